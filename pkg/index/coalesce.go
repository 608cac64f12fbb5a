package index

import (
	"context"
	"sync"
	"time"
)

// Gathering of the coalesced reads (docs/ARCHITECTURE.md, "Start-up reads
// are shared"): a read starts once no call has arrived for gatherQuiet, or
// gatherMax after the first call it serves arrived, whichever is first.
const (
	gatherQuiet = 100 * time.Millisecond
	gatherMax   = time.Second
)

// coalescer serves many concurrent calls of one kind of read (the index
// bucket's status, its entries, the event stream's catch-up) with one read
// for all of them: the watches of a relayd start together, and one
// JetStream consumer or API request per watch does not scale (thousands of
// watches reach the server's consumer limit). A call waits for a read that
// starts after it arrived (so it sees at least what it would have seen on
// its own), at most one read runs at a time, and the calls that arrive
// while one runs are served together by the next. The read's context ends
// when every call it serves has given up.
type coalescer[Q, R any] struct {
	// read serves qs; it returns one result per call, in order, or one
	// error for all of them.
	read func(ctx context.Context, qs []Q) ([]R, error)

	mu      sync.Mutex
	pending []*coCall[Q, R]
	last    time.Time // when the last pending call arrived
	busy    bool      // a gather or a read is under way
}

type coCall[Q, R any] struct {
	ctx  context.Context
	q    Q
	r    R
	err  error
	done chan struct{}
}

// do runs q in the next read and returns its result.
func (c *coalescer[Q, R]) do(ctx context.Context, q Q) (R, error) {
	call := &coCall[Q, R]{ctx: ctx, q: q, done: make(chan struct{})}
	c.mu.Lock()
	c.pending = append(c.pending, call)
	c.last = time.Now()
	if !c.busy {
		c.busy = true
		go c.loop(context.WithoutCancel(ctx))
	}
	c.mu.Unlock()
	select {
	case <-call.done:
		return call.r, call.err
	case <-ctx.Done():
		c.leave(call)
		var zero R
		return zero, ctx.Err()
	}
}

// leave removes a call that gave up before its read started.
func (c *coalescer[Q, R]) leave(call *coCall[Q, R]) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, p := range c.pending {
		if p == call {
			c.pending = append(c.pending[:i], c.pending[i+1:]...)
			return
		}
	}
}

// loop gathers the pending calls and reads for them until none is left.
func (c *coalescer[Q, R]) loop(base context.Context) {
	for {
		calls := c.gather()
		if len(calls) == 0 {
			return
		}
		c.serve(base, calls)
	}
}

// gather waits until calls stop arriving, then takes them; none (and the
// loop ends) if every one gave up meanwhile.
func (c *coalescer[Q, R]) gather() []*coCall[Q, R] {
	start := time.Now()
	for {
		c.mu.Lock()
		wait := gatherQuiet - time.Since(c.last)
		if left := gatherMax - time.Since(start); left < wait {
			wait = left
		}
		if wait <= 0 || len(c.pending) == 0 {
			calls := c.pending
			c.pending = nil
			if len(calls) == 0 {
				c.busy = false
			}
			c.mu.Unlock()
			return calls
		}
		c.mu.Unlock()
		time.Sleep(wait)
	}
}

// serve runs one read for calls. Its context is cancelled once every call
// has given up.
func (c *coalescer[Q, R]) serve(base context.Context, calls []*coCall[Q, R]) {
	ctx, cancel := context.WithCancel(base)
	defer cancel()
	var mu sync.Mutex
	left := len(calls)
	qs := make([]Q, len(calls))
	stops := make([]func() bool, len(calls))
	for i, call := range calls {
		qs[i] = call.q
		stops[i] = context.AfterFunc(call.ctx, func() {
			mu.Lock()
			defer mu.Unlock()
			if left--; left == 0 {
				cancel()
			}
		})
	}
	rs, err := c.read(ctx, qs)
	for i, call := range calls {
		stops[i]()
		if err == nil {
			call.r = rs[i]
		}
		call.err = err
		close(call.done)
	}
}
