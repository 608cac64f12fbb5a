package watch

import (
	"errors"
	"strconv"
	"sync"

	"github.com/relayd/relayd/pkg/event"
)

// requestState is the resync asked for (Resync) until its sync.completed:
// a watcher built meanwhile (after a failed attempt) is asked again, so
// the request survives the watch's restarts.
type requestState struct {
	mu   sync.Mutex
	live relister // the current attempt's watcher; nil between attempts
	cur  *Request // asked for and not completed
}

// Request is a resync asked for by an operator (pkg/resync): the watch
// relists with reason requested, its sync markers carry ID, and Full
// publishes every listed object again. Done is told the counts of its
// sync.completed (on the watch's goroutine; nil: not told).
type Request struct {
	ID   string
	Full bool
	Done func(event.SyncCounts)
}

// relister is a watcher that relists on request (a *source.Watcher).
type relister interface {
	Request(id string, full bool)
}

// ErrResyncRunning is Resync's answer while another request's resync of
// the watch has not completed.
var ErrResyncRunning = errors.New("another resync of this watch is running")

// Resync asks the watch to relist for r, without restarting it: the
// running watch request ends and the list follows at once (a list in
// progress, a 410's, completes first). Asking again for the same ID is a
// no-op; another ID while r runs is ErrResyncRunning (with the running
// request's id). Safe to call from any goroutine.
func (w *Watch) Resync(r Request) (running string, err error) {
	q := &w.req
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.cur != nil {
		if q.cur.ID == r.ID {
			return "", nil
		}
		return q.cur.ID, ErrResyncRunning
	}
	q.cur = &r
	if q.live != nil {
		q.live.Request(r.ID, r.Full)
	}
	return "", nil
}

// setLive records the watcher of the current attempt (nil: none) and asks
// it for the resync not yet completed.
func (w *Watch) setLive(wt Watcher) {
	q := &w.req
	q.mu.Lock()
	defer q.mu.Unlock()
	q.live, _ = wt.(relister)
	if q.live != nil && q.cur != nil {
		q.live.Request(q.cur.ID, q.cur.Full)
	}
}

// requestCompleted ends the request whose sync.completed s is.
func (w *Watch) requestCompleted(s *event.SyncEvent) {
	if s.RequestID == "" {
		return
	}
	q := &w.req
	q.mu.Lock()
	cur := q.cur
	if cur != nil && cur.ID == s.RequestID {
		q.cur = nil
	}
	q.mu.Unlock()
	if cur != nil && cur.ID == s.RequestID && cur.Done != nil {
		cur.Done(s.Counts)
	}
}

// fullID is the id suffix of an object published by a full resync: the
// epoch makes its Nats-Msg-Id one JetStream has not seen (the object's
// first publication had none), so the republication is stored.
func fullID(epoch uint64) string { return "/full/" + strconv.FormatUint(epoch, 10) }

// Resyncing is the id of the resync asked for and not completed ("":
// none). Safe to call from any goroutine.
func (w *Watch) Resyncing() string {
	q := &w.req
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.cur == nil {
		return ""
	}
	return q.cur.ID
}
