package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
)

// A filter that compiles and passes the cost check is accepted: check-config
// exits 0 on a config that sets one (with filterOnError), as run does (the
// relay applies filters: pkg/relay's filter tests).
func TestCheckConfigAcceptsFilter(t *testing.T) {
	cfg := filepath.Join("..", "..", "pkg", "config", "testdata", "good-filter.yaml")
	var out, errb bytes.Buffer
	if code := run([]string{"check-config", "-c", cfg}, nil, &out, &errb); code != 0 || !strings.Contains(out.String(), "SUCCESS") {
		t.Errorf("check-config: exit %d\n%s%s", code, out.String(), errb.String())
	}
}
