// Package heartbeat publishes the heartbeats of the running watches
// (docs/CONSUMING.md, "Heartbeats"): every heartbeatInterval each running
// watch publishes, on <prefix>.<cluster>._relayd.<source>.heartbeat, its
// checkpointed position, the stream sequence of its last acknowledged event
// and when it last read a change, so that a consumer detects a stalled or
// absent relayd from the stream alone.
//
// One goroutine and one ticker serve the whole process, never one per
// watch (relayd runs up to 10,000 watches: docs/PERFORMANCE.md, "Memory
// per watch"). Each tick (every second) walks the running watches; a
// watch's heartbeats fall at a fixed phase of its interval, a hash of its
// checkpoint key, so that the watches' heartbeats are spread evenly over
// the interval instead of bursting at once, and each watch keeps a steady
// cadence across restarts. Heartbeats are published outside the watches'
// pipelines (sink.Sink.PublishUnordered): they are never ordered with, or
// wait behind, the watches' events, never retried (the next one is due an
// interval later), and they write no checkpoint.
//
// A heartbeat is published only for a watch that is running (its watch
// request established: watch.Watch.Beat) and that is not stalled. A watch
// is stalled when its pipeline acknowledged nothing over a whole interval
// while it had entries waiting, or when it is stuck: it has been in the
// handling of one object (filter, index, encode: watch.Watch.Handling) for
// longer than the stall bound (Options.StallAfter, 5s). A stalled watch's
// heartbeat is withheld (counted as stalled in relayd_heartbeats_total);
// a missing heartbeat is thus the one signal of an absent relayd, a watch
// that is down, and a stalled one. The walk also counts, every tick, the
// stuck watches of each source in relayd_watch_stalled, whether or not
// the source has heartbeats, and logs when a watch gets stuck and when it
// is no longer (the watch names the object once it is done with it).
//
// The walk only reads the watches (atomics, and the pipeline's and the
// checkpoints' short locks, which a stuck handler does not hold): a stuck
// watch delays neither the walk nor any other watch's heartbeat.
package heartbeat

import (
	"context"
	"errors"
	"hash/fnv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/relayd/relayd/internal/retry"
	"github.com/relayd/relayd/pkg/config"
	"github.com/relayd/relayd/pkg/event"
	"github.com/relayd/relayd/pkg/watch"
)

// DefaultTick is how often the running watches are walked: the
// granularity of the spread, and the shortest interval served exactly.
const DefaultTick = time.Second

// DefaultStallAfter is the stall bound: a watch in one object's handling
// for longer is stuck. Handling an object takes microseconds to a few
// milliseconds (docs/PERFORMANCE.md); 5s is far above any healthy one and
// short against the heartbeat intervals and the alerts' windows.
const DefaultStallAfter = 5 * time.Second

// Watch is a running watch (a *watch.Watch).
type Watch interface {
	Beat() (watch.Beat, bool)
	Key() string
	Source() *config.Source
	Namespace() string
	// Handling is how long the watch has been in its current object's
	// handling at now (0: it is not handling one); beyond bound the watch
	// notes it is stuck (it names the object once it is done with it).
	Handling(now time.Time, bound time.Duration) time.Duration
}

// Publisher publishes a message outside every pipeline (a *sink.Sink).
type Publisher interface {
	PublishUnordered(m *event.Message) (jetstream.PubAckFuture, error)
}

// Options are a Heartbeats' dependencies; all but Connected, Tick and
// StallAfter are required.
type Options struct {
	// Config gives the prefix, cluster, content mode and each source's
	// heartbeat interval (config.Config.HeartbeatOf).
	Config *config.Config
	// Each calls f with every watch this replica runs. It may hold a lock
	// meanwhile: f does not block (it only reads the watch's state).
	Each      func(f func(Watch))
	Publisher Publisher
	// Connected is the NATS connection's (natsconn.Conn.Up): while it is
	// down, heartbeats are counted as failed, not buffered. Nil: always up.
	Connected func() <-chan struct{}
	Logger    *zap.Logger
	Metrics   *Metrics
	// Tick is the walk period; default DefaultTick.
	Tick time.Duration
	// StallAfter is the stall bound; default DefaultStallAfter.
	StallAfter time.Duration
}

