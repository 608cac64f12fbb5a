// Package chaos runs relayd's fault-injection scenarios
// (internal/chaos/scenario) against real servers and checks every run's
// history (internal/chaos/history).
//
// Without flags (inside `make test`) every scenario runs once, short. With
// -chaos.budget=<duration> (`make chaos`) the scenarios run over and over
// with new seeds and longer writers until the budget is spent. Failed runs
// leave their history as JSON (re-check it with `go run
// ./internal/chaos/cmd/recheck <file>`) and relayd's log under
// -chaos.artifacts.
package chaos

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/relayd/relayd/internal/chaos/history"
	"github.com/relayd/relayd/internal/chaos/scenario"
	"github.com/relayd/relayd/internal/testenv"
)

var (
	budget    = flag.Duration("chaos.budget", 0, "run the long matrix until this much time is spent (0: every scenario once, short)")
	only      = flag.String("chaos.run", "", "regexp selecting scenarios by name")
	seed      = flag.Uint64("chaos.seed", 0, "first seed (0: derived from the time)")
	table     = flag.String("chaos.table", "", "write the results table (markdown) to this file")
	artifacts = flag.String("chaos.artifacts", "", "directory for the histories and logs of failed runs (default: a temp dir, printed)")
	filter    = flag.Bool("chaos.filter", true, "add the filtered source (scoped: a CEL filter objects enter and leave) to every run's config")
)

var (
	k8s  *testenv.Env
	nats *testenv.NATS
	bin  string
)

