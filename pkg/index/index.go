// Package index keeps, per watch, the set of objects relayd has published:
// uid → (resourceVersion, namespace/name). It is what turns a relist after a
// 410 Gone into exact news instead of a flood or a silent gap: objects whose
// uid and resourceVersion are already in the index are not republished, and
// every indexed object the relist no longer contains is reported deleted.
//
// The in-memory [Index] is compact (about 100–160 bytes per object, see
// BenchmarkIndexBytesPerObject): uids are stored as 16-byte keys, numeric
// resourceVersions as integers, and namespace/name as one string. The
// durable copy lives in a NATS JetStream key-value bucket ([Bucket]); relayd
// writes it through the same publish pipeline as the events, after the
// event's PubAck, so the bucket never claims a version that was not
// published.
package index

import (
	"crypto/sha256"
	"strconv"
	"strings"
)

// Object is one indexed object.
type Object struct {
	UID             string
	Namespace       string // "" for cluster-scoped objects
	Name            string
	ResourceVersion string
	// Fingerprint is a hash of the published version minus the source's
	// ignoreChanges paths (event.Fingerprinter: keyed with
	// nats.index.fingerprintKeyFile, else event.Object.Fingerprint); 0 when
	// the source has none, or when it is not known (an entry written by an
	// older relayd, caught up from the stream, or stored under another
	// fingerprint key). Two non-zero equal fingerprints mean the object did
	// not change in any watched field.
	Fingerprint uint64
	// Managers identifies the managedFields entries of the published version
	// (event.ManagersDigest): the next version's author is the entries that
	// differ from them (docs/CONSUMING.md, "Who changed it"); 0 when not
	// known.
	Managers uint64
	// Paths are the fingerprints of the source's changedPaths in the
	// published version (event.Fingerprinter.PathFingerprints), 8 bytes
	// big-endian each, in the order of the paths (see paths.go); ""
	// when the index has no paths (Index.WithPaths), or none are known.
	// A zero fingerprint is not known.
	Paths string
	// PathSet identifies the paths and the key of Paths
	// (event.Shaping.PathSetID); the bucket stores it with them.
	PathSet uint64
}

// Outcome is what a relisted object is, compared with the index.
type Outcome int

// Outcomes of [Index.Observe].
const (
	Unchanged Outcome = iota // same uid and resourceVersion: already published
	Added                    // uid not in the index
	Modified                 // uid in the index with another resourceVersion
)

func (o Outcome) String() string {
	switch o {
	case Added:
		return "added"
	case Modified:
		return "modified"
	}
	return "unchanged"
}

// key is a uid packed into 16 bytes: the UUID itself when the uid is one (it
// always is for objects created by a kube-apiserver), else a hash of it.
type key [16]byte

// entry is 40 bytes: the resourceVersion and the sync mark share a word so
// that the fingerprint costs no memory over an index without it. An index
// with changedPaths keeps their fingerprints after the name, in the same
// string (see paths.go): 8 bytes per path, nothing without.
type entry struct {
	rvm  uint64 // numeric resourceVersion << markBits | sync mark; resourceVersion 0 means "see Index.rvs"
	fp   uint64 // Object.Fingerprint
	mf   uint64 // Object.Managers
	name string // "namespace/name", or "name" for cluster-scoped objects
}

// markBits of entry.rvm hold the sync generation that last observed the
// entry; the resourceVersion (an etcd revision) keeps the other 48 bits,
// and a larger one goes to Index.rvs like a non-numeric one.
const (
	markBits = 16
	markMask = 1<<markBits - 1
	maxRV    = 1<<(64-markBits) - 1
)

func (e entry) rv() uint64   { return e.rvm >> markBits }
func (e entry) mark() uint16 { return uint16(e.rvm & markMask) }

func (e *entry) setRV(rv uint64)     { e.rvm = rv<<markBits | e.rvm&markMask }
func (e *entry) setMark(mark uint16) { e.rvm = e.rvm&^markMask | uint64(mark) }

// Index is the per-watch object index. It is not safe for concurrent use:
// one watch goroutine owns it.
type Index struct {
	m    map[key]entry
	rvs  map[key]string // resourceVersions that are not decimal integers (rare)
	uids map[key]string // uids that are not UUIDs (rare)
	mark uint16
	// npaths is how many path fingerprints follow each entry's name;
	// pathSet identifies them (see WithPaths).
	npaths  int
	pathSet uint64
}

// New returns an empty index.
func New() *Index {
	return &Index{m: map[key]entry{}}
}

// Len is the number of indexed objects.
func (x *Index) Len() int { return len(x.m) }

