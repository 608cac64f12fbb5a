package event

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/cespare/xxhash/v2"
)

// MaxChangedPaths is how many changedPaths a source may list: a change is
// reported as two 64-bit sets of them (ChangedSet).
const MaxChangedPaths = 64

// checkChangedPath says why p, the i-th path of changedPaths, cannot be
// one: a changed path selects one member, so it has no [*] step.
func checkChangedPath(p Path, i int) error {
	if i >= MaxChangedPaths {
		return fmt.Errorf("more than %d changedPaths", MaxChangedPaths)
	}
	for _, sg := range p.segs {
		if sg.all {
			return fmt.Errorf("%q has a [*] step: a changed path selects one member (select the member holding the list)", p.String())
		}
	}
	return nil
}

// ChangedPaths returns the canonical form of the ChangedPaths paths, in
// order (nil for a nil s).
func (s *Shaping) ChangedPaths() []string {
	if s == nil {
		return nil
	}
	return s.chg
}

// NumChangedPaths is len(ChangedPaths()).
func (s *Shaping) NumChangedPaths() int {
	if s == nil {
		return 0
	}
	return len(s.chg)
}

// PathSetID identifies the ChangedPaths of s and the fingerprint key
// (keyID, FingerprintKey.ID; "" for none) their fingerprints are made
// with: path fingerprints stored under another PathSetID cannot be
// compared with those made now (docs/CONSUMING.md, "What changed"). Never 0
// when s has ChangedPaths; 0 otherwise.
func (s *Shaping) PathSetID(keyID string) uint64 {
	if s.NumChangedPaths() == 0 {
		return 0
	}
	var d xxhash.Digest
	d.Reset()
	_, _ = d.WriteString(keyID)
	for _, p := range s.chg {
		_, _ = d.WriteString("\n" + p)
	}
	if h := d.Sum64(); h != 0 {
		return h
	}
	return 1
}

// The values of a path fingerprint that are not hashes of a value.
const (
	// PathUnknown is a path fingerprint that is not known (an index entry
	// written before the source had changedPaths, or with other ones).
	PathUnknown uint64 = 0
	// pathAbsent is the unkeyed fingerprint of an absent member (xxhash64
	// of no bytes, which no JSON value hashes to but by collision).
	pathAbsent uint64 = 0xef46db3751d8e999
)

// PathFingerprints appends to dst[:0] one fingerprint per ChangedPaths path
// of the Shaping o was parsed with, in order: a 64-bit hash of the member's
// canonical content (canonHash: what encoding/json decodes, so member
// order, whitespace and string escapes do not count; numbers count by their
// float64 value), or the fingerprint of an absent member when o has none
// there (a member below a value that is not an object is absent). A member
// with a duplicate key counts once, as its last occurrence. Keyed with f's
// key when it has one (HMAC-SHA256 of the hash, first 64 bits). Never
// PathUnknown. It allocates nothing (dst has room) unless a member's key
// or string value with escapes is longer than 512 bytes.
func (f *Fingerprinter) PathFingerprints(o *Object, dst []uint64) []uint64 {
	n := o.sh.NumChangedPaths()
	dst = dst[:0]
	for range n {
		dst = append(dst, pathAbsent)
	}
	if n == 0 || !o.parsed() {
		return dst
	}
	for k := range o.fix {
		o.pathFingerprint(&o.fix[k], dst)
	}
	for k := range o.recs {
		o.pathFingerprint(&o.recs[k], dst)
	}
	for k := range dst {
		dst[k] = f.keyed(dst[k])
	}
	return dst
}

// pathFingerprint sets dst[m.chg] to the hash of m's value, if m is a
// changed path's member.
func (o *Object) pathFingerprint(m *member, dst []uint64) {
	if m.key == 0 || m.mask&catChanged == 0 || int(m.chg) >= len(dst) || m.chg < 0 {
		return
	}
	kend, _, err := scanString(o.Raw, m.key)
	if err != nil {
		return
	}
	v, err := skipColon(o.Raw, kend)
	if err != nil {
		return
	}
	h, _, err := canonHash(o.Raw[:m.val], v)
	if err != nil {
		return
	}
	dst[m.chg] = h
}

