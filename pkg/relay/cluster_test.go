package relay_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/relayd/relayd/internal/testenv"
)

// JetStream clusters (docs/GUARANTEES.md, "Delivery guarantees": effectively once across
// restarts, backpressure rather than loss): relayd publishes to a stream and
// keeps its index in a bucket, both with 3 replicas on three clustered
// nats-servers, while servers are stopped under load.

const clusterSource = `
  - name: cms
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]`

// newClusterFixture is newFixture with relayd and the test connected to
// every server of c (nats.url lists them all) and the stream and the index
// bucket created with 3 replicas.
func newClusterFixture(t *testing.T, c *testenv.NATSCluster) *fixture {
	t.Helper()
	f := newFixture(t, env, natsSrv, clusterSource)
	f.nc.Close()
	f.nats = nil // not the package's single server
	before := f.cfgYAML
	f.cfgYAML = strings.Replace(f.cfgYAML, "  url: "+natsSrv.URL()+"\n", "  url: "+c.URLs()+"\n", 1)
	f.cfgYAML = strings.Replace(f.cfgYAML, "    duplicateWindow: 10m\n", "    duplicateWindow: 10m\n    replicas: 3\n", 1)
	if f.cfgYAML == before {
		t.Fatalf("config template changed; cannot point it at the cluster:\n%s", before)
	}
	f.setNATS("  index:\n    replicas: 3")
	nc, err := nats.Connect(c.URLs(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	f.nc = nc
	if f.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	return f
}

func startCluster(t *testing.T) *testenv.NATSCluster {
	t.Helper()
	c, err := testenv.StartNATSCluster(3, testenv.NATSClusterOptions{Name: "relay-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Shutdown)
	return c
}

// waitStreamsUsable waits until the stream and the bucket have a leader
// and answer STREAM.INFO (right after a server start they may still
// answer 503 "JetStream system temporarily unavailable"; f.stored fails
// the test on any error).
func (f *fixture) waitStreamsUsable(c *testenv.NATSCluster) {
	f.t.Helper()
	for _, name := range []string{f.stream, f.bucketStream()} {
		if _, err := c.WaitStreamLeader(name, 60*time.Second); err != nil {
			f.t.Fatal(err)
		}
		f.eventually(60*time.Second, "stream "+name+" answers", func() error {
			ctx, cancel := context.WithTimeout(f.t.Context(), 5*time.Second)
			defer cancel()
			s, err := f.js.Stream(ctx, name)
			if err != nil {
				return err
			}
			_, err = s.Info(ctx)
			return err
		})
	}
}

// bucketStream is the stream under the fixture's index bucket.
func (f *fixture) bucketStream() string { return "KV_relayd-index-" + f.cluster }

// checkReplicas fails unless the stream and the bucket relayd created have
// 3 replicas.
func (f *fixture) checkReplicas() {
	f.t.Helper()
	ctx := f.t.Context()
	for _, name := range []string{f.stream, f.bucketStream()} {
		s, err := f.js.Stream(ctx, name)
		if err != nil {
			f.t.Fatalf("stream %s: %v", name, err)
		}
		if r := s.CachedInfo().Config.Replicas; r != 3 {
			f.t.Fatalf("stream %s has %d replicas, want 3 (nats.stream.replicas / nats.index.replicas)", name, r)
		}
	}
}

// writer makes churn writes, one every pace, in the background.
type writer struct {
	done chan struct{}
	mu   sync.Mutex
	n    int // writes done
	err  error
}

func (f *fixture) startWriter(seed uint64, n int, pace time.Duration) *writer {
	w := &writer{done: make(chan struct{})}
	c := &churn{cs: f.cs, ns: f.ns, rng: rand.New(rand.NewPCG(seed, 2)), names: 20, deleteOneIn: 6}
	ctx := f.t.Context()
	go func() {
		defer close(w.done)
		for i := range n {
			if err := c.write(ctx, i); err != nil {
				w.mu.Lock()
				w.err = err
				w.mu.Unlock()
				return
			}
			w.mu.Lock()
			w.n = i + 1
			w.mu.Unlock()
			time.Sleep(pace)
		}
	}()
	return w
}

func (w *writer) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}

// waitWrites waits until at least n writes are done.
func (f *fixture) waitWrites(w *writer, n int) {
	f.t.Helper()
	f.eventually(120*time.Second, fmt.Sprintf("%d writes", n), func() error {
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.err != nil {
			f.t.Fatalf("writer: %v", w.err)
		}
		if w.n < n {
			return fmt.Errorf("%d writes so far", w.n)
		}
		return nil
	})
}

// finish waits for the writer to end and fails on its error.
func (w *writer) finish(t *testing.T) {
	t.Helper()
	select {
	case <-w.done:
	case <-time.After(3 * time.Minute):
		t.Fatal("writer did not finish within 3m")
	}
	if w.err != nil {
		t.Fatalf("writer: %v", w.err)
	}
}

// checkOnceInOrder checks the stream against the reference: every change
// stored exactly once (and nothing else), each object's events in
// resourceVersion order, no Nats-Msg-Id twice. It returns the number of
// object events.
func (f *fixture) checkOnceInOrder(ref *reference) int {
	f.t.Helper()
	ms := f.stored()
	count := storedChanges(ms, false)
	history := ref.changes()
	objects := 0
	for c, n := range count {
		objects += n
		if n != 1 {
			f.t.Errorf("%+v stored %d times", c, n)
		}
	}
	for _, c := range history {
		if count[c] != 1 {
			f.t.Errorf("reference change %+v stored %d times", c, count[c])
		}
	}
	if objects != len(history) {
		f.t.Errorf("stream holds %d object events, the reference watch saw %d changes", objects, len(history))
	}
	ids := map[string]uint64{}
	last := map[string]int64{}
	for _, m := range ms {
		if m.MsgID == "" {
			f.t.Errorf("message %d (%s) has no Nats-Msg-Id", m.Seq, m.Env.Type)
		} else if seq, dup := ids[m.MsgID]; dup {
			f.t.Errorf("Nats-Msg-Id %s stored twice: sequences %d and %d", m.MsgID, seq, m.Seq)
		}
		ids[m.MsgID] = m.Seq
		if !strings.Contains(m.Env.Type, ".object.") {
			continue
		}
		rv := rvNum(f.t, m.Env.K8sResourceVersion)
		if prev, ok := last[m.Env.K8sUID]; ok && rv <= prev {
			f.t.Errorf("object %s (%s): resourceVersion %d stored after %d (sequence %d)", m.Env.K8sName, m.Env.K8sUID, rv, prev, m.Seq)
		}
		last[m.Env.K8sUID] = rv
	}
	if f.t.Failed() {
		f.t.Logf("stream:\n%s", dump(ms))
	}
	return objects
}

// waitBucketMatches waits until the index bucket holds, for source cms,
// exactly the objects the reference says exist, each at its last
// resourceVersion.
func (f *fixture) waitBucketMatches(ref *reference) {
	f.t.Helper()
	want := map[string]string{} // uid -> rv of the objects that exist
	for _, c := range ref.changes() {
		if c.typ == "deleted" {
			delete(want, c.uid)
		} else {
			want[c.uid] = c.rv
		}
	}
	kv := f.indexBucket()
	prefix := "cms." + f.ns + "."
	f.eventually(60*time.Second, "index bucket matches the reference", func() error {
		ctx, cancel := context.WithTimeout(f.t.Context(), 20*time.Second)
		defer cancel()
		keys, err := kv.ListKeys(ctx)
		if err != nil {
			return err
		}
		got := map[string]string{}
		for k := range keys.Keys() {
			if !strings.HasPrefix(k, prefix) {
				continue
			}
			e, err := kv.Get(ctx, k)
			if errors.Is(err, jetstream.ErrKeyNotFound) {
				continue
			}
			if err != nil {
				return fmt.Errorf("get %s: %w", k, err)
			}
			var v struct {
				UID             string `json:"uid"`
				ResourceVersion string `json:"resourceVersion"`
			}
			if err := json.Unmarshal(e.Value(), &v); err != nil {
				return fmt.Errorf("bucket key %s: %w", k, err)
			}
			got[v.UID] = v.ResourceVersion
		}
		var diff []string
		for uid, rv := range want {
			if got[uid] != rv {
				diff = append(diff, fmt.Sprintf("%s: bucket %q, want %s", uid, got[uid], rv))
			}
		}
		for uid, rv := range got {
			if _, ok := want[uid]; !ok {
				diff = append(diff, fmt.Sprintf("%s: bucket %s, deleted", uid, rv))
			}
		}
		if len(diff) > 0 {
			sort.Strings(diff)
			return fmt.Errorf("%d of %d objects differ: %s", len(diff), len(want), strings.Join(diff, "; "))
		}
		return nil
	})
}

// sumMetric adds up every series of a metric that has labels.
func sumMetric(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) (float64, map[string]float64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total, by := 0.0, map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			var desc []string
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok && v != l.GetValue() {
					continue next
				}
				desc = append(desc, l.GetName()+"="+l.GetValue())
			}
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
			total += v
			by[strings.Join(desc, ",")] = v
		}
	}
	return total, by
}

