package index

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/pkg/event"
)

// startWorld is a stream and a bucket as n watches of one source ("cms",
// namespaces ns-0..ns-n-1) leave them: each watch's object has one event on
// the stream at resourceVersion 10 (the watch's catch-up reads from it), and
// an index entry at 10, or, for every third watch, at 5 (relayd stopped
// between the PubAck and the index write: the catch-up must fix it); each
// watch's epoch is its number. A message of another publisher sits on
// relayd's subjects among them.
type startWorld struct {
	js     jetstream.JetStream
	nc     *nats.Conn
	bucket *Bucket
	stream *CatchUpReader
	n      int
	from   []uint64 // per watch, the sequence of its event
}

func newStartWorld(tb testing.TB, n int) *startWorld {
	tb.Helper()
	ctx := context.Background()
	srv := testenv.NATST(tb, testenv.NATSOptions{})
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"k8s.>"}}); err != nil {
		tb.Fatal(err)
	}
	b, err := Open(ctx, js, BucketOptions{Name: "start-reads", Create: true})
	if err != nil {
		tb.Fatal(err)
	}
	enc, err := event.NewEncoder(event.EncoderOptions{Cluster: "c1", Source: "cms"})
	if err != nil {
		tb.Fatal(err)
	}
	cms := event.Resource{Version: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespaced: true}
	w := &startWorld{js: js, nc: nc, bucket: b, n: n, from: make([]uint64, n),
		stream: &CatchUpReader{JetStream: js, Stream: "EVENTS", Subject: "k8s.c1.>", Cluster: "c1"}}
	for i := range n {
		ns := fmt.Sprintf("ns-%d", i)
		m, err := enc.Encode(&event.Change{Type: event.Added, Origin: event.OriginWatch, Resource: cms,
			Meta: event.Meta{Namespace: ns, Name: "o", UID: uid(i), ResourceVersion: "10"}, Payload: event.PayloadMetadata, Data: []byte(`{}`)})
		if err != nil {
			tb.Fatal(err)
		}
		w.from[i] = publishStart(tb, js, &m)
		if i == n/2 {
			publishStart(tb, js, &event.Message{Subject: "k8s.c1.foreign", Data: []byte(`not an event`)})
		}
		rv := "10"
		if i%3 == 0 {
			rv = "5"
		}
		publishStart(tb, js, b.PutMsg(Prefix("cms", ns), Object{UID: uid(i), Namespace: ns, Name: "o", ResourceVersion: rv}))
		publishStart(tb, js, b.EpochMsg(Prefix("cms", ns), uint64(i)))
	}
	return w
}

func publishStart(tb testing.TB, js jetstream.JetStream, m *event.Message) uint64 {
	tb.Helper()
	ack, err := js.PublishMsg(context.Background(), &nats.Msg{Subject: m.Subject, Data: m.Data, Header: nats.Header(m.Header)})
	if err != nil {
		tb.Fatalf("publish %s: %v", m.Subject, err)
	}
	return ack.Sequence
}

// started is what one watch's first load got.
type started struct {
	x     *Index
	gen   Generation
	epoch uint64
	res   CatchUpResult
	err   error
}

// start runs the first load of every watch at once, as pkg/watch does
// (generation, entries, epoch, catch-up from the watch's event), and
// returns the JetStream API requests and consumer creates the server
// received meanwhile.
func (w *startWorld) start(tb testing.TB) (out []started, requests, consumers int) {
	tb.Helper()
	var mu sync.Mutex
	sub, err := w.nc.Subscribe("$JS.API.>", func(m *nats.Msg) {
		mu.Lock()
		defer mu.Unlock()
		requests++
		if strings.HasPrefix(m.Subject, "$JS.API.CONSUMER.CREATE.") {
			consumers++
		}
	})
	if err != nil {
		tb.Fatal(err)
	}
	if err := w.nc.Flush(); err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out = make([]started, w.n)
	var wg sync.WaitGroup
	for i := range w.n {
		wg.Go(func() { out[i] = w.startOne(ctx, i) })
	}
	wg.Wait()
	if err := w.nc.Flush(); err != nil {
		tb.Fatal(err)
	}
	_ = sub.Unsubscribe()
	mu.Lock()
	defer mu.Unlock()
	return out, requests, consumers
}

