package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/pkg/event"
)

// The steps of the scale run (docs/PERFORMANCE.md, "Scale").
const (
	// StepTracked: relayd tracking replayed pods and ConfigMaps at each
	// size; at the largest, a restart from the index bucket, a 410 of the
	// pods alone and a 410 of everything.
	StepTracked = "tracked"
	// StepNamespaces: a source listing namespaces, on the real apiserver.
	StepNamespaces = "namespaces"
	// StepSources: many sources in one relayd, on the real apiserver.
	StepSources = "sources"
)

// The sizes the scale goals are stated at; a smaller (-quick) run reports
// the figures of those goals but not whether they are met.
const (
	goalObjects = 1_000_000
	goalPods    = 150_000
)

// ScaleOptions sizes the scale run.
type ScaleOptions struct {
	Steps []string
	// Objects are the tracked sizes (ascending); PodShare of each are
	// replayed 9 KB pods, the rest small ConfigMaps, spread over
	// Namespaces namespaces.
	Objects    []int
	PodShare   float64
	Namespaces int
	// WatchNamespaces are the sizes of the per-namespace step: a source
	// listing that many namespaces (one watch each).
	WatchNamespaces []int
	// Sources is the size of the sources step.
	Sources int
	// FlushInterval is relayd's checkpoint.flushInterval in the
	// per-namespace and sources steps (0: relayd's default, 5s).
	FlushInterval time.Duration
	// Rate sizes the sustained-rate step (scale_rate.go).
	Rate  RateOptions
	Quick bool
	// ProfileWatches runs relayd in-process in the per-namespace step and
	// writes its heap and goroutine profiles at each size's steady point
	// (profiles/namespaces-N.heap.pprof, .goroutine.pprof).
	ProfileWatches bool `json:",omitempty"`
	// RestartProfile takes a CPU profile of the restart at the largest
	// tracked size (relayd in-process), into <work>/profiles.
	RestartProfile bool `json:",omitempty"`
}

func (o *ScaleOptions) flush() time.Duration {
	if o.FlushInterval > 0 {
		return o.FlushInterval
	}
	return flushInterval
}

// scaleConfig is relaydConfig with a checkpoint ConfigMap of the cluster's
// own (the steps on the real apiserver share it: a checkpoint left by an
// earlier size would name another index bucket and make relayd relist) and
// the checkpoint flush interval of so.
func (h *harness) scaleConfig(so ScaleOptions, cluster, stream, extra, sources string) string {
	ckpt := "  name: relayd-checkpoint-" + cluster + "\n"
	if so.FlushInterval > 0 {
		ckpt += fmt.Sprintf("  flushInterval: %s\n", so.FlushInterval)
	}
	return strings.Replace(h.relaydConfig(cluster, stream, extra, sources), "  name: relayd-checkpoint\n", ckpt, 1)
}

func (o *ScaleOptions) has(s string) bool {
	for _, x := range o.Steps {
		if x == s {
			return true
		}
	}
	return false
}

// TrackedPoint is relayd's initial sync of Objects replayed objects.
type TrackedPoint struct {
	Objects, Pods, ConfigMaps, Namespaces int
	Tracked                               float64 // relayd_tracked_objects
	// SyncSeconds is from process start to the last sync.completed.
	SyncSeconds, SyncPerSecond float64
	RSS, HeapInuse, LiveHeap   int64
	SyncHWM                    int64 // VmHWM of the process after the sync
	Goroutines                 float64
}

// RestartResult is a clean restart with the index bucket filled.
type RestartResult struct {
	Entries float64 // relayd_tracked_objects after the restart
	// Seconds from process start: /readyz 200, and the first change made
	// after the stop received from NATS.
	Ready, FirstChange float64
	RSS, HWM           int64 // steady, and VmHWM of the whole restart
	Relists            float64
	ConsumersCreated   int64
	StreamingLists     int64 // replay server: lists served to the restart
}

// ExpireResult is a forced 410 and the relist that follows.
type ExpireResult struct {
	Objects   int
	Seconds   float64 // 410 → last sync.completed received
	RSS       int64   // steady, just before
	PeakRSS   int64   // VmHWM reset at the 410, read at sync.completed
	PeakReset PeakReset
	PeakError string `json:",omitempty"`
}

