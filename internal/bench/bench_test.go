package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/relayd/relayd/pkg/source"
)

// podFrames makes n watch frames of pkg/event's realistic pod, each with
// its own resourceVersion.
func podFrames(t *testing.T, n int) [][]byte {
	t.Helper()
	raw, err := os.ReadFile("../../pkg/event/testdata/pod.json")
	if err != nil {
		t.Fatal(err)
	}
	var pod map[string]any
	if err := json.Unmarshal(raw, &pod); err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for i := range n {
		pod["metadata"].(map[string]any)["resourceVersion"] = fmt.Sprint(1000 + i)
		b, err := json.Marshal(map[string]any{"type": "MODIFIED", "object": pod})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

// The replay server speaks enough of the apiserver for client-go: a dynamic
// and a typed watch get every recorded frame, once, and the checkpoint
// ConfigMap can be created (protobuf, client-go's default), read and
// updated.
func TestReplayServerServesClientGo(t *testing.T) {
	const n = 50
	srv := NewServer(&Replay{Version: "v1", Resource: "pods", Kind: "Pod", Namespaced: true, ListRV: "999", Watch: podFrames(t, n)})
	defer srv.Close()
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := srv.WriteKubeconfig(kc); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	w, err := dyn.Resource(schema.GroupVersionResource{Version: "v1", Resource: "pods"}).Watch(t.Context(), metav1.ListOptions{ResourceVersion: "999"})
	if err != nil {
		t.Fatal(err)
	}
	var rvs []string
	for len(rvs) < n {
		ev := <-w.ResultChan()
		if ev.Type != watch.Modified {
			t.Fatalf("event %d: %s %v", len(rvs), ev.Type, ev.Object)
		}
		o, err := metaOf(ev.Object)
		if err != nil {
			t.Fatal(err)
		}
		rvs = append(rvs, o)
	}
	w.Stop()
	if rvs[0] != "1000" || rvs[n-1] != fmt.Sprint(1000+n-1) {
		t.Errorf("resourceVersions %s … %s, want 1000 … %d", rvs[0], rvs[n-1], 1000+n-1)
	}
	if srv.WatchSent.Load() == 0 || srv.Watches.Load() != 1 {
		t.Errorf("watches %d, sent %d", srv.Watches.Load(), srv.WatchSent.Load())
	}

	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "relayd-checkpoint"}, Data: map[string]string{"a": "1"}}
	got, err := cs.CoreV1().ConfigMaps("relayd").Create(t.Context(), cm, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got.Data["a"] = "2"
	if _, err := cs.CoreV1().ConfigMaps("relayd").Update(t.Context(), got, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	again, err := cs.CoreV1().ConfigMaps("relayd").Get(t.Context(), "relayd-checkpoint", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if again.Data["a"] != "2" || srv.CheckpointWrites.Load() != 1 {
		t.Errorf("ConfigMap data %v, %d writes; want a=2 and 1 write", again.Data, srv.CheckpointWrites.Load())
	}
}

func metaOf(o any) (string, error) {
	type rv interface{ GetResourceVersion() string }
	m, ok := o.(rv)
	if !ok {
		return "", fmt.Errorf("%T has no resourceVersion", o)
	}
	return m.GetResourceVersion(), nil
}

// The report states every goal with its margin when it is missed, and a
// goal is met only when it was measured.
func TestReportGoals(t *testing.T) {
	capacity := func(relayd, dynamic, typed, shaped float64) *CapacityResult {
		c := &CapacityResult{}
		for _, s := range []CapacitySummary{
			{Stream: "pods", Consumer: ModeRelayd, PerCPUSecond: relayd},
			{Stream: "pods", Consumer: ModeDynamic, PerCPUSecond: dynamic},
			{Stream: "pods", Consumer: ModeTyped, PerCPUSecond: typed},
			{Stream: "pods", Consumer: ConsumerRelaydShaped, PerCPUSecond: shaped},
			{Stream: "widgets", Consumer: ModeRelayd, PerCPUSecond: 4000},
			{Stream: "widgets", Consumer: ModeDynamic, PerCPUSecond: 1000},
		} {
			if s.PerCPUSecond >= 0 { // < 0: the summary is missing
				c.Summaries = append(c.Summaries, s)
			}
		}
		return c
	}
	latency := func(writes, samples int) *LatencyResult {
		return &LatencyResult{Writes: writes, ReadToAck: Percentiles{N: samples, P50: 0.0005, P99: 0.010},
			CheckpointPS: 0.2, IdleSeconds: 60, CheckpointsCounted: true,
			// Six flushes in a window just under 30 s: one per 5 s, the
			// window began just before one and ended just after another.
			CheckpointWrites: 6, Duration: 29.998}
	}
	memory := func(peaks ...MemoryPoint) *MemoryResult {
		return &MemoryResult{Points: peaks, RSSPerObject: 200, LiveHeapPerObject: 120, HeapPerObject: 130}
	}
	// filtered adds the filtered relayd's figure (pods) to c.
	filtered := func(c *CapacityResult, v float64) *CapacityResult {
		c.Summaries = append(c.Summaries, CapacitySummary{Stream: "pods", Consumer: ConsumerRelaydFiltered, PerCPUSecond: v})
		return c
	}
	twoSizes := []MemoryPoint{{Objects: 10, RSS: 100 << 20, PeakRSS: 120 << 20}, {Objects: 20, RSS: 200 << 20, PeakRSS: 220 << 20}}
	recovery := func(from410 float64) *RecoveryResult {
		return &RecoveryResult{Objects: 1000, Runs: []RecoveryRun{{From410: from410}}, From410: from410}
	}
	const (
		absPods  = "capacity: relayd, pods (9 KB), events per CPU-second"
		dynPods  = "capacity: relayd ÷ dynamic consumer, pods"
		typPods  = "capacity: relayd ÷ typed consumer, pods"
		dynWidg  = "capacity: relayd ÷ dynamic consumer, widgets"
		shaped   = "capacity: relayd with drop + ignoreChanges ÷ plain relayd, pods"
		filter   = "capacity: relayd with a three-clause filter ÷ plain relayd, pods"
		liveHeap = "memory: live heap per tracked object"
		recov    = "recovery: 410 → sync.completed"
		p50, p99 = "latency: watch read → PubAck p50", "latency: watch read → PubAck p99"
		load     = "checkpoint writes under load"
		idle     = "checkpoint writes when idle"
		peak     = "memory: RSS peak (VmHWM) during a forced relist"
		rssSlope = "memory: RSS per tracked object"
	)
	type want struct {
		prefix            string
		met, notMeasured  bool
		miss, measuredHas string
	}
	for _, tc := range []struct {
		name string
		r    *Report
		want []want
	}{{
		name: "every figure measured",
		r:    &Report{Capacity: capacity(24000, 3000, 2000, 21600), Latency: latency(3000, 3000)},
		want: []want{
			{prefix: absPods, met: true, measuredHas: "24,000"},
			{prefix: dynPods, miss: "20% short", measuredHas: "8.00×"},
			{prefix: typPods, met: true},
			{prefix: dynWidg, met: true},
			{prefix: shaped, met: true, measuredHas: "0.90×"},
			{prefix: p50, met: true},
			{prefix: p99, miss: "2.00× the goal"},
			{prefix: load, met: true},
			{prefix: idle, met: true},
		},
	}, {
		name: "too few PubAck samples: latency not measured",
		r:    &Report{Latency: latency(3000, 2990)},
		want: []want{
			{prefix: p50, notMeasured: true, miss: "not measured: a PubAck was seen for 2990 of 3000 writes", measuredHas: "0.50 ms from 2990 of 3000 writes"},
			{prefix: p99, notMeasured: true, miss: "2990 of 3000"},
			{prefix: load, met: true},
		},
	}, {
		name: "no PubAck samples: latency not measured",
		r:    &Report{Latency: latency(3000, 0)},
		want: []want{{prefix: p50, notMeasured: true, miss: "0 of 3000 writes"}, {prefix: p99, notMeasured: true, miss: "0 of 3000 writes"}},
	}, {
		name: "checkpoint counter missing: not measured",
		r:    &Report{Latency: func() *LatencyResult { l := latency(10, 10); l.CheckpointsCounted = false; return l }()},
		want: []want{{prefix: load, notMeasured: true, miss: "relayd_checkpoint_writes_total"}, {prefix: idle, notMeasured: true}},
	}, {
		name: "relist peak from VmHWM: within the goal",
		r: &Report{Memory: memory(
			MemoryPoint{Objects: 10, RSS: 100 << 20, PeakRSS: 120 << 20},
			MemoryPoint{Objects: 20, RSS: 200 << 20, PeakRSS: 220 << 20})},
		want: []want{{prefix: peak, met: true, measuredHas: "1.20×"}, {prefix: rssSlope, met: true}},
	}, {
		name: "relist peak from VmHWM: over the goal",
		r: &Report{Memory: memory(
			MemoryPoint{Objects: 10, RSS: 100 << 20, PeakRSS: 120 << 20},
			MemoryPoint{Objects: 20, RSS: 200 << 20, PeakRSS: 360 << 20})},
		want: []want{{prefix: peak, miss: "1.20× the goal", measuredHas: "1.80×"}},
	}, {
		name: "relist peak: VmHWM not reset",
		r: &Report{Memory: memory(
			MemoryPoint{Objects: 10, RSS: 100 << 20, PeakRSS: 120 << 20},
			MemoryPoint{Objects: 20, RSS: 200 << 20, PeakError: "the kernel did not reset it"})},
		want: []want{{prefix: peak, notMeasured: true, miss: "20 objects: the kernel did not reset it"}},
	}, {
		name: "one memory size: slopes not measured, peak judged",
		r:    &Report{Memory: memory(MemoryPoint{Objects: 10, RSS: 100 << 20, PeakRSS: 110 << 20})},
		want: []want{{prefix: rssSlope, notMeasured: true, miss: "two sizes"}, {prefix: peak, met: true}},
	}, {
		name: "0 ratios: failure rows",
		r:    &Report{Capacity: capacity(0, 2000, 0, 0)},
		want: []want{
			{prefix: absPods, miss: "relayd measured 0: failed"},
			{prefix: dynPods, miss: "a side measured 0 (relayd: 0, dynamic: 2000): failed"},
			{prefix: typPods, miss: "a side measured 0"},
			{prefix: shaped, miss: "a side measured 0"},
			{prefix: dynWidg, met: true},
		},
	}, {
		name: "a missing side: not measured",
		r:    &Report{Capacity: capacity(30000, -1, 1000, -1)},
		want: []want{
			{prefix: absPods, met: true},
			{prefix: dynPods, notMeasured: true, miss: "not measured: no figure for dynamic on pods"},
			{prefix: shaped, notMeasured: true, miss: "not measured: no figure for relayd-shaped on pods"},
			{prefix: typPods, met: true},
		},
	}, {
		name: "relayd below 20,000 pod events per CPU-second",
		r:    &Report{Capacity: capacity(16000, 1000, 1000, 16000)},
		want: []want{{prefix: absPods, miss: "20% short (needs 1.25× of what was measured)", measuredHas: "16,000"}, {prefix: dynPods, met: true}},
	}, {
		name: "relayd missing: not measured",
		r:    &Report{Capacity: capacity(-1, 1000, 1000, -1)},
		want: []want{{prefix: absPods, notMeasured: true, miss: "not measured: no figure for relayd on pods"}},
	}, {
		name: "shaped ÷ plain below 0.85",
		r:    &Report{Capacity: capacity(3000, 1000, 1000, 2400)},
		want: []want{{prefix: shaped, miss: "6% short", measuredHas: "0.80×"}},
	}, {
		name: "shaped ÷ plain above 0.85",
		r:    &Report{Capacity: capacity(3000, 1000, 1000, 2580)},
		want: []want{{prefix: shaped, met: true, measuredHas: "0.86×"}},
	}, {
		// Every guard below: a 0 or missing input is never met.
		name: "plain relayd measured 0: no ratio over it is met (not +Inf)",
		r:    &Report{Capacity: filtered(capacity(0, 2000, 1000, 21600), 18000)},
		want: []want{
			{prefix: shaped, miss: "a side measured 0 (relayd-shaped: 21600, relayd: 0): failed"},
			{prefix: filter, miss: "a side measured 0 (relayd-filtered: 18000, relayd: 0): failed"},
			{prefix: typPods, miss: "a side measured 0"},
		},
	}, {
		name: "filtered ÷ plain below 0.7",
		r:    &Report{Capacity: filtered(capacity(3000, 1000, 1000, 2700), 1800)},
		want: []want{{prefix: filter, miss: "14% short", measuredHas: "0.60×"}},
	}, {
		name: "filtered ÷ plain above 0.7",
		r:    &Report{Capacity: filtered(capacity(3000, 1000, 1000, 2700), 2250)},
		want: []want{{prefix: filter, met: true, measuredHas: "0.75×"}},
	}, {
		name: "filtered relayd missing or measured 0",
		r:    &Report{Capacity: capacity(3000, 1000, 1000, 2700)},
		want: []want{{prefix: filter, notMeasured: true, miss: "no figure for relayd-filtered on pods"}},
	}, {
		name: "filtered relayd measured 0",
		r:    &Report{Capacity: filtered(capacity(3000, 1000, 1000, 2700), 0)},
		want: []want{{prefix: filter, miss: "a side measured 0 (relayd-filtered: 0, relayd: 3000): failed"}},
	}, {
		name: "a VmHWM of 0: the peak is not measured (not 0×)",
		r: &Report{Memory: memory(twoSizes[0],
			MemoryPoint{Objects: 20, RSS: 200 << 20, PeakRSS: 0})},
		want: []want{{prefix: peak, notMeasured: true, miss: "20 objects: no VmHWM or steady RSS"}},
	}, {
		name: "a steady RSS of 0: the peak is not measured",
		r:    &Report{Memory: memory(MemoryPoint{Objects: 10, RSS: 0, PeakRSS: 120 << 20}, twoSizes[1])},
		want: []want{{prefix: peak, notMeasured: true, miss: "10 objects: no VmHWM or steady RSS"}},
	}, {
		name: "negative memory slopes: not measured",
		r:    &Report{Memory: &MemoryResult{Points: twoSizes, RSSPerObject: -40, LiveHeapPerObject: -3, HeapPerObject: 10}},
		want: []want{
			{prefix: rssSlope, notMeasured: true, miss: "a slope of 0 or below", measuredHas: "-40 B"},
			{prefix: liveHeap, notMeasured: true, miss: "a slope of 0 or below"},
			{prefix: peak, met: true},
		},
	}, {
		name: "memory slopes of 0: not measured",
		r:    &Report{Memory: &MemoryResult{Points: twoSizes}},
		want: []want{{prefix: rssSlope, notMeasured: true}, {prefix: liveHeap, notMeasured: true}},
	}, {
		name: "no 410 in relayd's log: recovery not measured (not -1 s)",
		r:    &Report{Recovery: recovery(-1)},
		want: []want{{prefix: recov, notMeasured: true, miss: "no 410 in relayd's log"}},
	}, {
		name: "a recovery of 0 s: not measured",
		r:    &Report{Recovery: recovery(0)},
		want: []want{{prefix: recov, notMeasured: true, miss: "a recovery of 0 s"}},
	}, {
		name: "recovery without runs: not measured",
		r:    &Report{Recovery: &RecoveryResult{Objects: 1000, From410: 2}},
		want: []want{{prefix: recov, notMeasured: true, miss: "no runs"}},
	}, {
		name: "recovery measured",
		r:    &Report{Recovery: recovery(3.5)},
		want: []want{{prefix: recov, met: true, measuredHas: "3.50 s"}},
	}, {
		name: "0 checkpoint writes under load: not measured",
		r:    &Report{Latency: func() *LatencyResult { l := latency(10, 10); l.CheckpointWrites = 0; return l }()},
		want: []want{{prefix: load, notMeasured: true, miss: "no checkpoint write counted under load", measuredHas: "0 in 30.0s"}, {prefix: idle, met: true}},
	}, {
		name: "a load window of 0 s: checkpoint writes not measured",
		r:    &Report{Latency: func() *LatencyResult { l := latency(10, 10); l.Duration = 0; return l }()},
		want: []want{{prefix: load, notMeasured: true, miss: "no checkpoint write counted under load"}},
	}, {
		name: "latencies of 0: not measured",
		r:    &Report{Latency: func() *LatencyResult { l := latency(10, 10); l.ReadToAck.P50, l.ReadToAck.P99 = 0, 0; return l }()},
		want: []want{{prefix: p50, notMeasured: true, miss: "a latency of 0"}, {prefix: p99, notMeasured: true, miss: "a latency of 0"}},
	}, {
		name: "failed scenarios: not measured",
		r: &Report{Options: Options{Scenarios: []string{ScenarioCapacity, ScenarioLatency, ScenarioMemory, ScenarioRecovery}, IdleFor: time.Minute},
			Errors: map[string]string{ScenarioCapacity: "bench: capacity: boom"}},
		want: []want{
			{prefix: absPods, notMeasured: true, miss: "the scenario failed: bench: capacity: boom"},
			{prefix: dynPods, notMeasured: true, miss: "the scenario failed: bench: capacity: boom"},
			{prefix: shaped, notMeasured: true, miss: "boom"},
			{prefix: p50, notMeasured: true, miss: "did not run"},
			{prefix: idle, notMeasured: true, miss: "did not run"},
			{prefix: peak, notMeasured: true, miss: "did not run"},
			{prefix: "recovery: 410 → sync.completed", notMeasured: true, miss: "did not run"},
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			goals := tc.r.Goals()
			for _, w := range tc.want {
				var g *Goal
				for i := range goals {
					if strings.HasPrefix(goals[i].What, w.prefix) {
						g = &goals[i]
						break
					}
				}
				if g == nil {
					t.Errorf("no goal %q in %+v", w.prefix, goals)
					continue
				}
				if g.Met != w.met || g.NotMeasured != w.notMeasured || !strings.Contains(g.Miss, w.miss) || !strings.Contains(g.Measured, w.measuredHas) {
					t.Errorf("%s: met %v, not measured %v, measured %q, miss %q; want met %v, not measured %v, measured containing %q, miss containing %q",
						g.What, g.Met, g.NotMeasured, g.Measured, g.Miss, w.met, w.notMeasured, w.measuredHas, w.miss)
				}
			}
			var md bytes.Buffer
			tc.r.Markdown(&md)
			for _, g := range goals {
				if !g.Met && !strings.Contains(md.String(), "**no**: "+g.Miss) {
					t.Errorf("report does not say why %q is not met:\n%s", g.What, md.String())
				}
			}
		})
	}
	l := latency(3000, 3000)
	l.CheckpointWrites = 7
	if g := checkpointsUnderLoad(l); g.Met || !strings.Contains(g.Miss, "over") {
		t.Errorf("7 checkpoint writes in 29.998s: met %v, miss %q; want missed", g.Met, g.Miss)
	}
}

func TestPercentilesAndHistogramQuantile(t *testing.T) {
	var xs []float64
	for i := 1; i <= 1000; i++ {
		xs = append(xs, float64(i))
	}
	p := percentiles(xs)
	if p.P50 != 500 || p.P99 != 990 || p.P999 != 999 || p.Max != 1000 {
		t.Errorf("percentiles %+v", p)
	}
	after := Samples{
		{Name: "lag_bucket", Labels: map[string]string{"le": "0.001"}, Value: 50},
		{Name: "lag_bucket", Labels: map[string]string{"le": "0.01"}, Value: 100},
		{Name: "lag_bucket", Labels: map[string]string{"le": "+Inf"}, Value: 100},
	}
	if q := HistogramQuantile(0.5, "lag", nil, nil, after); q != 0.001 {
		t.Errorf("p50 %v, want 0.001", q)
	}
	if q := HistogramQuantile(0.75, "lag", nil, nil, after); q < 0.0055-1e-9 || q > 0.0055+1e-9 {
		t.Errorf("p75 %v, want 0.0055 (interpolated)", q)
	}
	if s, ok := parseSample(`relayd_publish_lag_seconds_bucket{source="a\"b",le="0.005"} 42`); !ok || s.Labels["source"] != `a"b` || s.Value != 42 {
		t.Errorf("parseSample: %+v %v", s, ok)
	}
}

// A watch that asks for PartialObjectMetadata gets Replay.Metadata when it
// is set, Replay.Watch (whole objects) otherwise; SentBytes counts what was
// written.
func TestReplayServerServesPartialObjectMetadataOnRequest(t *testing.T) {
	full := podFrames(t, 3)
	var meta [][]byte
	for i := range 3 {
		meta = append(meta, fmt.Appendf(nil, `{"type":"MODIFIED","object":{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"name":"p","namespace":"ns","uid":"u","resourceVersion":"%d"}}}`, 1000+i))
	}
	for _, tc := range []struct {
		name     string
		metadata [][]byte
		want     [][]byte
	}{{"recorded as PartialObjectMetadata", meta, meta}, {"whole objects only", nil, full}} {
		t.Run(tc.name, func(t *testing.T) {
			srv := NewServer(&Replay{Version: "v1", Resource: "pods", Kind: "Pod", Namespaced: true, ListRV: "999", Watch: full, Metadata: tc.metadata})
			defer srv.Close()
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL()+"/api/v1/pods?watch=true&resourceVersion=999", nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Accept", source.AcceptPartialObjectMetadata)
			resp, err := srv.srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			sc.Buffer(nil, 1<<20)
			var n int64
			for i, want := range tc.want {
				if !sc.Scan() {
					t.Fatalf("frame %d: %v", i, sc.Err())
				}
				if !bytes.Equal(sc.Bytes(), want) {
					t.Fatalf("frame %d: %.200s, want %.200s", i, sc.Bytes(), want)
				}
				n += int64(len(want) + 1)
			}
			if srv.MetadataWatches.Load() != 1 || srv.SentBytes.Load() != n {
				t.Errorf("MetadataWatches %d, SentBytes %d; want 1, %d", srv.MetadataWatches.Load(), srv.SentBytes.Load(), n)
			}
		})
	}
}

// The report compares the metadata-only fetch with whole objects.
func TestReportMetadataFetch(t *testing.T) {
	r := &Report{Capacity: &CapacityResult{Summaries: []CapacitySummary{
		{Stream: "pods", Consumer: ModeRelayd, PerCPUSecond: 1000, CPUPerEvent: time.Millisecond},
		{Stream: "pods", Consumer: ConsumerRelaydMetadata, PerCPUSecond: 4000, CPUPerEvent: 250 * time.Microsecond, BytesPerEvent: 1000},
		{Stream: "pods", Consumer: ConsumerRelaydMetadataWhole, PerCPUSecond: 1000, CPUPerEvent: time.Millisecond, BytesPerEvent: 9000},
	}}}
	if cpu, b := r.Capacity.MetadataFetch(); cpu != 4 || b != 9 {
		t.Errorf("MetadataFetch = %v, %v; want 4, 9", cpu, b)
	}
	var md bytes.Buffer
	r.Markdown(&md)
	if !strings.Contains(md.String(), "| **whole objects ÷ PartialObjectMetadata** | **9.0×** | **4.00×** | |") {
		t.Errorf("no metadata-only fetch table:\n%s", md.String())
	}
}

// Every capacity run's run-queue wait is in the report, and a run that
// waited a tenth of its CPU time or more for a CPU is marked loaded.
func TestReportRunQueueWait(t *testing.T) {
	r := &Report{Capacity: &CapacityResult{
		Runs: []CapacityRun{
			{Stream: "pods", Consumer: ModeRelayd, Rep: 1, CPU: 2, RunQueueWait: 0.05},
			{Stream: "pods", Consumer: ModeRelayd, Rep: 2, CPU: 2, RunQueueWait: 0.8},
		},
		Summaries: []CapacitySummary{{Stream: "pods", Consumer: ModeRelayd, PerCPUSecond: 1000}},
	}}
	var md bytes.Buffer
	r.Markdown(&md)
	for _, want := range []string{
		"1 of 2 runs waited a tenth of their CPU time or more (**loaded**)",
		"| pods | relayd | 1 | 2.00 s | 0.050 s | 2% |",
		"| pods | relayd | 2 | 2.00 s | 0.800 s | 40% **loaded** |",
	} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("the report lacks %q:\n%s", want, md.String())
		}
	}
}
