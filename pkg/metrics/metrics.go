// Package metrics assembles relayd's Prometheus metrics (docs/OPERATIONS.md,
// "Metrics"). Each component defines and registers its own (source, sink,
// watch, index, checkpoint, heartbeat, resync: their NewMetrics); New registers all of them,
// with the process's own (readiness, NATS, stream, whether each source runs
// here and is up, build information, the Go and process collectors), on a
// registry the caller passes in (never the global one). All carry the
// relayd_ prefix and base units, and their only per-source label is the
// source name from the config — never an object name — so cardinality is
// bounded by the config.
package metrics

import (
	"strconv"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/relayd/relayd/internal/version"
	"github.com/relayd/relayd/pkg/checkpoint"
	"github.com/relayd/relayd/pkg/heartbeat"
	"github.com/relayd/relayd/pkg/index"
	"github.com/relayd/relayd/pkg/resync"
	"github.com/relayd/relayd/pkg/sink"
	"github.com/relayd/relayd/pkg/source"
	"github.com/relayd/relayd/pkg/watch"
)

// Metrics are the components' metrics and the process's own. Construct
// with New.
type Metrics struct {
	Source     *source.Metrics
	Sink       *sink.Metrics
	Watch      *watch.Metrics
	Index      *index.Metrics
	Checkpoint *checkpoint.Metrics
	Heartbeat  *heartbeat.Metrics
	Resync     *resync.Metrics

	NATSConnected prometheus.Gauge
	StreamUsable  prometheus.Gauge
	SourceUp      *prometheus.GaugeVec // source
	SourceLeader  *prometheus.GaugeVec // source
	// Ready is relayd_ready, computed at each scrape by the function given
	// to SetReadiness (0 until then); the reason stays on /readyz.
	Ready    prometheus.GaugeFunc
	notReady atomic.Pointer[func() string]
}

// New creates the metrics and registers them, with the Go and process
// collectors and relayd_build_info, on reg.
func New(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{}
	var err error
	if m.Source, err = source.NewMetrics(reg); err != nil {
		return nil, err
	}
	if m.Sink, err = sink.NewMetrics(reg); err != nil {
		return nil, err
	}
	if m.Watch, err = watch.NewMetrics(reg, m.Source, m.Sink); err != nil {
		return nil, err
	}
	if m.Index, err = index.NewMetrics(reg); err != nil {
		return nil, err
	}
	if m.Checkpoint, err = checkpoint.NewMetrics(reg); err != nil {
		return nil, err
	}
	if m.Heartbeat, err = heartbeat.NewMetrics(reg); err != nil {
		return nil, err
	}
	if m.Resync, err = resync.NewMetrics(reg); err != nil {
		return nil, err
	}
	m.initState()
	cs := []prometheus.Collector{
		m.NATSConnected, m.StreamUsable, m.SourceUp, m.SourceLeader, m.Ready, newBuildInfo(),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// initState creates the gauges of the state of the process and its
// sources: the NATS connection and stream, whether each source runs here
// and is up, and readiness.
func (m *Metrics) initState() {
	src := []string{"source"}
	m.StreamUsable = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "relayd_stream_usable", Help: "1 when the last stream check found the stream usable (exists, captures relayd's subjects, has a leader); /readyz says why not.",
	})
	m.NATSConnected = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "relayd_nats_connected", Help: "1 when the NATS connection is up.",
	})
	m.SourceUp = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "relayd_source_up", Help: "1 when every watch of the source is established.",
	}, src)
	m.SourceLeader = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "relayd_source_leader", Help: "1 when this replica runs the source.",
	}, src)
	m.Ready = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "relayd_ready", Help: "1 when /readyz answers 200 (computed at each scrape); /readyz says why not.",
	}, func() float64 {
		if f := m.notReady.Load(); f != nil && (*f)() == "" {
			return 1
		}
		return 0
	})
}

// SetReadiness sets what relayd_ready reports: 1 when notReady returns ""
// (the function /readyz asks), else 0.
func (m *Metrics) SetReadiness(notReady func() string) { m.notReady.Store(&notReady) }

// newBuildInfo creates relayd_build_info, set to 1 with the labels of this
// build.
func newBuildInfo() *prometheus.GaugeVec {
	buildInfo := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "relayd_build_info", Help: "Build information; always 1. failpoints is \"true\" only in a build with the failpoints tag (fault injection), never in a shipped one.",
	}, []string{"version", "revision", "goversion", "failpoints"})
	buildInfo.WithLabelValues(version.Version, version.Commit, version.GoVersion(), strconv.FormatBool(version.Failpoints())).Set(1)
	return buildInfo
}

// InitSource pre-initialises a source's label values, so that alerts and
// dashboards see 0 instead of no series before the first event.
func (m *Metrics) InitSource(source string) {
	m.Source.InitSource(source)
	m.Sink.InitSource(source)
	m.Watch.InitSource(source)
	m.Index.InitSource(source)
	m.Checkpoint.InitSource(source)
	m.Heartbeat.InitSource(source)
	m.Resync.InitSource(source)
	m.SourceUp.WithLabelValues(source)
	m.SourceLeader.WithLabelValues(source)
}
