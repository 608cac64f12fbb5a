package checkpoint

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the store's metrics (docs/OPERATIONS.md, "Metrics"): writes
// of the checkpoint ConfigMaps, failed writes, and per source the time of
// the oldest last write of its watches' positions. Construct with
// NewMetrics.
type Metrics struct {
	Writes prometheus.Counter
	Errors prometheus.Counter
	// LastWrite has a series for each source from InitSource, 0 until the
	// store writes a position of a source it follows (Store.Follow), gone
	// once the store stops following it (Store.Unfollow).
	LastWrite *prometheus.GaugeVec // source
}

// NewMetrics creates the store's metrics and registers them on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		Writes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "relayd_checkpoint_writes_total", Help: "Successful checkpoint ConfigMap updates.",
		}),
		Errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "relayd_checkpoint_errors_total", Help: "Failed checkpoint ConfigMap updates.",
		}),
		LastWrite: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "relayd_checkpoint_last_write_timestamp_seconds",
			Help: "Unix time of the least recent last write of the source's positions (one per watch) by this process; 0 until a first write.",
		}, []string{"source"}),
	}
	for _, c := range []prometheus.Collector{m.Writes, m.Errors, m.LastWrite} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// InitSource pre-creates the source's series (0), so that dashboards see
// the source before a first write.
func (m *Metrics) InitSource(source string) { m.LastWrite.WithLabelValues(source) }

// write counts one write of a ConfigMap: err is nil if it was stored.
func (m *Metrics) write(err error) {
	if m == nil {
		return
	}
	if err != nil {
		m.Errors.Inc()
	} else {
		m.Writes.Inc()
	}
}

// unixSeconds is t as the value of a _timestamp_seconds gauge (0 for the
// zero time).
func unixSeconds(t time.Time) float64 {
	if t.IsZero() {
		return 0
	}
	return float64(t.UnixNano()) / 1e9
}
