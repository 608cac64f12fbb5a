package shard

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	coordinationv1 "k8s.io/api/coordination/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/internal/testutil"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, testenv.Options{}, &env, nil))
}

// Timings for the tests. fast makes expiry-based take-over quick; slow has
// a LeaseDuration long enough that a hand-over well under it shows that it
// did not wait for expiry.
var (
	fast = timings{lease: 3 * time.Second, renew: 2 * time.Second, retry: 500 * time.Millisecond}
	slow = timings{lease: 10 * time.Second, renew: 6 * time.Second, retry: 500 * time.Millisecond}
)

type timings struct{ lease, renew, retry time.Duration }

func sourceNames(n int) []string {
	var out []string
	for i := range n {
		out = append(out, fmt.Sprintf("src-%d", i))
	}
	return out
}

// createLeases pre-creates the Leases of sources, empty, like deploy/ does.
func createLeases(t *testing.T, admin *kubernetes.Clientset, ns string, sources ...string) {
	t.Helper()
	for _, src := range sources {
		_, err := admin.CoordinationV1().Leases(ns).Create(t.Context(), &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: LeaseName(DefaultLeasePrefix, src), Namespace: ns},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// grant gives the restricted user exactly verbs on the named Leases of
// sources (resourceNames), like deploy/'s Role, and waits until RBAC lets it
// get the first one (when "get" is granted).
func grant(t *testing.T, ns string, sources []string, verbs ...string) {
	t.Helper()
	var names []string
	for _, src := range sources {
		names = append(names, LeaseName(DefaultLeasePrefix, src))
	}
	var probe func(context.Context) error
	if len(verbs) > 0 && verbs[0] == "get" {
		restricted := env.Clientset(t, true)
		probe = func(ctx context.Context) error {
			_, err := restricted.CoordinationV1().Leases(ns).Get(ctx, names[0], metav1.GetOptions{})
			return err
		}
	}
	env.Grant(t, ns, "relayd-shard", []rbacv1.PolicyRule{{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"},
		ResourceNames: names, Verbs: verbs}}, probe)
}

// setup creates a namespace with the pre-created Leases of n sources and
// grants the restricted user get and update on exactly them.
func setup(t *testing.T, n int) (ns string, sources []string) {
	t.Helper()
	admin := env.Clientset(t, false)
	ns = env.Namespace(t)
	sources = sourceNames(n)
	createLeases(t, admin, ns, sources...)
	grant(t, ns, sources, "get", "update")
	return ns, sources
}

var errPartition = errors.New("test: network partition")

// partitionable wraps the restricted Lease client of one replica. While down
// is set every request fails at once, as if the replica were cut off from
// the apiserver: it can neither renew nor release, which is what a replica
// that died looks like to the others, except that its process goes on and
// the test can check that it stopped its sources in time. It also records
// when each successful (non-dry-run) update of a Lease was sent.
type partitionable struct {
	coordinationv1client.LeasesGetter
	down atomic.Bool

	mu        sync.Mutex
	lastWrite map[string]time.Time
}

func (p *partitionable) Leases(ns string) coordinationv1client.LeaseInterface {
	return &partitionedLeases{LeaseInterface: p.LeasesGetter.Leases(ns), p: p}
}

func (p *partitionable) lastWriteOf(lease string) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lastWrite[lease]
}

type partitionedLeases struct {
	coordinationv1client.LeaseInterface
	p *partitionable
}

func (l *partitionedLeases) Get(ctx context.Context, name string, o metav1.GetOptions) (*coordinationv1.Lease, error) {
	if l.p.down.Load() {
		return nil, errPartition
	}
	return l.LeaseInterface.Get(ctx, name, o)
}

func (l *partitionedLeases) Update(ctx context.Context, lease *coordinationv1.Lease, o metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	if l.p.down.Load() {
		return nil, errPartition
	}
	sent := time.Now()
	out, err := l.LeaseInterface.Update(ctx, lease, o)
	if err == nil && len(o.DryRun) == 0 {
		l.p.mu.Lock()
		if l.p.lastWrite == nil {
			l.p.lastWrite = map[string]time.Time{}
		}
		l.p.lastWrite[lease.Name] = sent
		l.p.mu.Unlock()
	}
	return out, err
}

// interval is one execution of Options.Run, timed with the monotonic clock.
type interval struct {
	id, source              string
	start, cancelled, ended time.Time // zero until it happened
	lost                    bool      // the context's cause was ErrLeaseLost
}

// recorder is the Options.Run of every replica in a test: it records each
// execution and takes drain to return after its context is cancelled, like a
// source draining in-flight publishes.
type recorder struct {
	drain time.Duration

	mu      sync.Mutex
	ivs     []*interval
	leading map[string]int // OnLeading(source, true) minus (…, false), per id/source
}

func newRecorder(drain time.Duration) *recorder {
	return &recorder{drain: drain, leading: map[string]int{}}
}

func (r *recorder) run(id string) func(context.Context, string) {
	return func(ctx context.Context, source string) {
		iv := &interval{id: id, source: source, start: time.Now()}
		r.mu.Lock()
		r.ivs = append(r.ivs, iv)
		r.mu.Unlock()
		<-ctx.Done()
		r.mu.Lock()
		iv.cancelled = time.Now()
		iv.lost = errors.Is(context.Cause(ctx), ErrLeaseLost)
		r.mu.Unlock()
		time.Sleep(r.drain)
		r.mu.Lock()
		iv.ended = time.Now()
		r.mu.Unlock()
	}
}

func (r *recorder) onLeading(id string) func(string, bool) {
	return func(source string, leading bool) {
		r.mu.Lock()
		defer r.mu.Unlock()
		if leading {
			r.leading[id+"/"+source]++
		} else {
			r.leading[id+"/"+source]--
		}
	}
}

// intervals returns copies of the recorded intervals of source, by start.
func (r *recorder) intervals(source string) []interval {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []interval
	for _, iv := range r.ivs {
		if iv.source == source {
			out = append(out, *iv)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].start.Before(out[j].start) })
	return out
}

