package main

import (
	"encoding/json"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/relayd/relayd/pkg/event"
)

// heartbeatData is the part of a heartbeat's data the watchdog uses
// (docs/CONSUMING.md, "Heartbeats").
type heartbeatData struct {
	Namespace       string  `json:"namespace"`
	IntervalSeconds float64 `json:"intervalSeconds"`
}

// Watchdog detects an absent or stalled relayd from the stream alone
// (docs/CONSUMING.md, "Heartbeats"): it keeps, per (source, namespace),
// the time of the newest heartbeat and its interval, and Check logs
// "heartbeat missing" once for each whose next heartbeat is 2 intervals
// overdue, and "heartbeat resumed" when one arrives again. It judges only
// while the consumer is caught up with the stream (a consumer reading a
// backlog reads old heartbeats: that is its own lag, not relayd's), and
// only the watches it saw a heartbeat of since it started. Safe for
// concurrent use.
type Watchdog struct {
	log *slog.Logger

	mu       sync.Mutex
	beats    map[watchKey]*lastBeat
	caughtUp bool
}

type watchKey struct{ source, namespace string }

type lastBeat struct {
	at       time.Time // the heartbeat's time
	interval time.Duration
	missing  bool // "heartbeat missing" was logged, not yet "resumed"
}

// NewWatchdog returns a Watchdog that logs to log.
func NewWatchdog(log *slog.Logger) *Watchdog {
	return &Watchdog{log: log, beats: map[watchKey]*lastBeat{}}
}

// Beat records a heartbeat (env, a checked heartbeat); pending is how many
// messages the consumer has yet to read after it (0: caught up).
func (w *Watchdog) Beat(env *event.Envelope, pending uint64) error {
	var d heartbeatData
	if err := json.Unmarshal(env.Data, &d); err != nil {
		return unusable("heartbeat data: %v", err)
	}
	if d.Namespace != env.K8sNamespace || d.IntervalSeconds <= 0 {
		return unusable("heartbeat of namespace %q, k8snamespace %q, intervalSeconds %v", d.Namespace, env.K8sNamespace, d.IntervalSeconds)
	}
	k := watchKey{env.RelaydSource, env.K8sNamespace}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.caughtUp = pending == 0
	b := w.beats[k]
	if b == nil {
		b = &lastBeat{}
		w.beats[k] = b
	}
	if env.Time.Before(b.at) {
		return nil // an older one, read late
	}
	b.at, b.interval = env.Time, time.Duration(d.IntervalSeconds*float64(time.Second))
	if b.missing {
		b.missing = false
		w.log.Info("heartbeat resumed", "source", k.source, "namespace", k.namespace, "time", env.Time)
	}
	return nil
}

// Seen notes that the consumer read a message other than a heartbeat,
// with pending messages after it.
func (w *Watchdog) Seen(pending uint64) {
	w.mu.Lock()
	w.caughtUp = pending == 0
	w.mu.Unlock()
}

// Check logs "heartbeat missing" for every watch whose newest heartbeat is
// more than 2 intervals older than now, once per outage, and returns them
// ("source/namespace", sorted).
func (w *Watchdog) Check(now time.Time) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.caughtUp {
		return nil
	}
	var out []string
	for k, b := range w.beats {
		if b.missing || now.Sub(b.at) <= 2*b.interval {
			continue
		}
		b.missing = true
		w.log.Warn("heartbeat missing: relayd is down, not running the source, or the watch is down or stalled",
			"source", k.source, "namespace", k.namespace, "last", b.at, "interval", b.interval, "overdue", now.Sub(b.at)-b.interval)
		out = append(out, k.source+"/"+k.namespace)
	}
	sort.Strings(out)
	return out
}
