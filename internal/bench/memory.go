package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/relayd/relayd/pkg/event"
)

// MemoryPoint is relayd relaying n objects (replayed ConfigMaps).
type MemoryPoint struct {
	Objects int
	Tracked float64 // relayd_tracked_objects: what relayd says it tracks
	// Steady state after the list (and the churn that follows it).
	RSS, HeapInuse, HeapAlloc int64
	// LiveHeap estimates the heap live after the last GC: the GC's heap
	// goal (go_memstats_next_gc_bytes) ÷ (1 + GOGC/100). Heap in use also
	// counts garbage not yet collected, which depends on when the GC ran.
	LiveHeap int64
	// During a forced relist (410 from the replay server). PeakRSS is the
	// kernel's high-water mark, VmHWM, reset at the start of the relist
	// (Child.ResetPeakRSS; the reset's own readings in PeakReset); 0, with
	// PeakError, if it could not be reset or read. PeakHeapInuse is sampled
	// (every 100 ms) and only shown.
	PeakRSS       int64
	PeakReset     PeakReset
	PeakError     string `json:",omitempty"`
	PeakHeapInuse int64
	RelistSeconds float64
	RelistEvents  int64 // acks on the event stream during the relist
}

// MemoryResult is the memory scenario.
type MemoryResult struct {
	Points []MemoryPoint
	// Slopes, bytes per object (least squares over the points).
	RSSPerObject, HeapPerObject, LiveHeapPerObject float64
	Churn                                          int
}

// markers collects relayd's sync markers from NATS as they are stored.
type markers struct {
	mu   sync.Mutex
	sub  *nats.Subscription
	seen []marker
}

type marker struct {
	Source    string // the subject's source token
	Completed bool
	Epoch     uint64
	Time      time.Time // the event's time (relayd's clock)
	Recv      time.Time
	Total     int64
}

func (h *harness) watchMarkers(cluster string) (*markers, error) {
	m := &markers{}
	sub, err := h.nc.Subscribe("k8s."+cluster+"._relayd.>", func(msg *nats.Msg) {
		recv := time.Now()
		ev, err := event.DecodeMessage(msg.Header, msg.Data)
		if err != nil || strings.HasSuffix(msg.Subject, "."+event.HeartbeatToken) {
			return
		}
		var d struct {
			Counts struct {
				Total int64 `json:"total"`
			} `json:"counts"`
		}
		_ = json.Unmarshal(ev.Data, &d)
		var src string
		if _, rest, ok := strings.Cut(msg.Subject, "._relayd."); ok {
			src, _, _ = strings.Cut(rest, ".")
		}
		m.mu.Lock()
		m.seen = append(m.seen, marker{Source: src, Completed: strings.HasSuffix(ev.Type, ".completed"), Epoch: ev.RelaydEpoch, Time: ev.Time, Recv: recv, Total: d.Counts.Total})
		m.mu.Unlock()
	})
	if err != nil {
		return nil, err
	}
	_ = sub.SetPendingLimits(-1, -1)
	m.sub = sub
	return m, h.nc.Flush()
}

