package heartbeat

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"

	"github.com/relayd/relayd/pkg/config"
	"github.com/relayd/relayd/pkg/event"
	"github.com/relayd/relayd/pkg/sink"
	"github.com/relayd/relayd/pkg/watch"
)

// These are unit tests of the walk's decisions (spread, stall, failures)
// with fake watches and a fake publisher: pkg/relay's heartbeat_test.go
// shows the heartbeats of real watches on a real stream.

type fakeWatch struct {
	key, ns string
	src     *config.Source
	running bool
	beat    watch.Beat
	since   time.Time // in an object's handling since (zero: not)
	marked  int       // Handling calls past the bound
}

func (w *fakeWatch) Beat() (watch.Beat, bool) { return w.beat, w.running }
func (w *fakeWatch) Key() string              { return w.key }
func (w *fakeWatch) Source() *config.Source   { return w.src }
func (w *fakeWatch) Namespace() string        { return w.ns }
func (w *fakeWatch) Handling(now time.Time, bound time.Duration) time.Duration {
	if w.since.IsZero() {
		return 0
	}
	if now.Sub(w.since) > bound {
		w.marked++
	}
	return now.Sub(w.since)
}

// doneFuture is a future that is already acknowledged (or failed).
type doneFuture struct {
	ok  chan *jetstream.PubAck
	err chan error
}

func (f doneFuture) Ok() <-chan *jetstream.PubAck { return f.ok }
func (f doneFuture) Err() <-chan error            { return f.err }
func (f doneFuture) Msg() *nats.Msg               { return nil }

type fakePublisher struct {
	sent    []event.Message
	n       int   // publishes
	discard bool  // count only (the benchmark)
	fail    error // PublishUnordered fails with it
	nack    error // the future fails with it
	pending bool  // the future never resolves
}

func (p *fakePublisher) PublishUnordered(m *event.Message) (jetstream.PubAckFuture, error) {
	if p.fail != nil {
		return nil, p.fail
	}
	p.n++
	if !p.discard {
		p.sent = append(p.sent, *m)
	}
	f := doneFuture{ok: make(chan *jetstream.PubAck, 1), err: make(chan error, 1)}
	switch {
	case p.pending:
	case p.nack != nil:
		f.err <- p.nack
	default:
		f.ok <- &jetstream.PubAck{}
	}
	return f, nil
}

func newTest(t testing.TB, pub Publisher, sources ...config.Source) (*Heartbeats, *[]Watch, *Metrics) {
	cfg := &config.Config{Cluster: "c", Prefix: "k8s", Sources: sources}
	cfg.ApplyDefaults()
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ws := &[]Watch{}
	h := New(Options{Config: cfg, Publisher: pub, Logger: zap.NewNop(), Metrics: m,
		Each: func(f func(Watch)) {
			for _, w := range *ws {
				f(w)
			}
		}})
	return h, ws, m
}

func every(d time.Duration) *config.Duration { v := config.Duration(d); return &v }

// t0 is a simulated start; ticks are simulated seconds after it.
var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Each running watch publishes exactly one heartbeat per interval, at its
// own phase: 600 watches over 10 minutes of 1s ticks publish 6,000, spread
// over the interval: each quarter of it carries 20–30% of them (an even
// spread 25%; phases squeezed into half the interval leave two quarters
// empty), and no tick more than 2.5 times the average (the phases are
// hashes of the watches' keys: 2.2 times here); a source with interval 0
// publishes none.
func TestSpreadOnePerInterval(t *testing.T) {
	pub := &fakePublisher{}
	h, ws, _ := newTest(t, pub, config.Source{Name: "a"}, config.Source{Name: "off", HeartbeatInterval: every(0)})
	h.last = t0
	src, off := &h.o.Config.Sources[0], &h.o.Config.Sources[1]
	for i := range 600 {
		*ws = append(*ws, &fakeWatch{key: fmt.Sprintf("a.ns-%d", i), ns: fmt.Sprintf("ns-%d", i), src: src, running: true})
	}
	*ws = append(*ws, &fakeWatch{key: "off.x", src: off, running: true})
	per := map[string]int{}
	maxTick := 0
	var quarters [4]int // heartbeats by the quarter of the (60 s) interval they fell in
	for s := 1; s <= 600; s++ {
		before := len(pub.sent)
		h.Tick(t0.Add(time.Duration(s) * time.Second))
		n := len(pub.sent) - before
		maxTick = max(maxTick, n)
		quarters[(s%60)/15] += n
	}
	for _, m := range pub.sent {
		env, err := event.DecodeMessage(m.Header, m.Data)
		if err != nil {
			t.Fatal(err)
		}
		if env.RelaydSource != "a" {
			t.Fatalf("a heartbeat of source %q, whose interval is 0", env.RelaydSource)
		}
		per[env.K8sNamespace]++
	}
	if len(per) != 600 {
		t.Errorf("%d watches had heartbeats, want 600", len(per))
	}
	for ns, n := range per {
		if n != 10 {
			t.Errorf("%s: %d heartbeats in 10 intervals, want 10", ns, n)
		}
	}
	if avg := 600 / 60; 2*maxTick > 5*avg {
		t.Errorf("a tick published %d heartbeats; the average is %d: not spread", maxTick, avg)
	}
	for i, n := range quarters {
		if share := float64(n) / float64(len(pub.sent)); share < 0.20 || share > 0.30 {
			t.Errorf("quarter %d of the interval carried %d of %d heartbeats (%.0f%%; quarters %v): not spread over the interval", i+1, n, len(pub.sent), 100*share, quarters)
		}
	}
}

