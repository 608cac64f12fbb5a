package index

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/relayd/relayd/internal/retry"
)

// OpenRetrying opens the bucket of o like Open, retrying with backoff until
// it succeeds (NATS may not be up yet, or the bucket may be missing) or ctx
// ends (nil). Each failure is passed to onErr; repeated ones are logged
// through retry.Failures. Settings of the opened bucket that differ from a
// bucket relayd creates are logged as warnings.
func OpenRetrying(ctx context.Context, js jetstream.JetStream, o BucketOptions, log *zap.Logger, onErr func(error)) *Bucket {
	failures := retry.NewFailures(log, "cannot open the index bucket; sources wait")
	var b *Bucket
	opened := retry.Until(ctx, retry.Setup(), failures, func(ctx context.Context) error {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		var err error
		if b, err = Open(cctx, js, o); err != nil {
			onErr(err)
		}
		return err
	}, zap.String("bucket", o.Name))
	if !opened {
		return nil
	}
	b.logWarnings(log)
	return b
}

// logWarnings logs how b differs from a bucket relayd creates.
func (b *Bucket) logWarnings(log *zap.Logger) {
	if !b.ExpiringMarkers() {
		log.Warn("index bucket has no per-message TTLs", zap.String("bucket", b.Name()),
			zap.String("effect", "every deleted object leaves a small delete marker in it for good"),
			zap.String("remedy", "create the bucket with a limit marker TTL, or let relayd create it"))
	}
	for _, msg := range b.Warnings() {
		log.Warn("index bucket setting differs from the config", zap.String("bucket", b.Name()), zap.String("finding", msg))
	}
	log.Info("index bucket ready", zap.String("bucket", b.Name()))
}
