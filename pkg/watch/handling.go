package watch

import (
	"time"

	"go.uber.org/zap"

	"github.com/relayd/relayd/pkg/event"
)

// An object's handling is the span from the moment the watcher read an
// object item until the watch hands the object's entry to its pipeline (or
// drops it): the decode, the self check, the fingerprint and changed
// paths, the filter, the index lookup and the encode. It is the watch's own work: a wait for the
// pipeline (backpressure, a drain) is not part of it (the heartbeats see
// a pipeline that does not move on their own: pkg/heartbeat). The
// heartbeat walk reads how long the current handling has lasted
// (Handling) and, beyond its bound, counts the watch as stuck: its
// heartbeats are withheld and relayd_watch_stalled counts it
// (docs/OPERATIONS.md, "RelaydWatchStalled").
//
// The handler records only when the handling began, with one atomic store
// per object (and one to clear it): no lock, no allocation, not even a
// clock reading on the hot path. The start is the item's ReadAt, the
// monotonic time the watcher read the object, just before it decoded it
// and called the handler (a watcher reads its next item only once the
// handler returned), so a slow decode counts too. Marks are nanoseconds
// since the watch was built (its born time), plus one so that 0 means
// "not handling".

// ObjectHook is told, inside each object's handling, which object it is
// (before the filter and the encode). Tests stall a watch with it (a hook
// that blocks): pkg/relay's TestStuckWatch. Nil in the shipped binary.
type ObjectHook interface {
	HandlingObject(w *Watch, m *event.Meta)
}

// beginHandling marks the start of an object's handling: readAt, the
// item's.
func (w *Watch) beginHandling(readAt time.Time) {
	d := readAt.Sub(w.born)
	if d <= 0 { // no read time (an item a test made)
		d = time.Since(w.born)
	}
	w.handling.Store(int64(d) + 1)
}

// endHandling clears the mark: the object is handed to the pipeline or
// dropped (or its handling failed). If the heartbeat walk found the watch
// stuck in this object's handling, the object is named in the log now:
// the walk cannot read the object (the handler owns it), the handler can.
func (w *Watch) endHandling(m *event.Meta) {
	since := w.handling.Load()
	if since == 0 {
		return
	}
	w.handling.Store(0)
	if w.stuck.Load() == since {
		took := time.Since(w.born) - time.Duration(since-1)
		w.log.Warn("an object held its watch longer than the stall bound; the watch goes on", zap.String("object", m.Namespace+"/"+m.Name),
			zap.String("uid", m.UID), zap.String("resourceVersion", m.ResourceVersion), zap.Duration("took", took))
	}
}

// Handling is how long the watch has been in the handling of its current
// object at now (0: it is not handling one). Beyond bound, the watch is
// stuck in it: it records which handling that is, and names the object in
// the log once it is done with it (endHandling). Safe from any goroutine;
// it reads one atomic (and writes one when stuck).
func (w *Watch) Handling(now time.Time, bound time.Duration) time.Duration {
	since := w.handling.Load()
	if since == 0 {
		return 0
	}
	d := max(now.Sub(w.born)-time.Duration(since-1), 0)
	if d > bound {
		w.stuck.Store(since)
	}
	return d
}
