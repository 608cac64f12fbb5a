package relay

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/relayd/relayd/internal/failpoint"
	"github.com/relayd/relayd/internal/retry"
	"github.com/relayd/relayd/pkg/checkpoint"
	"github.com/relayd/relayd/pkg/config"
	"github.com/relayd/relayd/pkg/event"
	"github.com/relayd/relayd/pkg/index"
	"github.com/relayd/relayd/pkg/metrics"
	"github.com/relayd/relayd/pkg/shard"
	"github.com/relayd/relayd/pkg/sink"
	"github.com/relayd/relayd/pkg/source"
)

// watch is one (source, namespace): one Watcher, one pipeline, one
// checkpoint key.
type watch struct {
	src       *config.Source
	namespace string
	key       string
	log       *zap.Logger
	pipe      *sink.Pipeline

	resource    event.Resource
	resolved    bool
	watcher     *source.Watcher
	enc         *event.Encoder
	filter      map[event.Type]bool
	shaping     *event.Shaping // the source's drop/ignoreChanges paths; its frames are parsed with it
	fingerprint bool           // the source has ignoreChanges: objects get fingerprints
	tracked     int            // objects in idx as last reported to relayd_tracked_objects
	trackedG    prometheus.Gauge
	filtered    prometheus.Counter
	suppressed  prometheus.Counter
	established atomic.Bool
	up          atomic.Bool
	lastErr     atomic.Value // string: why the watch last stopped (for /readyz)

	// The object index (see pkg/index), owned by the watch goroutine.
	idx        *index.Index
	ixPrefix   string // bucket key prefix of this watch
	ixGen      string // bucket generation the index was loaded from
	ixSeqFloor uint64 // index seq of the loaded checkpoint
	ixLoaded   bool   // false: (re)load before running
	relist     string // reason of a list due at start; cleared when a list completes
	epochFloor uint64 // epoch recorded in the bucket (read at the first load): the epoch to start from when the checkpoint has none or an older one
	counts     event.SyncCounts
}

// setTracked reports the index size through relayd_tracked_objects (summed
// over the source's watches).
func (w *watch) setTracked(n int) {
	if d := n - w.tracked; d != 0 {
		w.trackedG.Add(float64(d))
		w.tracked = n
	}
}

func (w *watch) String() string {
	if w.namespace == "" {
		return w.src.Name
	}
	return w.src.Name + "/" + w.namespace
}

// newWatches builds the watches of one source: one per namespace (or one
// for all namespaces / a cluster-scoped kind), each with a new pipeline.
func (r *relay) newWatches(src *config.Source) []*watch {
	namespaces := src.Namespaces
	if len(namespaces) == 0 {
		namespaces = []string{""}
	}
	filter := map[event.Type]bool{}
	for _, t := range []config.EventType{config.EventAdded, config.EventModified, config.EventDeleted} {
		filter[event.Type(t)] = src.Publishes(t)
	}
	// Validate compiled the same options; an error here is a Config built
	// in Go without Validate, and the source then publishes unshaped.
	shaping, err := event.NewShaping(src.Shaping())
	if err != nil {
		r.log.Error("source shaping options do not compile; publishing without drop and ignoreChanges", zap.String("source", src.Name), zap.Error(err))
		shaping = nil
	}
	var ws []*watch
	for _, ns := range namespaces {
		w := &watch{src: src, namespace: ns, key: checkpoint.Key(src.Name, ns), filter: filter,
			shaping: shaping, fingerprint: shaping != nil && len(src.IgnoreChanges) > 0,
			trackedG: r.m.TrackedObjects.WithLabelValues(src.Name), filtered: r.m.EventsFiltered.WithLabelValues(src.Name),
			suppressed: r.m.EventsSuppressed.WithLabelValues(src.Name),
			ixPrefix:   index.Prefix(src.Name, ns)}
		w.log = r.log.With(zap.String("source", src.Name), zap.String("namespace", ns))
		w.pipe = r.sink.NewPipeline(src.Name, func(a sink.Advance) { r.advance(w, a) })
		ws = append(ws, w)
	}
	return ws
}