// A watch that is not running publishes nothing; a watch whose pipeline
// acknowledged nothing over an interval with entries waiting is stalled:
// its heartbeat is withheld (counted) until its pipeline moves again.
func TestNotRunningAndStalled(t *testing.T) {
	pub := &fakePublisher{}
	h, ws, m := newTest(t, pub, config.Source{Name: "a", HeartbeatInterval: every(10 * time.Second)})
	h.last = t0
	w := &fakeWatch{key: "a", src: &h.o.Config.Sources[0], running: false}
	*ws = append(*ws, w)
	tick := func(s int) { h.Tick(t0.Add(time.Duration(s) * time.Second)) }
	for s := 1; s <= 20; s++ {
		tick(s)
	}
	if len(pub.sent) != 0 {
		t.Fatalf("%d heartbeats of a watch that is not running", len(pub.sent))
	}
	w.running = true
	w.beat.Progress = sink.Progress{Done: 5, Pending: 3}
	for s := 21; s <= 30; s++ { // its first due: published (nothing to compare with)
		tick(s)
	}
	for s := 31; s <= 50; s++ { // two more dues, Done still 5 with entries waiting
		tick(s)
	}
	stalled := testutil.ToFloat64(m.Heartbeats.WithLabelValues("a", ResultStalled))
	if len(pub.sent) != 1 || stalled != 2 {
		t.Fatalf("%d published, %v stalled; want 1 and 2", len(pub.sent), stalled)
	}
	w.beat.Progress.Done = 9 // the pipeline moved
	for s := 51; s <= 60; s++ {
		tick(s)
	}
	if len(pub.sent) != 2 {
		t.Fatalf("%d published after the pipeline moved, want 2", len(pub.sent))
	}
	w.beat.Progress.Pending = 0 // idle: no entries, nothing to acknowledge
	for s := 61; s <= 80; s++ {
		tick(s)
	}
	if len(pub.sent) != 4 {
		t.Fatalf("%d published by an idle watch, want 4", len(pub.sent))
	}
	n := len(pub.sent)
	h.Tick(t0.Add(81 * time.Second)) // reaps the acknowledgements
	if got := testutil.ToFloat64(m.Heartbeats.WithLabelValues("a", ResultPublished)); got != float64(n) {
		t.Errorf("published counted %v, want %d", got, n)
	}
}

// A watch in one object's handling for longer than the stall bound (5s)
// is stuck: relayd_watch_stalled counts it (every tick, also for a source
// without heartbeats), its heartbeats are withheld and counted as stalled
// (also while it is not running: a relist's object), the watch is told at
// each tick; once the handling ends, everything resumes. Another watch of
// the same source goes on publishing meanwhile.
func TestStuckInOneObject(t *testing.T) {
	pub := &fakePublisher{}
	h, ws, m := newTest(t, pub, config.Source{Name: "a", HeartbeatInterval: every(2 * time.Second)},
		config.Source{Name: "quiet", HeartbeatInterval: every(0)})
	h.last = t0
	a, quiet := &h.o.Config.Sources[0], &h.o.Config.Sources[1]
	stuck := &fakeWatch{key: "a.x", ns: "x", src: a, running: true}
	other := &fakeWatch{key: "a.y", ns: "y", src: a, running: true}
	q := &fakeWatch{key: "quiet", src: quiet, running: true}
	*ws = append(*ws, stuck, other, q)
	gauge := func(src string) float64 { return testutil.ToFloat64(m.Stalled.WithLabelValues(src)) }
	sentBy := func(ns string) int {
		n := 0
		for _, msg := range pub.sent {
			env, err := event.DecodeMessage(msg.Header, msg.Data)
			if err != nil {
				t.Fatal(err)
			}
			if env.K8sNamespace == ns {
				n++
			}
		}
		return n
	}
	tick := func(s int) { h.Tick(t0.Add(time.Duration(s) * time.Second)) }
	for s := 1; s <= 4; s++ {
		tick(s)
	}
	if sentBy("x") != 2 || sentBy("y") != 2 {
		t.Fatalf("before: %d and %d heartbeats, want 2 each", sentBy("x"), sentBy("y"))
	}

	// Handling one object from 4s on (and the quiet source's from 4s): at
	// the bound not yet stuck, past it stuck.
	stuck.since, q.since = t0.Add(4*time.Second), t0.Add(4*time.Second)
	for s := 5; s <= 9; s++ {
		tick(s)
	}
	if g := gauge("a"); g != 0 {
		t.Fatalf("relayd_watch_stalled{a} = %v after 5s in one object (the bound), want 0", g)
	}
	if sentBy("x") != 4 {
		t.Fatalf("%d heartbeats of x within the bound, want 4", sentBy("x"))
	}
	for s := 10; s <= 20; s++ {
		tick(s)
		if g := gauge("a"); g != 1 {
			t.Fatalf("at %ds relayd_watch_stalled{a} = %v, want 1", s, g)
		}
		if g := gauge("quiet"); g != 1 {
			t.Fatalf("at %ds relayd_watch_stalled{quiet} = %v, want 1 (a source without heartbeats)", s, g)
		}
	}
	stalled := testutil.ToFloat64(m.Heartbeats.WithLabelValues("a", ResultStalled))
	if sentBy("x") != 4 || stalled != 6 {
		t.Errorf("stuck from 9s to 20s: %d heartbeats of x (want 4: none more), %v counted stalled (want 6)", sentBy("x"), stalled)
	}
	if sentBy("y") != 10 {
		t.Errorf("%d heartbeats of y, want 10 (one per 2s: the other watch goes on)", sentBy("y"))
	}
	if stuck.marked != 11 {
		t.Errorf("the stuck watch was told %d times, want at each of the 11 ticks past the bound", stuck.marked)
	}
	// Not running (a relist) and still stuck: withheld, counted.
	stuck.running = false
	for s := 21; s <= 22; s++ {
		tick(s)
	}
	if got := testutil.ToFloat64(m.Heartbeats.WithLabelValues("a", ResultStalled)); got != stalled+1 {
		t.Errorf("stalled counted %v while stuck and not running, want %v", got, stalled+1)
	}

	// Done with the object: the gauge drops at the next tick, heartbeats
	// resume at the next due.
	stuck.running, stuck.since, q.since = true, time.Time{}, time.Time{}
	for s := 23; s <= 24; s++ {
		tick(s)
	}
	if g, gq := gauge("a"), gauge("quiet"); g != 0 || gq != 0 {
		t.Errorf("relayd_watch_stalled %v, %v once the handling ended, want 0", g, gq)
	}
	if sentBy("x") != 5 {
		t.Errorf("%d heartbeats of x after the handling ended, want 5", sentBy("x"))
	}
}

