package relay_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	corev1 "k8s.io/api/core/v1"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/pkg/event"
)

// sharedSources are the sources both relayds of TestTwoClustersShareOneStream
// run, under the same names: cms sees only its own cluster's objects (a
// label per relayd stands in for a second cluster), all sees the same
// objects from both (two relayds relaying one cluster under two names, as
// during a migration).
const sharedSources = `
  - name: cms
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]
    labelSelector: owner=$OWNER
  - name: all
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]`

// TestTwoClustersShareOneStream: two relayds with different cluster names
// and the same source names publish to one stream (docs/GUARANTEES.md, "A
// shared stream"). Through live changes, a graceful restart, a kill -9 and
// a 410 relist of one of them (A), with messages on A's subjects that
// another publisher wrote: neither publishes anything about objects only
// the other sees, neither deduplicates the other's messages (both clusters'
// sync markers and both copies of the shared objects' changes are stored),
// and A's catch-up counts the foreign messages and applies none.
func TestTwoClustersShareOneStream(t *testing.T) {
	alongside(t)
	noCache := testenv.StartT(t, testenv.Options{DisableWatchCache: true})
	fa := newFixture(t, noCache, natsSrv, sharedSources)
	fb := *fa
	fb.cluster = fa.cluster + "b"
	fb.cfgYAML = strings.NewReplacer("cluster: "+fa.cluster+"\n", "cluster: "+fb.cluster+"\n", "  name: cp\n", "  name: cp-b\n").Replace(fa.cfgYAML)
	fa.cfgYAML = strings.ReplaceAll(fa.cfgYAML, "$OWNER", "a")
	fb.cfgYAML = strings.ReplaceAll(fb.cfgYAML, "$OWNER", "b")
	ownedBy := func(o string) map[string]string { return map[string]string{"owner": o} }
	onlyA, onlyB := map[string]bool{}, map[string]bool{}
	cm := func(name, owner string) *corev1.ConfigMap {
		switch owner {
		case "a":
			onlyA[name] = true
		case "b":
			onlyB[name] = true
		}
		return fa.createCM(name, ownedBy(owner), nil)
	}
	a1, a2 := cm("a1", "a"), cm("a2", "a")
	b1 := cm("b1", "b")
	cm("b2", "b")
	n1 := cm("n1", "")

	ra, rb := fa.binary(), fb.binary()
	completed := func(cluster, source string, after uint64) func(msg) bool {
		return func(m msg) bool {
			return m.Seq > after && m.Env.K8sCluster == cluster && m.Env.RelaydSource == source && isSync("completed")(m)
		}
	}
	// A creates the stream; B adopts it (adds its subject) and from then on
	// neither changes anything of it (checkSharedConfig, at the end).
	ra.start()
	fa.waitStored(60*time.Second, completed(fa.cluster, "cms", 0), completed(fa.cluster, "all", 0))
	created, err := testenv.JSRequest(t.Context(), fa.nc, "$JS.API.STREAM.INFO."+fa.stream, nil)
	if err != nil {
		t.Fatal(err)
	}
	rb.start()
	fa.waitStored(60*time.Second, completed(fb.cluster, "cms", 0), completed(fb.cluster, "all", 0))

	// Live changes.
	a1 = fa.updateCM(a1, "v", "2")
	cm("a3", "a")
	cm("b3", "b")
	fa.deleteCM("b2")
	n1 = fa.updateCM(n1, "v", "2")
	fa.waitStored(30*time.Second, onCluster(fa.cluster, isEvent("modified", "a1", a1.ResourceVersion)),
		onCluster(fa.cluster, isEvent("modified", "n1", n1.ResourceVersion)),
		onCluster(fb.cluster, isEvent("modified", "n1", n1.ResourceVersion)), onCluster(fb.cluster, isEvent("deleted", "b2", "")))
	fa.eventually(20*time.Second, "A's checkpoint with a stream sequence", func() error {
		if p := fa.checkpoints()["cms."+fa.ns]; p.StreamSeq == 0 {
			return fmt.Errorf("checkpoint %+v", p)
		}
		return nil
	})

	// A restarts gracefully; B goes on meanwhile.
	ra.stop()
	a2 = fa.updateCM(a2, "v", "2")
	b4 := cm("b4", "b")
	fa.waitStored(30*time.Second, onCluster(fb.cluster, isEvent("added", "b4", b4.ResourceVersion)))
	ra.start()
	fa.waitStored(30*time.Second, onCluster(fa.cluster, isEvent("modified", "a2", a2.ResourceVersion)))

	// kill -9 of A.
	ra.kill()
	fa.deleteCM("a3")
	b1 = fa.updateCM(b1, "v", "2")
	fa.waitStored(30*time.Second, onCluster(fb.cluster, isEvent("modified", "b1", b1.ResourceVersion)))
	ra.start()
	fa.waitStored(30*time.Second, onCluster(fa.cluster, isEvent("deleted", "a3", "")))

	// A stops; another publisher writes on A's subjects (another cluster's
	// event, and one claiming A's cluster from B's source); B relays a new
	// object; A's position is compacted away: A relists after a 410.
	ra.stop()
	all := fa.stored()
	before := all[len(all)-1].Seq
	injectForeign(t, fa, fb.cluster, all)
	b5 := cm("b5", "b")
	a4 := cm("a4", "a")
	fa.waitStored(30*time.Second, onCluster(fb.cluster, isEvent("added", "b5", b5.ResourceVersion)))
	if _, err := noCache.CompactNow(t.Context()); err != nil {
		t.Fatal(err)
	}
	ra.start()
	ms := fa.waitStored(60*time.Second, completed(fa.cluster, "cms", before), completed(fa.cluster, "all", before))
	for _, m := range ms {
		if m.Seq > before && m.Env.K8sCluster == fa.cluster && isSync("started")(m) {
			if sd := syncOf(t, m); sd.Reason != "expired" {
				t.Errorf("A's relist %s: reason %q, want expired (the test must reach the relist after a 410)", m.Subject, sd.Reason)
			}
		}
	}
	a5 := cm("a5", "a")
	ms = fa.waitStored(30*time.Second, onCluster(fa.cluster, isEvent("added", "a5", a5.ResourceVersion)),
		onCluster(fa.cluster, isEvent("added", "a4", a4.ResourceVersion)))
	ra.stop()
	rb.stop()

	if !strings.Contains(ra.log(), "messages on relayd's own subjects that it did not write") {
		t.Error("A's log does not report the foreign messages on its subjects")
	}
	checkShared(t, ms, fa.cluster, fb.cluster, onlyA, onlyB, n1.ResourceVersion)
	checkSharedConfig(t, fa, created, "k8s."+fa.cluster+".>", "k8s."+fb.cluster+".>")
}

