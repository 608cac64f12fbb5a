package bench

import (
	"context"
	"fmt"
	"path/filepath"
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
}

// CapacitySummary is the median over the repetitions of one stream and
// consumer.
type CapacitySummary struct {
	Stream, Consumer string
	PerCPUSecond     float64 // median
	Min, Max         float64 // of PerCPUSecond
	PerSecond        float64 // median
	CPUPerEvent      time.Duration
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

type capacityCase struct {
	stream   *Stream
	consumer string
}

func capacityCases(rec *Recording) []capacityCase {
	var cases []capacityCase
	if s := rec.Stream("pods"); s != nil {
		cases = append(cases, capacityCase{s, ModeRelayd}, capacityCase{s, ModeDynamic}, capacityCase{s, ModeTyped})
	}
	if s := rec.Stream("widgets"); s != nil {
		cases = append(cases, capacityCase{s, ModeRelayd}, capacityCase{s, ModeDynamic})
	}
	return cases
}

func (h *harness) capacity(ctx context.Context, rec *Recording) (*CapacityResult, error) {
	res := &CapacityResult{}
	cases := capacityCases(rec)
	for rep := 1; rep <= h.o.Repeat; rep++ {
		for _, c := range cases {
			run, err := h.capacityRun(ctx, c.stream, c.consumer, "")
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
		var per, wall []float64
		for _, r := range res.Runs {
			if r.Stream == c.stream.Name && r.Consumer == c.consumer {
				per = append(per, r.PerCPUSecond)
				wall = append(wall, r.PerSecond)
			}
		}
		sort.Float64s(per)
		m := median(per)
		res.Summaries = append(res.Summaries, CapacitySummary{
			Stream: c.stream.Name, Consumer: c.consumer, PerCPUSecond: m, Min: per[0], Max: per[len(per)-1],
			PerSecond: median(wall), CPUPerEvent: time.Duration(float64(time.Second) / m),
		})
	}
	if h.o.Profile {
		dir := filepath.Join(h.o.WorkDir, "profiles")
		for _, c := range cases {
			p := filepath.Join(dir, c.stream.Name+"-"+c.consumer+".pprof")
			if _, err := h.capacityRun(ctx, c.stream, c.consumer, p); err != nil {
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

// capacityRun serves s from a fresh replay server to one consumer process
// and measures its CPU time from its watch request to its last event.
func (h *harness) capacityRun(ctx context.Context, s *Stream, consumer, cpuProfile string) (CapacityRun, error) {
	run := CapacityRun{Stream: s.Name, Consumer: consumer, Events: s.Events, Bytes: s.Bytes}
	srv := NewServer(&Replay{Group: s.Group, Version: s.Version, Resource: s.Resource, Kind: s.Kind, Namespaced: s.Namespaced,
		ListRV: s.StartRV, Watch: s.Frames()})
	defer srv.Close()
	id := h.next()
	kc := filepath.Join(h.o.WorkDir, "replay-"+id+".kubeconfig")
	if err := srv.WriteKubeconfig(kc); err != nil {
		return run, err
	}
	var (
		mu    sync.Mutex
		child *Child
		cpu0  time.Duration
		t0    time.Time
		cpuOK = make(chan error, 1)
	)
	srv.OnWatch = func() {
		mu.Lock()
		defer mu.Unlock()
		t0 = time.Now()
		var err error
		cpu0, err = child.CPU()
		cpuOK <- err
	}
	name := fmt.Sprintf("capacity-%s-%s-%s", s.Name, consumer, id)
	var (
		end  time.Time
		cpu1 time.Duration
	)
	if consumer == ModeRelayd {
		stream, cluster := "CAP"+id, "cap"+id
		if err := h.createStream(ctx, stream, cluster); err != nil {
			return run, err
		}
		defer h.deleteStream(stream)
		src := fmt.Sprintf(`  - name: %s
    resource: {group: %q, version: %s, resource: %s}
    initial: none
`, s.Name, s.Group, s.Version, s.Resource)
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
	run.CPU = (cpu1 - cpu0).Seconds()
	run.Wall = end.Sub(t0).Seconds()
	if run.CPU <= 0 {
		run.CPU = clockTick.Seconds() // below the resolution of /proc
	}
	run.PerCPUSecond = float64(run.Events) / run.CPU
	run.PerSecond = float64(run.Events) / run.Wall
	return run, nil
}
