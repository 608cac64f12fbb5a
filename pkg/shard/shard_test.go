package shard

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestFairShareAndExclusivity: three replicas over six sources settle on two
// each, stay there, and never run one source twice at a time.
func TestFairShareAndExclusivity(t *testing.T) {
	ns, sources := setup(t, 6)
	rec := newRecorder(100 * time.Millisecond)
	var reps []*replica
	for _, id := range []string{"replica-a", "replica-b", "replica-c"} {
		reps = append(reps, startReplica(t, ns, id, sources, fast, rec))
	}
	// A Lease is held a moment before its source's Run starts: balanced
	// means every source held and running.
	took := waitFor(t, 20*time.Second, "2/2/2, every source running", func() bool {
		return shares(reps, sources, 2, 2, 2) && rec.running() == len(sources)
	})
	t.Logf("balanced 2/2/2 after %v (%d Run starts): %s", took.Round(time.Millisecond), rec.count(), describe(reps))

	// Balanced is stable: no replica fights for more.
	starts := rec.count()
	time.Sleep(4 * fast.retry)
	if !shares(reps, sources, 2, 2, 2) || rec.count() != starts {
		t.Errorf("not stable: %s, Run starts %d → %d", describe(reps), starts, rec.count())
	}

	for _, r := range reps {
		r.stop(t)
	}
	rec.checkNoOverlap(t, sources)
	rec.checkLeadingBalanced(t)
	for _, src := range sources {
		spec := holderOf(t, ns, src)
		if spec.HolderIdentity == nil || *spec.HolderIdentity != "" || spec.LeaseDurationSeconds == nil || *spec.LeaseDurationSeconds != 1 {
			t.Errorf("Lease of %s not released after all replicas stopped: %+v", src, spec)
		}
	}
}

// TestDeadReplicaTakenOver: a replica cut off from the apiserver (it can
// neither renew nor release: what a dead replica looks like to the others)
// stops its sources within RenewDeadline of its last renewal, and the others
// take them over no earlier than LeaseDuration after it and soon after
// that.
func TestDeadReplicaTakenOver(t *testing.T) {
	ns, sources := setup(t, 6)
	rec := newRecorder(100 * time.Millisecond)
	var reps []*replica
	for _, id := range []string{"replica-a", "replica-b", "replica-c"} {
		reps = append(reps, startReplica(t, ns, id, sources, fast, rec))
	}
	waitFor(t, 20*time.Second, "2/2/2", func() bool { return shares(reps, sources, 2, 2, 2) })
	// A Lease is held a moment before its source's Run starts: cut only
	// once every Run has, or the victim's would start after the cut.
	waitFor(t, 20*time.Second, "every source running", func() bool {
		for _, src := range sources {
			if len(rec.intervals(src)) == 0 {
				return false
			}
		}
		return true
	})

	victim, rest := reps[1], []*replica{reps[0], reps[2]}
	lost := victim.sh.Leading()
	cut := time.Now()
	victim.client.down.Store(true)
	took := waitFor(t, fast.lease+10*time.Second, "3/3 on the survivors", func() bool {
		return shares(rest, sources, 3, 3) && len(victim.sh.Leading()) == 0
	})
	t.Logf("survivors hold 3/3 %v after the cut: %s", took.Round(time.Millisecond), describe(rest))

	for _, src := range lost {
		ivs := rec.intervals(src)
		var old, next *interval
		for i := range ivs {
			if ivs[i].id == victim.id && ivs[i].start.Before(cut) {
				old = &ivs[i]
			}
			if ivs[i].id != victim.id && ivs[i].start.After(cut) && next == nil {
				next = &ivs[i]
			}
		}
		if old == nil || next == nil || old.cancelled.IsZero() {
			t.Fatalf("source %s: missing intervals: %+v", src, ivs)
		}
		lastRenew := victim.client.lastWriteOf(LeaseName(DefaultLeasePrefix, src))
		cancelAfter := old.cancelled.Sub(lastRenew)
		sinceRenew := next.start.Sub(lastRenew)
		takeover := next.start.Sub(cut)
		t.Logf("source %s: victim's Run cancelled %v after its last renewal; %s started it %v after the last renewal, %v after the cut",
			src, cancelAfter.Round(time.Millisecond), next.id, sinceRenew.Round(time.Millisecond), takeover.Round(time.Millisecond))
		if !old.lost {
			t.Errorf("source %s: the victim's Run context was not cancelled with ErrLeaseLost", src)
		}
		if cancelAfter > fast.renew+500*time.Millisecond {
			t.Errorf("source %s: victim's Run cancelled %v after its last renewal, want ≤ RenewDeadline %v (+0.5s)", src, cancelAfter, fast.renew)
		}
		if sinceRenew < fast.lease {
			t.Errorf("source %s: taken over %v after the victim's last renewal, before LeaseDuration %v", src, sinceRenew, fast.lease)
		}
		if limit := fast.lease + 6*fast.retry; takeover > limit {
			t.Errorf("source %s: taken over %v after the cut, want ≤ LeaseDuration + 6 RetryPeriods = %v", src, takeover, limit)
		}
	}

	// The cut-off replica still stops promptly (its requests fail at once).
	if d := victim.stop(t); d > 5*time.Second {
		t.Errorf("cut-off replica took %v to stop", d)
	}
	for _, r := range rest {
		r.stop(t)
	}
	rec.checkNoOverlap(t, sources)
	rec.checkLeadingBalanced(t)
}