// running counts the executions not cancelled yet.
func (r *recorder) running() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, iv := range r.ivs {
		if iv.cancelled.IsZero() {
			n++
		}
	}
	return n
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.ivs)
}

// checkNoOverlap fails the test if two executions of one source ever
// overlapped: each must have ended before the next started.
func (r *recorder) checkNoOverlap(t *testing.T, sources []string) {
	t.Helper()
	for _, src := range sources {
		ivs := r.intervals(src)
		for i := 1; i < len(ivs); i++ {
			prev, cur := ivs[i-1], ivs[i]
			if prev.ended.IsZero() || cur.start.Before(prev.ended) {
				t.Errorf("source %s: %s started at +%v while %s (started +%v) had not ended (ended: %v)",
					src, cur.id, cur.start.Sub(ivs[0].start), prev.id, prev.start.Sub(ivs[0].start), !prev.ended.IsZero())
			}
		}
	}
}

// checkLeadingBalanced fails if OnLeading calls were not paired.
func (r *recorder) checkLeadingBalanced(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, n := range r.leading {
		if n != 0 {
			t.Errorf("OnLeading for %s: %d more true than false calls", k, n)
		}
	}
}

// replica is one Sharder running in the test process.
type replica struct {
	id     string
	sh     *Sharder
	client *partitionable
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
}

// startReplica builds and runs a Sharder with the restricted identity; the
// test's cleanup stops it.
func startReplica(t *testing.T, ns, id string, sources []string, tm timings, rec *recorder) *replica {
	t.Helper()
	rep := &replica{id: id, client: &partitionable{LeasesGetter: env.Clientset(t, true).CoordinationV1()}, done: make(chan error, 1)}
	sh, err := New(Options{
		Client:        rep.client,
		Namespace:     ns,
		Identity:      id,
		Sources:       sources,
		LeaseDuration: tm.lease,
		RenewDeadline: tm.renew,
		RetryPeriod:   tm.retry,
		Logger:        zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)).Named(id),
		Run:           rec.run(id),
		OnLeading:     rec.onLeading(id),
	})
	if err != nil {
		t.Fatal(err)
	}
	rep.sh = sh
	ctx, cancel := context.WithCancel(context.Background())
	rep.cancel = cancel
	go func() { rep.done <- sh.Run(ctx) }()
	t.Cleanup(func() { rep.stop(t) })
	return rep
}

// stop cancels the replica and waits for its Run to return.
func (r *replica) stop(t *testing.T) time.Duration {
	t.Helper()
	t0 := time.Now()
	r.once.Do(func() {
		r.cancel()
		select {
		case r.err = <-r.done:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: Run did not return within 30s of cancel", r.id)
		}
		if r.err != nil {
			t.Errorf("%s: Run: %v", r.id, r.err)
		}
	})
	return time.Since(t0)
}

// waitFor polls cond until it holds or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	t0 := time.Now()
	testutil.Eventually(t, timeout, what, func() error {
		if !cond() {
			return errors.New("not yet")
		}
		return nil
	})
	return time.Since(t0)
}

// shares reports whether the replicas' Leading lists have the lengths
// want (in order) and together cover sources exactly once.
func shares(reps []*replica, sources []string, want ...int) bool {
	seen := map[string]int{}
	for i, r := range reps {
		l := r.sh.Leading()
		if len(l) != want[i] {
			return false
		}
		for _, s := range l {
			seen[s]++
		}
	}
	if len(seen) != len(sources) {
		return false
	}
	for _, s := range sources {
		if seen[s] != 1 {
			return false
		}
	}
	return true
}

func describe(reps []*replica) string {
	var b strings.Builder
	for _, r := range reps {
		fmt.Fprintf(&b, "%s=%v ", r.id, r.sh.Leading())
	}
	return b.String()
}

// holderOf reads a Lease with the admin client.
func holderOf(t *testing.T, ns, source string) coordinationv1.LeaseSpec {
	t.Helper()
	l, err := env.Clientset(t, false).CoordinationV1().Leases(ns).Get(t.Context(), LeaseName(DefaultLeasePrefix, source), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return l.Spec
}
