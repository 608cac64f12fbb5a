// Package version holds build information stamped by the Makefile with
// -ldflags "-X github.com/relayd/relayd/internal/version.Version=...".
package version

import (
	"runtime"
	"strconv"

	"github.com/relayd/relayd/internal/failpoint"
)

// Stamped at build time; defaults for `go run` and tests.
var (
	Version   = "dev"
	Commit    = "unknown"
	BuildDate = "unknown"
)

// GoVersion is the Go toolchain that built the binary.
func GoVersion() string { return runtime.Version() }

// Failpoints reports whether the binary was built with the "failpoints"
// build tag (internal/failpoint): true only for the reliability suite's
// builds (docs/RELIABILITY.md), never for a shipped one. It follows from
// the build tag, so no -ldflags can set it.
func Failpoints() bool { return failpoint.Enabled }

// TestBuild reports whether the binary was built with the "testbuild"
// build tag: a test build (bin/relayd-test, the chaos suite's), which
// honours the tests' switches (RELAYD_INDEX_CHECK). The shipped binary is
// never one. It follows from the build tag, so no -ldflags can set it.
func TestBuild() bool { return testBuild }

// String is the one-line form printed by `relayd version`, e.g.
//
//	relayd v1.4.0 (commit 9520d9a, built 2026-11-24T07:00:00Z, go1.26.0, failpoints=false)
//
// A test build (TestBuild) adds ", testbuild=true" after failpoints.
func String() string {
	s := "relayd " + Version + " (commit " + Commit + ", built " + BuildDate + ", " + GoVersion() +
		", failpoints=" + strconv.FormatBool(Failpoints())
	if TestBuild() {
		s += ", testbuild=true"
	}
	return s + ")"
}
