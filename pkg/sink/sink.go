// Package sink publishes relayd's events to NATS JetStream.
//
// Each watch gets a Pipeline: a bounded window of asynchronous publishes
// whose PubAcks are consumed in submission order. The pipeline's watermark
// is the position of the newest entry such that it and every earlier entry
// were acknowledged (or needed no publish: bookmarks, filtered events); it
// is reported through OnAdvance and is what the checkpoint may store.
//
// Nothing is dropped: a failed publish (timeout, NATS down, stream full with
// discard-new, no stream) is retried with backoff, with the same Nats-Msg-Id
// so that JetStream drops any copy that did land. While it is retried the
// window stays full and Publish blocks, so the watch stops being read:
// backpressure, not loss.
//
// Every publish names the stream that must store it (Nats-Expected-Stream:
// Options.EventStream for events, Options.FollowUpStream for follow-up
// writes). A stream of another name that captures the subject (relayd's
// stream deleted and another one created over its subjects) refuses it
// rather than storing it, and the refusal is a failure like any other:
// retried, never acknowledged, so the watermark and the checkpoint stay
// before it. Refusals that need an operator (another stream captures the
// subjects; no stream answers) are reported through Options.OnUndeliverable
// until the publishes are stored again.
//
// The window is bounded in entries (MaxInFlight) and in bytes: per pipeline
// (MaxInFlightBytes) and for the whole process (a Budget shared by every
// pipeline of the Sink), so that objects of a megabyte each cannot hold
// hundreds of megabytes unacknowledged. An entry larger than a bound is
// admitted alone (it waits until nothing else holds that bound).
//
// Per-object order: at most one message per object (uid) is in flight in a
// pipeline. Messages from one connection are stored in the order sent, but a
// retried message could otherwise land after a newer version of the same
// object; the gate makes that impossible.
//
// Follow-up writes: an entry may carry a second message (Entry.FollowUp;
// relayd's object index writes its key-value entry this way) that is
// published only after the event's PubAck, so that what it records was
// published. The entry is done, and the watermark may pass it, only when both
// are acked. The two stages are pipelined: waiting for one entry's follow-up
// ack does not hold back the next entry's event.
package sink

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/sync/semaphore"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/relayd/relayd/internal/failpoint"
	"github.com/relayd/relayd/internal/retry"
	"github.com/relayd/relayd/pkg/event"
)

// Publisher is the part of jetstream.JetStream the sink uses.
type Publisher interface {
	PublishMsgAsync(msg *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error)
}

// Options configures a Sink.
type Options struct {
	JetStream   Publisher   // required; a jetstream.JetStream
	Logger      *zap.Logger // required
	Metrics     *Metrics    // required
	MaxInFlight int         // per pipeline; default 256
	// MaxInFlightBytes bounds the bytes of unacknowledged messages per
	// pipeline; default 16 MiB.
	MaxInFlightBytes int64
	// ProcessInFlightBytes bounds them for every pipeline of the Sink
	// together; default 48 MiB.
	ProcessInFlightBytes int64
	// RetryBackoff paces retries of a failed publish; default retry.NATS
	// (100ms doubling to 10s, jittered).
	RetryBackoff wait.Backoff
	// Connected returns a channel closed once the NATS connection is up
	// (natsconn.Conn's Up: at once while it is); nil means always up. While
	// it is down a failed publish is not retried, it waits for the
	// channel: the client's reconnect buffer already holds the message
	// once and sends it when NATS returns, and every retry would add
	// another copy to that buffer (memory that grows with the outage).
	Connected func() <-chan struct{}
	// EventStream is the stream that must store the events (Entry.Msg);
	// FollowUpStream that of the follow-up writes (Entry.FollowUp: the
	// object index bucket's stream, KV_<bucket>). Each publish says so
	// (jetstream.WithExpectStream); "" = not said.
	EventStream, FollowUpStream string
	// OnUndeliverable, if set, is called with why publishes cannot be
	// stored (another stream captures their subjects, or no stream answers
	// on them), naming the stream, whenever that changes, and with "" once
	// every pipeline's publishes are stored again. Calls are serialised.
	OnUndeliverable func(reason string)

	// after waits out one retry backoff step; nil = time.After. Package
	// tests count the waits through it.
	after func(time.Duration) <-chan time.Time
}

