package scenario

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/relayd/relayd/internal/chaos/history"
)

// configState is what ChangeFilter needs: relayd's config file, its text,
// and the filtered source's current filter spelling.
type configState struct {
	path, text string
	filter     string // the scoped source's filter as written now ("": no filtered source)
	changes    int
}

// ChangeFilter rewrites the scoped source's filter to another spelling of
// the same expression (`(<filter>) && <n> > 0`: the same objects in scope,
// so the checker's Go equivalent still holds, but another hash), records
// a config-changed fault of the source and restarts relayd with SIGKILL:
// it starts with a filter its checkpoint was not written under and
// relists the source (reason config-changed). It reports false if the
// run has no filtered source.
func (r *Run) ChangeFilter() bool {
	c := &r.cfg
	if c.filter == "" {
		r.Fault("error", "config-changed: the run has no filtered source (Params.Filter)")
		return false
	}
	c.changes++
	text, next, ok := respell(c.text, c.filter, c.changes)
	if !ok {
		r.Fault("error", "config-changed: the filter is not in the config")
		return false
	}
	tmp := c.path + ".new"
	if err := os.WriteFile(tmp, []byte(text), 0o600); err != nil {
		r.Fault("error", "config-changed: "+err.Error())
		return false
	}
	if err := os.Rename(tmp, c.path); err != nil {
		r.Fault("error", "config-changed: "+err.Error())
		return false
	}
	c.text, c.filter = text, next
	r.FaultAt(time.Now(), history.FaultConfigChanged, fmt.Sprintf("filter spelling %d", c.changes), 0)
	r.mu.Lock()
	r.faults[len(r.faults)-1].Source = "scoped"
	r.mu.Unlock()
	r.Kill9()
	return true
}

// respell replaces the filter cur in the config text by its n-th other
// spelling, (scopeFilter) && n > 0, and returns the new text and filter;
// false if cur is not in text.
func respell(text, cur string, n int) (string, string, bool) {
	next := fmt.Sprintf("(%s) && %d > 0", scopeFilter, n)
	out := strings.Replace(text, fmt.Sprintf("filter: %q", cur), fmt.Sprintf("filter: %q", next), 1)
	return out, next, out != text
}

// Resync runs `relayd resync` of source (with --full if full) and records
// the request (resync-requested, before it is sent). The command waits for
// the resync to complete (at most wait); relayd may be killed meanwhile, so
// its failure is logged, not a run error.
func (r *Run) Resync(ctx context.Context, source string, full bool, wait time.Duration) {
	detail := "default"
	args := []string{"resync", "-c", r.cfg.path, "--source", source, "--timeout", "5s", "--wait", wait.String()}
	if full {
		detail = "full"
		args = append(args, "--full")
	}
	r.FaultAt(time.Now(), history.FaultResyncRequested, detail, 0)
	r.mu.Lock()
	r.faults[len(r.faults)-1].Source = source
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), wait+10*time.Second)
	defer cancel()
	// Sent again (same id: the same resync) while no relayd serves the
	// source yet (it is starting), for up to 10 s.
	args = append(args, "--id", fmt.Sprintf("chaos-%d", time.Now().UnixNano()))
	for deadline := time.Now().Add(10 * time.Second); ; {
		out, err := exec.CommandContext(ctx, r.Env.RelaydBin, args...).CombinedOutput()
		if err != nil && strings.Contains(string(out), "no relayd serves the source") && time.Now().Before(deadline) && Sleep(ctx, 300*time.Millisecond) {
			continue
		}
		if r.Env.Logf != nil {
			r.Env.Logf("relayd resync --source %s (%s): %v: %s", source, detail, err, strings.TrimSpace(string(out)))
		}
		return
	}
}

// resyncSources are the sources a requested resync picks from: the plain
// ones, and those whose events the checker probes or filters.
var resyncSources = []string{"cms", "widgets", "dropped", "scoped"}

// relistScenarios change the filtered source's config and request
// resyncs while relayd is killed: the relists of reason config-changed and
// requested under faults.
var relistScenarios = []Scenario{
	{
		// The filter's spelling changes and relayd restarts with it; half
		// the time it is killed again 0.1–0.6 s later, during (or right
		// after) the config-changed relist: the next start relists again,
		// from the same position (its checkpoint keeps the old filter's
		// hash until a relist completes).
		Name: "config-changed", MinFaults: 4,
		Faults: func(ctx context.Context, r *Run) {
			for quiet(ctx, r) {
				if !r.ChangeFilter() {
					return
				}
				if r.Rng.IntN(2) == 0 && Sleep(ctx, r.Between(100*time.Millisecond, 600*time.Millisecond)) {
					r.Kill9()
				}
			}
		},
	},
	{
		// A resync requested while relayd recovers from a 410: etcd is
		// compacted while relayd is down (as in compaction-410), and right
		// as it starts again, relisting (expired), relayd resync of a
		// random source, by default or --full, is sent (again until a
		// relayd serves it).
		Name: "resync-during-410", NoWatchCache: true, MinFaults: 4,
		Faults: func(ctx context.Context, r *Run) {
			var wg sync.WaitGroup
			defer wg.Wait()
			for i := 0; quiet(ctx, r); i++ {
				r.Down(ctx, r.Between(time.Second, 2*time.Second), func() { r.Compact(ctx) })
				src, full := resyncSources[r.Rng.IntN(len(resyncSources))], i%2 == 1
				wg.Add(1)
				go func() { defer wg.Done(); r.Resync(ctx, src, full, 20*time.Second) }()
			}
		},
	},
	{
		// relayd resync of a random source, by default or --full, while
		// relayd is killed now and then — sometimes 0.1–0.5 s into the
		// resync (the request dies with the process: the list is not
		// redone). Each request waits at most 20 s.
		Name: "resync-requested", MinFaults: 4,
		Faults: func(ctx context.Context, r *Run) {
			var wg sync.WaitGroup
			defer wg.Wait()
			for i := 0; quiet(ctx, r); i++ {
				if i%3 == 2 {
					r.Kill9()
					continue
				}
				src, full := resyncSources[r.Rng.IntN(len(resyncSources))], i%3 == 1
				wg.Add(1)
				go func() { defer wg.Done(); r.Resync(ctx, src, full, 20*time.Second) }()
				if r.Rng.IntN(3) == 0 && Sleep(ctx, r.Between(100*time.Millisecond, 500*time.Millisecond)) {
					r.Kill9()
				}
			}
		},
	},
}
