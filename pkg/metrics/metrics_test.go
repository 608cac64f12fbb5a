package metrics_test

import (
	"testing"

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
	if got := testutil.ToFloat64(m.Sink.Events.WithLabelValues("pods", "deleted", "resync")); got != 0 {
		t.Errorf("events{pods,deleted,resync} = %v", got)
	}
	if n := testutil.CollectAndCount(m.Source.WatchRestarts); n != 10 {
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
