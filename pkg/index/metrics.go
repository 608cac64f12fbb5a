package index

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the metrics of the index catch-up (docs/OPERATIONS.md,
// "Metrics"). Construct with NewMetrics; StreamReader.Foreign takes
// ForeignMessages.
type Metrics struct {
	ForeignMessages *prometheus.CounterVec // source
}

// NewMetrics creates the catch-up's metrics and registers them on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		ForeignMessages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "relayd_foreign_messages_total", Help: "Messages on relayd's own subjects that another publisher wrote (another cluster's k8scluster or source, or no relayd event), read by the source's index catch-up and never applied.",
		}, []string{"source"}),
	}
	if err := reg.Register(m.ForeignMessages); err != nil {
		return nil, err
	}
	return m, nil
}

// InitSource pre-creates the source's series, so that alerts and
// dashboards see 0 instead of no series before the first message.
func (m *Metrics) InitSource(source string) { m.ForeignMessages.WithLabelValues(source) }
