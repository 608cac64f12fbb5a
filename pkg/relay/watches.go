package relay

import (
	"context"
	"errors"
	"slices"
	"sync"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/relayd/relayd/internal/retry"
	"github.com/relayd/relayd/pkg/checkpoint"
	"github.com/relayd/relayd/pkg/config"
	"github.com/relayd/relayd/pkg/event"
	"github.com/relayd/relayd/pkg/index"
	"github.com/relayd/relayd/pkg/shard"
	"github.com/relayd/relayd/pkg/sink"
	"github.com/relayd/relayd/pkg/source"
	"github.com/relayd/relayd/pkg/watch"
)

// newWatches builds the watches of one source over the open index bucket
// b: one per namespace (or one for all namespaces / a cluster-scoped kind),
// each with a new pipeline.
func (r *relay) newWatches(src *config.Source, b *index.Bucket) []*watch.Watch {
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
	scope, err := watch.NewScope(src) // an error: each watch reports it
	if err != nil {
		scope = nil
	}
	kube, self := source.Clients{Config: r.o.RestConfig, HTTP: r.httpc}, ownObjects{r.cfg}
	var check watch.RelistHook // nil: none
	if r.o.IndexCheck != nil {
		check = r.o.IndexCheck(b, kube, self, r.fail)
	}
	ws, resolver := []*watch.Watch(nil), source.NewSharedResolver(r.disco) // one discovery request for all its watches
	for _, ns := range namespaces {
		ws = append(ws, watch.New(watch.Options{
			Source: src, Namespace: ns, Config: r.cfg, Logger: r.log, Metrics: r.m.Watch,
			Shaping: shaping, Scope: scope, FingerprintKey: r.fpKey, MaxPayload: int(r.nc.MaxPayload()) - r.sink.HeaderBytes(), Backoff: r.relistBackoff(),
			Pipelines: pipelines{r.sink}, Positions: r.store, Events: r.events, Bucket: b,
			Ready: r.ready.Waiter(condCheckpoints, condNATS), Resolver: resolver, Watchers: watchers{kube}, Self: self,
			State: r, AfterRelist: check, ObjectHook: r.o.ObjectHook,
		}))
	}
	return ws
}

// pipelines opens the watches' pipelines on the sink (watch.Pipelines).
type pipelines struct{ s *sink.Sink }

func (p pipelines) NewPipe(source string, acked watch.Acked) watch.Pipe {
	return p.s.NewPipeline(source, acked.Advance)
}

// watchers builds the watches' source.Watchers (watch.Watchers).
type watchers struct{ source.Clients }

func (w watchers) NewWatcher(o source.Options) (watch.Watcher, error) {
	wt, err := w.Clients.NewWatcher(o)
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
func (r *relay) runSource(ctx context.Context, ws []*watch.Watch) {
	var wg sync.WaitGroup
	for _, w := range ws {
		wg.Go(func() { w.Supervise(ctx) })
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
			if err := w.Pipe().Drain(drainCtx); err != nil {
				r.log.Warn("drain incomplete", zap.String("source", name), zap.String("namespace", w.Namespace()), zap.Error(err),
					zap.String("effect", "events not acknowledged were not checkpointed: whoever runs the source next replays them"))
			} else if !w.Replaying() { // a replay's position must keep the checkpoint's sequence
				r.store.Settle(w.Key(), r.sink.NextStreamSeq())
			}
		})
	}
	wg.Wait()
	keys := make([]string, 0, len(ws))
	for _, w := range ws {
		w.Pipe().Close()
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
	return retry.Watch(b.Initial.Duration(), b.Max.Duration(), b.Factor, b.JitterFraction())
}

// WatchState sets relayd_source_up of w's source (watch.StateObserver): 1
// when all its watches are up.
func (r *relay) WatchState(changed *watch.Watch, _ bool) {
	name, all := changed.Source().Name, 1.0
	for _, w := range r.activeWatches() {
		if w.Source().Name == name && !w.Up() {
			all = 0
		}
	}
	r.m.SourceUp.WithLabelValues(name).Set(all)
}

// ownObjects are relayd's own objects (watch.SelfFilter): the checkpoint
// ConfigMap and, with sharding, the source Leases (renewed every few
// seconds). relayd must not feed on its own writes.
type ownObjects struct{ cfg *config.Config }

func (o ownObjects) IsSelf(res event.Resource, m *event.Meta) bool {
	cfg := o.cfg
	if m.Namespace != cfg.Checkpoint.Namespace {
		return false
	}
	switch {
	case res.Group == "" && res.Resource == "configmaps":
		return slices.Contains(checkpoint.ShardNames(cfg.Checkpoint.Name, cfg.CheckpointShards()), m.Name)
	case cfg.Sharding.Enabled && res.Group == "coordination.k8s.io" && res.Resource == "leases":
		for i := range cfg.Sources {
			if m.Name == shard.LeaseName(cfg.Sharding.LeasePrefix, cfg.Sources[i].Name) {
				return true
			}
		}
	}
	return false
}