// target is where a message must be stored: the stream, and what the
// messages are (for the reports).
type target struct {
	stream string
	what   string // "events" or "index writes"
	// header is the Nats-Expected-Stream header value ([stream]), shared
	// read-only by every message to this target.
	header []string
}

func newTarget(stream, what string) target {
	return target{stream: stream, what: what, header: []string{stream}}
}

// Sink creates pipelines that share one JetStream context and publish
// their events to one stream.
type Sink struct {
	o Options
	// evSeq is the highest event-stream sequence acked for any pipeline (or
	// seeded from the stream): every message published later is stored
	// after it. Shared, so that the stream sequence a position carries
	// follows the whole stream, not only its own watch's messages: a
	// source that rarely changes would otherwise keep an old bound, and
	// every restart would read the stream from there.
	evSeq atomic.Uint64
	// bytes is the process-wide byte budget (FIFO: a large entry waiting
	// is not overtaken by smaller ones of other pipelines).
	bytes *semaphore.Weighted
	// events and followUps are where Entry.Msg and Entry.FollowUp must be
	// stored.
	events, followUps target
	undeliverable     undeliverable
}

// Default byte bounds: sized for the deployment's 256 MiB memory limit. A
// message not yet acknowledged is held twice while NATS is unreachable
// (the pipeline's copy and the client's reconnect buffer), so 48 MiB in
// flight costs up to ~96 MiB. pkg/relay's TestMemoryIsBoundedByBytes shows
// them fitting (docs/CONFIGURATION.md, "Memory is bounded by bytes").
const (
	DefaultMaxInFlightBytes     = 16 << 20
	DefaultProcessInFlightBytes = 48 << 20
)

// SeedStreamSeq tells the sink that the event stream's last sequence is at
// least seq, so that positions carry a tight StreamSeq before the first
// PubAck (without it the bound is 1: correct, but a restart reads the
// whole stream).
func (s *Sink) SeedStreamSeq(seq uint64) {
	s.ackedEventSeq(seq)
}

// NextStreamSeq is a sequence of the event stream at or before every
// message the sink publishes from now on: one past the last it knows of.
func (s *Sink) NextStreamSeq() uint64 { return s.evSeq.Load() + 1 }

// ackedEventSeq raises evSeq to seq.
func (s *Sink) ackedEventSeq(seq uint64) {
	for {
		cur := s.evSeq.Load()
		if seq <= cur || s.evSeq.CompareAndSwap(cur, seq) {
			return
		}
	}
}

// New validates o and returns a Sink.
func New(o Options) (*Sink, error) {
	switch {
	case o.JetStream == nil:
		return nil, errors.New("sink: Options.JetStream is required")
	case o.Logger == nil:
		return nil, errors.New("sink: Options.Logger is required")
	case o.Metrics == nil:
		return nil, errors.New("sink: Options.Metrics is required")
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = 256
	}
	if o.MaxInFlightBytes <= 0 {
		o.MaxInFlightBytes = DefaultMaxInFlightBytes
	}
	if o.ProcessInFlightBytes <= 0 {
		o.ProcessInFlightBytes = DefaultProcessInFlightBytes
	}
	if o.after == nil {
		o.after = time.After
	}
	if o.RetryBackoff.Duration == 0 {
		o.RetryBackoff = retry.NATS()
	}
	return &Sink{
		o: o, bytes: semaphore.NewWeighted(o.ProcessInFlightBytes),
		events:        newTarget(o.EventStream, "events"),
		followUps:     newTarget(o.FollowUpStream, "index writes"),
		undeliverable: undeliverable{report: o.OnUndeliverable, by: map[undeliverableKey]string{}},
	}, nil
}

// Advance is a new watermark: the checkpointable position of a pipeline.
type Advance struct {
	ResourceVersion string
	Epoch           uint64
	// BookmarkOnly is true when nothing but bookmarks (or other publish-free
	// entries) moved the watermark since the previous Advance.
	BookmarkOnly bool
	// FollowUpSeq is the highest stream sequence of an acknowledged
	// follow-up write of this pipeline (0 if none yet).
	FollowUpSeq uint64
	// StreamSeq is a sequence of the event stream at or before every event
	// message of the entries after this position (at least 1): a restart
	// that finds the index behind the stream (index writes follow the
	// PubAck) reads the stream from here to catch it up.
	StreamSeq uint64
}

