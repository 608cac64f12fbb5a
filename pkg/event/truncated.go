package event

// The extensions a relaydtruncated extension can name, as bits, in the
// order it lists them.
const (
	truncK8sManager uint8 = 1 << iota
	truncK8sOperation
	truncK8sSubresource
	truncChanged
	truncChangedUnknown
)

// truncNames are the extension names of the trunc* bits, in bit order.
var truncNames = [...]string{"k8smanager", "k8soperation", "k8ssubresource", "relaydchanged", "relaydchangedunknown"}

// appendTruncated appends the names of the extensions of bits, joined by
// ',' (the value of relaydtruncated).
func appendTruncated(dst []byte, bits uint8) []byte {
	first := true
	for i, name := range truncNames {
		if bits&(1<<i) == 0 {
			continue
		}
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = append(dst, name...)
	}
	return dst
}

// capped returns what the extensions of s name within MaxExtensionBytes:
// s itself when all of it fits, else a copy with the paths that do not fit
// (the last ones, in changedPaths order) left out of each list, and which
// extensions that leaves incomplete (truncChanged, truncChangedUnknown).
func (s *ChangedSet) capped() (*ChangedSet, uint8) {
	if s.Changed|s.Unknown == 0 {
		return s, 0
	}
	total := 0
	for _, p := range s.Paths {
		total += len(p) + 1
	}
	if total <= MaxExtensionBytes+1 {
		return s, 0 // all paths joined fit
	}
	c := *s
	var trunc uint8
	c.Changed = capBits(s.Paths, s.Changed)
	if c.Changed != s.Changed {
		trunc |= truncChanged
	}
	c.Unknown = capBits(s.Paths, s.Unknown)
	if c.Unknown != s.Unknown {
		trunc |= truncChangedUnknown
	}
	return &c, trunc
}

// capBits is bits without the paths past those that, joined by ',', fit
// within MaxExtensionBytes.
func capBits(paths []string, bits uint64) uint64 {
	n := -1
	for i, p := range paths {
		if i >= MaxChangedPaths || bits&(1<<i) == 0 {
			continue
		}
		if n += 1 + len(p); n > MaxExtensionBytes {
			return bits & (1<<i - 1)
		}
	}
	return bits
}

// truncBits are the bits of the extensions a names (none for nobody).
func (a *Author) truncBits() uint8 {
	if a.n == 0 {
		return 0
	}
	b := truncK8sManager | truncK8sOperation
	if a.has(authorSubresource) {
		b |= truncK8sSubresource
	}
	return b
}

// truncBits are the bits of the extensions s adds.
func (s *ChangedSet) truncBits() uint8 {
	var b uint8
	if s.Changed != 0 {
		b |= truncChanged
	}
	if s.Unknown != 0 {
		b |= truncChangedUnknown
	}
	return b
}