// Heartbeats publishes the heartbeats of the running watches; Run runs it.
type Heartbeats struct {
	o        Options
	states   map[Watch]*state // one allocation per watch, then lookups only
	sources  map[string]*sourceState
	gen      uint32
	last     time.Time // the previous tick
	due      []due     // this tick's heartbeats (reused)
	sent     []sent    // published, not yet acknowledged
	failures *retry.Failures
}

// state is what the walk keeps of a watch between ticks.
type state struct {
	src   *sourceState
	phase time.Duration // where in its interval the watch's heartbeats fall
	done  uint64        // its pipeline's Progress.Done at its previous heartbeat due
	seen  bool          // done is set (the watch was running at its previous due)
	stuck bool          // stuck at the previous tick
	mark  uint32        // the tick generation that last saw it
}

// sourceState is a source's: its heartbeat interval (0: none) and encoder,
// and its stuck watches in this tick (relayd_watch_stalled).
type sourceState struct {
	interval time.Duration
	enc      *event.Encoder
	stalled  prometheus.Gauge
	stuck    int
}

type due struct {
	w        Watch
	src      *sourceState
	b        watch.Beat
	interval time.Duration
	stalled  bool
}

type sent struct {
	f      jetstream.PubAckFuture
	source string
}

var errDisconnected = errors.New("NATS not connected")

// New returns the heartbeats of o.Config's sources (none for a source
// whose interval is 0).
func New(o Options) *Heartbeats {
	if o.Tick <= 0 {
		o.Tick = DefaultTick
	}
	if o.StallAfter <= 0 {
		o.StallAfter = DefaultStallAfter
	}
	h := &Heartbeats{o: o, states: map[Watch]*state{}, sources: map[string]*sourceState{},
		failures: retry.NewFailures(o.Logger, "heartbeats not published; the watches are not affected", retry.AtLevel(zap.WarnLevel))}
	cfg := o.Config
	for i := range cfg.Sources {
		src := &cfg.Sources[i]
		ss := h.source(src.Name)
		iv := cfg.HeartbeatOf(src)
		if iv <= 0 {
			continue
		}
		enc, err := event.NewEncoder(event.EncoderOptions{Prefix: cfg.Prefix, Cluster: cfg.Cluster, Source: src.Name, Binary: cfg.CloudEvents.Mode == config.ModeBinary})
		if err != nil { // a Config built in Go without Validate
			o.Logger.Error("no heartbeats for the source", zap.String("source", src.Name), zap.Error(err))
			continue
		}
		ss.enc, ss.interval = enc, iv
	}
	return h
}

// source is the state of the source named name (created on first use).
func (h *Heartbeats) source(name string) *sourceState {
	ss := h.sources[name]
	if ss == nil {
		ss = &sourceState{stalled: h.o.Metrics.Stalled.WithLabelValues(name)}
		h.sources[name] = ss
	}
	return ss
}

// Run walks the watches every tick until ctx ends: heartbeats, and the
// stuck watches (even with no source that has heartbeats).
func (h *Heartbeats) Run(ctx context.Context) {
	t := time.NewTicker(h.o.Tick)
	defer t.Stop()
	h.last = time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			h.Tick(now)
		}
	}
}

// Tick is one walk at time now (Run's; exported for the benchmark): it
// counts the acknowledgements that arrived, publishes the heartbeats that
// fell due since the previous tick and forgets the watches no longer run.
func (h *Heartbeats) Tick(now time.Time) {
	h.reap()
	h.gen++
	h.due = h.due[:0]
	seen := 0
	h.o.Each(func(w Watch) {
		seen++
		h.visit(w, now)
	})
	if len(h.states) > seen {
		for w, st := range h.states {
			if st.mark != h.gen {
				delete(h.states, w)
			}
		}
	}
	for _, ss := range h.sources {
		ss.stalled.Set(float64(ss.stuck))
		ss.stuck = 0
	}
	h.last = now
	h.publish(now)
	clear(h.due) // drop the references to the watches
}

