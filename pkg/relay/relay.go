// Package relay wires relayd's data path and supervises it:
//
//	config → source (one Watcher per source and namespace)
//	       → event (payload shaping, CloudEvent, subject, Nats-Msg-Id)
//	       → sink (JetStream pipeline per watch, acked watermark)
//	       → checkpoint (ConfigMap, coalesced, never ahead of the watermark)
//
// Every watch runs in its own goroutine under a supervisor that restarts it
// with backoff, recovers panics (counted and logged with the stack), and
// never lets one source stop the others. Run also serves /metrics, /healthz
// and /readyz, and performs the graceful shutdown sequence of docs/OPERATIONS.md, "Operations".
package relay

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"

	"github.com/relayd/relayd/internal/retry"
	"github.com/relayd/relayd/pkg/checkpoint"
	"github.com/relayd/relayd/pkg/config"
	"github.com/relayd/relayd/pkg/index"
	"github.com/relayd/relayd/pkg/metrics"
	"github.com/relayd/relayd/pkg/natsconn"
	"github.com/relayd/relayd/pkg/sink"
	"github.com/relayd/relayd/pkg/stream"
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
	// Ready, if set, receives the listeners' addresses once serving (tests
	// use ":0").
	Ready func(metricsAddr, healthAddr string)
	// Identity names this replica in the sharding Leases (sharding.enabled);
	// default: the host name. cmd/relayd passes $POD_NAME.
	Identity string
	// IndexCheck compares the object index with a consistent LIST after
	// every relist and stops Run with an error on any difference (tests;
	// see IndexCheckEnv).
	IndexCheck bool
}

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
	natsc  *natsconn.Conn // set before HTTP serves: /readyz asks it why NATS is not connected
	nc     *nats.Conn
	js     jetstream.JetStream
	store  *checkpoint.Store
	sink   *sink.Sink
	disco  discovery.DiscoveryInterface
	leases coordinationv1client.LeasesGetter
	httpc  *http.Client

	mu     sync.Mutex
	active map[string][]*watch // the watches of the sources this replica runs

	ready         atomic.Bool // flipped off first on shutdown
	checkpointsOK atomic.Bool
	bucket        atomic.Pointer[index.Bucket] // set once the index bucket is open
	indexErr      atomic.Value                 // string: why it is not (yet)
	failed        chan error                   // a fatal error (IndexCheck); Run stops
	shardErr      atomic.Value                 // string: why sharding has not started ("" once it has)
	streamErr     atomic.Value                 // string: why the stream is not usable ("" when it is)
}