// NamespacePoint is a source listing Namespaces namespaces.
type NamespacePoint struct {
	Namespaces int
	// From process start: /readyz 200, and a change in the last namespace
	// received from NATS (changes are written every 250 ms).
	Ready, FirstChange                 float64
	CheckpointErrors, CheckpointWrites float64 // first start, after 2 flushes
	RSS                                int64
	Goroutines                         float64
	HeapInuse, StackInuse              int64 // go_memstats_{heap,stack}_inuse_bytes at the RSS sample
	Restart                            RestartResult
	RestartCheckpointErrors            float64
}

// SourcesResult is many sources in one relayd.
type SourcesResult struct {
	Sources     int
	Ready       float64
	RSS         int64
	Goroutines  float64
	Connections int // TCP connections to the apiserver
}

// ScaleReport is everything a scale run measured.
type ScaleReport struct {
	Machine           Machine
	Started, Finished time.Time
	Options           ScaleOptions
	Relayd            string
	Tracked           []TrackedPoint
	RSSPerObject      float64
	Restart           *RestartResult `json:",omitempty"`
	PodRelist         *ExpireResult  `json:",omitempty"`
	Expire            *ExpireResult  `json:",omitempty"`
	Namespaces        []NamespacePoint
	MemoryPerWatch    float64
	Sources           *SourcesResult    `json:",omitempty"`
	Rate              []RateResult      `json:",omitempty"`
	Errors            map[string]string `json:",omitempty"`
}

func (r *ScaleReport) fail(step string, err error) error {
	if r.Errors == nil {
		r.Errors = map[string]string{}
	}
	r.Errors[step] = err.Error()
	return err
}

