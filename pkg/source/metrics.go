package source

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/relayd/relayd/pkg/event"
)

// Restart reasons, the reason label of relayd_watch_restarts_total that a
// Watcher decides (pkg/watch adds "panic" and "resolve"); a fixed set so
// label values stay bounded.
const (
	ReasonExpired   = "expired"   // 410: history compacted
	ReasonTimeout   = "timeout"   // the server ended the watch at timeoutSeconds
	ReasonIdle      = "idle"      // no frame for watch.idleTimeout (client-side)
	ReasonClosed    = "closed"    // the stream ended early (network, apiserver restart)
	ReasonForbidden = "forbidden" // RBAC refused list/watch
	ReasonNotFound  = "not-found" // kind/namespace not served (e.g. CRD deleted)
	ReasonError     = "error"     // anything else
	ReasonOversized = "oversized" // a watch frame or LIST item over watch.maxObjectBytes
)

// restartReasons are the reasons a Watcher counts, pre-created by InitSource.
var restartReasons = []string{ReasonExpired, ReasonTimeout, ReasonIdle, ReasonClosed, ReasonForbidden, ReasonNotFound, ReasonError, ReasonOversized}

// Metrics are the metrics of the watchers (docs/OPERATIONS.md, "Metrics"):
// what they read off the watch before publishing, their restarts and
// relists. Construct with NewMetrics.
type Metrics struct {
	WatchRestarts *prometheus.CounterVec // source, reason
	Relists       *prometheus.CounterVec // source, reason
	Bookmarks     *prometheus.CounterVec // source
	LastEvent     *prometheus.GaugeVec   // source
	LastBookmark  *prometheus.GaugeVec   // source
	Epoch         *prometheus.GaugeVec   // source
}

// NewMetrics creates the watchers' metrics and registers them on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	src := []string{"source"}
	m := &Metrics{
		WatchRestarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "relayd_watch_restarts_total", Help: "Watch requests that ended and were restarted, by reason.",
		}, []string{"source", "reason"}),
		Relists: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "relayd_relists_total", Help: "Full lists of a source (initial snapshot or recovery from 410 Expired), by reason.",
		}, []string{"source", "reason"}),
		Bookmarks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "relayd_bookmarks_total", Help: "BOOKMARK frames received.",
		}, src),
		LastEvent: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "relayd_last_event_timestamp_seconds", Help: "Unix time of the last object event read from the watch.",
		}, src),
		LastBookmark: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "relayd_last_bookmark_timestamp_seconds", Help: "Unix time of the last BOOKMARK read from the watch.",
		}, src),
		Epoch: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "relayd_source_epoch", Help: "Relist generation of the source (relaydepoch of its events).",
		}, src),
	}
	for _, c := range []prometheus.Collector{m.WatchRestarts, m.Relists, m.Bookmarks, m.LastEvent, m.LastBookmark, m.Epoch} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// InitSource pre-creates the source's series, so that alerts and
// dashboards see 0 instead of no series before the first event.
func (m *Metrics) InitSource(source string) {
	for _, r := range restartReasons {
		m.WatchRestarts.WithLabelValues(source, r)
	}
	for _, r := range event.RelistReasons {
		m.Relists.WithLabelValues(source, string(r))
	}
	m.Bookmarks.WithLabelValues(source)
	m.LastEvent.WithLabelValues(source)
	m.LastBookmark.WithLabelValues(source)
	m.Epoch.WithLabelValues(source)
}
