package event

// Author is who made an object's change, as its metadata.managedFields
// records it: the field manager, the operation (Apply or Update) and the
// subresource of the entries with the newest time (docs/CONSUMING.md, "Who
// changed it"). managedFields times have one-second resolution, so several
// entries may share the newest time: all of them are named, in the order of
// managedFields. The zero Author names nobody (no managedFields, or no
// entry with a time).
//
// An Author aliases the Raw of the Object it was read from.
type Author struct {
	raw []byte
	n   int
	e   [inlineAuthors]authorEntry
	// more holds the entries past the first inlineAuthors (rare: that many
	// managers in one second).
	more []authorEntry
}

// inlineAuthors entries of an Author need no allocation.
const inlineAuthors = 4

// authorEntry is one named managedFields entry: spans of the raw contents
// of its strings (zero span: member absent).
type authorEntry struct {
	manager, operation, subresource strSpan
}

// The parts of an entry.
const (
	authorManager = iota
	authorOperation
	authorSubresource
)

// Len is the number of entries named.
func (a *Author) Len() int { return a.n }

func (a *Author) entry(i int) *authorEntry {
	if i < inlineAuthors {
		return &a.e[i]
	}
	return &a.more[i-inlineAuthors]
}

func (e *authorEntry) part(p int) *strSpan {
	switch p {
	case authorManager:
		return &e.manager
	case authorOperation:
		return &e.operation
	}
	return &e.subresource
}

// Manager, Operation and Subresource are the named entries' values, decoded
// and joined as the extensions carry them (see appendPart); "" when none
// (Subresource: when no named entry has one). They allocate; the encoder
// uses appendPart.
func (a *Author) Manager() string     { return string(a.appendPart(nil, authorManager)) }
func (a *Author) Operation() string   { return string(a.appendPart(nil, authorOperation)) }
func (a *Author) Subresource() string {
	if !a.has(authorSubresource) {
		return ""
	}
	return string(a.appendPart(nil, authorSubresource))
}

// has reports whether any named entry has part p.
func (a *Author) has(p int) bool {
	for i := range a.n {
		if sp := a.entry(i).part(p); sp.end > sp.start {
			return true
		}
	}
	return false
}

// appendPart appends part p of the named entries, decoded: one value, or,
// when several entries are named, their values joined by ',' in which each
// value's own '%' and ',' are percent-encoded (%25, %2C), so that the lists
// split unambiguously and item i of each list describes the same entry (an
// entry without a subresource is an empty item).
func (a *Author) appendPart(dst []byte, p int) []byte {
	list := a.n > 1
	for i := range a.n {
		if i > 0 {
			dst = append(dst, ',')
		}
		sp := a.entry(i).part(p)
		s := a.raw[sp.start:sp.end]
		if !stringIsPlain(s, sp.flags) {
			start := len(dst)
			dst = appendUnquoted(dst, s)
			if list {
				dst = append(dst[:start], listEscape(nil, dst[start:])...)
			}
			continue
		}
		if list {
			dst = listEscape(dst, s)
		} else {
			dst = append(dst, s...)
		}
	}
	return dst
}

// listEscape appends s with '%' and ',' percent-encoded.
func listEscape(dst, s []byte) []byte {
	for _, c := range s {
		switch c {
		case '%':
			dst = append(dst, "%25"...)
		case ',':
			dst = append(dst, "%2C"...)
		default:
			dst = append(dst, c)
		}
	}
	return dst
}

// appendJSONPart appends part p as the contents of a JSON string: the raw
// contents of a single plain value as they are (valid JSON string contents
// already: no allocation), anything else decoded, joined and re-escaped.
func (a *Author) appendJSONPart(dst []byte, p int) []byte {
	if a.n == 1 {
		sp := a.e[0].part(p)
		s := a.raw[sp.start:sp.end]
		if sp.flags&strEscaped == 0 {
			return append(dst, s...)
		}
	}
	return appendJSONStringContent(dst, string(a.appendPart(nil, p)))
}

// jsonLen is the length of the extensions appendJSON writes, escapes aside
// (for sizing a buffer).
func (a *Author) jsonLen() int {
	if a.n == 0 {
		return 0
	}
	n := len(`,"k8smanager":"","k8soperation":"","k8ssubresource":""`)
	for i := range a.n {
		e := a.entry(i)
		n += 3 + e.manager.end - e.manager.start + e.operation.end - e.operation.start + e.subresource.end - e.subresource.start
	}
	return n
}

