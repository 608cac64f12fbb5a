package checkpoint

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/relayd/relayd/pkg/index"
)

// byteCounter counts what updates send: the bytes of the data (keys and
// values) of every ConfigMap update, and the updates.
type byteCounter struct {
	corev1client.ConfigMapsGetter
	bytes, updates atomic.Int64
}

func (c *byteCounter) ConfigMaps(ns string) corev1client.ConfigMapInterface {
	return &byteCounterCMs{ConfigMapInterface: c.ConfigMapsGetter.ConfigMaps(ns), c: c}
}

type byteCounterCMs struct {
	corev1client.ConfigMapInterface
	c *byteCounter
}

func (w *byteCounterCMs) Update(ctx context.Context, cm *corev1.ConfigMap, o metav1.UpdateOptions) (*corev1.ConfigMap, error) {
	if len(o.DryRun) == 0 {
		w.c.updates.Add(1)
		for k, v := range cm.Data {
			w.c.bytes.Add(int64(len(k) + len(v)))
		}
	}
	return w.ConfigMapInterface.Update(ctx, cm, o)
}

// BenchmarkFlushBytes reports what one flush sends to the apiserver (and
// so what etcd stores) with the one-ConfigMap layout of earlier versions
// ("one") and with one ConfigMap per DefaultWatchesPerConfigMap watches
// ("sharded"), at 1,000 and 10,000 watches of one source with that many
// namespaces, when 1 key, a tenth of the keys or every key changed since
// the last flush. Values are realistic: a 7-digit resourceVersion, an index
// generation and a stream sequence. At 10,000 watches the one ConfigMap is
// over the apiserver's 1 MiB and every flush fails (failed/flush 1).
// Metrics: B/flush (data bytes of the updates), updates/flush, B/watch.
//
//	go test -run '^$' -bench FlushBytes -benchtime 3x ./pkg/checkpoint
func BenchmarkFlushBytes(b *testing.B) {
	for _, watches := range []int{1000, 10000} {
		for _, layout := range []struct {
			name   string
			shards int
		}{{"one", 1}, {"sharded", ShardCount(watches, DefaultWatchesPerConfigMap)}} {
			for _, changed := range []int{1, watches / 10, watches} {
				name := fmt.Sprintf("watches=%d/layout=%s/configmaps=%d/changed=%d", watches, layout.name, layout.shards, changed)
				b.Run(name, func(b *testing.B) { benchFlush(b, watches, layout.shards, changed) })
			}
		}
	}
}

func benchFlush(b *testing.B, watches, shards, changed int) {
	admin := env.Clientset(b, false)
	ns := env.Namespace(b)
	bc := &byteCounter{ConfigMapsGetter: admin.CoreV1()}
	s, err := New(Options{Client: bc, Namespace: ns, Name: cmName, Shards: shards, Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Load(b.Context()); err != nil {
		b.Fatal(err)
	}
	gen := time.Date(2026, 11, 23, 9, 0, 0, 500_000_000, time.UTC).Format(time.RFC3339Nano)
	rv := 4_000_000
	advance := func(n int) {
		for i := range n {
			rv++
			s.Advance(Key("pods", fmt.Sprintf("team-%05d", i)), Position{ResourceVersion: fmt.Sprint(rv), Epoch: 1,
				Index: &index.Ref{Generation: gen, Seq: uint64(rv)}, StreamSeq: uint64(rv)}, false)
		}
	}
	advance(watches)
	failed := 0
	if err := s.Flush(b.Context()); err != nil {
		failed++
	}
	bc.bytes.Store(0)
	bc.updates.Store(0)
	b.ResetTimer()
	for range b.N {
		advance(changed)
		if err := s.Flush(b.Context()); err != nil {
			failed++
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(bc.bytes.Load())/float64(b.N), "B/flush")
	b.ReportMetric(float64(bc.updates.Load())/float64(b.N), "updates/flush")
	b.ReportMetric(float64(failed)/float64(b.N+1), "failed/flush")
	var stored int64
	for _, name := range ShardNames(cmName, shards) {
		cm, err := admin.CoreV1().ConfigMaps(ns).Get(b.Context(), name, metav1.GetOptions{})
		if err != nil {
			b.Fatal(err)
		}
		for k, v := range cm.Data {
			stored += int64(len(k) + len(v))
		}
	}
	if failed == 0 {
		b.ReportMetric(float64(stored)/float64(watches), "B/watch")
	}
}
