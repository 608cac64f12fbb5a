package relay

import (
	"context"
	"errors"
	"os"

	"go.uber.org/zap"

	"github.com/relayd/relayd/internal/retry"
	"github.com/relayd/relayd/pkg/config"
	"github.com/relayd/relayd/pkg/shard"
)

// runSharded runs the sources this replica holds the Lease of (see
// pkg/shard) until ctx ends. A failed start (a missing or forbidden Lease)
// is retried with backoff and keeps the replica unready, naming the problem.
func (r *relay) runSharded(ctx context.Context) {
	sh := r.cfg.Sharding
	id := r.o.Identity
	if id == "" {
		id, _ = os.Hostname()
	}
	names := make([]string, len(r.cfg.Sources))
	for i := range r.cfg.Sources {
		names[i] = r.cfg.Sources[i].Name
	}
	failures := retry.NewFailures(r.log, "sharding cannot start; no source runs on this replica; retrying")
	// The sharder runs until ctx ends: any earlier return is retried.
	retry.Until(ctx, retry.Setup(), failures, func(ctx context.Context) error {
		s, err := shard.New(shard.Options{
			Client: r.leases, Namespace: r.cfg.Checkpoint.Namespace, Identity: id, Sources: names,
			LeasePrefix:   sh.LeasePrefix,
			LeaseDuration: sh.LeaseDuration.Duration(), RenewDeadline: sh.RenewDeadline.Duration(), RetryPeriod: sh.RetryPeriod.Duration(),
			Logger:    r.log.Named("shard"),
			Run:       r.runShard,
			OnLeading: func(source string, leading bool) { r.m.SourceLeader.WithLabelValues(source).Set(b2f(leading)) },
			OnStarted: func() { r.ready.Set(condSharding, ""); failures.OK(zap.String("identity", id)) },
		})
		if err == nil {
			err = s.Run(ctx)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err == nil {
			err = errors.New("sharder stopped")
		}
		r.ready.Set(condSharding, "sharding not started: "+err.Error())
		return err
	}, zap.String("identity", id))
}

// runShard runs one source whose Lease this replica acquired, until the
// Sharder cancels ctx.
func (r *relay) runShard(ctx context.Context, name string) {
	var src *config.Source
	for i := range r.cfg.Sources {
		if r.cfg.Sources[i].Name == name {
			src = &r.cfg.Sources[i]
		}
	}
	// Another replica may have run the source since the checkpoints were
	// read: read them again before resuming from them.
	if !r.readCheckpoints(ctx, "cannot read the checkpoints of a source this replica took over; it waits", zap.String("source", name)) {
		return
	}
	select { // the watches are built over the open index bucket
	case <-r.bucketOpen:
	case <-ctx.Done():
		return
	}
	ws := r.newWatches(src, r.bucket)
	r.setActive(name, ws)
	defer r.setActive(name, nil)
	r.runSource(ctx, ws)
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
