package event

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// MaxSubjectLen is the longest object subject relayd publishes on. Beyond it
// the name token is replaced by a hash token (see the package doc).
const MaxSubjectLen = 512

// Placeholders for empty variable tokens (see the package doc).
const (
	// CoreGroupToken is the group token of the core ("") API group.
	CoreGroupToken = "core"
	// EmptyToken is the token of an empty namespace (cluster-scoped object)
	// and of any other empty variable token.
	EmptyToken = "_"
	// HashTokenPrefix starts a name token that is a hash of an over-long name.
	HashTokenPrefix = "%H"
	// ControlToken is the token after the cluster in control subjects.
	ControlToken = "_relayd"
)

// tokenEscape marks the bytes EncodeToken writes as %HH.
var tokenEscape = func() (t [256]bool) {
	for c := 0; c < 256; c++ {
		t[c] = c == '%' || c == '.' || c == '*' || c == '>' || c <= ' ' || c >= 0x7f
	}
	return t
}()

// EncodeToken encodes s as one NATS subject token, reversibly: '%', '.', '*',
// '>', space, control bytes (< 0x20, 0x7f) and every byte >= 0x80 become %HH
// (upper-case hex); all other bytes are kept. It returns s itself (no
// allocation) when nothing needs escaping. The empty string encodes to the
// empty string; the subject builder substitutes placeholders for it.
func EncodeToken(s string) string {
	n := 0
	for i := 0; i < len(s); i++ {
		if tokenEscape[s[i]] {
			n++
		}
	}
	if n == 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 2*n)
	from := 0
	for i := 0; i < len(s); i++ {
		if c := s[i]; tokenEscape[c] {
			b.WriteString(s[from:i])
			b.WriteByte('%')
			b.WriteByte(hexUpper[c>>4])
			b.WriteByte(hexUpper[c&0xf])
			from = i + 1
		}
	}
	b.WriteString(s[from:])
	return b.String()
}

// AppendToken appends EncodeToken(s) to dst.
func AppendToken(dst []byte, s string) []byte {
	from := 0
	for i := 0; i < len(s); i++ {
		if c := s[i]; tokenEscape[c] {
			dst = append(dst, s[from:i]...)
			dst = append(dst, '%', hexUpper[c>>4], hexUpper[c&0xf])
			from = i + 1
		}
	}
	return append(dst, s[from:]...)
}

