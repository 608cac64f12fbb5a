package metrics_test

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/relayd/relayd/pkg/metrics"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestMetricNamesLintClean(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	m.InitSource("pods")
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
	// Pre-initialised: alerts see 0, not an absent series.
	if got := testutil.ToFloat64(m.Events.WithLabelValues("pods", "deleted", "resync")); got != 0 {
		t.Errorf("events{pods,deleted,resync} = %v", got)
	}
	if n := testutil.CollectAndCount(m.WatchRestarts); n != 10 {
		t.Errorf("watch restart reasons pre-initialised: %d series, want 10", n)
	}
}

func TestRegisteringTwiceIsAnError(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := metrics.New(reg); err != nil {
		t.Fatal(err)
	}
	if _, err := metrics.New(reg); err == nil {
		t.Fatal("second New on the same registry succeeded")
	}
}

// relayd_checkpoint_age_seconds is computed when scraped: per source, from
// the least recently written position of its watches, growing between
// writes; 0 before a first write; gone once the source is deleted.
func TestCheckpointAgeGrowsBetweenWritesWithoutUpdates(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	a := metrics.NewAges(func() time.Time { return now })
	a.Init("cms")
	a.Init("pods")
	a.Persisted("pods", "pods/a", now.Add(-10*time.Second))
	a.Persisted("pods", "pods/b", now.Add(-3*time.Second))
	want := func(step, exp string) {
		t.Helper()
		if err := testutil.CollectAndCompare(a, strings.NewReader(exp), "relayd_checkpoint_age_seconds"); err != nil {
			t.Errorf("%s: %v", step, err)
		}
	}
	const head = "# HELP relayd_checkpoint_age_seconds Seconds since the source's position was last persisted (0 until a first write).\n# TYPE relayd_checkpoint_age_seconds gauge\n"
	want("at first", head+"relayd_checkpoint_age_seconds{source=\"cms\"} 0\nrelayd_checkpoint_age_seconds{source=\"pods\"} 10\n")
	now = now.Add(5 * time.Second)
	want("5 s later", head+"relayd_checkpoint_age_seconds{source=\"cms\"} 0\nrelayd_checkpoint_age_seconds{source=\"pods\"} 15\n")
	a.Persisted("pods", "pods/a", now)
	a.Persisted("cms", "cms/x", now.Add(-time.Second))
	want("after writes", head+"relayd_checkpoint_age_seconds{source=\"cms\"} 1\nrelayd_checkpoint_age_seconds{source=\"pods\"} 8\n")
	a.Delete("pods")
	want("pods deleted", head+"relayd_checkpoint_age_seconds{source=\"cms\"} 1\n")
	// A flush that ends after the source stopped here does not bring its
	// series back; taking the source over again does, at 0.
	a.Persisted("pods", "pods/a", now)
	want("a late write of pods", head+"relayd_checkpoint_age_seconds{source=\"cms\"} 1\n")
	a.Init("pods")
	want("pods again", head+"relayd_checkpoint_age_seconds{source=\"cms\"} 1\nrelayd_checkpoint_age_seconds{source=\"pods\"} 0\n")
}