// TestGracefulStopHandsOver: a replica that stops drains its sources, then
// releases their Leases, and the others take them over within a few
// RetryPeriods, far sooner than LeaseDuration.
func TestGracefulStopHandsOver(t *testing.T) {
	ns, sources := setup(t, 6)
	rec := newRecorder(300 * time.Millisecond)
	var reps []*replica
	for _, id := range []string{"replica-a", "replica-b", "replica-c"} {
		reps = append(reps, startReplica(t, ns, id, sources, slow, rec))
	}
	waitFor(t, 20*time.Second, "2/2/2", func() bool { return shares(reps, sources, 2, 2, 2) })

	leaving, rest := reps[2], reps[:2]
	moved := leaving.sh.Leading()
	d := leaving.stop(t)
	t.Logf("%s stopped in %v", leaving.id, d.Round(time.Millisecond))
	// On return every Run has returned and the Leases were released.
	for _, src := range moved {
		ivs := rec.intervals(src)
		for _, iv := range ivs {
			if iv.id == leaving.id && iv.ended.IsZero() {
				t.Errorf("source %s: Sharder.Run returned before the source's Run did", src)
			}
		}
		if spec := holderOf(t, ns, src); spec.HolderIdentity != nil && *spec.HolderIdentity == leaving.id {
			t.Errorf("source %s: Lease still held by %s after Sharder.Run returned", src, leaving.id)
		}
	}

	took := waitFor(t, slow.lease, "3/3 on the others", func() bool { return shares(rest, sources, 3, 3) })
	t.Logf("others hold 3/3 %v after %s stopped", took.Round(time.Millisecond), leaving.id)
	for _, src := range moved {
		ivs := rec.intervals(src)
		last := ivs[len(ivs)-1]
		prev := ivs[len(ivs)-2]
		if prev.id != leaving.id || last.id == leaving.id {
			t.Fatalf("source %s: unexpected intervals %+v", src, ivs)
		}
		if prev.lost {
			t.Errorf("source %s: a graceful hand-over cancelled Run with ErrLeaseLost", src)
		}
		gap := last.start.Sub(prev.ended)
		t.Logf("source %s: hand-over %s → %s took %v (Run ended → Run started)", src, prev.id, last.id, gap.Round(time.Millisecond))
		if limit := 6 * slow.retry; gap > limit {
			t.Errorf("source %s: hand-over took %v, want ≤ %v (LeaseDuration is %v)", src, gap, limit, slow.lease)
		}
	}
	for _, r := range rest {
		r.stop(t)
	}
	rec.checkNoOverlap(t, sources)
	rec.checkLeadingBalanced(t)
}

