package relay_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/relayd/relayd/internal/chaos/faultproxy"
	"github.com/relayd/relayd/pkg/checkpoint"
	"github.com/relayd/relayd/pkg/shard"
)

// TestShardingPartition cuts one of two relayd replicas off from the
// apiserver (not a crash: the process, its NATS connection and its watches'
// TCP connections stay up) while it holds half of the sources, and checks
// the exclusivity promised in pkg/shard's documentation ("Exclusivity") and
// docs/DEPLOY.md ("High availability and sharding") at the relayd level, where
// JetStream's duplicate window would otherwise hide a source run twice at
// once:
//
//   - the cut-off replica A stops publishing for its sources within
//     RenewDeadline of its last renewal the apiserver stored (+ stopSlack for
//     the timer and in-flight publishes), and its watchdog logs the cancel;
//   - the taker B acquires them (acquireTime) and publishes for them only
//     LeaseDuration or more after that renewal. "That renewal" is the
//     renewTime of the last Lease record with A as holder, as the test's own
//     watch of the Leases saw it: A's clock when it sent the renewal, the
//     latest moment A's watchdog can count from;
//   - over the whole run (start, partition, heal and rebalance, graceful
//     stops) no replica publishes for a source outside its own tenure, and
//     no checkpoint key ever moves back (docs/DEPLOY.md, "Never twice at once":
//     a replica that lost a Lease must not write that source's checkpoint
//     over the new holder's), as the test's own watch of the checkpoint
//     ConfigMap sees it;
//   - after healing, every change of every object is on the stream once, in
//     per-object resourceVersion order.
//
// Who published what, when: relayd puts nothing on a message that names
// the replica (and a subscriber cannot tell two publishers apart), so each
// replica talks to NATS through its own loopback tap (natsTap) that parses
// the client-to-server NATS protocol, forwards it unchanged and timestamps
// every PUB/HPUB: event and sync messages by their Nats-Msg-Id
// ("<source>/…"), object index writes by their key ("$KV.<bucket>.<source>.…",
// "$KV.<bucket>._epoch.<source>.…"). A tap sees a publish when the
// replica sends it, before the server; it records even the publishes
// JetStream drops as duplicates. A replica's tenure of a source is read
// from the Lease history recorded by the test's own watch (through no
// proxy): a tenure starts at the acquireTime of a record naming the holder
// (the holder's clock when it sent the acquire; a release writes an empty
// holder and a new acquireTime) and lasts until the next such record. A
// publish by X at time t is in X's tenure iff the newest acquireTime ≤ t is
// X's. A holder publishes only after its acquire succeeded and stops before
// it sends its release, and a taker sends its acquire only after the
// previous holder's Run must have returned, so every publish of a correct
// relayd lies inside its own tenure; a publish after another replica's
// acquire (or after its own release) is two replicas publishing for one
// source in overlapping intervals. All clocks are the one host's wall clock.
//
// Two faults, through internal/chaos/faultproxy in front of A's apiserver
// connection:
//
//   - blackhole: nothing passes either way (a silent partition). A's watches
//     starve too, so A has nothing left to publish: this checks the hand-over
//     timing, and the heal, when the proxy delivers everything it held.
//   - slow-link: 2 s added per forwarded chunk, more than a Lease request's
//     timeout (RenewDeadline/2), so every renewal times out at A while A's
//     watches still deliver events: A keeps getting input, and only its
//     watchdog can keep it from publishing alongside B. Some of A's writes
//     still reach the apiserver late and are stored (a renewal, a release);
//     B's LeaseDuration then counts from when it saw them.
func TestShardingPartition(t *testing.T) {
	for _, fault := range []string{"blackhole", "slow-link"} {
		t.Run(fault, func(t *testing.T) { shardingPartition(t, fault) })
	}
}