func upperHexVal(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// DecodeToken inverts EncodeToken: DecodeToken(EncodeToken(s)) == s for every
// s. A token is malformed if a '%' is not followed by two upper-case hex
// digits (so a hash token is rejected) or if it contains a byte EncodeToken
// would have escaped. Escapes of bytes EncodeToken keeps (e.g. "%63ore" for
// the group "core") are accepted.
func DecodeToken(tok string) (string, error) {
	i := 0
	for i < len(tok) && tok[i] != '%' {
		if tokenEscape[tok[i]] {
			return "", badTokenByte(tok, i)
		}
		i++
	}
	if i == len(tok) {
		return tok, nil
	}
	var b strings.Builder
	b.Grow(len(tok))
	b.WriteString(tok[:i])
	for i < len(tok) {
		c := tok[i]
		if c == '%' {
			if i+2 >= len(tok) {
				return "", badEscape(tok, i)
			}
			hi, ok1 := upperHexVal(tok[i+1])
			lo, ok2 := upperHexVal(tok[i+2])
			if !ok1 || !ok2 {
				return "", badEscape(tok, i)
			}
			b.WriteByte(hi<<4 | lo)
			i += 3
			continue
		}
		if tokenEscape[c] {
			return "", badTokenByte(tok, i)
		}
		b.WriteByte(c)
		i++
	}
	return b.String(), nil
}

func badEscape(tok string, i int) error {
	return errors.New("malformed escape at offset " + strconv.Itoa(i) + " in token " + strconv.Quote(tok))
}

func badTokenByte(tok string, i int) error {
	return errors.New("invalid byte " + quoteByte(tok[i]) + " at offset " + strconv.Itoa(i) + " in token " + strconv.Quote(tok))
}

// appendSlot appends a variable token: placeholder for "", the placeholder
// with its first byte escaped for a value equal to the placeholder, and
// EncodeToken(s) otherwise.
func appendSlot(dst []byte, s, placeholder string) []byte {
	switch s {
	case "":
		return append(dst, placeholder...)
	case placeholder:
		dst = append(dst, '%', hexUpper[s[0]>>4], hexUpper[s[0]&0xf])
		return append(dst, s[1:]...)
	}
	return AppendToken(dst, s)
}

// decodeSlot inverts appendSlot.
func decodeSlot(tok, placeholder string) (string, error) {
	if tok == placeholder {
		return "", nil
	}
	return DecodeToken(tok)
}

// appendHashToken appends "%H" + hex(sha256(name)[:16]).
func appendHashToken(dst []byte, name string) []byte {
	sum := sha256.Sum256([]byte(name))
	dst = append(dst, HashTokenPrefix...)
	for _, c := range sum[:16] {
		dst = append(dst, hexLower[c>>4], hexLower[c&0xf])
	}
	return dst
}

// HashToken returns the name token used when the subject of an object named
// name would exceed MaxSubjectLen: "%H" followed by 32 lower-case hex digits.
func HashToken(name string) string {
	return string(appendHashToken(make([]byte, 0, 34), name))
}

// appendObjectSubject appends the subject of an object change to dst.
// prefix is "<prefix>.<cluster>.".
func appendObjectSubject(dst []byte, prefix string, r Resource, namespace, name string, t Type) []byte {
	start := len(dst)
	dst = append(dst, prefix...)
	dst = append(appendSlot(dst, r.Group, CoreGroupToken), '.')
	dst = append(appendSlot(dst, r.Version, EmptyToken), '.')
	dst = append(appendSlot(dst, r.Resource, EmptyToken), '.')
	dst = append(appendSlot(dst, namespace, EmptyToken), '.')
	nameAt := len(dst)
	dst = append(appendSlot(dst, name, EmptyToken), '.')
	dst = append(dst, t...)
	if len(dst)-start > MaxSubjectLen {
		dst = append(appendHashToken(dst[:nameAt], name), '.')
		dst = append(dst, t...)
	}
	return dst
}

// SubjectParts is an object subject taken apart by ParseSubject.
type SubjectParts struct {
	Prefix    string // e.g. "k8s" or "acme.k8s"
	Cluster   string
	Group     string // "" for the core group
	Version   string
	Resource  string
	Namespace string // "" for cluster-scoped objects
	// Name is the object name; empty when the subject carries a hash token.
	Name string
	// NameHash is the hash token ("%H..."), set instead of Name when the
	// name was too long for the subject; the name is in the k8sname
	// extension, and HashToken(name) == NameHash.
	NameHash string
	Type     Type
}

// ParseSubject inverts the subject of an object change:
// <prefix>.<cluster>.<group>.<version>.<resource>.<namespace>.<name>.<type>.
// The prefix may span several tokens; the last seven are fixed. Control
// subjects (…._relayd.<source>.sync.<started|completed> and
// …._relayd.<source>.heartbeat) are recognised and rejected with an error
// wrapping ErrControlSubject (ParseControlSubject takes them apart).
func ParseSubject(subject string) (SubjectParts, error) {
	var p SubjectParts
	fail := func(msg string) (SubjectParts, error) {
		return SubjectParts{}, errors.New("subject " + strconv.Quote(subject) + ": " + msg)
	}
	if c, err := ParseControlSubject(subject); err == nil {
		return SubjectParts{}, fmt.Errorf("subject %q: %w (%s of source %q)", subject, ErrControlSubject, c.Event, c.Source)
	}
	// Split the last seven tokens off from the right.
	var toks [7]string
	rest := subject
	for k := 6; k >= 0; k-- {
		dot := strings.LastIndexByte(rest, '.')
		if dot < 0 {
			return fail("not an object subject (too few tokens)")
		}
		toks[k] = rest[dot+1:]
		rest = rest[:dot]
	}
	p.Prefix = rest
	for _, tok := range strings.Split(rest, ".") {
		if !validToken(tok) {
			return fail("invalid prefix token " + strconv.Quote(tok))
		}
	}
	for _, tok := range toks {
		if tok == "" {
			return fail("empty token")
		}
	}
	switch t := Type(toks[6]); t {
	case Added, Modified, Deleted:
		p.Type = t
	default:
		return fail("not an object subject (last token " + strconv.Quote(toks[6]) + ")")
	}
	if !validToken(toks[0]) {
		return fail("invalid cluster token " + strconv.Quote(toks[0]))
	}
	p.Cluster = toks[0]
	var err error
	slots := [...]struct {
		dst         *string
		placeholder string
		what        string
	}{
		{&p.Group, CoreGroupToken, "group"},
		{&p.Version, EmptyToken, "version"},
		{&p.Resource, EmptyToken, "resource"},
		{&p.Namespace, EmptyToken, "namespace"},
	}
	for k, s := range slots {
		if *s.dst, err = decodeSlot(toks[k+1], s.placeholder); err != nil {
			return fail(s.what + " token: " + err.Error())
		}
	}
	if nameTok := toks[5]; strings.HasPrefix(nameTok, HashTokenPrefix) {
		if !isHashToken(nameTok) {
			return fail("malformed hash token " + strconv.Quote(nameTok))
		}
		p.NameHash = nameTok
	} else if p.Name, err = decodeSlot(nameTok, EmptyToken); err != nil {
		return fail("name token: " + err.Error())
	}
	return p, nil
}

func isHashToken(tok string) bool {
	if len(tok) != len(HashTokenPrefix)+32 {
		return false
	}
	for i := len(HashTokenPrefix); i < len(tok); i++ {
		if c := tok[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// validToken reports whether tok is a non-empty run of A-Z a-z 0-9 _ -, the
// characters allowed in the fixed tokens (prefix, cluster, source).
func validToken(tok string) bool {
	if tok == "" {
		return false
	}
	for i := 0; i < len(tok); i++ {
		c := tok[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}
