package watch

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"

	"go.uber.org/zap"

	"github.com/relayd/relayd/internal/retry"
	"github.com/relayd/relayd/pkg/config"
	"github.com/relayd/relayd/pkg/event"
	"github.com/relayd/relayd/pkg/sink"
	"github.com/relayd/relayd/pkg/source"
)

// Supervise runs the watch until ctx ends: it restarts it with backoff
// after any error (starting over after a healthy minute, retry.ResetAfter)
// and recovers panics, so one bad source never stops the others.
// Restarts are logged when they start, summarised while they repeat, and
// when the watch is up again (retry.Failures).
func (w *Watch) Supervise(ctx context.Context) {
	backoff := retry.NewDelays(w.o.Backoff, nil)
	for {
		err := w.runOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		w.setUp(false)
		if err != nil {
			w.lastErr.Store(err.Error())
		}
		d := backoff.Step()
		w.restarts.Fail(err, zap.Duration("in", d))
		if !retry.Sleep(ctx, d) {
			return
		}
	}
}

var errPanic = errors.New("panic")

// runOnce is one attempt of the watch: it waits until it can run, prepares
// what a previous attempt did not leave (resource, encoder, watcher,
// index), and runs the watcher from the start position. A panic is
// recovered and returned as an error.
func (w *Watch) runOnce(ctx context.Context) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = w.recovered(p)
		}
	}()
	if err := w.o.Ready.Wait(ctx); err != nil {
		return err
	}
	if err := w.prepare(ctx); err != nil {
		return err
	}
	st := w.start()
	if err := w.recordWatching(ctx, st); err != nil {
		return err
	}
	handlerFailed := false
	err = w.watcher.Run(ctx, st, func(ctx context.Context, it *source.Item) error {
		err := w.handle(ctx, it)
		handlerFailed = handlerFailed || err != nil
		return err
	})
	if handlerFailed && ctx.Err() == nil {
		// The handler may have indexed an item it then could not submit
		// (its watch's context ended meanwhile); the watcher reads that
		// item again. Reload the index from the bucket (once the pipeline
		// drained) so that the replay writes its index entry too. Other
		// errors (forbidden, not found) leave the index as acked: no reload.
		w.ix.loaded = false
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		// Not found may mean a deleted CRD: resolve again next time.
		w.resolved = false
		w.enc = nil
		w.watcher = nil
		w.setLive(nil)
	}
	return err
}

// recovered handles a panic of an attempt: counted, logged with the stack,
// and returned as an error. The next attempt starts over from the acked
// position: anything after it is re-read and deduplicated by its
// Nats-Msg-Id, and the index is reloaded from the bucket once the pipeline
// is drained.
func (w *Watch) recovered(p any) error {
	name := w.o.Source.Name
	w.o.Metrics.SourcePanics.WithLabelValues(name).Inc()
	w.o.Metrics.Source.WatchRestarts.WithLabelValues(name, ReasonPanic).Inc()
	w.log.Error("panic in source (recovered)", zap.Any("panic", p), zap.ByteString("stack", debug.Stack()))
	w.watcher = nil
	w.setLive(nil)
	w.ix.loaded = false
	w.handling.Store(0) // a panic inside an object's handling ends it
	return fmt.Errorf("%w: %v", errPanic, p)
}