// checkSharedConfig compares the stream's configuration as the server
// reports it (STREAM.INFO) with before, key by key, in full, but for
// "subjects", which must be exactly subjects: relayd's only change to a
// stream it shares is adding its subject (docs/GUARANTEES.md, "A shared
// stream").
func checkSharedConfig(t *testing.T, f *fixture, before map[string]json.RawMessage, subjects ...string) {
	t.Helper()
	after, err := testenv.JSRequest(t.Context(), f.nc, "$JS.API.STREAM.INFO."+f.stream, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	if err := json.Unmarshal(after["subjects"], &got); err != nil {
		t.Fatalf("subjects %s: %v", after["subjects"], err)
	}
	if !slices.Equal(slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(subjects))) {
		t.Errorf("the shared stream's subjects %q, want %q", got, subjects)
	}
	if diff := testenv.DiffConfigs(before, after, "subjects"); len(diff) > 0 {
		t.Errorf("relayd changed more than the subjects of the shared stream:\n%s", strings.Join(diff, "\n"))
	}
}

// onCluster narrows want to cluster's messages.
func onCluster(cluster string, want func(msg) bool) func(msg) bool {
	return func(m msg) bool { return m.Env.K8sCluster == cluster && want(m) }
}

// injectForeign publishes, on cluster A's (fa's) subjects, copies of
// another cluster's (other's) object events: one as it was (k8scluster
// other), one claiming A's cluster with other's CloudEvents source. Stored
// after A's checkpoint, A's catch-up reads them.
func injectForeign(t *testing.T, fa *fixture, other string, all []msg) {
	t.Helper()
	s, err := fa.js.Stream(t.Context(), fa.stream)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range all {
		if m.Env.K8sCluster != other || m.Env.RelaydSource != "cms" || m.Env.K8sUID == "" || m.Env.Type != "k8s.object.added" {
			continue
		}
		rm, err := s.GetMsg(t.Context(), m.Seq)
		if err != nil {
			t.Fatal(err)
		}
		subj := "k8s." + fa.cluster + strings.TrimPrefix(m.Subject, "k8s."+other)
		data := rm.Data
		if n == 1 {
			data = []byte(strings.Replace(string(data), `"k8scluster":"`+other+`"`, `"k8scluster":"`+fa.cluster+`"`, 1))
		}
		out := nats.NewMsg(subj)
		out.Data = data
		out.Header.Set("Content-Type", event.ContentTypeCloudEvents)
		if _, err := fa.js.PublishMsg(t.Context(), out); err != nil {
			t.Fatal(err)
		}
		if n++; n == 2 {
			return
		}
	}
	t.Fatalf("fewer than two of %s's added events to copy", other)
}