// runSource runs the watches ws of one source until ctx ends, then stops
// them: it waits for their goroutines, drains their publishes (up to
// shutdown.drainTimeout), closes their pipelines and writes the checkpoint.
// When it returns, nothing of the source runs any more and its position is
// stored (unless the write failed, which is logged): another replica may
// take it over. If ctx ended because this replica lost the source's Lease
// (shard.ErrLeaseLost), another replica may already run it: nothing is
// drained or written, and progress not yet written is discarded, so that
// the other replica's checkpoint cannot be moved back.
func (r *relay) runSource(ctx context.Context, ws []*watch) {
	var wg sync.WaitGroup
	for _, w := range ws {
		wg.Go(func() { r.supervise(ctx, w) })
	}
	wg.Wait()
	name := ws[0].src.Name
	lost := errors.Is(context.Cause(ctx), shard.ErrLeaseLost)
	drainCtx, cancel := context.WithTimeout(context.Background(), r.cfg.Shutdown.DrainTimeout.Duration())
	defer cancel()
	for _, w := range ws {
		if lost {
			break
		}
		wg.Go(func() {
			if err := w.pipe.Drain(drainCtx); err != nil {
				w.log.Warn("drain incomplete; these events were not checkpointed and will be replayed by whoever runs the source next", zap.Error(err))
			}
		})
	}
	wg.Wait()
	keys := make([]string, 0, len(ws))
	for _, w := range ws {
		w.pipe.Close()
		w.setTracked(0)
		keys = append(keys, w.key)
	}
	if lost {
		r.store.Discard(keys...)
		r.log.Warn("lost the Lease of the source: stopped without writing its checkpoint; the replica taking it over resumes from the last one written (replays are dropped by JetStream as duplicates)",
			zap.String("source", name))
	} else if r.checkpointsOK.Load() {
		if err := r.store.Flush(drainCtx); err != nil {
			r.log.Error("checkpoint write after stopping the source failed; it resumes from the previous checkpoint", zap.String("source", name), zap.Error(err))
		}
	}
	r.m.SourceUp.WithLabelValues(name).Set(0)
	r.m.CheckpointAge.DeleteLabelValues(name)
}

// supervise runs one watch until ctx ends: it restarts it with backoff
// after any error and recovers panics, so one bad source never stops the
// others.
func (r *relay) supervise(ctx context.Context, w *watch) {
	backoff := r.relistBackoff()
	for {
		t0 := time.Now()
		err := r.runOnce(ctx, w)
		if ctx.Err() != nil {
			return
		}
		r.setUp(w, false)
		if err != nil {
			w.lastErr.Store(err.Error())
		}
		if time.Since(t0) > 5*time.Minute {
			backoff = r.relistBackoff()
		}
		d := backoff.Step()
		w.log.Error("source stopped; restarting", zap.Error(err), zap.Duration("in", d))
		if !retry.Sleep(ctx, d) {
			return
		}
	}
}

// relistBackoff is watch.relistBackoff from the config, fresh (unstepped).
func (r *relay) relistBackoff() wait.Backoff {
	b := r.cfg.Watch.RelistBackoff
	return wait.Backoff{Duration: b.Initial.Duration(), Factor: b.Factor, Jitter: b.JitterFraction(), Steps: 1 << 30, Cap: b.Max.Duration()}
}

var errPanic = errors.New("panic")