// Entry is one unit submitted to a pipeline, in watch order.
type Entry struct {
	// Msg is the message to publish; nil for entries that only move the
	// position (bookmarks, filtered events).
	Msg *event.Message
	// FollowUp is a write that must follow Msg (the object index's entry
	// of this change), published once Msg is acked (at once when Msg is
	// nil); nil if none.
	FollowUp *event.Message
	// ResourceVersion is the position reached once this entry and all before
	// it are done; "" for entries that must not move the checkpoint (items of
	// a list, whose order is not resourceVersion order).
	ResourceVersion string
	Epoch           uint64
	// ObjectKey gates per-object order (the uid); "" for control events.
	ObjectKey string
	// ReadAt is when the event was read off the watch (for the lag metric).
	ReadAt time.Time
	// For the events metric.
	Type   event.Type
	Origin event.Origin
	// Bookmark marks an entry that is a bookmark.
	Bookmark bool
	// StreamSeqCap, when set, caps the stream sequence its Advance
	// reports (Advance.StreamSeq): a watch replaying what an earlier run
	// stored after its checkpoint sets it to that checkpoint's sequence,
	// for the replays are duplicates of messages stored before the ones
	// this process has acked.
	StreamSeqCap uint64
}

type eventKey struct {
	t event.Type
	o event.Origin
}

type pending struct {
	e            Entry
	future       jetstream.PubAckFuture // of the first message (Msg, else FollowUp); never nil (publishFuture)
	followFuture jetstream.PubAckFuture // of FollowUp when it follows Msg
	done         chan struct{}          // closed when done (releases the object gate)
	fromSeq      uint64                 // every copy of Msg, and of later entries' messages, is stored at or after this event-stream sequence
	weight       int64                  // bytes held in the pipeline's and the process's budgets until done
}

// Pipeline is the publish window of one watch. Submit is called from the
// watch goroutine only; the pipeline's own goroutine consumes acks.
type Pipeline struct {
	s      *Sink
	source string
	log    *zap.Logger
	// evStage and followStage are the retry state of stage 1 (events) and
	// stage 2 (follow-up writes).
	evStage, followStage *stage
	onAdvance            func(Advance)
	slots                chan struct{}       // window: one token per entry not yet done
	bytes                *semaphore.Weighted // the pipeline's byte budget

	mu        sync.Mutex
	inflight  map[string]chan struct{} // object key -> done of its in-flight message
	lastRV    string
	lastEp    uint64
	followSeq uint64 // highest acked follow-up write sequence
	unacked   int    // published, not yet acked (for the in-flight gauge on Close)
	held      int64  // bytes taken from the process budget by entries not yet done

	// Metric children resolved once, not per event.
	inFlight prometheus.Gauge
	inBytes  prometheus.Gauge
	lag      prometheus.Observer
	dups     prometheus.Counter
	events   map[eventKey]prometheus.Counter

	// The stages' goroutines run only while they have entries (kick), and
	// their queues hold memory only while not empty: a quiet watch's
	// pipeline holds no goroutine, no stack and no window
	// (docs/PERFORMANCE.md, "Memory per watch"). wg counts them for Close.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// bookmarkOnly is stage 2's: nothing but bookmarks (or other
	// publish-free entries) moved the watermark since the last Advance.
	bookmarkOnly bool
	// lastSeq is the event-stream sequence of the last event acked, done
	// counts the entries done (Progress).
	lastSeq, done atomic.Uint64
}

// Progress is how far a pipeline got (for heartbeats, pkg/heartbeat).
type Progress struct {
	// StreamSeq is the event-stream sequence of the pipeline's last event
	// acknowledged (0: none yet).
	StreamSeq uint64
	// Done counts the entries done since the pipeline started; Pending is
	// the entries submitted and not yet done. Pending > 0 with Done
	// unchanged since an earlier look: nothing was acknowledged meanwhile.
	Done    uint64
	Pending int
}

