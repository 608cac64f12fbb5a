package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"strings"
	"time"
)

// Machine describes where the figures were taken.
type Machine struct {
	CPU     string
	Cores   int
	MemGiB  float64
	Kernel  string
	Go      string
	LoadAvg string // at the start of the run: other work on the machine
}

func machineInfo() Machine {
	m := Machine{Cores: runtime.NumCPU(), Go: runtime.Version()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb float64
		if _, err := fmt.Sscanf(string(b), "MemTotal: %f kB", &kb); err == nil {
			m.MemGiB = kb / (1 << 20)
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		f := strings.Fields(string(b))
		if len(f) >= 3 {
			m.LoadAvg = strings.Join(f[:3], " ")
		}
	}
	return m
}

// Report is everything a run measured.
type Report struct {
	Machine           Machine
	Started, Finished time.Time
	Options           Options
	Relayd            string
	Recording         *Recording      `json:",omitempty"`
	Capacity          *CapacityResult `json:",omitempty"`
	Latency           *LatencyResult  `json:",omitempty"`
	Memory            *MemoryResult   `json:",omitempty"`
	Recovery          *RecoveryResult `json:",omitempty"`
}

// WriteJSON writes the report as JSON (NaN becomes null).
func (r *Report) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// Goal is one performance goal of docs/PERFORMANCE.md and what was measured.
type Goal struct {
	What, Goal, Measured string
	Met                  bool
	// Miss says by how much a goal that is not met is missed.
	Miss string
}

// atLeast is a goal met when got ≥ want.
func atLeast(what, goal, measured string, got, want float64) Goal {
	g := Goal{What: what, Goal: goal, Measured: measured, Met: got >= want}
	if !g.Met {
		g.Miss = fmt.Sprintf("%.0f%% short (needs %.2f× of what was measured)", (1-got/want)*100, want/got)
	}
	return g
}

// atMost is a goal met when got ≤ want.
func atMost(what, goal, measured string, got, want float64) Goal {
	g := Goal{What: what, Goal: goal, Measured: measured, Met: got <= want+1e-12}
	if !g.Met {
		if want > 0 {
			g.Miss = fmt.Sprintf("%.2f× the goal (%.0f%% over)", got/want, (got/want-1)*100)
		} else {
			g.Miss = "not zero"
		}
	}
	return g
}

// checkpointsUnderLoad: at most one write per flush interval, that is
// floor(T/interval)+1 in a window of T seconds (a window can begin just
// before a flush and end just after one).
func checkpointsUnderLoad(l *LatencyResult) Goal {
	most := math.Floor(l.Duration/flushInterval.Seconds()) + 1
	return atMost("checkpoint writes under load", fmt.Sprintf("≤ one per %v flush", flushInterval),
		fmt.Sprintf("%.0f in %.1fs (%.3f/s; at most %.0f)", l.CheckpointWrites, l.Duration, l.CheckpointPS, most),
		l.CheckpointWrites, most)
}

// Goals lists the goals the report has figures for.
func (r *Report) Goals() []Goal {
	var g []Goal
	if c := r.Capacity; c != nil {
		add := func(stream, consumer string, want float64) {
			if v := c.Ratio(stream, consumer); v > 0 {
				g = append(g, atLeast(fmt.Sprintf("capacity: relayd ÷ %s consumer, %s, events per CPU-second", consumer, stream),
					fmt.Sprintf("≥ %.1f×", want), fmt.Sprintf("%.2f×", v), v, want))
			}
		}
		add("pods", ModeDynamic, 2)
		add("pods", ModeTyped, 1)
		add("widgets", ModeDynamic, 2)
	}
	if l := r.Latency; l != nil {
		g = append(g,
			atMost("latency: watch read → PubAck p50", "≤ 1 ms", ms(l.ReadToAck.P50), l.ReadToAck.P50, 0.001),
			atMost("latency: watch read → PubAck p99", "≤ 5 ms", ms(l.ReadToAck.P99), l.ReadToAck.P99, 0.005),
			checkpointsUnderLoad(l))
		if l.IdleSeconds > 0 {
			g = append(g, atMost("checkpoint writes when idle", "0", fmt.Sprintf("%.0f in %.0fs", l.IdleWrites, l.IdleSeconds), l.IdleWrites, 0))
		}
	}
	if m := r.Memory; m != nil && len(m.Points) >= 2 {
		g = append(g,
			atMost("memory: RSS per tracked object (slope)", "≤ 256 B", fmt.Sprintf("%.0f B", m.RSSPerObject), m.RSSPerObject, 256),
			atMost("memory: live heap per tracked object (slope)", "≤ 256 B", fmt.Sprintf("%.0f B (heap in use: %.0f B)", m.LiveHeapPerObject, m.HeapPerObject), m.LiveHeapPerObject, 256))
		worst := 0.0
		for _, p := range m.Points {
			worst = math.Max(worst, float64(p.PeakRSS)/float64(p.RSS))
		}
		g = append(g, atMost("memory: RSS peak during a forced relist ÷ steady state (worst size)", "≤ 1.5×", fmt.Sprintf("%.2f×", worst), worst, 1.5))
	}
	if rc := r.Recovery; rc != nil && len(rc.Runs) > 0 {
		what := fmt.Sprintf("recovery: 410 → sync.completed, %d objects (median)", rc.Objects)
		if rc.From410 < 0 { // the 410 was not found in relayd's log
			g = append(g, Goal{What: what, Goal: "≤ 10 s", Measured: "n/a (no 410 in relayd's log)", Miss: "not measured"})
		} else {
			g = append(g, atMost(what, "≤ 10 s", fmt.Sprintf("%.2f s", rc.From410), rc.From410, 10))
		}
	}
	return g
}

// Markdown writes the report's tables.
func (r *Report) Markdown(w io.Writer) {
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	m := r.Machine
	p("Measured %s, %s: %s, %d cores, %.0f GiB, Linux %s, %s; load average at start %s.\n",
		r.Started.Format("2006-01-02 15:04 MST"), durRound(r.Finished.Sub(r.Started)), m.CPU, m.Cores, m.MemGiB, m.Kernel, m.Go, m.LoadAvg)
	p("relayd: %s.\n\n", r.Relayd)

	p("#### Goals\n\n| goal | target | measured | met |\n|---|---|---|---|\n")
	for _, g := range r.Goals() {
		met := "yes"
		if !g.Met {
			met = "**no**: " + g.Miss
		}
		p("| %s | %s | %s | %s |\n", g.What, g.Goal, g.Measured, met)
	}
	p("\n")

	if c := r.Capacity; c != nil {
		p("#### 1. Pipeline capacity (replayed watch, full speed; median of %d runs, [min–max])\n\n", r.Options.Repeat)
		p("| stream | consumer | events | avg frame | events per CPU-second | CPU per event | events/s (wall) | relayd ÷ this |\n|---|---|---|---|---|---|---|---|\n")
		for _, s := range c.Summaries {
			if isMetadata(s.Consumer) || s.Consumer == ConsumerRelaydShaped {
				continue // in the tables below
			}
			st := r.Recording.Stream(s.Stream)
			if st == nil {
				st = &Stream{Events: 1}
			}
			ratio := "–"
			if s.Consumer != ModeRelayd {
				ratio = fmt.Sprintf("**%.2f×**", c.Ratio(s.Stream, s.Consumer))
			}
			p("| %s | %s | %d | %.1f KB | %.0f [%.0f–%.0f] | %.1f µs | %.0f | %s |\n", s.Stream, consumerName(s.Consumer),
				st.Events, float64(st.Bytes)/float64(st.Events)/1000, s.PerCPUSecond, s.Min, s.Max,
				float64(s.CPUPerEvent)/1e3, s.PerSecond, ratio)
		}
		p("\n")
		if cpu, bytes := c.MetadataFetch(); cpu > 0 {
			p("#### 1a. Metadata-only fetch (pods, relayd with `payload: metadata`; same interleaved runs)\n\n")
			p("| relayd read | bytes read per event | CPU per event | events per CPU-second |\n|---|---|---|---|\n")
			for _, k := range []string{ConsumerRelaydMetadata, ConsumerRelaydMetadataWhole} {
				s := c.Summary("pods", k)
				p("| %s | %.0f B | %.1f µs | %.0f [%.0f–%.0f] |\n", consumerName(k), s.BytesPerEvent, float64(s.CPUPerEvent)/1e3, s.PerCPUSecond, s.Min, s.Max)
			}
			p("| **whole objects ÷ PartialObjectMetadata** | **%.1f×** | **%.2f×** | |\n\n", bytes, cpu)
		}
		if ratio := c.Shaped(); ratio > 0 {
			p("#### 1b. drop and ignoreChanges (pods; same interleaved runs; goal: within 15%% of plain)\n\n")
			p("| relayd | events per CPU-second | CPU per event |\n|---|---|---|\n")
			for _, k := range []string{ModeRelayd, ConsumerRelaydShaped} {
				s := c.Summary("pods", k)
				p("| %s | %.0f [%.0f–%.0f] | %.1f µs |\n", consumerName(k), s.PerCPUSecond, s.Min, s.Max, float64(s.CPUPerEvent)/1e3)
			}
			p("| **shaped ÷ plain** | **%.2f×** | |\n\n", ratio)
		}
	}
	if l := r.Latency; l != nil {
		p("#### 2. Added latency (real kube-apiserver, %d pods, %d writes at %.0f/s over %.0fs)\n\n", l.Objects, l.Writes, l.Rate, l.Duration)
		p("| interval | n | p50 | p99 | p99.9 | max |\n|---|---|---|---|---|---|\n")
		p("| watch read → PubAck | %d | %s | %s | %s | %s |\n", l.ReadToAck.N, ms(l.ReadToAck.P50), ms(l.ReadToAck.P99), ms(l.ReadToAck.P999), ms(l.ReadToAck.Max))
		p("| (relayd_publish_lag_seconds, bucket-interpolated) | | %s | %s | | |\n", msHist(l.ReadToAck.HistP50), msHist(l.ReadToAck.HistP99))
		p("| writer's API response → message received | %d | %s | %s | %s | %s |\n\n", l.WriteToRecv.N, ms(l.WriteToRecv.P50), ms(l.WriteToRecv.P99), ms(l.WriteToRecv.P999), ms(l.WriteToRecv.Max))
		p("%d of %d messages (%.0f%%) reached the JetStream consumer before the writer's client had read its API response (negative figures).\n\n",
			l.RecvFirst, l.WriteToRecv.N, 100*float64(l.RecvFirst)/float64(max(l.WriteToRecv.N, 1)))
		p("Per event, relayd's threads ran %v on a CPU and waited %v in the kernel's run queue for one (/proc/<pid>/task/*/schedstat over the load).\n\n",
			l.RunPerEvent.Round(time.Microsecond), l.RunQueueWait.Round(time.Microsecond))
	}
	if mm := r.Memory; mm != nil {
		p("#### 3. Memory (replayed ConfigMaps; %d MODIFIED events after the list)\n\n", mm.Churn)
		p("| objects | relayd_tracked_objects | RSS | heap in use | live heap (est.) | relist: peak RSS | ÷ steady | peak heap in use | ÷ steady | relist time |\n|---|---|---|---|---|---|---|---|---|---|\n")
		for _, pt := range mm.Points {
			p("| %d | %.0f | %.1f MiB | %.1f MiB | %.1f MiB | %.1f MiB | %.2f× | %.1f MiB | %.2f× | %.2f s |\n", pt.Objects, pt.Tracked,
				mib(pt.RSS), mib(pt.HeapInuse), mib(pt.LiveHeap), mib(pt.PeakRSS), float64(pt.PeakRSS)/float64(pt.RSS),
				mib(pt.PeakHeapInuse), float64(pt.PeakHeapInuse)/float64(pt.HeapInuse), pt.RelistSeconds)
		}
		p("\nSlope (least squares): RSS %.0f B per object, heap in use %.0f B per object, live heap (heap goal ÷ (1+GOGC/100)) %.0f B per object.\n\n",
			mm.RSSPerObject, mm.HeapPerObject, mm.LiveHeapPerObject)
	}
	if l := r.Latency; l != nil {
		p("#### 4. Checkpoint writes (flushInterval %s)\n\n| state | writes |\n|---|---|\n", l.FlushInterval)
		p("| under load (%.0f events/s for %.0fs) | %.3f/s |\n", l.Rate, l.Duration, l.CheckpointPS)
		if l.IdleSeconds > 0 {
			p("| idle, %.0fs | %.0f |\n", l.IdleSeconds, l.IdleWrites)
		}
		p("\n")
	}
	if rc := r.Recovery; rc != nil {
		p("#### 5. Recovery (forced 410, %d ConfigMaps, kube-apiserver --watch-cache=false)\n\n", rc.Objects)
		p("| run | 410 → sync.completed | of which relist backoff | sync.started → completed | process start → completed | listed | CPU |\n|---|---|---|---|---|---|---|\n")
		for i, x := range rc.Runs {
			p("| relayd %d | %.2f s | %.2f s | %.2f s | %.2f s | %d | %.2f s |\n", i+1, x.From410, x.Backoff, x.Relist, x.FromStart, x.Listed, x.CPU)
		}
		for i, x := range rc.Informer {
			p("| client-go informer %d: list → HasSynced | %.2f s | | | | %d | %.2f s |\n", i+1, x.Synced, x.Objects, x.CPU)
		}
		p("\n")
	}
}

func consumerName(c string) string {
	switch c {
	case ModeRelayd:
		return "relayd (→ JetStream PubAck)"
	case ModeDynamic:
		return "client-go dynamic (decode only)"
	case ModeTyped:
		return "client-go typed corev1 (decode only)"
	case ConsumerRelaydMetadata:
		return "PartialObjectMetadata (as relayd asks for it)"
	case ConsumerRelaydMetadataWhole:
		return "whole objects (as before)"
	case ConsumerRelaydShaped:
		return "relayd with drop (2 paths) and ignoreChanges (fingerprints)"
	}
	return c
}

func durRound(d time.Duration) string { return d.Round(time.Second).String() }
