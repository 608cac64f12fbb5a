package event

import (
	"unicode/utf8"

	"github.com/cespare/xxhash/v2"
)

// Author is who made an object's change, as its metadata.managedFields
// records it: the field manager, the operation (Apply or Update) and the
// subresource of the entries with the newest time (docs/CONSUMING.md, "Who
// changed it"). managedFields times have one-second resolution, so several
// entries may share the newest time: all of them are named, in the order of
// managedFields. The zero Author names nobody (no managedFields, or no
// entry with a time).
//
// An Author names at most MaxAuthorEntries entries, the first ones in the
// order of managedFields; the Encoder cuts what it names further so that
// each of the three extensions stays within MaxExtensionBytes (capped).
//
// An Author aliases the Raw of the Object it was read from.
type Author struct {
	raw []byte
	n   int
	// left is how many more entries qualified than the n named (past
	// MaxAuthorEntries).
	left int
	// cut: the one entry named has values longer than MaxExtensionBytes,
	// which the extensions carry cut to that length (capped).
	cut bool
	e   [inlineAuthors]authorEntry
	// more holds the entries past the first inlineAuthors (rare: that many
	// managers in one second).
	more []authorEntry
}

// MaxAuthorEntries is how many managedFields entries the extensions
// k8smanager, k8soperation and k8ssubresource name at most: the first ones,
// in the order of managedFields (docs/CONSUMING.md, "Truncated extensions").
const MaxAuthorEntries = 16

// MaxExtensionBytes is the most bytes the value of each extension computed
// from what writers put in the object (k8smanager, k8soperation,
// k8ssubresource, relaydchanged, relaydchangedunknown) has, as the
// CloudEvents attribute value (before a ce-* header's percent-encoding or
// JSON's escaping, which at most multiply it by 3 and 6): the Encoder names
// only the entries or paths that fit, and flags the event relaydtruncated
// (docs/CONSUMING.md, "Truncated extensions").
const MaxExtensionBytes = 2048

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

