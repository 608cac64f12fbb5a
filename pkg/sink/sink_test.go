package sink

// Narrow unit tests with a fake publisher, for orderings a real server does
// not produce on demand (a publish failing while a later one succeeds).
// The end-to-end behaviour against real NATS is in pkg/relay's tests.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/relayd/relayd/pkg/event"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type future struct {
	msg *nats.Msg
	ok  chan *jetstream.PubAck
	err chan error
}

func (f *future) Ok() <-chan *jetstream.PubAck { return f.ok }
func (f *future) Err() <-chan error            { return f.err }
func (f *future) Msg() *nats.Msg               { return f.msg }

// fakePublisher records publishes in order; the test resolves each future.
type fakePublisher struct {
	mu        sync.Mutex
	published []string // Nats-Msg-Id per publish attempt
	futures   chan *future
}

func newFake() *fakePublisher { return &fakePublisher{futures: make(chan *future, 100)} }

func (p *fakePublisher) PublishMsgAsync(m *nats.Msg, _ ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	f := &future{msg: m, ok: make(chan *jetstream.PubAck, 1), err: make(chan error, 1)}
	p.mu.Lock()
	p.published = append(p.published, m.Header.Get(jetstream.MsgIDHeader))
	p.mu.Unlock()
	p.futures <- f
	return f, nil
}

func (p *fakePublisher) order() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.published...)
}

// next returns the next publish attempt, failing the test after 2s.
func (p *fakePublisher) next(t *testing.T) *future {
	t.Helper()
	select {
	case f := <-p.futures:
		return f
	case <-time.After(2 * time.Second):
		t.Fatal("no publish within 2s")
		return nil
	}
}

func (p *fakePublisher) none(t *testing.T) {
	t.Helper()
	select {
	case f := <-p.futures:
		t.Fatalf("unexpected publish of %s", f.msg.Header.Get(jetstream.MsgIDHeader))
	case <-time.After(100 * time.Millisecond):
	}
}

func ack(f *future)           { f.ok <- &jetstream.PubAck{} }
func fail(f *future, e error) { f.err <- e }

func newPipeline(t *testing.T, window int) (*fakePublisher, *Pipeline, *Metrics, chan Advance) {
	t.Helper()
	fake := newFake()
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{JetStream: fake, Logger: zap.NewNop(), Metrics: m, MaxInFlight: window,
		RetryBackoff: wait.Backoff{Duration: time.Millisecond, Factor: 1, Steps: 1 << 30}})
	if err != nil {
		t.Fatal(err)
	}
	adv := make(chan Advance, 100)
	p := s.NewPipeline("src", func(a Advance) { adv <- a })
	t.Cleanup(p.Close)
	return fake, p, m, adv
}

func entry(id, uid, rv string) Entry {
	msg := &event.Message{Subject: "k8s.c.core.v1.x.ns." + id + ".added", MsgID: id,
		Header: map[string][]string{jetstream.MsgIDHeader: {id}}, Data: []byte("{}")}
	return Entry{Msg: msg, ObjectKey: uid, ResourceVersion: rv, Type: event.Added, Origin: event.OriginWatch}
}

