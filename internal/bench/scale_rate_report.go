package bench

import (
	"fmt"
	"io"
	"math"
	"strings"
)

func rateTargetName(replicas int) string {
	if replicas == 1 {
		return "R1"
	}
	return fmt.Sprintf("R%d (%d servers)", replicas, replicas)
}

// rateGoals: per stream, the knee held for 5 minutes at read → PubAck p99
// ≤ 50 ms. The issue sets no rate: the rate and relayd's CPU per event are
// reported, the hold is judged.
func (r *ScaleReport) rateGoals() []Goal {
	const goal = "held 5 min at read → PubAck p99 ≤ 50 ms (rate reported)"
	var g []Goal
	for _, n := range r.Options.Rate.withDefaults().Replicas {
		what := fmt.Sprintf("sustained rate into %s: knee (p99 ≤ 50 ms for 5 min), CPU per event", rateTargetName(n))
		var res *RateResult
		for i := range r.Rate {
			if r.Rate[i].Replicas == n {
				res = &r.Rate[i]
			}
		}
		switch {
		case res == nil:
			g = append(g, notMeasured(what, goal, "", r.why(StepRate)))
			continue
		case res.Knee == 0 && len(res.Probes) > 0:
			lowest := res.Probes[len(res.Probes)-1]
			g = append(g, Goal{What: what, Goal: goal, Measured: "no rate held: " + lowest.line(),
				Miss: fmt.Sprintf("no rate held, down to %.0f events/s", lowest.Rate)})
			continue
		case res.Hold() == nil:
			g = append(g, notMeasured(what, goal, fmt.Sprintf("knee %.0f events/s (search)", res.Knee), "the hold did not run: "+r.why(StepRate)))
			continue
		}
		h := res.Hold()
		knee := ""
		if res.AtMax {
			knee = " (the search's ceiling: every probe held)"
		}
		m := fmt.Sprintf("%.0f events/s%s for %.0f s: p50 %s, p99 %s; relayd %.0f µs CPU per event, %.0f MiB RSS",
			h.Rate, knee, h.Paced, msHist(h.P50), msHist(h.P99), h.CPUPerEvent()*1e6, mib(h.RSS))
		if len(res.Holds) > 1 {
			b := res.Holds[0]
			m += fmt.Sprintf(" (after %.0f events/s broke: %s)", b.Rate, b.Why)
		}
		switch {
		case !h.Held:
			g = append(g, Goal{What: what, Goal: goal, Measured: m, Miss: "the hold broke: " + h.Why})
		case h.Planned < rateGoalHold.Seconds():
			g = append(g, Goal{What: what, Goal: goal, Measured: m, NotMeasured: true,
				Miss: fmt.Sprintf("not measured: held %.0f s, the goal is %v (a smoke run)", h.Planned, rateGoalHold)})
		default:
			g = append(g, Goal{What: what, Goal: goal, Measured: m, Met: true})
		}
	}
	return g
}

func (r *ScaleReport) rateMarkdown(w io.Writer) {
	if len(r.Rate) == 0 {
		return
	}
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	p("#### S6. Sustained rate (replay server pacing recorded 9 KB pods on one watch)\n\n")
	p("A rate holds when relayd_publish_lag_seconds (read → PubAck) has ≤ 1%% of its events over 50 ms, the backlog (events due and not acknowledged) stays ≤ %.1f s of events and the last PubAck comes ≤ %.0f s after the last event was due. CPU per event: CPU-seconds of each process (/proc/<pid>/stat) ÷ events stored, over the probe (pacing start → last PubAck); in brackets, relayd's run-queue wait (schedstat). On 2 cores relayd, the nats-server(s) and the harness (replay server, pacer, ack snoop) share the CPUs: the cores column shows each one's share and the other work on the machine (/proc/stat busy time minus theirs).\n\n",
		rateMaxBehind, rateMaxDrain)
	p("| stream | phase | rate | seconds | events | p50 | p99 | > 50 ms | backlog | relayd µs/event (waiting for a CPU) | nats-server µs/event | harness µs/event | cores: relayd / nats-server(s) / harness / other work | relayd RSS | held |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, res := range r.Rate {
		rows := func(phase string, ps []RateProbe) {
			for _, x := range ps {
				held := "yes"
				if !x.Held {
					held = "no: " + x.Why
				}
				cores := func(c float64) string { return fmt.Sprintf("%.2f", c/math.Max(x.Window, 1e-9)) }
				var each []string
				for _, c := range x.NATSCPU {
					each = append(each, cores(c))
				}
				other := math.Max(0, x.MachineCPU-x.RelaydCPU-x.natsCPU()-x.HarnessCPU)
				p("| %s | %s | %.0f/s | %.1f | %d | %s | %s | %.2f%% | %.2f s | %.0f (%.0f) | %.0f | %.0f | %s / %s / %s / %s | %.1f MiB | %s |\n",
					rateTargetName(res.Replicas), phase, x.Rate, x.Paced, x.Stored, msHist(x.P50), msHist(x.P99), x.Over50*100, x.MaxBehind,
					x.CPUPerEvent()*1e6, perEvent(x.RelaydWait, x.Stored), perEvent(x.natsCPU(), x.Stored), perEvent(x.HarnessCPU, x.Stored),
					cores(x.RelaydCPU), strings.Join(each, "+"), cores(x.HarnessCPU), cores(other), mib(x.RSS), held)
			}
		}
		rows("probe", res.Probes)
		rows("hold", res.Holds)
	}
	p("\n")
	for _, res := range r.Rate {
		knee := "none held"
		if res.Knee > 0 {
			knee = fmt.Sprintf("%.0f events/s", res.Knee)
		}
		if res.AtMax {
			knee += " (the search's ceiling)"
		}
		p("%s: knee %s; %d events paced", rateTargetName(res.Replicas), knee, res.Paced)
		if res.Verified {
			p("; read back: %d found once, %d missing, %d duplicated, %d other messages", res.Found, res.Missing, res.Duplicated, res.Foreign)
		}
		p(".\n")
	}
	p("\n")
}
