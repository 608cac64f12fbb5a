package scenario

import (
	"strings"
	"testing"

	"github.com/relayd/relayd/internal/chaos/history"

	yaml "go.yaml.in/yaml/v3"
)

// The filtered source's filter is respelled in the config relayd reads,
// and nothing else changes.
func TestRespellTheFilter(t *testing.T) {
	text := shapedSources("ns", true, 12).yaml
	out, next, ok := respell(text, scopeFilter, 1)
	if !ok || next != "("+scopeFilter+") && 1 > 0" {
		t.Fatalf("respell: %v, %q", ok, next)
	}
	var before, after []map[string]any
	if err := yaml.Unmarshal([]byte(text), &before); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal([]byte(out), &after); err != nil {
		t.Fatal(err)
	}
	last := len(after) - 1
	if after[last]["name"] != "scoped" || after[last]["filter"] != next {
		t.Errorf("the scoped source after: %v", after[last])
	}
	after[last]["filter"] = scopeFilter
	if b, a := strings.TrimSpace(toYAML(t, before)), strings.TrimSpace(toYAML(t, after)); b != a {
		t.Errorf("more than the filter changed:\n%s\n%s", b, a)
	}
	again, _, ok := respell(out, next, 2)
	if !ok || !strings.Contains(again, "&& 2 > 0") || strings.Contains(again, "&& 1 > 0") {
		t.Errorf("second respelling:\n%s", again)
	}
	if _, _, ok := respell(text, "no such filter", 3); ok {
		t.Errorf("a filter not in the config was respelled")
	}
}

func toYAML(t *testing.T, v any) string {
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// scopeMoves counts the changes that made an object enter and leave the
// filter's scope, as the checker maps them.
func TestScopeMoves(t *testing.T) {
	f := history.Filter{Label: "tier", Value: "gold"}
	gold := map[string]string{"tier": "gold"}
	changes := []history.Change{
		{Source: "scoped", UID: "a", Type: history.Added, Labels: gold},    // created in scope
		{Source: "scoped", UID: "a", Type: history.Modified},               // left
		{Source: "scoped", UID: "a", Type: history.Modified, Labels: gold}, // entered
		{Source: "scoped", UID: "a", Type: history.Deleted},                // deleted in scope: neither
		{Source: "scoped", UID: "b", Type: history.Added},                  // created out of scope
		{Source: "scoped", UID: "b", Type: history.Modified, Labels: gold}, // entered
		{Source: "other", UID: "c", Type: history.Modified, Labels: gold},  // another source
	}
	if e, l := scopeMoves(changes, "scoped", f); e != 2 || l != 1 {
		t.Errorf("entered %d, left %d; want 2, 1", e, l)
	}
}