// runOnce resolves the resource (if needed), waits for checkpoints and
// NATS, and runs the watcher. A panic is recovered and returned as an error.
func (r *relay) runOnce(ctx context.Context, w *watch) (err error) {
	defer func() {
		if p := recover(); p != nil {
			r.m.SourcePanics.WithLabelValues(w.src.Name).Inc()
			r.m.WatchRestarts.WithLabelValues(w.src.Name, metrics.ReasonPanic).Inc()
			w.log.Error("panic in source (recovered)", zap.Any("panic", p), zap.ByteString("stack", debug.Stack()))
			// Start over from the acknowledged position: anything after it is
			// re-read and deduplicated by its Nats-Msg-Id. The index is
			// reloaded from the bucket once the pipeline is drained.
			w.watcher = nil
			w.ixLoaded = false
			err = fmt.Errorf("%w: %v", errPanic, p)
		}
	}()
	for !r.checkpointsOK.Load() || !r.nc.IsConnected() || r.bucket.Load() == nil {
		if !retry.Sleep(ctx, 100*time.Millisecond) {
			return ctx.Err()
		}
	}
	if !w.resolved {
		res, err := resolve(r.disco, w.src)
		if err != nil {
			r.m.WatchRestarts.WithLabelValues(w.src.Name, metrics.ReasonResolve).Inc()
			return fmt.Errorf("source %q: %w", w.src.Name, err)
		}
		w.resource, w.resolved = res, true
	}
	if w.enc == nil {
		enc, err := event.NewEncoder(event.EncoderOptions{
			Prefix: r.cfg.Prefix, Cluster: r.cfg.Cluster, Source: w.src.Name,
			Binary:     r.cfg.CloudEvents.Mode == config.ModeBinary,
			MaxPayload: int(r.nc.MaxPayload()),
		})
		if err != nil {
			return fmt.Errorf("source %q: %w", w.src.Name, err)
		}
		w.enc = enc
	}
	if w.watcher == nil {
		client, err := r.restClient(w.resource)
		if err != nil {
			return fmt.Errorf("source %q: %w", w.src.Name, err)
		}
		wt, err := source.New(source.Options{
			Client: client, Resource: w.resource, Source: w.src.Name, Namespace: w.namespace,
			LabelSelector: w.src.LabelSelector, FieldSelector: w.src.FieldSelector,
			Timeout: r.cfg.Watch.Timeout.Duration(), IdleTimeout: r.cfg.Watch.IdleTimeout.Duration(),
			PageSize: int64(r.cfg.Watch.PageSize),
			Backoff:  r.relistBackoff(),
			Logger:   r.log.Named("source"), Metrics: r.m,
			OnState: func(up bool) { r.setUp(w, up) },
			// Payload metadata and reference publish nothing else. With
			// ignoreChanges the whole object is read all the same: a
			// change anywhere outside the ignored paths (a ConfigMap's
			// data, say) must still be published, as metadata.
			MetadataOnly: w.src.Payload != config.PayloadFull && !w.fingerprint,
			Shaping:      w.shaping,
		})
		if err != nil {
			return err
		}
		w.watcher = wt
	}
	if !w.ixLoaded {
		relist, err := r.loadIndex(ctx, w)
		if err != nil {
			return fmt.Errorf("source %q: object index: %w", w.src.Name, err)
		}
		if relist != "" {
			w.relist = relist
		}
		w.ixLoaded = true
	}
	st := source.Start{Snapshot: w.src.Initial != config.InitialNone, Relist: w.relist}
	// The acked watermark wins over the stored checkpoint (it is never
	// behind it) when a watcher is rebuilt after a panic.
	if rv, ep := w.pipe.Watermark(); rv != "" {
		st.ResourceVersion, st.Epoch = rv, ep
	} else if pos, ok := r.store.Get(w.key); ok {
		st.ResourceVersion, st.Epoch = pos.ResourceVersion, max(pos.Epoch, w.epochFloor)
	} else {
		st.Epoch = w.epochFloor
	}
	handlerFailed := false
	err = w.watcher.Run(ctx, st, func(ctx context.Context, it *source.Item) error {
		err := r.handle(ctx, w, it)
		handlerFailed = handlerFailed || err != nil
		return err
	})
	if handlerFailed && ctx.Err() == nil {
		// The handler may have indexed an item it then could not submit
		// (its watch's context ended meanwhile); the watcher reads that
		// item again. Reload the index from the bucket (once the pipeline
		// drained) so that the replay writes its index entry too. Other
		// errors (forbidden, not found) leave the index as acked: no reload.
		w.ixLoaded = false
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		// Not found may mean a deleted CRD: resolve again next time.
		w.resolved = false
		w.enc = nil
		w.watcher = nil
	}
	return err
}

func (r *relay) restClient(res event.Resource) (rest.Interface, error) {
	cfg := rest.CopyConfig(r.o.RestConfig)
	cfg.GroupVersion = &schema.GroupVersion{Group: res.Group, Version: res.Version}
	cfg.APIPath = "/apis"
	if res.Group == "" {
		cfg.APIPath = "/api"
	}
	cfg.ContentType = "application/json"
	cfg.AcceptContentTypes = "application/json"
	cfg.NegotiatedSerializer = scheme.Codecs.WithoutConversion()
	if cfg.UserAgent == "" {
		cfg.UserAgent = "relayd"
	}
	return rest.RESTClientForConfigAndClient(cfg, r.httpc)
}

