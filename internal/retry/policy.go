package retry

import (
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"
)

// The named retry policies of relayd: every wait between failed attempts
// follows one of them. Each is an apimachinery wait.Backoff, exponential with jitter so
// that replicas and sources fall out of step; the unbounded ones have
// effectively endless Steps, so that they stop growing only at their Cap.

// endless is the Steps of a policy that retries until it succeeds.
const endless = 1 << 30

// Watch is the policy of the watch restarts (the source watcher's retries
// of a failed list or watch, and the watch supervisor's restarts after a
// permanent error or a panic): watch.relistBackoff from the config, whose
// defaults (pkg/config) are 1s doubling to 5m with jitter 0.5. The cap is
// the operator's: a source that cannot be watched (forbidden, a missing
// CRD, an apiserver outage) costs the apiserver one request per cap.
func Watch(initial, max time.Duration, factor, jitter float64) wait.Backoff {
	return wait.Backoff{Duration: initial, Factor: factor, Jitter: jitter, Steps: endless, Cap: max}
}

// NATS is the policy of what waits for NATS: the first connection
// (natsconn.Conn.Dial; once connected, nats.go reconnects by itself) and a
// publish's retry (pkg/sink, which meanwhile waits for the connection to
// be up rather than retrying into the reconnect buffer). 100ms doubling to
// 10s: a NATS server restarts, and a client fails over to another, within
// seconds, and every publish held back holds its source's checkpoint.
func NATS() wait.Backoff {
	return wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Jitter: 0.5, Steps: endless, Cap: 10 * time.Second}
}

// Setup is the policy of what relayd waits for before its sources run, and
// an administrator fixes: loading the checkpoint ConfigMap (pkg/relay),
// starting sharding (the Leases, pkg/relay), opening the index bucket
// (pkg/index), and the stream check while the stream is not usable
// (pkg/stream Keep). 500ms doubling to 30s: a fix is picked up within 30s
// (the interval at which pkg/stream checks a usable stream), at the cost of
// one request per 30s while it lasts.
func Setup() wait.Backoff {
	return wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 0.5, Steps: endless, Cap: 30 * time.Second}
}

// Check is the policy of the tests' index consistency check
// (internal/indexcheck) while it cannot read the list or the bucket (the
// fault-injection suite stops the apiserver and NATS): 200ms doubling to
// 5s, so that the check is made soon after they are back and does not hold
// up the run.
func Check() wait.Backoff {
	return wait.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: endless, Cap: 5 * time.Second}
}

// Conflict is the policy of a checkpoint write that lost a race with
// another replica (client-go's retry.RetryOnConflict, in pkg/checkpoint):
// 8 attempts from 10ms doubling to 1s, about 2s in all (well inside the
// flush interval and a shutdown's grace period). A write that still
// conflicts is retried by the next flush tick.
func Conflict() wait.Backoff {
	return wait.Backoff{Duration: 10 * time.Millisecond, Factor: 2, Jitter: 0.5, Steps: 8, Cap: time.Second}
}

// ResetAfter is relayd's one reset rule: a loop's waits start over from
// the policy's first delay once it went ResetAfter without a failure (from
// the end of its last wait), so a failure after a minute of working is a
// new incident, retried quickly, while a run of failures, or a thing that
// keeps breaking within a minute of each retry, backs off to the cap. A
// minute is what the source watcher, which retries most of what operators
// see (relayd_watch_restarts_total), always used; loops that succeed
// (Until, and pkg/stream Keep's checks) also start over at their success.
//
// Not wait.Backoff.DelayWithReset: its reset is periodic, ResetAfter after
// the previous reset whether or not anything worked in between, so a long
// outage would go back to the first delay every ResetAfter and never wait
// a cap at or above it (watch.relistBackoff.max, 5m by default).
const ResetAfter = time.Minute

// Delays are the waits of one loop under a policy and the reset rule
// (ResetAfter). Not safe for concurrent use.
type Delays struct {
	policy wait.Backoff
	next   wait.DelayFunc
	clock  clock.PassiveClock
	// retried is when the last wait ended (the attempt after it started),
	// or when Delays was made.
	retried time.Time
}

// NewDelays returns the waits of policy, measuring time with c (nil: the
// real clock).
func NewDelays(policy wait.Backoff, c clock.PassiveClock) *Delays {
	if c == nil {
		c = clock.RealClock{}
	}
	return &Delays{policy: policy, next: policy.DelayFunc(), clock: c, retried: c.Now()}
}

// Fresh reports whether the next Step starts over: ResetAfter went by
// without a failure.
func (d *Delays) Fresh() bool { return d.clock.Since(d.retried) > ResetAfter }

// Step returns the wait after a failure (starting over first if Fresh),
// and expects the loop to retry when it ends.
func (d *Delays) Step() time.Duration {
	if d.Fresh() {
		d.Reset()
	}
	w := d.next()
	d.retried = d.clock.Now().Add(w)
	return w
}

// Reset starts the waits over: the next Step is the policy's first delay.
// For a loop whose attempt succeeded.
func (d *Delays) Reset() { d.next = d.policy.DelayFunc() }