// text is what the index reads uids, names and resourceVersions from: the
// strings of an Object, or the bytes of a bucket entry being loaded (see
// putLoaded), which the index never keeps (it copies what it stores).
type text interface{ string | []byte }

func keyOf[S text](uid S) (k key, isUUID bool) {
	if parseUUID(uid, &k) {
		return k, true
	}
	sum := sha256.Sum256([]byte(uid))
	copy(k[:], sum[:16])
	return k, false
}

// parseUUID parses the canonical lower-case 36-character form (only that
// round-trips through uidOf; anything else is hashed and kept verbatim).
func parseUUID[S text](s S, k *key) bool {
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return false
	}
	j := 0
	for i := 0; i < 36; {
		if s[i] == '-' {
			i++
			continue
		}
		hi, ok1 := unhex(s[i])
		lo, ok2 := unhex(s[i+1])
		if !ok1 || !ok2 {
			return false
		}
		k[j] = hi<<4 | lo
		j++
		i += 2
	}
	return true
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

const hexDigits = "0123456789abcdef"

func (x *Index) uidOf(k key) string {
	if u, ok := x.uids[k]; ok {
		return u
	}
	var b [36]byte
	j := 0
	for i := 0; i < 16; i++ {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			b[j] = '-'
			j++
		}
		b[j], b[j+1] = hexDigits[k[i]>>4], hexDigits[k[i]&0xf]
		j += 2
	}
	return string(b[:])
}

// parseRV returns the resourceVersion as an integer when it is a canonical
// decimal (no sign, no leading zero) that fits in 48 bits, else 0. It is only used to
// store it compactly; resourceVersions are compared for equality.
func parseRV[S text](rv S) uint64 {
	if len(rv) == 0 || rv[0] == '0' || len(rv) > 19 { // 19 digits cannot overflow
		return 0
	}
	var n uint64
	for i := 0; i < len(rv); i++ {
		c := rv[i]
		if c < '0' || c > '9' {
			return 0
		}
		n = n*10 + uint64(c-'0')
	}
	if n > maxRV {
		return 0
	}
	return n
}

func (x *Index) rvOf(k key, e entry) string {
	if rv := e.rv(); rv != 0 {
		return strconv.FormatUint(rv, 10)
	}
	return x.rvs[k]
}

func sameRV[S text](x *Index, k key, e entry, rv S) bool {
	if n := parseRV(rv); n != 0 {
		return e.rv() == n
	}
	return e.rv() == 0 && x.rvs[k] == string(rv)
}

// joinName is "namespace/name" (or "name"), in one allocation.
func joinName[S text](ns, name S) string {
	if len(ns) == 0 {
		return string(name)
	}
	var b strings.Builder
	b.Grow(len(ns) + 1 + len(name))
	writeText(&b, ns)
	b.WriteByte('/')
	writeText(&b, name)
	return b.String()
}

func writeText[S text](b *strings.Builder, s S) {
	switch s := any(s).(type) {
	case string:
		b.WriteString(s)
	case []byte:
		b.Write(s)
	}
}

func (x *Index) object(k key, e entry) Object {
	name, paths := x.split(e)
	o := Object{UID: x.uidOf(k), ResourceVersion: x.rvOf(k, e), Name: name, Fingerprint: e.fp, Managers: e.mf, Paths: paths}
	if paths != "" {
		o.PathSet = x.pathSet
	}
	// Names and namespaces cannot contain '/' (they are path segments).
	if i := strings.IndexByte(name, '/'); i >= 0 {
		o.Namespace, o.Name = name[:i], name[i+1:]
	}
	return o
}

// fields are an object's uid, namespace, name and resourceVersion, and its
// path fingerprints (Object.Paths).
type fields[S text] struct{ uid, ns, name, rv, paths S }

func fieldsOf(o Object) fields[string] {
	return fields[string]{o.UID, o.Namespace, o.Name, o.ResourceVersion, o.Paths}
}

func store[S text](x *Index, k key, isUUID bool, o fields[S], fp, mf uint64, old entry, existed bool) {
	e := old
	if x.npaths > 0 {
		storeName(x, &e, o, existed)
	} else if !existed || e.name == "" {
		e.name = joinName(o.ns, o.name)
	}
	e.fp, e.mf = fp, mf
	e.setRV(parseRV(o.rv))
	if e.rv() == 0 {
		if x.rvs == nil {
			x.rvs = map[key]string{}
		}
		x.rvs[k] = string(o.rv)
	} else if x.rvs != nil {
		delete(x.rvs, k)
	}
	if !isUUID {
		if x.uids == nil {
			x.uids = map[key]string{}
		}
		x.uids[k] = string(o.uid)
	}
	x.m[k] = e
}

