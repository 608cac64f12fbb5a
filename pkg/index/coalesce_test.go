package index

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// TestCoalescer: calls made together share one read; a call that arrives
// while a read runs is served by the next read, never by one that began
// before it; a read whose calls all gave up has its context cancelled.
func TestCoalescer(t *testing.T) {
	var (
		mu    sync.Mutex
		reads [][]int
	)
	running := make(chan struct{})
	release := make(chan struct{})
	c := coalescer[int, int]{read: func(ctx context.Context, qs []int) ([]int, error) {
		mu.Lock()
		reads = append(reads, append([]int(nil), qs...))
		first := len(reads) == 1
		mu.Unlock()
		if first {
			close(running)
			<-release
		}
		out := make([]int, len(qs))
		for i, q := range qs {
			out[i] = q * 10
		}
		return out, nil
	}}
	ctx := context.Background()
	var wg sync.WaitGroup
	results := make([]int, 6)
	for i := range 3 {
		wg.Go(func() { results[i], _ = c.do(ctx, i) })
	}
	<-running // the first read has begun with calls 0..2
	for i := 3; i < 6; i++ {
		wg.Go(func() { results[i], _ = c.do(ctx, i) })
	}
	for waiting := 0; waiting < 3; { // until 3..5 wait for the next read
		c.mu.Lock()
		waiting = len(c.pending)
		c.mu.Unlock()
		time.Sleep(time.Millisecond)
	}
	close(release)
	wg.Wait()
	// Calls 0..2 normally share the first read (one may miss it on a
	// loaded machine and join the second); 3..5 arrived while it ran: all
	// in the next read, none in the first.
	last := reads[len(reads)-1]
	for _, q := range reads[0] {
		if q >= 3 {
			t.Errorf("the first read served call %d, which arrived after it began: %v", q, reads)
		}
	}
	late := 0
	for _, q := range last {
		if q >= 3 {
			late++
		}
	}
	if len(reads) > 3 || late != 3 {
		t.Errorf("reads %v, want calls 3..5 together in the last read", reads)
	}
	for i, r := range results {
		if r != i*10 {
			t.Errorf("call %d got %d, want %d", i, r, i*10)
		}
	}

	// Every call gives up: the read's context ends, and so do the calls.
	cancelled := make(chan struct{})
	started := make(chan struct{})
	c2 := coalescer[int, int]{read: func(ctx context.Context, qs []int) ([]int, error) {
		close(started)
		<-ctx.Done()
		close(cancelled)
		return nil, ctx.Err()
	}}
	cctx, cancel := context.WithCancel(ctx)
	errs := make(chan error, 2)
	for i := range 2 {
		go func() { _, err := c2.do(cctx, i); errs <- err }()
	}
	<-started
	cancel()
	for range 2 {
		if err := <-errs; !errors.Is(err, context.Canceled) {
			t.Errorf("call: %v, want context.Canceled", err)
		}
	}
	<-cancelled
}