// The stream's leader is stopped while changes are being written, later
// the bucket's leader too; each comes back. Then relayd restarts from a
// checkpoint saved before the bucket's leader stopped, on a stream whose
// leader changed once more: its replays must be dropped by the new
// leader's duplicate window. Every change is stored exactly once, in
// per-object order, and the bucket ends up matching the cluster.
func TestJetStreamClusterLeaderStoppedUnderLoad(t *testing.T) {
	alongside(t)
	c := startCluster(t)
	f := newClusterFixture(t, c)
	ref := f.reference("")
	r := f.start(nil, true)
	f.waitStored(30*time.Second, isSync("completed"))
	f.checkReplicas()

	const n = 300
	w := f.startWriter(1, n, 10*time.Millisecond)

	f.waitWrites(w, n/4)
	lead, err := c.WaitStreamLeader(f.stream, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	c.Stop(lead)
	next, err := c.WaitStreamLeader(f.stream, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("stream leader %s stopped after %d writes; %s leads after %v", c.Name(lead), w.count(), c.Name(next), time.Since(t0).Round(time.Millisecond))
	f.waitWrites(w, n/2)
	if err := c.Start(lead); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s back after %d writes", c.Name(lead), w.count())
	if err := c.WaitReady(60 * time.Second); err != nil {
		t.Fatal(err)
	}

	f.waitWrites(w, 3*n/4)
	// A checkpoint as it is now, for the replay below.
	cm, err := f.cs.CoreV1().ConfigMaps(f.ns).Get(t.Context(), "cp", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	key := "cms." + f.ns
	saved := cm.Data[key]
	blead, err := c.WaitStreamLeader(f.bucketStream(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.Stop(blead)
	bnext, err := c.WaitStreamLeader(f.bucketStream(), 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("bucket leader %s stopped after %d writes; %s leads", c.Name(blead), w.count(), c.Name(bnext))
	w.finish(t)
	if err := c.StartAll(60 * time.Second); err != nil {
		t.Fatal(err)
	}
	f.waitStreamsUsable(c)

	f.waitEveryChange(ref, 90*time.Second)
	f.waitBucketMatches(ref)
	if err := r.readyErr(); err != nil {
		t.Errorf("after the faults: %v", err)
	}
	r.stop(t)
	errs, byReason := sumMetric(t, r.reg, "relayd_publish_errors_total", nil)

	// A replay across a leader change: relayd restarts from the checkpoint
	// saved above (as after a crash right after writing it), on a stream
	// led by another server than the one that stored those messages. The
	// new leader's duplicate window must drop every replay.
	lead, err = c.WaitStreamLeader(f.stream, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.Stop(lead)
	// Another server must have taken over before the old leader returns:
	// restarted at once, it can win the election again.
	if _, err := c.WaitStreamLeader(f.stream, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(lead); err != nil {
		t.Fatal(err)
	}
	f.waitStreamsUsable(c)
	if now := c.StreamLeader(f.stream); now == lead {
		t.Fatalf("%s still leads %s after its restart", c.Name(lead), f.stream)
	}
	f.editCheckpoint(func(d map[string]string) { d[key] = saved })
	r = f.start(nil, true)
	f.eventually(60*time.Second, "replays dropped as duplicates", func() error {
		if v, _ := sumMetric(t, r.reg, "relayd_publish_duplicates_total", map[string]string{"source": "cms"}); v < 1 {
			return fmt.Errorf("relayd_publish_duplicates_total{source=cms} = %v", v)
		}
		return nil
	})
	f.eventually(60*time.Second, "the replay caught up", func() error {
		if got := rvNum(t, f.checkpoints()[key].ResourceVersion); got < rvNum(t, ref.changes()[len(ref.changes())-1].rv) {
			return fmt.Errorf("checkpoint %d", got)
		}
		return nil
	})
	r.stop(t)
	ref.close()
	objects := f.checkOnceInOrder(ref)
	dups, _ := sumMetric(t, r.reg, "relayd_publish_duplicates_total", nil)
	t.Logf("%d changes, %d object events stored once each; relayd saw %v publish errors %v during the faults and %v duplicates replaying from an older checkpoint after a leader change",
		len(ref.changes()), objects, errs, nonZero(byReason), dups)
}

// Two of three servers stopped while changes are being written: no quorum,
// nothing can be stored. relayd stalls without exiting, publish errors and
// in-flight publishes show it, and the checkpoint does not pass the first
// change written during the outage. Both servers back: every change
// arrives once, in order, the bucket matches, and relayd is ready.
func TestJetStreamClusterQuorumLossStallsAndLosesNothing(t *testing.T) {
	alongside(t)
	c := startCluster(t)
	f := newClusterFixture(t, c)
	ref := f.reference("")
	r := f.start(nil, true)
	f.waitStored(30*time.Second, isSync("completed"))
	f.checkReplicas()
	key := "cms." + f.ns

	// Before: some changes, all stored and checkpointed.
	var cms []string
	for i := range 10 {
		cms = append(cms, f.createCM(fmt.Sprint("before-", i), nil, nil).ResourceVersion)
	}
	f.waitEveryChange(ref, 30*time.Second)
	f.checkpointWithin(key, cms[len(cms)-1], "")

	lead, err := c.WaitStreamLeader(f.stream, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// The stream leader and one more: the survivor is a follower.
	down := []int{lead, (lead + 1) % 3}
	for _, i := range down {
		c.Stop(i)
	}
	stopped := time.Now()
	t.Logf("stopped %s (stream leader) and %s; %v running", c.Name(down[0]), c.Name(down[1]), c.Running())
	errsBefore, _ := sumMetric(t, r.reg, "relayd_publish_errors_total", map[string]string{"source": "cms"})

	first := f.createCM("during-0", nil, nil)
	w := f.startWriter(2, 40, 20*time.Millisecond)
	w.finish(t)

	// Stalled and alive; unready once the stream check (every 30s) sees
	// the stream has no leader (a member still answers STREAM.INFO).
	if err := r.healthErr(); err != nil {
		t.Errorf("/healthz without quorum: %v, want 200 (no crash loop)", err)
	}
	select {
	case err := <-r.done:
		t.Fatalf("relay.Run returned without quorum: %v", err)
	default:
	}
	var byReason map[string]float64
	f.eventually(30*time.Second, "publish errors without quorum", func() error {
		var total float64
		total, byReason = sumMetric(t, r.reg, "relayd_publish_errors_total", map[string]string{"source": "cms"})
		if total <= errsBefore {
			return fmt.Errorf("relayd_publish_errors_total{source=cms} still %v", total)
		}
		return nil
	})
	inFlight, _ := sumMetric(t, r.reg, "relayd_publish_in_flight", map[string]string{"source": "cms"})
	t.Logf("publish errors without quorum: %v; in flight %v", nonZero(byReason), inFlight)
	if inFlight < 1 {
		t.Errorf("relayd_publish_in_flight{source=cms} = %v while nothing can be stored, want > 0", inFlight)
	}
	// Held for 40s: longer than the stream check's 30s interval.
	for f.checkpointHolds(key, first.ResourceVersion); time.Since(stopped) < 40*time.Second; {
		f.checkpointHolds(key, first.ResourceVersion)
	}
	why := r.unreadyBecause(f, "stream not usable", "no leader")
	t.Logf("/readyz without quorum, %v after the servers stopped: %s", time.Since(stopped).Round(time.Second), why)
	if v := metricValue(t, r.reg, "relayd_stream_usable", nil); v != 0 {
		t.Errorf("relayd_stream_usable = %v without quorum, want 0", v)
	}

	// Quorum back.
	t0 := time.Now()
	if err := c.StartAll(60 * time.Second); err != nil {
		t.Fatal(err)
	}
	f.waitStreamsUsable(c)
	f.waitEveryChange(ref, 120*time.Second)
	t.Logf("every change stored %v after the servers were started again", time.Since(t0).Round(time.Millisecond))
	r.unreadyGone(f)
	changes := ref.changes()
	f.checkpointWithin(key, changes[len(changes)-1].rv, "")
	f.waitBucketMatches(ref)
	r.stop(t)
	ref.close()
	objects := f.checkOnceInOrder(ref)
	t.Logf("%d changes (%d during the outage), %d object events stored once each", len(ref.changes()), 41, objects)
}

func nonZero(m map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range m {
		if v != 0 {
			out[k] = v
		}
	}
	return out
}
