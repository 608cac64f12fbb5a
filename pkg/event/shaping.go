package event

import (
	"errors"
	"fmt"
	"slices"

	"github.com/cespare/xxhash/v2"
)

// LastAppliedAnnotation is the annotation in which `kubectl apply` keeps
// the whole object as last applied, often including a Secret's data or a
// ConfigMap's contents. Payloads leave it out unless
// ShapingOptions.KeepLastApplied is set.
const LastAppliedAnnotation = "kubectl.kubernetes.io/last-applied-configuration"

// ShapingOptions configures a Shaping. Paths use the syntax of ParsePath.
type ShapingOptions struct {
	// Drop lists paths removed from every payload (full and metadata).
	Drop []string
	// IgnoreChanges lists paths left out of the fingerprint: a change
	// inside them alone does not change Object.Fingerprint.
	IgnoreChanges []string
	// KeepManagedFields keeps metadata.managedFields; otherwise it is
	// removed (as AppendPayload does).
	KeepManagedFields bool
	// KeepLastApplied keeps the annotation LastAppliedAnnotation; otherwise
	// it is removed.
	KeepLastApplied bool
	// ChangedPaths lists paths whose content is fingerprinted one by one,
	// for the relaydchanged extension (Object.PathFingerprints, see
	// changed.go). At most MaxChangedPaths, none with [*].
	ChangedPaths []string
}

// Shaping is how one source shapes what it publishes; compiled once by
// NewShaping, immutable, safe for concurrent use. A nil *Shaping is valid
// everywhere one is accepted and means the zero ShapingOptions:
// managedFields and the last-applied annotation removed, nothing else.
type Shaping struct {
	opts   ShapingOptions
	root   *node    // the paths as a tree, built-in members included
	drops  []string // canonical Drop paths; node.drop indexes them
	ignore []string // canonical IgnoreChanges paths
	chg    []string // canonical ChangedPaths paths; node.chg indexes them
}

// ShapingError is one problem NewShaping found with one path.
type ShapingError struct {
	// List is "drop", "ignoreChanges" or "changedPaths" (the
	// configuration keys).
	List string
	// Index is the position of the path in its list.
	Index int
	// Err says what is wrong: a *PathError from ParsePath, or why the path
	// cannot be used.
	Err error
}

// Error returns "<list>[<index>]: <problem>", e.g.
// `drop[2]: unexpected "]" at offset 7`.
func (e *ShapingError) Error() string {
	return fmt.Sprintf("%s[%d]: %v", e.List, e.Index, e.Err)
}

// Unwrap returns Err.
func (e *ShapingError) Unwrap() error { return e.Err }

// DuplicatePathError is the Err of a ShapingError for a path listed twice
// in one list (as written or in another spelling of the same path).
type DuplicatePathError struct {
	Path  string // the canonical path
	List  string // "drop", "ignoreChanges" or "changedPaths"
	First int    // the position of its first occurrence in List
}

// Error returns e.g. `duplicate path "spec.a" (first at drop[0])`.
func (e *DuplicatePathError) Error() string {
	return fmt.Sprintf("duplicate path %q (first at %s[%d])", e.Path, e.List, e.First)
}

// NewShaping compiles o. Every problem is reported, each as a
// *ShapingError (joined with errors.Join when there are several):
//
//   - a path that does not parse (see ParsePath);
//   - a path that ends with [*] (a path selects a member; to remove a whole
//     list, select the member holding it);
//   - a path listed twice in the same list;
//   - a Drop path that selects apiVersion, kind, metadata, or
//     metadata.name, .namespace, .uid or .resourceVersion (or anything
//     below them): they identify the object in every payload;
//   - a ChangedPaths path with a [*] step, or more than MaxChangedPaths.
//
// IgnoreChanges paths may select any member.
func NewShaping(o ShapingOptions) (*Shaping, error) {
	s := &Shaping{
		opts: ShapingOptions{
			Drop:              slices.Clone(o.Drop),
			IgnoreChanges:     slices.Clone(o.IgnoreChanges),
			KeepManagedFields: o.KeepManagedFields,
			KeepLastApplied:   o.KeepLastApplied,
			ChangedPaths:      slices.Clone(o.ChangedPaths),
		},
		root: builtinTree(),
	}
	var errs []error
	add := func(list string, paths []string, cat uint8) []string {
		var canon []string
		first := map[string]int{}
		for i, str := range paths {
			p, err := ParsePath(str)
			switch {
			case err != nil:
			case cat == catChanged:
				err = checkChangedPath(p, i)
			default:
				err = checkShapingPath(p, cat == catDrop, i)
			}
			if err == nil {
				c := p.String()
				if j, dup := first[c]; dup {
					err = &DuplicatePathError{Path: c, List: list, First: j}
				} else {
					first[c] = i
				}
			}
			if err != nil {
				errs = append(errs, &ShapingError{List: list, Index: i, Err: err})
				continue
			}
			n := s.root.insert(p)
			n.mask |= cat
			switch cat {
			case catDrop:
				n.drop = int16(len(canon))
			case catChanged:
				n.chg = int16(len(canon))
			}
			canon = append(canon, p.String())
		}
		return canon
	}
	s.drops = add("drop", o.Drop, catDrop)
	s.ignore = add("ignoreChanges", o.IgnoreChanges, catIgnore)
	s.chg = add("changedPaths", o.ChangedPaths, catChanged)
	if len(errs) == 1 {
		return nil, errs[0]
	}
	if len(errs) > 1 {
		return nil, errors.Join(errs...)
	}
	return s, nil
}

