package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"
)

// CapacityRun is one consumer reading one recorded stream from the replay
// server at full speed.
type CapacityRun struct {
	Stream   string  `json:"stream"`
	Consumer string  `json:"consumer"`
	Rep      int     `json:"rep"`
	Events   int     `json:"events"`
	Bytes    int64   `json:"bytes"`
	CPU      float64 `json:"cpuSeconds"`  // user+sys of the consumer process, watch start → last event
	Wall     float64 `json:"wallSeconds"` // same window
	// PerCPUSecond is events per CPU-second of the consumer: the figure
	// the goals are about.
	PerCPUSecond float64 `json:"eventsPerCpuSecond"`
	PerSecond    float64 `json:"eventsPerSecond"`
	// RunQueueWait is how long the consumer's threads waited in the
	// kernel's run queue for a CPU in the same window
	// (/proc/<pid>/task/*/schedstat): other work on the machine took the
	// CPUs meanwhile. A loaded run shows here.
	RunQueueWait float64 `json:"runQueueWaitSeconds"`
}

// Loaded reports whether the run waited for a CPU for a tenth of its CPU
// time or more: another process had the CPUs for a good part of it.
func (r CapacityRun) Loaded() bool { return r.CPU > 0 && r.RunQueueWait >= r.CPU/10 }

// CapacitySummary is the median over the repetitions of one stream and
// consumer.
type CapacitySummary struct {
	Stream, Consumer string
	PerCPUSecond     float64 // median
	Min, Max         float64 // of PerCPUSecond
	PerSecond        float64 // median
	CPUPerEvent      time.Duration
	// BytesPerEvent is what the consumer read from its watch per event
	// (frames and newlines; median).
	BytesPerEvent float64
}

// CapacityResult is the pipeline-capacity scenario.
type CapacityResult struct {
	Runs      []CapacityRun
	Summaries []CapacitySummary
	Profiles  []string `json:",omitempty"`
}

// Summary returns the summary of stream and consumer, or nil.
func (c *CapacityResult) Summary(stream, consumer string) *CapacitySummary {
	for i := range c.Summaries {
		if c.Summaries[i].Stream == stream && c.Summaries[i].Consumer == consumer {
			return &c.Summaries[i]
		}
	}
	return nil
}

// Ratio is relayd's events per CPU-second over consumer's (0 if either is
// missing).
func (c *CapacityResult) Ratio(stream, consumer string) float64 {
	r, b := c.Summary(stream, ModeRelayd), c.Summary(stream, consumer)
	if r == nil || b == nil || b.PerCPUSecond == 0 {
		return 0
	}
	return r.PerCPUSecond / b.PerCPUSecond
}

// MetadataFetch compares relayd publishing payload metadata from the
// PartialObjectMetadata frames it asks for with the same from whole objects
// (the pods, in the same interleaved runs): CPU per event and bytes read per
// event, whole objects ÷ PartialObjectMetadata (0 if not measured).
func (c *CapacityResult) MetadataFetch() (cpu, bytes float64) {
	m, w := c.Summary("pods", ConsumerRelaydMetadata), c.Summary("pods", ConsumerRelaydMetadataWhole)
	if m == nil || w == nil || m.CPUPerEvent == 0 || m.BytesPerEvent == 0 {
		return 0, 0
	}
	return float64(w.CPUPerEvent) / float64(m.CPUPerEvent), w.BytesPerEvent / m.BytesPerEvent
}

// Capacity consumers besides the consume modes: relayd with a source of
// payload metadata, which asks for PartialObjectMetadata, served the pods'
// events recorded that way, or served them as whole objects (the pods
// stream), which is what relayd read before it asked for metadata only.
const (
	ConsumerRelaydMetadata      = "relayd-metadata"
	ConsumerRelaydMetadataWhole = "relayd-metadata-whole"
	// ConsumerRelaydShaped is relayd with a source that drops fields and
	// has ignoreChanges, on the pods: the cost of the payload cuts and the
	// fingerprint. Its ignoreChanges path is absent from the recording, so
	// every event is still published and the run counts the same events as
	// plain relayd (suppressed events would be cheaper, not dearer).
	ConsumerRelaydShaped = "relayd-shaped"
	// ConsumerRelaydFiltered is relayd with a source whose filter has three
	// clauses (a label, a status field, a container image regex) that every
	// recorded pod satisfies: each clause is evaluated on every event, and
	// the run counts the same events as plain relayd.
	ConsumerRelaydFiltered = "relayd-filtered"
)

// filteredSource is ConsumerRelaydFiltered's filter.
const filteredSource = `    filter: >-
      object.metadata.labels['app.kubernetes.io/part-of'] == 'shop' &&
      object.status.phase != 'Unknown' &&
      object.spec.containers.exists(c, c.image.matches('^registry\\.example\\.com/'))
`

// shapedSource is ConsumerRelaydShaped's drop and ignoreChanges.
const shapedSource = `    drop: ['spec.containers[*].env', 'metadata.annotations["kubectl.kubernetes.io/restartedAt"]']
    ignoreChanges: ['metadata.annotations["bench.relayd.io/never-set"]']
`

