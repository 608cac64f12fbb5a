package index

import "bytes"

// rawValue is a bucket entry's members as written in its JSON (see
// parseCanonical); each slices the entry's bytes.
type rawValue struct {
	f                          fields[[]byte]
	fingerprint, kid, managers []byte
	paths                      []byte
	v                          uint64
}

// parseCanonical reads a bucket entry written exactly in the layout PutMsg
// writes (encoding/json of value): the members of value in their order,
// each optional one present or not, strings of printable ASCII without
// escapes, "v" a decimal of up to three digits, nothing after the closing
// brace. It reads such an entry as encoding/json does, without allocating;
// anything else (another order, spaces, escapes, unknown members, another
// case of a member's name, non-ASCII) it leaves to encoding/json (ok
// false). FuzzParseCanonical compares the two. Loading a million entries
// is mostly decoding them (docs/PERFORMANCE.md, "Restart at 1M index
// entries").
func parseCanonical(data []byte) (r rawValue, ok bool) {
	p := jsonScan{b: data}
	ok = p.lit(`{"uid":`) && p.str(&r.f.uid) &&
		(!p.lit(`,"namespace":`) || p.str(&r.f.ns)) &&
		p.lit(`,"name":`) && p.str(&r.f.name) &&
		p.lit(`,"resourceVersion":`) && p.str(&r.f.rv) &&
		(!p.lit(`,"fingerprint":`) || p.str(&r.fingerprint)) &&
		(!p.lit(`,"fingerprintKeyID":`) || p.str(&r.kid)) &&
		(!p.lit(`,"managers":`) || p.str(&r.managers)) &&
		(!p.lit(`,"paths":`) || p.str(&r.paths)) &&
		(!p.lit(`,"v":`) || p.uint(&r.v)) &&
		p.lit("}") && len(p.b) == 0
	return r, ok
}

// jsonScan consumes the start of b.
type jsonScan struct{ b []byte }

// lit consumes s if b starts with it.
func (p *jsonScan) lit(s string) bool {
	if len(p.b) < len(s) || string(p.b[:len(s)]) != s {
		return false
	}
	p.b = p.b[len(s):]
	return true
}

// str consumes a JSON string of printable ASCII other than '"' and '\'
// (no escape sequences), and sets *s to its contents.
func (p *jsonScan) str(s *[]byte) bool {
	if len(p.b) == 0 || p.b[0] != '"' {
		return false
	}
	end := bytes.IndexByte(p.b[1:], '"')
	if end < 0 {
		return false
	}
	v := p.b[1 : 1+end]
	for _, c := range v {
		if c < 0x20 || c > 0x7e || c == '\\' {
			return false
		}
	}
	*s, p.b = v, p.b[2+end:]
	return true
}

// uint consumes a decimal of one to three digits without a leading zero.
func (p *jsonScan) uint(n *uint64) bool {
	i := 0
	for i < len(p.b) && i < 4 && '0' <= p.b[i] && p.b[i] <= '9' {
		i++
	}
	if i == 0 || i > 3 || (i > 1 && p.b[0] == '0') {
		return false
	}
	*n = 0
	for _, c := range p.b[:i] {
		*n = *n*10 + uint64(c-'0')
	}
	p.b = p.b[i:]
	return true
}

// parseHex64 reads exactly 16 hex digits (either case), as
// strconv.ParseUint(s, 16, 64) with len(s) == 16 does.
func parseHex64(s []byte) (uint64, bool) {
	if len(s) != 16 {
		return 0, false
	}
	var n uint64
	for _, c := range s {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		n = n<<4 | uint64(c)
	}
	return n, true
}
