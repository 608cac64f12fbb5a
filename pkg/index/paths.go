package index

import "strings"

// WithPaths makes x, still empty, an index of a source with n changedPaths
// whose fingerprints are identified by pathSet (event.Shaping.PathSetID):
// every entry then keeps n path fingerprints (Object.Paths), 8 bytes each
// in the same string as its name, and loads them from bucket entries
// stored under the same pathSet only (others load as not known). n == 0:
// none, at no cost. It returns x.
func (x *Index) WithPaths(n int, pathSet uint64) *Index {
	x.npaths, x.pathSet = n, pathSet
	return x
}

// PathSet is the pathSet of WithPaths (0: none).
func (x *Index) PathSet() uint64 { return x.pathSet }

// Paths returns the Paths of the indexed object with uid ("" when not
// indexed, or when the index has no paths), without allocating.
func (x *Index) Paths(uid string) string {
	if x.npaths == 0 {
		return ""
	}
	k, _ := keyOf(uid)
	e, ok := x.m[k]
	if !ok {
		return ""
	}
	_, p := x.split(e)
	return p
}

// split returns an entry's "namespace/name" and its path fingerprints (""
// when none is known).
func (x *Index) split(e entry) (name, paths string) {
	n := 8 * x.npaths
	if n == 0 || len(e.name) < n {
		return e.name, ""
	}
	name, paths = e.name[:len(e.name)-n], e.name[len(e.name)-n:]
	if strings.Count(paths, "\x00") == n {
		return name, ""
	}
	return name, paths
}

// samePaths reports whether paths ("" or of another length: not known)
// would leave e's path fingerprints as they are.
func samePaths[S text](x *Index, e entry, paths S) bool {
	return len(paths) != 8*x.npaths || x.pathsOf(e) == string(paths)
}

func (x *Index) pathsOf(e entry) string {
	_, p := x.split(e)
	return p
}

// storeName sets e.name to the name of o followed by its path
// fingerprints (zeros when not known: o.paths "" or of another length);
// one allocation when they change.
func storeName[S text](x *Index, e *entry, o fields[S], existed bool) {
	name, old := x.split(*e)
	if !existed {
		name = ""
	}
	n := 8 * x.npaths
	known := len(o.paths) == n
	if name != "" && known && string(o.paths) == old {
		return
	}
	var b strings.Builder
	if name != "" {
		b.Grow(len(name) + n)
		b.WriteString(name)
	} else {
		b.Grow(len(o.ns) + 1 + len(o.name) + n)
		if len(o.ns) > 0 {
			writeText(&b, o.ns)
			b.WriteByte('/')
		}
		writeText(&b, o.name)
	}
	if known {
		writeText(&b, o.paths)
	} else {
		for range n {
			b.WriteByte(0)
		}
	}
	e.name = b.String()
}

// maxPaths is the most path fingerprints an entry holds
// (event.MaxChangedPaths).
const maxPaths = 64

// pathsHex is the "paths" member of o's bucket entry: its PathSet and its
// Paths, 16 lower-case hex digits each; "" when no path fingerprint is
// known.
func pathsHex(o Object) string {
	if o.PathSet == 0 || len(o.Paths) == 0 || len(o.Paths)%8 != 0 || strings.Count(o.Paths, "\x00") == len(o.Paths) {
		return ""
	}
	b := make([]byte, 0, 16+2*len(o.Paths))
	b = appendHex64(b, o.PathSet)
	for i := 0; i < len(o.Paths); i++ {
		b = append(b, hexDigits[o.Paths[i]>>4], hexDigits[o.Paths[i]&0xf])
	}
	return string(b)
}

func appendHex64(b []byte, v uint64) []byte {
	for s := 60; s >= 0; s -= 4 {
		b = append(b, hexDigits[v>>uint(s)&0xf])
	}
	return b
}

// parsePathsHex reads a "paths" member: the path set and the fingerprints,
// appended to dst as 8 bytes each. ok is false unless it is 16 hex digits
// and 1 to maxPaths times 16 more.
func parsePathsHex(s, dst []byte) (set uint64, paths []byte, ok bool) {
	if len(s) < 32 || len(s)%16 != 0 || len(s) > 16*(maxPaths+1) {
		return 0, nil, false
	}
	if set, ok = parseHex64(s[:16]); !ok {
		return 0, nil, false
	}
	for i := 16; i < len(s); i += 16 {
		v, ok := parseHex64(s[i : i+16])
		if !ok {
			return 0, nil, false
		}
		for sh := 56; sh >= 0; sh -= 8 {
			dst = append(dst, byte(v>>uint(sh)))
		}
	}
	return set, dst, true
}
