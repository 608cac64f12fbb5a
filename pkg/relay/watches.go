package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/relayd/relayd/pkg/checkpoint"
	"github.com/relayd/relayd/pkg/config"
	"github.com/relayd/relayd/pkg/event"
	"github.com/relayd/relayd/pkg/shard"
	"github.com/relayd/relayd/pkg/sink"
	"github.com/relayd/relayd/pkg/source"
	"github.com/relayd/relayd/pkg/watch"
)

// IndexCheckEnv is the environment variable that turns on the index
// consistency check (for tests): after every relist relayd compares its
// object index with a consistent LIST at the relist's resourceVersion and
// stops on any difference. cmd/relayd maps it to Options.IndexCheck.
const IndexCheckEnv = "RELAYD_INDEX_CHECK"

// running is one watch this replica runs, with its pipeline.
type running struct {
	*watch.Watch
	pipe *sink.Pipeline
}

// newWatches builds the watches of one source: one per namespace (or one
// for all namespaces / a cluster-scoped kind), each with a new pipeline.
func (r *relay) newWatches(src *config.Source) []running {
	namespaces := src.Namespaces
	if len(namespaces) == 0 {
		namespaces = []string{""}
	}
	// Validate compiled the same options; an error here is a Config built
	// in Go without Validate, and the source then publishes unshaped.
	shaping, err := event.NewShaping(src.Shaping())
	if err != nil {
		r.log.Error("source shaping options do not compile; publishing without drop and ignoreChanges", zap.String("source", src.Name), zap.Error(err))
		shaping = nil
	}
	ws, resolver := []running(nil), source.NewSharedResolver(r.disco) // one discovery request for all its watches
	for _, ns := range namespaces {
		var w *watch.Watch
		pipe := r.sink.NewPipeline(src.Name, func(a sink.Advance) { w.Advance(a) })
		w = watch.New(watch.Options{
			Source: src, Namespace: ns, Config: r.cfg, Logger: r.log, Metrics: r.m.Watch,
			Shaping: shaping, FingerprintKey: r.fpKey, MaxPayload: int(r.nc.MaxPayload()), Backoff: r.relistBackoff,
			Pipe: pipe, Positions: r.store, Stream: r.events,
			Ready:      r.watchesMayRun,
			Bucket:     func() watch.Bucket { return r.bucket.Load() },
			Resolve:    resolver.Resolve,
			NewWatcher: r.newWatcher,
			IsSelf:     r.isSelf,
			OnState:    func(bool) { r.sourceUp(src.Name) },
			IndexCheck: r.o.IndexCheck, RestClient: r.restClient, Fail: r.fail,
		})
		ws = append(ws, running{w, pipe})
	}
	return ws
}

// watchesMayRun waits until the checkpoints are loaded, NATS is connected
// and the index bucket is open.
func (r *relay) watchesMayRun(ctx context.Context) error {
	return r.ready.Wait(ctx, condCheckpoints, condNATS, condIndex)
}

// newWatcher builds a source.Watcher with a REST client for o.Resource.
func (r *relay) newWatcher(o source.Options) (watch.Watcher, error) {
	client, err := r.restClient(o.Resource)
	if err != nil {
		return nil, fmt.Errorf("source %q: %w", o.Source, err)
	}
	o.Client = client
	wt, err := source.New(o)
	if err != nil {
		return nil, err
	}
	return wt, nil
}

// runSource runs the watches ws of one source until ctx ends, then stops
// them: it waits for their goroutines, drains their publishes (up to
// shutdown.drainTimeout; a drained watch's position is settled past the
// stream, checkpoint.Store.Settle), closes their pipelines and writes the
// checkpoint. When it returns, nothing of the source runs any more and its
// position is stored (unless the write failed, which is logged): another
// replica may take it over. If ctx ended because this replica lost the
// source's Lease (shard.ErrLeaseLost), another replica may already run it:
// nothing is drained or written, and unwritten progress is discarded, so
// that the other replica's checkpoint cannot be moved back.
func (r *relay) runSource(ctx context.Context, ws []running) {
	var wg sync.WaitGroup
	for _, w := range ws {
		wg.Go(func() { w.Run(ctx) })
	}
	wg.Wait()
	name := ws[0].Source().Name
	lost := errors.Is(context.Cause(ctx), shard.ErrLeaseLost)
	drainCtx, cancel := context.WithTimeout(context.Background(), r.cfg.Shutdown.DrainTimeout.Duration())
	defer cancel()
	for _, w := range ws {
		if lost {
			break
		}
		wg.Go(func() {
			if err := w.pipe.Drain(drainCtx); err != nil {
				r.log.Warn("drain incomplete", zap.String("source", name), zap.String("namespace", w.Namespace()), zap.Error(err),
					zap.String("effect", "events not acknowledged were not checkpointed: whoever runs the source next replays them"))
			} else {
				r.store.Settle(w.Key(), r.sink.NextStreamSeq())
			}
		})
	}
	wg.Wait()
	keys := make([]string, 0, len(ws))
	for _, w := range ws {
		w.pipe.Close()
		w.Stopped()
		keys = append(keys, w.Key())
	}
	if lost {
		r.store.Discard(keys...)
		r.log.Warn("lost the source's Lease; stopped without writing its checkpoint", zap.String("source", name),
			zap.String("effect", "the replica taking it over resumes from the last checkpoint written; JetStream drops the replays as duplicates"))
	} else if r.ready.Met(condCheckpoints) {
		if err := r.store.Flush(drainCtx); err != nil {
			r.log.Error("checkpoint write after stopping the source failed", zap.String("source", name), zap.Error(err),
				zap.String("effect", "the source resumes from the previous checkpoint"))
		}
	}
	r.m.SourceUp.WithLabelValues(name).Set(0)
}

// relistBackoff is watch.relistBackoff from the config, fresh (unstepped).
func (r *relay) relistBackoff() wait.Backoff {
	b := r.cfg.Watch.RelistBackoff
	return wait.Backoff{Duration: b.Initial.Duration(), Factor: b.Factor, Jitter: b.JitterFraction(), Steps: 1 << 30, Cap: b.Max.Duration()}
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

// sourceUp sets relayd_source_up of a source: 1 when all its watches are up.
func (r *relay) sourceUp(name string) {
	all := 1.0
	for _, w := range r.activeWatches() {
		if w.Source().Name == name && !w.Up() {
			all = 0
		}
	}
	r.m.SourceUp.WithLabelValues(name).Set(all)
}

// isSelf reports relayd's own objects: the checkpoint ConfigMap and, with
// sharding, the source Leases (renewed every few seconds). relayd must not
// feed on its own writes.
func (r *relay) isSelf(res event.Resource, m *event.Meta) bool {
	if m.Namespace != r.cfg.Checkpoint.Namespace {
		return false
	}
	switch {
	case res.Group == "" && res.Resource == "configmaps":
		return slices.Contains(checkpoint.ShardNames(r.cfg.Checkpoint.Name, r.cfg.CheckpointShards()), m.Name)
	case r.cfg.Sharding.Enabled && res.Group == "coordination.k8s.io" && res.Resource == "leases":
		for i := range r.cfg.Sources {
			if m.Name == shard.LeaseName(r.cfg.Sharding.LeasePrefix, r.cfg.Sources[i].Name) {
				return true
			}
		}
	}
	return false
}
