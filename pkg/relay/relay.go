// Package relay wires relayd's data path and runs it:
//
//	config → source (one Watcher per source and namespace)
//	       → event (payload shaping, CloudEvent, subject, Nats-Msg-Id)
//	       → watch (the per-watch engine: object index, suppression, gap deletes)
//	       → sink (JetStream pipeline per watch, acked watermark)
//	       → checkpoint (ConfigMap, coalesced, never ahead of the watermark)
//
// Run makes the connections, starts the background components as one run
// group in a visible order, runs every watch (pkg/watch) in its own
// goroutine, serves /metrics, /healthz and /readyz (internal/health), and
// performs the graceful shutdown sequence of docs/OPERATIONS.md,
// "Operations". With sharding on, pkg/shard decides which sources run here.
package relay

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"

	"github.com/relayd/relayd/internal/health"
	"github.com/relayd/relayd/internal/retry"
	"github.com/relayd/relayd/pkg/checkpoint"
	"github.com/relayd/relayd/pkg/config"
	"github.com/relayd/relayd/pkg/event"
	"github.com/relayd/relayd/pkg/heartbeat"
	"github.com/relayd/relayd/pkg/index"
	"github.com/relayd/relayd/pkg/metrics"
	"github.com/relayd/relayd/pkg/natsconn"
	"github.com/relayd/relayd/pkg/resync"
	"github.com/relayd/relayd/pkg/sink"
	"github.com/relayd/relayd/pkg/source"
	"github.com/relayd/relayd/pkg/stream"
	"github.com/relayd/relayd/pkg/watch"
)

// Options are Run's dependencies.
type Options struct {
	Config     *config.Config       // loaded and validated
	RestConfig *rest.Config         // apiserver access
	Logger     *zap.Logger          // required
	Registry   *prometheus.Registry // metrics are registered here and served from it
	// MetricsAddr serves /metrics ("" = not served), HealthAddr serves
	// /healthz and /readyz ("" = not served). They may be equal.
	MetricsAddr string
	HealthAddr  string
	// Ready, if set, receives the listeners' addresses once serving.
	Ready func(metricsAddr, healthAddr string)
	// Identity names this replica in the sharding Leases (sharding.enabled);
	// default: the host name. cmd/relayd passes $POD_NAME.
	Identity string
	// IndexCheck, if set, builds the index consistency check run after
	// every relist (internal/indexcheck's NewHook: the tests and test
	// builds, -tags testbuild); the shipped binary passes nil.
	IndexCheck IndexCheckFunc
	ObjectHook watch.ObjectHook // tests: told of each object inside its handling (watch.ObjectHook)
}

// IndexCheckFunc builds the index consistency check of the watches over
// the index bucket b (Options.IndexCheck): kube lists, self are relayd's
// own objects (left out as the watches leave them out), fail stops Run.
type IndexCheckFunc func(b *index.Bucket, kube source.Clients, self watch.SelfFilter, fail func(error)) watch.RelistHook

func (o *Options) validate() error {
	var errs []error
	if o.Config == nil {
		errs = append(errs, errors.New("relay: Options.Config is required"))
	}
	if o.RestConfig == nil {
		errs = append(errs, errors.New("relay: Options.RestConfig is required"))
	}
	if o.Logger == nil {
		errs = append(errs, errors.New("relay: Options.Logger is required"))
	}
	if o.Registry == nil {
		errs = append(errs, errors.New("relay: Options.Registry is required"))
	}
	return errors.Join(errs...)
}

// relay is one running instance.
type relay struct {
	o      Options
	cfg    *config.Config
	log    *zap.Logger
	m      *metrics.Metrics
	natsc  *natsconn.Conn // dials NATS; reports its state to r.ready and the metric (OnReason)
	nc     *nats.Conn
	js     jetstream.JetStream
	store  *checkpoint.Store
	sink   *sink.Sink
	ctl    *resync.Server // answers `relayd resync` for the sources running here
	disco  discovery.DiscoveryInterface
	leases coordinationv1client.LeasesGetter
	httpc  *http.Client // the watches' and lists': at most source.DefaultOpening opening at once

	mu     sync.Mutex
	active map[string][]*watch.Watch // the watches of the sources this replica runs
	events *index.CatchUpReader      // the event stream, for the index catch-up

	// ready is readiness, fed by the components (see newConditions); the
	// watches wait on it for what they need.
	ready *health.Conditions
	// bucket is the open index bucket: set before bucketOpen is closed; the
	// watches are built over it (newWatches).
	bucket     *index.Bucket
	bucketOpen chan struct{}
	fpKey      *event.FingerprintKey // nats.index.fingerprintKeyFile; nil: unkeyed fingerprints
	failed     chan error            // a fatal error (IndexCheck); Run stops
}