// Run runs relayd until ctx is cancelled, then shuts down gracefully. It
// returns an error only if it cannot start (bad options, a listener that
// cannot bind) or, with Options.IndexCheck, when a check fails; everything
// else after start is retried, not fatal.
func Run(ctx context.Context, o Options) error {
	if err := o.validate(); err != nil {
		return err
	}
	m, err := metrics.New(o.Registry)
	if err != nil {
		return fmt.Errorf("relay: register metrics: %w", err)
	}
	r := &relay{o: o, cfg: o.Config, log: o.Logger, m: m, failed: make(chan error, 1), active: map[string][]*watch{}}
	r.streamErr.Store("checking")
	for i := range r.cfg.Sources {
		r.m.InitSource(r.cfg.Sources[i].Name)
	}
	r.natsc, err = natsconn.New(natsconn.Options{
		Config: &r.cfg.NATS, Logger: r.log,
		OnConnected: func(up bool) { r.m.NATSConnected.Set(map[bool]float64{true: 1}[up]) },
		// Publishes made while disconnected wait here for the reconnect:
		// at most the in-flight byte bound, plus requests (stream checks,
		// reads) made meanwhile. A publish that does not fit fails and is
		// retried, never lost.
		Extra: []nats.Option{nats.ReconnectBufSize(r.cfg.NATS.MaxInFlightBytes + 4<<20)},
	})
	if err != nil {
		return err
	}

	// HTTP first, so /healthz answers while we connect.
	srv, err := r.serveHTTP()
	if err != nil {
		return err
	}
	defer srv.shutdown(r.log)

	if err := r.connectKube(); err != nil {
		return err
	}
	// NATS down or refusing relayd at start: retry (unready, saying why),
	// not a crash loop. SIGTERM meanwhile is a clean stop.
	if r.nc, err = r.natsc.Dial(ctx); err != nil {
		return nil
	}
	defer r.nc.Close()
	if err := r.jetStream(); err != nil {
		return err
	}

	s, err := sink.New(sink.Options{
		JetStream: r.js, Logger: r.log.Named("sink"), Metrics: m, MaxInFlight: r.cfg.NATS.MaxInFlight,
		MaxInFlightBytes:     int64(r.cfg.NATS.MaxInFlightBytesPerWatch),
		ProcessInFlightBytes: int64(r.cfg.NATS.MaxInFlightBytes),
		Connected:            r.nc.IsConnected,
	})
	if err != nil {
		return err
	}
	r.sink = s

	// Everything below runs until ctx ends.
	runCtx, stopRun := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRun()
	var bg sync.WaitGroup
	bg.Go(func() { r.watchStream(runCtx) })
	bg.Go(func() { r.openIndex(runCtx) })
	bg.Go(func() { r.loadCheckpoints(runCtx) })
	srcCtx, stopSources := context.WithCancel(runCtx)
	var sources sync.WaitGroup
	if r.cfg.Sharding.Enabled {
		for i := range r.cfg.Sources {
			r.m.SourceLeader.WithLabelValues(r.cfg.Sources[i].Name).Set(0)
		}
		r.shardErr.Store("starting")
		sources.Go(func() { r.runSharded(srcCtx) })
	} else {
		// Every source runs here (one replica). Watches are registered
		// before the readiness loop starts, so readiness waits for all.
		for i := range r.cfg.Sources {
			src := &r.cfg.Sources[i]
			r.m.SourceLeader.WithLabelValues(src.Name).Set(1)
			ws := r.newWatches(src)
			r.setActive(src.Name, ws)
			sources.Go(func() {
				r.runSource(srcCtx, ws)
				r.setActive(src.Name, nil)
			})
		}
	}
	bg.Go(func() { r.checkpointLoop(runCtx) })
	bg.Go(func() { r.readinessLoop(runCtx) })

	var fatal error
	select {
	case <-ctx.Done():
	case fatal = <-r.failed:
		r.log.Error("stopping", zap.Error(fatal))
	}
	r.shutdown(stopSources, &sources)
	stopRun()
	bg.Wait()
	return fatal
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
	r.ready.Store(false)
	r.log.Info("shutting down: readiness off, stopping watches")
	stopSources()
	sources.Wait()
	if r.checkpointsOK.Load() {
		ctx, cancel := context.WithTimeout(context.Background(), r.cfg.Shutdown.DrainTimeout.Duration())
		defer cancel()
		if err := r.store.Flush(ctx); err != nil {
			r.log.Error("final checkpoint write failed; the next start replays from the previous checkpoint", zap.Error(err))
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
func (r *relay) setActive(source string, ws []*watch) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ws == nil {
		delete(r.active, source)
		return
	}
	r.active[source] = ws
}

// activeWatches lists the watches of every source this replica runs.
func (r *relay) activeWatches() []*watch {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*watch
	for _, ws := range r.active {
		out = append(out, ws...)
	}
	return out
}

func (r *relay) connectKube() error {
	cfg := rest.CopyConfig(r.o.RestConfig)
	if cfg.UserAgent == "" {
		cfg.UserAgent = "relayd"
	}
	// client-go's default of 5 requests/s would throttle relists and
	// checkpoint writes of many sources; the apiserver's priority and
	// fairness protects it.
	if cfg.QPS == 0 {
		cfg.QPS, cfg.Burst = 50, 100
	}
	httpc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return fmt.Errorf("relay: kubernetes client: %w", err)
	}
	r.httpc = httpc
	cs, err := kubernetes.NewForConfigAndClient(cfg, httpc)
	if err != nil {
		return fmt.Errorf("relay: kubernetes client: %w", err)
	}
	r.disco = cs.Discovery()
	// The Leases get a client (and a client-side rate limiter) of their
	// own, sized for their polling, so that renewals never queue behind
	// other requests: a renewal that waits is a source that may be lost.
	lc := rest.CopyConfig(cfg)
	sh := r.cfg.Sharding
	lc.QPS = float32(max(20, 4*float64(len(r.cfg.Sources))/sh.RetryPeriod.Duration().Seconds()))
	lc.Burst = int(2 * lc.QPS)
	lcs, err := kubernetes.NewForConfigAndClient(lc, httpc)
	if err != nil {
		return fmt.Errorf("relay: kubernetes client: %w", err)
	}
	r.leases = lcs.CoordinationV1()
	store, err := checkpoint.New(checkpoint.Options{
		Client:        cs.CoreV1(),
		Namespace:     r.cfg.Checkpoint.Namespace,
		Name:          r.cfg.Checkpoint.Name,
		FlushInterval: r.cfg.Checkpoint.FlushInterval.Duration(),
		Logger:        r.log.Named("checkpoint"),
		Metrics:       checkpointMetrics{r.m},
	})
	if err != nil {
		return err
	}
	r.store = store
	return nil
}

// jetStream sets r.js: the JetStream API in the configured domain.
func (r *relay) jetStream() error {
	n := r.cfg.NATS
	js, err := natsconn.JetStream(r.nc, &r.cfg.NATS,
		jetstream.WithPublishAsyncTimeout(n.PublishTimeout.Duration()),
		jetstream.WithPublishAsyncMaxPending(max(4096, n.MaxInFlight*(len(r.cfg.Sources)+1)*4)),
	)
	if err != nil {
		return fmt.Errorf("relay: jetstream: %w", err)
	}
	r.js = js
	return nil
}

// streamCheckInterval is how often the stream is looked at again: an
// administrator may fix (or break) it while relayd runs, and another relayd
// sharing it may have replaced its subjects.
const streamCheckInterval = 30 * time.Second

// watchStream makes sure the stream exists and captures relayd's subjects
// (see package stream), at start and every streamCheckInterval; until it
// does, relayd is unready with the reason. Warnings are logged when they
// first appear.
func (r *relay) watchStream(ctx context.Context) {
	s := r.cfg.NATS.Stream
	storage := jetstream.FileStorage
	if s.Storage == config.StorageMemory {
		storage = jetstream.MemoryStorage
	}
	want := stream.Want{
		Name: s.Name, Subject: r.cfg.StreamSubject(), Create: s.Create,
		DuplicateWindow: s.DuplicateWindow.Duration(), Replicas: s.Replicas, Storage: storage,
		MaxAge: s.MaxAge.Duration(), MaxBytes: s.MaxBytes,
	}
	backoff := wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 0.5, Steps: 1 << 30, Cap: streamCheckInterval}
	var lastErr, lastWarn string
	for {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		res, err := stream.Ensure(cctx, r.js, want)
		cancel()
		reason := res.Blocker
		if err != nil {
			reason = err.Error()
		}
		// While the stream is not usable, look again soon: an administrator
		// is probably fixing it.
		next := streamCheckInterval
		if reason != "" {
			next = backoff.Step()
		} else {
			backoff.Duration = 500 * time.Millisecond
		}
		r.streamErr.Store(reason)
		r.m.StreamUsable.Set(map[bool]float64{true: 1}[reason == ""])
		switch {
		case reason != "" && reason != lastErr:
			r.log.Error("the stream is not usable; relayd stays unready", zap.String("stream", s.Name), zap.String("reason", reason))
		case reason == "" && lastErr != "":
			r.log.Info("the stream is usable again", zap.String("stream", s.Name))
		}
		lastErr = reason
		if res.Created {
			r.log.Info("stream created", zap.String("stream", s.Name), zap.Strings("subjects", res.Found.Subjects),
				zap.Duration("maxAge", res.Found.MaxAge), zap.Duration("duplicateWindow", res.Found.Duplicates))
		}
		if res.Updated {
			r.log.Info("added relayd's subject to the stream; nothing else of it was changed", zap.String("stream", s.Name),
				zap.String("subject", want.Subject), zap.Strings("subjects", res.Found.Subjects))
		}
		if w := strings.Join(res.Warnings, "\n"); err == nil && w != lastWarn {
			for _, msg := range res.Warnings {
				r.log.Warn("stream setting differs from the config", zap.String("stream", s.Name), zap.String("finding", msg))
			}
			lastWarn = w
		}
		if !retry.Sleep(ctx, next) {
			return
		}
	}
}