// RunScale runs the scale steps (o gives the programs, directories and
// the recording the pod template is taken from).
func RunScale(ctx context.Context, o Options, so ScaleOptions) (*ScaleReport, error) {
	logf := o.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	for _, d := range []string{o.CacheDir, o.WorkDir, filepath.Join(o.WorkDir, "logs")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	h := &harness{o: o, logf: logf}
	defer h.close()
	rep := &ScaleReport{Machine: machineInfo(), Started: time.Now().UTC(), Options: so, Relayd: relaydVersion(o)}
	defer func() { rep.Finished = time.Now().UTC() }()
	if err := h.startNATS(ctx); err != nil {
		return nil, err
	}
	// The steps do not depend on each other: one that fails is reported
	// (its goals not measured) and the next one runs.
	var errs []error
	for _, st := range []struct {
		name string
		run  func(context.Context, ScaleOptions, *ScaleReport) error
	}{{StepTracked, h.scaleTracked}, {StepNamespaces, h.scaleNamespaces}, {StepSources, h.scaleSources}, {StepRate, h.scaleRate}} {
		if !so.has(st.name) || ctx.Err() != nil {
			continue
		}
		if err := st.run(ctx, so, rep); err != nil {
			errs = append(errs, rep.fail(st.name, fmt.Errorf("bench: %s: %w", st.name, err)))
		}
	}
	if ctx.Err() != nil {
		errs = append(errs, ctx.Err())
	}
	return rep, errors.Join(errs...)
}

// relaydVersion names what is measured: `relayd version` of the binary
// (its commit), or the in-process relayd.
func relaydVersion(o Options) string {
	if o.RelaydBin == "" {
		return "relay.Run in-process (" + filepath.Base(o.Self) + " consume -mode relayd)"
	}
	out, err := exec.Command(o.RelaydBin, "version").CombinedOutput()
	if err != nil {
		return o.RelaydBin
	}
	return o.RelaydBin + ", " + strings.Join(strings.Fields(string(out)), " ")
}

// objTemplate makes frames of distinct objects from one recorded object:
// name, namespace, uid and resourceVersion replaced (the first occurrence
// of each: metadata's).
type objTemplate struct {
	raw               []byte
	name, ns, uid, rv []byte
	prefix, uidPrefix string
}

func newObjTemplate(raw []byte, prefix, uidPrefix string) (*objTemplate, error) {
	o, err := event.ParseObject(raw)
	if err != nil {
		return nil, err
	}
	return &objTemplate{raw: raw, prefix: prefix, uidPrefix: uidPrefix,
		name: []byte(`"name":` + strconv.Quote(o.Meta.Name)), ns: []byte(`"namespace":` + strconv.Quote(o.Meta.Namespace)),
		uid: []byte(strconv.Quote(o.Meta.UID)), rv: []byte(`"resourceVersion":` + strconv.Quote(o.Meta.ResourceVersion))}, nil
}

func (t *objTemplate) frame(typ string, i int, rv int64, ns string) []byte {
	b := bytes.Replace(t.raw, t.name, fmt.Appendf(nil, `"name":"%s-%07d"`, t.prefix, i), 1)
	b = bytes.Replace(b, t.ns, fmt.Appendf(nil, `"namespace":%q`, ns), 1)
	b = bytes.Replace(b, t.uid, fmt.Appendf(nil, `"%s-0000-4000-8000-%012d"`, t.uidPrefix, i), 1)
	b = bytes.Replace(b, t.rv, fmt.Appendf(nil, `"resourceVersion":"%d"`, rv), 1)
	return fmt.Appendf(nil, `{"type":%q,"object":%s}`, typ, b)
}

// podTemplate is the largest recorded pod (a running one, ~9 KB).
func podTemplate(rec *Recording) (*objTemplate, error) {
	s := rec.Stream("pods")
	if s == nil || len(s.Frames()) == 0 {
		return nil, fmt.Errorf("no recorded pods")
	}
	var best []byte
	for _, f := range s.Frames() {
		if len(f) > len(best) && bytes.HasPrefix(f, []byte(`{"type":"MODIFIED"`)) {
			best = f
		}
	}
	_, o, err := event.ParseWatchEvent(best)
	if err != nil {
		return nil, err
	}
	return newObjTemplate(o.Raw, "pod", "be0d0000")
}

// steady is relayd at rest: the median of 5 samples of RSS and metrics.
type steady struct {
	RSS, HeapInuse, LiveHeap int64
	Tracked, Goroutines      float64
	m                        Samples // the last scrape
}

func (r *relayd) steady(ctx context.Context) (steady, error) {
	var s steady
	var rs, hi, lh []float64
	for range 5 {
		rss, _, err := r.Mem()
		if err != nil {
			return s, err
		}
		m, err := Scrape(ctx, r.metrics)
		if err != nil {
			return s, err
		}
		rs = append(rs, float64(rss))
		hi = append(hi, m.Sum("go_memstats_heap_inuse_bytes", nil))
		gogc := 100.0
		if m.Has("go_gc_gogc_percent") {
			gogc = m.Sum("go_gc_gogc_percent", nil)
		}
		lh = append(lh, m.Sum("go_memstats_next_gc_bytes", nil)/(1+gogc/100))
		s.Tracked, s.Goroutines, s.m = m.Sum("relayd_tracked_objects", nil), m.Sum("go_goroutines", nil), m
		time.Sleep(300 * time.Millisecond)
	}
	s.RSS, s.HeapInuse, s.LiveHeap = int64(median(rs)), int64(median(hi)), int64(median(lh))
	return s, nil
}

// firstMessage records when the first message on subject arrives.
type firstMessage struct {
	sub  *nats.Subscription
	at   atomic.Int64 // UnixNano
	done chan struct{}
	once sync.Once
}

func (h *harness) firstMessage(subject string) (*firstMessage, error) {
	f := &firstMessage{done: make(chan struct{})}
	sub, err := h.nc.Subscribe(subject, func(*nats.Msg) {
		f.once.Do(func() {
			f.at.Store(time.Now().UnixNano())
			close(f.done)
		})
	})
	if err != nil {
		return nil, err
	}
	f.sub = sub
	return f, h.nc.Flush()
}

// wait returns the seconds from t0 to the first message.
func (f *firstMessage) wait(ctx context.Context, t0 time.Time, timeout time.Duration, alive func() error) (float64, error) {
	deadline := time.After(timeout)
	for {
		select {
		case <-f.done:
			return time.Unix(0, f.at.Load()).Sub(t0).Seconds(), nil
		case <-deadline:
			return 0, fmt.Errorf("no message on %s within %v", f.sub.Subject, timeout)
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(50 * time.Millisecond):
			if err := alive(); err != nil {
				return 0, err
			}
		}
	}
}

func (f *firstMessage) close() { _ = f.sub.Unsubscribe() }

// consumerCreates counts JetStream consumer-create requests on the wire
// (relayd's index catch-up makes one per consumer).
type consumerCreates struct {
	subs []*nats.Subscription
	n    atomic.Int64
}

func (h *harness) countConsumerCreates() (*consumerCreates, error) {
	c := &consumerCreates{}
	for _, subj := range []string{"$JS.API.CONSUMER.CREATE.>", "$JS.API.CONSUMER.DURABLE.CREATE.>"} {
		sub, err := h.nc.Subscribe(subj, func(*nats.Msg) { c.n.Add(1) })
		if err != nil {
			c.close()
			return nil, err
		}
		c.subs = append(c.subs, sub)
	}
	return c, h.nc.Flush()
}

func (c *consumerCreates) count() int64 { return c.n.Load() }

func (c *consumerCreates) close() {
	for _, s := range c.subs {
		_ = s.Unsubscribe()
	}
}

// waitSources waits for a sync.completed of every source received after
// since, and returns the last one's time.
func (m *markers) waitSources(ctx context.Context, sources []string, since time.Time, timeout time.Duration, alive func() error) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	for {
		var last time.Time
		found := 0
		m.mu.Lock()
		for _, src := range sources {
			for _, s := range m.seen {
				if s.Completed && s.Source == src && !s.Recv.Before(since) {
					found++
					if s.Recv.After(last) {
						last = s.Recv
					}
					break
				}
			}
		}
		m.mu.Unlock()
		if found == len(sources) {
			return last, nil
		}
		if err := alive(); err != nil {
			return time.Time{}, err
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("sync.completed of %d of sources %v within %v", found, sources, timeout)
		}
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// dropIndex deletes a cluster's stream and its index bucket.
func (h *harness) dropIndex(stream, cluster string) {
	h.deleteStream(stream)
	h.deleteStream("KV_relayd-index-" + cluster)
}

// scaleWatchConfig keeps replayed watches (which get no bookmarks) open
// for the whole run.
const scaleWatchConfig = "watch:\n  timeout: 1h\n  idleTimeout: 2h\n  relistBackoff: {initial: 100ms, max: 1s}\n"

// scaleRecording is the recording the scale steps take their templates
// from, recorded once from the test kube-apiserver.
func (h *harness) scaleRecording(ctx context.Context) (*Recording, error) {
	rec, err := LoadOrRecord(ctx, RecordingDir(h.o.CacheDir, h.o.Record), h.o.Record, func() (*testenv.Env, error) {
		h.logf("bench: recording %d pod events (the pod template) from kube-apiserver %s", h.o.Record.PodEvents, testenv.K8sVersion)
		return h.apiserver(ctx)
	})
	if err != nil {
		return nil, fmt.Errorf("recording: %w", err)
	}
	return rec, nil
}

func (h *harness) scaleTracked(ctx context.Context, so ScaleOptions, rep *ScaleReport) error {
	rec, err := h.scaleRecording(ctx)
	if err != nil {
		return err
	}
	podT, err := podTemplate(rec)
	if err != nil {
		return err
	}
	cmT, err := newObjTemplate(rec.ConfigMap, "cm", "be0c0000")
	if err != nil {
		return err
	}
	for i, n := range so.Objects {
		if err := h.trackedPoint(ctx, so, rep, podT, cmT, n, i == len(so.Objects)-1); err != nil {
			return fmt.Errorf("%d objects: %w", n, err)
		}
	}
	var xs, ys []float64
	for _, p := range rep.Tracked {
		xs, ys = append(xs, float64(p.Objects)), append(ys, float64(p.RSS))
	}
	rep.RSSPerObject = slope(xs, ys)
	return nil
}

// trackedPoint syncs n objects; at the last size it goes on with the
// restart and the 410s.
func (h *harness) trackedPoint(ctx context.Context, so ScaleOptions, rep *ScaleReport, podT, cmT *objTemplate, n int, last bool) error {
	const base = 1_000_000
	pods := int(float64(n) * so.PodShare)
	cms := n - pods
	nsOf := func(i int) string { return fmt.Sprintf("ns-%05d", i%max(so.Namespaces, 1)) }
	rv := strconv.Itoa(base + n)
	podRp := &Replay{Version: "v1", Resource: "pods", Kind: "Pod", Namespaced: true, ListRV: rv, InitialRV: rv,
		InitialCount: pods, InitialFrame: func(i int) []byte { return podT.frame("ADDED", i, int64(base+i), nsOf(i)) }}
	// The change relayed after the restart: served to the first watch that
	// is not a streaming list, which only the restart makes.
	cmRp := &Replay{Version: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespaced: true, ListRV: rv, InitialRV: rv,
		InitialCount: cms, InitialFrame: func(i int) []byte { return cmT.frame("ADDED", i, int64(base+pods+i), nsOf(i)) },
		Watch: [][]byte{cmT.frame("MODIFIED", 0, int64(base+n+1), nsOf(0))}}
	srv := NewServer(podRp, cmRp)
	defer srv.Close()
	id := h.next()
	kc := filepath.Join(h.o.WorkDir, "replay-"+id+".kubeconfig")
	if err := srv.WriteKubeconfig(kc); err != nil {
		return err
	}
	stream, cluster := "SCALE"+id, "scale"+id
	if err := h.createStream(ctx, stream, cluster); err != nil {
		return err
	}
	defer h.dropIndex(stream, cluster)
	mk, err := h.watchMarkers(cluster)
	if err != nil {
		return err
	}
	defer mk.close()
	sources := []string{"pods", "configmaps"}
	src := "  - {name: pods, apiVersion: v1, kind: Pod, initial: snapshot}\n  - {name: configmaps, apiVersion: v1, kind: ConfigMap, initial: snapshot}\n"
	cfg := h.relaydConfig(cluster, stream, scaleWatchConfig, src)
	t0 := time.Now()
	r, err := h.startRelayd(ctx, fmt.Sprintf("tracked-%d-%s", n, id), cfg, kc, "")
	if err != nil {
		return err
	}
	defer func() { _ = r.Stop(2 * time.Minute) }()
	done, err := mk.waitSources(ctx, sources, t0, 30*time.Minute, r.alive)
	if err != nil {
		return err
	}
	// Every object and marker is published before the last sync.completed
	// is: what is missing by then (a minute later) is missing.
	want := int64(n + 2*len(sources))
	if err := h.snoop.WaitCount(ctx, stream, want, time.Minute, r.alive); err != nil {
		return fmt.Errorf("%d of %d messages (objects and sync markers) acknowledged a minute after the last sync.completed: %w",
			h.snoop.Count(stream), want, err)
	}
	h.snoop.Quiet(ctx, time.Second)
	st, err := r.steady(ctx)
	if err != nil {
		return err
	}
	_, hwm, err := r.Mem()
	if err != nil {
		return err
	}
	p := TrackedPoint{Objects: n, Pods: pods, ConfigMaps: cms, Namespaces: min(so.Namespaces, n), Tracked: st.Tracked,
		SyncSeconds: done.Sub(t0).Seconds(), RSS: st.RSS, HeapInuse: st.HeapInuse, LiveHeap: st.LiveHeap, SyncHWM: hwm, Goroutines: st.Goroutines}
	p.SyncPerSecond = float64(n) / p.SyncSeconds
	h.logf("bench: tracked %d objects (%d pods): synced in %.1fs (%.0f/s), RSS %.1f MiB, tracked %.0f, VmHWM %.1f MiB",
		n, pods, p.SyncSeconds, p.SyncPerSecond, mib(p.RSS), p.Tracked, mib(hwm))
	rep.Tracked = append(rep.Tracked, p)
	if !last {
		return nil
	}

	// Restart with the index bucket filled.
	if err := r.Stop(2 * time.Minute); err != nil {
		return fmt.Errorf("relayd stop: %w", err)
	}
	change, err := h.firstMessage(fmt.Sprintf("k8s.%s.core.v1.configmaps.*.*.modified", cluster))
	if err != nil {
		return err
	}
	defer change.close()
	if so.RestartProfile {
		h.restartProfile = filepath.Join(h.o.WorkDir, "profiles", fmt.Sprintf("restart-%d.cpu.pprof", n))
		defer func() { h.restartProfile = "" }()
	}
	r2, res, err := h.restart(ctx, fmt.Sprintf("restart-%d-%s", n, id), cfg, kc, change, nil, 0, 10*time.Minute)
	if err != nil {
		return err
	}
	defer func() { _ = r2.Stop(2 * time.Minute) }()
	res.StreamingLists = srv.StreamingLists.Load() - 2
	rep.Restart = res
	h.logf("bench: restart with %.0f entries: ready %.2fs, first change %.2fs, VmHWM %.1f MiB ÷ steady %.1f MiB, %.0f relists, %d consumers created",
		res.Entries, res.Ready, res.FirstChange, mib(res.HWM), mib(res.RSS), res.Relists, res.ConsumersCreated)

	// A 410 of the pods alone, then of everything.
	if rep.PodRelist, err = h.expire(ctx, r2, mk, []string{"pods"}, pods, func() { srv.ExpireResource("pods") }); err != nil {
		return fmt.Errorf("410 of the pods: %w", err)
	}
	h.logf("bench: 410 of %d pods: relisted in %.2fs", pods, rep.PodRelist.Seconds)
	if rep.Expire, err = h.expire(ctx, r2, mk, sources, n, srv.Expire); err != nil {
		return fmt.Errorf("410 of everything: %w", err)
	}
	h.logf("bench: 410 of %d objects: relisted in %.2fs, peak %.1f MiB ÷ steady %.1f MiB", n, rep.Expire.Seconds, mib(rep.Expire.PeakRSS), mib(rep.Expire.RSS))
	return nil
}

// restart starts relayd (stopped cleanly before) and measures it until the
// first message of change and a quiet second; stopChanges (if set) is
// called once the change has arrived. Relists and consumers created are
// counted settle later.
func (h *harness) restart(ctx context.Context, name, cfg, kc string, change *firstMessage, stopChanges func(), settle, timeout time.Duration) (*relayd, *RestartResult, error) {
	cc, err := h.countConsumerCreates()
	if err != nil {
		return nil, nil, err
	}
	defer cc.close()
	prof := h.restartProfile
	if prof != "" {
		if err := os.MkdirAll(filepath.Dir(prof), 0o755); err != nil {
			return nil, nil, err
		}
	}
	t0 := time.Now()
	r, err := h.startRelayd(ctx, name, cfg, kc, prof)
	if err != nil {
		return nil, nil, err
	}
	res := &RestartResult{}
	fail := func(err error) (*relayd, *RestartResult, error) {
		_ = r.Stop(time.Minute)
		return nil, nil, err
	}
	if err := r.waitReady(ctx, timeout); err != nil {
		relists := "n/a"
		if m, serr := Scrape(ctx, r.metrics); serr == nil {
			relists = fmt.Sprintf("%.0f", m.Sum("relayd_relists_total", nil))
		}
		return fail(fmt.Errorf("restart: %w (so far: %d JetStream consumers created, %s relists)", err, cc.count(), relists))
	}
	res.Ready = time.Since(t0).Seconds()
	res.FirstChange, err = change.wait(ctx, t0, timeout, r.alive)
	if stopChanges != nil {
		stopChanges()
	}
	if err != nil {
		return fail(err)
	}
	h.snoop.Quiet(ctx, time.Second)
	st, err := r.steady(ctx)
	if err != nil {
		return fail(err)
	}
	if _, res.HWM, err = r.Mem(); err != nil {
		return fail(err)
	}
	res.RSS, res.Entries = st.RSS, st.Tracked
	if prof != "" {
		if err := r.cmd.Process.Signal(syscall.SIGUSR2); err != nil {
			return fail(err)
		}
		if _, err := r.WaitLine(ctx, "cpuprofile", time.Minute); err != nil {
			return fail(err)
		}
		h.logf("bench: CPU profile of the restart: %s", prof)
	}
	select {
	case <-ctx.Done():
		return fail(ctx.Err())
	case <-time.After(settle):
	}
	m, err := Scrape(ctx, r.metrics)
	if err != nil {
		return fail(err)
	}
	res.Relists = m.Sum("relayd_relists_total", nil)
	res.ConsumersCreated = cc.count()
	return r, res, nil
}

// expire ends the watches with a 410 (do) and measures the relist of the
// sources until each one's sync.completed.
func (h *harness) expire(ctx context.Context, r *relayd, mk *markers, sources []string, objects int, do func()) (*ExpireResult, error) {
	st, err := r.steady(ctx)
	if err != nil {
		return nil, err
	}
	res := &ExpireResult{Objects: objects, RSS: st.RSS}
	reset, resetErr := r.ResetPeakRSS()
	res.PeakReset = reset
	t0 := time.Now()
	do()
	done, err := mk.waitSources(ctx, sources, t0, 20*time.Minute, r.alive)
	if err != nil {
		return nil, err
	}
	res.Seconds = done.Sub(t0).Seconds()
	h.snoop.Quiet(ctx, 500*time.Millisecond)
	if resetErr == nil {
		_, res.PeakRSS, resetErr = r.Mem()
	}
	if resetErr != nil {
		res.PeakRSS, res.PeakError = 0, resetErr.Error()
	}
	return res, nil
}
