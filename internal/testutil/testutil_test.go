package testutil

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// fatalTB records Fatalf and ends the goroutine as testing.T does.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}
func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// run calls fn with a fatalTB in its own goroutine and returns what it
// failed with ("" if it did not).
func run(t *testing.T, fn func(tb testing.TB)) string {
	f := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(f)
	}()
	<-done
	return f.msg
}

func TestEventuallyReturnsOnceTheConditionHolds(t *testing.T) {
	n := 0
	msg := run(t, func(tb testing.TB) {
		Eventually(tb, 5*time.Second, "third try", func() error {
			if n++; n < 3 {
				return fmt.Errorf("try %d", n)
			}
			return nil
		})
	})
	if msg != "" || n != 3 {
		t.Fatalf("failed with %q after %d tries, want success at the third", msg, n)
	}
}

func TestEventuallyFailsWithTheLastError(t *testing.T) {
	msg := run(t, func(tb testing.TB) {
		Eventually(tb, 120*time.Millisecond, "never", func() error { return errors.New("still not") })
	})
	if !strings.Contains(msg, "never: not within 120ms: still not") {
		t.Fatalf("failed with %q", msg)
	}
}

func TestEventuallyUnlessStopsAtOnce(t *testing.T) {
	tries := 0
	start := time.Now()
	msg := run(t, func(tb testing.TB) {
		EventuallyUnless(tb, time.Minute, "ready", func() error { return errors.New("relayd exited") },
			func() error { tries++; return errors.New("503") })
	})
	if tries != 1 || time.Since(start) > 10*time.Second || !strings.Contains(msg, "ready: relayd exited while waiting; last: 503") {
		t.Fatalf("after %d tries: %q", tries, msg)
	}
}

func TestRepoRootHoldsRelaydsGoMod(t *testing.T) {
	dir := RepoRootT(t)
	b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil || !strings.HasPrefix(string(b), "module github.com/relayd/relayd\n") {
		t.Fatalf("%s: %v %.40q", dir, err, b)
	}
	if _, err := os.Stat(filepath.Join(dir, "internal", "testutil", "testutil.go")); err != nil {
		t.Fatal(err)
	}
}

func TestGoldenNamesTheFileAndTheFormat(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.golden")
	if b := Golden(t, path, []byte("v1"), true, "the x format"); string(b) != "v1" {
		t.Fatalf("written %q", b)
	}
	rec := &errorTB{TB: t}
	Golden(rec, path, []byte("v2"), false, "the x format")
	if !strings.Contains(rec.msg, path) || !strings.Contains(rec.msg, "the x format changed") || !strings.Contains(rec.msg, `got: "v2"`) {
		t.Fatalf("failure %q", rec.msg)
	}
}

// errorTB records Errorf.
type errorTB struct {
	testing.TB
	msg string
}

func (e *errorTB) Helper() {}
func (e *errorTB) Errorf(format string, args ...any) {
	e.msg = fmt.Sprintf(format, args...)
}