// maxDropPaths bounds the Drop paths (member.drop is an int16).
const maxDropPaths = 1<<15 - 1

// checkShapingPath says why p, the i-th path of its list, cannot be a Drop
// (drop) or IgnoreChanges path.
func checkShapingPath(p Path, drop bool, i int) error {
	if drop && i >= maxDropPaths {
		return fmt.Errorf("more than %d drop paths", maxDropPaths)
	}
	if p.segs[len(p.segs)-1].all {
		parent := Path{segs: p.segs[:len(p.segs)-1]}
		return fmt.Errorf("%q ends with [*]: a path selects a member (to remove the whole list, use %q)", p.String(), parent.String())
	}
	if !drop {
		return nil
	}
	identity := p.hasPrefix("apiVersion") || p.hasPrefix("kind") || p.Len() == 1 && p.hasPrefix("metadata")
	for _, f := range []string{"name", "namespace", "uid", "resourceVersion"} {
		identity = identity || p.hasPrefix("metadata", f)
	}
	if identity {
		return fmt.Errorf("%q cannot be dropped: apiVersion, kind, metadata and metadata.name, namespace, uid and resourceVersion identify the object", p.String())
	}
	return nil
}

// Options returns the options s was compiled from (the zero options for a
// nil s).
func (s *Shaping) Options() ShapingOptions {
	if s == nil {
		return ShapingOptions{}
	}
	o := s.opts
	o.Drop = slices.Clone(o.Drop)
	o.IgnoreChanges = slices.Clone(o.IgnoreChanges)
	o.ChangedPaths = slices.Clone(o.ChangedPaths)
	return o
}

// DropPaths returns the canonical form of the Drop paths, in order.
func (s *Shaping) DropPaths() []string {
	if s == nil {
		return nil
	}
	return slices.Clone(s.drops)
}

// IgnorePaths returns the canonical form of the IgnoreChanges paths, in
// order.
func (s *Shaping) IgnorePaths() []string {
	if s == nil {
		return nil
	}
	return slices.Clone(s.ignore)
}

// node is one step of the tree of paths a parse follows. The root stands
// for the object itself.
type node struct {
	name  string
	kids  []*node // members, by name
	all   *node   // [*]: every element of an array
	mask  uint8   // cat* of the paths ending here
	fixed int8    // slot in Object.fix; -1 for none
	drop  int16   // index of the Drop path ending here in Shaping.drops; -1 for none
	chg   int16   // index of the ChangedPaths path ending here in Shaping.chg; -1 for none
}

func newNode(name string) *node { return &node{name: name, fixed: -1, drop: -1, chg: -1} }

// child returns the child of n named k, or nil (also when n is nil).
func (n *node) child(k []byte) *node {
	if n == nil {
		return nil
	}
	for _, c := range n.kids {
		if c.name == string(k) {
			return c
		}
	}
	return nil
}

// insert returns the node of p below n, creating the missing ones.
func (n *node) insert(p Path) *node {
	for _, sg := range p.segs {
		if sg.all {
			if n.all == nil {
				n.all = newNode("")
			}
			n = n.all
			continue
		}
		var next *node
		for _, c := range n.kids {
			if c.name == sg.name {
				next = c
				break
			}
		}
		if next == nil {
			next = newNode(sg.name)
			n.kids = append(n.kids, next)
		}
		n = next
	}
	return n
}

// builtinTree returns a new tree with the members every parse records.
func builtinTree() *node {
	root := newNode("")
	for _, b := range []struct {
		path  []string
		fixed int8
		cat   uint8
	}{
		{[]string{"apiVersion"}, fxAPIVersion, catVolatile},
		{[]string{"kind"}, fxKind, catVolatile},
		{[]string{"metadata", "resourceVersion"}, fxResourceVersion, catVolatile},
		{[]string{"metadata", "generation"}, fxGeneration, catVolatile},
		{[]string{"metadata", "managedFields"}, fxManagedFields, catManagedFields},
		{[]string{"metadata", "annotations", LastAppliedAnnotation}, fxLastApplied, catLastApplied},
	} {
		var p Path
		for _, name := range b.path {
			p.segs = append(p.segs, pathSeg{name: name})
		}
		n := root.insert(p)
		n.fixed = b.fixed
		n.mask |= b.cat
	}
	return root
}