// The conditions of readiness, in the order /readyz reports them; each is
// set by the component named.
const (
	condStopping    = "stopping"    // shutdown
	condNATS        = "nats"        // natsconn (OnReason)
	condCheckpoints = "checkpoints" // readCheckpoints
	condStream      = "stream"      // stream.Keep
	condPublish     = "publish"     // the sink (OnUndeliverable)
	condSharding    = "sharding"    // runSharded (with sharding on)
	condIndex       = "index"       // openIndex
)

func newConditions() *health.Conditions {
	return health.NewConditions(
		health.Condition{Name: condStopping},
		health.Condition{Name: condNATS, Reason: "NATS not connected: connecting"},
		health.Condition{Name: condCheckpoints, Reason: "checkpoints not loaded"},
		health.Condition{Name: condStream, Reason: "stream not usable: checking"},
		health.Condition{Name: condPublish},
		health.Condition{Name: condSharding},
		health.Condition{Name: condIndex, Reason: "index bucket not open: opening"},
	)
}

// Run runs relayd until ctx is cancelled, then shuts down gracefully. It
// returns an error only if it cannot start (bad options, a listener that
// cannot bind) or, with Options.IndexCheck, when a check fails; everything
// else after start is retried, not fatal.
func Run(ctx context.Context, o Options) error {
	r, err := newRelay(o)
	if err != nil {
		return err
	}
	// HTTP first, so /healthz answers while we connect.
	srv, err := health.Serve(health.Options{
		MetricsAddr: o.MetricsAddr, HealthAddr: o.HealthAddr, Registry: o.Registry,
		NotReady: r.notReadyReason, Logger: r.log, Ready: o.Ready,
	})
	if err != nil {
		return err
	}
	defer srv.Shutdown()
	if err := r.connectKube(); err != nil {
		return err
	}
	// NATS down or refusing relayd at start: retry (unready, saying why),
	// not a crash loop. SIGTERM meanwhile is a clean stop.
	if r.nc, err = r.natsc.Dial(ctx); err != nil {
		return nil
	}
	defer r.nc.Close()
	if err := r.connectJetStream(); err != nil {
		return err
	}
	return r.run(ctx)
}

// newRelay validates o and builds a relay with its metrics and its NATS
// connection (not yet dialled).
func newRelay(o Options) (*relay, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	m, err := metrics.New(o.Registry)
	if err != nil {
		return nil, fmt.Errorf("relay: register metrics: %w", err)
	}
	r := &relay{o: o, cfg: o.Config, log: o.Logger, m: m, failed: make(chan error, 1), active: map[string][]*watch.Watch{}, ready: newConditions(), bucketOpen: make(chan struct{})}
	if r.fpKey, err = event.ReadFingerprintKey(r.cfg.NATS.Index.FingerprintKeyFile); err != nil {
		return nil, fmt.Errorf("nats.index.fingerprintKeyFile: %w", err)
	}
	for i := range r.cfg.Sources {
		r.m.InitSource(r.cfg.Sources[i].Name)
	}
	r.m.SetReadiness(r.notReadyReason)
	r.natsc, err = natsconn.New(natsconn.Options{
		Config: &r.cfg.NATS, Logger: r.log,
		OnReason: func(why string) {
			r.m.NATSConnected.Set(b2f(why == ""))
			r.ready.Set(condNATS, prefixed("NATS not connected: ", why))
		},
		// Publishes made while disconnected wait here for the reconnect:
		// at most the in-flight byte bound, plus requests (stream checks,
		// reads) made meanwhile. A publish that does not fit fails and is
		// retried, never lost.
		Extra: []nats.Option{nats.ReconnectBufSize(int(r.cfg.NATS.MaxInFlightBytes) + 4<<20)},
	})
	if err != nil {
		return nil, err
	}
	return r, nil
}

