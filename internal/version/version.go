// Package version holds build information stamped by the Makefile with
// -ldflags "-X github.com/relayd/relayd/internal/version.Version=...".
package version

import "runtime"

// Stamped at build time; defaults for `go run` and tests.
var (
	Version   = "dev"
	Commit    = "unknown"
	BuildDate = "unknown"
)

// GoVersion is the Go toolchain that built the binary.
func GoVersion() string { return runtime.Version() }

// String is the one-line form printed by `relayd version`.
func String() string {
	return "relayd " + Version + " (commit " + Commit + ", built " + BuildDate + ", " + GoVersion() + ")"
}
