package event

import (
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// Path is a compiled field path (see the package doc for the syntax), e.g.
// spec.template.spec.containers[*].env or
// metadata.annotations["example.com/token"]. The zero Path is empty and
// selects nothing; ParsePath never returns it without an error.
type Path struct {
	segs []pathSeg
}

// pathSeg is one step of a Path: a member name, or every element of an
// array ([*]).
type pathSeg struct {
	name string
	all  bool
}

// PathError is the error returned by ParsePath.
type PathError struct {
	// Offset is the byte offset in the path where the problem was found
	// (for an unterminated quoted name, where it starts); -1 when the
	// problem is not at one place (an empty path).
	Offset int
	// Msg says what is wrong, without the offset.
	Msg string
	// Hint, if not empty, says what to write instead.
	Hint string
}

// Error returns "<msg> at offset N (<hint>)", leaving out the offset when
// it is negative and the hint when it is empty.
func (e *PathError) Error() string {
	s := e.Msg
	if e.Offset >= 0 {
		s += " at offset " + strconv.Itoa(e.Offset)
	}
	if e.Hint != "" {
		s += " (" + e.Hint + ")"
	}
	return s
}

func pathErr(off int, msg string) error { return &PathError{Offset: off, Msg: msg} }

func pathErrHint(off int, msg, hint string) error {
	return &PathError{Offset: off, Msg: msg, Hint: hint}
}

// isPlainName reports whether c may appear in a member name written without
// quotes: ASCII letters, digits, '_' and '-'.
func isPlainName(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

// ParsePath compiles s (see the package doc for the syntax). Errors are
// *PathError and say what is wrong and at which byte offset of s:
// `unexpected "]" at offset 7`, `empty member name at offset 5`, `[N]
// indexes are not supported (use [*]) at offset 9`, `unterminated quoted
// member name starting at offset 20`, ...
func ParsePath(s string) (Path, error) {
	if s == "" {
		return Path{}, pathErr(-1, "empty path")
	}
	var segs []pathSeg
	i := 0
	// expectName is true at the start and after a '.', where a member
	// name must follow (at the start, a quoted one may).
	expectName := true
	for i < len(s) {
		c := s[i]
		switch {
		case expectName && c == '.':
			return Path{}, pathErr(i, "empty member name")
		case expectName && c == '[' && i > 0:
			return Path{}, pathErrHint(i, `unexpected "["`, `no "." before "["`)
		case expectName && c != '[':
			j := i
			for j < len(s) && isPlainName(s[j]) {
				j++
			}
			if j == i {
				return Path{}, unexpected(s, i)
			}
			segs = append(segs, pathSeg{name: s[i:j]})
			i = j
			expectName = false
		case c == '.':
			i++
			if i == len(s) {
				return Path{}, pathErr(i, "empty member name")
			}
			expectName = true
		case c == '[':
			if i+1 >= len(s) {
				return Path{}, pathErr(i, `unterminated "["`)
			}
			switch d := s[i+1]; {
			case d == '*':
				if len(segs) == 0 {
					return Path{}, pathErr(i, "[*] must follow a member name")
				}
				if i+2 >= len(s) {
					return Path{}, pathErr(i, `unterminated "["`)
				}
				if s[i+2] != ']' {
					return Path{}, unexpected(s, i+2)
				}
				segs = append(segs, pathSeg{all: true})
				i += 3
			case d == '"':
				name, end, err := parseQuotedName(s, i)
				if err != nil {
					return Path{}, err
				}
				segs = append(segs, pathSeg{name: name})
				i = end
			case d >= '0' && d <= '9' || d == '-':
				return Path{}, pathErr(i, "[N] indexes are not supported (use [*])")
			default:
				return Path{}, unexpected(s, i+1)
			}
			expectName = false
		default:
			return Path{}, unexpected(s, i)
		}
	}
	return Path{segs: segs}, nil
}

// parseQuotedName parses `["..."]` starting at s[i] == '[' (s[i+1] == '"')
// and returns the decoded name and the offset just past the ']'.
func parseQuotedName(s string, i int) (string, int, error) {
	start := i
	i += 2
	var b []byte // decoded name, once an escape was seen
	lit := i     // start of the bytes not yet copied to b
	for {
		if i >= len(s) {
			return "", 0, pathErr(start, "unterminated quoted member name starting")
		}
		c := s[i]
		switch {
		case c == '"':
			if i+1 >= len(s) || s[i+1] != ']' {
				return "", 0, errAfterQuotedName(s, start, i+1)
			}
			name := s[lit:i]
			if b != nil {
				name = string(append(b, name...))
			}
			return name, i + 2, nil
		case c == '\\':
			if b == nil {
				b = make([]byte, 0, len(s)-start)
			}
			b = append(b, s[lit:i]...)
			var err error
			if b, i, err = appendPathEscape(b, s, start, i); err != nil {
				return "", 0, err
			}
			lit = i
		case c < 0x20 || c == 0x7f:
			return "", 0, pathErrHint(i, "control character "+quoteAt(s, i)+" in quoted member name", `write it as a \u escape`)
		case c < utf8.RuneSelf:
			i++
		default:
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				return "", 0, pathErr(i, "invalid UTF-8")
			}
			i += size
		}
	}
}

// errAfterQuotedName reports what is wrong at s[i], just past the closing
// quote of the quoted name whose '[' is at s[start], where a ']' must be.
func errAfterQuotedName(s string, start, i int) error {
	if i >= len(s) {
		return pathErr(start, `unterminated "["`)
	}
	return pathErrHint(i, "unexpected "+quoteAt(s, i), `want "]" after the quoted member name`)
}

// appendPathEscape decodes the escape at s[i] == '\\' inside the quoted
// name whose '[' is at s[start], appends it to b and returns b and the
// offset just past the escape. The escapes are JSON's.
func appendPathEscape(b []byte, s string, start, i int) ([]byte, int, error) {
	if i+1 >= len(s) {
		return nil, 0, pathErr(start, "unterminated quoted member name starting")
	}
	switch e := s[i+1]; e {
	case '"', '\\', '/':
		b = append(b, e)
	case 'b':
		b = append(b, '\b')
	case 'f':
		b = append(b, '\f')
	case 'n':
		b = append(b, '\n')
	case 'r':
		b = append(b, '\r')
	case 't':
		b = append(b, '\t')
	case 'u':
		r, n, err := pathUnicodeEscape(s, i)
		if err != nil {
			return nil, 0, err
		}
		return utf8.AppendRune(b, r), i + n, nil
	default:
		return nil, 0, pathErr(i, "invalid escape "+strconv.Quote(s[i:i+2]))
	}
	return b, i + 2, nil
}

// pathUnicodeEscape decodes the \uXXXX escape at s[i] == '\\' (s[i+1] ==
// 'u'), joined with a second one that follows when the two are a UTF-16
// surrogate pair, and returns the rune and the length of the escape (6, or
// 12 for a pair). A surrogate that is not part of a pair is an error.
func pathUnicodeEscape(s string, i int) (rune, int, error) {
	r, ok := pathHex4(s, i+2)
	if !ok {
		return 0, 0, pathErrHint(i, `invalid \u escape`, "want four hex digits")
	}
	if !utf16.IsSurrogate(r) {
		return r, 6, nil
	}
	if r2, ok := pathHex4(s, i+8); ok && s[i+6] == '\\' && s[i+7] == 'u' {
		if d := utf16.DecodeRune(r, r2); d != utf8.RuneError {
			return d, 12, nil
		}
	}
	return 0, 0, pathErrHint(i, `invalid \u escape`, "unpaired surrogate")
}

// pathHex4 decodes the four hex digits at s[i:i+4].
func pathHex4(s string, i int) (rune, bool) {
	if i+4 > len(s) {
		return 0, false
	}
	var r rune
	for k := i; k < i+4; k++ {
		c := s[k]
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// unexpected reports the character at s[i].
func unexpected(s string, i int) error {
	hint := ""
	switch s[i] {
	case '.', '[', ']', '"', '*':
	default:
		hint = `write member names with characters other than letters, digits, '_' and '-' as ["..."]`
	}
	return pathErrHint(i, "unexpected "+quoteAt(s, i), hint)
}

// quoteAt quotes the character at s[i] for an error message.
func quoteAt(s string, i int) string {
	r, size := utf8.DecodeRuneInString(s[i:])
	if r == utf8.RuneError && size == 1 {
		return "byte 0x" + string([]byte{hexLower[s[i]>>4], hexLower[s[i]&0xf]})
	}
	return strconv.Quote(string(r))
}

// String returns the canonical form of p, which ParsePath compiles back to
// an equal Path: member names made of letters, digits, '_' and '-' plainly
// (after a '.' unless first), other names as ["..."] with '"' and '\\'
// backslash-escaped, control characters as \n, \t, \r, \b, \f or \u00XX,
// DEL as \u007f and ',' as \u002c (so that a comma-separated list of
// canonical paths, as in the relayddropped extension, splits at its commas),
// every other character as it is; [*] as [*].
func (p Path) String() string {
	var b strings.Builder
	for i, sg := range p.segs {
		switch {
		case sg.all:
			b.WriteString("[*]")
		case sg.name != "" && isPlainString(sg.name):
			if i > 0 {
				b.WriteByte('.')
			}
			b.WriteString(sg.name)
		default:
			b.WriteString(`["`)
			writeQuotedName(&b, sg.name)
			b.WriteString(`"]`)
		}
	}
	return b.String()
}

func isPlainString(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isPlainName(s[i]) {
			return false
		}
	}
	return true
}

func writeQuotedName(b *strings.Builder, s string) {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c == '\n':
			b.WriteString(`\n`)
		case c == '\t':
			b.WriteString(`\t`)
		case c == '\r':
			b.WriteString(`\r`)
		case c == '\b':
			b.WriteString(`\b`)
		case c == '\f':
			b.WriteString(`\f`)
		case c < 0x20 || c == 0x7f || c == ',':
			b.WriteString(`\u00`)
			b.WriteByte(hexLower[c>>4])
			b.WriteByte(hexLower[c&0xf])
		default:
			b.WriteByte(c)
		}
	}
}

// Len returns the number of steps of p: member names and [*].
func (p Path) Len() int { return len(p.segs) }

// Equal reports whether p and q are the same path.
func (p Path) Equal(q Path) bool {
	if len(p.segs) != len(q.segs) {
		return false
	}
	for i := range p.segs {
		if p.segs[i] != q.segs[i] {
			return false
		}
	}
	return true
}

// hasPrefix reports whether p starts with the member names names.
func (p Path) hasPrefix(names ...string) bool {
	if len(p.segs) < len(names) {
		return false
	}
	for i, n := range names {
		if p.segs[i].all || p.segs[i].name != n {
			return false
		}
	}
	return true
}
