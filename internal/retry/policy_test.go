package retry

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	clocktesting "k8s.io/utils/clock/testing"
)

func newClock() *clocktesting.FakePassiveClock {
	return clocktesting.NewFakePassiveClock(time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC))
}

// Each named policy's first delay and cap, jitter included: under
// failures that follow each other (the clock moves by each wait), the
// waits double from the first delay to the cap and stay there.
func TestPoliciesFirstDelaysAndCaps(t *testing.T) {
	for _, c := range []struct {
		name       string
		policy     wait.Backoff
		first, cap time.Duration
	}{
		{"Watch (watch.relistBackoff defaults)", Watch(time.Second, 5*time.Minute, 2, 0.5), time.Second, 5 * time.Minute},
		{"NATS", NATS(), 100 * time.Millisecond, 10 * time.Second},
		{"Setup", Setup(), 500 * time.Millisecond, 30 * time.Second},
		{"Check", Check(), 200 * time.Millisecond, 5 * time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			clk := newClock()
			d := NewDelays(c.policy, clk)
			base := c.first
			for i := range 40 {
				got := d.Step()
				if got < base || got > base+base/2 {
					t.Fatalf("wait %d = %v, want %v plus up to half of it (jitter 0.5)", i, got, base)
				}
				base = min(2*base, c.cap)
				clk.SetTime(clk.Now().Add(got))
			}
			if base != c.cap {
				t.Errorf("40 failures did not reach the cap %v", c.cap)
			}
		})
	}
}

// Conflict is bounded: 8 attempts, about 2s of waits in all.
func TestConflictIsBounded(t *testing.T) {
	b := Conflict()
	if b.Steps != 8 {
		t.Errorf("Steps = %d, want 8", b.Steps)
	}
	b.Jitter = 0
	var sum time.Duration
	for range b.Steps {
		sum += b.Step()
	}
	if sum != 2270*time.Millisecond {
		t.Errorf("waits without jitter sum to %v, want 2.27s (10ms doubling, capped at 1s)", sum)
	}
}

// The reset rule: the waits start over after more than ResetAfter without
// a failure (from the end of the last wait), not after exactly
// ResetAfter, and not during a run of failures that lasts longer.
func TestDelaysStartOverAfterAHealthyMinute(t *testing.T) {
	policy := wait.Backoff{Duration: time.Second, Factor: 2, Steps: endless, Cap: 5 * time.Minute}
	clk := newClock()
	d := NewDelays(policy, clk)
	fail := func(ran time.Duration) time.Duration {
		clk.SetTime(clk.Now().Add(ran))
		w := d.Step()
		clk.SetTime(clk.Now().Add(w))
		return w
	}
	for i, want := range []time.Duration{1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300} {
		if got := fail(time.Second); got != want*time.Second {
			t.Fatalf("failure %d: wait %v, want %vs (a run of failures longer than ResetAfter grows to the cap)", i, got, want)
		}
	}
	if d.Fresh() {
		t.Error("Fresh right after a wait")
	}
	if got := fail(ResetAfter); got != 300*time.Second {
		t.Errorf("after exactly ResetAfter: wait %v, want the cap still", got)
	}
	clk.SetTime(clk.Now().Add(ResetAfter + time.Millisecond))
	if !d.Fresh() {
		t.Error("not Fresh after more than ResetAfter")
	}
	if got := fail(0); got != time.Second {
		t.Errorf("after more than ResetAfter without a failure: wait %v, want the first delay 1s", got)
	}
	if got := fail(time.Second); got != 2*time.Second {
		t.Errorf("next failure: wait %v, want 2s", got)
	}
	d.Reset()
	if got := fail(time.Second); got != time.Second {
		t.Errorf("after Reset: wait %v, want 1s", got)
	}
}

// Why Delays, not wait.Backoff.DelayWithReset: the latter starts over
// every resetInterval after its previous start, failures or not, so a run
// of failures never waits a cap at or above the interval (here 5m).
func TestDelayWithResetIsPeriodic(t *testing.T) {
	clk := clocktesting.NewFakeClock(newClock().Now())
	next := Watch(time.Second, 5*time.Minute, 2, 0).DelayWithReset(clk, ResetAfter)
	var longest time.Duration
	for range 40 {
		w := next()
		longest = max(longest, w)
		clk.SetTime(clk.Now().Add(w + time.Second))
	}
	if longest >= time.Minute {
		t.Errorf("DelayWithReset(ResetAfter) waited %v: it no longer resets periodically, Delays could use it", longest)
	}
}
