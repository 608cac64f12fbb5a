package bench

import (
	"strings"
	"testing"
)

// TestScaleWatchGoals: the per-namespace goals of time and memory are
// judged at 10,000 namespaces (the memory per watch by the slope), shown
// but not judged below it.
func TestScaleWatchGoals(t *testing.T) {
	at := func(r *ScaleReport, prefix string) Goal {
		t.Helper()
		for _, g := range r.Goals() {
			if strings.HasPrefix(g.What, prefix) {
				return g
			}
		}
		t.Fatalf("no goal %q", prefix)
		return Goal{}
	}
	full := &ScaleReport{Options: ScaleOptions{Steps: []string{StepNamespaces}}, MemoryPerWatch: 80 << 10,
		Namespaces: []NamespacePoint{{Namespaces: 1}, {Namespaces: 10_000, FirstChange: 30, Ready: 31, Goroutines: 20_000,
			Restart: RestartResult{Ready: 16, FirstChange: 20}}}}
	small := &ScaleReport{Options: ScaleOptions{Steps: []string{StepNamespaces}}, MemoryPerWatch: 10 << 10,
		Namespaces: []NamespacePoint{{Namespaces: 1}, {Namespaces: 100, FirstChange: 90, Restart: RestartResult{FirstChange: 1}}}}
	for _, c := range []struct {
		r                *ScaleReport
		prefix           string
		met, notMeasured bool
		measured, miss   string
	}{
		{full, "per-namespace watches: start → a change in the last", true, false, "30.00 s at 10000 namespaces", ""},
		{full, "per-namespace watches: graceful restart", false, false, "20.00 s at 10000 namespaces", "1.33× the goal"},
		{full, "per-namespace watches: memory per watch", false, false, "80.0 KB over 2 sizes up to 10000 (2 goroutines per watch)", "1.25× the goal"},
		{small, "per-namespace watches: start → a change in the last", false, true, "90.00 s at 100 namespaces", "run at 100 namespaces, the goal is at 10000 (a smoke run)"},
		{small, "per-namespace watches: memory per watch", false, true, "10.0 KB", "(a smoke run)"},
	} {
		g := at(c.r, c.prefix)
		if g.Met != c.met || g.NotMeasured != c.notMeasured || !strings.Contains(g.Measured, c.measured) || !strings.Contains(g.Miss, c.miss) {
			t.Errorf("%s: met %v, not measured %v, measured %q, miss %q; want %v, %v, %q, %q",
				g.What, g.Met, g.NotMeasured, g.Measured, g.Miss, c.met, c.notMeasured, c.measured, c.miss)
		}
	}
}
