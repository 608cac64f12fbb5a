// Package testutil holds the small helpers relayd's tests share: polling
// for a condition and finding the repository root. Servers are
// internal/testenv's.
package testutil

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// pollInterval is how often Eventually asks again.
const pollInterval = 50 * time.Millisecond

// Eventually calls cond until it returns nil, and fails tb with what and
// cond's last error once timeout has passed.
func Eventually(tb testing.TB, timeout time.Duration, what string, cond func() error) {
	tb.Helper()
	EventuallyUnless(tb, timeout, what, nil, cond)
}

// EventuallyUnless is Eventually that also gives up at once when stop
// (if not nil) returns an error after a failed attempt: e.g. the process
// the test waits on has exited, so waiting longer cannot help.
func EventuallyUnless(tb testing.TB, timeout time.Duration, what string, stop func() error, cond func() error) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if stop != nil {
			if serr := stop(); serr != nil {
				tb.Fatalf("%s: %v while waiting; last: %v", what, serr, err)
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s: not within %v: %v", what, timeout, err)
		}
		time.Sleep(pollInterval)
	}
}

// RepoRoot walks up from the working directory to relayd's go.mod.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.HasPrefix(string(b), "module github.com/relayd/relayd\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("relayd's go.mod not found above the working directory")
		}
		dir = parent
	}
}

// RepoRootT is RepoRoot for a test: it fails tb on error.
func RepoRootT(tb testing.TB) string {
	tb.Helper()
	dir, err := RepoRoot()
	if err != nil {
		tb.Fatal(err)
	}
	return dir
}

// Golden checks that written, what the current code writes, equals the
// golden file at path, and returns the file's bytes. With update it first
// rewrites the file from written. format names what the file pins ("the
// checkpoint format") in the failure, which says how to change it on
// purpose.
func Golden(tb testing.TB, path string, written []byte, update bool, format string) []byte {
	tb.Helper()
	if update {
		if err := os.WriteFile(path, written, 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	golden, err := os.ReadFile(path)
	if err != nil {
		tb.Fatalf("%v (create it with -update)", err)
	}
	if !bytes.Equal(written, golden) {
		tb.Errorf("the current code no longer writes %s (%s changed; if intended, freeze the old form, run with -update and describe it in docs/DEPLOY.md):\n got: %q\nwant: %q", path, format, written, golden)
	}
	return golden
}