func isRelayd(consumer string) bool {
	return consumer == ModeRelayd || consumer == ConsumerRelaydMetadata || consumer == ConsumerRelaydMetadataWhole || consumer == ConsumerRelaydShaped ||
		consumer == ConsumerRelaydFiltered
}

func isMetadata(consumer string) bool {
	return consumer == ConsumerRelaydMetadata || consumer == ConsumerRelaydMetadataWhole
}

// Shaped compares relayd with drop and ignoreChanges (ConsumerRelaydShaped)
// with plain relayd on the pods, in the same interleaved runs: events per
// CPU-second, shaped ÷ plain (0 if not measured).
func (c *CapacityResult) Shaped() float64 {
	s, p := c.Summary("pods", ConsumerRelaydShaped), c.Summary("pods", ModeRelayd)
	if s == nil || p == nil || p.PerCPUSecond == 0 {
		return 0
	}
	return s.PerCPUSecond / p.PerCPUSecond
}

// Filtered compares relayd with the three-clause filter
// (ConsumerRelaydFiltered) with plain relayd on the pods, in the same
// interleaved runs: events per CPU-second, filtered ÷ plain (0 if not
// measured).
func (c *CapacityResult) Filtered() float64 {
	s, p := c.Summary("pods", ConsumerRelaydFiltered), c.Summary("pods", ModeRelayd)
	if s == nil || p == nil || p.PerCPUSecond == 0 {
		return 0
	}
	return s.PerCPUSecond / p.PerCPUSecond
}

type capacityCase struct {
	stream   *Stream
	consumer string
	metadata *Stream // the stream's events as PartialObjectMetadata (ConsumerRelaydMetadata)
}

func capacityCases(rec *Recording) []capacityCase {
	var cases []capacityCase
	if s := rec.Stream("pods"); s != nil && s.Events > 0 {
		cases = append(cases, capacityCase{stream: s, consumer: ModeRelayd}, capacityCase{stream: s, consumer: ConsumerRelaydShaped},
			capacityCase{stream: s, consumer: ConsumerRelaydFiltered})
		if m := rec.Stream("pods-metadata"); m != nil && m.Events == s.Events {
			cases = append(cases, capacityCase{stream: s, consumer: ConsumerRelaydMetadata, metadata: m},
				capacityCase{stream: s, consumer: ConsumerRelaydMetadataWhole})
		}
		cases = append(cases, capacityCase{stream: s, consumer: ModeDynamic}, capacityCase{stream: s, consumer: ModeTyped})
	}
	if s := rec.Stream("widgets"); s != nil && s.Events > 0 { // -crd-events 0: none recorded
		cases = append(cases, capacityCase{stream: s, consumer: ModeRelayd}, capacityCase{stream: s, consumer: ModeDynamic})
	}
	return cases
}

