// Package watch runs one watch of relayd: one (source, namespace), read by
// a source.Watcher, compared with its object index, encoded (pkg/event) and
// submitted to its sink pipeline. It owns the per-watch engine of
// docs/ARCHITECTURE.md:
//
//   - Supervise supervises the watch: it restarts it with backoff after any
//     error and recovers panics, so that one bad source never stops the
//     others.
//   - One attempt (runOnce) resolves the resource, builds the encoder and
//     the watcher (a source.Watcher, whose Run is the request loop: list,
//     watch, and retries of its own),
//     loads the object index (first load: the recovery plan of
//     index.PlanRecovery and the catch-up from the event stream), and runs
//     the watcher from the acked watermark or the checkpoint.
//   - Each item is handled against the object index: live changes update
//     it; a list is compared with it (unchanged objects are not
//     republished, new and changed ones are, and every indexed object the
//     list did not contain is published as deleted, final state unknown).
//
// Everything the engine needs from the running process comes in Options as
// values and small interfaces (the sink's pipelines, the checkpoints, the
// open index bucket, the event stream, the resolver, the watcher factory),
// never closures, so that its decisions are unit-tested with fakes;
// pkg/relay wires the real ones. An optional RelistHook runs after each
// relist (the tests' index consistency check, internal/indexcheck).
package watch

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/relayd/relayd/internal/retry"
	"github.com/relayd/relayd/pkg/checkpoint"
	"github.com/relayd/relayd/pkg/config"
	"github.com/relayd/relayd/pkg/event"
	"github.com/relayd/relayd/pkg/index"
	"github.com/relayd/relayd/pkg/sink"
	"github.com/relayd/relayd/pkg/source"
)

// Pipe is the watch's publishing pipeline (a *sink.Pipeline). The watch
// goroutine is its only submitter.
type Pipe interface {
	Submit(ctx context.Context, e sink.Entry) error
	// Drain waits until every submitted entry is acknowledged.
	Drain(ctx context.Context) error
	// Watermark is the position of the last acknowledged entry ("" before
	// the first).
	Watermark() (rv string, epoch uint64)
	// Close stops the pipeline (after the watch stopped).
	Close()
	// Progress says how far the pipeline got (for the heartbeats).
	Progress() sink.Progress
}

// Pipelines opens the watches' pipelines (the sink). New calls it once.
type Pipelines interface {
	// NewPipe returns a pipeline for a watch of source, which tells acked
	// each move of its acknowledged watermark.
	NewPipe(source string, acked Acked) Pipe
}

// Acked is told each move of a pipeline's acknowledged watermark (the
// Watch, which records it as its checkpoint).
type Acked interface {
	Advance(a sink.Advance)
}

// Positions are the stored checkpoints (a *checkpoint.Store).
type Positions interface {
	Get(key string) (checkpoint.Position, bool)
	// Stored is the position as written in the checkpoint (the heartbeats').
	Stored(key string) (checkpoint.Position, bool)
	Advance(key string, p checkpoint.Position, bookmarkOnly bool)
}

// Bucket is the object index's bucket (an *index.Bucket): reads at load,
// and the messages of the writes the pipeline makes after each PubAck. The
// real one shares the reads of the watches that load together (one status
// request, one consumer; docs/ARCHITECTURE.md, "Start-up reads are
// shared"), so a call may wait for the others' arrival.
type Bucket interface {
	Name() string
	Generation(ctx context.Context) (index.Generation, error)
	Load(ctx context.Context, prefix string, x *index.Index) (index.Loaded, error)
	Epoch(ctx context.Context, prefix string) (epoch uint64, recorded bool, err error)
	PutMsg(prefix string, o index.Object) *event.Message
	DeleteMsg(prefix, uid string) *event.Message
	DeleteKeyMsg(key string) *event.Message
	EpochMsg(prefix string, epoch uint64) *event.Message
}

// CatchUpReader reads the event stream to catch the object index up with
// it (an *index.CatchUpReader, which serves the catch-ups of the watches
// that start together with one read: docs/ARCHITECTURE.md, "Start-up reads
// are shared").
type CatchUpReader interface {
	CatchUp(ctx context.Context, log *zap.Logger, x *index.Index, c index.CatchUpOf) (index.CatchUpResult, error)
}

// Watcher reads the source (a *source.Watcher): its Run is the request
// loop (list, watch, retry inside) that the watch's Supervise restarts.
type Watcher interface {
	Run(ctx context.Context, st source.Start, h source.Handler) error
}

// Watchers builds the watcher of a resolved source (o.Client is for it to
// set).
type Watchers interface {
	NewWatcher(o source.Options) (Watcher, error)
}

// Resolver turns a source into a served, watchable resource (a
// *source.SharedResolver).
type Resolver interface {
	Resolve(src *config.Source) (event.Resource, error)
}

// Readiness is what each attempt waits for before it runs: the
// checkpoints loaded, NATS connected.
type Readiness interface {
	Wait(ctx context.Context) error
}

// SelfFilter recognises relayd's own objects, which are not relayed.
type SelfFilter interface {
	IsSelf(res event.Resource, m *event.Meta) bool
}