// keyed is h as stored: itself unkeyed, else the first 64 bits of its
// HMAC; never PathUnknown.
func (f *Fingerprinter) keyed(h uint64) uint64 {
	if f != nil && f.mac != nil {
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], h)
		f.mac.Reset()
		_, _ = f.mac.Write(b[:])
		h = binary.BigEndian.Uint64(f.mac.Sum(f.sum[:0]))
	}
	if h == PathUnknown {
		return 1
	}
	return h
}

// Type tags of canonHash, so that values of different types never hash
// alike by construction.
const (
	tagObject = 'o'
	tagArray  = 'a'
	tagString = 's'
	tagNumber = 'n'
	tagTrue   = 't'
	tagFalse  = 'f'
	tagNull   = 'z'
	tagMember = 'm'
)

// canonHash returns a 64-bit hash of the JSON value at data[i] (validated
// by the parse) that depends only on what encoding/json decodes it to: an
// object hashes as the sum of its members' hashes (member order does not
// count), a string by its decoded contents, a number by its float64 value
// (-0 as 0), and whitespace not at all. It returns the offset just past the
// value.
func canonHash(data []byte, i int) (uint64, int, error) {
	if i >= len(data) {
		return 0, 0, errTruncated(data)
	}
	switch c := data[i]; {
	case c == '{':
		return canonObject(data, i)
	case c == '[':
		return canonArray(data, i)
	case c == '"':
		end, flags, err := scanString(data, i)
		if err != nil {
			return 0, 0, err
		}
		return hashString(tagString, data[i+1:end-1], flags), end, nil
	case c == 't':
		end, err := scanLiteral(data, i, "true")
		return tagHash(tagTrue), end, err
	case c == 'f':
		end, err := scanLiteral(data, i, "false")
		return tagHash(tagFalse), end, err
	case c == 'n':
		end, err := scanLiteral(data, i, "null")
		return tagHash(tagNull), end, err
	}
	end, err := scanNumber(data, i)
	if err != nil {
		return 0, 0, err
	}
	f, err := strconv.ParseFloat(string(data[i:end]), 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return 0, 0, err
	}
	if f == 0 {
		f = 0 // -0
	}
	return hash2(tagNumber, math.Float64bits(f), 0), end, nil
}

func tagHash(tag byte) uint64 { return hash2(tag, 0, 0) }

// hash2 combines a tag and two words into one (the bytes of strings are
// hashed with xxhash64; structure is combined with this, which costs a
// few multiplications instead of a hash call per member).
func hash2(tag byte, a, b uint64) uint64 {
	return mix64(mix64(a^uint64(tag)*0x9e3779b97f4a7c15) + b*0xc2b2ae3d27d4eb4f + 1)
}

// mix64 is splitmix64's finalizer: a bijection of 64-bit words whose
// every output bit depends on every input bit.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// hashString hashes the decoded contents of the raw string s.
func hashString(tag byte, s []byte, flags uint8) uint64 {
	if !stringIsPlain(s, flags) {
		var buf [512]byte
		s = appendUnquoted(buf[:0], s)
	}
	return hash2(tag, xxhash.Sum64(s), uint64(len(s)))
}

// canonObject is canonHash of the object at data[i] == '{'.
func canonObject(data []byte, i int) (uint64, int, error) {
	var sum, n uint64
	i = skipWS(data, i+1)
	if i >= len(data) {
		return 0, 0, errTruncated(data)
	}
	if data[i] == '}' {
		return hash2(tagObject, 0, 0), i + 1, nil
	}
	for {
		kend, kflags, err := scanString(data, i)
		if err != nil {
			return 0, 0, err
		}
		k := hashString(tagMember, data[i+1:kend-1], kflags)
		if i, err = skipColon(data, kend); err != nil {
			return 0, 0, err
		}
		var v uint64
		if v, i, err = canonHash(data, i); err != nil {
			return 0, 0, err
		}
		sum += hash2(tagMember, k, v)
		n++
		next, last, err := afterMember(data, i)
		if err != nil {
			return 0, 0, err
		}
		if last {
			return hash2(tagObject, sum, n), next + 1, nil
		}
		i = next
	}
}

