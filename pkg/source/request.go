package source

import (
	"context"
	"errors"

	"github.com/relayd/relayd/pkg/event"
)

// errRelistRequested ends the current watch request when a relist was
// requested (Request): Run lists at once, without a backoff.
var errRelistRequested = errors.New("relist requested")

// Request asks the running watcher to relist (reason requested, origin
// resync) with the request's id, which its sync markers carry; full asks
// for every listed object to be published, unchanged ones too. A watch
// request in progress ends at once; a list in progress (a 410's, the
// initial one) completes first, then the requested list follows. A
// request made while another one has not begun replaces it. Safe to call
// from any goroutine.
func (w *Watcher) Request(id string, full bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.requested = &listPlan{origin: event.OriginResync, reason: event.RelistRequested, requestID: id, full: full}
	if w.listing == nil && w.stop != nil {
		w.stop(errRelistRequested)
	}
}

// takeRequest makes a requested relist the list due, unless a list is
// due already (it then follows that list: endList).
func (w *Watcher) takeRequest() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.listing == nil && w.requested != nil {
		w.listing, w.requested = w.requested, nil
	}
}

// setStop records the cancel function of the watch request in progress
// (nil: none). A relist requested before the request began and after the
// list due was taken ends it at once.
func (w *Watcher) setStop(stop context.CancelCauseFunc) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stop = stop
	if stop != nil && w.listing == nil && w.requested != nil {
		stop(errRelistRequested)
	}
}