// run starts relayd's components as one run group, in this order: the
// stream check, the checkpoints (load, then periodic writes), and the
// sources (which open the index bucket first: startSources). Watches wait
// for the checkpoints and NATS before each attempt (newWatches). It runs
// until ctx ends or a fatal error, then shuts down: sources first, the
// rest after them.
func (r *relay) run(ctx context.Context) error {
	runCtx, stopRun := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRun()
	var g errgroup.Group
	for _, run := range []func(context.Context){r.keepStream, r.runCheckpoints} {
		g.Go(func() error { run(runCtx); return nil })
	}
	srcCtx, stopSources := context.WithCancel(runCtx)
	var sources sync.WaitGroup
	sources.Go(func() { r.startSources(srcCtx, &sources) })
	hb := heartbeat.New(heartbeat.Options{Config: r.cfg, Each: r.eachWatch, Publisher: r.sink, Connected: r.natsc.Up,
		Logger: r.log.Named("heartbeat"), Metrics: r.m.Heartbeat})
	sources.Go(func() { hb.Run(srcCtx) }) // stops with the sources
	var fatal error
	select {
	case <-ctx.Done():
	case fatal = <-r.failed:
		r.log.Error("stopping", zap.Error(fatal))
	}
	r.shutdown(stopSources, &sources)
	stopRun()
	_ = g.Wait()
	return fatal
}

// startSources starts the sources this replica runs: with sharding, the
// sharder, which starts those whose Lease it holds (each waits for the
// index bucket: runShard); without, all of them, once it opened the index
// bucket.
func (r *relay) startSources(ctx context.Context, sources *sync.WaitGroup) {
	sharded := r.cfg.Sharding.Enabled
	if sharded {
		for i := range r.cfg.Sources {
			r.m.SourceLeader.WithLabelValues(r.cfg.Sources[i].Name).Set(0)
		}
		r.ready.Set(condSharding, "sharding not started: starting")
		sources.Go(func() { r.runSharded(ctx) })
	}
	if r.bucket = r.openIndex(ctx); r.bucket == nil {
		return
	}
	close(r.bucketOpen)
	if !sharded {
		r.startAll(ctx, sources)
	}
	r.ready.Set(condIndex, "")
}

// startAll starts every source (without sharding). Its watches are
// registered before the index condition is met, so readiness waits for
// all.
func (r *relay) startAll(ctx context.Context, sources *sync.WaitGroup) {
	for i := range r.cfg.Sources {
		src := &r.cfg.Sources[i]
		r.m.SourceLeader.WithLabelValues(src.Name).Set(1)
		ws := r.newWatches(src, r.bucket)
		r.setActive(src.Name, ws)
		sources.Go(func() {
			r.runSource(ctx, ws)
			r.setActive(src.Name, nil)
		})
	}
}

// fail stops Run with err (the first one wins).
func (r *relay) fail(err error) {
	select {
	case r.failed <- err:
	default:
	}
}

// shutdown is docs/OPERATIONS.md's "Operations" shutdown: readiness off, stop watches, drain in-flight
// publishes, write the final checkpoint (each source does the last three as
// it stops; the HTTP servers stop last, in Run's deferred call).
func (r *relay) shutdown(stopSources context.CancelFunc, sources *sync.WaitGroup) {
	t0 := time.Now()
	r.ready.Set(condStopping, "shutting down")
	r.log.Info("shutting down: readiness off, stopping watches")
	stopSources()
	sources.Wait()
	if r.ready.Met(condCheckpoints) {
		ctx, cancel := context.WithTimeout(context.Background(), r.cfg.Shutdown.DrainTimeout.Duration())
		defer cancel()
		if err := r.store.Flush(ctx); err != nil {
			r.log.Error("final checkpoint write failed", zap.Error(err), zap.String("effect", "the next start replays from the previous checkpoint"))
		} else {
			r.log.Info("final checkpoint written")
		}
	}
	if err := r.nc.FlushTimeout(time.Second); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		r.log.Debug("nats flush", zap.Error(err))
	}
	r.log.Info("shutdown complete", zap.Duration("took", time.Since(t0)))
}

// setActive records the watches of a source this replica runs (nil: none).
// relayd_checkpoint_last_write_timestamp_seconds follows the writes of
// their checkpoint keys from then on (checkpoint.Store.Follow); a source
// that stops running here loses its series.
func (r *relay) setActive(source string, ws []*watch.Watch) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ws == nil {
		delete(r.active, source)
		r.store.Unfollow(source)
		r.ctl.Stop(source)
		return
	}
	r.active[source] = ws
	r.ctl.Serve(source, resync.Targets(ws))
	keys := make([]string, len(ws))
	for i, w := range ws {
		keys[i] = w.Key()
	}
	r.store.Follow(source, keys)
}

