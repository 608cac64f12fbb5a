package bench

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/relayd/relayd/pkg/config"
	"github.com/relayd/relayd/pkg/event"
)

// Percentiles of a latency distribution, in seconds.
type Percentiles struct {
	N                   int
	P50, P99, P999, Max float64
	HistP50, HistP99    float64 `json:",omitempty"` // from relayd_publish_lag_seconds, for comparison
	Mean                float64
}

func percentiles(xs []float64) Percentiles {
	if len(xs) == 0 {
		return Percentiles{}
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	q := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return s[max(0, min(i, len(s)-1))]
	}
	var sum float64
	for _, x := range s {
		sum += x
	}
	return Percentiles{N: len(s), P50: q(.5), P99: q(.99), P999: q(.999), Max: s[len(s)-1], Mean: sum / float64(len(s))}
}

// LatencyResult is the latency and checkpoint scenario on the real
// apiserver.
type LatencyResult struct {
	Objects  int
	Rate     float64 // writes per second achieved
	Duration float64 // seconds
	Writes   int
	Received int
	// ReadToAck is relayd's watch read (event time) → PubAck seen on the
	// wire, one sample per write whose PubAck the snoop saw: its N below
	// Writes means the figure is not measured (the report says so).
	ReadToAck   Percentiles
	WriteToRecv Percentiles // writer's API response → message received by a JetStream consumer
	// RecvFirst counts messages received before the writer's client had
	// its API response (a negative WriteToRecv).
	RecvFirst    int
	CheckpointPS float64 // checkpoint writes per second under load
	// CheckpointWrites counts them; a window of Duration seconds holds at
	// most floor(Duration/flush interval)+1 flushes.
	CheckpointWrites float64
	// CheckpointsCounted says relayd_checkpoint_writes_total was in every
	// scrape around the load and the idle time (else the counts are none).
	CheckpointsCounted bool
	// RunQueueWait is how long relayd's threads waited for a CPU in the
	// kernel's run queue while the load ran, per event; RunPerEvent the CPU
	// they ran. A wait of the order of the latency tail says the tail is the
	// machine's CPU contention, not relayd.
	RunQueueWait, RunPerEvent time.Duration
	IdleWrites                float64 // checkpoint writes while idle
	IdleSeconds               float64
	FlushInterval             string
}

// flushInterval is the checkpoint flush interval the bench runs relayd
// with: the default.
const flushInterval = config.DefaultFlushInterval

type received struct {
	seq          uint64
	readAt, recv time.Time
}