func (h *harness) capacity(ctx context.Context, rec *Recording) (*CapacityResult, error) {
	res := &CapacityResult{}
	cases := capacityCases(rec)
	if len(h.o.Consumers) > 0 {
		var some []capacityCase
		for _, c := range cases {
			if slices.Contains(h.o.Consumers, c.consumer) {
				some = append(some, c)
			}
		}
		cases = some
	}
	for rep := 1; rep <= h.o.Repeat; rep++ {
		for _, c := range cases {
			run, err := h.capacityRun(ctx, c, "")
			if err != nil {
				return nil, fmt.Errorf("%s/%s: %w", c.stream.Name, c.consumer, err)
			}
			run.Rep = rep
			h.logf("bench: capacity %-7s %-7s rep %d: %d events, %.2fs CPU, %.2fs wall: %.0f events/CPU-s, %.0f events/s",
				run.Stream, run.Consumer, rep, run.Events, run.CPU, run.Wall, run.PerCPUSecond, run.PerSecond)
			res.Runs = append(res.Runs, run)
		}
	}
	for _, c := range cases {
		var per, wall, bytes []float64
		for _, r := range res.Runs {
			if r.Stream == c.stream.Name && r.Consumer == c.consumer {
				per = append(per, r.PerCPUSecond)
				wall = append(wall, r.PerSecond)
				bytes = append(bytes, float64(r.Bytes)/float64(r.Events))
			}
		}
		sort.Float64s(per)
		m := median(per)
		res.Summaries = append(res.Summaries, CapacitySummary{
			Stream: c.stream.Name, Consumer: c.consumer, PerCPUSecond: m, Min: per[0], Max: per[len(per)-1],
			PerSecond: median(wall), CPUPerEvent: time.Duration(float64(time.Second) / m), BytesPerEvent: median(bytes),
		})
	}
	if h.o.Profile {
		dir := filepath.Join(h.o.WorkDir, "profiles")
		for _, c := range cases {
			p := filepath.Join(dir, c.stream.Name+"-"+c.consumer+".pprof")
			if _, err := h.capacityRun(ctx, c, p); err != nil {
				return nil, fmt.Errorf("profile %s/%s: %w", c.stream.Name, c.consumer, err)
			}
			res.Profiles = append(res.Profiles, p)
			h.logf("bench: CPU profile %s", p)
		}
	}
	return res, nil
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// capacityRun serves c's stream from a fresh replay server to one consumer
// process and measures its CPU time from its watch request to its last
// event.
func (h *harness) capacityRun(ctx context.Context, c capacityCase, cpuProfile string) (CapacityRun, error) {
	s, consumer := c.stream, c.consumer
	run := CapacityRun{Stream: s.Name, Consumer: consumer, Events: s.Events, Bytes: s.Bytes}
	rp := &Replay{Group: s.Group, Version: s.Version, Resource: s.Resource, Kind: s.Kind, Namespaced: s.Namespaced,
		ListRV: s.StartRV, Watch: s.Frames()}
	if c.metadata != nil {
		rp.Metadata = c.metadata.Frames()
	}
	srv := NewServer(rp)
	defer srv.Close()
	id := h.next()
	kc := filepath.Join(h.o.WorkDir, "replay-"+id+".kubeconfig")
	if err := srv.WriteKubeconfig(kc); err != nil {
		return run, err
	}
	var (
		mu     sync.Mutex
		child  *Child
		cpu0   time.Duration
		sched0 SchedStat
		t0     time.Time
		cpuOK  = make(chan error, 1)
	)
	srv.OnWatch = func() {
		mu.Lock()
		defer mu.Unlock()
		t0 = time.Now()
		var err error
		if cpu0, err = child.CPU(); err == nil {
			sched0, err = child.Sched()
		}
		cpuOK <- err
	}
	var sched1 SchedStat
	name := fmt.Sprintf("capacity-%s-%s-%s", s.Name, consumer, id)
	var (
		end  time.Time
		cpu1 time.Duration
	)
	if isRelayd(consumer) {
		stream, cluster := "CAP"+id, "cap"+id
		if err := h.createStream(ctx, stream, cluster); err != nil {
			return run, err
		}
		defer h.deleteStream(stream)
		src := fmt.Sprintf(`  - name: %s
    resource: {group: %q, version: %s, resource: %s}
    initial: none
`, s.Name, s.Group, s.Version, s.Resource)
		switch {
		case isMetadata(consumer):
			src += "    payload: metadata\n"
		case consumer == ConsumerRelaydShaped:
			src += shapedSource
		case consumer == ConsumerRelaydFiltered:
			src += filteredSource
		}
		mu.Lock()
		r, err := h.startRelayd(ctx, name, h.relaydConfig(cluster, stream, "", src), kc, cpuProfile)
		if err != nil {
			mu.Unlock()
			return run, err
		}
		child = r.Child
		mu.Unlock()
		defer r.Stop(30 * time.Second)
		if err := h.snoop.WaitCount(ctx, stream, int64(s.Events), 10*time.Minute, r.alive); err != nil {
			return run, err
		}
		// Acks of work relayd does after an event's ack (if any) come in
		// the quiet period.
		end = h.snoop.Quiet(ctx, 300*time.Millisecond)
		var err2 error
		if cpu1, err2 = child.CPU(); err2 != nil {
			return run, err2
		}
		if sched1, err2 = child.Sched(); err2 != nil {
			return run, err2
		}
	} else {
		args := []string{"-mode", consumer, "-kubeconfig", kc, "-group", s.Group, "-version", s.Version, "-resource", s.Resource,
			"-rv", s.StartRV, "-count", strconv.Itoa(s.Events)}
		if cpuProfile != "" {
			args = append(args, "-cpuprofile", cpuProfile)
		}
		mu.Lock()
		c, err := h.self(name, "consume", args...)
		if err != nil {
			mu.Unlock()
			return run, err
		}
		child = c
		mu.Unlock()
		defer c.Stop(30 * time.Second)
		if _, err := c.WaitLine(ctx, "done", 10*time.Minute); err != nil {
			return run, err
		}
		end = time.Now()
		if cpu1, err = c.CPU(); err != nil {
			return run, err
		}
		if sched1, err = c.Sched(); err != nil {
			return run, err
		}
	}
	select {
	case err := <-cpuOK:
		if err != nil {
			return run, err
		}
	default:
		return run, fmt.Errorf("the consumer never started its watch")
	}
	if n := srv.Watches.Load(); n != 1 {
		return run, fmt.Errorf("%d watch requests, want 1 (did the consumer reconnect?)", n)
	}
	if isMetadata(consumer) && srv.MetadataWatches.Load() != 1 {
		return run, fmt.Errorf("relayd with payload metadata did not ask for PartialObjectMetadata (a relayd binary older than the metadata-only fetch?)")
	}
	run.Bytes = srv.SentBytes.Load()
	run.CPU = (cpu1 - cpu0).Seconds()
	run.RunQueueWait = (sched1.Wait - sched0.Wait).Seconds()
	run.Wall = end.Sub(t0).Seconds()
	if run.CPU <= 0 {
		run.CPU = clockTick.Seconds() // below the resolution of /proc
	}
	run.PerCPUSecond = float64(run.Events) / run.CPU
	run.PerSecond = float64(run.Events) / run.Wall
	return run, nil
}