const (
	partLeaseDuration = 6 * time.Second
	partRenewDeadline = 3 * time.Second
	partRetryPeriod   = 500 * time.Millisecond
	// stopSlack is what A may publish after RenewDeadline: the watchdog
	// timer's lateness and publishes already in flight when it fires. The
	// hard limit is LeaseDuration − RenewDeadline (3 s here), past which
	// the overlap check fails anyway.
	stopSlack = time.Second
)

func shardingPartition(t *testing.T, fault string) {
	const shards = 4
	var srcs strings.Builder
	for i := range shards {
		fmt.Fprintf(&srcs, "\n  - name: s%d\n    apiVersion: v1\n    kind: ConfigMap\n    namespaces: [$NS]\n    labelSelector: shard=s%d", i, i)
	}
	f := newFixture(t, env, natsSrv, srcs.String())
	f.cfgYAML += fmt.Sprintf(`
sharding:
  enabled: true
  leaseDuration: %v
  renewDeadline: %v
  retryPeriod: %v
`, partLeaseDuration, partRenewDeadline, partRetryPeriod)
	ctx := t.Context()
	leases := f.cs.CoordinationV1().Leases(f.ns)
	sources := make([]string, shards)
	for i := range shards {
		sources[i] = fmt.Sprintf("s%d", i)
		if _, err := leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "relayd-" + sources[i]}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	lh := recordLeases(t, f)
	cph := recordCheckpoints(t, f)
	holderOf := func() map[string]string { // source -> holder
		h := holders(t, f, leaseNames(sources)...)
		out := map[string]string{}
		for l, id := range h {
			out[strings.TrimPrefix(l, "relayd-")] = id
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

	// Replica "ra" (A, the one cut off) and "rb" (B), each with its own
	// apiserver proxy and NATS tap. Created before the processes, so that
	// their cleanups run after the processes are killed.
	bucket := "relayd-index-" + f.cluster
	natsAddr := strings.TrimPrefix(natsSrv.URL(), "nats://")
	apiProxy, taps := map[string]*faultproxy.Proxy{}, map[string]*natsTap{}
	for _, id := range []string{"ra", "rb"} {
		p, err := faultproxy.New(strings.TrimPrefix(env.Host(), "https://"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		apiProxy[id] = p
		taps[id] = newNATSTap(t, id, natsAddr, bucket)
	}
	ref := f.reference("shard")
	procs := map[string]*relaydProc{}
	for _, id := range []string{"ra", "rb"} {
		p := f.binary()
		p.env = []string{"POD_NAME=" + id}
		kc, err := clientcmd.LoadFromFile(p.kc)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range kc.Clusters {
			c.Server = "https://" + apiProxy[id].Addr()
		}
		if err := clientcmd.WriteToFile(*kc, p.kc); err != nil {
			t.Fatal(err)
		}
		cfg := strings.Replace(f.cfgYAML, "url: "+natsSrv.URL()+"\n", "url: nats://"+taps[id].addr()+"\n", 1)
		if cfg == f.cfgYAML {
			t.Fatalf("no nats url %s in the config:\n%s", natsSrv.URL(), f.cfgYAML)
		}
		if err := os.WriteFile(p.conf, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		procs[id] = p
		p.start()
	}
	f.eventually(60*time.Second, "two sources per replica", func() error {
		if c := count(holderOf()); c["ra"] != 2 || c["rb"] != 2 {
			return fmt.Errorf("holders %v", holderOf())
		}
		return nil
	})
	f.waitInitialLists(procs, shards)

	// Writer: creates, updates and deletes objects of every source.
	stopWriter := make(chan struct{})
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		w := &churn{cs: f.cs, ns: f.ns, rng: rand.New(rand.NewPCG(5, 6)), names: 24, deleteOneIn: 5,
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

	// The cut.
	before := holderOf()
	var aSources []string
	for src, id := range before {
		if id == "ra" {
			aSources = append(aSources, src)
		}
	}
	sort.Strings(aSources)
	if len(aSources) != 2 {
		t.Fatalf("ra holds %v before the cut, want two sources (holders %v)", aSources, before)
	}
	switch fault {
	case "blackhole":
		apiProxy["ra"].Blackhole(true)
	case "slow-link":
		apiProxy["ra"].SetLatency(2 * time.Second)
	}
	cut := time.Now()
	f.eventually(4*partLeaseDuration, "rb holds every source", func() error {
		if c := count(holderOf()); c["rb"] != shards {
			return fmt.Errorf("holders %v", holderOf())
		}
		return nil
	})
	f.eventually(20*time.Second, "rb publishes for ra's sources", func() error {
		for _, src := range aSources {
			if _, ok := taps["rb"].first(src, cut); !ok {
				return fmt.Errorf("nothing from rb for %s since the cut", src)
			}
		}
		return nil
	})
	// Hold the partition a little longer: under slow-link A's watches go on
	// delivering, and a source still running on A would publish them now.
	time.Sleep(2 * time.Second)
	apiProxy["ra"].Heal()
	heal := time.Now()
	t.Logf("%s: ra cut off at %s with %v; healed %v later", fault, cut.Format("15:04:05.000"), aSources, heal.Sub(cut).Round(time.Millisecond))

	f.eventually(60*time.Second, "two sources per replica after healing", func() error {
		if c := count(holderOf()); c["ra"] != 2 || c["rb"] != 2 {
			return fmt.Errorf("holders %v", holderOf())
		}
		return nil
	})
	balanced := time.Now()
	time.Sleep(2 * time.Second)
	close(stopWriter)
	<-writerDone
	f.waitEveryChange(ref, 60*time.Second)
	procs["ra"].stop()
	procs["rb"].stop()
	ref.close()
	history := lh.close()
	cpHistory := cph.close()
	pubs := append(taps["ra"].close(), taps["rb"].close()...)
	sort.Slice(pubs, func(i, j int) bool { return pubs[i].at.Before(pubs[j].at) })
	rel := func(at time.Time) string { return fmt.Sprintf("cut%+v", at.Sub(cut).Round(time.Millisecond)) }

	// Nothing lost, nothing twice, per-object order.
	ms := f.stored()
	counts := storedChanges(ms, true)
	changes := ref.changes()
	for c, n := range counts {
		if n != 1 {
			t.Errorf("%+v stored %d times", c, n)
		}
	}
	for _, c := range changes {
		if counts[c] != 1 {
			t.Errorf("reference change %+v stored %d times", c, counts[c])
		}
	}
	lastRV := map[string]int64{}
	for _, m := range ms {
		if !strings.Contains(m.Env.Type, ".object.") || m.Env.RelaydOrigin != "watch" {
			continue
		}
		rv := rvNum(t, m.Env.K8sResourceVersion)
		if prev, ok := lastRV[m.Env.K8sUID]; ok && rv <= prev {
			t.Errorf("stream seq %d: %s %s/%s rv %d after rv %d of the same object", m.Seq, evType(m), m.Env.K8sNamespace, m.Env.K8sName, rv, prev)
		}
		lastRV[m.Env.K8sUID] = rv
	}

	// No checkpoint moved back: docs/DEPLOY.md ("High availability and
	// sharding", "Never twice at once") promises that a replica that lost a
	// Lease does not write the source's checkpoint, so that it cannot move
	// the new holder's position back.
	for key, writes := range cpHistory {
		for i := 1; i < len(writes); i++ {
			prev, cur := writes[i-1], writes[i]
			if prev.rv != "" && cur.rv != "" && rvNum(t, cur.rv) < rvNum(t, prev.rv) {
				t.Errorf("checkpoint key %s moved back from resourceVersion %s (written at %s) to %s (written at %s, seen %s): a replica wrote a stale position over the owner's",
					key, prev.rv, rel(prev.updated), cur.rv, rel(cur.updated), rel(cur.seen))
			}
		}
	}

	// No publish outside the publisher's tenure.
	tenures := map[string][]tenure{}
	for _, src := range sources {
		tenures[src] = tenuresOf(history["relayd-"+src])
	}
	outside := 0
	perReplica := map[string]int{}
	for _, p := range pubs {
		perReplica[p.replica]++
		ten, ok := tenureAt(tenures[p.source], p.at)
		switch {
		case !ok:
			t.Errorf("%s published %q for %s at %s, before any replica acquired its Lease", p.replica, p.what, p.source, rel(p.at))
		case ten.holder != p.replica:
			holder := ten.holder
			if holder == "" {
				holder = "nobody (released)"
			}
			t.Errorf("%s published %q for %s at %s, in the tenure of %s since %s: two replicas published for one source at once",
				p.replica, p.what, p.source, rel(p.at), holder, rel(ten.since))
		default:
			continue
		}
		if outside++; outside >= 20 {
			t.Fatalf("stopping after %d publishes outside their tenure", outside)
		}
	}

	// The partition: A stops, B waits for LeaseDuration.
	cancels := watchdogCancels(t, procs["ra"].log())
	for _, src := range aSources {
		ts := tenures[src]
		ti := -1
		for i, ten := range ts {
			if ten.holder == "rb" && ten.since.After(cut) {
				ti = i
				break
			}
		}
		if ti < 0 {
			t.Errorf("%s: no acquisition by rb after the cut in the Lease history %v", src, ts)
			continue
		}
		renewA, ok := lastRenewal(history["relayd-"+src], "ra", ts[ti].since)
		if !ok {
			t.Errorf("%s: no renewal by ra before rb's acquisition", src)
			continue
		}
		aLast, _ := taps["ra"].last(src, heal)
		aAfter := taps["ra"].countIn(src, cut, heal)
		bFirst, _ := taps["rb"].first(src, cut)
		// What the Lease went through between the cut and rb's
		// acquisition (a late write by ra, delivered after the cut,
		// restarts rb's LeaseDuration: later, never earlier, is safe).
		for _, r := range history["relayd-"+src] {
			if r.seen.After(cut) && r.acquire.Before(ts[ti].since) {
				t.Logf("%s %s: after the cut, before rb's acquisition: %v", fault, src, r)
			}
		}
		if d := ts[ti].since.Sub(renewA); d < partLeaseDuration {
			t.Errorf("%s: rb acquired the Lease %v after ra's last renewal, before LeaseDuration %v", src, d, partLeaseDuration)
		}
		if d := bFirst.Sub(renewA); d < partLeaseDuration {
			t.Errorf("%s: rb published %v after ra's last renewal, before LeaseDuration %v", src, d, partLeaseDuration)
		}
		if d := aLast.Sub(renewA); d > partRenewDeadline+stopSlack {
			t.Errorf("%s: ra published %v after its last renewal, later than RenewDeadline %v + %v", src, d, partRenewDeadline, stopSlack)
		}
		if !aLast.Before(bFirst) {
			t.Errorf("%s: ra's last publish before healing (%s) is not before rb's first (%s)", src, rel(aLast), rel(bFirst))
		}
		c, ok := cancels[src]
		switch {
		case !ok:
			t.Errorf("%s: ra did not log its watchdog's cancel (\"could not renew Lease within RenewDeadline\")", src)
		case c.lastRenewal.After(renewA.Truncate(time.Millisecond)): // the log has milliseconds
			t.Errorf("%s: ra's watchdog counted from a renewal at %s, after the last one the apiserver stored (%s)", src, rel(c.lastRenewal), rel(renewA))
		case c.at.Sub(c.lastRenewal) > partRenewDeadline+stopSlack:
			t.Errorf("%s: ra's watchdog cancelled the source %v after the renewal it counted from, RenewDeadline is %v", src, c.at.Sub(c.lastRenewal), partRenewDeadline)
		}
		t.Logf("%s %s: ra's last stored renewal %s; ra's watchdog counted from %s, cancelled at +%v; ra's last publish +%v (%d publishes after the cut); rb acquired +%v, first publish +%v; gap between publishers %v",
			fault, src, rel(renewA), rel(c.lastRenewal), c.at.Sub(renewA).Round(time.Millisecond),
			aLast.Sub(renewA).Round(time.Millisecond), aAfter, ts[ti].since.Sub(renewA).Round(time.Millisecond),
			bFirst.Sub(renewA).Round(time.Millisecond), bFirst.Sub(aLast).Round(time.Millisecond))
	}
	for id, p := range procs {
		if strings.Contains(p.log(), "source still running LeaseDuration after its last renewal") {
			t.Errorf("%s logged a source still running LeaseDuration after its last renewal", id)
		}
	}
	for _, src := range sources {
		t.Logf("%s %s publishers: %s", fault, src, segments(pubs, src, rel))
	}
	if t.Failed() {
		for _, src := range aSources {
			for _, r := range history["relayd-"+src] {
				t.Logf("Lease relayd-%s: %v", src, r)
			}
		}
	}
	t.Logf("%s: %d changes, %d publishes tapped (ra %d, rb %d), %d outside their tenure; rebalanced %v after healing",
		fault, len(changes), len(pubs), perReplica["ra"], perReplica["rb"], outside, balanced.Sub(heal).Round(time.Millisecond))
}

func leaseNames(sources []string) []string {
	out := make([]string, len(sources))
	for i, s := range sources {
		out[i] = "relayd-" + s
	}
	return out
}

// segments describes who published for src, in runs of one publisher.
func segments(pubs []tapped, src string, rel func(time.Time) string) string {
	var b strings.Builder
	var cur string
	var first, last time.Time
	n := 0
	flush := func() {
		if n > 0 {
			fmt.Fprintf(&b, " %s×%d [%s, %s]", cur, n, rel(first), rel(last))
		}
	}
	for _, p := range pubs {
		if p.source != src {
			continue
		}
		if p.replica != cur {
			flush()
			cur, first, n = p.replica, p.at, 0
		}
		last = p.at
		n++
	}
	flush()
	return strings.TrimSpace(b.String())
}

// cpWrite is one stored position of a checkpoint key.
type cpWrite struct {
	seen, updated time.Time
	rv            string
}

// cpHistory records every change of every key of the fixture's checkpoint
// ConfigMap.
type cpHistory struct {
	w       watch.Interface
	done    chan struct{}
	stopped atomic.Bool
	mu      sync.Mutex
	keys    map[string][]cpWrite
}

func recordCheckpoints(t *testing.T, f *fixture) *cpHistory {
	t.Helper()
	cms := f.cs.CoreV1().ConfigMaps(f.ns)
	opts := metav1.ListOptions{FieldSelector: "metadata.name=cp"}
	list, err := cms.List(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	opts.ResourceVersion = list.ResourceVersion
	w, err := cms.Watch(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	h := &cpHistory{w: w, done: make(chan struct{}), keys: map[string][]cpWrite{}}
	go func() {
		defer close(h.done)
		for ev := range w.ResultChan() {
			cm, ok := ev.Object.(*corev1.ConfigMap)
			if !ok {
				if !h.stopped.Load() {
					t.Errorf("checkpoint watch: %v event %T", ev.Type, ev.Object)
				}
				continue
			}
			seen := time.Now()
			h.mu.Lock()
			for k, v := range cm.Data {
				var p checkpoint.Position
				if err := json.Unmarshal([]byte(v), &p); err != nil {
					t.Errorf("checkpoint key %s: %v", k, err)
					continue
				}
				ws := h.keys[k]
				if n := len(ws); n > 0 && ws[n-1].rv == p.ResourceVersion && ws[n-1].updated.Equal(p.Updated) {
					continue
				}
				h.keys[k] = append(ws, cpWrite{seen: seen, updated: p.Updated, rv: p.ResourceVersion})
			}
			h.mu.Unlock()
		}
		if !h.stopped.Load() {
			t.Errorf("the test's checkpoint watch ended early: the checkpoint history is incomplete")
		}
	}()
	t.Cleanup(func() { h.close() })
	return h
}

func (h *cpHistory) close() map[string][]cpWrite {
	h.stopped.Store(true)
	h.w.Stop()
	<-h.done
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.keys
}

// leaseRecord is one state of a Lease as the test's watch saw it.
type leaseRecord struct {
	seen           time.Time // when the test's watch delivered it
	holder         string
	acquire, renew time.Time
	members        string // MembersAnnotation
}

func (r leaseRecord) String() string {
	f := func(t time.Time) string { return t.Format("15:04:05.000000") }
	return fmt.Sprintf("seen %s holder %q acquire %s renew %s members %s", f(r.seen), r.holder, f(r.acquire), f(r.renew), r.members)
}

// leaseHistory records every state of the fixture's Leases.
type leaseHistory struct {
	w       watch.Interface
	done    chan struct{}
	stopped atomic.Bool
	mu      sync.Mutex
	recs    map[string][]leaseRecord
}

func recordLeases(t *testing.T, f *fixture) *leaseHistory {
	t.Helper()
	leases := f.cs.CoordinationV1().Leases(f.ns)
	list, err := leases.List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := leases.Watch(t.Context(), metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	h := &leaseHistory{w: w, done: make(chan struct{}), recs: map[string][]leaseRecord{}}
	go func() {
		defer close(h.done)
		for ev := range w.ResultChan() {
			l, ok := ev.Object.(*coordinationv1.Lease)
			if !ok {
				if st, isStatus := ev.Object.(*metav1.Status); isStatus && h.stopped.Load() {
					continue // the watch's end
				} else if isStatus {
					t.Errorf("Lease watch: %v event: %s", ev.Type, st.Message)
				} else {
					t.Errorf("Lease watch: %v event %T", ev.Type, ev.Object)
				}
				continue
			}
			r := leaseRecord{seen: time.Now(), members: l.Annotations[shard.MembersAnnotation]}
			if l.Spec.HolderIdentity != nil {
				r.holder = *l.Spec.HolderIdentity
			}
			if l.Spec.AcquireTime != nil {
				r.acquire = l.Spec.AcquireTime.Time
			}
			if l.Spec.RenewTime != nil {
				r.renew = l.Spec.RenewTime.Time
			}
			h.mu.Lock()
			h.recs[l.Name] = append(h.recs[l.Name], r)
			h.mu.Unlock()
		}
		if !h.stopped.Load() {
			t.Errorf("the test's Lease watch ended early: the Lease history is incomplete")
		}
	}()
	t.Cleanup(func() { h.close() })
	return h
}

// close stops the watch and returns every Lease's records, in order.
func (h *leaseHistory) close() map[string][]leaseRecord {
	h.stopped.Store(true)
	h.w.Stop()
	<-h.done
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.recs
}

// tenure is a holder's (or, for "", nobody's) time with a Lease.
type tenure struct {
	holder string
	since  time.Time // acquireTime: the holder's clock when it sent the acquire (or release)
}

func (t tenure) String() string {
	return fmt.Sprintf("%q since %s", t.holder, t.since.Format("15:04:05.000000"))
}

func tenuresOf(recs []leaseRecord) []tenure {
	var out []tenure
	for _, r := range recs {
		if r.acquire.IsZero() {
			continue
		}
		if n := len(out); n > 0 && out[n-1].holder == r.holder && out[n-1].since.Equal(r.acquire) {
			continue // a renewal or a heartbeat
		}
		out = append(out, tenure{holder: r.holder, since: r.acquire})
	}
	return out
}

// tenureAt is the tenure with the newest start at or before at.
func tenureAt(ts []tenure, at time.Time) (tenure, bool) {
	var cur tenure
	ok := false
	for _, ten := range ts {
		if ten.since.After(at) {
			break
		}
		cur, ok = ten, true
	}
	return cur, ok
}

// lastRenewal is the renewTime of the last record naming holder before a
// tenure starting at until.
func lastRenewal(recs []leaseRecord, holder string, until time.Time) (time.Time, bool) {
	var out time.Time
	ok := false
	for _, r := range recs {
		if !r.acquire.IsZero() && !r.acquire.Before(until) {
			break
		}
		if r.holder == holder {
			out, ok = r.renew, true
		}
	}
	return out, ok
}

// watchdogCancel is one "could not renew Lease within RenewDeadline" line
// of a relayd log.
type watchdogCancel struct{ at, lastRenewal time.Time }

// watchdogCancels returns, per source, the last watchdog cancel in a relayd
// JSON log.
func watchdogCancels(t *testing.T, log string) map[string]watchdogCancel {
	t.Helper()
	const layout = "2006-01-02T15:04:05.000Z0700" // zapcore.ISO8601TimeEncoder
	out := map[string]watchdogCancel{}
	for line := range strings.Lines(log) {
		if !strings.Contains(line, "could not renew Lease within RenewDeadline") {
			continue
		}
		var e struct {
			TS          string `json:"ts"`
			Source      string `json:"source"`
			LastRenewal string `json:"lastRenewal"`
		}
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("relayd log line %q: %v", line, err)
		}
		at, err1 := time.Parse(layout, e.TS)
		lr, err2 := time.Parse(layout, e.LastRenewal)
		if err := errors.Join(err1, err2); err != nil {
			t.Fatalf("relayd log line %q: %v", line, err)
		}
		out[e.Source] = watchdogCancel{at: at, lastRenewal: lr}
	}
	return out
}

// tapped is one publish seen by a natsTap.
type tapped struct {
	at      time.Time
	replica string
	source  string
	what    string // Nats-Msg-Id, or "kv <key>"
}

// natsTap is a loopback TCP proxy in front of one replica's NATS
// connections: it forwards every byte unchanged and records the time,
// source and identity of every publish the replica sends (see
// TestShardingPartition).
type natsTap struct {
	t                         *testing.T
	replica, target, kvPrefix string
	ln                        net.Listener
	wg                        sync.WaitGroup

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	pubs   []tapped
	closed bool
}

func newNATSTap(t *testing.T, replica, target, bucket string) *natsTap {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n := &natsTap{t: t, replica: replica, target: target, kvPrefix: "$KV." + bucket + ".", ln: ln, conns: map[net.Conn]struct{}{}}
	n.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.wg.Go(func() { n.serve(c) })
		}
	})
	t.Cleanup(func() { n.close() })
	return n
}

func (n *natsTap) addr() string { return n.ln.Addr().String() }

func (n *natsTap) track(cs ...net.Conn) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return false
	}
	for _, c := range cs {
		n.conns[c] = struct{}{}
	}
	return true
}

func (n *natsTap) serve(client net.Conn) {
	server, err := net.DialTimeout("tcp", n.target, 5*time.Second)
	if err != nil {
		_ = client.Close()
		return
	}
	if !n.track(client, server) {
		_ = client.Close()
		_ = server.Close()
		return
	}
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(client, server)
		_ = client.Close()
		close(done)
	}()
	if err := n.relayClient(client, server); err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
		n.t.Logf("NATS tap of %s: %v", n.replica, err)
	}
	_ = server.Close()
	<-done
	n.mu.Lock()
	delete(n.conns, client)
	delete(n.conns, server)
	n.mu.Unlock()
}

// relayClient forwards the client's protocol to the server frame by frame,
// recording PUB and HPUB.
func (n *natsTap) relayClient(client, server net.Conn) error {
	r := bufio.NewReaderSize(client, 64<<10)
	w := bufio.NewWriterSize(server, 64<<10)
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			return err
		}
		at := time.Now()
		if _, err := w.Write(line); err != nil {
			return err
		}
		args := strings.Fields(string(line))
		if len(args) > 0 {
			op := strings.ToUpper(args[0])
			var subject string
			var hsize, tsize int
			switch {
			case op == "PUB" && (len(args) == 3 || len(args) == 4): // PUB <subject> [reply] <size>
				subject = args[1]
				tsize, err = strconv.Atoi(args[len(args)-1])
			case op == "HPUB" && (len(args) == 4 || len(args) == 5): // HPUB <subject> [reply] <header size> <total size>
				subject = args[1]
				hsize, err = strconv.Atoi(args[len(args)-2])
				if err == nil {
					tsize, err = strconv.Atoi(args[len(args)-1])
				}
			case op == "PUB" || op == "HPUB":
				return fmt.Errorf("malformed %q", line)
			}
			if err != nil || hsize < 0 || tsize < hsize {
				return fmt.Errorf("malformed %q: %v", line, err)
			}
			if subject != "" {
				body := make([]byte, tsize+2) // payload and its CRLF
				if _, err := io.ReadFull(r, body); err != nil {
					return err
				}
				if _, err := w.Write(body); err != nil {
					return err
				}
				n.record(at, subject, body[:hsize])
			}
		}
		if r.Buffered() == 0 {
			if err := w.Flush(); err != nil {
				return err
			}
		}
	}
}

