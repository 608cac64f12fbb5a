package watch

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/relayd/relayd/pkg/sink"
	"github.com/relayd/relayd/pkg/source"
)

// Restart reasons a watch decides itself, besides its source.Watcher's
// (source.ReasonExpired...): the reason label of
// relayd_watch_restarts_total.
const (
	ReasonResolve = "resolve" // discovery could not resolve the kind
	ReasonPanic   = "panic"   // a recovered panic in the source goroutine
)

// Metrics are the metrics of the watches (docs/OPERATIONS.md, "Metrics"):
// what they do with the events their watcher reads (filtered, suppressed,
// the object index, sync markers, oversize events) and their panics.
// Construct with NewMetrics.
type Metrics struct {
	EventsFiltered   *prometheus.CounterVec // source
	EventsSuppressed *prometheus.CounterVec // source
	ResyncMarkers    *prometheus.CounterVec // source, marker
	Oversize         *prometheus.CounterVec // source
	Unencodable      *prometheus.CounterVec // source
	TrackedObjects   *prometheus.GaugeVec   // source
	SourcePanics     *prometheus.CounterVec // source
	FilterErrors     *prometheus.CounterVec // source
	// Source is given to each watch's source.Watcher; the watch counts its
	// own restarts (ReasonResolve, ReasonPanic) in its WatchRestarts.
	Source *source.Metrics
	// Sink is the sink's; the watch counts a change it cannot encode in
	// its PublishErrors (reason "unencodable").
	Sink *sink.Metrics
}

// NewMetrics creates the watches' metrics and registers them on reg; src
// and snk are the source's and the sink's (see Metrics).
func NewMetrics(reg prometheus.Registerer, src *source.Metrics, snk *sink.Metrics) (*Metrics, error) {
	s := []string{"source"}
	m := &Metrics{
		EventsFiltered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "relayd_events_filtered_total", Help: "Events read but not published because of the source's eventTypes filter.",
		}, s),
		EventsSuppressed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "relayd_events_suppressed_total", Help: "modified events not published because the object changed only in the source's ignoreChanges fields.",
		}, s),
		ResyncMarkers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "relayd_resync_markers_total", Help: "sync.started / sync.completed control events published.",
		}, []string{"source", "marker"}),
		Oversize: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "relayd_events_oversize_total", Help: "Events sent as a reference because the object exceeded the NATS max payload.",
		}, s),
		Unencodable: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "relayd_events_unencodable_total", Help: "Events sent without data (relaydunencodable) because even the object's reference exceeded the NATS max payload; consumers must re-read the object.",
		}, s),
		TrackedObjects: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "relayd_tracked_objects", Help: "Objects in the source's object index (what relayd has published and not seen deleted).",
		}, s),
		SourcePanics: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "relayd_source_panics_total", Help: "Panics recovered in a source goroutine (the source is restarted).",
		}, s),
		FilterErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "relayd_filter_errors_total", Help: "Evaluations of the source's filter that failed; the object was kept in scope, or left out with filterOnError: exclude.",
		}, s),
		Source: src,
		Sink:   snk,
	}
	for _, c := range []prometheus.Collector{m.EventsFiltered, m.EventsSuppressed, m.ResyncMarkers, m.Oversize, m.Unencodable, m.TrackedObjects, m.SourcePanics, m.FilterErrors} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// InitSource pre-creates the source's series, so that alerts and
// dashboards see 0 instead of no series before the first event (with the
// watch's restart and publish-error reasons; the source and the sink
// pre-create theirs).
func (m *Metrics) InitSource(source string) {
	m.EventsFiltered.WithLabelValues(source)
	m.EventsSuppressed.WithLabelValues(source)
	m.ResyncMarkers.WithLabelValues(source, "started")
	m.ResyncMarkers.WithLabelValues(source, "completed")
	m.Oversize.WithLabelValues(source)
	m.Unencodable.WithLabelValues(source)
	m.TrackedObjects.WithLabelValues(source)
	m.SourcePanics.WithLabelValues(source)
	m.FilterErrors.WithLabelValues(source)
	m.Source.WatchRestarts.WithLabelValues(source, ReasonResolve)
	m.Source.WatchRestarts.WithLabelValues(source, ReasonPanic)
	m.Sink.PublishErrors.WithLabelValues(source, "unencodable")
}
