//go:build !testbuild

package main

import "github.com/relayd/relayd/pkg/relay"

// indexCheck is nil in the shipped binary: whatever the environment says
// (RELAYD_INDEX_CHECK), it runs no index consistency check, and does not
// contain one (internal/indexcheck is linked only with -tags testbuild).
func indexCheck(func(string) string) relay.IndexCheckFunc { return nil }
