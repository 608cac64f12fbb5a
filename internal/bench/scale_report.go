package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
)

// WriteJSON writes the report as JSON.
func (r *ScaleReport) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// atScale keeps a goal stated at a size (want) only when the run reached
// it (have); below it (a -quick run) the figure is shown, not judged.
func atScale(g Goal, have, want int, unit string) Goal {
	if have >= want || g.NotMeasured {
		return g
	}
	return Goal{What: g.What, Goal: g.Goal, Measured: g.Measured, NotMeasured: true,
		Miss: fmt.Sprintf("not measured: run at %d %s, the goal is at %d (a smoke run)", have, unit, want)}
}

// why says why a step has no figures: it failed, or did not run.
func (r *ScaleReport) why(step string) string {
	if e := r.Errors[step]; e != "" {
		return "the step failed: " + e
	}
	return "the step did not run (interrupted)"
}

// peakGoal is VmHWM ÷ steady RSS ≤ want.
func peakGoal(what string, e *ExpireResult, want float64, why string) Goal {
	goal := fmt.Sprintf("≤ %.1f×", want)
	switch {
	case why != "":
		return notMeasured(what, goal, "", why)
	case e.PeakError != "":
		return notMeasured(what, goal, "", e.PeakError)
	case e.PeakRSS <= 0 || e.RSS <= 0:
		return notMeasured(what, goal, "", "no VmHWM or steady RSS")
	}
	v := float64(e.PeakRSS) / float64(e.RSS)
	return atMost(what, goal, fmt.Sprintf("%.2f× (%.0f ÷ %.0f MiB)", v, mib(e.PeakRSS), mib(e.RSS)), v, want)
}

// consumersTarget: loading a source's index and catching it up with the
// stream take a consumer each, whatever the number of its watches.
const consumersTarget = "≤ 2 per source"

// consumersGoal is consumers created ≤ perSource × sources (sizes: where).
func consumersGoal(what string, n int64, sources int, where string) Goal {
	return atMost(what, consumersTarget, fmt.Sprintf("%d%s", n, where), float64(n), float64(2*sources))
}

// Goals lists the scale goals of the steps that ran or were asked for; a
// goal without a figure is not measured, never met.
func (r *ScaleReport) Goals() []Goal {
	var g []Goal
	if r.Options.has(StepTracked) {
		g = append(g, r.trackedGoals()...)
	}
	if r.Options.has(StepNamespaces) {
		g = append(g, r.namespaceGoals()...)
	}
	if r.Options.has(StepRate) {
		g = append(g, r.rateGoals()...)
	}
	return g
}

func (r *ScaleReport) trackedGoals() []Goal {
	const (
		rssAt    = "tracked objects: RSS after the initial sync (largest size)"
		perObj   = "tracked objects: RSS per tracked object (slope)"
		ready    = "restart with the index bucket filled: start → ready and the first new change relayed"
		loadPeak = "restart: RSS during the load (VmHWM) ÷ steady"
		exp      = "410 of every source: 410 → last sync.completed"
		expPeak  = "410 of every source: relist peak (VmHWM) ÷ steady"
		pods     = "410 of the pods alone: relist → sync.completed"
		relists  = "restart with the index bucket filled: relists"
		creates  = "restart with the index bucket filled: JetStream consumers created (2 sources)"
	)
	why := ""
	if len(r.Tracked) == 0 {
		why = r.why(StepTracked)
	}
	var g []Goal
	if why != "" {
		g = append(g, notMeasured(rssAt, "≤ 512 MiB at 1,000,000", "", why), notMeasured(perObj, "≤ 256 B", "", why))
	} else {
		p := r.Tracked[len(r.Tracked)-1]
		g = append(g, atScale(atMost(rssAt, "≤ 512 MiB at 1,000,000",
			fmt.Sprintf("%.1f MiB at %d objects (%.0f tracked) in %d namespaces", mib(p.RSS), p.Objects, p.Tracked, p.Namespaces), mib(p.RSS), 512),
			p.Objects, goalObjects, "objects"))
		if len(r.Tracked) < 2 {
			g = append(g, notMeasured(perObj, "≤ 256 B", "", fmt.Sprintf("a slope needs two sizes or more, %d measured", len(r.Tracked))))
		} else {
			g = append(g, atScale(atMost(perObj, "≤ 256 B", fmt.Sprintf("%.0f B over %d sizes", r.RSSPerObject, len(r.Tracked)), r.RSSPerObject, 256),
				r.Tracked[len(r.Tracked)-1].Objects, goalObjects, "objects"))
		}
	}
	objects, podsN := 0, 0
	if n := len(r.Tracked); n > 0 {
		objects, podsN = r.Tracked[n-1].Objects, r.Tracked[n-1].Pods
	}
	if rs := r.Restart; rs == nil {
		w := r.why(StepTracked)
		g = append(g, notMeasured(ready, "≤ 15 s at 1,000,000", "", w), notMeasured(loadPeak, "≤ 1.2×", "", w),
			notMeasured(relists, "0", "", w), notMeasured(creates, consumersTarget, "", w))
	} else {
		v := max(rs.Ready, rs.FirstChange)
		g = append(g, atScale(atMost(ready, "≤ 15 s at 1,000,000",
			fmt.Sprintf("%.2f s (ready %.2f s, change %.2f s; %.0f entries)", v, rs.Ready, rs.FirstChange, rs.Entries), v, 15),
			objects, goalObjects, "objects"))
		peak := float64(rs.HWM) / float64(rs.RSS)
		g = append(g, atScale(atMost(loadPeak, "≤ 1.2×", fmt.Sprintf("%.2f× (%.0f ÷ %.0f MiB)", peak, mib(rs.HWM), mib(rs.RSS)), peak, 1.2),
			objects, goalObjects, "objects"),
			atMost(relists, "0", fmt.Sprintf("%.0f", rs.Relists), rs.Relists, 0),
			consumersGoal(creates, rs.ConsumersCreated, 2, ""))
	}
	if e := r.Expire; e == nil {
		w := r.why(StepTracked)
		g = append(g, notMeasured(exp, "≤ 60 s at 1,000,000", "", w), peakGoal(expPeak, nil, 1.2, w))
	} else {
		g = append(g, atScale(atMost(exp, "≤ 60 s at 1,000,000", fmt.Sprintf("%.2f s (%d objects)", e.Seconds, e.Objects), e.Seconds, 60),
			e.Objects, goalObjects, "objects"), atScale(peakGoal(expPeak, e, 1.2, ""), e.Objects, goalObjects, "objects"))
	}
	if e := r.PodRelist; e == nil {
		g = append(g, notMeasured(pods, "≤ 30 s at 150,000 pods", "", r.why(StepTracked)))
	} else {
		g = append(g, atScale(atMost(pods, "≤ 30 s at 150,000 pods", fmt.Sprintf("%.2f s (%d pods)", e.Seconds, e.Objects), e.Seconds, 30),
			podsN, goalPods, "pods"))
	}
	return g
}