func (n *natsTap) record(at time.Time, subject string, hdr []byte) {
	var src, what string
	if key, ok := strings.CutPrefix(subject, n.kvPrefix); ok {
		what = "kv " + key
		if rest, ok := strings.CutPrefix(key, "_epoch."); ok {
			key = rest
		}
		src, _, _ = strings.Cut(key, ".")
	} else if id := headerValue(hdr, "Nats-Msg-Id"); id != "" {
		what = id
		_, rest, _ := strings.Cut(id, "/") // <prefix>.<cluster>/<source>/…
		src, _, _ = strings.Cut(rest, "/")
	} else {
		return // JetStream API requests and the like: no source's
	}
	n.mu.Lock()
	n.pubs = append(n.pubs, tapped{at: at, replica: n.replica, source: src, what: what})
	n.mu.Unlock()
}

// headerValue finds key in a NATS header block ("NATS/1.0\r\nKey: v\r\n…").
func headerValue(hdr []byte, key string) string {
	for line := range bytes.Lines(hdr) {
		k, v, ok := bytes.Cut(line, []byte(":"))
		if ok && strings.EqualFold(string(bytes.TrimSpace(k)), key) {
			return string(bytes.TrimSpace(v))
		}
	}
	return ""
}

// first is the first publish for src after t.
func (n *natsTap) first(src string, t time.Time) (time.Time, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, p := range n.pubs {
		if p.source == src && p.at.After(t) {
			return p.at, true
		}
	}
	return time.Time{}, false
}

// last is the last publish for src before t.
func (n *natsTap) last(src string, t time.Time) (time.Time, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out time.Time
	ok := false
	for _, p := range n.pubs {
		if p.source == src && p.at.Before(t) {
			out, ok = p.at, true
		}
	}
	return out, ok
}

// countIn counts the publishes for src in (from, to).
func (n *natsTap) countIn(src string, from, to time.Time) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	c := 0
	for _, p := range n.pubs {
		if p.source == src && p.at.After(from) && p.at.Before(to) {
			c++
		}
	}
	return c
}

// close stops the tap and returns what it recorded.
func (n *natsTap) close() []tapped {
	n.mu.Lock()
	if !n.closed {
		n.closed = true
		_ = n.ln.Close()
		for c := range n.conns {
			_ = c.Close()
		}
	}
	n.mu.Unlock()
	n.wg.Wait()
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]tapped(nil), n.pubs...)
}
