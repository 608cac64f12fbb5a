// Package metrics defines relayd's Prometheus metrics (docs/OPERATIONS.md, "Metrics"). They are
// registered on a registry the caller passes in (never the global one), all
// carry the relayd_ prefix and base units, and their only per-source label is
// the source name from the config — never an object name — so cardinality is
// bounded by the config.
package metrics

import (
	"strconv"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/relayd/relayd/internal/version"
	"github.com/relayd/relayd/pkg/event"
)

// Restart and relist reasons; a fixed set so label values stay bounded.
const (
	ReasonExpired   = "expired"   // 410: history compacted
	ReasonTimeout   = "timeout"   // the server ended the watch at timeoutSeconds
	ReasonIdle      = "idle"      // no frame for watch.idleTimeout (client-side)
	ReasonClosed    = "closed"    // the stream ended early (network, apiserver restart)
	ReasonForbidden = "forbidden" // RBAC refused list/watch
	ReasonNotFound  = "not-found" // kind/namespace not served (e.g. CRD deleted)
	ReasonResolve   = "resolve"   // discovery could not resolve the kind
	ReasonError     = "error"     // anything else
	ReasonOversized = "oversized" // a watch frame or LIST item over watch.maxObjectBytes
	ReasonPanic     = "panic"     // a recovered panic in the source goroutine
)

// Metrics is the full set. Construct with New.
type Metrics struct {
	Events           *prometheus.CounterVec   // source, type, origin
	EventsFiltered   *prometheus.CounterVec   // source
	EventsSuppressed *prometheus.CounterVec   // source
	WatchRestarts    *prometheus.CounterVec   // source, reason
	Relists          *prometheus.CounterVec   // source, reason
	ResyncMarkers    *prometheus.CounterVec   // source, marker
	Bookmarks        *prometheus.CounterVec   // source
	LastEvent        *prometheus.GaugeVec     // source
	LastBookmark     *prometheus.GaugeVec     // source
	Lag              *prometheus.HistogramVec // source
	InFlight         *prometheus.GaugeVec     // source
	InFlightBytes    *prometheus.GaugeVec     // source
	ProcessBytes     prometheus.Gauge         // every watch together
	PublishErrors    *prometheus.CounterVec   // source, reason
	Duplicates       *prometheus.CounterVec   // source
	Oversize         *prometheus.CounterVec   // source
	Unencodable      *prometheus.CounterVec   // source
	CheckpointWrites prometheus.Counter
	CheckpointErrors prometheus.Counter
	CheckpointAge    *Ages // source
	NATSConnected    prometheus.Gauge
	StreamUsable     prometheus.Gauge
	SourceUp         *prometheus.GaugeVec // source
	SourceLeader     *prometheus.GaugeVec // source
	TrackedObjects   *prometheus.GaugeVec // source
	Epoch            *prometheus.GaugeVec // source
	SourcePanics     *prometheus.CounterVec
	ForeignMessages  *prometheus.CounterVec // source
	// Ready is relayd_ready, computed at each scrape by the function given
	// to SetReadiness (0 until then); the reason stays on /readyz.
	Ready    prometheus.GaugeFunc
	notReady atomic.Pointer[func() string]
}

// New creates the metrics and registers them, with the Go and process
// collectors and relayd_build_info, on reg.
func New(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{}
	m.initWatch()
	m.initPublish()
	m.initCheckpoint()
	m.initState()
	cs := []prometheus.Collector{
		m.Events, m.EventsFiltered, m.EventsSuppressed, m.WatchRestarts, m.Relists, m.ResyncMarkers, m.Bookmarks,
		m.LastEvent, m.LastBookmark, m.Lag, m.InFlight, m.InFlightBytes, m.ProcessBytes, m.PublishErrors, m.Duplicates, m.Oversize, m.Unencodable,
		m.CheckpointWrites, m.CheckpointErrors, m.CheckpointAge, m.NATSConnected, m.StreamUsable, m.SourceUp,
		m.SourceLeader, m.TrackedObjects, m.Epoch, m.SourcePanics, m.ForeignMessages, m.Ready, newBuildInfo(),
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

// initWatch creates the metrics of what the watches read: frames and events
// before publishing (filtered, suppressed, bookmarks, last timestamps) and
// the watch's own lifecycle (restarts, relists, sync markers).
func (m *Metrics) initWatch() {
	src := []string{"source"}
	m.EventsFiltered = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "relayd_events_filtered_total", Help: "Events read but not published because of the source's eventTypes filter.",
	}, src)
	m.EventsSuppressed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "relayd_events_suppressed_total", Help: "modified events not published because the object changed only in the source's ignoreChanges fields.",
	}, src)
	m.WatchRestarts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "relayd_watch_restarts_total", Help: "Watch requests that ended and were restarted, by reason.",
	}, []string{"source", "reason"})
	m.Relists = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "relayd_relists_total", Help: "Full lists of a source (initial snapshot or recovery from 410 Expired), by reason.",
	}, []string{"source", "reason"})
	m.ResyncMarkers = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "relayd_resync_markers_total", Help: "sync.started / sync.completed control events published.",
	}, []string{"source", "marker"})
	m.Bookmarks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "relayd_bookmarks_total", Help: "BOOKMARK frames received.",
	}, src)
	m.LastEvent = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "relayd_last_event_timestamp_seconds", Help: "Unix time of the last object event read from the watch.",
	}, src)
	m.LastBookmark = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "relayd_last_bookmark_timestamp_seconds", Help: "Unix time of the last BOOKMARK read from the watch.",
	}, src)
}

