package index

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/internal/testenv"
)

// fillBucket opens a bucket on a new embedded server and writes n entries
// into it the way the scale run's relayd leaves them (docs/PERFORMANCE.md,
// "Restart at 1M index entries"): 15% under "pods._", the rest under
// "configmaps._", each source with its epoch.
func fillBucket(tb testing.TB, n int) (*Bucket, jetstream.JetStream) {
	tb.Helper()
	ctx := context.Background()
	url := os.Getenv("RELAYD_BENCH_NATS_URL")
	if url == "" {
		url = testenv.NATST(tb, testenv.NATSOptions{}).URL()
	}
	nc, err := nats.Connect(url)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		tb.Fatal(err)
	}
	b, err := Open(ctx, js, BucketOptions{Name: "load", Create: true})
	if err != nil {
		tb.Fatal(err)
	}
	if st, err := b.kv.Status(ctx); err == nil && st.Values() == uint64(n+2) {
		return b, js // an external server's bucket, filled by an earlier run
	}
	pods := n * 15 / 100
	for i := range n {
		src, name := "configmaps", fmt.Sprintf("cm-%07d", i)
		if i < pods {
			src, name = "pods", fmt.Sprintf("pod-%07d", i)
		}
		m := b.PutMsg(Prefix(src, ""), Object{UID: uid(i), Namespace: fmt.Sprintf("ns-%05d", i%10000), Name: name,
			ResourceVersion: strconv.Itoa(1_000_000 + i), Fingerprint: uint64(i) + 1})
		if _, err := js.PublishMsgAsync(&nats.Msg{Subject: m.Subject, Data: m.Data}, jetstream.WithStallWait(time.Minute)); err != nil {
			tb.Fatal(err)
		}
	}
	for _, src := range []string{"pods", "configmaps"} {
		m := b.EpochMsg(Prefix(src, ""), 3)
		if _, err := js.PublishMsgAsync(&nats.Msg{Subject: m.Subject, Data: m.Data}, jetstream.WithStallWait(time.Minute)); err != nil {
			tb.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
	}
	return b, js
}

// loadBoth is the restart's shared Load of the two sources.
func loadBoth(tb testing.TB, b *Bucket) (pods, cms *Index) {
	tb.Helper()
	pods, cms = New(), New()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, q := range []struct {
		p string
		x *Index
	}{{Prefix("pods", ""), pods}, {Prefix("configmaps", ""), cms}} {
		wg.Go(func() { _, errs[i] = b.Load(context.Background(), q.p, q.x) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			tb.Fatal(err)
		}
	}
	return pods, cms
}

// BenchmarkLoad is the restart's shared Load of a bucket of
// RELAYD_BENCH_LOAD_ENTRIES entries (default 100,000) into the indexes of
// two sources (docs/PERFORMANCE.md, "Restart at 1M index entries"). The
// server is embedded (its allocations count too), or, with
// RELAYD_BENCH_NATS_URL, an external one (whose bucket is filled once and
// kept for the next runs).
func BenchmarkLoad(b *testing.B) {
	n := 100_000
	if s := os.Getenv("RELAYD_BENCH_LOAD_ENTRIES"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil {
			b.Fatal(err)
		}
	}
	b.Run(fmt.Sprintf("entries=%d", n), func(b *testing.B) {
		bk, _ := fillBucket(b, n)
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			pods, cms := loadBoth(b, bk)
			if got := pods.Len() + cms.Len(); got != n {
				b.Fatalf("loaded %d entries, want %d", got, n)
			}
		}
		b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "entries/s")
	})
}