// StateObserver is told when a watch comes up or goes down.
type StateObserver interface {
	WatchState(w *Watch, up bool)
}

// RelistHook is called on the watch's goroutine after each relist is
// compared with the object index and its sync.completed submitted; an
// error stops the attempt (the watch restarts). The index consistency
// check of the tests (internal/indexcheck) is one.
type RelistHook interface {
	AfterRelist(ctx context.Context, r Relisted) error
}

// Relisted is a completed relist, as a RelistHook sees it. It is valid
// during the call only.
type Relisted struct {
	Watch           string // the watch's name (Watch.String)
	Source          *config.Source
	Namespace       string
	Resource        event.Resource
	Shaping         *event.Shaping
	ResourceVersion string // the list's
	// Index is the in-memory object index after the relist; IndexPrefix
	// its keys in the bucket.
	Index       *index.Index
	IndexPrefix string
	// Fingerprinter is the watch's, with ignoreChanges (nil otherwise).
	Fingerprinter *event.Fingerprinter
	// Scope is the source's filter (nil: none): the index holds the
	// objects in its scope only.
	Scope *Scope
	// Pipe is the watch's pipeline: once drained, the bucket holds every
	// index write the watch made.
	Pipe Pipe
	Log  *zap.Logger
}

// Options are a watch's settings and dependencies. All but State,
// AfterRelist and ObjectHook are required.
type Options struct {
	Source    *config.Source
	Namespace string // "" for all namespaces or a cluster-scoped kind
	Config    *config.Config
	Logger    *zap.Logger // the watch adds its source and namespace
	Metrics   *Metrics
	// Shaping is the source's compiled drop/ignoreChanges paths (nil: none).
	Shaping *event.Shaping
	// Scope is the source's compiled filter (NewScope), shared by its
	// watches: a compiled expression holds ~90 KB, more than a quiet
	// watch's whole budget. Nil: the watch compiles Source.Filter itself.
	Scope *Scope
	// FingerprintKey keys the fingerprints of ignoreChanges
	// (nats.index.fingerprintKeyFile; nil: unkeyed). The Bucket must store
	// them under its ID (index.BucketOptions.FingerprintKeyID).
	FingerprintKey *event.FingerprintKey
	// MaxPayload is the NATS server's max payload less what the sink adds
	// to each event (sink.Sink.HeaderBytes): events above it are sent as
	// references, or without data; a change that fits not even so stalls
	// the watch (see Watch.encode).
	MaxPayload int
	// Backoff is the restart backoff (watch.relistBackoff), unstepped: the
	// watch and its watcher step copies of it.
	Backoff wait.Backoff

	Pipelines Pipelines
	Positions Positions
	Events    CatchUpReader // the event stream
	Bucket    Bucket        // the object index's bucket, open
	// Ready is waited for before each attempt.
	Ready    Readiness
	Resolver Resolver
	Watchers Watchers
	// Self are relayd's own objects, which are not relayed.
	Self SelfFilter
	// State, if set, is told when the watch comes up or goes down.
	State StateObserver
	// AfterRelist, if set, is called after each relist.
	AfterRelist RelistHook
	// ObjectHook, if set, is told of each object inside its handling
	// (tests).
	ObjectHook ObjectHook
}

// Watch is one running watch. Supervise is called by one goroutine at a
// time; the other methods may be called from any goroutine.
type Watch struct {
	o    Options
	key  string
	log  *zap.Logger
	pipe Pipe // from Options.Pipelines, told of its acks by Advance

	filter map[event.Type]bool
	// fp computes the objects' fingerprints (Options.FingerprintKey) when
	// the source has ignoreChanges, nil otherwise; the Supervise goroutine's.
	fp         *event.Fingerprinter
	paths      pathState  // the source's changedPaths (changed.go)
	scope      scopeState // the source's filter (scope.go)
	trackedG   prometheus.Gauge
	filtered   prometheus.Counter
	suppressed prometheus.Counter

	restarts    *retry.Failures // logs the restarts
	established atomic.Bool
	up          atomic.Bool
	lastErr     atomic.Value // string: why the watch last stopped (for /readyz)
	lastRead    atomic.Int64 // unix nanoseconds of the last change read (0: none yet; Beat)
	// born is when the watch was built; handling is when the handling of
	// its current object began, in nanoseconds since born plus one (0: not
	// handling one), and stuck the handling mark the heartbeat walk found
	// stuck last (handling.go).
	born     time.Time
	handling atomic.Int64
	stuck    atomic.Int64

	// Owned by the Supervise goroutine: what one attempt built and may reuse.
	resource event.Resource
	resolved bool
	watcher  Watcher
	enc      *event.Encoder
	tracked  int // objects in idx as last reported to relayd_tracked_objects
	ix       indexState
	counts   event.SyncCounts
	full     bool // the list in progress is a full resync (request.go)

	req requestState // the resync asked for (request.go)
}