func (r *ScaleReport) namespaceGoals() []Goal {
	const (
		ckpt     = "per-namespace watches: checkpoint errors during start (relayd_checkpoint_errors_total)"
		relists  = "per-namespace watches: relists at a clean restart"
		creates  = "per-namespace watches: JetStream consumers created at a restart (1 source)"
		ckptRest = "per-namespace watches: checkpoint errors after the restart"
	)
	if len(r.Namespaces) == 0 {
		w := r.why(StepNamespaces)
		return append([]Goal{notMeasured(ckpt, "0", "", w), notMeasured(relists, "0", "", w),
			notMeasured(creates, consumersTarget, "", w), notMeasured(ckptRest, "0", "", w)}, r.watchGoals()...)
	}
	// The worst size of each.
	var wc, wr, wk NamespacePoint
	var wrc NamespacePoint
	for _, p := range r.Namespaces {
		if p.CheckpointErrors >= wc.CheckpointErrors {
			wc = p
		}
		if p.Restart.Relists >= wr.Restart.Relists {
			wr = p
		}
		if p.Restart.ConsumersCreated >= wk.Restart.ConsumersCreated {
			wk = p
		}
		if p.RestartCheckpointErrors >= wrc.RestartCheckpointErrors {
			wrc = p
		}
	}
	g := []Goal{
		atMost(ckpt, "0", fmt.Sprintf("%.0f at %d namespaces (%.0f writes)", wc.CheckpointErrors, wc.Namespaces, wc.CheckpointWrites), wc.CheckpointErrors, 0),
		atMost(relists, "0", fmt.Sprintf("%.0f at %d namespaces", wr.Restart.Relists, wr.Namespaces), wr.Restart.Relists, 0),
		consumersGoal(creates, wk.Restart.ConsumersCreated, 1, fmt.Sprintf(" at %d namespaces", wk.Namespaces)),
		atMost(ckptRest, "0", fmt.Sprintf("%.0f at %d namespaces", wrc.RestartCheckpointErrors, wrc.Namespaces), wrc.RestartCheckpointErrors, 0),
	}
	g = append(g, r.watchGoals()...)
	// A larger size failed: the smaller sizes' figures do not judge it.
	if e := r.Errors[StepNamespaces]; e != "" {
		for i, x := range g {
			if x.Met {
				g[i] = notMeasured(x.What, x.Goal, x.Measured, "a larger size failed: "+e)
			}
		}
	}
	return g
}

