//go:build testbuild

package main

import (
	"github.com/relayd/relayd/internal/indexcheck"
	"github.com/relayd/relayd/pkg/relay"
)

// indexCheck, in a test build (-tags testbuild: bin/relayd-test, the
// chaos suite's build), is the index consistency check when getenv says
// RELAYD_INDEX_CHECK=1 (docs/RELIABILITY.md).
func indexCheck(getenv func(string) string) relay.IndexCheckFunc {
	if getenv(indexcheck.EnvVar) != "1" {
		return nil
	}
	return indexcheck.NewHook
}