// Progress says how far the pipeline got; safe from any goroutine.
func (p *Pipeline) Progress() Progress {
	return Progress{StreamSeq: p.lastSeq.Load(), Done: p.done.Load(), Pending: len(p.slots)}
}

// NewPipeline starts a pipeline for one watch of source. onAdvance is called
// from the pipeline's goroutines, in order (one at a time), with each new
// watermark. Close stops it.
func (s *Sink) NewPipeline(source string, onAdvance func(Advance)) *Pipeline {
	ctx, cancel := context.WithCancel(context.Background())
	p := &Pipeline{
		s: s, source: source, onAdvance: onAdvance,
		log:          s.o.Logger.WithLazy(zap.String("source", source)),
		slots:        make(chan struct{}, s.o.MaxInFlight),
		bytes:        semaphore.NewWeighted(s.o.MaxInFlightBytes),
		inflight:     map[string]chan struct{}{},
		ctx:          ctx,
		cancel:       cancel,
		bookmarkOnly: true,
		inFlight:     s.o.Metrics.InFlight.WithLabelValues(source),
		inBytes:      s.o.Metrics.InFlightBytes.WithLabelValues(source),
		lag:          s.o.Metrics.Lag.WithLabelValues(source),
		dups:         s.o.Metrics.Duplicates.WithLabelValues(source),
		events:       map[eventKey]prometheus.Counter{},
	}
	p.evStage, p.followStage = p.newStage(), p.newStage()
	for _, t := range []event.Type{event.Added, event.Modified, event.Deleted} {
		for _, o := range []event.Origin{event.OriginWatch, event.OriginInitial, event.OriginResync} {
			p.events[eventKey{t, o}] = s.o.Metrics.Events.WithLabelValues(source, string(t), string(o))
		}
	}
	return p
}

// enqueue queues pe for stage st and starts the stage's goroutine (run or
// runFollowUps) unless it runs or the pipeline is closed. Never blocks: at
// most cap(slots) entries are queued.
func (p *Pipeline) enqueue(st *stage, pe *pending, run func(context.Context)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	st.queue = append(st.queue, pe)
	if st.running || p.ctx.Err() != nil {
		return
	}
	st.running = true
	p.wg.Go(func() { run(p.ctx) })
}

// next is stage st's next entry. A stage with none left ends (false),
// giving its queue's memory back; enqueue starts it again.
func (p *Pipeline) next(ctx context.Context, st *stage) (*pending, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if st.head == len(st.queue) || ctx.Err() != nil {
		st.running = false
		st.queue, st.head = nil, 0
		return nil, false
	}
	pe := st.queue[st.head]
	st.queue[st.head] = nil
	st.head++
	return pe, true
}

// waiting is how many entries wait behind the one stage st awaits.
func (p *Pipeline) waiting(st *stage) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(st.queue) - st.head
}

// stage is the retry state of one stage of a pipeline.
type stage struct {
	// failures reports "publish failed; retrying": logged when a run of
	// failures starts, summarised, and when it ends (see await).
	failures *retry.Failures
	// queue[head:] are the entries behind the one awaited, in order;
	// running says whether the stage's goroutine runs. Under the
	// pipeline's mu.
	queue   []*pending
	head    int
	running bool
	// resumed is set when a retried publish is acked and cleared when a
	// first publish is: the publishes behind a retried one failed in the
	// same outage (their acks timed out while NATS was away; the client
	// sent them on reconnect), so each is republished at once, not after a
	// backoff step of its own: a window of 256 would otherwise take 256
	// steps (~30 s) to catch up while the watch's position ages.
	resumed atomic.Bool
}

func (p *Pipeline) newStage() *stage {
	return &stage{
		failures: retry.NewFailures(p.log, "publish failed; retrying (the watch is paused meanwhile)", retry.AtLevel(zapcore.WarnLevel))}
}