// Markdown writes the report's tables.
func (r *ScaleReport) Markdown(w io.Writer) {
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	m := r.Machine
	p("Measured %s, %s: %s, %d cores, %.0f GiB, Linux %s, %s; load average at start %s.\n",
		r.Started.Format("2006-01-02 15:04 MST"), durRound(r.Finished.Sub(r.Started)), m.CPU, m.Cores, m.MemGiB, m.Kernel, m.Go, m.LoadAvg)
	p("relayd: %s.\n", r.Relayd)
	if r.Options.Quick {
		p("A -quick run: the goals stated at 1,000,000 objects or 150,000 pods (sizes, times, slopes, peaks) are shown, not judged.\n")
	}
	p("\n#### Goals\n\n| goal | target | measured | met |\n|---|---|---|---|\n")
	for _, g := range r.Goals() {
		met := "yes"
		if !g.Met {
			met = "**no**: " + g.Miss
		}
		p("| %s | %s | %s | %s |\n", g.What, g.Goal, g.Measured, met)
	}
	p("\n")
	if len(r.Tracked) > 0 {
		p("#### S1. Tracked objects (replay server: recorded 9 KB pods + ConfigMaps, initial: snapshot)\n\n")
		p("| objects | pods | ConfigMaps | namespaces | relayd_tracked_objects | initial sync | objects/s | RSS | heap in use | live heap | VmHWM of the sync | goroutines |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, t := range r.Tracked {
			p("| %d | %d | %d | %d | %.0f | %.2f s | %.0f | %.1f MiB | %.1f MiB | %.1f MiB | %.1f MiB | %.0f |\n", t.Objects, t.Pods, t.ConfigMaps, t.Namespaces,
				t.Tracked, t.SyncSeconds, t.SyncPerSecond, mib(t.RSS), mib(t.HeapInuse), mib(t.LiveHeap), mib(t.SyncHWM), t.Goroutines)
		}
		p("\nSlope (least squares): RSS %.0f B per tracked object.\n\n", r.RSSPerObject)
	}
	if rs := r.Restart; rs != nil {
		p("#### S2. Restart with %.0f entries in the index bucket (replay server)\n\n", rs.Entries)
		p("| start → ready | start → first new change | steady RSS | VmHWM | relists | consumers created | lists served |\n|---|---|---|---|---|---|---|\n")
		p("| %.2f s | %.2f s | %.1f MiB | %.1f MiB | %.0f | %d | %d |\n\n", rs.Ready, rs.FirstChange, mib(rs.RSS), mib(rs.HWM), rs.Relists, rs.ConsumersCreated, rs.StreamingLists)
	}
	if r.PodRelist != nil || r.Expire != nil {
		p("#### S3. Forced 410 (replay server)\n\n| expired | objects | 410 → sync.completed | steady RSS | peak (VmHWM) | ÷ steady |\n|---|---|---|---|---|---|\n")
		for _, x := range []struct {
			name string
			e    *ExpireResult
		}{{"pods", r.PodRelist}, {"every source", r.Expire}} {
			if x.e == nil {
				continue
			}
			peak, ratio := "n/a", "n/a"
			if x.e.PeakError == "" && x.e.PeakRSS > 0 {
				peak, ratio = fmt.Sprintf("%.1f MiB", mib(x.e.PeakRSS)), fmt.Sprintf("%.2f×", float64(x.e.PeakRSS)/float64(x.e.RSS))
			}
			p("| %s | %d | %.2f s | %.1f MiB | %s | %s |\n", x.name, x.e.Objects, x.e.Seconds, mib(x.e.RSS), peak, ratio)
		}
		p("\n")
	}
	if len(r.Namespaces) > 0 {
		p("#### S4. Per-namespace watches (real kube-apiserver; one source, a ConfigMap per namespace, changed every 250 ms in the last one)\n\n")
		p("| namespaces | start → change in the last relayed | start → ready | checkpoint writes / errors | RSS | goroutines | restart: ready | first change | relists | consumers created | checkpoint errors |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, n := range r.Namespaces {
			restart := fmt.Sprintf("%.2f s | %.2f s | %.0f | %d | %.0f", n.Restart.Ready, n.Restart.FirstChange, n.Restart.Relists, n.Restart.ConsumersCreated, n.RestartCheckpointErrors)
			if n.Restart.Ready == 0 {
				restart = "failed (below) | | | |"
			}
			p("| %d | %.2f s | %.2f s | %.0f / %.0f | %.1f MiB | %.0f | %s |\n", n.Namespaces, n.FirstChange, n.Ready,
				n.CheckpointWrites, n.CheckpointErrors, mib(n.RSS), n.Goroutines, restart)
		}
		p("\nSlope (least squares): RSS %.0f B per watch.\n\n", r.MemoryPerWatch)
	}
	if s := r.Sources; s != nil {
		p("#### S5. Sources (real kube-apiserver; a ConfigMap source per namespace)\n\n| sources | start → ready | RSS | goroutines | apiserver connections |\n|---|---|---|---|---|\n")
		p("| %d | %.2f s | %.1f MiB | %.0f | %d |\n\n", s.Sources, s.Ready, mib(s.RSS), s.Goroutines, s.Connections)
	}
	r.rateMarkdown(w)
	for step, e := range r.Errors {
		p("Step %s failed: %s\n\n", step, e)
	}
}
