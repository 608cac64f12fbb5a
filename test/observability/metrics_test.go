package observability

import (
	"bufio"
	"bytes"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/relayd/relayd/pkg/metrics"
)

// metricRow is one row of docs/OPERATIONS.md's metrics table.
type metricRow struct {
	Type   string
	Labels []string
}

// operationsTable returns the rows (cells trimmed) of the table with the given
// header in docs/OPERATIONS.md's "## Metrics" section.
func operationsTable(t *testing.T, header string) [][]string {
	t.Helper()
	var rows [][]string
	sc := bufio.NewScanner(bytes.NewReader(repoFile(t, "docs/OPERATIONS.md")))
	inSection, inTable := false, false
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "## ") {
			inSection, inTable = line == "## Metrics", false
			continue
		}
		if !inSection {
			continue
		}
		if !strings.HasPrefix(line, "|") {
			inTable = false
			continue
		}
		if line == header {
			inTable = true
			continue
		}
		if !inTable || strings.HasPrefix(line, "|---") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		rows = append(rows, cells)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(rows) == 0 {
		t.Fatalf("docs/OPERATIONS.md: no table %q in the \"## Metrics\" section", header)
	}
	return rows
}

// documentedMetrics parses the metrics reference table.
func documentedMetrics(t *testing.T) map[string]metricRow {
	t.Helper()
	out := map[string]metricRow{}
	for _, cells := range operationsTable(t, "| name | type | labels | meaning |") {
		if len(cells) != 4 {
			t.Errorf("docs/OPERATIONS.md metrics row has %d cells, want 4 (name, type, labels, meaning): %v", len(cells), cells)
			continue
		}
		name := strings.Trim(cells[0], "`")
		if _, dup := out[name]; dup {
			t.Errorf("docs/OPERATIONS.md lists %s twice", name)
		}
		var labels []string
		if l := cells[2]; l != "–" && l != "-" && l != "" {
			for _, s := range strings.Split(l, ",") {
				labels = append(labels, strings.TrimSpace(s))
			}
		}
		sort.Strings(labels)
		if cells[3] == "" {
			t.Errorf("docs/OPERATIONS.md: %s has no meaning", name)
		}
		out[name] = metricRow{Type: cells[1], Labels: labels}
	}
	return out
}

// registryMetrics is what metrics.New registers once a source is
// initialised, for the relayd_ names.
func registryMetrics(t *testing.T) (*prometheus.Registry, map[string]metricRow) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	m.InitSource("x")
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]metricRow{}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "relayd_") {
			continue
		}
		labels := map[string]bool{}
		for _, mt := range mf.GetMetric() {
			for _, l := range mt.GetLabel() {
				labels[l.GetName()] = true
			}
		}
		var ls []string
		for l := range labels {
			ls = append(ls, l)
		}
		sort.Strings(ls)
		out[mf.GetName()] = metricRow{Type: strings.ToLower(mf.GetType().String()), Labels: ls}
	}
	return reg, out
}

func TestMetricsTableMatchesRegistry(t *testing.T) {
	doc := documentedMetrics(t)
	reg, got := registryMetrics(t)
	for name, g := range got {
		d, ok := doc[name]
		if !ok {
			t.Errorf("docs/OPERATIONS.md metrics table lacks %s (%s, labels %v)", name, g.Type, g.Labels)
			continue
		}
		if d.Type != g.Type {
			t.Errorf("%s: docs/OPERATIONS.md says %s, registry has %s", name, d.Type, g.Type)
		}
		if !slices.Equal(d.Labels, g.Labels) {
			t.Errorf("%s: docs/OPERATIONS.md labels %v, registry has %v", name, d.Labels, g.Labels)
		}
	}
	for name := range doc {
		if _, ok := got[name]; !ok {
			t.Errorf("docs/OPERATIONS.md lists %s, which the registry does not expose", name)
		}
	}

	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("metric lint: %s: %s", p.Metric, p.Text)
	}
}