// Get returns the indexed object with uid.
func (x *Index) Get(uid string) (Object, bool) {
	k, _ := keyOf(uid)
	e, ok := x.m[k]
	if !ok {
		return Object{}, false
	}
	return x.object(k, e), true
}

// Has reports whether an object with uid is indexed, without allocating.
func (x *Index) Has(uid string) bool {
	k, _ := keyOf(uid)
	_, ok := x.m[k]
	return ok
}

// Managers returns the Managers of the indexed object with uid (0 when not
// indexed or not known), without allocating.
func (x *Index) Managers(uid string) uint64 {
	k, _ := keyOf(uid)
	return x.m[k].mf
}

// Put records o as published (a watch ADDED or MODIFIED); it reports
// whether that changed the index (false: this version was indexed already).
func (x *Index) Put(o Object) bool {
	return put(x, fieldsOf(o), o.Fingerprint, o.Managers)
}

// putLoaded is Put of an object read from the bucket, given as the bytes
// of its entry's members: the index keeps copies, never the bytes.
func (x *Index) putLoaded(o fields[[]byte], fp, mf uint64) bool {
	if x.npaths == 0 {
		o.paths = nil
	}
	return put(x, o, fp, mf)
}

func put[S text](x *Index, o fields[S], fp, mf uint64) bool {
	k, isUUID := keyOf(o.uid)
	e, ok := x.m[k]
	if ok && sameRV(x, k, e, o.rv) && (fp == 0 || e.fp == fp) && (mf == 0 || e.mf == mf) && samePaths(x, e, o.paths) {
		return false
	}
	store(x, k, isUUID, o, fp, mf, e, ok)
	return true
}

// Same reports whether o's uid is indexed with a non-zero fingerprint equal
// to o's: the object changed only in fields the source ignores, so the
// change is not published (and the index keeps the published version).
func (x *Index) Same(o Object) bool {
	if o.Fingerprint == 0 {
		return false
	}
	k, _ := keyOf(o.UID)
	e, ok := x.m[k]
	return ok && e.fp == o.Fingerprint
}

// Delete forgets uid (a watch DELETED); it reports whether uid was indexed.
func (x *Index) Delete(uid string) bool {
	k, _ := keyOf(uid)
	if _, ok := x.m[k]; !ok {
		return false
	}
	x.forget(k)
	return true
}

func (x *Index) forget(k key) {
	delete(x.m, k)
	if x.rvs != nil {
		delete(x.rvs, k)
	}
	if x.uids != nil {
		delete(x.uids, k)
	}
}

// BeginSync starts a relist: every object the relist contains is then
// passed to Observe, and EndSync reports the ones it did not contain. A
// BeginSync without EndSync (an interrupted list) is simply superseded by
// the next BeginSync.
func (x *Index) BeginSync() {
	x.mark++
	if x.mark == 0 { // wrapped: clear old marks so none can match
		for k, e := range x.m {
			e.setMark(0)
			x.m[k] = e
		}
		x.mark = 1
	}
}

// Observe compares a relisted object with the index, records it, and marks
// it as present in the current relist. An object at another
// resourceVersion whose non-zero fingerprint equals the indexed one is
// Unchanged too (it changed only in ignored fields); the index keeps the
// version that was published.
func (x *Index) Observe(o Object) Outcome {
	k, isUUID := keyOf(o.UID)
	e, ok := x.m[k]
	out := Added
	if ok {
		if sameRV(x, k, e, o.ResourceVersion) || (o.Fingerprint != 0 && e.fp == o.Fingerprint) {
			e.setMark(x.mark)
			x.m[k] = e
			return Unchanged
		}
		out = Modified
	}
	e.setMark(x.mark)
	store(x, k, isUUID, fieldsOf(o), o.Fingerprint, o.Managers, e, ok)
	return out
}

// EndSync removes every object not observed since BeginSync, calling gone
// for each first (in no particular order), and returns how many it removed.
// If gone returns an error, EndSync stops and returns it; that object and
// the ones not yet visited stay indexed.
func (x *Index) EndSync(gone func(Object) error) (int, error) {
	n := 0
	for k, e := range x.m {
		if e.mark() == x.mark {
			continue
		}
		if gone != nil {
			if err := gone(x.object(k, e)); err != nil {
				return n, err
			}
		}
		x.forget(k)
		n++
	}
	return n, nil
}

// Range calls fn for every indexed object until fn returns false.
func (x *Index) Range(fn func(Object) bool) {
	for k, e := range x.m {
		if !fn(x.object(k, e)) {
			return
		}
	}
}

// Reset empties the index.
func (x *Index) Reset() {
	clear(x.m)
	x.rvs, x.uids = nil, nil
}
