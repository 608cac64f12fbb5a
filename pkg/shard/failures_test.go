package shard

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
)

// failing wraps a Lease client: while getDown (updateDown) is set, every
// get (non-dry-run update) fails at once, each time with another message,
// as the errors of an apiserver that is down do (ports, timeouts).
type failing struct {
	coordinationv1client.LeasesGetter
	getDown, updateDown atomic.Bool
	failures            atomic.Int64
}

func (f *failing) Leases(ns string) coordinationv1client.LeaseInterface {
	return &failingLeases{LeaseInterface: f.LeasesGetter.Leases(ns), f: f}
}

func (f *failing) err() error {
	return fmt.Errorf("test: apiserver unreachable (attempt %d)", f.failures.Add(1))
}

type failingLeases struct {
	coordinationv1client.LeaseInterface
	f *failing
}

func (l *failingLeases) Get(ctx context.Context, name string, o metav1.GetOptions) (*coordinationv1.Lease, error) {
	if l.f.getDown.Load() {
		return nil, l.f.err()
	}
	return l.LeaseInterface.Get(ctx, name, o)
}

func (l *failingLeases) Update(ctx context.Context, lease *coordinationv1.Lease, o metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	if l.f.updateDown.Load() && len(o.DryRun) == 0 {
		return nil, l.f.err()
	}
	return l.LeaseInterface.Update(ctx, lease, o)
}

// startObserved runs a Sharder on client whose log is observed; the test's
// cleanup stops it.
func startObserved(t *testing.T, ns string, sources []string, client coordinationv1client.LeasesGetter) (*Sharder, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zapcore.InfoLevel)
	log := zap.New(zapcore.NewTee(core, zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)).Core()))
	rec := newRecorder(0)
	sh, err := New(Options{
		Client: client, Namespace: ns, Identity: "replica-a", Sources: sources,
		LeaseDuration: fast.lease, RenewDeadline: fast.renew, RetryPeriod: fast.retry,
		Logger: log, Run: rec.run("replica-a"),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sh.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("Run did not return within 30s of cancel")
		}
	})
	return sh, logs
}

// lines returns the lines with message msg about source.
func lines(logs *observer.ObservedLogs, msg, source string) []observer.LoggedEntry {
	return logs.FilterMessage(msg).FilterField(zap.String("source", source)).All()
}

// checkOneRun fails unless source's failed Lease requests were logged as one
// run: one error line when it started, one "recovered" line when it ended
// counting at least minFailures, and no line per attempt in between.
func checkOneRun(t *testing.T, logs *observer.ObservedLogs, source string, minFailures int64) {
	t.Helper()
	started := lines(logs, "Lease request failed", source)
	if len(started) != 1 || started[0].Level != zapcore.ErrorLevel {
		t.Errorf("source %s: %d lines %q, want 1 at error level: %v", source, len(started), "Lease request failed", started)
	}
	ended := lines(logs, "Lease request failed: recovered", source)
	if len(ended) != 1 {
		t.Fatalf("source %s: %d lines %q, want 1: %v", source, len(ended), "Lease request failed: recovered", ended)
	}
	if n, _ := ended[0].ContextMap()["failures"].(int64); n < minFailures {
		t.Errorf("source %s: recovered after %d failures, want at least %d (one per attempt)", source, n, minFailures)
	}
	if still := lines(logs, "Lease request failed (still failing)", source); len(still) != 0 {
		t.Errorf("source %s: summary lines within a minute: %v", source, still)
	}
}

// An apiserver that cannot be reached for a while (every request fails, with
// another message each time) is logged per Lease once when it starts and
// once when it ends, not at every renewal or read.
func TestLeaseOutageIsLoggedOnce(t *testing.T) {
	ns, sources := setup(t, 2)
	client := &failing{LeasesGetter: env.Clientset(t, true).CoordinationV1()}
	sh, logs := startObserved(t, ns, sources, client)
	waitFor(t, 20*time.Second, "both sources running", func() bool { return len(sh.Leading()) == 2 })

	client.getDown.Store(true)
	client.updateDown.Store(true)
	// Beyond RenewDeadline: the sources stop, the releases fail, reads fail.
	time.Sleep(fast.renew + 4*fast.retry)
	client.getDown.Store(false)
	client.updateDown.Store(false)
	waitFor(t, 20*time.Second, "both sources running again", func() bool { return len(sh.Leading()) == 2 })
	waitFor(t, 10*time.Second, "recovered lines", func() bool {
		return logs.FilterMessage("Lease request failed: recovered").Len() == 2
	})
	t.Logf("%d failed requests", client.failures.Load())
	for _, src := range sources {
		checkOneRun(t, logs, src, 3)
	}
}

// Updates refused while reads work (a Role that lost "update", a webhook):
// the successful reads between them do not end the run, so the refusals
// are logged once when they start and once when an update works again.
func TestRefusedUpdatesAreLoggedOnce(t *testing.T) {
	ns, sources := setup(t, 2)
	client := &failing{LeasesGetter: env.Clientset(t, true).CoordinationV1()}
	client.updateDown.Store(true) // after the dry-run check of Run
	sh, logs := startObserved(t, ns, sources, client)
	// A replica acquires nothing before its first heartbeat, which fails:
	// it keeps reading both Leases and retrying the heartbeat in one.
	waitFor(t, 20*time.Second, "refused heartbeats", func() bool { return client.failures.Load() >= 5 })
	client.updateDown.Store(false)
	waitFor(t, 20*time.Second, "both sources running", func() bool { return len(sh.Leading()) == 2 })

	checkOneRun(t, logs, sh.hbSlot.source, 5)
	for _, src := range sources {
		if src == sh.hbSlot.source {
			continue
		}
		if l := lines(logs, "Lease request failed", src); len(l) != 0 {
			t.Errorf("source %s: its Lease was only read, yet failures were logged: %v", src, l)
		}
	}
}