// initPublish creates the metrics of publishing to JetStream: events
// acknowledged, the lag to the PubAck, the in-flight window, failures,
// duplicates, and oversize and unencodable events.
func (m *Metrics) initPublish() {
	src := []string{"source"}
	m.Events = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "relayd_events_total", Help: "Events published and acknowledged by JetStream, by source, type and origin.",
	}, []string{"source", "type", "origin"})
	m.Lag = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "relayd_publish_lag_seconds",
		Help:    "Time from reading an event off the watch to its JetStream PubAck.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
	}, src)
	m.InFlight = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "relayd_publish_in_flight", Help: "Publishes sent and not yet acknowledged.",
	}, src)
	m.InFlightBytes = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "relayd_publish_in_flight_bytes", Help: "Bytes of publishes sent and not yet acknowledged (bounded by nats.maxInFlightBytes and nats.maxInFlightBytesPerWatch).",
	}, src)
	m.ProcessBytes = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "relayd_publish_process_in_flight_bytes", Help: "Bytes of publishes sent and not yet acknowledged, every watch together (bounded by nats.maxInFlightBytes).",
	})
	m.PublishErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "relayd_publish_errors_total", Help: "Failed publish attempts (each is retried; nothing is dropped), by reason.",
	}, []string{"source", "reason"})
	m.Duplicates = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "relayd_publish_duplicates_total", Help: "Publishes JetStream reported as duplicates (dropped by Nats-Msg-Id dedup).",
	}, src)
	m.Oversize = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "relayd_events_oversize_total", Help: "Events sent as a reference because the object exceeded the NATS max payload.",
	}, src)
	m.Unencodable = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "relayd_events_unencodable_total", Help: "Events sent without data (relaydunencodable) because even the object's reference exceeded the NATS max payload; consumers must re-read the object.",
	}, src)
	m.ForeignMessages = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "relayd_foreign_messages_total", Help: "Messages on relayd's own subjects that another publisher wrote (another cluster's k8scluster or source, or no relayd event), read by the source's index catch-up and never applied.",
	}, src)
}

// initCheckpoint creates the metrics of the checkpoint ConfigMap: writes,
// failed writes, and the age of each source's persisted position.
func (m *Metrics) initCheckpoint() {
	m.CheckpointWrites = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "relayd_checkpoint_writes_total", Help: "Successful checkpoint ConfigMap updates.",
	})
	m.CheckpointErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "relayd_checkpoint_errors_total", Help: "Failed checkpoint ConfigMap updates.",
	})
	m.CheckpointAge = NewAges(nil)
}

// initState creates the gauges and counters of the state of the process and
// its sources: the NATS connection and stream, whether each source runs
// here and is up, its object index size and epoch, and recovered panics.
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
	m.TrackedObjects = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "relayd_tracked_objects", Help: "Objects in the source's object index (what relayd has published and not seen deleted).",
	}, src)
	m.Epoch = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "relayd_source_epoch", Help: "Relist generation of the source (relaydepoch of its events).",
	}, src)
	m.SourcePanics = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "relayd_source_panics_total", Help: "Panics recovered in a source goroutine (the source is restarted).",
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
	for _, t := range []string{"added", "modified", "deleted"} {
		for _, o := range []string{"watch", "initial", "resync"} {
			m.Events.WithLabelValues(source, t, o)
		}
	}
	m.EventsFiltered.WithLabelValues(source)
	m.EventsSuppressed.WithLabelValues(source)
	for _, r := range []string{ReasonExpired, ReasonTimeout, ReasonIdle, ReasonClosed, ReasonForbidden, ReasonNotFound, ReasonResolve, ReasonError, ReasonOversized, ReasonPanic} {
		m.WatchRestarts.WithLabelValues(source, r)
	}
	for _, r := range event.RelistReasons {
		m.Relists.WithLabelValues(source, string(r))
	}
	m.ResyncMarkers.WithLabelValues(source, "started")
	m.ResyncMarkers.WithLabelValues(source, "completed")
	m.Bookmarks.WithLabelValues(source)
	m.LastEvent.WithLabelValues(source)
	m.LastBookmark.WithLabelValues(source)
	m.Lag.WithLabelValues(source)
	m.InFlight.WithLabelValues(source)
	m.InFlightBytes.WithLabelValues(source)
	m.PublishErrors.WithLabelValues(source, "error")
	m.PublishErrors.WithLabelValues(source, "unencodable")
	m.Duplicates.WithLabelValues(source)
	m.Oversize.WithLabelValues(source)
	m.Unencodable.WithLabelValues(source)
	m.ForeignMessages.WithLabelValues(source)
	m.CheckpointAge.Init(source)
	m.SourceUp.WithLabelValues(source)
	m.SourceLeader.WithLabelValues(source)
	m.TrackedObjects.WithLabelValues(source)
	m.Epoch.WithLabelValues(source)
	m.SourcePanics.WithLabelValues(source)
}