func TestMain(m *testing.M) {
	flag.Parse()
	code := func() int {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		var err error
		dir, err := os.MkdirTemp("", "relayd-chaos-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "FAIL:", err)
			return 1
		}
		defer os.RemoveAll(dir)
		if bin, err = scenario.BuildRelayd(filepath.Join("..", ".."), dir); err != nil {
			fmt.Fprintln(os.Stderr, "FAIL:", err)
			return 1
		}
		if k8s, err = testenv.Start(ctx, testenv.Options{}); err != nil {
			fmt.Fprintln(os.Stderr, "FAIL:", err)
			return 1
		}
		defer k8s.Stop()
		if nats, err = testenv.StartNATS(testenv.NATSOptions{}); err != nil {
			fmt.Fprintln(os.Stderr, "FAIL:", err)
			return 1
		}
		defer nats.Shutdown()
		return m.Run()
	}()
	if code == 0 {
		if err := goleak.Find(testenv.LeakOptions()...); err != nil {
			fmt.Fprintln(os.Stderr, "FAIL: goroutine leak after all tests:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func TestChaos(t *testing.T) {
	// The relayd under test was built from these files (TestMain).
	if err := scenario.StatSources(filepath.Join("..", "..")); err != nil {
		t.Fatal(err)
	}
	var re *regexp.Regexp
	if *only != "" {
		re = regexp.MustCompile(*only)
	}
	var selected []scenario.Scenario
	for _, s := range scenario.Catalog {
		if re != nil && !re.MatchString(s.Name) {
			continue
		}
		// The short suite leaves out scenarios marked LongOnly (named
		// here, with the reason), unless -chaos.run asks for them.
		if s.LongOnly != "" && *budget == 0 && re == nil {
			t.Logf("%s runs in `make chaos` only: %s", s.Name, s.LongOnly)
			continue
		}
		selected = append(selected, s)
	}
	if len(selected) == 0 {
		t.Fatalf("no scenario matches %q", *only)
	}
	art := *artifacts
	if art == "" {
		art = filepath.Join(os.TempDir(), fmt.Sprintf("relayd-chaos-%d", time.Now().Unix()))
	}
	// Two lanes run side by side, each one scenario at a time: the shared
	// servers of TestMain, and a second set for the scenarios that restart
	// their servers (RestartsServers) — with the JetStream cluster ones,
	// which bring their own NATS, to even the lanes out. Most of a run is
	// waiting (the writer's pace, faults, drains), so two at once halve
	// the suite's time on 2 cores without starving either.
	shared := &scenario.Env{K8s: k8s, NATS: nats, RelaydBin: bin, ArtifactDir: art}
	var own *scenario.Env
	for _, s := range selected {
		if ownLane(s) && own == nil {
			own = &scenario.Env{K8s: testenv.StartT(t, testenv.Options{}), NATS: testenv.NATST(t, testenv.NATSOptions{}), RelaydBin: bin, ArtifactDir: art}
		}
	}
	for _, s := range selected {
		e := shared
		if ownLane(s) {
			e = own
		}
		if s.NoWatchCache && e.K8sNoWC == nil {
			e.K8sNoWC = testenv.StartT(t, testenv.Options{DisableWatchCache: true})
		}
	}
	s0 := *seed
	if s0 == 0 {
		s0 = uint64(time.Now().UnixNano() % 1e6)
	}
	short := scenario.Params{Writes: 250, WriteFor: 8 * time.Second, Pace: 30 * time.Millisecond, Objects: 12, DrainTimeout: 60 * time.Second}
	long := scenario.Params{Writes: 2000, WriteFor: 30 * time.Second, Pace: 20 * time.Millisecond, Objects: 40, DrainTimeout: 120 * time.Second}
	short.Filter, long.Filter = *filter, *filter
	var (
		mu      sync.Mutex
		results []scenario.Result
	)
	start := time.Now()
	// lane runs its scenarios in order: every scenario once; with a
	// budget, more rounds follow while a scenario's last duration still
	// fits into what is left.
	lane := func(t *testing.T, env *scenario.Env, mine func(scenario.Scenario) bool) {
		last := map[string]time.Duration{} // each scenario's last duration
		for round := 0; round == 0 || *budget > 0; round++ {
			ran := false
			for i, s := range selected {
				if !mine(s) || round > 0 && time.Since(start)+last[s.Name] > *budget {
					continue
				}
				ran = true
				p := short
				if *budget > 0 {
					p = long
				}
				p.Seed = s0 + uint64(round*len(selected)+i)
				name := s.Name
				if *budget > 0 {
					name = fmt.Sprintf("%s/seed-%d", s.Name, p.Seed)
				}
				t.Run(name, func(t *testing.T) {
					env.Logf = t.Logf
					res := scenario.Execute(t.Context(), env, s, p)
					mu.Lock()
					results = append(results, res)
					mu.Unlock()
					last[s.Name] = res.Duration
					t.Logf("%s seed %d: %d acknowledged writes, %d faults %v, %d relayd restarts (%d failpoint crashes), %s in %v",
						s.Name, p.Seed, res.Writes, len(res.Faults), faultKinds(res), res.Restarts, res.Crashes, res.Report.Summary(), res.Duration.Round(time.Second))
					if res.Report.ReferenceChanges == 0 {
						t.Errorf("no reference changes: the writer wrote nothing")
					}
					if res.Err != nil {
						t.Errorf("run: %v", res.Err)
					}
					if !res.Report.OK() {
						t.Errorf("history check failed")
					}
					if !res.OK() {
						t.Errorf("history: %s\nrelayd logs: %s\nre-check: go run ./internal/chaos/cmd/recheck -all %s", res.HistoryFile, res.RelaydLogDir, res.HistoryFile)
					}
				})
			}
			if !ran {
				break
			}
		}
	}
	t.Run("lanes", func(t *testing.T) {
		t.Run("shared", func(t *testing.T) {
			t.Parallel()
			lane(t, shared, func(s scenario.Scenario) bool { return !ownLane(s) })
		})
		if own != nil {
			t.Run("own", func(t *testing.T) {
				t.Parallel()
				lane(t, own, ownLane)
			})
		}
	})
	t.Logf("%d runs in %v", len(results), time.Since(start).Round(time.Second))
	md := Table(results)
	t.Logf("results:\n%s", md)
	if *table != "" {
		if err := os.WriteFile(*table, []byte(md), 0o644); err != nil {
			t.Error(err)
		}
	}
}

// ownLane reports whether s runs in the lane of servers of its own: it
// restarts them, or it brings its own NATS (JetStream cluster).
func ownLane(s scenario.Scenario) bool {
	return s.RestartsServers || s.NATSCluster > 0
}

func faultKinds(r scenario.Result) map[string]int {
	m := map[string]int{}
	for _, f := range r.Faults {
		if f.Kind != "error" { // a failed injection is a run error, not a fault
			m[f.Kind]++
		}
	}
	if r.Crashes > 0 {
		m["failpoint-kill"] = r.Crashes
	}
	return m
}

// Table renders the results as markdown, one row per scenario (runs of the
// same scenario summed).
func Table(results []scenario.Result) string {
	type row struct {
		runs, events, objs, faults, lost, dups, covered, gapDel, failed int
		kinds, checks, relists                                          map[string]int
	}
	rows := map[string]*row{}
	var order []string
	for _, r := range results {
		x := rows[r.Scenario]
		if x == nil {
			x = &row{kinds: map[string]int{}, checks: map[string]int{}, relists: map[string]int{}}
			rows[r.Scenario] = x
			order = append(order, r.Scenario)
		}
		x.runs++
		x.events += r.Report.ReferenceChanges
		x.objs += r.Report.ObjectMessages
		x.lost += r.Report.Lost()
		x.dups += r.Report.Duplicates
		x.covered += r.Report.CoveredByResync
		x.gapDel += r.Report.GapDeletes
		for k, n := range faultKinds(r) {
			x.kinds[k] += n
			x.faults += n
		}
		for why, n := range r.Report.Relists {
			x.relists[why] += n
		}
		for _, f := range r.Report.Failures {
			if f.Check != "lost" {
				x.checks[f.Check]++
			}
		}
		if r.Err != nil {
			x.checks["run error"]++
		}
		if !r.OK() {
			x.failed++
		}
	}
	var b strings.Builder
	b.WriteString("| scenario | runs | events (reference) | object messages | faults injected | lost | other failures | relists (what explained them) | covered by resync | gap deletes reported | duplicates on stream | outcome |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, name := range order {
		x := rows[name]
		var ks []string
		for k, n := range x.kinds {
			ks = append(ks, fmt.Sprintf("%s×%d", k, n))
		}
		sort.Strings(ks)
		outcome := "pass"
		if x.failed > 0 {
			outcome = fmt.Sprintf("**FAIL** (%d of %d runs)", x.failed, x.runs)
		}
		var cs []string
		for k, n := range x.checks {
			cs = append(cs, fmt.Sprintf("%s×%d", k, n))
		}
		sort.Strings(cs)
		other := "0"
		if len(cs) > 0 {
			other = strings.Join(cs, ", ")
		}
		var rs []string
		for k, n := range x.relists {
			rs = append(rs, fmt.Sprintf("%s×%d", k, n))
		}
		sort.Strings(rs)
		relists := "0"
		if len(rs) > 0 {
			relists = strings.Join(rs, ", ")
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d (%s) | %d | %s | %s | %d | %d | %d | %s |\n", name, x.runs, x.events, x.objs, x.faults, strings.Join(ks, ", "), x.lost, other, relists, x.covered, x.gapDel, x.dups, outcome)
	}
	return b.String()
}

// TestCheckerCatchesTamperedStream runs a kill -9 scenario and then deletes
// the stream's last object event: the live pipeline (writer, etcd
// reference, reader, final LIST, checker) must report it as lost and stale,
// and the history written for the failed run must re-check the same way.
func TestCheckerCatchesTamperedStream(t *testing.T) {
	var deleted uint64
	s := scenario.Scenario{
		Name: "tamper", MinFaults: 1,
		Faults: func(ctx context.Context, r *scenario.Run) {
			if scenario.Sleep(ctx, time.Second) {
				r.Kill9()
			}
		},
		Tamper: func(ctx context.Context, js jetstream.JetStream, stream string) error {
			st, err := js.Stream(ctx, stream)
			if err != nil {
				return err
			}
			info, err := st.Info(ctx)
			if err != nil {
				return err
			}
			for seq := info.State.LastSeq; seq > 0; seq-- {
				m, err := st.GetMsg(ctx, seq)
				if err != nil {
					return err
				}
				if strings.Contains(m.Subject, "._relayd.") {
					continue
				}
				deleted = seq
				return st.DeleteMsg(ctx, seq)
			}
			return fmt.Errorf("no object event on the stream")
		},
	}
	env := &scenario.Env{K8s: k8s, NATS: nats, RelaydBin: bin, ArtifactDir: t.TempDir(), Logf: t.Logf}
	res := scenario.Execute(t.Context(), env, s, scenario.Params{Seed: 42, Writes: 60, WriteFor: 4 * time.Second, Pace: 30 * time.Millisecond, Objects: 5, DrainTimeout: 60 * time.Second})
	if res.Err != nil {
		t.Fatalf("run: %v", res.Err)
	}
	t.Logf("deleted message %d: %s", deleted, res.Report.Summary())
	if res.Report.OK() || res.Report.Lost() != 1 {
		t.Errorf("the checker did not report exactly one lost change: %s", res.Report.Summary())
	}
	stale := 0
	for _, f := range res.Report.Failures {
		if f.Check == "final" {
			stale++
		}
	}
	if stale != 1 {
		t.Errorf("final-state findings %d, want 1 (the deleted event was the object's last)", stale)
	}
	h, err := history.Load(res.HistoryFile)
	if err != nil {
		t.Fatalf("the failed run's history: %v", err)
	}
	if again := history.Check(h); again.Summary() != res.Report.Summary() {
		t.Errorf("re-check differs:\n%s\n%s", again.Summary(), res.Report.Summary())
	}
}