// checkShared checks the stream of TestTwoClustersShareOneStream: each
// cluster's messages are on its own subjects; no cluster published
// anything about an object only the other sees (onlyA, onlyB); both
// clusters' initial sync markers are stored, for both sources; the shared
// object's change at rv is stored for both; no Nats-Msg-Id twice.
func checkShared(t *testing.T, ms []msg, a, b string, onlyA, onlyB map[string]bool, rv string) {
	t.Helper()
	ids := map[string]uint64{}
	markers := map[string]int{}
	for _, m := range ms {
		c := m.Env.K8sCluster
		if first, dup := ids[m.MsgID]; dup && m.MsgID != "" {
			t.Errorf("Nats-Msg-Id %q stored twice (seq %d and %d)", m.MsgID, first, m.Seq)
		}
		ids[m.MsgID] = m.Seq
		if m.MsgID == "" {
			continue // injected by the test (relayd sets a Nats-Msg-Id on everything)
		}
		if !strings.HasPrefix(m.Subject, "k8s."+c+".") {
			t.Errorf("cluster %s's message on %s", c, m.Subject)
		}
		if m.Env.K8sUID == "" {
			if m.Env.RelaydEpoch == 1 {
				markers[c+"/"+m.Env.RelaydSource+"/"+m.Env.Type]++
			}
			continue
		}
		if m.Env.RelaydSource == "cms" && ((c == a && onlyB[m.Env.K8sName]) || (c == b && onlyA[m.Env.K8sName])) {
			t.Errorf("cluster %s published %s about %s, an object only the other cluster sees (origin %s, seq %d)",
				c, m.Env.Type, m.Env.K8sName, m.Env.RelaydOrigin, m.Seq)
		}
	}
	for _, c := range []string{a, b} {
		for _, src := range []string{"cms", "all"} {
			for _, phase := range []string{"started", "completed"} {
				if k := c + "/" + src + "/k8s.source.sync." + phase; markers[k] != 1 {
					t.Errorf("%s: %d initial sync.%s markers stored, want 1", k, markers[k], phase)
				}
			}
		}
		n := 0
		for _, m := range ms {
			if m.Env.K8sCluster == c && m.Env.RelaydSource == "all" && isEvent("modified", "n1", rv)(m) {
				n++
			}
		}
		if n != 1 {
			t.Errorf("cluster %s: n1's change at rv %s stored %d times, want once", c, rv, n)
		}
	}
	if t.Failed() {
		t.Logf("stream:\n%s", dump(ms))
	}
}

