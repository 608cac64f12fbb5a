package relay_test

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestShardingFailover runs three relayd binaries over six sources sharing
// one apiserver and one NATS through per-source Leases: the sources are
// spread two per replica; kill -9 of one moves its sources to the others,
// which resume from its checkpoints; a graceful stop hands over promptly;
// and against an independent reference watch every change is on the stream
// exactly once (the replays after the kill were dropped by JetStream).
func TestShardingFailover(t *testing.T) {
	const shards = 6
	var srcs strings.Builder
	for i := range shards {
		fmt.Fprintf(&srcs, "\n  - name: s%d\n    apiVersion: v1\n    kind: ConfigMap\n    namespaces: [$NS]\n    labelSelector: shard=s%d", i, i)
	}
	f := newFixture(t, env, natsSrv, srcs.String())
	const leaseDuration = 8 * time.Second
	f.cfgYAML += `
sharding:
  enabled: true
  leaseDuration: 8s
  renewDeadline: 5s
  retryPeriod: 500ms
`
	ctx := t.Context()
	leases := f.cs.CoordinationV1().Leases(f.ns)
	for i := range shards {
		if _, err := leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("relayd-s%d", i)}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	holders := func() map[string]string { // source -> holder
		out := map[string]string{}
		for i := range shards {
			l, err := leases.Get(ctx, fmt.Sprintf("relayd-s%d", i), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if h := l.Spec.HolderIdentity; h != nil && *h != "" {
				out[fmt.Sprintf("s%d", i)] = *h
			}
		}
		return out
	}
	count := func(h map[string]string) map[string]int {
		c := map[string]int{}
		for _, id := range h {
			c[id]++
		}
		return c
	}

	// Reference history: an independent watch from before the first write.
	ref := f.reference("shard")

	procs := map[string]*relaydProc{}
	for _, id := range []string{"r0", "r1", "r2"} {
		p := f.binary()
		p.env = []string{"POD_NAME=" + id}
		procs[id] = p
		p.start()
	}
	f.eventually(60*time.Second, "two sources per replica", func() error {
		if c := count(holders()); len(c) != 3 || c["r0"] != 2 || c["r1"] != 2 || c["r2"] != 2 {
			return fmt.Errorf("holders %v", holders())
		}
		return nil
	})
	t.Logf("spread: %v", holders())
	f.waitInitialLists(procs, shards)

	// Writer: creates and updates objects of every shard.
	stopWriter := make(chan struct{})
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		w := &churn{cs: f.cs, ns: f.ns, rng: rand.New(rand.NewPCG(3, 4)), names: 24, deleteOneIn: 5,
			labels: func(rng *rand.Rand) map[string]string {
				return map[string]string{"shard": fmt.Sprintf("s%d", rng.IntN(shards))}
			}}
		for i := 0; ; i++ {
			select {
			case <-stopWriter:
				return
			default:
			}
			if err := w.write(ctx, i); err != nil {
				t.Error(err)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	time.Sleep(2 * time.Second)

	// kill -9 of r0: its sources go to r1 and r2 after the lease duration.
	victim := holders()
	procs["r0"].kill()
	killed := time.Now()
	f.eventually(3*leaseDuration, "r0's sources taken over", func() error {
		h := holders()
		for src, id := range victim {
			if id == "r0" && (h[src] == "" || h[src] == "r0") {
				return fmt.Errorf("%s still held by %q", src, h[src])
			}
		}
		return nil
	})
	takeover := time.Since(killed)
	f.eventually(20*time.Second, "three sources per survivor", func() error {
		if c := count(holders()); c["r1"] != 3 || c["r2"] != 3 {
			return fmt.Errorf("holders %v", holders())
		}
		return nil
	})
	time.Sleep(time.Second)

	// Graceful stop of r1: r2 takes everything over well inside a lease
	// duration, because r1 releases its Leases once it has stopped.
	_ = procs["r1"].cmd.Process.Signal(syscall.SIGTERM)
	stopped := time.Now()
	f.eventually(leaseDuration/2, "r1's sources handed over to r2", func() error {
		if c := count(holders()); c["r2"] != shards {
			return fmt.Errorf("holders %v", holders())
		}
		return nil
	})
	handover := time.Since(stopped)
	if err := procs["r1"].cmd.Wait(); err != nil {
		t.Errorf("r1 did not exit cleanly: %v", err)
	}
	procs["r1"].cmd = nil
	time.Sleep(time.Second)
	close(stopWriter)
	<-writerDone

	// Every reference change on the stream, exactly once.
	f.waitEveryChange(ref, 60*time.Second)
	procs["r2"].stop()
	ref.close()
	counts := storedChanges(f.stored(), true)
	objects := 0
	for _, n := range counts {
		objects += n
	}
	history := ref.changes()
	var dup []string
	for c, n := range counts {
		if n != 1 {
			dup = append(dup, fmt.Sprintf("%+v x%d", c, n))
		}
	}
	sort.Strings(dup)
	if len(dup) > 0 {
		t.Errorf("stored more than once: %v", dup)
	}
	for _, c := range history {
		if counts[c] != 1 {
			t.Errorf("reference change %+v stored %d times", c, counts[c])
		}
	}
	if h := holders(); len(h) != 0 {
		t.Errorf("Leases still held after every replica stopped: %v", h)
	}
	t.Logf("%d changes, %d watch events stored; kill -9 takeover %v (lease duration %v); graceful hand-over %v",
		len(history), objects, takeover.Round(time.Millisecond), leaseDuration, handover.Round(time.Millisecond))
}

// TestShardingSingleReplicaIgnoresItsOwnLeases: one in-process replica with
// sharding on takes every source, is ready, reports leadership, and a source
// watching Leases relays other Leases but never relayd's own, which it
// renews every retry period.
func TestShardingSingleReplicaIgnoresItsOwnLeases(t *testing.T) {
	f := newFixture(t, env, natsSrv, `
  - name: leases
    apiVersion: coordination.k8s.io/v1
    kind: Lease
    namespaces: [$NS]
  - name: cms
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]`)
	f.cfgYAML += `
sharding:
  enabled: true
  leaseDuration: 3s
  renewDeadline: 2s
  retryPeriod: 200ms
`
	ctx := t.Context()
	leases := f.cs.CoordinationV1().Leases(f.ns)
	for _, name := range []string{"relayd-leases", "relayd-cms"} {
		if _, err := leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	r := f.start(nil, true)
	f.eventually(20*time.Second, "both sources led", func() error {
		for _, src := range []string{"leases", "cms"} {
			if v := metricValue(t, r.reg, "relayd_source_leader", map[string]string{"source": src}); v != 1 {
				return fmt.Errorf("relayd_source_leader{%s} = %v", src, v)
			}
		}
		return r.readyErr()
	})
	mine, err := leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "mine"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // about ten renewals of relayd's own Leases
	ms := f.waitStored(20*time.Second, isEvent("added", "mine", mine.ResourceVersion))
	for _, m := range ms {
		if strings.HasPrefix(m.Env.K8sName, "relayd-") {
			t.Errorf("relayd published its own Lease: %s %s", m.Env.Type, m.Env.K8sName)
		}
	}
	r.stop(t)
	if h := holders(t, f, "relayd-leases", "relayd-cms"); len(h) != 0 {
		t.Errorf("Leases still held after a graceful stop: %v", h)
	}
}

// TestShardingCheckpointLastWriteFollowsTheSource: the replica that hands a
// source over loses its relayd_checkpoint_last_write_timestamp_seconds
// series, so the source neither ages nor fires RelaydCheckpointStale where
// it no longer runs; the replica that takes it over reports its writes, and
// reports 0 (never written here) for the source it does not run.
func TestShardingCheckpointLastWriteFollowsTheSource(t *testing.T) {
	f := newFixture(t, env, natsSrv, `
  - name: s0
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]
  - name: s1
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]`)
	f.cfgYAML += `
sharding:
  enabled: true
  leaseDuration: 3s
  renewDeadline: 2s
  retryPeriod: 200ms
`
	leases := f.cs.CoordinationV1().Leases(f.ns)
	for _, name := range []string{"relayd-s0", "relayd-s1"} {
		if _, err := leases.Create(t.Context(), &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	const lastWrite = "relayd_checkpoint_last_write_timestamp_seconds"
	value := func(r *running, src string) float64 {
		return metricValue(t, r.reg, lastWrite, map[string]string{"source": src})
	}
	a := f.startAs("a", nil, true)
	f.createCM("first", nil, nil)
	f.eventually(30*time.Second, "a runs both sources and wrote their positions", func() error {
		for _, src := range []string{"s0", "s1"} {
			if v := value(a, src); v <= 0 {
				return fmt.Errorf("a: %s{%s} = %v", lastWrite, src, v)
			}
		}
		return nil
	})

	b := f.startAs("b", nil, false)
	var moved, kept string
	f.eventually(30*time.Second, "one source each", func() error {
		h := holders(t, f, "relayd-s0", "relayd-s1")
		if h["relayd-s0"] == h["relayd-s1"] || h["relayd-s0"] == "" || h["relayd-s1"] == "" {
			return fmt.Errorf("holders %v", h)
		}
		moved, kept = "s0", "s1"
		if h["relayd-s1"] == "b" {
			moved, kept = "s1", "s0"
		}
		return b.readyErr()
	})
	f.createCM("second", nil, nil)
	f.eventually(30*time.Second, "the moved source's series gone from a, written on b", func() error {
		if v := value(a, moved); v != -1 {
			return fmt.Errorf("a still has %s{%s} = %v", lastWrite, moved, v)
		}
		if v := value(b, moved); v <= 0 {
			return fmt.Errorf("b: %s{%s} = %v", lastWrite, moved, v)
		}
		return nil
	})
	if v := value(a, kept); v <= 0 {
		t.Errorf("a: %s{%s} = %v, want its last write", lastWrite, kept, v)
	}
	if v := value(b, kept); v != 0 {
		t.Errorf("b: %s{%s} = %v, want 0 (never run here)", lastWrite, kept, v)
	}
}

func holders(t *testing.T, f *fixture, names ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, n := range names {
		l, err := f.cs.CoordinationV1().Leases(f.ns).Get(t.Context(), n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if h := l.Spec.HolderIdentity; h != nil && *h != "" {
			out[n] = *h
		}
	}
	return out
}

// waitInitialLists waits until each source s0..s<n-1> has made its initial
// list in one of procs. A writer starts after it: a change made before its
// source's initial list arrives from the list, not the watch, and the
// sharding tests count watch events.
func (f *fixture) waitInitialLists(procs map[string]*relaydProc, n int) {
	f.t.Helper()
	f.eventually(60*time.Second, "every source's initial list", func() error {
		for i := range n {
			done := fmt.Sprintf(`"msg":"list completed","source":"s%d"`, i)
			if !slices.ContainsFunc(slices.Collect(maps.Values(procs)), func(p *relaydProc) bool { return strings.Contains(p.log(), done) }) {
				return fmt.Errorf("s%d has not listed", i)
			}
		}
		return nil
	})
}
