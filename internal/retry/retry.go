// Package retry holds what relayd's retry loops share: the named backoff
// policies (Watch, NATS, Setup, Conflict) and the one rule that starts
// their waits over (Delays, ResetAfter); Until, the loop of
// an operation retried with backoff until it succeeds; a wait that ends with
// the context; and Failures, which logs a failure that repeats once when it
// starts, as a summary at most once a minute while it lasts, and once when
// it ends, so that a loop retrying every second does not flood the log (an
// apiserver restart used to give one identical error per checkpoint tick).
package retry

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"k8s.io/apimachinery/pkg/util/wait"
)

// Until calls attempt until it returns nil, waiting the policy b's delays
// after each failure (Delays: starting over after an attempt that ran
// ResetAfter), or until ctx ends; it reports whether attempt succeeded. Each
// failure is reported to f with fields and the wait ("in"), and the success
// that ends a run of failures as f's recovery (f.OK with fields). A failure
// once ctx has ended is the stop, not a fault: it is not reported.
func Until(ctx context.Context, b wait.Backoff, f *Failures, attempt func(context.Context) error, fields ...zap.Field) bool {
	delays := NewDelays(b, nil)
	for {
		err := attempt(ctx)
		if err == nil {
			f.OK(fields...)
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		d := delays.Step()
		f.Fail(err, append(fields[:len(fields):len(fields)], zap.Duration("in", d))...)
		if !Sleep(ctx, d) {
			return false
		}
	}
}

// Sleep waits for d, or until ctx ends; it reports whether it waited the
// whole d (false: ctx ended). It is relayd's one wait of that kind.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// DefaultSummaryInterval is how often, at most, Failures logs a summary
// while a failure lasts.
const DefaultSummaryInterval = time.Minute

// Failures reports the failures of one retried operation. Fail logs the
// first failure at once (Level, the message, the error and the fields
// given); further failures are counted and summarised at most once per
// Interval ("<msg> (still failing)": failures since the last line, for how
// long, the first and the last error). OK after failures logs, at info,
// "<msg>: recovered" with the count and the duration. Safe for concurrent
// use; the zero value is not usable: use NewFailures.
type Failures struct {
	log      *zap.Logger
	msg      string
	level    zapcore.Level
	interval time.Duration
	now      func() time.Time
	changes  bool // log a failure whose error differs from the last one

	mu        sync.Mutex
	count     int // failures since the first
	unlogged  int // failures since the last line
	first     string
	since     time.Time
	lastLine  time.Time
	lastError string
}

// Option changes a Failures.
type Option func(*Failures)

// AtLevel logs the first failure and the summaries at l (default error).
func AtLevel(l zapcore.Level) Option { return func(f *Failures) { f.level = l } }

// Every sets the summary interval (default DefaultSummaryInterval).
func Every(d time.Duration) Option { return func(f *Failures) { f.interval = d } }

// LogChanges logs a failure in full, like the first, whenever its error
// differs from the previous failure's: for loops whose errors say what
// changed (a source whose collection was found, then its apiVersion no
// longer served), where the summary's last error would be too late.
func LogChanges() Option { return func(f *Failures) { f.changes = true } }

// WithClock replaces time.Now (for tests).
func WithClock(now func() time.Time) Option { return func(f *Failures) { f.now = now } }

// NewFailures returns a Failures that logs msg to log.
func NewFailures(log *zap.Logger, msg string, opts ...Option) *Failures {
	f := &Failures{log: log, msg: msg, level: zapcore.ErrorLevel, interval: DefaultSummaryInterval, now: time.Now}
	for _, o := range opts {
		o(f)
	}
	return f
}

// Fail records a failure and logs it if it is the first of a run, or if a
// summary is due.
func (f *Failures) Fail(err error, fields ...zap.Field) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.now()
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	changed := f.changes && f.count > 0 && msg != f.lastError
	f.count++
	f.lastError = msg
	if changed {
		f.lastLine, f.unlogged = now, 0
		f.log.Log(f.level, f.msg, append(fields, zap.Error(err), zap.Int("failures", f.count))...)
		return
	}
	if f.count == 1 {
		f.first, f.since, f.lastLine, f.unlogged = msg, now, now, 0
		f.log.Log(f.level, f.msg, append(fields, zap.Error(err))...)
		return
	}
	f.unlogged++
	if now.Sub(f.lastLine) < f.interval {
		return
	}
	f.log.Log(f.level, f.msg+" (still failing)", append(fields,
		zap.Int("failures", f.count), zap.Int("sinceLastLine", f.unlogged), zap.Duration("for", now.Sub(f.since).Round(time.Millisecond)),
		zap.String("firstError", f.first), zap.String("lastError", f.lastError))...)
	f.lastLine, f.unlogged = now, 0
}

// OK ends a run of failures, logging that it recovered; without a run it
// does nothing.
func (f *Failures) OK(fields ...zap.Field) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.count == 0 {
		return
	}
	f.log.Info(f.msg+": recovered", append(fields,
		zap.Int("failures", f.count), zap.Duration("for", f.now().Sub(f.since).Round(time.Millisecond)), zap.String("lastError", f.lastError))...)
	f.count, f.unlogged = 0, 0
}

// Failing reports how many failures the current run has had (0: none).
func (f *Failures) Failing() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.count
}