// defaultRoot is the tree of a nil *Shaping.
var defaultRoot = builtinTree()

// AppendShaped appends the payload for mode, like AppendPayload, but with
// the cuts of the Shaping applied: the Drop paths, metadata.managedFields
// (unless KeepManagedFields) and the annotation LastAppliedAnnotation
// (unless KeepLastApplied); s == nil removes managedFields and the
// annotation. The bytes between the cuts are copied unchanged, and the
// result is always valid JSON: removing a member takes one adjacent comma
// with it, and a member inside a removed one goes with it. An object left
// with no members reads {} (for example "annotations":{} when the
// last-applied annotation was the only one).
//
// The metadata payload applies the same cuts inside metadata; the reference
// payload is built from Meta and is never cut.
//
// It also returns the canonical form of the Drop paths that removed
// something from this payload (in Drop order; nil if none), for the
// relayddropped extension ([Change.Dropped]). A path whose members were
// all inside a member removed by another path removed nothing itself.
//
// The cuts are those recorded by the parse: s must be the Shaping o was
// parsed with (ParseObjectShaped, ParseWatchEventShaped; nil for
// ParseObject and ParseWatchEvent). Of s only KeepManagedFields and
// KeepLastApplied are read here.
func (o *Object) AppendShaped(dst []byte, mode PayloadMode, s *Shaping) ([]byte, []string) {
	mask := catDrop | catManagedFields | catLastApplied
	if s != nil {
		if s.opts.KeepManagedFields {
			mask &^= catManagedFields
		}
		if s.opts.KeepLastApplied {
			mask &^= catLastApplied
		}
	}
	var c cutter
	dst = o.appendPayload(dst, mode, mask, &c)
	return dst, c.droppedPaths(o)
}

// Fingerprint returns a 64-bit xxhash of the object's bytes minus the
// members selected by the IgnoreChanges paths and minus apiVersion, kind,
// metadata.resourceVersion, metadata.generation and metadata.managedFields,
// which are always left out: resourceVersion and managedFields change on
// every write, generation with every spec change, and apiVersion and kind
// are fixed for a source but missing from list items of built-in kinds (so
// an object reads the same from a list as from a watch). The bytes between
// the cuts are hashed as they are, without decoding or re-encoding.
//
// Two objects that differ only inside ignored members (including whether
// those members are there at all) have the same fingerprint; any other byte
// difference changes it (barring a 64-bit hash collision; the comma and
// whitespace next to a removed member go with it). Byte equality is the right notion of "unchanged"
// because the apiserver serializes a given object deterministically: the
// same members in the same order with the same formatting, so an object
// that did not change outside the ignored paths reads the same bytes. (A
// server or version that reordered members would change every fingerprint
// once: at worst one spurious event per object.)
//
// The Drop paths are not left out: a change in a dropped field is a change
// (list it in IgnoreChanges as well to suppress it), and neither is the
// last-applied annotation. The value is stable across processes and relayd
// versions for the same bytes and paths (xxhash64, seed 0): anyone can
// recompute it, so it can confirm a guess of a member the payload leaves
// out; Fingerprinter with a FingerprintKey makes the keyed form. The spans are
// those recorded by the parse: s must be the Shaping o was parsed with, as
// for AppendShaped. An Object without byte spans has fingerprint 0.
func (o *Object) Fingerprint(s *Shaping) uint64 {
	_ = s // the ignored members were recorded by the parse
	if !o.parsed() {
		return 0
	}
	// '{' and then the object after its opening brace: an object narrowed
	// to its metadata by OverrideTypeMeta (whose start is then the byte
	// before the metadata key) hashes like the same object unnarrowed.
	var c cutter
	c.init(o, o.start+1, o.end, fingerprintMask)
	var d xxhash.Digest
	d.Reset()
	_, _ = d.Write([]byte{'{'})
	for {
		a, b, ok := c.next(o)
		if !ok {
			return d.Sum64()
		}
		_, _ = d.Write(o.Raw[a:b])
	}
}

// fingerprintMask selects the members Fingerprint leaves out.
const fingerprintMask = catIgnore | catManagedFields | catVolatile