// wait returns the marker (started or completed) of epoch, once seen.
func (m *markers) wait(ctx context.Context, completed bool, epoch uint64, timeout time.Duration, alive func() error) (marker, error) {
	deadline := time.Now().Add(timeout)
	for {
		m.mu.Lock()
		for _, s := range m.seen {
			if s.Completed == completed && s.Epoch == epoch {
				m.mu.Unlock()
				return s, nil
			}
		}
		m.mu.Unlock()
		if alive != nil {
			if err := alive(); err != nil {
				return marker{}, err
			}
		}
		if time.Now().After(deadline) {
			return marker{}, fmt.Errorf("no sync marker (completed=%v, epoch %d) within %v", completed, epoch, timeout)
		}
		select {
		case <-ctx.Done():
			return marker{}, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (m *markers) close() { _ = m.sub.Unsubscribe() }

// configMapFrames makes frames of n distinct objects from the recorded
// ConfigMap: name, uid and resourceVersion replaced.
type cmTemplate struct {
	raw           []byte
	name, uid, rv []byte
}

func newCMTemplate(raw []byte) (*cmTemplate, error) {
	o, err := event.ParseObject(raw)
	if err != nil {
		return nil, err
	}
	return &cmTemplate{raw: raw, name: []byte(strconv.Quote(o.Meta.Name)), uid: []byte(strconv.Quote(o.Meta.UID)),
		rv: []byte(`"resourceVersion":` + strconv.Quote(o.Meta.ResourceVersion))}, nil
}

// frame is object i at rv. Its uid is an RFC 4122 UUID, as the apiserver
// makes them: relayd's index keeps a UUID in 16 bytes, and any other uid
// as the string (which would keep the whole parsed metadata alive).
func (t *cmTemplate) frame(typ string, i int, rv int64) []byte {
	b := bytes.Replace(t.raw, t.name, fmt.Appendf(nil, `"cm-%07d"`, i), 1)
	b = bytes.Replace(b, t.uid, fmt.Appendf(nil, `"be0c0000-0000-4000-8000-%012d"`, i), 1)
	b = bytes.Replace(b, t.rv, fmt.Appendf(nil, `"resourceVersion":"%d"`, rv), 1)
	return fmt.Appendf(nil, `{"type":%q,"object":%s}`, typ, b)
}

func (h *harness) memory(ctx context.Context, rec *Recording) (*MemoryResult, error) {
	tpl, err := newCMTemplate(rec.ConfigMap)
	if err != nil {
		return nil, err
	}
	res := &MemoryResult{Churn: h.o.MemChurn}
	for _, n := range h.o.MemSizes {
		p, err := h.memoryPoint(ctx, tpl, n)
		if err != nil {
			return nil, fmt.Errorf("%d objects: %w", n, err)
		}
		h.logf("bench: memory %d objects: RSS %.1f MiB, heap in use %.1f MiB, live heap %.1f MiB, tracked %.0f; relist peak RSS %.1f MiB (%.2f×), %.1fs",
			n, mib(p.RSS), mib(p.HeapInuse), mib(p.LiveHeap), p.Tracked, mib(p.PeakRSS), float64(p.PeakRSS)/float64(p.RSS), p.RelistSeconds)
		res.Points = append(res.Points, *p)
	}
	var xs, rss, heap, live []float64
	for _, p := range res.Points {
		xs = append(xs, float64(p.Objects))
		rss = append(rss, float64(p.RSS))
		heap = append(heap, float64(p.HeapInuse))
		live = append(live, float64(p.LiveHeap))
	}
	res.RSSPerObject = slope(xs, rss)
	res.HeapPerObject = slope(xs, heap)
	res.LiveHeapPerObject = slope(xs, live)
	return res, nil
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// slope is the least-squares slope of ys over xs.
func slope(xs, ys []float64) float64 {
	if len(xs) < 2 {
		return 0
	}
	var mx, my float64
	for i := range xs {
		mx += xs[i]
		my += ys[i]
	}
	mx /= float64(len(xs))
	my /= float64(len(xs))
	var num, den float64
	for i := range xs {
		num += (xs[i] - mx) * (ys[i] - my)
		den += (xs[i] - mx) * (xs[i] - mx)
	}
	if den == 0 {
		return 0
	}
	return num / den
}

func (h *harness) memoryPoint(ctx context.Context, tpl *cmTemplate, n int) (*MemoryPoint, error) {
	const base = 1_000_000
	initial := make([][]byte, n)
	for i := range n {
		initial[i] = tpl.frame("ADDED", i, int64(base+i))
	}
	churn := make([][]byte, h.o.MemChurn)
	for k := range churn {
		churn[k] = tpl.frame("MODIFIED", k%max(n, 1), int64(base+n+1+k))
	}
	srv := NewServer(&Replay{Version: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespaced: true,
		ListRV: strconv.Itoa(base + n), Initial: initial, InitialRV: strconv.Itoa(base + n), After: churn})
	defer srv.Close()
	id := h.next()
	kc := filepath.Join(h.o.WorkDir, "replay-"+id+".kubeconfig")
	if err := srv.WriteKubeconfig(kc); err != nil {
		return nil, err
	}
	stream, cluster := "MEM"+id, "mem"+id
	if err := h.createStream(ctx, stream, cluster); err != nil {
		return nil, err
	}
	defer h.deleteStream(stream)
	mk, err := h.watchMarkers(cluster)
	if err != nil {
		return nil, err
	}
	defer mk.close()
	// No ignoreChanges here: the replayed MODIFIED events would be
	// suppressed and never reach the stream this scenario counts. Every
	// index entry has its fingerprint field whether it is used or not, so
	// the bytes per object below include it.
	src := `  - name: cms
    apiVersion: v1
    kind: ConfigMap
    initial: snapshot
`
	extra := "watch:\n  relistBackoff: {initial: 100ms, max: 1s}\n"
	var heapProf string
	if h.o.Profile {
		heapProf = filepath.Join(h.o.WorkDir, "profiles", fmt.Sprintf("memory-%d.heap.pprof", n))
	}
	r, err := h.startRelayd(ctx, fmt.Sprintf("memory-%d-%s", n, id), h.relaydConfig(cluster, stream, extra, src), kc, heapProf)
	if err != nil {
		return nil, err
	}
	defer r.Stop(30 * time.Second)
	if err := h.snoop.WaitCount(ctx, stream, int64(n+2+h.o.MemChurn), 10*time.Minute, r.alive); err != nil {
		return nil, err
	}
	h.snoop.Quiet(ctx, time.Second)
	p := &MemoryPoint{Objects: n}
	// Steady state: the median of a few samples.
	var rs, hi, ha, lh []float64
	for range 5 {
		rss, _, err := r.Mem()
		if err != nil {
			return nil, err
		}
		m, err := Scrape(ctx, r.metrics)
		if err != nil {
			return nil, err
		}
		rs = append(rs, float64(rss))
		hi = append(hi, m.Sum("go_memstats_heap_inuse_bytes", nil))
		ha = append(ha, m.Sum("go_memstats_heap_alloc_bytes", nil))
		gogc := 100.0
		if m.Has("go_gc_gogc_percent") {
			gogc = m.Sum("go_gc_gogc_percent", nil)
		}
		lh = append(lh, m.Sum("go_memstats_next_gc_bytes", nil)/(1+gogc/100))
		p.Tracked = m.Sum("relayd_tracked_objects", nil)
		time.Sleep(300 * time.Millisecond)
	}
	p.RSS, p.HeapInuse, p.HeapAlloc, p.LiveHeap = int64(median(rs)), int64(median(hi)), int64(median(ha)), int64(median(lh))
	if heapProf != "" {
		if err := r.heapProfile(ctx); err != nil {
			return nil, err
		}
		h.logf("bench: heap profile %s", heapProf)
	}

	// A forced relist: the replay server ends the watch with 410 Expired.
	// The RSS peak is the kernel's: VmHWM, reset to the RSS of now.
	before := h.snoop.Count(stream)
	reset, resetErr := r.ResetPeakRSS()
	p.PeakReset = reset
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			if m, err := Scrape(ctx, r.metrics); err == nil {
				if v := int64(m.Sum("go_memstats_heap_inuse_bytes", nil)); v > p.PeakHeapInuse {
					p.PeakHeapInuse = v
				}
			}
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	})
	t0 := time.Now()
	srv.Expire()
	done, err := mk.wait(ctx, true, 2, 10*time.Minute, r.alive)
	if err == nil {
		h.snoop.Quiet(ctx, 500*time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if err != nil {
		return nil, err
	}
	if resetErr == nil {
		_, hwm, err := r.Mem()
		if err != nil {
			resetErr = err
		} else {
			p.PeakRSS = hwm
		}
	}
	if resetErr != nil {
		p.PeakError = resetErr.Error()
		h.logf("bench: memory %d objects: relist peak RSS not measured: %v", n, resetErr)
	}
	p.RelistSeconds = done.Recv.Sub(t0).Seconds()
	p.RelistEvents = h.snoop.Count(stream) - before
	return p, nil
}
