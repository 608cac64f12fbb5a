package docs

import (
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/relayd/relayd/pkg/metrics"
)

// recorder registers on a real registry and keeps every collector, so that
// the metrics of a vector without any label values (not gathered) are
// found through their descriptions.
type recorder struct {
	*prometheus.Registry
	collectors []prometheus.Collector
}

func (r *recorder) Register(c prometheus.Collector) error {
	r.collectors = append(r.collectors, c)
	return r.Registry.Register(c)
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

var fqNameRE = regexp.MustCompile(`fqName: "([^"]+)"`)

// registeredMetrics builds the registry as relayd does (metrics.New on a
// fresh registry, one source initialised) and returns the relayd_ metric
// names it holds, each with the names Prometheus exposes for it (a
// histogram's _bucket, _sum and _count too).
func registeredMetrics(t *testing.T) (names map[string]bool, exposed map[string]string) {
	t.Helper()
	r := &recorder{Registry: prometheus.NewRegistry()}
	m, err := metrics.New(r)
	if err != nil {
		t.Fatal(err)
	}
	m.InitSource("x")
	names = map[string]bool{}
	for _, c := range r.collectors {
		ch := make(chan *prometheus.Desc, 64)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			mm := fqNameRE.FindStringSubmatch(d.String())
			if mm == nil {
				t.Fatalf("cannot read the name of %s", d)
			}
			if strings.HasPrefix(mm[1], "relayd_") {
				names[mm[1]] = true
			}
		}
	}
	if len(names) == 0 {
		t.Fatal("metrics.New registered no relayd_ metric")
	}
	mfs, err := r.Gather()
	if err != nil {
		t.Fatal(err)
	}
	exposed = map[string]string{}
	for n := range names {
		exposed[n] = n
	}
	for _, mf := range mfs {
		if t := mf.GetType().String(); names[mf.GetName()] && (t == "HISTOGRAM" || t == "SUMMARY") {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				exposed[mf.GetName()+s] = mf.GetName()
			}
		}
	}
	return names, exposed
}

// metricRE matches a relayd_ metric name in prose or code. A match that
// ends in '_' is part of a pattern (relayd_last_(event|bookmark)_…,
// relayd_*), not a name.
var metricRE = regexp.MustCompile(`\brelayd_[a-z0-9_]+`)

// TestDocumentedMetricsExist: every relayd_ metric name in README.md or
// docs/*.md is one the registry exposes. (Every registered metric being in
// docs/OPERATIONS.md's table, with its type and labels, is
// test/observability's TestMetricsTableMatchesRegistry.)
func TestDocumentedMetricsExist(t *testing.T) {
	_, exposed := registeredMetrics(t)
	seen := 0
	for _, f := range markdownFiles(t) {
		for _, loc := range metricRE.FindAllStringIndex(f.Text, -1) {
			name := f.Text[loc[0]:loc[1]]
			if strings.HasSuffix(name, "_") {
				continue
			}
			seen++
			if _, ok := exposed[name]; !ok {
				t.Errorf("%s:%d: %s is not a metric relayd exposes", f.Rel, lineOf(f.Text, loc[0]), name)
			}
		}
	}
	if seen == 0 {
		t.Fatal("no relayd_ metric name found in the docs: the scan is broken")
	}
}

// TestRegisteredMetricsAreInTheTable: every relayd_ metric the registry
// holds, also one whose vector has no label values yet (so not gathered),
// has a row in docs/OPERATIONS.md's metrics table.
func TestRegisteredMetricsAreInTheTable(t *testing.T) {
	names, _ := registeredMetrics(t)
	f := readMarkdown(t, "docs/OPERATIONS.md")
	rows, _ := table(t, f, "name", "type", "labels", "meaning")
	inTable := map[string]bool{}
	for _, row := range rows {
		if v, ok := cellValue(row[0]); ok {
			inTable[v] = true
		}
	}
	for _, n := range sortedKeys(names) {
		if !inTable[n] {
			t.Errorf("docs/OPERATIONS.md's metrics table has no row for %s", n)
		}
	}
}