// activeWatches lists the watches of every source this replica runs.
func (r *relay) activeWatches() []*watch.Watch {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*watch.Watch
	for _, ws := range r.active {
		out = append(out, ws...)
	}
	return out
}

// eachWatch calls f with every watch this replica runs (the heartbeats').
func (r *relay) eachWatch(f func(heartbeat.Watch)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ws := range r.active {
		for _, w := range ws {
			f(w)
		}
	}
}

func (r *relay) connectKube() error {
	cfg, httpc, watches, err := source.Connect(r.o.RestConfig)
	if err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	r.httpc = watches
	cs, err := kubernetes.NewForConfigAndClient(cfg, httpc)
	if err != nil {
		return fmt.Errorf("relay: kubernetes client: %w", err)
	}
	r.disco = cs.Discovery()
	// The Leases and the checkpoint get a client (and rate limiter) each, so
	// that they never queue behind the discovery of thousands of watches
	// (docs/OPERATIONS.md, "Client-side rate limits").
	lc := rest.CopyConfig(cfg)
	sh := r.cfg.Sharding
	lc.QPS = float32(max(20, 4*float64(len(r.cfg.Sources))/sh.RetryPeriod.Duration().Seconds()))
	lc.Burst = int(2 * lc.QPS)
	lcs, err := kubernetes.NewForConfigAndClient(lc, httpc)
	if err != nil {
		return fmt.Errorf("relay: kubernetes client: %w", err)
	}
	r.leases = lcs.CoordinationV1()
	ccs, err := checkpoint.NewClient(cfg, httpc, r.cfg.CheckpointShards(), r.cfg.Checkpoint.FlushInterval.Duration())
	if err != nil {
		return err
	}
	store, err := checkpoint.New(checkpoint.Options{
		Client:        ccs,
		Namespace:     r.cfg.Checkpoint.Namespace,
		Name:          r.cfg.Checkpoint.Name,
		Shards:        r.cfg.CheckpointShards(),
		FlushInterval: r.cfg.Checkpoint.FlushInterval.Duration(),
		Logger:        r.log.Named("checkpoint"),
		Metrics:       r.m.Checkpoint,
	})
	if err != nil {
		return err
	}
	r.store = store
	return nil
}

// connectJetStream sets up what runs on the NATS connection: the
// JetStream API in the configured domain, the sink, and the event stream's
// reader for the index catch-up.
func (r *relay) connectJetStream() error {
	n := r.cfg.NATS
	js, err := natsconn.JetStream(r.nc, &r.cfg.NATS,
		jetstream.WithPublishAsyncTimeout(n.PublishTimeout.Duration()),
		jetstream.WithPublishAsyncMaxPending(max(4096, n.MaxInFlight*(len(r.cfg.Sources)+1)*4)),
	)
	if err != nil {
		return fmt.Errorf("relay: jetstream: %w", err)
	}
	r.js = js
	r.sink, err = sink.New(sink.Options{
		JetStream: r.js, Logger: r.log.Named("sink"), Metrics: r.m.Sink, MaxInFlight: n.MaxInFlight,
		MaxInFlightBytes:     int64(n.MaxInFlightBytesPerWatch),
		ProcessInFlightBytes: int64(n.MaxInFlightBytes),
		Connected:            r.natsc.Up,
		// Each publish says which stream must store it: another stream
		// that captured the subjects refuses it instead of storing it
		// (the checkpoint holds, /readyz says so).
		EventStream: n.Stream.Name, FollowUpStream: index.StreamName(n.Index.Bucket),
		OnUndeliverable: func(why string) { r.ready.Set(condPublish, prefixed("publishes not stored: ", why)) },
	})
	if err != nil {
		return err
	}
	r.ctl = resync.NewServer(resync.ServerOptions{
		Conn: r.nc, Prefix: r.cfg.Prefix, Cluster: r.cfg.Cluster, Logger: r.log.Named("resync"),
		// Answers only to the requesters' inboxes, never on relayd's own
		// subjects (events, control) nor on "$" ones (pkg/resync, ReplyPolicy).
		Replies: resync.ReplyPolicy{
			Inboxes: r.cfg.Resync.RequesterInboxPrefixes, Never: []string{r.cfg.Prefix, r.cfg.Prefix + "-ctl"},
		}, // and never on the event stream's subjects (keepStream: SetStreamSubjects)
		MinFullInterval: r.cfg.Resync.MinFullInterval.Duration(),
		Metrics:         r.m.Resync,
	})
	r.events = &index.CatchUpReader{
		JetStream: r.js, Stream: n.Stream.Name, Subject: r.cfg.StreamSubject(), Cluster: r.cfg.Cluster,
		Foreign: r.m.Index.ForeignMessages, OnLastSeq: r.sink.SeedStreamSeq,
	}
	return nil
}