// cutter yields the byte ranges of Raw[from:to] that remain when the
// members whose mask intersects its own are removed, working out the commas:
// a run of adjacent removed members followed by a kept member is cut from
// the first key to the next kept key; a run that ends the object is cut from
// the end of the kept value before it (taking its comma), or, if the object
// keeps no member, from the first key to the last value. A member inside a
// removed member is skipped (the outer cut wins).
//
// The cutter holds no pointer to the Object (every method takes it), so
// that using one never moves the Object to the heap.
type cutter struct {
	mask     uint8
	from, to int
	fx       [numFixed]int8 // slots of o.fix in the mask, by key
	nfx, ifx int
	ir       int      // next index in o.recs
	cover    int      // end of the last removed value: members before it are inside it
	pos      int      // start of the bytes not yet yielded
	pk       int      // handle (see walker.open) of the member peek returned; noMember: none left
	hasPk    bool     // pk is set
	dropped  uint64   // bit per Shaping.drops index < 64 that removed something
	more     []uint64 // the same for indices >= 64 (bit i-64)
}

// at returns the member of handle h.
func (o *Object) at(h int) *member {
	if h >= 0 {
		return &o.recs[h]
	}
	return &o.fix[-2-h]
}

func (c *cutter) init(o *Object, from, to int, mask uint8) {
	*c = cutter{mask: mask, from: from, to: to, pos: from, ir: len(o.recs)}
	if mask == 0 {
		return
	}
	c.ir = 0
	for slot := range o.fix {
		m := &o.fix[slot]
		if m.key == 0 || m.mask&mask == 0 {
			continue
		}
		k := c.nfx
		for k > 0 && o.fix[c.fx[k-1]].key > m.key {
			c.fx[k] = c.fx[k-1]
			k--
		}
		c.fx[k] = int8(slot)
		c.nfx++
	}
}

// nextMember returns the handle of the next member to remove, in key
// order, or noMember.
func (c *cutter) nextMember(o *Object) int {
	for {
		var h int
		switch {
		case c.ifx < c.nfx && (c.ir >= len(o.recs) || o.fix[c.fx[c.ifx]].key < o.recs[c.ir].key):
			h = -2 - int(c.fx[c.ifx])
			c.ifx++
		case c.ir < len(o.recs):
			h = c.ir
			c.ir++
		default:
			return noMember
		}
		m := o.at(h)
		if m.mask&c.mask == 0 || m.key < c.from || m.val > c.to || m.key < c.cover {
			continue
		}
		return h
	}
}

func (c *cutter) peek(o *Object) int {
	if !c.hasPk {
		c.pk, c.hasPk = c.nextMember(o), true
	}
	return c.pk
}

// remove notes that m is removed.
func (c *cutter) remove(o *Object, m *member) {
	c.hasPk = false
	c.cover = m.val
	if m.drop >= 0 && m.mask&c.mask&catDrop != 0 {
		c.markDropped(int(m.drop))
	}
}

// next returns the next range [a, b) of o.Raw to keep; ok is false at the
// end.
func (c *cutter) next(o *Object) (a, b int, ok bool) {
	for {
		h := c.peek(o)
		if h == noMember {
			if c.pos < c.to {
				a, b = c.pos, c.to
				c.pos = c.to
				return a, b, true
			}
			return 0, 0, false
		}
		first := o.at(h)
		c.remove(o, first)
		last := first
		for last.next >= 0 {
			h := c.peek(o)
			if h == noMember || o.at(h).key != last.next {
				break
			}
			last = o.at(h)
			c.remove(o, last)
		}
		var cs, ce int
		switch {
		case last.next >= 0: // a kept member follows: cut up to its key
			cs, ce = first.key, last.next
		case first.prev >= 0: // the run ends the object: take the comma before it
			cs, ce = first.prev, last.val
		default: // the run is the whole object
			cs, ce = first.key, last.val
		}
		cs = max(cs, c.pos)
		a, b = c.pos, cs
		c.pos = max(ce, c.pos)
		if b > a {
			return a, b, true
		}
	}
}

// appendTo appends the kept ranges of o.Raw to dst.
func (c *cutter) appendTo(o *Object, dst []byte) []byte {
	for {
		a, b, ok := c.next(o)
		if !ok {
			return dst
		}
		dst = append(dst, o.Raw[a:b]...)
	}
}

func (c *cutter) markDropped(i int) {
	if i < 64 {
		c.dropped |= 1 << i
		return
	}
	i -= 64
	for len(c.more) <= i/64 {
		c.more = append(c.more, 0)
	}
	c.more[i/64] |= 1 << (i % 64)
}

func (c *cutter) isDropped(i int) bool {
	if i < 64 {
		return c.dropped&(1<<i) != 0
	}
	i -= 64
	return i/64 < len(c.more) && c.more[i/64]&(1<<(i%64)) != 0
}

// droppedPaths returns the canonical Drop paths that removed something.
func (c *cutter) droppedPaths(o *Object) []string {
	if (c.dropped == 0 && c.more == nil) || o.sh == nil {
		return nil
	}
	var out []string
	for i, p := range o.sh.drops {
		if c.isDropped(i) {
			out = append(out, p)
		}
	}
	return out
}