// Submit adds e to the window. It blocks while the window is full or while
// an earlier message for the same object is unacknowledged, and returns
// only ctx's error. An entry with a message is published before Submit
// returns; its ack is awaited by the pipeline.
func (p *Pipeline) Submit(ctx context.Context, e Entry) error {
	pe := &pending{e: e}
	first, firstTo := e.Msg, p.s.events
	if first == nil {
		first, firstTo = e.FollowUp, p.s.followUps
	}
	if first != nil && e.ObjectKey != "" {
		if err := p.waitObject(ctx, e.ObjectKey); err != nil {
			return err
		}
	}
	select {
	case p.slots <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := p.acquire(ctx, pe, first); err != nil {
		<-p.slots
		return err
	}
	// Every copy of this entry's messages is published from now on, so it
	// is stored after every message acked so far.
	pe.fromSeq = p.s.NextStreamSeq()
	if e.StreamSeqCap > 0 {
		pe.fromSeq = min(pe.fromSeq, e.StreamSeqCap)
	}
	p.mu.Lock()
	if first != nil {
		pe.done = make(chan struct{})
		if e.ObjectKey != "" {
			p.inflight[e.ObjectKey] = pe.done
		}
	}
	p.mu.Unlock()
	if first != nil {
		// A publish that fails before it is sent (e.g. a full reconnect
		// buffer) gets a future that fails at once: the pipeline goroutine
		// retries it in order.
		pe.future = p.publishCounted(first, firstTo)
		failpoint.Inject(failpoint.SinkAfterPublish)
	}
	p.enqueue(p.evStage, pe, p.run)
	return nil
}

// acquire takes the entry's bytes from the pipeline's budget, then from the
// process's, clamped to each bound so that an outsized entry waits until it
// is alone rather than forever.
func (p *Pipeline) acquire(ctx context.Context, pe *pending, first *event.Message) error {
	if first == nil {
		return nil
	}
	w := messageSize(pe.e.Msg) + messageSize(pe.e.FollowUp)
	w = min(w, p.s.o.MaxInFlightBytes, p.s.o.ProcessInFlightBytes)
	if err := p.bytes.Acquire(ctx, w); err != nil {
		return err
	}
	if err := p.s.bytes.Acquire(ctx, w); err != nil {
		p.bytes.Release(w)
		return err
	}
	pe.weight = w
	p.mu.Lock()
	p.held += w
	p.mu.Unlock()
	// The gauges go up only once both budgets are held, and down before
	// either is given back (releaseBytes, Close): so they never show more
	// than is held, and a sample of them never exceeds a bound.
	p.inBytes.Add(float64(w))
	p.s.o.Metrics.ProcessBytes.Add(float64(w))
	return nil
}

// releaseBytes returns a done entry's bytes to both budgets.
func (p *Pipeline) releaseBytes(pe *pending) {
	if pe.weight == 0 {
		return
	}
	p.mu.Lock()
	p.held -= pe.weight
	p.mu.Unlock()
	p.inBytes.Sub(float64(pe.weight))
	p.s.o.Metrics.ProcessBytes.Sub(float64(pe.weight))
	p.s.bytes.Release(pe.weight)
	p.bytes.Release(pe.weight)
}

// messageSize is what a message costs while in flight: its payload, subject,
// id and headers (nats.go holds the encoded form, of about this size).
func messageSize(m *event.Message) int64 {
	if m == nil {
		return 0
	}
	n := len(m.Data) + len(m.Subject) + len(m.MsgID)
	for k, vs := range m.Header {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return int64(n)
}

func (p *Pipeline) waitObject(ctx context.Context, key string) error {
	for {
		p.mu.Lock()
		ch, busy := p.inflight[key]
		p.mu.Unlock()
		if !busy {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (p *Pipeline) release(pe *pending) {
	if pe.done == nil {
		return
	}
	p.mu.Lock()
	if pe.e.ObjectKey != "" && p.inflight[pe.e.ObjectKey] == pe.done {
		delete(p.inflight, pe.e.ObjectKey)
	}
	p.mu.Unlock()
	close(pe.done)
}

// publish publishes m, to be stored in to.stream.
func (p *Pipeline) publish(m *event.Message, to target) (jetstream.PubAckFuture, error) {
	return p.s.publish(m, to)
}

// PublishUnordered publishes m to the event stream outside every
// pipeline: no order with the watches' entries, no window, no retry, no
// effect on any position. The caller reads the future (pkg/heartbeat's
// heartbeats: a failed one is counted, and the next is due an interval
// later).
func (s *Sink) PublishUnordered(m *event.Message) (jetstream.PubAckFuture, error) {
	return s.publish(m, s.events)
}

// publish publishes m, to be stored in to.stream.
func (s *Sink) publish(m *event.Message, to target) (jetstream.PubAckFuture, error) {
	// The headers jetstream.WithMsgID and WithExpectStream would set, set
	// here: without options PublishMsgAsync allocates no options, closures
	// or header values per message (its defaults are those of the options).
	h := nats.Header(m.Header)
	if h == nil && (m.MsgID != "" || to.stream != "") {
		h = nats.Header{}
		m.Header = h
	}
	if m.MsgID != "" {
		if v := h[jetstream.MsgIDHeader]; len(v) != 1 || v[0] != m.MsgID {
			h[jetstream.MsgIDHeader] = []string{m.MsgID}
		}
	}
	if to.stream != "" {
		h[jetstream.ExpectedStreamHeader] = to.header
	}
	return s.o.JetStream.PublishMsgAsync(&nats.Msg{Subject: m.Subject, Data: m.Data, Header: h})
}

// publishCounted publishes m as a new in-flight message (see
// publishFuture).
func (p *Pipeline) publishCounted(m *event.Message, to target) jetstream.PubAckFuture {
	p.mu.Lock()
	p.unacked++
	p.mu.Unlock()
	p.inFlight.Inc()
	return p.publishFuture(m, to)
}

// publishFuture publishes m; a synchronous failure (the client's reconnect
// buffer full, the message over the server's max payload) yields a future
// that fails with it at once, so that await counts it, logs it and retries
// it like a publish that timed out: a stall is never silent.
func (p *Pipeline) publishFuture(m *event.Message, to target) jetstream.PubAckFuture {
	f, err := p.publish(m, to)
	if err != nil {
		return failedFuture{err: err, msg: m}
	}
	return f
}

// failedFuture is the future of a publish that failed before it was sent.
type failedFuture struct {
	err error
	msg *event.Message
}

func (f failedFuture) Ok() <-chan *jetstream.PubAck { return nil }
func (f failedFuture) Err() <-chan error {
	c := make(chan error, 1)
	c <- f.err
	return c
}
func (f failedFuture) Msg() *nats.Msg {
	return &nats.Msg{Subject: f.msg.Subject, Data: f.msg.Data, Header: nats.Header(f.msg.Header)}
}

// HeaderBytes is what the sink adds to each event message it publishes
// (the Nats-Expected-Stream header): the encoder's max payload must leave
// it room, or an event that fits as encoded would be refused by the client.
func (s *Sink) HeaderBytes() int { return HeaderBytes(s.events.stream) }

// HeaderBytes is what a sink whose events go to stream adds to each event
// message (0 for "": no stream said).
func HeaderBytes(stream string) int {
	if stream == "" {
		return 0
	}
	return len(jetstream.ExpectedStreamHeader) + len(": ") + len(stream) + len("\r\n")
}

func (p *Pipeline) countError(err error) {
	p.s.o.Metrics.PublishErrors.WithLabelValues(p.source, errorReason(err)).Inc()
}

// errCodeStreamMismatch is JetStream's error code for a message whose
// Nats-Expected-Stream is not the stream that captured its subject
// ("expected stream does not match").
const errCodeStreamMismatch jetstream.ErrorCode = 10060

// errorReason maps publish errors to a small fixed label set.
func errorReason(err error) string {
	switch {
	case isStreamMismatch(err):
		return "wrong-stream"
	case errors.Is(err, jetstream.ErrAsyncPublishTimeout), errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout):
		return "timeout"
	case errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, nats.ErrNoResponders):
		return "no-stream"
	case errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, nats.ErrDisconnected), errors.Is(err, nats.ErrConnectionDraining), errors.Is(err, nats.ErrReconnectBufExceeded):
		return "disconnected"
	case errors.Is(err, jetstream.ErrTooManyStalledMsgs):
		return "stalled"
	case errors.Is(err, nats.ErrMaxPayload):
		// Refused by the client before it was sent: the server's max
		// payload is now smaller than when the watch's encoder was built
		// (the client reconnected to another server, or it was lowered).
		return "max-payload"
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case errCodeStoreFailed, errCodeInsufficientResources, errCodeAccountResourcesExceeded:
			return "stream-full"
		}
		return "rejected"
	}
	return "error"
}

// JetStream API error codes of a store that refuses to take more (the
// codes of nats-server's errors.json; nats.go names none of them).
const (
	// errCodeStoreFailed: the stream refused to store the message, in
	// practice a limit of a discard-new stream ("maximum messages
	// exceeded", "maximum bytes exceeded", "maximum messages per subject
	// exceeded").
	errCodeStoreFailed jetstream.ErrorCode = 10077
	// errCodeInsufficientResources: the server has no storage left.
	errCodeInsufficientResources jetstream.ErrorCode = 10023
	// errCodeAccountResourcesExceeded: the account's JetStream limits.
	errCodeAccountResourcesExceeded jetstream.ErrorCode = 10002
)

// run is stage 1: it consumes entries in order, waits for the first
// message's ack (retrying failures), publishes its follow-up write, and
// hands the entry to stage 2.
func (p *Pipeline) run(ctx context.Context) {
	for {
		pe, ok := p.next(ctx, p.evStage)
		if !ok {
			return
		}
		if pe.e.Msg != nil {
			if !p.await(ctx, p.evStage, pe.e.Msg, p.s.events, &pe.future, func(ack *jetstream.PubAck) { p.eventAcked(pe, ack) }) {
				return
			}
			if pe.e.FollowUp != nil {
				pe.followFuture = p.publishCounted(pe.e.FollowUp, p.s.followUps)
			}
		} else if pe.e.FollowUp != nil {
			pe.followFuture = pe.future
		}
		p.enqueue(p.followStage, pe, p.runFollowUps)
	}
}

// runFollowUps is stage 2: it waits for follow-up writes in order, then releases the
// object, advances the watermark and frees the slot.
func (p *Pipeline) runFollowUps(ctx context.Context) {
	for {
		pe, ok := p.next(ctx, p.followStage)
		if !ok {
			return
		}
		if pe.e.FollowUp != nil {
			if !p.await(ctx, p.followStage, pe.e.FollowUp, p.s.followUps, &pe.followFuture, p.followUpAcked) {
				return
			}
		}
		p.release(pe)
		if pe.e.Msg != nil {
			// Stored, never published again: its encoder may reuse the body.
			pe.e.Msg.Release()
		}
		if pe.e.Msg != nil || pe.e.FollowUp != nil || !pe.e.Bookmark {
			p.bookmarkOnly = false
		}
		p.mu.Lock()
		advance := pe.e.ResourceVersion != "" && (pe.e.ResourceVersion != p.lastRV || pe.e.Epoch != p.lastEp)
		if advance {
			p.lastRV, p.lastEp = pe.e.ResourceVersion, pe.e.Epoch
		}
		followSeq := p.followSeq
		p.mu.Unlock()
		failpoint.Inject(failpoint.SinkAfterAck)
		if advance && p.onAdvance != nil {
			p.onAdvance(Advance{ResourceVersion: pe.e.ResourceVersion, Epoch: pe.e.Epoch, BookmarkOnly: p.bookmarkOnly, FollowUpSeq: followSeq, StreamSeq: pe.fromSeq})
			p.bookmarkOnly = true
		}
		p.releaseBytes(pe)
		p.done.Add(1)
		<-p.slots
	}
}

func (p *Pipeline) eventAcked(pe *pending, ack *jetstream.PubAck) {
	p.s.ackedEventSeq(ack.Sequence)
	p.lastSeq.Store(max(p.lastSeq.Load(), ack.Sequence)) // stage 1 is its only writer
	if ack.Duplicate {
		p.dups.Inc()
	}
	// Object events only; control events (sync markers) have no type.
	if c, ok := p.events[eventKey{pe.e.Type, pe.e.Origin}]; ok {
		c.Inc()
	}
	if !pe.e.ReadAt.IsZero() {
		p.lag.Observe(time.Since(pe.e.ReadAt).Seconds())
	}
}

func (p *Pipeline) followUpAcked(ack *jetstream.PubAck) {
	p.mu.Lock()
	p.followSeq = max(p.followSeq, ack.Sequence)
	p.mu.Unlock()
}

// await waits for the PubAck of m (*f is its future; one that failed before
// it was sent fails at once, see publishFuture), republishing it (same Msg-Id, stored in to.stream)
// with backoff until one arrives, and calls onAck with it. It returns false
// only when the pipeline is closed. st is the stage's retry state: the
// failures of one outage are one run, and after a retried publish is acked
// the failed ones behind it are republished without a backoff step each.
func (p *Pipeline) await(ctx context.Context, st *stage, m *event.Message, to target, f *jetstream.PubAckFuture, onAck func(*jetstream.PubAck)) bool {
	backoff := p.s.o.RetryBackoff
	for attempt := 0; ; attempt++ {
		var err error
		select {
		case ack := <-(*f).Ok():
			p.inFlight.Dec()
			p.mu.Lock()
			p.unacked--
			p.mu.Unlock()
			onAck(ack)
			st.resumed.Store(attempt > 0)
			if attempt > 0 {
				p.s.undeliverable.set(p, to.stream, "")
			}
			// One run of failures per outage, not one per entry of the
			// window: it ends at a first publish acked, or when
			// nothing waits behind this one.
			if st.failures.Failing() > 0 && (attempt == 0 || p.waiting(st) == 0) {
				st.failures.OK(zap.String("subject", m.Subject), zap.String("stream", to.stream), zap.String("msgId", m.MsgID), zap.Int("attempts", attempt+1))
			}
			return true
		case err = <-(*f).Err():
			p.countError(err)
		case <-ctx.Done():
			return false
		}
		fields := []zap.Field{zap.String("subject", m.Subject), zap.String("stream", to.stream), zap.String("msgId", m.MsgID), zap.Int("attempt", attempt+1)}
		if why := undeliverableReason(err, to); why != "" {
			p.s.undeliverable.set(p, to.stream, why)
			fields = append(fields, zap.String("why", why))
		}
		st.failures.Fail(err, fields...)
		if attempt > 0 || !st.resumed.Load() {
			select {
			case <-p.s.o.after(backoff.Step()):
			case <-ctx.Done():
				return false
			}
		}
		if p.s.o.Connected != nil {
			select {
			case <-p.s.o.Connected():
			case <-ctx.Done():
				return false
			}
		}
		*f = p.publishFuture(m, to)
	}
}

// Watermark is the newest acknowledged position.
func (p *Pipeline) Watermark() (rv string, epoch uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lastRV, p.lastEp
}

// Drain waits until every submitted entry is done (acked) or ctx ends.
// Submit must not be called concurrently.
func (p *Pipeline) Drain(ctx context.Context) error {
	// Fill every slot: possible only once the pipeline freed them all.
	for i := 0; i < cap(p.slots); i++ {
		select {
		case p.slots <- struct{}{}:
		case <-ctx.Done():
			for ; i > 0; i-- {
				<-p.slots
			}
			return fmt.Errorf("drain %s: %d publishes still unacknowledged: %w", p.source, p.waiting(p.evStage)+p.waiting(p.followStage), ctx.Err())
		}
	}
	for i := 0; i < cap(p.slots); i++ {
		<-p.slots
	}
	return nil
}

// Close stops the pipeline goroutine; unacknowledged entries are abandoned
// (they were never checkpointed, so a restart replays them).
func (p *Pipeline) Close() {
	// Cancelled under mu: enqueue starts a stage only under mu and not
	// after the cancel, so no goroutine is added while Wait waits.
	p.mu.Lock()
	p.cancel()
	p.mu.Unlock()
	p.wg.Wait()
	p.s.undeliverable.forget(p)
	p.mu.Lock()
	n := p.unacked
	p.unacked = 0
	held := p.held
	p.held = 0
	p.mu.Unlock()
	if n > 0 {
		p.inFlight.Sub(float64(n))
	}
	// Abandoned entries give their bytes back to the process's budget (the
	// pipeline's own dies with it).
	if held > 0 {
		p.inBytes.Sub(float64(held))
		p.s.o.Metrics.ProcessBytes.Sub(float64(held))
		p.s.bytes.Release(held)
	}
}
