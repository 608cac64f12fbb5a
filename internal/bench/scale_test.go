package bench

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// selfEnv makes the test binary the harness's `natsd` and `consume`
// programs (Options.Self), as relayd-bench is for `make bench-scale`.
const selfEnv = "RELAYD_BENCH_SELF"

func self(sub string, args []string) int {
	switch sub {
	case "natsd":
		return NATSD(args)
	case "consume":
		return Consume(args)
	}
	fmt.Fprintf(os.Stderr, "unknown harness program %q\n", sub)
	return 2
}

// The scale run end to end at the smallest step of `-quick` (1,000
// replayed objects with the restart and both 410s; one namespace and two
// sources on the real kube-apiserver; the rate step for seconds at tens of
// events/s, checkRateStep), so that the harness cannot rot:
// every step measures (the counts are checked, not the times), and every
// goal either has its figure or says why not.
func TestScaleSmallestStep(t *testing.T) {
	dir := t.TempDir()
	const n = 1000
	rep, err := RunScale(t.Context(), Options{
		Self: os.Args[0], SelfEnv: []string{selfEnv + "=1"}, RelaydBin: os.Getenv("RELAYD_BIN"),
		CacheDir: dir, WorkDir: filepath.Join(dir, "work"), Record: RecordOptions{PodEvents: 25, WidgetEvents: 5}, Logf: t.Logf,
	}, ScaleOptions{
		Steps: []string{StepTracked, StepNamespaces, StepSources, StepRate}, Objects: []int{n}, PodShare: 0.15, Namespaces: 100,
		WatchNamespaces: []int{1}, Sources: 2, FlushInterval: time.Second, Quick: true,
		Rate: RateOptions{Replicas: []int{1, 3}, Start: 40, Max: 40, Probe: 2 * time.Second, Hold: 3 * time.Second, Verify: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Tracked) != 1 || rep.Tracked[0].Tracked != n || rep.Tracked[0].Pods != 150 || rep.Tracked[0].RSS <= 0 {
		t.Errorf("tracked: %+v; want %d tracked objects, 150 of them pods, and an RSS", rep.Tracked, n)
	}
	if rs := rep.Restart; rs == nil || rs.Entries != n || rs.HWM < rs.RSS || rs.RSS <= 0 {
		t.Errorf("restart: %+v; want %d entries and VmHWM ≥ RSS > 0", rs, n)
	}
	for name, e := range map[string]*ExpireResult{"pods": rep.PodRelist, "everything": rep.Expire} {
		if e == nil || e.PeakError != "" || e.PeakRSS <= 0 {
			t.Errorf("410 of %s: %+v; want a VmHWM peak", name, e)
		}
	}
	if rep.PodRelist != nil && rep.PodRelist.Objects != 150 || rep.Expire != nil && rep.Expire.Objects != n {
		t.Errorf("410s of %d pods and %d objects; want 150 and %d", rep.PodRelist.Objects, rep.Expire.Objects, n)
	}
	if len(rep.Namespaces) != 1 || rep.Namespaces[0].CheckpointWrites < 1 || rep.Namespaces[0].Restart.Entries != 1 {
		t.Errorf("namespaces: %+v; want one size, checkpoint writes, and the 1 ConfigMap tracked after the restart", rep.Namespaces)
	}
	if s := rep.Sources; s == nil || s.Sources != 2 || s.Connections < 1 || s.Goroutines <= 0 {
		t.Errorf("sources: %+v; want 2 sources, an apiserver connection or more, goroutines", s)
	}
	for _, g := range rep.Goals() {
		if g.NotMeasured && !strings.Contains(g.Miss, "(a smoke run)") && !strings.Contains(g.Miss, "a slope needs two sizes") {
			t.Errorf("goal %q not measured: %s", g.What, g.Miss)
		}
	}
	var md bytes.Buffer
	rep.Markdown(&md)
	checkRateStep(t, rep)
	for _, h := range []string{"#### Goals", "#### S1.", "#### S2.", "#### S3.", "#### S4.", "#### S5.", "#### S6.", "relayd_checkpoint_errors_total"} {
		if !strings.Contains(md.String(), h) {
			t.Errorf("report has no %q:\n%s", h, md.String())
		}
	}
}

// The scale goals: a goal stated at 1,000,000 objects is judged only at
// that size; counts over their goal are missed with the margin; a step
// that failed lists its goals as not measured.
func TestScaleReportGoals(t *testing.T) {
	full := &ScaleReport{Options: ScaleOptions{Steps: []string{StepTracked, StepNamespaces}},
		Tracked:   []TrackedPoint{{Objects: 10_000, RSS: 40 << 20}, {Objects: 1_000_000, Pods: 150_000, RSS: 300 << 20, Tracked: 1e6, Namespaces: 10_000}},
		Restart:   &RestartResult{Ready: 9, FirstChange: 16, RSS: 300 << 20, HWM: 330 << 20, Entries: 1e6, Relists: 2, ConsumersCreated: 5},
		Expire:    &ExpireResult{Objects: 1_000_000, Seconds: 50, RSS: 300 << 20, PeakRSS: 400 << 20},
		PodRelist: &ExpireResult{Objects: 150_000, Seconds: 20, RSS: 300 << 20, PeakRSS: 310 << 20},
		Namespaces: []NamespacePoint{{Namespaces: 100, CheckpointWrites: 3, Restart: RestartResult{ConsumersCreated: 1}},
			{Namespaces: 5000, CheckpointErrors: 4, Restart: RestartResult{Relists: 0, ConsumersCreated: 5000}}},
	}
	full.RSSPerObject = 280
	quick := &ScaleReport{Options: ScaleOptions{Steps: []string{StepTracked, StepNamespaces}, Quick: true},
		Tracked: []TrackedPoint{{Objects: 1000, Pods: 150, RSS: 30 << 20}},
		Restart: &RestartResult{Ready: 1, FirstChange: 1, RSS: 30 << 20, HWM: 33 << 20, ConsumersCreated: 4},
		Expire:  &ExpireResult{Objects: 1000, Seconds: 1, RSS: 30 << 20, PeakRSS: 31 << 20}, PodRelist: &ExpireResult{Objects: 150, Seconds: 1},
		Errors: map[string]string{StepNamespaces: "bench: namespaces: boom"}}
	type want struct {
		prefix           string
		met, notMeasured bool
		miss, measured   string
	}
	for _, tc := range []struct {
		name string
		r    *ScaleReport
		want []want
	}{{"at the goals' sizes", full, []want{
		{prefix: "tracked objects: RSS after", met: true, measured: "300.0 MiB at 1000000 objects"},
		{prefix: "tracked objects: RSS per tracked object", miss: "1.09× the goal"},
		{prefix: "restart with the index bucket filled", miss: "1.07× the goal", measured: "16.00 s"},
		{prefix: "restart: RSS during the load", met: true, measured: "1.10×"},
		{prefix: "410 of every source: 410", met: true},
		{prefix: "410 of every source: relist peak", miss: "1.11× the goal", measured: "1.33×"},
		{prefix: "410 of the pods alone", met: true},
		{prefix: "per-namespace watches: checkpoint errors during start", miss: "not zero", measured: "4 at 5000 namespaces"},
		{prefix: "per-namespace watches: relists", met: true},
		{prefix: "per-namespace watches: JetStream consumers", miss: "2500.00× the goal", measured: "5000 at 5000 namespaces"},
		{prefix: "restart with the index bucket filled: JetStream consumers", miss: "1.25× the goal", measured: "5"},
		{prefix: "restart with the index bucket filled: relists", miss: "not zero"},
	}}, {"a -quick run, a failed step", quick, []want{
		{prefix: "tracked objects: RSS after", notMeasured: true, miss: "run at 1000 objects, the goal is at 1000000 (a smoke run)"},
		{prefix: "tracked objects: RSS per tracked object", notMeasured: true, miss: "a slope needs two sizes"},
		{prefix: "restart with the index bucket filled: relists", met: true},
		{prefix: "restart with the index bucket filled: JetStream consumers", met: true},
		{prefix: "restart with the index bucket filled", notMeasured: true, miss: "(a smoke run)"},
		{prefix: "restart: RSS during the load", notMeasured: true, miss: "(a smoke run)", measured: "1.10×"},
		{prefix: "410 of every source: 410", notMeasured: true, miss: "(a smoke run)"},
		{prefix: "410 of every source: relist peak", notMeasured: true, miss: "(a smoke run)"},
		{prefix: "410 of the pods alone", notMeasured: true, miss: "run at 150 pods, the goal is at 150000"},
		{prefix: "per-namespace watches: checkpoint errors during start", notMeasured: true, miss: "the step failed: bench: namespaces: boom"},
		{prefix: "per-namespace watches: JetStream consumers", notMeasured: true, miss: "boom"},
	}}, {"a larger size failed", &ScaleReport{Options: ScaleOptions{Steps: []string{StepNamespaces}},
		Namespaces: []NamespacePoint{{Namespaces: 100, Restart: RestartResult{ConsumersCreated: 200}}},
		Errors:     map[string]string{StepNamespaces: "bench: namespaces: 5000 namespaces: not ready"}}, []want{
		{prefix: "per-namespace watches: checkpoint errors during start", notMeasured: true, miss: "a larger size failed: bench: namespaces: 5000 namespaces: not ready", measured: "0 at 100 namespaces"},
		{prefix: "per-namespace watches: JetStream consumers", miss: "100.00× the goal"},
	}}} {
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
				if g.Met != w.met || g.NotMeasured != w.notMeasured || !strings.Contains(g.Miss, w.miss) || !strings.Contains(g.Measured, w.measured) {
					t.Errorf("%s: met %v, not measured %v, measured %q, miss %q; want met %v, not measured %v, measured containing %q, miss containing %q",
						g.What, g.Met, g.NotMeasured, g.Measured, g.Miss, w.met, w.notMeasured, w.measured, w.miss)
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
}

// checkRateStep checks the rate step of TestScaleSmallestStep (a few
// seconds at tens of events/s, into an R1 stream and an R3 stream on three
// nats-servers): whatever rate holds on the machine (times are not
// checked), every probe and hold stores each event it paced, and the
// streams read back hold every paced event once.
func checkRateStep(t *testing.T, rep *ScaleReport) {
	t.Helper()
	if len(rep.Rate) != 2 || rep.Rate[0].Replicas != 1 || rep.Rate[1].Replicas != 3 {
		t.Errorf("rate results: %+v; want R1 and R3", rep.Rate)
		return
	}
	for _, res := range rep.Rate {
		var sent int64
		var cpu float64 // one probe may use less than /proc's 10 ms tick
		for _, p := range append(append([]RateProbe(nil), res.Probes...), res.Holds...) {
			sent, cpu = sent+p.Sent, cpu+p.RelaydCPU
			stoppedEarly := !p.Held && strings.Contains(p.Why, "stopped after")
			if p.Stored != p.Sent || p.Sent == 0 || (!stoppedEarly && p.Sent != int64(p.Rate*p.Planned)) || p.RSS <= 0 {
				t.Errorf("R%d: %.0f events/s for %.0f s: %d sent, %d stored, RSS %d; want %d sent (unless stopped early), all stored, an RSS",
					res.Replicas, p.Rate, p.Planned, p.Sent, p.Stored, p.RSS, int64(p.Rate*p.Planned))
			}
			if len(p.NATSCPU) != res.Replicas {
				t.Errorf("R%d: CPU of %d nats-servers, want %d", res.Replicas, len(p.NATSCPU), res.Replicas)
			}
		}
		if cpu <= 0 {
			t.Errorf("R%d: relayd used no CPU relaying %d events", res.Replicas, sent)
		}
		if res.Knee > 0 && len(res.Holds) == 0 {
			t.Errorf("R%d: knee %.0f/s and no hold", res.Replicas, res.Knee)
		}
		if !res.Verified || res.Paced != sent || res.Found != sent || res.Missing != 0 || res.Duplicated != 0 || res.Foreign != 0 {
			t.Errorf("R%d: %d events paced (%d by the probes and holds); read back: verified %v, %d found once, %d missing, %d duplicated, %d other messages",
				res.Replicas, res.Paced, sent, res.Verified, res.Found, res.Missing, res.Duplicated, res.Foreign)
		}
	}
	goals := rep.Goals()
	for _, want := range []string{"sustained rate into R1:", "sustained rate into R3 (3 servers):"} {
		found := false
		for _, g := range goals {
			if strings.HasPrefix(g.What, want) {
				found = true
				if g.Met || g.NotMeasured && !strings.Contains(g.Miss, "(a smoke run)") {
					t.Errorf("goal %q: met %v, %s; a run of seconds is a smoke run, never met", g.What, g.Met, g.Miss)
				}
			}
		}
		if !found {
			t.Errorf("no goal %q in %+v", want, goals)
		}
	}
}

// The rate goals: a 5-minute hold that held is met, one that broke is
// missed (with the rate that broke before it), a short hold is a smoke
// run, and a search where nothing held says how low it went.
func TestScaleRateGoals(t *testing.T) {
	held := RateProbe{Rate: 3600, Planned: 300, Paced: 300, Stored: 1_080_000, RelaydCPU: 108, Held: true, P50: .001, P99: .02}
	broke := RateProbe{Rate: 4000, Planned: 300, Paced: 36, Stored: 144_000, Why: "backlog over 1.0 s of events: stopped after 36.0 s"}
	for _, tc := range []struct {
		name string
		res  []RateResult
		want []string // per stream: met, or what the miss contains
	}{
		{"held", []RateResult{{Replicas: 1, Knee: 3600, Holds: []RateProbe{held}}, {Replicas: 3, Knee: 4000, Holds: []RateProbe{broke, held}}},
			[]string{"met", "met"}},
		{"broke", []RateResult{{Replicas: 1, Knee: 4000, Holds: []RateProbe{broke}}, {Replicas: 3, Probes: []RateProbe{{Rate: 31, Why: "p99"}}}},
			[]string{"the hold broke: backlog", "no rate held, down to 31 events/s"}},
		{"smoke", []RateResult{{Replicas: 1, Knee: 40, Holds: []RateProbe{{Rate: 40, Planned: 3, Held: true}}}},
			[]string{"(a smoke run)", "not measured: the step did not run"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &ScaleReport{Options: ScaleOptions{Steps: []string{StepRate}}, Rate: tc.res}
			goals := r.Goals()
			if len(goals) != 2 {
				t.Fatalf("%d goals, want R1 and R3: %+v", len(goals), goals)
			}
			for i, g := range goals {
				if ok := tc.want[i] == "met"; g.Met != ok || !ok && !strings.Contains(g.Miss, tc.want[i]) {
					t.Errorf("%s: met %v, miss %q; want %s", g.What, g.Met, g.Miss, tc.want[i])
				}
			}
			if len(tc.res) > 1 && len(tc.res[1].Holds) == 2 && !strings.Contains(goals[1].Measured, "after 4000 events/s broke") {
				t.Errorf("R3 measured %q does not say the first hold broke", goals[1].Measured)
			}
		})
	}
}
