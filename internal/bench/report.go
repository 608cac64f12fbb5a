package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"strconv"
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
	// Errors holds the error of each scenario that failed: its goals are
	// listed as not measured.
	Errors map[string]string `json:",omitempty"`
}

// fail records that scenario failed with err and returns err.
func (r *Report) fail(scenario string, err error) error {
	if r.Errors == nil {
		r.Errors = map[string]string{}
	}
	r.Errors[scenario] = err.Error()
	return err
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
// A goal is met only when it was measured and the figure is within it.
type Goal struct {
	What, Goal, Measured string
	Met                  bool
	// NotMeasured is a goal without a (complete) figure: its scenario
	// failed or did not run, a side of a ratio is missing, or the samples
	// do not cover what was done. Never met.
	NotMeasured bool
	// Miss says by how much a goal that is not met is missed, or why it
	// was not measured.
	Miss string
}

// notMeasured is a goal without a figure (measured says what there is).
func notMeasured(what, goal, measured, why string) Goal {
	if measured == "" {
		measured = "n/a"
	}
	return Goal{What: what, Goal: goal, Measured: measured, NotMeasured: true, Miss: "not measured: " + why}
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

// positiveAtMost is atMost for a figure that is never 0 or below when it
// was measured: such a figure is not measured (why says what it was).
func positiveAtMost(what, goal, measured string, got, want float64, why string) Goal {
	if got <= 0 || math.IsNaN(got) {
		return notMeasured(what, goal, measured, why)
	}
	return atMost(what, goal, measured, got, want)
}

// checkpointsUnderLoad: at most one write per flush interval, that is
// floor(T/interval)+1 in a window of T seconds (a window can begin just
// before a flush and end just after one).
//
// No write at all, or no window, is not measured: relayd writes its
// checkpoint under load (a stuck relayd, or a counter that never moved,
// would otherwise pass).
func checkpointsUnderLoad(l *LatencyResult) Goal {
	const what = "checkpoint writes under load"
	goal := fmt.Sprintf("≤ one per %v flush", flushInterval)
	if l.CheckpointWrites <= 0 || l.Duration <= 0 {
		return notMeasured(what, goal, fmt.Sprintf("%.0f in %.1fs", l.CheckpointWrites, l.Duration),
			"no checkpoint write counted under load (relayd writes one per flush while it relays)")
	}
	most := math.Floor(l.Duration/flushInterval.Seconds()) + 1
	return atMost(what, goal,
		fmt.Sprintf("%.0f in %.1fs (%.3f/s; at most %.0f)", l.CheckpointWrites, l.Duration, l.CheckpointPS, most),
		l.CheckpointWrites, most)
}

// Goals lists every goal of the scenarios the report has results for or
// was asked to run: a goal without a figure is listed as not measured
// (never met), so that a failed or partial measurement cannot pass as met.
func (r *Report) Goals() []Goal {
	var g []Goal
	if why, ok := r.wanted(ScenarioCapacity, r.Capacity != nil); ok {
		g = append(g, capacityGoals(r.Capacity, why)...)
	}
	if why, ok := r.wanted(ScenarioLatency, r.Latency != nil); ok {
		g = append(g, latencyGoals(r.Latency, r.Options.IdleFor > 0, why)...)
	}
	if why, ok := r.wanted(ScenarioMemory, r.Memory != nil); ok {
		g = append(g, memoryGoals(r.Memory, why)...)
	}
	if why, ok := r.wanted(ScenarioRecovery, r.Recovery != nil); ok {
		g = append(g, recoveryGoal(r.Recovery, r.Options.RecoveryObjects, why))
	}
	return g
}

// wanted says whether the report lists scenario's goals (it has a result,
// or the scenario was asked for), and, without a result, why.
func (r *Report) wanted(scenario string, have bool) (why string, ok bool) {
	if have {
		return "", true
	}
	if !r.Options.has(scenario) {
		return "", false
	}
	if e := r.Errors[scenario]; e != "" {
		return "the scenario failed: " + e, true
	}
	return "the scenario did not run (an earlier step failed)", true
}

// capacityGoals: relayd's own events per CPU-second on the pods, relayd ÷
// each client-go consumer, and relayd with drop and ignoreChanges ÷ plain
// relayd (the same interleaved runs). The targets are docs/PERFORMANCE.md's
// "Goals".
func capacityGoals(c *CapacityResult, why string) []Goal {
	perCPU := "events per CPU-second"
	return []Goal{
		absoluteGoal("capacity: relayd, pods (9 KB), "+perCPU, MinRelaydPodsPerCPUSecond, c, "pods", ModeRelayd, why),
		ratioGoal(fmt.Sprintf("capacity: relayd ÷ %s consumer, pods, %s", ModeDynamic, perCPU), 10, "≥ 10.0×",
			c, "pods", ModeRelayd, ModeDynamic, why),
		ratioGoal(fmt.Sprintf("capacity: relayd ÷ %s consumer, pods, %s", ModeTyped, perCPU), 8, "≥ 8.0×",
			c, "pods", ModeRelayd, ModeTyped, why),
		ratioGoal(fmt.Sprintf("capacity: relayd ÷ %s consumer, widgets, %s", ModeDynamic, perCPU), 3.5, "≥ 3.5×",
			c, "widgets", ModeRelayd, ModeDynamic, why),
		ratioGoal("capacity: relayd with drop + ignoreChanges ÷ plain relayd, pods, "+perCPU, 0.85, "≥ 0.85×",
			c, "pods", ConsumerRelaydShaped, ModeRelayd, why),
		ratioGoal("capacity: relayd with a three-clause filter ÷ plain relayd, pods, "+perCPU, 0.7, "≥ 0.7×",
			c, "pods", ConsumerRelaydFiltered, ModeRelayd, why),
	}
}

// MinRelaydPodsPerCPUSecond is the capacity goal of relayd itself: pod
// events (the 9 KB recording) per CPU-second, end to end to the PubAck.
const MinRelaydPodsPerCPUSecond = 20000

// absoluteGoal is consumer's events per CPU-second on stream ≥ want. No
// summary: not measured; 0: a failure.
func absoluteGoal(what string, want float64, c *CapacityResult, stream, consumer, why string) Goal {
	goal := fmt.Sprintf("≥ %s", thousands(want))
	if why != "" {
		return notMeasured(what, goal, "", why)
	}
	s := c.Summary(stream, consumer)
	if s == nil {
		return notMeasured(what, goal, "", fmt.Sprintf("no figure for %s on %s", consumer, stream))
	}
	if s.PerCPUSecond <= 0 {
		return Goal{What: what, Goal: goal, Measured: "0", Miss: fmt.Sprintf("%s measured 0: failed", consumer)}
	}
	measured := thousands(s.PerCPUSecond)
	if s.Max > s.Min {
		measured += fmt.Sprintf(" [%s–%s]", thousands(s.Min), thousands(s.Max))
	}
	return atLeast(what, goal, measured, s.PerCPUSecond, want)
}

// thousands formats v rounded, with a comma between thousands.
func thousands(v float64) string {
	s := strconv.FormatInt(int64(math.Round(v)), 10)
	for i := len(s) - 3; i > 0 && s[i-1] != '-'; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// ratioGoal is num ÷ den ≥ want, events per CPU-second on stream. A side
// without a summary is not measured; a side measured at 0 makes the ratio
// 0 or undefined: a failure, never a missing row.
func ratioGoal(what string, want float64, goal string, c *CapacityResult, stream, num, den, why string) Goal {
	if why != "" {
		return notMeasured(what, goal, "", why)
	}
	n, d := c.Summary(stream, num), c.Summary(stream, den)
	for _, k := range []string{num, den} {
		if c.Summary(stream, k) == nil {
			return notMeasured(what, goal, "", fmt.Sprintf("no figure for %s on %s", k, stream))
		}
	}
	if n.PerCPUSecond <= 0 || d.PerCPUSecond <= 0 {
		return Goal{What: what, Goal: goal,
			Measured: fmt.Sprintf("%.0f ÷ %.0f events per CPU-second", n.PerCPUSecond, d.PerCPUSecond),
			Miss:     fmt.Sprintf("a side measured 0 (%s: %.0f, %s: %.0f): failed", num, n.PerCPUSecond, den, d.PerCPUSecond)}
	}
	v := n.PerCPUSecond / d.PerCPUSecond
	return atLeast(what, goal, fmt.Sprintf("%.2f×", v), v, want)
}

// latencyGoals: watch read → PubAck p50 and p99 from a sample for every
// write, and the checkpoint writes under load and when idle.
func latencyGoals(l *LatencyResult, idle bool, why string) []Goal {
	const (
		p50, p99     = "latency: watch read → PubAck p50", "latency: watch read → PubAck p99"
		load, idleW  = "checkpoint writes under load", "checkpoint writes when idle"
		noCheckpoint = "relayd_checkpoint_writes_total was not in every scrape"
	)
	loadGoal := fmt.Sprintf("≤ one per %v flush", flushInterval)
	if l == nil {
		g := []Goal{notMeasured(p50, "≤ 1 ms", "", why), notMeasured(p99, "≤ 5 ms", "", why), notMeasured(load, loadGoal, "", why)}
		if idle {
			g = append(g, notMeasured(idleW, "0", "", why))
		}
		return g
	}
	var g []Goal
	if n := l.ReadToAck.N; l.Writes == 0 || n < l.Writes {
		partial := fmt.Sprintf("%d samples for %d writes", n, l.Writes)
		if n > 0 {
			partial = fmt.Sprintf("%s from %d of %d writes", ms(l.ReadToAck.P50), n, l.Writes)
		}
		why := fmt.Sprintf("a PubAck was seen for %d of %d writes", n, l.Writes)
		g = append(g, notMeasured(p50, "≤ 1 ms", partial, why))
		if n > 0 {
			partial = fmt.Sprintf("%s from %d of %d writes", ms(l.ReadToAck.P99), n, l.Writes)
		}
		g = append(g, notMeasured(p99, "≤ 5 ms", partial, why))
	} else {
		g = append(g,
			positiveAtMost(p50, "≤ 1 ms", ms(l.ReadToAck.P50), l.ReadToAck.P50, 0.001, "a latency of 0"),
			positiveAtMost(p99, "≤ 5 ms", ms(l.ReadToAck.P99), l.ReadToAck.P99, 0.005, "a latency of 0"))
	}
	if !l.CheckpointsCounted {
		g = append(g, notMeasured(load, loadGoal, "", noCheckpoint))
	} else {
		g = append(g, checkpointsUnderLoad(l))
	}
	switch {
	case l.IdleSeconds > 0 && l.CheckpointsCounted:
		g = append(g, atMost(idleW, "0", fmt.Sprintf("%.0f in %.0fs", l.IdleWrites, l.IdleSeconds), l.IdleWrites, 0))
	case l.IdleSeconds > 0:
		g = append(g, notMeasured(idleW, "0", "", noCheckpoint))
	case idle:
		g = append(g, notMeasured(idleW, "0", "", "the idle period did not run"))
	}
	return g
}

// memoryGoals: the slopes per tracked object (two sizes or more) and the
// RSS peak of a forced relist, the kernel's VmHWM (see MemoryPoint).
func memoryGoals(m *MemoryResult, why string) []Goal {
	const (
		rss  = "memory: RSS per tracked object (slope)"
		live = "memory: live heap per tracked object (slope)"
		peak = "memory: RSS peak (VmHWM) during a forced relist ÷ steady state (worst size)"
	)
	if why == "" && m != nil && len(m.Points) < 2 {
		why = fmt.Sprintf("a slope needs two sizes or more, %d measured", len(m.Points))
	}
	var g []Goal
	if why != "" {
		g = append(g, notMeasured(rss, "≤ 256 B", "", why), notMeasured(live, "≤ 256 B", "", why))
	} else {
		// Memory grows with the objects relayd tracks: a slope of 0 or
		// below says the sizes' figures are noise (or missing), not
		// that objects are free.
		const flat = "a slope of 0 or below (memory did not grow with the objects: the figures are noise or missing)"
		g = append(g,
			positiveAtMost(rss, "≤ 256 B", fmt.Sprintf("%.0f B", m.RSSPerObject), m.RSSPerObject, 256, flat),
			positiveAtMost(live, "≤ 256 B", fmt.Sprintf("%.0f B (heap in use: %.0f B)", m.LiveHeapPerObject, m.HeapPerObject), m.LiveHeapPerObject, 256, flat))
	}
	if m == nil || len(m.Points) == 0 {
		if why == "" {
			why = "no sizes measured"
		}
		return append(g, notMeasured(peak, "≤ 1.5×", "", why))
	}
	worst := 0.0
	for _, p := range m.Points {
		switch {
		case p.PeakError != "":
			return append(g, notMeasured(peak, "≤ 1.5×", "", fmt.Sprintf("%d objects: %s", p.Objects, p.PeakError)))
		case p.PeakRSS <= 0 || p.RSS <= 0:
			return append(g, notMeasured(peak, "≤ 1.5×", "", fmt.Sprintf("%d objects: no VmHWM or steady RSS", p.Objects)))
		}
		worst = math.Max(worst, float64(p.PeakRSS)/float64(p.RSS))
	}
	return append(g, atMost(peak, "≤ 1.5×", fmt.Sprintf("%.2f×", worst), worst, 1.5))
}

// recoveryGoal: 410 → sync.completed, from relayd's log.
func recoveryGoal(rc *RecoveryResult, objects int, why string) Goal {
	if rc != nil {
		objects = rc.Objects
	}
	what := fmt.Sprintf("recovery: 410 → sync.completed, %d objects (median)", objects)
	switch {
	case why != "":
		return notMeasured(what, "≤ 10 s", "", why)
	case len(rc.Runs) == 0:
		return notMeasured(what, "≤ 10 s", "", "no runs")
	case rc.From410 < 0:
		return notMeasured(what, "≤ 10 s", "", "no 410 in relayd's log")
	case rc.From410 == 0:
		return notMeasured(what, "≤ 10 s", "0 s", "a recovery of 0 s (no time between the 410 and sync.completed)")
	}
	return atMost(what, "≤ 10 s", fmt.Sprintf("%.2f s", rc.From410), rc.From410, 10)
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
			if isMetadata(s.Consumer) || s.Consumer == ConsumerRelaydShaped || s.Consumer == ConsumerRelaydFiltered {
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
		c.runQueueTable(p)
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
		if ratio := c.Filtered(); ratio > 0 {
			p("#### 1c. filter (pods; three clauses: a label, a status field, an image regex; same interleaved runs; goal: ≥ 0.7× plain)\n\n")
			p("| relayd | events per CPU-second | CPU per event |\n|---|---|---|\n")
			for _, k := range []string{ModeRelayd, ConsumerRelaydFiltered} {
				s := c.Summary("pods", k)
				p("| %s | %.0f [%.0f–%.0f] | %.1f µs |\n", consumerName(k), s.PerCPUSecond, s.Min, s.Max, float64(s.CPUPerEvent)/1e3)
			}
			p("| **filtered ÷ plain** | **%.2f×** | |\n\n", ratio)
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
		p("| objects | relayd_tracked_objects | RSS | heap in use | live heap (est.) | relist: peak RSS (VmHWM) | ÷ steady | peak heap in use (sampled) | ÷ steady | relist time |\n|---|---|---|---|---|---|---|---|---|---|\n")
		for _, pt := range mm.Points {
			peak, ratio := "n/a", "n/a"
			if pt.PeakError == "" && pt.PeakRSS > 0 {
				peak, ratio = fmt.Sprintf("%.1f MiB", mib(pt.PeakRSS)), fmt.Sprintf("%.2f×", float64(pt.PeakRSS)/float64(pt.RSS))
			}
			p("| %d | %.0f | %.1f MiB | %.1f MiB | %.1f MiB | %s | %s | %.1f MiB | %.2f× | %.2f s |\n", pt.Objects, pt.Tracked,
				mib(pt.RSS), mib(pt.HeapInuse), mib(pt.LiveHeap), peak, ratio,
				mib(pt.PeakHeapInuse), float64(pt.PeakHeapInuse)/float64(pt.HeapInuse), pt.RelistSeconds)
		}
		p("\nSlope (least squares): RSS %.0f B per object, heap in use %.0f B per object, live heap (heap goal ÷ (1+GOGC/100)) %.0f B per object.\n\n",
			mm.RSSPerObject, mm.HeapPerObject, mm.LiveHeapPerObject)
		p("The relist peak is relayd's VmHWM (/proc/<pid>/status) at sync.completed, reset at the 410 with `echo 5 > /proc/<pid>/clear_refs`; VmHWM before → right after the reset (RSS then):")
		for i, pt := range mm.Points {
			sep := ";"
			if i == len(mm.Points)-1 {
				sep = "."
			}
			rs := pt.PeakReset
			p(" %d objects: %.1f → %.1f MiB (%.1f MiB)%s", pt.Objects, mib(rs.HWMBefore), mib(rs.HWMAfter), mib(rs.RSSAfter), sep)
			if pt.PeakError != "" {
				p(" Not measured: %s.", pt.PeakError)
			}
		}
		p("\n\n")
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

// runQueueTable lists every capacity run's run-queue wait: how long the
// consumer waited for a CPU while it ran (other work on the machine), so
// that a run measured on a loaded machine shows as such.
func (c *CapacityResult) runQueueTable(p func(string, ...any)) {
	loaded := 0
	for _, r := range c.Runs {
		if r.Loaded() {
			loaded++
		}
	}
	p("Run-queue wait of each run (the consumer's threads waiting for a CPU, /proc/<pid>/task/*/schedstat, watch start → last event): %d of %d runs waited a tenth of their CPU time or more (**loaded**).\n\n", loaded, len(c.Runs))
	p("| stream | consumer | run | CPU | run-queue wait | wait ÷ CPU |\n|---|---|---|---|---|---|\n")
	for _, r := range c.Runs {
		share, mark := "n/a", ""
		if r.CPU > 0 {
			share = fmt.Sprintf("%.0f%%", 100*r.RunQueueWait/r.CPU)
		}
		if r.Loaded() {
			mark = " **loaded**"
		}
		p("| %s | %s | %d | %.2f s | %.3f s | %s%s |\n", r.Stream, r.Consumer, r.Rep, r.CPU, r.RunQueueWait, share, mark)
	}
	p("\n")
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
	case ConsumerRelaydFiltered:
		return "relayd with a three-clause filter (CEL)"
	}
	return c
}

func durRound(d time.Duration) string { return d.Round(time.Second).String() }