func TestFailedPublishIsRetriedWithoutReorderingItsObject(t *testing.T) {
	fake, p, m, adv := newPipeline(t, 8)
	ctx := t.Context()
	if err := p.Submit(ctx, entry("a1", "A", "1")); err != nil {
		t.Fatal(err)
	}
	a1 := fake.next(t)
	if err := p.Submit(ctx, entry("b1", "B", "2")); err != nil { // another object: not gated
		t.Fatal(err)
	}
	b1 := fake.next(t)
	// A's next version must wait for a1's ack, so Submit blocks.
	submitted := make(chan error, 1)
	go func() { submitted <- p.Submit(ctx, entry("a2", "A", "3")) }()
	fake.none(t)

	fail(a1, errors.New("nats: timeout")) // a1 fails, b1 was stored
	ack(b1)
	a1retry := fake.next(t)
	if got := a1retry.msg.Header.Get(jetstream.MsgIDHeader); got != "a1" {
		t.Fatalf("retried %s, want a1 with the same Msg-Id", got)
	}
	fake.none(t) // still no a2
	select {
	case a := <-adv:
		t.Fatalf("watermark advanced to %s while a1 is unacknowledged", a.ResourceVersion)
	default:
	}
	ack(a1retry)
	if err := <-submitted; err != nil {
		t.Fatal(err)
	}
	ack(fake.next(t)) // a2

	want := []string{"a1", "b1", "a1", "a2"}
	if got := fake.order(); len(got) != len(want) || got[0] != "a1" || got[1] != "b1" || got[2] != "a1" || got[3] != "a2" {
		t.Fatalf("publish order %v, want %v", got, want)
	}
	for _, rv := range []string{"1", "2", "3"} {
		select {
		case a := <-adv:
			if a.ResourceVersion != rv {
				t.Fatalf("watermark %s, want %s (in submission order)", a.ResourceVersion, rv)
			}
		case <-time.After(2 * time.Second):
			t.Fatalf("no watermark %s", rv)
		}
	}
	if v := testutil.ToFloat64(m.PublishErrors.WithLabelValues("src", "error")); v != 1 {
		t.Errorf("publish errors = %v, want 1", v)
	}
	if v := testutil.ToFloat64(m.Events.WithLabelValues("src", "added", "watch")); v != 3 {
		t.Errorf("events = %v, want 3", v)
	}
	if v := testutil.ToFloat64(m.InFlight.WithLabelValues("src")); v != 0 {
		t.Errorf("in flight = %v, want 0", v)
	}
}

func TestFullWindowBlocksSubmitAndHoldsTheWatermark(t *testing.T) {
	fake, p, _, adv := newPipeline(t, 2)
	ctx := t.Context()
	for i, id := range []string{"x", "y"} {
		if err := p.Submit(ctx, entry(id, id, string(rune('1'+i)))); err != nil {
			t.Fatal(err)
		}
	}
	x, y := fake.next(t), fake.next(t)
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if err := p.Submit(short, entry("z", "z", "3")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Submit with a full window: %v, want it to block until the deadline", err)
	}
	fake.none(t)
	ack(y) // out of order: the watermark still waits for x
	select {
	case a := <-adv:
		t.Fatalf("watermark %s before x was acked", a.ResourceVersion)
	case <-time.After(100 * time.Millisecond):
	}
	ack(x)
	if a := <-adv; a.ResourceVersion != "1" {
		t.Fatalf("watermark %s, want 1", a.ResourceVersion)
	}
	if a := <-adv; a.ResourceVersion != "2" {
		t.Fatalf("watermark %s, want 2", a.ResourceVersion)
	}
}