// loadCheckpoints reads the checkpoint ConfigMap, retrying with backoff: a
// missing or forbidden ConfigMap is logged with what to do and keeps relayd
// unready, rather than crash-looping.
func (r *relay) loadCheckpoints(ctx context.Context) {
	if r.readCheckpoints(ctx, "cannot load checkpoints; sources wait") {
		go r.store.Run(ctx)
	}
}

// readCheckpoints reads the checkpoint ConfigMap, retrying with backoff
// until it succeeds (true) or ctx ends; msg is logged when the failures
// start, summarised while they last, and when they end (retry.Failures).
func (r *relay) readCheckpoints(ctx context.Context, msg string, fields ...zap.Field) bool {
	backoff := wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 0.5, Steps: 1 << 30, Cap: time.Minute}
	failures := retry.NewFailures(r.log, msg)
	for {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := r.store.Load(cctx)
		cancel()
		if err == nil {
			failures.OK(fields...)
			r.checkpointsOK.Store(true)
			return true
		}
		failures.Fail(err, fields...)
		if !retry.Sleep(ctx, backoff.Step()) {
			return false
		}
	}
}

// checkpointLoop keeps relayd_checkpoint_age_seconds current.
func (r *relay) checkpointLoop(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		oldest := map[string]time.Time{}
		for _, w := range r.activeWatches() {
			at := r.store.LastPersisted(w.key)
			if at.IsZero() {
				continue
			}
			if o, ok := oldest[w.src.Name]; !ok || at.Before(o) {
				oldest[w.src.Name] = at
			}
		}
		for name, at := range oldest {
			r.m.CheckpointAge.WithLabelValues(name).Set(time.Since(at).Seconds())
		}
	}
}

