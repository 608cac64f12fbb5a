package stream

import (
	"context"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/relayd/relayd/internal/retry"
)

// CheckInterval is how often Keep looks at the stream again: an
// administrator may fix (or break) it while relayd runs, and another relayd
// sharing it may have replaced its subjects.
const CheckInterval = 30 * time.Second

// Keep runs Ensure at start and every CheckInterval until ctx ends (sooner,
// with backoff, while the stream is not usable: an administrator is
// probably fixing it). It passes onState why the stream is not usable (""
// when it is) and the stream's subjects as found (nil when the check
// failed) after every check, logs when that changes, and logs what was
// created or updated, and each warning when it first appears.
func Keep(ctx context.Context, js jetstream.JetStream, want Want, log *zap.Logger, onState func(reason string, subjects []string)) {
	backoff := retry.NewDelays(retry.Setup(), nil) // capped at CheckInterval
	var lastErr, lastWarn string
	for {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		res, err := Ensure(cctx, js, want)
		cancel()
		reason := res.Blocker
		if err != nil {
			reason = err.Error()
		}
		next := CheckInterval
		if reason != "" {
			next = backoff.Step()
		} else {
			backoff.Reset()
		}
		var subjects []string
		if err == nil {
			subjects = res.Found.Subjects
		}
		onState(reason, subjects)
		switch {
		case reason != "" && reason != lastErr:
			log.Error("the stream is not usable; relayd stays unready", zap.String("stream", want.Name), zap.String("reason", reason))
		case reason == "" && lastErr != "":
			log.Info("the stream is usable again", zap.String("stream", want.Name))
		}
		lastErr = reason
		logChanges(log, want, res)
		if w := strings.Join(res.Warnings, "\n"); err == nil && w != lastWarn {
			for _, msg := range res.Warnings {
				log.Warn("stream setting differs from the config", zap.String("stream", want.Name), zap.String("finding", msg))
			}
			lastWarn = w
		}
		if !retry.Sleep(ctx, next) {
			return
		}
	}
}

// logChanges logs what Ensure created or updated.
func logChanges(log *zap.Logger, want Want, res Result) {
	if res.Created {
		log.Info("stream created", zap.String("stream", want.Name), zap.Strings("subjects", res.Found.Subjects),
			zap.Duration("maxAge", res.Found.MaxAge), zap.Duration("duplicateWindow", res.Found.Duplicates))
	}
	if res.Updated {
		log.Info("added relayd's subject to the stream; nothing else of it was changed", zap.String("stream", want.Name),
			zap.String("subject", want.Subject), zap.Strings("subjects", res.Found.Subjects))
	}
}