// visit counts w if it is stuck, and notes its heartbeat if one fell due
// in (h.last, now].
func (h *Heartbeats) visit(w Watch, now time.Time) {
	st := h.states[w]
	if st == nil {
		st = &state{src: h.source(w.Source().Name)}
		if iv := st.src.interval; iv > 0 {
			st.phase = Phase(w.Key(), iv)
		}
		h.states[w] = st
	}
	st.mark = h.gen
	stuck := h.stuck(w, st, now)
	iv := st.src.interval
	if iv <= 0 || Slot(now, st.phase, iv) == Slot(h.last, st.phase, iv) {
		return
	}
	b, running := w.Beat()
	switch {
	case running:
		p := b.Progress
		stalled := stuck || st.seen && p.Pending > 0 && p.Done == st.done
		st.done, st.seen = p.Done, true
		h.due = append(h.due, due{w: w, src: st.src, b: b, interval: iv, stalled: stalled})
	case stuck:
		// Not running (a relist's LIST, say) yet stuck in an object of
		// it: counted as withheld all the same.
		st.seen = false
		h.due = append(h.due, due{w: w, src: st.src, interval: iv, stalled: true})
	default:
		st.seen = false
	}
}

// stuck reports whether w has been in one object's handling for longer
// than the stall bound, counts it for relayd_watch_stalled, and logs when
// it gets stuck and when it is no longer.
func (h *Heartbeats) stuck(w Watch, st *state, now time.Time) bool {
	d := w.Handling(now, h.o.StallAfter)
	stuck := d > h.o.StallAfter
	switch {
	case stuck && !st.stuck:
		h.o.Logger.Warn("watch stuck in one object's handling (filter, index, encode) longer than the stall bound; its heartbeats are withheld",
			zap.String("source", w.Source().Name), zap.String("namespace", w.Namespace()), zap.Duration("for", d), zap.Duration("bound", h.o.StallAfter))
	case !stuck && st.stuck:
		h.o.Logger.Info("watch no longer stuck in one object's handling", zap.String("source", w.Source().Name), zap.String("namespace", w.Namespace()))
	}
	st.stuck = stuck
	if stuck {
		st.src.stuck++
	}
	return stuck
}

// Phase is where in interval the heartbeats of the watch with checkpoint
// key fall: FNV-1a of the key, modulo the interval.
func Phase(key string, interval time.Duration) time.Duration {
	f := fnv.New64a()
	_, _ = f.Write([]byte(key))
	return time.Duration(f.Sum64() % uint64(interval))
}

// Slot numbers the intervals at phase: a heartbeat falls due whenever it
// changes.
func Slot(t time.Time, phase, interval time.Duration) int64 {
	return (t.UnixNano() - int64(phase)) / int64(interval)
}

// publish publishes this tick's heartbeats.
func (h *Heartbeats) publish(now time.Time) {
	up := h.connected()
	for i := range h.due {
		d := &h.due[i]
		name := d.w.Source().Name
		switch {
		case d.stalled:
			h.count(name, ResultStalled)
			continue
		case !up:
			h.fail(name, errDisconnected)
			continue
		}
		m := d.src.enc.Heartbeat(event.HeartbeatEvent{
			Namespace: d.w.Namespace(), ResourceVersion: d.b.ResourceVersion, Epoch: d.b.Epoch,
			StreamSeq: d.b.Progress.StreamSeq, LastRead: d.b.LastRead, Interval: d.interval, Time: now,
		})
		f, err := h.o.Publisher.PublishUnordered(&m)
		if err != nil {
			h.fail(name, err)
			continue
		}
		h.sent = append(h.sent, sent{f: f, source: name})
	}
}

// reap counts the heartbeats acknowledged, or failed, since the last tick
// (a publish times out after nats.publishTimeout).
func (h *Heartbeats) reap() {
	keep := h.sent[:0]
	for _, s := range h.sent {
		select {
		case <-s.f.Ok():
			h.count(s.source, ResultPublished)
			if h.failures.Failing() > 0 {
				h.failures.OK()
			}
		case err := <-s.f.Err():
			h.fail(s.source, err)
		default:
			keep = append(keep, s)
		}
	}
	clear(h.sent[len(keep):])
	h.sent = keep
}

func (h *Heartbeats) connected() bool {
	if h.o.Connected == nil {
		return true
	}
	select {
	case <-h.o.Connected():
		return true
	default:
		return false
	}
}

func (h *Heartbeats) count(source, result string) {
	h.o.Metrics.Heartbeats.WithLabelValues(source, result).Inc()
}

// fail counts a failed heartbeat; the failures are logged when they start,
// summarised while they last and when they end (retry.Failures).
func (h *Heartbeats) fail(source string, err error) {
	h.count(source, ResultFailed)
	h.failures.Fail(err, zap.String("source", source))
}