// readinessLoop: ready when checkpoints are loaded, NATS is connected and
// every watch was established at least once.
func (r *relay) readinessLoop(ctx context.Context) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.ready.Store(r.notReadyReason() == "")
	}
}

func (r *relay) notReadyReason() string {
	if why := r.natsc.Reason(); why != "" {
		return "NATS not connected: " + why
	}
	if !r.checkpointsOK.Load() {
		return "checkpoints not loaded"
	}
	if why, _ := r.streamErr.Load().(string); why != "" {
		return "stream not usable: " + why
	}
	if msg, _ := r.shardErr.Load().(string); msg != "" {
		return "sharding not started: " + msg
	}
	if r.bucket.Load() == nil {
		msg, _ := r.indexErr.Load().(string)
		if msg == "" {
			msg = "opening"
		}
		return "index bucket not open: " + msg
	}
	var waiting []string
	for _, w := range r.activeWatches() {
		if !w.established.Load() {
			why := w.String()
			if e, _ := w.lastErr.Load().(string); e != "" {
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

type httpServers struct{ servers []*http.Server }

func (h *httpServers) shutdown(log *zap.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, s := range h.servers {
		if err := s.Shutdown(ctx); err != nil {
			log.Warn("http shutdown", zap.Error(err))
		}
	}
}

func (r *relay) serveHTTP() (*httpServers, error) {
	metricsMux, healthMux := http.NewServeMux(), http.NewServeMux()
	metricsMux.Handle("/metrics", promhttp.HandlerFor(r.o.Registry, promhttp.HandlerOpts{Registry: r.o.Registry}))
	healthMux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		// Alive as long as the process serves HTTP; never tied to NATS or the apiserver.
		_, _ = w.Write([]byte("ok\n"))
	})
	healthMux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if r.ready.Load() {
			_, _ = w.Write([]byte("ok\n"))
			return
		}
		reason := r.notReadyReason()
		if reason == "" {
			reason = "shutting down"
		}
		http.Error(w, "not ready: "+reason, http.StatusServiceUnavailable)
	})
	type bind struct {
		addr string
		mux  *http.ServeMux
	}
	var binds []bind
	switch {
	case r.o.MetricsAddr != "" && r.o.MetricsAddr == r.o.HealthAddr:
		metricsMux.Handle("/", healthMux)
		binds = append(binds, bind{r.o.MetricsAddr, metricsMux})
	default:
		if r.o.MetricsAddr != "" {
			binds = append(binds, bind{r.o.MetricsAddr, metricsMux})
		}
		if r.o.HealthAddr != "" {
			binds = append(binds, bind{r.o.HealthAddr, healthMux})
		}
	}
	h := &httpServers{}
	addrs := map[*http.ServeMux]string{}
	for _, b := range binds {
		l, err := net.Listen("tcp", b.addr)
		if err != nil {
			h.shutdown(r.log)
			return nil, fmt.Errorf("relay: listen on %s: %w", b.addr, err)
		}
		s := &http.Server{Handler: b.mux, ReadHeaderTimeout: 10 * time.Second}
		h.servers = append(h.servers, s)
		addrs[b.mux] = l.Addr().String()
		go func() {
			if err := s.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				r.log.Error("http server stopped", zap.String("addr", b.addr), zap.Error(err))
			}
		}()
	}
	if r.o.Ready != nil {
		ma, ha := addrs[metricsMux], addrs[healthMux]
		if ha == "" {
			ha = ma
		}
		r.o.Ready(ma, ha)
	}
	return h, nil
}

// checkpointMetrics adapts Metrics to checkpoint.Metrics.
type checkpointMetrics struct{ m *metrics.Metrics }

func (c checkpointMetrics) CheckpointWrite(err error) {
	if err != nil {
		c.m.CheckpointErrors.Inc()
		return
	}
	c.m.CheckpointWrites.Inc()
}

func (c checkpointMetrics) CheckpointPersisted(string, time.Time) {}