// canonArray is canonHash of the array at data[i] == '[': its elements'
// hashes chained in order.
func canonArray(data []byte, i int) (uint64, int, error) {
	var h, n uint64
	i = skipWS(data, i+1)
	if i >= len(data) {
		return 0, 0, errTruncated(data)
	}
	if data[i] == ']' {
		return hash2(tagArray, 0, 0), i + 1, nil
	}
	for {
		v, end, err := canonHash(data, i)
		if err != nil {
			return 0, 0, err
		}
		h, n = hash2(tagArray, h, v), n+1
		i = skipWS(data, end)
		if i >= len(data) {
			return 0, 0, errTruncated(data)
		}
		switch data[i] {
		case ',':
			i = skipWS(data, i+1)
		case ']':
			return hash2(tagArray, h, n), i + 1, nil
		default:
			return 0, 0, errInvalid(data, i, "after array element")
		}
	}
}

// ChangedSet is what changed in a modified object, for the relaydchanged
// and relaydchangedunknown extensions: of Paths (the source's canonical
// ChangedPaths), bit i of Changed says Paths[i] changed, bit i of Unknown
// that whether it changed is not known. The zero ChangedSet adds neither
// extension.
type ChangedSet struct {
	Paths            []string
	Changed, Unknown uint64
}

// CompareChanged compares the path fingerprints of a new version (cur,
// from PathFingerprints) with those of the version published before it,
// prev in the form of PathsString (a fingerprint PathUnknown, or prev
// shorter: not known).
func CompareChanged(paths []string, prev string, cur []uint64) ChangedSet {
	s := ChangedSet{Paths: paths}
	for i := range min(len(cur), len(paths), MaxChangedPaths) {
		var p uint64
		if 8*i+8 <= len(prev) {
			p = binary.BigEndian.Uint64([]byte(prev[8*i : 8*i+8]))
		}
		switch {
		case p == PathUnknown:
			s.Unknown |= 1 << i
		case p != cur[i]:
			s.Changed |= 1 << i
		}
	}
	return s
}

// PathsString is fps as 8 bytes big-endian each, as the object index
// keeps them (index.Object.Paths).
func PathsString(fps []uint64) string {
	b := make([]byte, 8*len(fps))
	for i, v := range fps {
		binary.BigEndian.PutUint64(b[8*i:], v)
	}
	return string(b)
}

// appendList appends the paths of bits joined by ','.
func (s *ChangedSet) appendList(dst []byte, bits uint64, escape bool) []byte {
	first := true
	for i, p := range s.Paths {
		if i >= MaxChangedPaths || bits&(1<<i) == 0 {
			continue
		}
		if !first {
			dst = append(dst, ',')
		}
		first = false
		if escape {
			dst = appendJSONStringContent(dst, p)
		} else {
			dst = append(dst, p...)
		}
	}
	return dst
}

// jsonLen is the length of the members appendJSON writes, escapes aside.
func (s *ChangedSet) jsonLen() int {
	if s.Changed|s.Unknown == 0 {
		return 0
	}
	n := len(`,"relaydchanged":"","relaydchangedunknown":""`)
	for _, p := range s.Paths {
		n += len(p) + 1
	}
	return n
}

// appendJSON appends relaydchanged (the paths that changed) and
// relaydchangedunknown (the paths not known to have changed or not), each
// left out when it would be empty.
func (s *ChangedSet) appendJSON(b []byte) []byte {
	if s.Changed != 0 {
		b = append(b, `,"relaydchanged":"`...)
		b = append(s.appendList(b, s.Changed, true), '"')
	}
	if s.Unknown != 0 {
		b = append(b, `,"relaydchangedunknown":"`...)
		b = append(s.appendList(b, s.Unknown, true), '"')
	}
	return b
}

// headers adds the same extensions as ce-* headers.
func (s *ChangedSet) headers(hb *headerBuilder) {
	if s.Changed != 0 {
		hb.ce(HeaderPrefix+"relaydchanged", string(s.appendList(nil, s.Changed, false)))
	}
	if s.Unknown != 0 {
		hb.ce(HeaderPrefix+"relaydchangedunknown", string(s.appendList(nil, s.Unknown, false)))
	}
}
