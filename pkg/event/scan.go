package event

import (
	"encoding/binary"
	"math/bits"
	"strconv"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// maxDepth is the deepest nesting of objects and arrays accepted, the same
// limit as encoding/json, so that the scanner and json.Valid agree.
const maxDepth = 10000

// SyntaxError reports malformed JSON found by [ParseObject],
// [ParseWatchFrame] or [ParseWatchEvent].
type SyntaxError struct {
	// Offset is the byte offset in the input where the problem was found;
	// for a truncated input it is the input's length.
	Offset int
	// Truncated is true when the input ended inside a value.
	Truncated bool
	// Msg describes an invalid byte; empty when Truncated.
	Msg string
}

// Error returns "truncated JSON at offset N" or "invalid JSON at offset N: <msg>".
func (e *SyntaxError) Error() string {
	if e.Truncated {
		return "truncated JSON at offset " + strconv.Itoa(e.Offset)
	}
	return "invalid JSON at offset " + strconv.Itoa(e.Offset) + ": " + e.Msg
}

func errTruncated(data []byte) error {
	return &SyntaxError{Offset: len(data), Truncated: true}
}

// errInvalid reports the byte data[i], which is not allowed in context.
func errInvalid(data []byte, i int, context string) error {
	return &SyntaxError{Offset: i, Msg: "invalid character " + quoteByte(data[i]) + " " + context}
}

func quoteByte(c byte) string {
	switch {
	case c == '\'':
		return `'\''`
	case c == '"':
		return `'"'`
	case c >= 0x20 && c < 0x7f:
		return "'" + string(rune(c)) + "'"
	}
	return "byte 0x" + string([]byte{hexLower[c>>4], hexLower[c&0xf]})
}

// strPlain marks the bytes a JSON string may contain verbatim and that need
// no attention from the scanner: printable ASCII except '"' and '\\'.
var strPlain = func() (t [256]bool) {
	for c := 0x20; c < 0x80; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// notPlain8 has the high bit set in the byte of x (eight bytes of a string,
// little endian) that is the first not strPlain, if any: a control
// character (< 0x20), '"', '\\' or a byte >= 0x80. Bytes above that one may
// be marked too (borrows), bytes below it never: so the lowest marked byte
// is the first one not plain, and 0 means all eight are plain.
func notPlain8(x uint64) uint64 {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	quote, backslash := x^(ones*'"'), x^(ones*'\\')
	// With no byte >= 0x80 (x&highs catches those), each subtraction sets
	// the high bit of the first byte below the bound (0x20), or zero
	// (the byte equal to '"' or '\\'), and of no byte before it.
	return (x | (x - ones*0x20) | (quote - ones) | (backslash - ones)) & highs
}

// Flags returned by scanString.
const (
	strEscaped = 1 << iota // the string contains a backslash escape
	strHigh                // the string contains a byte >= 0x80
)

func isSpace(c byte) bool { return c == ' ' || c == '\n' || c == '\r' || c == '\t' }

func skipWS(data []byte, i int) int {
	// Compact JSON has no whitespace: one comparison for the usual byte.
	for i < len(data) && data[i] <= ' ' && isSpace(data[i]) {
		i++
	}
	return i
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// scanString validates the JSON string starting at data[i] == '"' and returns
// the offset just past its closing quote and the str* flags of its contents.
func scanString(data []byte, i int) (int, uint8, error) {
	var flags uint8
	i++
	for {
		// Eight bytes at a time up to the first that is not plain, then
		// byte by byte (the string's end, an escape, a high byte).
		found := false
		for i+8 <= len(data) {
			if m := notPlain8(binary.LittleEndian.Uint64(data[i:])); m != 0 {
				i += bits.TrailingZeros64(m) >> 3
				found = true
				break
			}
			i += 8
		}
		for !found && i < len(data) && strPlain[data[i]] {
			i++
		}
		if i >= len(data) {
			return 0, 0, errTruncated(data)
		}
		switch c := data[i]; {
		case c == '"':
			return i + 1, flags, nil
		case c == '\\':
			flags |= strEscaped
			if i+1 >= len(data) {
				return 0, 0, errTruncated(data)
			}
			switch data[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				for k := 2; k < 6; k++ {
					if i+k >= len(data) {
						return 0, 0, errTruncated(data)
					}
					if !isHex(data[i+k]) {
						return 0, 0, errInvalid(data, i+k, "in \\u hexadecimal character escape")
					}
				}
				i += 6
			default:
				return 0, 0, errInvalid(data, i+1, "in string escape code")
			}
		case c < 0x20:
			return 0, 0, errInvalid(data, i, "in string literal")
		default: // >= 0x80; UTF-8 validity is checked only when the value is used
			flags |= strHigh
			i++
		}
	}
}

// skipValue validates the JSON value starting at data[i] (no leading
// whitespace) and returns the offset just past it. depth is the nesting depth
// of the container holding the value.
func skipValue(data []byte, i, depth int) (int, error) {
	if i >= len(data) {
		return 0, errTruncated(data)
	}
	switch c := data[i]; c {
	case '"':
		end, _, err := scanString(data, i)
		return end, err
	case '{':
		return skipObject(data, i, depth+1)
	case '[':
		return skipArray(data, i, depth+1)
	case 't':
		return scanLiteral(data, i, "true")
	case 'f':
		return scanLiteral(data, i, "false")
	case 'n':
		return scanLiteral(data, i, "null")
	default:
		if c == '-' || isDigit(c) {
			return scanNumber(data, i)
		}
		return 0, errInvalid(data, i, "looking for beginning of value")
	}
}

func errDepth(i int) error {
	return &SyntaxError{Offset: i, Msg: "exceeded max nesting depth " + strconv.Itoa(maxDepth)}
}

// skipObject validates the object starting at data[i] == '{' at nesting depth
// depth and returns the offset just past its closing brace.
func skipObject(data []byte, i, depth int) (int, error) {
	if depth > maxDepth {
		return 0, errDepth(i)
	}
	i = skipWS(data, i+1)
	if i >= len(data) {
		return 0, errTruncated(data)
	}
	if data[i] == '}' {
		return i + 1, nil
	}
	for {
		if data[i] != '"' {
			return 0, errInvalid(data, i, "looking for beginning of object key string")
		}
		end, _, err := scanString(data, i)
		if err != nil {
			return 0, err
		}
		if i, err = skipColon(data, end); err != nil {
			return 0, err
		}
		if i, err = skipValue(data, i, depth); err != nil {
			return 0, err
		}
		i = skipWS(data, i)
		if i >= len(data) {
			return 0, errTruncated(data)
		}
		switch data[i] {
		case ',':
			i = skipWS(data, i+1)
			if i >= len(data) {
				return 0, errTruncated(data)
			}
		case '}':
			return i + 1, nil
		default:
			return 0, errInvalid(data, i, "after object key:value pair")
		}
	}
}

// skipColon skips the whitespace, colon and whitespace after an object key
// ending at i and returns the offset of the value.
func skipColon(data []byte, i int) (int, error) {
	i = skipWS(data, i)
	if i >= len(data) {
		return 0, errTruncated(data)
	}
	if data[i] != ':' {
		return 0, errInvalid(data, i, "after object key")
	}
	i = skipWS(data, i+1)
	if i >= len(data) {
		return 0, errTruncated(data)
	}
	return i, nil
}

// skipArray validates the array starting at data[i] == '[' at nesting depth
// depth and returns the offset just past its closing bracket.
func skipArray(data []byte, i, depth int) (int, error) {
	if depth > maxDepth {
		return 0, errDepth(i)
	}
	i = skipWS(data, i+1)
	if i >= len(data) {
		return 0, errTruncated(data)
	}
	if data[i] == ']' {
		return i + 1, nil
	}
	for {
		var err error
		if i, err = skipValue(data, i, depth); err != nil {
			return 0, err
		}
		i = skipWS(data, i)
		if i >= len(data) {
			return 0, errTruncated(data)
		}
		switch data[i] {
		case ',':
			i = skipWS(data, i+1)
		case ']':
			return i + 1, nil
		default:
			return 0, errInvalid(data, i, "after array element")
		}
	}
}

func scanLiteral(data []byte, i int, lit string) (int, error) {
	for k := 1; k < len(lit); k++ {
		if i+k >= len(data) {
			return 0, errTruncated(data)
		}
		if data[i+k] != lit[k] {
			return 0, errInvalid(data, i+k, "in literal "+lit+" (expecting "+quoteByte(lit[k])+")")
		}
	}
	return i + len(lit), nil
}

// scanNumber validates the number starting at data[i] ('-' or a digit).
func scanNumber(data []byte, i int) (int, error) {
	n := len(data)
	if data[i] == '-' {
		i++
		if i >= n {
			return 0, errTruncated(data)
		}
	}
	switch c := data[i]; {
	case c == '0':
		i++
	case c >= '1' && c <= '9':
		i++
		for i < n && isDigit(data[i]) {
			i++
		}
	default:
		return 0, errInvalid(data, i, "in numeric literal")
	}
	if i < n && data[i] == '.' {
		i++
		if i >= n {
			return 0, errTruncated(data)
		}
		if !isDigit(data[i]) {
			return 0, errInvalid(data, i, "after decimal point in numeric literal")
		}
		for i < n && isDigit(data[i]) {
			i++
		}
	}
	if i < n && (data[i] == 'e' || data[i] == 'E') {
		i++
		if i < n && (data[i] == '+' || data[i] == '-') {
			i++
		}
		if i >= n {
			return 0, errTruncated(data)
		}
		if !isDigit(data[i]) {
			return 0, errInvalid(data, i, "in exponent of numeric literal")
		}
		for i < n && isDigit(data[i]) {
			i++
		}
	}
	return i, nil
}

// appendUnquoted appends the decoded contents of a JSON string to dst. s is
// the text between the quotes and must have been validated by scanString.
// Invalid UTF-8 and unpaired surrogate escapes become U+FFFD, exactly as
// encoding/json decodes them.
func appendUnquoted(dst, s []byte) []byte {
	for r := 0; r < len(s); {
		c := s[r]
		switch {
		case c == '\\':
			switch e := s[r+1]; e {
			case 'b':
				dst = append(dst, '\b')
			case 'f':
				dst = append(dst, '\f')
			case 'n':
				dst = append(dst, '\n')
			case 'r':
				dst = append(dst, '\r')
			case 't':
				dst = append(dst, '\t')
			case 'u':
				rr := hex4(s[r+2:])
				r += 6
				if utf16.IsSurrogate(rr) {
					if r+6 <= len(s) && s[r] == '\\' && s[r+1] == 'u' {
						if dec := utf16.DecodeRune(rr, hex4(s[r+2:])); dec != unicode.ReplacementChar {
							r += 6
							dst = utf8.AppendRune(dst, dec)
							continue
						}
					}
					rr = unicode.ReplacementChar
				}
				dst = utf8.AppendRune(dst, rr)
				continue
			default: // '"', '\\', '/'
				dst = append(dst, e)
			}
			r += 2
		case c < utf8.RuneSelf:
			dst = append(dst, c)
			r++
		default:
			rr, size := utf8.DecodeRune(s[r:])
			r += size
			dst = utf8.AppendRune(dst, rr)
		}
	}
	return dst
}

// hex4 decodes four validated hex digits.
func hex4(s []byte) rune {
	var r rune
	for _, c := range s[:4] {
		switch {
		case c <= '9':
			c -= '0'
		case c >= 'a':
			c -= 'a' - 10
		default:
			c -= 'A' - 10
		}
		r = r<<4 | rune(c)
	}
	return r
}

// stringIsPlain reports whether the raw contents of a scanned string (with
// the flags scanString returned) decode to themselves.
func stringIsPlain(s []byte, flags uint8) bool {
	if flags&strEscaped != 0 {
		return false
	}
	return flags&strHigh == 0 || utf8.Valid(s)
}

// maxMFEntries is how many managedFields entries a parse records.
const maxMFEntries = 6

// mfEntry is one managedFields element in Raw: data[start:end], its
// fieldsV1 value data[fv0:fv1] (0, 0: none); start == end: not an object.
type mfEntry struct{ start, end, fv0, fv1 int32 }

func (e *mfEntry) shift(d int) {
	e.start += int32(d)
	e.end += int32(d)
	if e.fv1 > 0 {
		e.fv0 += int32(d)
		e.fv1 += int32(d)
	}
}

// skipManagedFields is skipArray for the metadata.managedFields list at
// data[i] == '[' (depth as skipArray's): it also records its first entries
// in o.mf, with their fieldsV1 value, and counts them in o.mfN. It
// validates exactly what skipArray does.
func skipManagedFields(data []byte, i, depth int, o *Object) (int, error) {
	if depth > maxDepth {
		return 0, errDepth(i)
	}
	o.mfOK = true
	i = skipWS(data, i+1)
	if i >= len(data) {
		return 0, errTruncated(data)
	}
	if data[i] == ']' {
		return i + 1, nil
	}
	for {
		var e mfEntry
		start := i
		var err error
		if i >= len(data) {
			return 0, errTruncated(data)
		}
		if data[i] == '{' {
			i, err = skipEntry(data, i, depth+1, &e)
		} else {
			i, err = skipValue(data, i, depth)
		}
		if err != nil {
			return 0, err
		}
		if data[start] == '{' {
			e.start, e.end = int32(start), int32(i)
		}
		if int(o.mfN) < maxMFEntries {
			o.mf[o.mfN] = e
		}
		o.mfN++
		i = skipWS(data, i)
		if i >= len(data) {
			return 0, errTruncated(data)
		}
		switch data[i] {
		case ',':
			i = skipWS(data, i+1)
		case ']':
			return i + 1, nil
		default:
			return 0, errInvalid(data, i, "after array element")
		}
	}
}

// skipEntry is skipObject for one managedFields entry: it also records the
// span of its fieldsV1 value in e.
func skipEntry(data []byte, i, depth int, e *mfEntry) (int, error) {
	if depth > maxDepth {
		return 0, errDepth(i)
	}
	i = skipWS(data, i+1)
	if i >= len(data) {
		return 0, errTruncated(data)
	}
	if data[i] == '}' {
		return i + 1, nil
	}
	for {
		if data[i] != '"' {
			return 0, errInvalid(data, i, "looking for beginning of object key string")
		}
		end, _, err := scanString(data, i)
		if err != nil {
			return 0, err
		}
		fields := string(data[i+1:end-1]) == "fieldsV1"
		if i, err = skipColon(data, end); err != nil {
			return 0, err
		}
		v := i
		if i, err = skipValue(data, i, depth); err != nil {
			return 0, err
		}
		if fields {
			e.fv0, e.fv1 = int32(v), int32(i)
		}
		i = skipWS(data, i)
		if i >= len(data) {
			return 0, errTruncated(data)
		}
		switch data[i] {
		case ',':
			i = skipWS(data, i+1)
			if i >= len(data) {
				return 0, errTruncated(data)
			}
		case '}':
			return i + 1, nil
		default:
			return 0, errInvalid(data, i, "after object key:value pair")
		}
	}
}
