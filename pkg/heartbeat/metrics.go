package heartbeat

import "github.com/prometheus/client_golang/prometheus"

// Results of a heartbeat due: the result label of relayd_heartbeats_total.
const (
	ResultPublished = "published" // acknowledged by JetStream
	ResultFailed    = "failed"    // not sent (NATS down) or not acknowledged; the next is due an interval later
	ResultStalled   = "stalled"   // withheld: the watch's pipeline acknowledged nothing for an interval with entries waiting, or the watch is stuck in one object's handling
)

// Metrics are the heartbeats' (docs/OPERATIONS.md, "Metrics"). Construct
// with NewMetrics.
type Metrics struct {
	Heartbeats *prometheus.CounterVec // source, result
	Stalled    *prometheus.GaugeVec   // source
}

// NewMetrics creates the heartbeats' metrics and registers them on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{Heartbeats: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "relayd_heartbeats_total",
		Help: "Heartbeats due for the running watches, by source and result: published (acknowledged), failed (not sent or not acknowledged), stalled (withheld: the watch's publishes made no progress for an interval, or it is stuck in one object's handling).",
	}, []string{"source", "result"}),
		Stalled: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "relayd_watch_stalled",
			Help: "Watches of the source stuck in one object's handling (filter, index, encode) for longer than the stall bound (5s), as of the last heartbeat walk (every second).",
		}, []string{"source"})}
	for _, c := range []prometheus.Collector{m.Heartbeats, m.Stalled} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// InitSource pre-creates the source's series.
func (m *Metrics) InitSource(source string) {
	for _, r := range []string{ResultPublished, ResultFailed, ResultStalled} {
		m.Heartbeats.WithLabelValues(source, r)
	}
	m.Stalled.WithLabelValues(source)
}
