package event

import "errors"

// ScanList splits a LIST response body (a JSON object with "metadata" and
// "items") without copying it: item is called with each element of "items",
// a sub-slice of page, in order, and the raw "metadata" object is returned.
// The page is validated as it is scanned; an element that is not a JSON
// object is an error. An error returned by item stops the scan and is
// returned as is.
//
// A LIST page is thus held once (its body) instead of twice (the body and
// a copy of every item), which matters for pages of large objects.
func ScanList(page []byte, item func([]byte) error) (metadata []byte, err error) {
	i := skipWS(page, 0)
	if i >= len(page) {
		return nil, errors.New("list response is empty")
	}
	if page[i] != '{' {
		return nil, errors.New("list response is not a JSON object")
	}
	i = skipWS(page, i+1)
	if i >= len(page) {
		return nil, errTruncated(page)
	}
	if page[i] == '}' {
		return nil, nil
	}
	for {
		if page[i] != '"' {
			return nil, errInvalid(page, i, "looking for beginning of object key string")
		}
		kend, kflags, err := scanString(page, i)
		if err != nil {
			return nil, err
		}
		key := listKey(page[i+1:kend-1], kflags)
		if i, err = skipColon(page, kend); err != nil {
			return nil, err
		}
		switch key {
		case "metadata":
			start := i
			if i, err = skipValue(page, i, 1); err != nil {
				return nil, err
			}
			metadata = page[start:i:i]
		case "items":
			if i, err = scanItems(page, i, item); err != nil {
				return nil, err
			}
		default:
			if i, err = skipValue(page, i, 1); err != nil {
				return nil, err
			}
		}
		i = skipWS(page, i)
		if i >= len(page) {
			return nil, errTruncated(page)
		}
		switch page[i] {
		case ',':
			i = skipWS(page, i+1)
			if i >= len(page) {
				return nil, errTruncated(page)
			}
		case '}':
			return metadata, nil
		default:
			return nil, errInvalid(page, i, "after object key:value pair")
		}
	}
}

// scanItems walks the "items" value at page[i]: null or an array of
// objects.
func scanItems(page []byte, i int, item func([]byte) error) (int, error) {
	if page[i] == 'n' {
		return scanLiteral(page, i, "null")
	}
	if page[i] != '[' {
		return 0, errors.New("list response items is not an array")
	}
	i = skipWS(page, i+1)
	if i >= len(page) {
		return 0, errTruncated(page)
	}
	if page[i] == ']' {
		return i + 1, nil
	}
	for {
		if page[i] != '{' {
			return 0, errors.New("list response item is not a JSON object")
		}
		end, err := skipObject(page, i, 3)
		if err != nil {
			return 0, err
		}
		if err := item(page[i:end:end]); err != nil {
			return 0, err
		}
		i = skipWS(page, end)
		if i >= len(page) {
			return 0, errTruncated(page)
		}
		switch page[i] {
		case ',':
			i = skipWS(page, i+1)
			if i >= len(page) {
				return 0, errTruncated(page)
			}
		case ']':
			return i + 1, nil
		default:
			return 0, errInvalid(page, i, "after array element")
		}
	}
}

// listKey is the key of a LIST response member, unescaped when needed;
// "" for keys relayd does not read.
func listKey(raw []byte, flags uint8) string {
	k := raw
	if !stringIsPlain(raw, flags) {
		if len(raw) > 6*8 {
			return ""
		}
		var buf [64]byte
		k = appendUnquoted(buf[:0], raw)
	}
	switch string(k) {
	case "metadata":
		return "metadata"
	case "items":
		return "items"
	}
	return ""
}