// A heartbeat that cannot be sent, is refused, or is due while NATS is
// down is counted as failed; the walk goes on (nothing waits, nothing is
// retried); a watch no longer run is forgotten.
func TestFailuresAreCountedNotRetried(t *testing.T) {
	pub := &fakePublisher{fail: errors.New("nats: slow consumer")}
	h, ws, m := newTest(t, pub, config.Source{Name: "a", HeartbeatInterval: every(time.Second)})
	h.last = t0
	*ws = append(*ws, &fakeWatch{key: "a", src: &h.o.Config.Sources[0], running: true})
	h.Tick(t0.Add(time.Second))
	pub.fail, pub.nack = nil, errors.New("nats: timeout")
	h.Tick(t0.Add(2 * time.Second))
	h.Tick(t0.Add(3 * time.Second)) // reaps the refused one, sends another
	down := make(chan struct{})
	h.o.Connected = func() <-chan struct{} { return down }
	h.Tick(t0.Add(4 * time.Second))
	if got := testutil.ToFloat64(m.Heartbeats.WithLabelValues("a", ResultFailed)); got != 4 {
		t.Errorf("failed counted %v, want 4 (a send error, two refused, one while disconnected)", got)
	}
	if len(pub.sent) != 2 {
		t.Errorf("%d publishes, want 2: none is retried", len(pub.sent))
	}
	*ws = nil
	h.Tick(t0.Add(5 * time.Second))
	if len(h.states) != 0 {
		t.Errorf("%d watch states kept after the watches stopped", len(h.states))
	}
}

// BenchmarkTick10k is one tick of the walk over 10,000 running watches
// with the default 1m interval (about 167 heartbeats due per tick, each
// encoded and handed to a publisher that acknowledges at once): the CPU
// and allocations of one second of heartbeats at that scale.
func BenchmarkTick10k(b *testing.B) { benchTick(b, true) }

// BenchmarkWalk10k is the walk alone: 10,000 watches, none running (no
// heartbeat is encoded or published).
func BenchmarkWalk10k(b *testing.B) { benchTick(b, false) }

func benchTick(b *testing.B, running bool) {
	pub := &fakePublisher{}
	h, ws, _ := newTest(b, pub, config.Source{Name: "deployments"})
	src := &h.o.Config.Sources[0]
	for i := range 10000 {
		*ws = append(*ws, &fakeWatch{key: fmt.Sprintf("deployments.ns-%d", i), ns: fmt.Sprintf("ns-%d", i), src: src, running: running,
			beat: watch.Beat{ResourceVersion: "123456789", Epoch: 3, LastRead: t0, Progress: sink.Progress{StreamSeq: 987654321, Done: 7}}})
	}
	h.last = t0
	now := t0
	for range 120 { // warm up: every watch's state exists
		now = now.Add(time.Second)
		h.Tick(now)
	}
	pub.discard, pub.n = true, 0
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		now = now.Add(time.Second)
		h.Tick(now)
	}
	b.ReportMetric(float64(pub.n)/float64(b.N), "heartbeats/tick")
}
