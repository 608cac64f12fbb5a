package watch

import (
	"github.com/relayd/relayd/pkg/event"
	"github.com/relayd/relayd/pkg/index"
	"github.com/relayd/relayd/pkg/source"
)

// pathState is what a watch of a source with changedPaths keeps to say
// what changed (docs/CONSUMING.md, "What changed"); the zero pathState
// (no changedPaths) costs nothing per event.
type pathState struct {
	fp  *event.Fingerprinter // nil without changedPaths
	set uint64               // event.Shaping.PathSetID
	buf []uint64             // the current object's path fingerprints
}

// pathChanges fingerprints the changedPaths of the item's object into
// obj (Paths, PathSet) and compares them with those of the version the
// index holds. A delete fingerprints nothing: the index forgets the
// object.
func (w *Watch) pathChanges(it *source.Item, obj *index.Object) event.ChangedSet {
	p := &w.paths
	if p.fp == nil || it.Type == event.Deleted {
		return event.ChangedSet{}
	}
	p.buf = p.fp.PathFingerprints(&it.Object, p.buf)
	prev := w.ix.idx.Paths(obj.UID)
	obj.Paths, obj.PathSet = event.PathsString(p.buf), p.set
	return event.CompareChanged(w.o.Shaping.ChangedPaths(), prev, p.buf)
}
