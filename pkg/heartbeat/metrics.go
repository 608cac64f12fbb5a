package heartbeat

import "github.com/prometheus/client_golang/prometheus"

// Results of a heartbeat due: the result label of relayd_heartbeats_total.
const (
	ResultPublished = "published" // acknowledged by JetStream
	ResultFailed    = "failed"    // not sent (NATS down) or not acknowledged; the next is due an interval later
	ResultStalled   = "stalled"   // withheld: the watch's pipeline acknowledged nothing for an interval with entries waiting
)

// Metrics are the heartbeats' (docs/OPERATIONS.md, "Metrics"). Construct
// with NewMetrics.
type Metrics struct {
	Heartbeats *prometheus.CounterVec // source, result
}

// NewMetrics creates the heartbeats' metrics and registers them on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{Heartbeats: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "relayd_heartbeats_total",
		Help: "Heartbeats due for the running watches, by source and result: published (acknowledged), failed (not sent or not acknowledged), stalled (withheld: the watch's publishes made no progress for an interval).",
	}, []string{"source", "result"})}
	if err := reg.Register(m.Heartbeats); err != nil {
		return nil, err
	}
	return m, nil
}

// InitSource pre-creates the source's series.
func (m *Metrics) InitSource(source string) {
	for _, r := range []string{ResultPublished, ResultFailed, ResultStalled} {
		m.Heartbeats.WithLabelValues(source, r)
	}
}
