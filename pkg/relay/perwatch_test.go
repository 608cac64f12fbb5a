package relay_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/relayd/relayd/pkg/checkpoint"
)

// What a quiet per-namespace watch may cost (docs/PERFORMANCE.md, "Memory
// per watch"): two goroutines, its own and the HTTP/2 stream's (its
// pipeline's run only while it has entries; the bound leaves half a
// goroutine for the process's own variations), and the bytes of live heap
// and goroutine stack it holds. Measured in a clean process of a build
// without -race (TestQuietWatchesAreSmall): 2.06 goroutines and 52.5 KB per
// watch (77 KB under -race, whose frames make stacks larger; 53 KB was
// once measured under -race in a process whose earlier tests had left
// stack spans cached, which hid that); before, with a 64 KiB frame buffer, a gzip decompressor
// and a 256-entry window held for the watch's whole life and the pipeline's
// two goroutines always running, 4.07 and 180 KB.
const (
	quietWatchGoroutines = 2.5
	quietWatchBytes      = 64 << 10
)

// quietWatchNamespaces is the size of the larger source: enough watches
// that the per-watch cost stands far above the noise of the process.
const quietWatchNamespaces = 200

// TestQuietWatchesAreSmall: relayd runs in-process with a source of one
// namespace, then with a source of quietWatchNamespaces+1 namespaces, all
// quiet once their initial list is relayed; the difference, per watch, in
// goroutines and in live heap plus stack bytes (runtime.MemStats after a
// GC) is bounded. The source has a filter: its compiled expression
// (~90 KB) is the source's, shared by the watches.
//
// The whole process is measured, so the measurement runs in a clean one:
// the test binary again, running only this test (quietWatchesChild set;
// it starts servers of its own) built without -race, which warms up with
// one unmeasured run, then measures once and judges that.
// Whatever earlier tests of this process left running cannot count.
func TestQuietWatchesAreSmall(t *testing.T) {
	if os.Getenv(quietWatchesChild) != "" {
		// A first run of relayd in the process makes what every later one
		// shares (the client libraries' caches, the runtime's spans); it
		// is not measured, so that the two measured runs differ by their
		// watches only.
		quietWatchesSample(t, 0)
		one := quietWatchesSample(t, 0)
		many := quietWatchesSample(t, quietWatchNamespaces)
		g := float64(many.goroutines-one.goroutines) / quietWatchNamespaces
		b := (float64(many.bytes) - float64(one.bytes)) / quietWatchNamespaces
		t.Logf("%s 1 watch: %d goroutines, %d B; %d watches: %d goroutines, %d B; per watch: %.2f goroutines, %.0f B",
			quietWatchesLine, one.goroutines, one.bytes, quietWatchNamespaces+1, many.goroutines, many.bytes, g, b)
		if g > quietWatchGoroutines {
			t.Errorf("%.2f goroutines per quiet watch, want at most %.1f", g, quietWatchGoroutines)
		}
		if b > quietWatchBytes {
			t.Errorf("%.0f bytes of live heap and stack per quiet watch, want at most %d", b, quietWatchBytes)
		}
		return
	}
	// The measured process is the package's test binary built as relayd
	// ships (without -race, whose instrumented frames make every goroutine
	// stack larger: 77 KB per watch under -race, in a clean process).
	exe := filepath.Join(t.TempDir(), "relay.test")
	var flags []string
	for _, f := range strings.Fields(os.Getenv("GOFLAGS")) {
		if f != "-race" {
			flags = append(flags, f)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, "go", "test", "-c", "-o", exe, ".")
	build.Env = append(os.Environ(), "GOFLAGS="+strings.Join(flags, " "))
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the test binary without -race: %v\n%s", err, out)
	}
	cmd := exec.CommandContext(ctx, exe, "-test.run=^TestQuietWatchesAreSmall$", "-test.count=1", "-test.v", "-test.timeout=5m")
	cmd.Env = append(os.Environ(), quietWatchesChild+"=1")
	out, err := cmd.CombinedOutput()
	var measured string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, quietWatchesLine) {
			measured = strings.TrimSpace(l)
		}
	}
	t.Logf("measured in a process of its own: %s", measured)
	if err != nil || measured == "" {
		t.Errorf("the measurement in a process of its own failed (%v) or measured nothing; its output:\n%s", err, out)
	}
}

// quietWatchesChild, set in the environment, makes TestQuietWatchesAreSmall
// take its measurement (in a process of its own); quietWatchesLine marks
// the measurement in its output.
const (
	quietWatchesChild = "RELAYD_TEST_QUIET_WATCHES_CHILD"
	quietWatchesLine  = "quiet watches measured:"
)

type watchesSample struct {
	goroutines int
	bytes      uint64 // live heap and goroutine stacks
}

// quietWatchesSample runs relayd with a source of n+1 namespaces (each with
// no object), waits until every watch is checkpointed, and samples the
// process with relayd running, at the smallest of a few samples a second
// apart (goroutines and garbage of the start-up ending).
func quietWatchesSample(t *testing.T, n int) watchesSample {
	names := make([]string, n+1)
	names[0] = "$NS"
	for i := 1; i <= n; i++ {
		names[i] = fmt.Sprintf("$NS-%d", i)
	}
	f := newFixture(t, env, natsSrv, `
  - name: cms
    apiVersion: v1
    kind: ConfigMap
    initial: snapshot
    filter: "has(object.data) && object.data.size() > 0"
    namespaces: [`+strings.Join(names, ", ")+`]`)
	createNamespaces(t, f, n)
	r := f.start(nil, true)
	defer r.stop(t)
	f.eventually(60*time.Second, "every watch checkpointed", func() error {
		cps := f.checkpoints()
		for _, ns := range names {
			key := checkpoint.Key("cms", strings.ReplaceAll(ns, "$NS", f.ns))
			if p, ok := cps[key]; !ok || p.ResourceVersion == "" {
				return fmt.Errorf("%s: no checkpoint", key)
			}
		}
		return nil
	})
	best := watchesSample{goroutines: 1 << 30, bytes: 1 << 62}
	for range 5 {
		time.Sleep(time.Second)
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		best.goroutines = min(best.goroutines, runtime.NumGoroutine())
		best.bytes = min(best.bytes, ms.HeapAlloc+ms.StackInuse)
	}
	return best
}