// TestJoinRebalances: a replica that joins gets its share from the others
// by graceful hand-overs; exactly the minimum of sources moves.
func TestJoinRebalances(t *testing.T) {
	ns, sources := setup(t, 6)
	rec := newRecorder(300 * time.Millisecond)
	reps := []*replica{
		startReplica(t, ns, "replica-a", sources, slow, rec),
		startReplica(t, ns, "replica-b", sources, slow, rec),
	}
	// Every source's Run started (a Lease is held a moment before its Run
	// starts): a first start after the join would look like a hand-over.
	waitFor(t, 20*time.Second, "3/3, every source running", func() bool {
		if !shares(reps, sources, 3, 3) {
			return false
		}
		for _, src := range sources {
			if len(rec.intervals(src)) == 0 {
				return false
			}
		}
		return true
	})
	before := map[string]string{}
	for _, r := range reps {
		for _, src := range r.sh.Leading() {
			before[src] = r.id
		}
	}

	joined := time.Now()
	reps = append(reps, startReplica(t, ns, "replica-c", sources, slow, rec))
	took := waitFor(t, 20*time.Second, "2/2/2", func() bool { return shares(reps, sources, 2, 2, 2) })
	t.Logf("rebalanced to 2/2/2 %v after replica-c started: %s", took.Round(time.Millisecond), describe(reps))

	movedN := 0
	for _, src := range sources {
		for _, iv := range rec.intervals(src) {
			if !iv.start.After(joined) {
				continue
			}
			movedN++
			ivs := rec.intervals(src)
			if len(ivs) < 2 {
				t.Errorf("source %s: its first Run started after the join: %+v", src, ivs)
				continue
			}
			prev := ivs[len(ivs)-2]
			gap := iv.start.Sub(prev.ended)
			t.Logf("source %s: hand-over %s → %s took %v (Run ended → Run started)", src, prev.id, iv.id, gap.Round(time.Millisecond))
			if prev.id != before[src] || prev.ended.IsZero() {
				t.Errorf("source %s: unexpected intervals %+v", src, ivs)
			}
			if limit := 6 * slow.retry; gap > limit {
				t.Errorf("source %s: hand-over took %v, want ≤ %v (LeaseDuration is %v)", src, gap, limit, slow.lease)
			}
		}
	}
	if movedN != 2 {
		t.Errorf("%d sources moved, want 2", movedN)
	}

	// Every replica's heartbeat is in the Leases' membership annotation.
	ids := map[string]bool{}
	admin := env.Clientset(t, false)
	for _, src := range sources {
		l, err := admin.CoordinationV1().Leases(ns).Get(t.Context(), LeaseName(DefaultLeasePrefix, src), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		heartbeats, err := decodeMembers(l)
		if err != nil {
			t.Fatalf("Lease of %s: %s: %v", src, MembersAnnotation, err)
		}
		for id := range heartbeats {
			ids[id] = true
		}
	}
	if len(ids) != 3 {
		t.Errorf("members in the annotations: %v, want the 3 replicas", ids)
	}
	for _, r := range reps {
		r.stop(t)
	}
	rec.checkNoOverlap(t, sources)
	rec.checkLeadingBalanced(t)
}

// TestSingleReplicaAcquiresAll: alone, a replica holds every source (plain
// leader election) and writes the Lease like client-go does.
func TestSingleReplicaAcquiresAll(t *testing.T) {
	ns, sources := setup(t, 4)
	rec := newRecorder(0)
	rep := startReplica(t, ns, "solo", sources, fast, rec)
	took := waitFor(t, 10*time.Second, "all 4", func() bool { return shares([]*replica{rep}, sources, 4) })
	t.Logf("holds all 4 after %v", took.Round(time.Millisecond))
	spec := holderOf(t, ns, sources[0])
	if spec.HolderIdentity == nil || *spec.HolderIdentity != "solo" || spec.LeaseDurationSeconds == nil || *spec.LeaseDurationSeconds != 3 ||
		spec.RenewTime == nil || spec.AcquireTime == nil || spec.LeaseTransitions == nil || *spec.LeaseTransitions != 1 {
		t.Errorf("Lease spec = %+v", spec)
	}
	rep.stop(t)
	rec.checkLeadingBalanced(t)
}

// TestRunReturningEarly: a Run that returns on its own gets its Lease
// released and the source is started again.
func TestRunReturningEarly(t *testing.T) {
	ns, sources := setup(t, 1)
	starts := make(chan struct{}, 10)
	sh, err := New(Options{
		Client: env.Clientset(t, true).CoordinationV1(), Namespace: ns, Identity: "solo", Sources: sources,
		LeaseDuration: fast.lease, RenewDeadline: fast.renew, RetryPeriod: fast.retry,
		Logger: zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)),
		Run: func(ctx context.Context, source string) {
			select {
			case starts <- struct{}{}:
			default:
			}
			if len(starts) < 2 {
				return // the first run gives up at once
			}
			<-ctx.Done()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sh.Run(ctx) }()
	waitFor(t, 10*time.Second, "a second start", func() bool { return len(starts) >= 2 })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestMissingLease: a Lease that was not pre-created is an error naming it.
func TestMissingLease(t *testing.T) {
	admin := env.Clientset(t, false)
	ns := env.Namespace(t)
	sources := sourceNames(3)
	createLeases(t, admin, ns, sources[0], sources[2])
	grant(t, ns, sources, "get", "update")
	err := runOnce(t, ns, sources)
	t.Logf("error: %v", err)
	want := "shard: Lease " + ns + "/relayd-src-1 not found: it must be pre-created"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("error = %v, want it to contain %q", err, want)
	}
	if strings.Contains(err.Error(), "relayd-src-0") || strings.Contains(err.Error(), "relayd-src-2") {
		t.Errorf("error names Leases that exist: %v", err)
	}
}

// TestForbidden: missing RBAC is an error naming the verb and the Lease.
func TestForbidden(t *testing.T) {
	for _, tc := range []struct {
		name  string
		verbs []string
		want  string
	}{
		{"no update", []string{"get"}, "shard: forbidden to update Lease %s/relayd-src-0: relayd needs the verbs get and update on it"},
		{"nothing", nil, "shard: forbidden to get Lease %s/relayd-src-0: relayd needs the verbs get and update on it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			admin := env.Clientset(t, false)
			ns := env.Namespace(t)
			sources := sourceNames(2)
			createLeases(t, admin, ns, sources...)
			if tc.verbs != nil {
				grant(t, ns, sources, tc.verbs...)
			}
			err := runOnce(t, ns, sources)
			t.Logf("error: %v", err)
			want := strings.Replace(tc.want, "%s", ns, 1)
			if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "relayd-src-1") {
				t.Fatalf("error = %v, want it to contain %q and name relayd-src-1 too", err, want)
			}
		})
	}
}