// appendJSON appends the extensions k8smanager, k8soperation and
// k8ssubresource (left out when no named entry has a subresource) as JSON
// members, each after a ','; nothing for the zero Author.
func (a *Author) appendJSON(b []byte) []byte {
	if a.n == 0 {
		return b
	}
	b = append(b, `,"k8smanager":"`...)
	b = a.appendJSONPart(b, authorManager)
	b = append(b, `","k8soperation":"`...)
	b = a.appendJSONPart(b, authorOperation)
	b = append(b, '"')
	if a.has(authorSubresource) {
		b = append(b, `,"k8ssubresource":"`...)
		b = a.appendJSONPart(b, authorSubresource)
		b = append(b, '"')
	}
	return b
}

// Author reads who made o's change from its metadata.managedFields (see
// [Author]); the zero Author when o has none or was not parsed. It scans
// only the managedFields value, which ParseObject located.
func (o *Object) Author() Author {
	m := &o.fix[fxManagedFields]
	if !o.parsed() || m.key == 0 {
		return Author{}
	}
	data := o.Raw[:m.val]
	i, _, err := scanString(data, m.key)
	if err != nil {
		return Author{}
	}
	if i, err = skipColon(data, i); err != nil {
		return Author{}
	}
	if i = skipWS(data, i); i >= len(data) || data[i] != '[' {
		return Author{} // null, or not a list
	}
	a := Author{raw: o.Raw}
	a.read(data, i)
	return a
}

// read names the entries of the managedFields list at data[i] == '['
// (already validated by ParseObject: an error only stops the reading).
func (a *Author) read(data []byte, i int) {
	var newest strSpan
	for i = skipWS(data, i+1); i < len(data) && data[i] != ']'; {
		var end int
		var err error
		if data[i] == '{' {
			var e authorEntry
			var t strSpan
			end, err = entryMembers(data, i, &e, &t)
			if err == nil && t.end > t.start {
				switch c := compareSpans(data, t, newest); {
				case c > 0:
					newest, a.n, a.more = t, 0, a.more[:0]
					a.add(e)
				case c == 0:
					a.add(e)
				}
			}
		} else {
			end, err = skipValue(data, i, 2)
		}
		if err != nil {
			return
		}
		if i = skipWS(data, end); i < len(data) && data[i] == ',' {
			i = skipWS(data, i+1)
		}
	}
}

func (a *Author) add(e authorEntry) {
	if a.n < inlineAuthors {
		a.e[a.n] = e
	} else {
		a.more = append(a.more, e)
	}
	a.n++
}

// compareSpans compares two raw string contents bytewise (managedFields
// times are RFC 3339 in UTC, "2006-01-02T15:04:05Z": bytewise order is time
// order); an empty b is less than any a.
func compareSpans(data []byte, a, b strSpan) int {
	if b.end == b.start {
		return 1
	}
	x, y := data[a.start:a.end], data[b.start:b.end]
	switch {
	case string(x) > string(y):
		return 1
	case string(x) < string(y):
		return -1
	}
	return 0
}

// entryMembers reads the manager, operation, subresource and time strings
// of the managedFields entry at data[i] == '{' and returns the offset just
// past it. Members of other types are ignored.
func entryMembers(data []byte, i int, e *authorEntry, t *strSpan) (int, error) {
	i = skipWS(data, i+1)
	if i >= len(data) {
		return 0, errTruncated(data)
	}
	if data[i] == '}' {
		return i + 1, nil
	}
	for {
		kend, _, err := scanString(data, i)
		if err != nil {
			return 0, err
		}
		k := data[i+1 : kend-1]
		if i, err = skipColon(data, kend); err != nil {
			return 0, err
		}
		if i = skipWS(data, i); i >= len(data) {
			return 0, errTruncated(data)
		}
		var sp *strSpan
		switch string(k) {
		case "manager":
			sp = &e.manager
		case "operation":
			sp = &e.operation
		case "subresource":
			sp = &e.subresource
		case "time":
			sp = t
		}
		if sp != nil && data[i] == '"' {
			end, flags, err := scanString(data, i)
			if err != nil {
				return 0, err
			}
			*sp = strSpan{start: i + 1, end: end - 1, flags: flags}
			i = end
		} else if i, err = skipValue(data, i, 3); err != nil {
			return 0, err
		}
		next, last, err := afterMember(data, i)
		if err != nil {
			return 0, err
		}
		if last {
			return next + 1, nil
		}
		i = next
	}
}