// Len is the number of entries named: at most MaxAuthorEntries (the
// Encoder may name fewer, within MaxExtensionBytes).
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
func (a *Author) Manager() string   { return string(a.appendPart(nil, authorManager)) }
func (a *Author) Operation() string { return string(a.appendPart(nil, authorOperation)) }
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
	if a.cut {
		start := len(dst)
		a.cut = false
		dst = a.appendPart(dst, p)
		a.cut = true
		return dst[:start+cutLen(dst[start:], MaxExtensionBytes)]
	}
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
	if a.n == 1 && !a.cut {
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

// Author is AuthorSince(0): the entries of the newest second.
func (o *Object) Author() Author {
	a, _ := o.AuthorSince(0)
	return a
}

// AuthorSince reads who made o's change from its metadata.managedFields,
// given the digest of the managedFields of the version published before it
// (prev; 0 when not known), and returns the digest of o's own:
//
//   - prev known: the entries that are new or whose manager, operation,
//     apiVersion, subresource or time differ from that version's entries:
//     the managers that wrote since it. Their fields (fieldsV1) are left
//     out of the comparison: a manager whose fields another took over
//     keeps its time, and did not write. Nobody when no entry is new or
//     newer (for example a manager writing twice within one second, or a
//     second scale by the manager of the scale subresource, whose entries
//     carry no time);
//   - prev not known: the entries of the newest second (entries without a
//     time, as the apiserver writes those of the scale subresource, are
//     never the newest).
//
// The digest holds a 16-bit hash of each entry's bytes but fieldsV1 (xxhash), up to
// maxDigestEntries entries; 0 (not known) for more, or for none. An entry
// whose hash collides with one of the previous version's reads as
// unchanged: a change is then named by the other entries that differ, or by
// nobody (about 4 in 65,536 changed entries); an entry is never named
// without differing. The zero Author and digest 0 when o was not parsed or
// has no managedFields. It scans only the managedFields value, which
// ParseObject located, and allocates nothing for up to inlineAuthors named
// entries.
func (o *Object) AuthorSince(prev uint64) (Author, uint64) {
	m := &o.fix[fxManagedFields]
	if !o.parsed() || m.key == 0 {
		return Author{}, 0
	}
	data := o.Raw[:m.val]
	i, _, err := scanString(data, m.key)
	if err != nil {
		return Author{}, 0
	}
	if i, err = skipColon(data, i); err != nil {
		return Author{}, 0
	}
	if i = skipWS(data, i); i >= len(data) || data[i] != '[' {
		return Author{}, 0 // null, or not a list
	}
	sc := entryScan{data: data, prev: prev, changed: Author{raw: o.Raw}, newest: Author{raw: o.Raw}}
	if !sc.recorded(o) {
		sc.reset()
		sc.slow(i)
	}
	digest := sc.digest
	if sc.n > maxDigestEntries {
		digest = 0
	}
	if prev != 0 {
		return sc.changed, digest
	}
	return sc.newest, digest
}

// entryScan reads the entries of a managedFields list: the entries not in
// prev (changed), those of the newest second (newest), and the digest.
type entryScan struct {
	data            []byte
	prev            uint64
	changed, newest Author
	latest          strSpan // the newest time so far
	digest          uint64
	n               int // entries read
}

func (sc *entryScan) reset() {
	sc.changed.clear()
	sc.newest.clear()
	sc.latest, sc.digest, sc.n = strSpan{}, 0, 0
}

// add takes the entry data[start:end], whose fieldsV1 value is
// data[fields[0]:fields[1]] ({0, 0}: none), with its strings e and time t.
func (sc *entryScan) add(start, end int, fields [2]int, e authorEntry, t strSpan) {
	h := entryHash(sc.data, start, end, fields)
	if sc.n < maxDigestEntries {
		sc.digest |= uint64(h) << (16 * sc.n)
	}
	sc.n++
	if sc.prev != 0 && !digestHas(sc.prev, h) {
		sc.changed.add(e)
	}
	if t.end > t.start {
		switch c := compareSpans(sc.data, t, sc.latest); {
		case c > 0:
			sc.latest = t
			sc.newest.clear()
			sc.newest.add(e)
		case c == 0:
			sc.newest.add(e)
		}
	}
}

// recorded reads the entries o's parse recorded (see skipManagedFields)
// without walking their fieldsV1 again; false when it did not record them
// all (more than maxMFEntries, or a Shaping walked the list).
func (sc *entryScan) recorded(o *Object) bool {
	if !o.mfOK || int(o.mfN) > maxMFEntries {
		return false
	}
	for k := range int(o.mfN) {
		r := &o.mf[k]
		if r.start == r.end {
			continue // not an object
		}
		var e authorEntry
		var t strSpan
		fields := [2]int{int(r.fv0), int(r.fv1)}
		if _, err := entryMembers(sc.data, int(r.start), &e, &t, &fields); err != nil {
			return false
		}
		sc.add(int(r.start), int(r.end), fields, e, t)
	}
	return true
}

// entryField is where the string member named k of an entry goes (nil: not
// read).
func entryField(e *authorEntry, t *strSpan, k []byte) *strSpan {
	switch string(k) {
	case "manager":
		return &e.manager
	case "operation":
		return &e.operation
	case "subresource":
		return &e.subresource
	case "time":
		return t
	}
	return nil
}

// slow reads the list at data[i] == '[' member by member (validated by
// ParseObject already: an error only stops the reading).
func (sc *entryScan) slow(i int) {
	data := sc.data
	for i = skipWS(data, i+1); i < len(data) && data[i] != ']'; {
		var end int
		var err error
		if data[i] == '{' {
			var e authorEntry
			var t strSpan
			var fields [2]int // the fieldsV1 value; none: {0, 0}
			if end, err = entryMembers(data, i, &e, &t, &fields); err != nil {
				return
			}
			sc.add(i, end, fields, e, t)
		} else if end, err = skipValue(data, i, 2); err != nil {
			return
		}
		if i = skipWS(data, end); i < len(data) && data[i] == ',' {
			i = skipWS(data, i+1)
		}
	}
}

// entryHash is the 16-bit hash of the managedFields entry data[start:end]
// without its fieldsV1 value (never 0: 0 is an empty slot of a digest).
func entryHash(data []byte, start, end int, fields [2]int) uint16 {
	var d xxhash.Digest
	d.Reset()
	if fields[1] > fields[0] {
		_, _ = d.Write(data[start:fields[0]])
		_, _ = d.Write(data[fields[1]:end])
	} else {
		_, _ = d.Write(data[start:end])
	}
	if h := uint16(d.Sum64()); h != 0 {
		return h
	}
	return 1
}

// maxDigestEntries is how many entries a managedFields digest holds.
const maxDigestEntries = 4

// digestHas reports whether digest d holds the 16-bit hash h.
func digestHas(d uint64, h uint16) bool {
	for k := range maxDigestEntries {
		if uint16(d>>(16*k)) == h {
			return true
		}
	}
	return false
}

// add names e, if fewer than MaxAuthorEntries are named; otherwise it
// counts it as left out.
func (a *Author) add(e authorEntry) {
	switch {
	case a.n >= MaxAuthorEntries:
		a.left++
		return
	case a.n < inlineAuthors:
		a.e[a.n] = e
	default:
		a.more = append(a.more, e)
	}
	a.n++
}

// clear names nobody, keeping the buffer of more.
func (a *Author) clear() {
	a.n, a.left, a.cut, a.more = 0, 0, false, a.more[:0]
}

// cutLen is the length of s cut to at most max bytes without splitting a
// UTF-8 sequence.
func cutLen(s []byte, max int) int {
	if len(s) <= max {
		return len(s)
	}
	n := max
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return n
}

// capped returns what the extensions of a name within the caps
// (MaxAuthorEntries, MaxExtensionBytes): a itself when all of it fits, else
// a copy naming the first entries whose values fit (or, when not even the
// first one's do, that entry with its values cut), and which extensions
// that leaves incomplete (truncK8s* bits of the relaydtruncated
// extension).
func (a *Author) capped() (*Author, uint8) {
	if a.n == 0 || (a.left == 0 && a.quickFits()) {
		return a, 0
	}
	var lens [3]int // values of the first k entries as a list
	var first [3]int
	var buf []byte
	k := 0
	for ; k < a.n; k++ {
		var item [3]int
		for p := range 3 {
			sp := a.entry(k).part(p)
			buf = appendUnquoted(buf[:0], a.raw[sp.start:sp.end])
			if k == 0 {
				first[p] = len(buf)
			}
			item[p] = len(buf)
			for _, c := range buf {
				if c == '%' || c == ',' {
					item[p] += 2
				}
			}
		}
		fits := true
		for p := range 3 {
			if lens[p]+b2i(k > 0)+item[p] > MaxExtensionBytes {
				fits = false
			}
		}
		if !fits {
			break
		}
		for p := range 3 {
			lens[p] += b2i(k > 0) + item[p]
		}
	}
	if k == a.n && a.left == 0 {
		return a, 0
	}
	c := *a
	c.n = k
	if k < 2 {
		c.n = 1 // named on its own: not list-escaped
	}
	c.left += a.n - c.n
	var trunc uint8
	if c.left > 0 {
		trunc = truncK8sManager | truncK8sOperation | truncK8sSubresource
	}
	if c.n == 1 {
		for p, bit := range [3]uint8{truncK8sManager, truncK8sOperation, truncK8sSubresource} {
			if first[p] > MaxExtensionBytes {
				c.cut = true
				trunc |= bit
			}
		}
	}
	return &c, trunc
}

// quickFits reports, without decoding, that the values of every named
// entry fit within MaxExtensionBytes: each raw byte decodes and
// list-escapes to at most 3.
func (a *Author) quickFits() bool {
	for p := range 3 {
		n := a.n - 1
		for i := range a.n {
			sp := a.entry(i).part(p)
			n += 3 * (sp.end - sp.start)
		}
		if n > MaxExtensionBytes {
			return false
		}
	}
	return true
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
// past it. Members of other types are ignored. The span of the fieldsV1
// value goes to *fields; when *fields is set already (recorded by the
// parse), that value is jumped over instead of walked.
func entryMembers(data []byte, i int, e *authorEntry, t *strSpan, fields *[2]int) (int, error) {
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
		sp := entryField(e, t, k)
		if sp != nil && data[i] == '"' {
			end, flags, err := scanString(data, i)
			if err != nil {
				return 0, err
			}
			*sp = strSpan{start: i + 1, end: end - 1, flags: flags}
			i = end
		} else if fields[1] > 0 && i == fields[0] {
			i = fields[1]
		} else {
			start := i
			if i, err = skipValue(data, i, 3); err != nil {
				return 0, err
			}
			if string(k) == "fieldsV1" {
				*fields = [2]int{start, i}
			}
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
