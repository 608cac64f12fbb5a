package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Ages is relayd_checkpoint_age_seconds: per source, the seconds since the
// least recently persisted position of its watches was written, computed
// when scraped, so that it grows between writes with no loop refreshing it
// (0 for a source without a write yet). A source has a series from Init
// until Delete (it stops running here); the checkpoint store reports each
// write (Persisted), and a write reported for a source without a series (a
// flush that ended after the source stopped) is ignored. Safe for
// concurrent use.
type Ages struct {
	desc *prometheus.Desc
	now  func() time.Time

	mu sync.Mutex
	at map[string]map[string]time.Time // source → checkpoint key → last write
}

// NewAges returns an empty Ages; now replaces time.Now (tests) if not nil.
func NewAges(now func() time.Time) *Ages {
	if now == nil {
		now = time.Now
	}
	return &Ages{
		desc: prometheus.NewDesc("relayd_checkpoint_age_seconds",
			"Seconds since the source's position was last persisted (0 until a first write).", []string{"source"}, nil),
		now: now,
		at:  map[string]map[string]time.Time{},
	}
}

// Init makes the source's series exist (0 until a first write); a source
// that has one keeps it.
func (a *Ages) Init(source string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.at[source] == nil {
		a.at[source] = map[string]time.Time{}
	}
}

// Persisted records that the position of key (a watch of source) was
// written at at, if the source has a series.
func (a *Ages) Persisted(source, key string, at time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if keys := a.at[source]; keys != nil {
		keys[key] = at
	}
}

// Delete removes the source's series.
func (a *Ages) Delete(source string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.at, source)
}

// Describe implements prometheus.Collector.
func (a *Ages) Describe(ch chan<- *prometheus.Desc) { ch <- a.desc }

// Collect implements prometheus.Collector.
func (a *Ages) Collect(ch chan<- prometheus.Metric) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	for source, keys := range a.at {
		var oldest time.Time
		for _, at := range keys {
			if oldest.IsZero() || at.Before(oldest) {
				oldest = at
			}
		}
		age := 0.0
		if !oldest.IsZero() {
			age = now.Sub(oldest).Seconds()
		}
		ch <- prometheus.MustNewConstMetric(a.desc, prometheus.GaugeValue, age, source)
	}
}