// prepare builds what the attempt needs and a previous one did not leave:
// the resolved resource, the encoder, the watcher, the loaded index.
func (w *Watch) prepare(ctx context.Context) error {
	src := w.o.Source
	if w.scope.err != nil {
		return w.scope.err
	}
	if !w.resolved {
		res, err := w.o.Resolver.Resolve(src)
		if err != nil {
			w.o.Metrics.Source.WatchRestarts.WithLabelValues(src.Name, ReasonResolve).Inc()
			return fmt.Errorf("source %q: %w", src.Name, err)
		}
		w.resource, w.resolved = res, true
	}
	if w.enc == nil {
		cfg := w.o.Config
		enc, err := event.NewEncoder(event.EncoderOptions{
			Prefix: cfg.Prefix, Cluster: cfg.Cluster, Source: src.Name,
			Binary:     cfg.CloudEvents.Mode == config.ModeBinary,
			MaxPayload: w.o.MaxPayload,
		})
		if err != nil {
			return fmt.Errorf("source %q: %w", src.Name, err)
		}
		w.enc = enc
	}
	if w.watcher == nil {
		wt, err := w.o.Watchers.NewWatcher(w.watcherOptions())
		if err != nil {
			return err
		}
		w.watcher = wt
		w.setLive(wt)
	}
	if !w.ix.loaded {
		relist, err := w.loadIndex(ctx)
		if err != nil {
			return fmt.Errorf("source %q: object index: %w", src.Name, err)
		}
		if relist != "" {
			w.ix.relist = relist
		}
		w.ix.loaded = true
	}
	return nil
}

// watcherOptions are the options of the watch's source.Watcher (without
// its Client).
func (w *Watch) watcherOptions() source.Options {
	src, wc := w.o.Source, w.o.Config.Watch
	return source.Options{
		Resource: w.resource, Source: src.Name, Namespace: w.o.Namespace,
		LabelSelector: src.LabelSelector, FieldSelector: src.FieldSelector,
		Timeout: wc.Timeout.Duration(), IdleTimeout: wc.IdleTimeout.Duration(), MaxObjectBytes: int64(wc.MaxObjectBytes),
		PageSize: int64(wc.PageSize),
		Backoff:  w.o.Backoff,
		Logger:   w.o.Logger.Named("source"), Metrics: w.o.Metrics.Source,
		OnEstablished: w.setUp,
		// Payload metadata and reference publish nothing else. With
		// ignoreChanges the whole object is read all the same: a change
		// anywhere outside the ignored paths (a ConfigMap's data, say)
		// must still be published, as metadata; with a filter, it is
		// evaluated on the whole object.
		MetadataOnly: src.Payload != config.PayloadFull && w.fp == nil && w.paths.fp == nil && w.scope.s == nil,
		Shaping:      w.o.Shaping,
	}
}

// start is where the watcher starts: from the acked watermark when a
// watcher is rebuilt (it is never behind the stored checkpoint), else from
// the checkpoint, else per the source's initial setting; a list due at
// start (the recovery plan's) is asked for. The epoch never goes below the
// one recorded in the bucket.
func (w *Watch) start() source.Start {
	st := source.Start{Snapshot: w.o.Source.Initial != config.InitialNone, Relist: w.ix.relist}
	if rv, ep := w.pipe.Watermark(); rv != "" {
		st.ResourceVersion, st.Epoch = rv, ep
	} else if pos, ok := w.o.Positions.Get(w.key); ok {
		st.ResourceVersion, st.Epoch = pos.ResourceVersion, max(pos.Epoch, w.ix.epochFloor)
	} else {
		st.Epoch = w.ix.epochFloor
	}
	return st
}

// recordWatching records, before a watch first starts from now (no
// checkpoint, initial: none, no list due), its epoch in the bucket, acked
// before the watch runs: with it, a later start that finds no checkpoint
// knows the watch ran and relists it with reason no-checkpoint instead of
// starting from now again, which would lose the changes made meanwhile
// without a word (docs/GUARANTEES.md, "Other decisions an operator should
// know").
func (w *Watch) recordWatching(ctx context.Context, st source.Start) error {
	if st.Snapshot || st.ResourceVersion != "" || st.Relist != "" || w.ix.epochRecorded {
		return nil
	}
	if err := w.submit(ctx, sink.Entry{FollowUp: w.o.Bucket.EpochMsg(w.ix.prefix, st.Epoch), ObjectKey: epochGate, Epoch: st.Epoch}); err != nil {
		return err
	}
	if err := w.pipe.Drain(ctx); err != nil {
		return err
	}
	w.ix.epochRecorded = true
	return nil
}
