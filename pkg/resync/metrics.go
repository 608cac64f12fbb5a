package resync

import "github.com/prometheus/client_golang/prometheus"

// The result label of relayd_resync_requests_total.
const (
	ResultAccepted  = "accepted"  // a resync started
	ResultDuplicate = "duplicate" // an id accepted before: the same resync
	ResultRunning   = "running"   // refused: another resync of the source runs
	ResultTooSoon   = "too_soon"  // refused: a --full within resync.minFullInterval of the last
	ResultInvalid   = "invalid"   // refused: bad JSON, bad id, a namespace not watched
	ResultBadReply  = "bad_reply" // not answered, not acted on: a reply subject outside the inbox prefixes
)

// results are the values of the result label, pre-created per source.
var results = []string{ResultAccepted, ResultDuplicate, ResultRunning, ResultTooSoon, ResultInvalid, ResultBadReply}

// Metrics are the resync server's (docs/OPERATIONS.md, "Metrics").
// Construct with NewMetrics.
type Metrics struct {
	Requests *prometheus.CounterVec // source, result
}

// NewMetrics creates the metrics and registers them on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "relayd_resync_requests_total",
			Help: "Resync requests by result: accepted, duplicate (an id accepted before), refused (running, too_soon, invalid), or bad_reply (a reply subject outside the inbox prefixes: not answered, not acted on).",
		}, []string{"source", "result"}),
	}
	if err := reg.Register(m.Requests); err != nil {
		return nil, err
	}
	return m, nil
}

// InitSource pre-creates the source's series.
func (m *Metrics) InitSource(source string) {
	for _, r := range results {
		m.Requests.WithLabelValues(source, r)
	}
}