func (r *relay) setUp(w *watch, up bool) {
	if up {
		w.established.Store(true)
	}
	w.up.Store(up)
	all := 1.0
	for _, o := range r.activeWatches() {
		if o.src == w.src && !o.up.Load() {
			all = 0
		}
	}
	r.m.SourceUp.WithLabelValues(w.src.Name).Set(all)
}

// isSelf reports relayd's own objects: the checkpoint ConfigMap and, with
// sharding, the source Leases (renewed every few seconds). relayd must not
// feed on its own writes.
func (r *relay) isSelf(w *watch, m *event.Meta) bool {
	if m.Namespace != r.cfg.Checkpoint.Namespace {
		return false
	}
	switch {
	case w.resource.Group == "" && w.resource.Resource == "configmaps":
		return m.Name == r.cfg.Checkpoint.Name
	case r.cfg.Sharding.Enabled && w.resource.Group == "coordination.k8s.io" && w.resource.Resource == "leases":
		for i := range r.cfg.Sources {
			if m.Name == shard.LeaseName(r.cfg.Sharding.LeasePrefix, r.cfg.Sources[i].Name) {
				return true
			}
		}
	}
	return false
}

// epochGate is the pipeline object key of a relist's epoch write and its
// sync.started: no uid (a NUL byte cannot be in one), so it only orders
// the two.
const epochGate = "\x00epoch"