// runOnce runs a Sharder as the restricted user and returns Run's error;
// Run must fail at start, so nothing runs.
func runOnce(t *testing.T, ns string, sources []string) error {
	t.Helper()
	sh, err := New(Options{
		Client: env.Clientset(t, true).CoordinationV1(), Namespace: ns, Identity: "solo", Sources: sources,
		LeaseDuration: fast.lease, RenewDeadline: fast.renew, RetryPeriod: fast.retry,
		Logger: zaptest.NewLogger(t),
		Run:    func(context.Context, string) { t.Error("Run called") },
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	return sh.Run(ctx)
}

// TestLeaseTakenAway: when another identity overwrites a held Lease (an
// operator, or a replica that judged it expired), the holder stops the
// source at its next renewal, does not release the other's Lease, and takes
// it back only after the intruder's record expired.
func TestLeaseTakenAway(t *testing.T) {
	ns, sources := setup(t, 1)
	rec := newRecorder(0)
	rep := startReplica(t, ns, "solo", sources, fast, rec)
	waitFor(t, 10*time.Second, "the source", func() bool { return len(rep.sh.Leading()) == 1 })

	admin := env.Clientset(t, false).CoordinationV1().Leases(ns)
	var stolen time.Time
	for {
		l, err := admin.Get(t.Context(), LeaseName(DefaultLeasePrefix, sources[0]), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		intruder, secs, now := "intruder", int32(3), metav1.NowMicro()
		l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, l.Spec.RenewTime, l.Spec.AcquireTime = &intruder, &secs, &now, &now
		stolen = time.Now()
		if _, err = admin.Update(t.Context(), l, metav1.UpdateOptions{}); err == nil {
			break
		} else if !apierrors.IsConflict(err) {
			t.Fatal(err)
		}
	}
	took := waitFor(t, 5*time.Second, "the source to stop", func() bool { return len(rep.sh.Leading()) == 0 })
	t.Logf("source stopped %v after the Lease was taken", took.Round(time.Millisecond))
	if h := holderOf(t, ns, sources[0]).HolderIdentity; h == nil || *h != "intruder" {
		t.Errorf("holder after stopping = %v, want the intruder's record left alone", h)
	}
	waitFor(t, 10*time.Second, "the source to come back", func() bool { return len(rep.sh.Leading()) == 1 })
	ivs := rec.intervals(sources[0])
	if !ivs[0].lost {
		t.Error("the Run whose Lease was taken was not cancelled with ErrLeaseLost")
	}
	again := ivs[len(ivs)-1].start.Sub(stolen)
	t.Logf("taken back %v after it was taken", again.Round(time.Millisecond))
	if again < fast.lease {
		t.Errorf("taken back %v after the intruder's write, before LeaseDuration %v", again, fast.lease)
	}
	rep.stop(t)
	rec.checkNoOverlap(t, sources)
}