// TestReplayAfterUpgradeKeepsTheOlderMsgIDs: relayd versions before the
// Nats-Msg-Id named the cluster stored "<source>/<id>". After an upgrade,
// the new relayd resumes from the older one's checkpoint and republishes
// what came after it; those changes the older one had stored must get its
// ids again, or JetStream would store them twice (docs/DEPLOY.md, "Upgrade
// and rollback: formats"). The older relayd's last messages are built by
// hand, as it wrote them (a crash after their PubAcks, before the
// checkpoint moved): the test cannot run an older build.
func TestReplayAfterUpgradeKeepsTheOlderMsgIDs(t *testing.T) {
	f := newFixture(t, env, natsSrv, `
  - name: cms
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]
    labelSelector: app=x`)
	key := "cms." + f.ns
	x := f.createCM("x", map[string]string{"app": "x"}, nil)
	r := f.start(nil, true)
	f.waitStored(20*time.Second, isSync("completed"), isEvent("added", "x", x.ResourceVersion))
	f.eventually(20*time.Second, "checkpoint with a stream sequence", func() error {
		if p := f.checkpoints()[key]; p.StreamSeq == 0 {
			return fmt.Errorf("checkpoint %+v", p)
		}
		return nil
	})
	r.stop(t)

	// What the older relayd stored after its checkpoint, then crashed.
	enc, err := event.NewEncoder(event.EncoderOptions{Cluster: f.cluster, Source: "cms"})
	if err != nil {
		t.Fatal(err)
	}
	x2 := f.updateCM(x, "v", "2")
	y := f.createCM("y", map[string]string{"app": "x"}, nil)
	var legacy []string
	for _, c := range []struct {
		typ event.Type
		cm  *corev1.ConfigMap
	}{{event.Modified, x2}, {event.Added, y}} {
		m, err := enc.Encode(&event.Change{
			Type: c.typ, Origin: event.OriginWatch, Epoch: 1, Resource: event.Resource{Version: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespaced: true},
			Meta: event.Meta{Namespace: f.ns, Name: c.cm.Name, UID: string(c.cm.UID), ResourceVersion: c.cm.ResourceVersion},
		})
		if err != nil {
			t.Fatal(err)
		}
		enc.UseLegacyMsgID(&m)
		out := nats.NewMsg(m.Subject)
		out.Header, out.Data = m.Header, m.Data
		if _, err := f.js.PublishMsg(t.Context(), out); err != nil {
			t.Fatal(err)
		}
		legacy = append(legacy, m.MsgID)
	}
	all := f.stored()
	before := all[len(all)-1].Seq

	r = f.start(nil, true)
	z := f.createCM("z", map[string]string{"app": "x"}, nil)
	ms := f.waitStored(20*time.Second, isEvent("added", "z", z.ResourceVersion))
	if got := metricValue(t, r.reg, "relayd_publish_duplicates_total", map[string]string{"source": "cms"}); got < 2 {
		t.Errorf("relayd_publish_duplicates_total = %v, want the 2 replays dropped as duplicates", got)
	}
	ids := map[string]int{}
	for _, m := range ms {
		if m.Seq > before {
			if m.Env.K8sUID == "" {
				t.Errorf("after the upgrade: %s (seq %d), want no relist", m.Env.Type, m.Seq)
			}
			if m.Env.K8sName != "z" {
				t.Errorf("after the upgrade: %s %s@%s stored again (Nats-Msg-Id %s)", m.Env.Type, m.Env.K8sName, m.Env.K8sResourceVersion, m.MsgID)
			}
		}
		ids[m.MsgID]++
	}
	for _, id := range legacy {
		if ids[id] != 1 {
			t.Errorf("%s stored %d times, want once", id, ids[id])
		}
	}
	if !strings.HasPrefix(ms[len(ms)-1].MsgID, "k8s."+f.cluster+"/cms/") {
		t.Errorf("a new change's Nats-Msg-Id %q, want k8s.%s/cms/…", ms[len(ms)-1].MsgID, f.cluster)
	}
}