func (h *harness) latency(ctx context.Context) (*LatencyResult, error) {
	env, err := h.apiserver(ctx)
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(env.AdminConfig())
	if err != nil {
		return nil, err
	}
	id := h.next()
	ns := "lat-" + id
	for _, n := range []string{ns, "relayd"} {
		if err := ensureNamespace(ctx, cs, n); err != nil {
			return nil, err
		}
	}
	const objects = 100
	pods := make([]*corev1.Pod, objects)
	err = parallel(ctx, objects, 8, func(ctx context.Context, i int) error {
		p, err := cs.CoreV1().Pods(ns).Create(ctx, benchPod(ns, i), metav1.CreateOptions{FieldManager: managerRS})
		if err != nil {
			return err
		}
		kubeletStatus(p, i, true)
		pods[i], err = cs.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{FieldManager: managerKubelet})
		return err
	})
	if err != nil {
		return nil, err
	}
	kc := filepath.Join(h.o.WorkDir, "apiserver.kubeconfig")
	if err := env.WriteKubeconfig(kc, false); err != nil {
		return nil, err
	}
	stream, cluster := "LAT"+id, "lat"+id
	if err := h.createStream(ctx, stream, cluster); err != nil {
		return nil, err
	}
	defer h.deleteStream(stream)
	h.snoop.Record(stream)
	src := fmt.Sprintf(`  - name: pods
    apiVersion: v1
    kind: Pod
    namespaces: [%s]
    initial: none
`, ns)
	r, err := h.startRelayd(ctx, "latency-"+id, h.relaydConfig(cluster, stream, "", src), kc, "")
	if err != nil {
		return nil, err
	}
	defer r.Stop(30 * time.Second)
	if err := r.waitReady(ctx, time.Minute); err != nil {
		return nil, err
	}

	// The consumer: an ordered JetStream consumer, as a downstream service.
	var mu sync.Mutex
	got := map[string]received{}
	cons, err := h.js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, err
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		now := time.Now()
		md, err := m.Metadata()
		if err != nil {
			return
		}
		ev, err := event.DecodeMessage(m.Headers(), m.Data())
		if err != nil || ev.K8sUID == "" {
			return
		}
		mu.Lock()
		got[ev.K8sUID+"/"+ev.K8sResourceVersion] = received{seq: md.Sequence.Stream, readAt: ev.Time, recv: now}
		mu.Unlock()
	})
	if err != nil {
		return nil, err
	}
	defer cc.Stop()

	// The writer: an open loop at a steady rate, each write an annotation
	// on one of the pods (a MODIFIED event of ~8 KB).
	rate, dur := h.o.LatencyRate, h.o.LatencyDuration
	total := int(float64(rate) * dur.Seconds())
	written := make(map[string]time.Time, total)
	var wmu sync.Mutex
	ticks := make(chan int, total)
	m0, err := Scrape(ctx, r.metrics)
	if err != nil {
		return nil, err
	}
	s0, err := r.Sched()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	var wg sync.WaitGroup
	var werr error
	for range 16 {
		wg.Go(func() {
			for i := range ticks {
				p := pods[i%objects]
				patch := fmt.Appendf(nil, `{"metadata":{"annotations":{"bench.relayd.io/seq":"%d"}}}`, i)
				out, err := cs.CoreV1().Pods(ns).Patch(ctx, p.Name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: managerKubectl})
				t := time.Now()
				wmu.Lock()
				if err != nil {
					werr = err
				} else {
					written[string(out.UID)+"/"+out.ResourceVersion] = t
				}
				wmu.Unlock()
			}
		})
	}
	for i := range total {
		at := start.Add(time.Duration(float64(i) / float64(rate) * float64(time.Second)))
		if d := time.Until(at); d > 0 {
			time.Sleep(d)
		}
		ticks <- i
	}
	close(ticks)
	wg.Wait()
	elapsed := time.Since(start)
	s1, err := r.Sched()
	if err != nil {
		return nil, err
	}
	m1, err := Scrape(ctx, r.metrics)
	if err != nil {
		return nil, err
	}
	if werr != nil {
		return nil, werr
	}
	// Wait for every write to arrive.
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		n := 0
		for k := range written {
			if _, ok := got[k]; ok {
				n++
			}
		}
		mu.Unlock()
		if n == len(written) {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("only %d of %d writes arrived", n, len(written))
		}
		time.Sleep(100 * time.Millisecond)
	}
	res := &LatencyResult{Objects: objects, Writes: len(written), Duration: elapsed.Seconds(),
		Rate: float64(len(written)) / elapsed.Seconds(), FlushInterval: flushInterval.String() + " (default)"}
	var readToAck, writeToRecv []float64
	mu.Lock()
	for k, wt := range written {
		g := got[k]
		res.Received++
		writeToRecv = append(writeToRecv, g.recv.Sub(wt).Seconds())
		if g.recv.Before(wt) {
			res.RecvFirst++
		}
		if at, ok := h.snoop.AckTime(stream, g.seq); ok {
			readToAck = append(readToAck, at.Sub(g.readAt).Seconds())
		}
	}
	mu.Unlock()
	if res.Writes > 0 {
		res.RunQueueWait = (s1.Wait - s0.Wait) / time.Duration(res.Writes)
		res.RunPerEvent = (s1.Run - s0.Run) / time.Duration(res.Writes)
	}
	res.ReadToAck = percentiles(readToAck)
	res.WriteToRecv = percentiles(writeToRecv)
	lagMatch := map[string]string{"source": "pods"}
	res.ReadToAck.HistP50 = HistogramQuantile(.5, "relayd_publish_lag_seconds", lagMatch, m0, m1)
	res.ReadToAck.HistP99 = HistogramQuantile(.99, "relayd_publish_lag_seconds", lagMatch, m0, m1)
	res.CheckpointsCounted = m0.Has("relayd_checkpoint_writes_total") && m1.Has("relayd_checkpoint_writes_total")
	res.CheckpointWrites = m1.Sum("relayd_checkpoint_writes_total", nil) - m0.Sum("relayd_checkpoint_writes_total", nil)
	res.CheckpointPS = res.CheckpointWrites / elapsed.Seconds()
	h.logf("bench: latency: %d writes at %.0f/s: read→PubAck p50 %s p99 %s p99.9 %s; write→received p50 %s p99 %s; checkpoint writes %.3f/s; per event relayd ran %v and waited %v for a CPU",
		res.Writes, res.Rate, ms(res.ReadToAck.P50), ms(res.ReadToAck.P99), ms(res.ReadToAck.P999),
		ms(res.WriteToRecv.P50), ms(res.WriteToRecv.P99), res.CheckpointPS, res.RunPerEvent, res.RunQueueWait)

	// Idle: after the last flush of the load (one flush interval), nothing
	// changes; count writes over IdleFor.
	if h.o.IdleFor > 0 {
		select {
		case <-time.After(6 * time.Second):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		i0, err := Scrape(ctx, r.metrics)
		if err != nil {
			return nil, err
		}
		select {
		case <-time.After(h.o.IdleFor):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		i1, err := Scrape(ctx, r.metrics)
		if err != nil {
			return nil, err
		}
		res.CheckpointsCounted = res.CheckpointsCounted && i0.Has("relayd_checkpoint_writes_total") && i1.Has("relayd_checkpoint_writes_total")
		res.IdleWrites = i1.Sum("relayd_checkpoint_writes_total", nil) - i0.Sum("relayd_checkpoint_writes_total", nil)
		res.IdleSeconds = h.o.IdleFor.Seconds()
		h.logf("bench: idle %v: %.0f checkpoint writes", h.o.IdleFor, res.IdleWrites)
	}
	return res, nil
}

// ms formats seconds as milliseconds; negative values are real (a message
// can arrive before the writer's client has read its API response).
func ms(s float64) string {
	if math.IsNaN(s) {
		return "n/a"
	}
	return strconv.FormatFloat(s*1000, 'f', 2, 64) + " ms"
}

// msHist is ms for HistogramQuantile, which returns -1 without data.
func msHist(s float64) string {
	if s < 0 {
		return "n/a"
	}
	return ms(s)
}
