package sink

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/util/wait"
)

// bigEntry is an entry whose message costs about size bytes.
func bigEntry(id, uid, rv string, size int) Entry {
	e := entry(id, uid, rv)
	e.Msg.Data = []byte(strings.Repeat("x", size))
	return e
}

func newByteSink(t *testing.T, perPipeline, process int64) (*fakePublisher, *Sink, *Metrics) {
	t.Helper()
	fake := newFake()
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{JetStream: fake, Logger: zap.NewNop(), Metrics: m, MaxInFlight: 64,
		MaxInFlightBytes: perPipeline, ProcessInFlightBytes: process,
		RetryBackoff: wait.Backoff{Duration: time.Millisecond, Factor: 1, Steps: 1 << 30}})
	if err != nil {
		t.Fatal(err)
	}
	return fake, s, m
}

// submitAsync submits e and reports when Submit returned.
func submitAsync(ctx context.Context, p *Pipeline, e Entry) chan error {
	done := make(chan error, 1)
	go func() { done <- p.Submit(ctx, e) }()
	return done
}

func returned(t *testing.T, ch chan error, within time.Duration) bool {
	t.Helper()
	select {
	case err := <-ch:
		if err != nil {
			t.Fatalf("Submit: %v", err)
		}
		return true
	case <-time.After(within):
		return false
	}
}

func TestBytesBoundThePipelineWindow(t *testing.T) {
	fake, s, m := newByteSink(t, 1000, 10000)
	p := s.NewPipeline("src", nil)
	t.Cleanup(p.Close)
	ctx := t.Context()
	// Three messages of ~400 bytes: two fit in 1000 bytes, the third waits
	// although the entry window (64) is far from full.
	for i, id := range []string{"a", "b"} {
		if err := p.Submit(ctx, bigEntry(id, id, "1", 400)); err != nil {
			t.Fatalf("entry %d: %v", i, err)
		}
	}
	fa, _ := fake.next(t), fake.next(t)
	c := submitAsync(ctx, p, bigEntry("c", "c", "2", 400))
	if returned(t, c, 200*time.Millisecond) {
		t.Fatal("third 400-byte entry was admitted with 800 of 1000 bytes in flight")
	}
	if got := testutil.ToFloat64(m.InFlightBytes.WithLabelValues("src")); got < 800 || got > 1000 {
		t.Fatalf("relayd_publish_in_flight_bytes = %v, want 800..1000", got)
	}
	ack(fa)
	if !returned(t, c, 2*time.Second) {
		t.Fatal("third entry still blocked after the first was acked")
	}
	fake.next(t)
}

func TestBytesBoundTheProcessAcrossPipelines(t *testing.T) {
	fake, s, m := newByteSink(t, 1000, 1000)
	p1, p2 := s.NewPipeline("one", nil), s.NewPipeline("two", nil)
	t.Cleanup(p1.Close)
	t.Cleanup(p2.Close)
	ctx := t.Context()
	if err := p1.Submit(ctx, bigEntry("a", "a", "1", 700)); err != nil {
		t.Fatal(err)
	}
	fake.next(t)
	c := submitAsync(ctx, p2, bigEntry("b", "b", "1", 700))
	if returned(t, c, 200*time.Millisecond) {
		t.Fatal("pipeline two was admitted 700 bytes while pipeline one held 700 of the process's 1000")
	}
	// Closing pipeline one abandons its entry: its bytes go back to the
	// process's budget (a restarted watch replays it).
	p1.Close()
	if !returned(t, c, 2*time.Second) {
		t.Fatal("pipeline two still blocked after pipeline one closed")
	}
	fake.next(t)
	if got := testutil.ToFloat64(m.InFlightBytes.WithLabelValues("one")); got != 0 {
		t.Fatalf("closed pipeline still reports %v bytes in flight", got)
	}
}

func TestOversizedEntryIsPublishedAlone(t *testing.T) {
	fake, s, _ := newByteSink(t, 1000, 1000)
	p := s.NewPipeline("src", nil)
	t.Cleanup(p.Close)
	ctx := t.Context()
	if err := p.Submit(ctx, bigEntry("small", "s", "1", 100)); err != nil {
		t.Fatal(err)
	}
	fs := fake.next(t)
	// 5000 bytes exceed both bounds: it waits for the small one, then goes
	// alone instead of waiting forever.
	c := submitAsync(ctx, p, bigEntry("big", "b", "2", 5000))
	if returned(t, c, 200*time.Millisecond) {
		t.Fatal("oversized entry was admitted next to another")
	}
	ack(fs)
	if !returned(t, c, 2*time.Second) {
		t.Fatal("oversized entry never admitted")
	}
	fb := fake.next(t)
	d := submitAsync(ctx, p, bigEntry("after", "x", "3", 10))
	if returned(t, d, 200*time.Millisecond) {
		t.Fatal("entry admitted next to an oversized one")
	}
	ack(fb)
	if !returned(t, d, 2*time.Second) {
		t.Fatal("entry after the oversized one never admitted")
	}
	fake.next(t)
}

func TestSubmitBlockedOnBytesReturnsOnCancel(t *testing.T) {
	fake, s, _ := newByteSink(t, 1000, 1000)
	p := s.NewPipeline("src", nil)
	t.Cleanup(p.Close)
	if err := p.Submit(t.Context(), bigEntry("a", "a", "1", 900)); err != nil {
		t.Fatal(err)
	}
	fake.next(t)
	ctx, cancel := context.WithCancel(t.Context())
	c := submitAsync(ctx, p, bigEntry("b", "b", "2", 900))
	cancel()
	select {
	case err := <-c:
		if err == nil {
			t.Fatal("Submit returned nil after its context was cancelled")
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Submit blocked on bytes did not return on cancel")
	}
}