// indexState is the watch's object index (see pkg/index) and what its
// first load decided.
type indexState struct {
	idx      *index.Index
	prefix   string // bucket key prefix of this watch
	gen      string // bucket generation the index was loaded from
	seqFloor uint64 // index seq of the loaded checkpoint
	loaded   bool   // false: (re)load before running
	// relist is the reason of a list due at start; cleared when a list
	// completes.
	relist event.RelistReason
	// epochFloor is the epoch recorded in the bucket (read at the first
	// load): the epoch to start from when the checkpoint has none or an
	// older one. epochRecorded: the bucket has the epoch key.
	epochFloor    uint64
	epochRecorded bool
	// legacy holds the CloudEvents ids of the changes after the checkpoint
	// that an older relayd stored with a Nats-Msg-Id without the cluster
	// (index.CatchUpResult.Legacy): republished with that id, JetStream
	// drops them as duplicates.
	legacy map[string]struct{}
	// fences hold, after a resume from the checkpoint, the resourceVersion
	// of each object's last message on the stream after it
	// (index.CatchUpResult.Last): watch events of older versions are
	// replays and are not published again (Watch.replayed).
	fences map[string]string
	// fenceFrom is the stream sequence the fences were read from (the
	// checkpoint's), fenceUntil the highest resourceVersion among them (0:
	// passed): see Watch.submit.
	fenceFrom, fenceUntil uint64
}

// New returns the watch of o.Source in o.Namespace.
func New(o Options) *Watch {
	src := o.Source
	filter := map[event.Type]bool{}
	for _, t := range []config.EventType{config.EventAdded, config.EventModified, config.EventDeleted} {
		filter[event.Type(t)] = src.Publishes(t)
	}
	w := &Watch{
		o: o, key: checkpoint.Key(src.Name, o.Namespace), filter: filter, born: time.Now(),
		log:        o.Logger.WithLazy(zap.String("source", src.Name), zap.String("namespace", o.Namespace)),
		trackedG:   o.Metrics.TrackedObjects.WithLabelValues(src.Name),
		filtered:   o.Metrics.EventsFiltered.WithLabelValues(src.Name),
		suppressed: o.Metrics.EventsSuppressed.WithLabelValues(src.Name),
		ix:         indexState{prefix: index.Prefix(src.Name, o.Namespace)},
	}
	if o.Shaping != nil && len(src.IgnoreChanges) > 0 {
		w.fp = event.NewFingerprinter(o.FingerprintKey)
	}
	if o.Shaping.NumChangedPaths() > 0 {
		w.paths.fp, w.paths.set = event.NewFingerprinter(o.FingerprintKey), o.Shaping.PathSetID(o.FingerprintKey.ID())
	}
	w.initScope()
	w.pipe = o.Pipelines.NewPipe(src.Name, w)
	w.restarts = retry.NewFailures(w.log, "source stopped; restarting", retry.LogChanges())
	return w
}

// Key is the watch's checkpoint key.
func (w *Watch) Key() string { return w.key }

// Source is the watch's source.
func (w *Watch) Source() *config.Source { return w.o.Source }

// Namespace is the watch's namespace ("" for all, or cluster-scoped).
func (w *Watch) Namespace() string { return w.o.Namespace }

// Pipe is the watch's pipeline: its owner drains and closes it once
// Supervise returned.
func (w *Watch) Pipe() Pipe { return w.pipe }

func (w *Watch) String() string {
	if w.o.Namespace == "" {
		return w.o.Source.Name
	}
	return w.o.Source.Name + "/" + w.o.Namespace
}

// Established reports whether the watch has been up at least once.
func (w *Watch) Established() bool { return w.established.Load() }

// Up reports whether the watch is up now.
func (w *Watch) Up() bool { return w.up.Load() }

// LastError is why the watch last stopped ("" if it never did).
func (w *Watch) LastError() string {
	s, _ := w.lastErr.Load().(string)
	return s
}

// Advance is the pipeline's watermark callback: the checkpoint records the
// position with the index generation it matches.
func (w *Watch) Advance(a sink.Advance) {
	ref := &index.Ref{Generation: w.ix.gen, Seq: max(a.FollowUpSeq, w.ix.seqFloor)}
	w.o.Positions.Advance(w.key, checkpoint.Position{ResourceVersion: a.ResourceVersion, Epoch: a.Epoch, Index: ref, StreamSeq: a.StreamSeq,
		FilterHash: w.scope.ackedHash()}, a.BookmarkOnly)
}

// Stopped reports that the watch no longer tracks objects (its source
// stopped on this replica).
func (w *Watch) Stopped() { w.setTracked(0) }

// setTracked reports the index size through relayd_tracked_objects (summed
// over the source's watches).
func (w *Watch) setTracked(n int) {
	if d := n - w.tracked; d != 0 {
		w.trackedG.Add(float64(d))
		w.tracked = n
	}
}

// setUp records whether the watch is up and tells Options.State.
func (w *Watch) setUp(up bool) {
	if up {
		w.established.Store(true)
		w.restarts.OK()
	}
	w.up.Store(up)
	if w.o.State != nil {
		w.o.State.WatchState(w, up)
	}
}
