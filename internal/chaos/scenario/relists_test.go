package scenario

import (
	"strings"
	"testing"

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