func (w *startWorld) startOne(ctx context.Context, i int) (s started) {
	prefix := Prefix("cms", fmt.Sprintf("ns-%d", i))
	s.x = New()
	if s.gen, s.err = w.bucket.Generation(ctx); s.err != nil {
		return s
	}
	if _, s.err = w.bucket.Load(ctx, prefix, s.x); s.err != nil {
		return s
	}
	if s.epoch, _, s.err = w.bucket.Epoch(ctx, prefix); s.err != nil {
		return s
	}
	s.res, s.err = w.stream.CatchUp(ctx, zap.NewNop(), s.x, CatchUpOf{Source: "cms", Namespace: fmt.Sprintf("ns-%d", i), From: w.from[i], Legacy: true})
	return s
}

// TestStartReadsAreShared: the first loads of many watches made together
// share their reads (one bucket status, one consumer on the bucket, one
// stream info, one catch-up consumer), and each watch still gets exactly
// what a read of its own would give: its entries and epoch, the catch-up
// of its own range (messages read, fixes, replay fences, foreign messages).
func TestStartReadsAreShared(t *testing.T) {
	const n = 60
	w := newStartWorld(t, n)
	out, requests, consumers := w.start(t)
	t.Logf("%d watches: %d JetStream API requests, %d consumers created", n, requests, consumers)
	if consumers != 2 {
		t.Errorf("%d consumers created for %d watches, want 2 (one read of the bucket, one catch-up read)", consumers, n)
	}
	if requests > 10 {
		t.Errorf("%d JetStream API requests for %d watches, want at most 10 (shared reads)", requests, n)
	}
	foreignAt := w.from[n/2] + 1 // right after watch n/2's event: see newStartWorld
	var lastSeq uint64
	for i, s := range out {
		if s.err != nil {
			t.Fatalf("watch %d: %v", i, s.err)
		}
		if i == 0 {
			lastSeq = s.res.To
		}
		if o, ok := s.x.Get(uid(i)); !ok || o.ResourceVersion != "10" || s.x.Len() != 1 {
			t.Errorf("watch %d: index %+v (%d objects), want its own object at 10", i, o, s.x.Len())
		}
		if s.epoch != uint64(i) {
			t.Errorf("watch %d: epoch %d, want %d", i, s.epoch, i)
		}
		wantFixes := 0
		if i%3 == 0 {
			wantFixes = 1
		}
		if len(s.res.Fixes) != wantFixes || s.res.Last[uid(i)] != "10" || len(s.res.Last) != 1 {
			t.Errorf("watch %d: fixes %+v, fences %v; want %d fix and the fence at 10", i, s.res.Fixes, s.res.Last, wantFixes)
		}
		wantForeign := 0
		if w.from[i] < foreignAt {
			wantForeign = 1
		}
		// Its range holds its own event and every later watch's, and the
		// foreign message if it comes after its start.
		if wantRead := n - i + wantForeign; s.res.Read != wantRead || s.res.Foreign != wantForeign || s.res.To != lastSeq {
			t.Errorf("watch %d: read %d, foreign %d, to %d; want %d, %d, %d", i, s.res.Read, s.res.Foreign, s.res.To, wantRead, wantForeign, lastSeq)
		}
	}

	// A later start gets reads of its own, started after it asked: the
	// bucket's generation and epochs as they are now.
	publishStart(t, w.js, w.bucket.EpochMsg(Prefix("cms", "ns-1"), 99))
	alone, _, consumers := w.start(t)
	if g := alone[1].gen; alone[1].epoch != 99 || g.LastSeq != out[1].gen.LastSeq+1 || consumers != 2 {
		t.Errorf("second start: epoch %d, generation %+v (before %+v), %d consumers; want 99, one write later, 2", alone[1].epoch, g, out[1].gen, consumers)
	}
}

// BenchmarkStartReads reports the JetStream API requests and consumers of
// the first loads of 100 and 1,000 watches started together (the counts of
// docs/ARCHITECTURE.md, "Start-up reads are shared"): they do not grow with
// the number of watches.
func BenchmarkStartReads(b *testing.B) {
	for _, n := range []int{100, 1000} {
		b.Run(fmt.Sprintf("watches=%d", n), func(b *testing.B) {
			w := newStartWorld(b, n)
			var requests, consumers int
			for b.Loop() {
				out, r, c := w.start(b)
				for i, s := range out {
					if s.err != nil {
						b.Fatalf("watch %d: %v", i, s.err)
					}
				}
				requests, consumers = requests+r, consumers+c
			}
			b.ReportMetric(float64(requests)/float64(b.N), "api-requests/op")
			b.ReportMetric(float64(consumers)/float64(b.N), "consumers/op")
		})
	}
}