func TestListItemsDoNotMoveTheWatermarkAndBookmarksAreMarked(t *testing.T) {
	fake, p, _, adv := newPipeline(t, 8)
	ctx := t.Context()
	// A list: items carry no position; the completion marker does.
	for _, e := range []Entry{entry("l1", "L1", ""), entry("l2", "L2", "")} {
		if err := p.Submit(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	ack(fake.next(t))
	ack(fake.next(t))
	if err := p.Submit(ctx, Entry{ResourceVersion: "10"}); err != nil { // e.g. filtered / list end
		t.Fatal(err)
	}
	a := <-adv
	if a.ResourceVersion != "10" || a.BookmarkOnly {
		t.Fatalf("advance %+v, want rv 10 not bookmark-only", a)
	}
	if err := p.Submit(ctx, Entry{ResourceVersion: "11", Bookmark: true}); err != nil {
		t.Fatal(err)
	}
	if a := <-adv; a.ResourceVersion != "11" || !a.BookmarkOnly {
		t.Fatalf("advance %+v, want rv 11 bookmark-only", a)
	}
	if err := p.Submit(ctx, Entry{ResourceVersion: "11", Bookmark: true}); err != nil { // same rv: no advance
		t.Fatal(err)
	}
	select {
	case a := <-adv:
		t.Fatalf("advanced again to the same position: %+v", a)
	case <-time.After(100 * time.Millisecond):
	}
}

func TestDrainWaitsForAcksAndReportsWhatIsLeft(t *testing.T) {
	fake, p, _, _ := newPipeline(t, 4)
	ctx := t.Context()
	if err := p.Submit(ctx, entry("d1", "D", "1")); err != nil {
		t.Fatal(err)
	}
	f := fake.next(t)
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if err := p.Drain(short); err == nil {
		t.Fatal("Drain returned with a publish unacknowledged")
	}
	ack(f)
	if err := p.Drain(ctx); err != nil {
		t.Fatalf("Drain after the ack: %v", err)
	}
	if rv, _ := p.Watermark(); rv != "1" {
		t.Fatalf("watermark %q after drain, want 1", rv)
	}
}

func ackSeq(f *future, seq uint64) { f.ok <- &jetstream.PubAck{Sequence: seq} }

func withIndex(e Entry, id string) Entry {
	e.FollowUp = &event.Message{Subject: "$KV.idx." + id, Data: []byte(`{}`)}
	return e
}

func noAdvance(t *testing.T, adv chan Advance) {
	t.Helper()
	select {
	case a := <-adv:
		t.Fatalf("unexpected advance to %+v", a)
	case <-time.After(100 * time.Millisecond):
	}
}

func nextAdvance(t *testing.T, adv chan Advance) Advance {
	t.Helper()
	select {
	case a := <-adv:
		return a
	case <-time.After(2 * time.Second):
		t.Fatal("no advance within 2s")
		return Advance{}
	}
}

// The index write of a change is published only after the event's PubAck,
// the watermark waits for both, a failed index write is retried, and the
// object stays gated until its index write is acked. Stage 2 does not hold
// back the next entry's event.
func TestIndexWriteFollowsEventAck(t *testing.T) {
	fake, p, _, adv := newPipeline(t, 8)
	ctx := t.Context()
	if err := p.Submit(ctx, withIndex(entry("a1", "A", "1"), "A")); err != nil {
		t.Fatal(err)
	}
	a1 := fake.next(t)
	fake.none(t) // no index write before the event is acked
	if err := p.Submit(ctx, withIndex(entry("b1", "B", "2"), "B")); err != nil {
		t.Fatal(err)
	}
	b1 := fake.next(t) // another object's event is not held back
	ack(a1)
	ixA := fake.next(t)
	if ixA.msg.Subject != "$KV.idx.A" || ixA.msg.Header.Get(jetstream.MsgIDHeader) != "" {
		t.Fatalf("index write: subject %s, msg id %q", ixA.msg.Subject, ixA.msg.Header.Get(jetstream.MsgIDHeader))
	}
	noAdvance(t, adv) // event acked, index not yet
	ack(b1)
	ixB := fake.next(t) // pipelined: B's index write goes out while A's is pending
	fail(ixA, nats.ErrTimeout)
	ixA2 := fake.next(t)
	if ixA2.msg.Subject != "$KV.idx.A" {
		t.Fatalf("retry of %s", ixA2.msg.Subject)
	}
	// A is still gated: its next version cannot be published yet.
	submitted := make(chan error, 1)
	go func() { submitted <- p.Submit(ctx, withIndex(entry("a2", "A", "3"), "A")) }()
	fake.none(t)
	ackSeq(ixB, 7)
	noAdvance(t, adv) // in order: A's entry is not done
	ackSeq(ixA2, 8)
	if a := nextAdvance(t, adv); a.ResourceVersion != "1" {
		t.Fatalf("first advance %+v", a)
	}
	if a := nextAdvance(t, adv); a.ResourceVersion != "2" || a.FollowUpSeq != 8 {
		t.Fatalf("second advance %+v, want rv 2 and index seq 8", a)
	}
	if err := <-submitted; err != nil {
		t.Fatal(err)
	}
	a2 := fake.next(t)
	if a2.msg.Header.Get(jetstream.MsgIDHeader) != "a2" {
		t.Fatalf("after release: %s", a2.msg.Header.Get(jetstream.MsgIDHeader))
	}
	// An entry with only an index write (a filtered change) publishes it at once.
	ack(a2)
	ixA3 := fake.next(t)
	e := Entry{ObjectKey: "C", ResourceVersion: "4", FollowUp: &event.Message{Subject: "$KV.idx.C", Data: []byte(`{}`)}}
	if err := p.Submit(ctx, e); err != nil {
		t.Fatal(err)
	}
	ixC := fake.next(t)
	if ixC.msg.Subject != "$KV.idx.C" {
		t.Fatalf("index-only entry published %s", ixC.msg.Subject)
	}
	ackSeq(ixA3, 9)
	ackSeq(ixC, 10)
	if a := nextAdvance(t, adv); a.ResourceVersion != "3" {
		t.Fatalf("advance %+v", a)
	}
	if a := nextAdvance(t, adv); a.ResourceVersion != "4" || a.FollowUpSeq != 10 || a.BookmarkOnly {
		t.Fatalf("advance %+v", a)
	}
	if err := p.Drain(ctx); err != nil {
		t.Fatal(err)
	}
}

// While NATS is disconnected a failed publish is not retried (each retry
// would add a copy to the client's reconnect buffer): it waits for the
// Connected channel; once that is closed (NATS is back), the message is
// republished with its Msg-Id.
func TestNoRetryWhileDisconnected(t *testing.T) {
	fake := newFake()
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	up := make(chan struct{})
	s, err := New(Options{JetStream: fake, Logger: zap.NewNop(), Metrics: m, MaxInFlight: 8,
		RetryBackoff: wait.Backoff{Duration: time.Millisecond, Factor: 1, Steps: 1 << 30},
		Connected:    func() <-chan struct{} { return up }})
	if err != nil {
		t.Fatal(err)
	}
	p := s.NewPipeline("src", func(Advance) {})
	t.Cleanup(p.Close)
	if err := p.Submit(t.Context(), entry("a1", "A", "1")); err != nil {
		t.Fatal(err)
	}
	fail(fake.next(t), nats.ErrTimeout)
	fake.none(t) // a hundred 1ms backoff steps
	close(up)
	retry := fake.next(t)
	if got := retry.msg.Header.Get(jetstream.MsgIDHeader); got != "a1" {
		t.Fatalf("retried %s, want a1", got)
	}
	ack(retry)
	if got := fake.order(); len(got) != 2 {
		t.Fatalf("publishes %v, want a1 once before and once after the reconnect", got)
	}
}

// After an outage every publish of the window failed (their acks timed
// out); once the first is republished and acked, the ones behind it are
// republished at once, in order, without a backoff step each. A later
// failure, after a first publish was acked, waits its backoff again.
func TestPublishesBehindARetriedOneAreRepublishedAtOnce(t *testing.T) {
	fake := newFake()
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	var waits atomic.Int64
	core, logs := observer.New(zap.InfoLevel)
	s, err := New(Options{JetStream: fake, Logger: zap.New(core), Metrics: m, MaxInFlight: 8,
		RetryBackoff: wait.Backoff{Duration: time.Millisecond, Factor: 1, Steps: 1 << 30},
		after: func(d time.Duration) <-chan time.Time {
			waits.Add(1)
			return time.After(d)
		}})
	if err != nil {
		t.Fatal(err)
	}
	p := s.NewPipeline("src", func(Advance) {})
	t.Cleanup(p.Close)
	ids := []string{"a1", "a2", "a3", "a4", "a5"}
	for i, id := range ids {
		if err := p.Submit(t.Context(), entry(id, "obj-"+id, string(rune('1'+i)))); err != nil {
			t.Fatal(err)
		}
	}
	first := make([]*future, len(ids))
	for i := range ids {
		first[i] = fake.next(t)
	}
	for _, f := range first {
		fail(f, nats.ErrTimeout)
	}
	for _, id := range ids {
		f := fake.next(t)
		if got := f.msg.Header.Get(jetstream.MsgIDHeader); got != id {
			t.Fatalf("republished %s, want %s (in order)", got, id)
		}
		ack(f)
	}
	if err := p.Drain(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := waits.Load(); n != 1 {
		t.Errorf("republishing a window of 5 failed publishes waited %d backoff steps, want 1 (the first's)", n)
	}
	// One run of failures: logged when it starts and when it ends, not
	// once per entry of the window.
	failed := logs.FilterMessage("publish failed; retrying (the watch is paused meanwhile)").Len()
	recovered := logs.FilterMessage("publish failed; retrying (the watch is paused meanwhile): recovered").Len()
	if failed != 1 || recovered != 1 {
		t.Errorf("a window of 5 failed publishes logged %d failure and %d recovery lines, want 1 and 1", failed, recovered)
	}

	// The backlog is over once a first publish is acked.
	if err := p.Submit(t.Context(), entry("b1", "obj-b1", "10")); err != nil {
		t.Fatal(err)
	}
	ack(fake.next(t))
	if err := p.Submit(t.Context(), entry("b2", "obj-b2", "11")); err != nil {
		t.Fatal(err)
	}
	fail(fake.next(t), nats.ErrTimeout)
	ack(fake.next(t))
	if err := p.Drain(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := waits.Load(); n != 2 {
		t.Errorf("a failure after an acked first publish waited %d backoff steps in all, want 2", n)
	}
}

// Every publish carries the Nats-Msg-Id of its message and the
// Nats-Expected-Stream of its target (what jetstream.WithMsgID and
// WithExpectStream set), whatever headers the message came with.
func TestPublishSetsTheMsgIDAndExpectedStreamHeaders(t *testing.T) {
	fake := newFake()
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{JetStream: fake, Logger: zap.NewNop(), Metrics: m, MaxInFlight: 4, EventStream: "EV",
		RetryBackoff: wait.Backoff{Duration: time.Millisecond, Factor: 1, Steps: 1 << 30}})
	if err != nil {
		t.Fatal(err)
	}
	p := s.NewPipeline("src", func(Advance) {})
	t.Cleanup(p.Close)
	for i, h := range []map[string][]string{
		nil,
		{jetstream.MsgIDHeader: {"stale"}, "Content-Type": {"x"}},
		{jetstream.MsgIDHeader: {"m2"}},
	} {
		id := fmt.Sprintf("m%d", i)
		e := Entry{Msg: &event.Message{Subject: "k8s.c.core.v1.x.ns." + id + ".added", MsgID: id, Header: h, Data: []byte("{}")}, ObjectKey: id}
		if err := p.Submit(t.Context(), e); err != nil {
			t.Fatal(err)
		}
		f := fake.next(t)
		if got, stream := f.msg.Header.Values(jetstream.MsgIDHeader), f.msg.Header.Get(jetstream.ExpectedStreamHeader); len(got) != 1 || got[0] != id || stream != "EV" {
			t.Errorf("message %s published with Nats-Msg-Id %q, Nats-Expected-Stream %q; want %s and EV", id, got, stream, id)
		}
		ack(f)
	}
}

// An event's body goes back to its encoder (event.Message.Release) only
// when its entry is done: after the event's ack and its index write's, and
// never while a failed publish may be retried from it.
func TestEventBodyIsReleasedOnlyWhenItsEntryIsDone(t *testing.T) {
	fake, p, _, adv := newPipeline(t, 8)
	ctx := t.Context()
	enc, err := event.NewEncoder(event.EncoderOptions{Cluster: "c", Source: "src", MaxPayload: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := enc.Encode(&event.Change{Type: event.Added, Origin: event.OriginWatch, Epoch: 1,
		Resource: event.Resource{Version: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespaced: true},
		Meta:     event.Meta{UID: "u1", Namespace: "ns", Name: "a", ResourceVersion: "1"}})
	if err != nil {
		t.Fatal(err)
	}
	body := string(msg.Data)
	e := withIndex(Entry{Msg: &msg, ObjectKey: "u1", ResourceVersion: "1", Type: event.Added, Origin: event.OriginWatch}, "u1")
	if err := p.Submit(ctx, e); err != nil {
		t.Fatal(err)
	}
	first := fake.next(t)
	fail(first, nats.ErrTimeout)
	retry := fake.next(t)
	if string(retry.msg.Data) != body {
		t.Fatalf("retried with body %.60q…, want %.60q…", retry.msg.Data, body)
	}
	ack(retry)
	ix := fake.next(t)
	noAdvance(t, adv)
	if string(msg.Data) != body {
		t.Fatalf("event acked, index write pending: body is %.60q…, want it kept", msg.Data)
	}
	ackSeq(ix, 1)
	nextAdvance(t, adv)
	if msg.Data != nil {
		t.Errorf("entry done: body %.60q… not released", msg.Data)
	}
}