// keepStream makes sure the stream exists and captures relayd's subjects
// (stream.Keep); until it does, relayd is unready with the reason.
func (r *relay) keepStream(ctx context.Context) {
	s := r.cfg.NATS.Stream
	storage := jetstream.FileStorage
	if s.Storage == config.StorageMemory {
		storage = jetstream.MemoryStorage
	}
	want := stream.Want{
		Name: s.Name, Subject: r.cfg.StreamSubject(), Create: s.Create,
		DuplicateWindow: s.DuplicateWindow.Duration(), Replicas: s.Replicas, Storage: storage,
		MaxAge: s.MaxAge.Duration(), MaxBytes: int64(s.MaxBytes),
	}
	stream.Keep(ctx, r.js, want, r.log, func(reason string, subjects []string) {
		r.ctl.SetStreamSubjects(subjects)
		r.ready.Set(condStream, prefixed("stream not usable: ", reason))
		r.m.StreamUsable.Set(b2f(reason == ""))
	})
}

// openIndex opens (or creates) the index bucket, retrying until it
// succeeds (nil: ctx ended first); until then, relayd is unready with the
// reason.
func (r *relay) openIndex(ctx context.Context) *index.Bucket {
	ix := r.cfg.NATS.Index
	o := index.BucketOptions{Name: ix.Bucket, Create: ix.CreateBucket(), Replicas: ix.Replicas, Storage: jetstream.FileStorage,
		FingerprintKeyID: r.fpKey.ID()}
	if ix.Storage == config.StorageMemory {
		o.Storage = jetstream.MemoryStorage
	}
	return index.OpenRetrying(ctx, r.js, o, r.log, func(err error) { r.ready.Set(condIndex, "index bucket not open: "+err.Error()) })
}

// runCheckpoints reads the checkpoint ConfigMap, retrying with backoff (a
// missing or forbidden ConfigMap is logged with what to do and keeps relayd
// unready, rather than crash-looping), then writes the checkpoints as they
// advance until ctx ends.
func (r *relay) runCheckpoints(ctx context.Context) {
	if r.readCheckpoints(ctx, "cannot load checkpoints; sources wait") {
		r.store.Run(ctx)
	}
}

// readCheckpoints reads the checkpoint ConfigMap, retrying with backoff
// until it succeeds (true) or ctx ends; msg is logged when the failures
// start, summarised while they last, and when they end (retry.Failures).
func (r *relay) readCheckpoints(ctx context.Context, msg string, fields ...zap.Field) bool {
	loaded := retry.Until(ctx, retry.Setup(), retry.NewFailures(r.log, msg), func(ctx context.Context) error {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		return r.store.Load(cctx)
	}, fields...)
	if loaded {
		r.ready.Set(condCheckpoints, "")
	}
	return loaded
}

// notReadyReason says why relayd is not ready ("" when it is): ready when
// it is not stopping, NATS is connected, the checkpoints are loaded, the
// stream is usable, no publish is refused by another stream or unanswered,
// sharding has started, the index bucket is open (each
// component sets its condition as its state changes) and every watch was
// established at least once. /readyz asks it on every request, relayd_ready
// (metrics.SetReadiness) on every scrape.
func (r *relay) notReadyReason() string {
	if why := r.ready.Reason(); why != "" {
		return why
	}
	var waiting []string
	for _, w := range r.activeWatches() {
		if !w.Established() {
			why := w.String()
			if e := w.LastError(); e != "" {
				why += " (" + e + ")"
			}
			waiting = append(waiting, why)
		}
	}
	if len(waiting) > 0 {
		sort.Strings(waiting)
		return "watches not yet established: " + strings.Join(waiting, ", ")
	}
	return ""
}

// prefixed is prefix+reason, or "" for no reason (the condition is met).
func prefixed(prefix, reason string) string {
	if reason == "" {
		return ""
	}
	return prefix + reason
}