// handle turns one source item into pipeline entries, keeping the object
// index: live changes update it; a list is compared with it (unchanged
// objects are not republished, new and changed ones are, and at the end
// every indexed object the list did not contain is published as deleted).
func (r *relay) handle(ctx context.Context, w *watch, it *source.Item) error {
	failpoint.Inject(failpoint.RelayHandle)
	switch it.Kind {
	case source.ItemObject:
		meta := &it.Object.Meta
		if r.isSelf(w, meta) {
			// Not even a position move: see checkpoint's package doc.
			return nil
		}
		obj := index.Object{UID: meta.UID, Namespace: meta.Namespace, Name: meta.Name, ResourceVersion: meta.ResourceVersion}
		if w.fingerprint {
			obj.Fingerprint = it.Object.Fingerprint(w.shaping)
		}
		typ := it.Type
		changed := true
		if it.Origin == event.OriginWatch {
			switch {
			case typ == event.Deleted:
				changed = w.idx.Delete(meta.UID)
			case typ == event.Modified && w.idx.Same(obj):
				// Only ignoreChanges fields changed: not published, and
				// the index keeps the version that was; the position
				// still moves on.
				w.suppressed.Inc()
				return w.pipe.Submit(ctx, sink.Entry{ObjectKey: meta.UID, ResourceVersion: it.ResourceVersion, Epoch: it.Epoch})
			default:
				changed = w.idx.Put(obj)
			}
		} else {
			// A list item: list frames are all ADDED; the index tells.
			w.counts.Total++
			switch w.idx.Observe(obj) {
			case index.Unchanged:
				w.counts.Unchanged++
				return nil // already published; list items do not move the position
			case index.Added:
				typ = event.Added
				w.counts.Added++
			case index.Modified:
				typ = event.Modified
				w.counts.Modified++
			}
		}
		w.setTracked(w.idx.Len())
		// The index write; none when the index already had this (a replay
		// after a restart, or a delete of an object it never knew).
		var ix *event.Message
		if changed {
			if typ == event.Deleted {
				ix = r.bucket.Load().DeleteMsg(w.ixPrefix, meta.UID)
			} else {
				ix = r.bucket.Load().PutMsg(w.ixPrefix, obj)
			}
		}
		if !w.filter[typ] {
			w.filtered.Inc()
			return w.pipe.Submit(ctx, sink.Entry{Index: ix, ObjectKey: meta.UID, ResourceVersion: it.ResourceVersion, Epoch: it.Epoch})
		}
		data, dropped := it.Object.AppendShaped(nil, event.PayloadMode(w.src.Payload), w.shaping)
		msg, err := w.enc.Encode(&event.Change{
			Type: typ, Origin: it.Origin, Epoch: it.Epoch, Time: it.ReadAt.UTC(),
			Resource: w.resource, Meta: *meta, Payload: event.PayloadMode(w.src.Payload), Data: data, Dropped: dropped,
		})
		if err != nil {
			// Only an object whose bare reference exceeds the NATS max payload
			// gets here. It is reported loudly and counted; the position moves
			// on so one such object cannot wedge the source.
			r.m.PublishErrors.WithLabelValues(w.src.Name, "unencodable").Inc()
			w.log.Error("event cannot be encoded; NOT published", zap.String("object", meta.Namespace+"/"+meta.Name),
				zap.String("uid", meta.UID), zap.String("resourceVersion", meta.ResourceVersion), zap.Error(err))
			return w.pipe.Submit(ctx, sink.Entry{Index: ix, ObjectKey: meta.UID, ResourceVersion: it.ResourceVersion, Epoch: it.Epoch})
		}
		if msg.Oversize {
			r.m.Oversize.WithLabelValues(w.src.Name).Inc()
			w.log.Warn("object exceeds the NATS max payload; sent as a reference", zap.String("object", meta.Namespace+"/"+meta.Name),
				zap.Int("bytes", len(it.Object.Raw)))
		}
		return w.pipe.Submit(ctx, sink.Entry{
			Msg: &msg, Index: ix, ResourceVersion: it.ResourceVersion, Epoch: it.Epoch, ObjectKey: meta.UID,
			ReadAt: it.ReadAt, Type: typ, Origin: it.Origin,
		})
	case source.ItemBookmark:
		return w.pipe.Submit(ctx, sink.Entry{ResourceVersion: it.ResourceVersion, Epoch: it.Epoch, Bookmark: true})
	case source.ItemSyncStarted:
		w.idx.BeginSync()
		w.counts = event.SyncCounts{}
		r.m.ResyncMarkers.WithLabelValues(w.src.Name, "started").Inc()
		msg := w.enc.Control(it.Sync)
		// The epoch goes into the bucket before sync.started is published
		// (the shared key makes Submit wait for the write's ack): were
		// relayd to die between the two the other way round, the next
		// relist would reuse this epoch, and JetStream would drop its
		// markers as duplicates of this one's. A skipped epoch is harmless.
		if err := w.pipe.Submit(ctx, sink.Entry{Index: r.bucket.Load().EpochMsg(w.ixPrefix, it.Epoch), ObjectKey: epochGate, Epoch: it.Epoch}); err != nil {
			return err
		}
		return w.pipe.Submit(ctx, sink.Entry{Msg: &msg, ObjectKey: epochGate, Epoch: it.Epoch, ReadAt: it.ReadAt})
	case source.ItemSyncCompleted:
		if err := r.syncDeleted(ctx, w, &sourceSync{epoch: it.Epoch, readAt: it.ReadAt}); err != nil {
			return err
		}
		it.Sync.Counts = w.counts
		r.m.ResyncMarkers.WithLabelValues(w.src.Name, "completed").Inc()
		msg := w.enc.Control(it.Sync)
		if err := w.pipe.Submit(ctx, sink.Entry{Msg: &msg, ResourceVersion: it.ResourceVersion, Epoch: it.Epoch, ReadAt: it.ReadAt}); err != nil {
			return err
		}
		w.relist = ""
		w.log.Info("relist compared with the object index", zap.String("reason", it.Sync.Reason), zap.Uint64("epoch", it.Epoch),
			zap.Int64("added", w.counts.Added), zap.Int64("modified", w.counts.Modified), zap.Int64("deleted", w.counts.Deleted),
			zap.Int64("unchanged", w.counts.Unchanged), zap.Int("indexed", w.idx.Len()))
		if r.o.IndexCheck {
			if err := r.checkIndex(ctx, w, it.ResourceVersion); err != nil {
				err = fmt.Errorf("index consistency check failed for %s: %w", w, err)
				r.fail(err)
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("unknown item kind %d", it.Kind)
}
