package sink

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the metrics of publishing to JetStream (docs/OPERATIONS.md,
// "Metrics"): events acknowledged, the lag to the PubAck, the in-flight
// window, failures and duplicates. Construct with NewMetrics.
type Metrics struct {
	Events        *prometheus.CounterVec   // source, type, origin
	Lag           *prometheus.HistogramVec // source
	InFlight      *prometheus.GaugeVec     // source
	InFlightBytes *prometheus.GaugeVec     // source
	ProcessBytes  prometheus.Gauge         // every watch together
	// PublishErrors is also counted by pkg/watch, for a change it cannot
	// encode (reason "unencodable").
	PublishErrors *prometheus.CounterVec // source, reason
	Duplicates    *prometheus.CounterVec // source
}

// NewMetrics creates the sink's metrics and registers them on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	src := []string{"source"}
	m := &Metrics{
		Events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "relayd_events_total", Help: "Events published and acknowledged by JetStream, by source, type and origin.",
		}, []string{"source", "type", "origin"}),
		Lag: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "relayd_publish_lag_seconds",
			Help:    "Time from reading an event off the watch to its JetStream PubAck.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, src),
		InFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "relayd_publish_in_flight", Help: "Publishes sent and not yet acknowledged.",
		}, src),
		InFlightBytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "relayd_publish_in_flight_bytes", Help: "Bytes of publishes sent and not yet acknowledged (bounded by nats.maxInFlightBytes and nats.maxInFlightBytesPerWatch).",
		}, src),
		ProcessBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "relayd_publish_process_in_flight_bytes", Help: "Bytes of publishes sent and not yet acknowledged, every watch together (bounded by nats.maxInFlightBytes).",
		}),
		PublishErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "relayd_publish_errors_total", Help: "Failed publish attempts (each is retried; nothing is dropped), by reason.",
		}, []string{"source", "reason"}),
		Duplicates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "relayd_publish_duplicates_total", Help: "Publishes JetStream reported as duplicates (dropped by Nats-Msg-Id dedup).",
		}, src),
	}
	for _, c := range []prometheus.Collector{m.Events, m.Lag, m.InFlight, m.InFlightBytes, m.ProcessBytes, m.PublishErrors, m.Duplicates} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// InitSource pre-creates the source's series, so that alerts and
// dashboards see 0 instead of no series before the first event.
func (m *Metrics) InitSource(source string) {
	for _, t := range []string{"added", "modified", "deleted"} {
		for _, o := range []string{"watch", "initial", "resync"} {
			m.Events.WithLabelValues(source, t, o)
		}
	}
	m.Lag.WithLabelValues(source)
	m.InFlight.WithLabelValues(source)
	m.InFlightBytes.WithLabelValues(source)
	m.PublishErrors.WithLabelValues(source, "error")
	m.Duplicates.WithLabelValues(source)
}
