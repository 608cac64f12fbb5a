package relay_test

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/pkg/index"
)

// filterSources: pods in scope when labelled watch=yes or Failed; two
// sources whose filter errors on every pod without the label team (fail
// open, and filterOnError: exclude).
const filterSources = `
  - name: pods
    apiVersion: v1
    kind: Pod
    namespaces: [$NS]
    filter: "has(object.metadata.labels.watch) && object.metadata.labels.watch == 'yes' || object.status.phase == 'Failed'"
  - name: pods-err
    apiVersion: v1
    kind: Pod
    namespaces: [$NS]
    filter: "object.metadata.labels.team == 'a'"
  - name: pods-err-x
    apiVersion: v1
    kind: Pod
    namespaces: [$NS]
    filter: "object.metadata.labels.team == 'a'"
    filterOnError: exclude`

// Objects entering and leaving a source's filter are published as added
// with relaydscope entered and deleted with relaydscope left, objects
// created and deleted in scope as plain added and deleted, and objects out
// of scope not at all (docs/CONSUMING.md, "Filters: entering and leaving
// scope"), in both content modes: live (a label, a status field), across
// a 410 (an object that left scope during the gap is a scope-left delete),
// and across a changed filter (a config-changed relist, bracketed by
// markers, with exactly the scope changes; an unchanged filter relists
// nothing). Evaluation errors fail open and are counted; with
// filterOnError: exclude the object is out of scope.
func TestFilterScopeChanges(t *testing.T) {
	noCache := testenv.StartT(t, testenv.Options{DisableWatchCache: true})
	for _, mode := range []string{"structured", "binary"} {
		t.Run(mode, func(t *testing.T) { filterScopeChanges(t, noCache, mode) })
	}
}

// scopeEvents lists source's object events after seq as "type name scope
// origin" strings, sorted.
func scopeEvents(ms []msg, source string, after uint64) []string {
	var out []string
	for _, m := range ms {
		if m.Seq <= after || m.Env.RelaydSource != source || !strings.Contains(m.Env.Type, ".object.") {
			continue
		}
		scope := m.Env.RelaydScope
		if scope == "" {
			scope = "-"
		}
		out = append(out, fmt.Sprintf("%s %s %s %s", m.Env.Type[strings.LastIndex(m.Env.Type, ".")+1:], m.Env.K8sName, scope, m.Env.RelaydOrigin))
	}
	sort.Strings(out)
	return out
}

// podWriter makes the test's pod writes.
type podWriter struct {
	t   *testing.T
	ctx context.Context
	f   *fixture
}

func (w podWriter) create(name string, labels map[string]string) {
	w.t.Helper()
	no := false
	labels["app"] = "x"
	_, err := w.f.cs.CoreV1().Pods(w.f.ns).Create(w.ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: corev1.PodSpec{AutomountServiceAccountToken: &no, Containers: []corev1.Container{{Name: "c", Image: "example/app:1"}}}}, metav1.CreateOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
}

// label sets (v != "") or removes label k.
func (w podWriter) label(name, k, v string) {
	w.t.Helper()
	pods := w.f.cs.CoreV1().Pods(w.f.ns)
	p, err := pods.Get(w.ctx, name, metav1.GetOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	if v == "" {
		delete(p.Labels, k)
	} else {
		p.Labels[k] = v
	}
	if _, err := pods.Update(w.ctx, p, metav1.UpdateOptions{}); err != nil {
		w.t.Fatal(err)
	}
}

func (w podWriter) phase(name string, ph corev1.PodPhase) {
	w.t.Helper()
	pods := w.f.cs.CoreV1().Pods(w.f.ns)
	p, err := pods.Get(w.ctx, name, metav1.GetOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	p.Status.Phase = ph
	if _, err := pods.UpdateStatus(w.ctx, p, metav1.UpdateOptions{}); err != nil {
		w.t.Fatal(err)
	}
}

func (w podWriter) delete(name string) {
	w.t.Helper()
	if err := w.f.cs.CoreV1().Pods(w.f.ns).Delete(w.ctx, name, metav1.DeleteOptions{}); err != nil {
		w.t.Fatal(err)
	}
}

// expectScope waits until source's object events after seq are want
// (sorted "type name scope origin"), and fails if they differ.
func (f *fixture) expectScope(source string, after uint64, want ...string) []msg {
	f.t.Helper()
	sort.Strings(want)
	var ms []msg
	var got []string
	f.eventually(30*time.Second, source+" events", func() error {
		var err error
		if ms, err = f.readStored(5 * time.Second); err != nil {
			return err
		}
		got = scopeEvents(ms, source, after)
		if len(got) < len(want) {
			return fmt.Errorf("%d of %d events:\n%s", len(got), len(want), strings.Join(got, "\n"))
		}
		return nil
	})
	if !slices.Equal(got, want) {
		f.t.Errorf("%s: events after seq %d:\n%s\nwant:\n%s", source, after, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	return ms
}

// lastRV is the highest resourceVersion of source's object events in ms.
func lastRV(t *testing.T, ms []msg, source string) int64 {
	var n int64
	for _, m := range ms {
		if m.Env.RelaydSource == source && strings.Contains(m.Env.Type, ".object.") {
			n = max(n, rvNum(t, m.Env.K8sResourceVersion))
		}
	}
	return n
}

func lastSeq(ms []msg) uint64 {
	if len(ms) == 0 {
		return 0
	}
	return ms[len(ms)-1].Seq
}

func filterScopeChanges(t *testing.T, e *testenv.Env, mode string) {
	f := newFixture(t, e, natsSrv, filterSources+"\ncloudevents:\n  mode: "+mode)
	ctx := t.Context()
	w := podWriter{t: t, ctx: ctx, f: f}
	// No controller-manager here: the ServiceAccount admission plugin
	// needs the namespace's default ServiceAccount to exist.
	if _, err := f.cs.CoreV1().ServiceAccounts(f.ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r := f.start(nil, true)

	// Live: created in scope; created out of scope, entering by a label,
	// leaving by it, entering by a status field; modified in scope;
	// deleted in scope (a pod on no node is first marked: a modified
	// event) and out of scope (nothing).
	w.create("p1", map[string]string{"watch": "yes"})
	w.create("p2", map[string]string{})
	w.create("p6", map[string]string{"watch": "no"})
	w.create("p9", map[string]string{})
	w.label("p2", "watch", "yes")
	w.label("p2", "watch", "")
	w.phase("p2", corev1.PodFailed)
	w.label("p1", "tier", "front")
	w.delete("p9")
	w.create("p3", map[string]string{"team": "a", "watch": "yes"})
	w.label("p3", "team", "b")
	ms := f.expectScope("pods", 0,
		"added p1 - watch", "added p2 entered watch", "deleted p2 left watch", "added p2 entered watch", "modified p1 - watch",
		"added p3 - watch", "modified p3 - watch")
	// Fail open: pods without the label team are in scope; exclude: out.
	f.expectScope("pods-err", 0, "added p1 - watch", "added p2 - watch", "added p6 - watch", "added p9 - watch",
		"modified p2 - watch", "modified p2 - watch", "modified p2 - watch", "modified p1 - watch", "modified p9 - watch", "deleted p9 - watch",
		"added p3 - watch", "deleted p3 left watch")
	f.expectScope("pods-err-x", 0, "added p3 - watch", "deleted p3 left watch")
	for src, wantErrs := range map[string]bool{"pods": false, "pods-err": true, "pods-err-x": true} {
		n := metricValue(t, r.reg, "relayd_filter_errors_total", map[string]string{"source": src})
		if (n > 0) != wantErrs || n < 0 {
			t.Errorf("relayd_filter_errors_total{source=%q} = %v, want errors: %v", src, n, wantErrs)
		}
	}
	after, oldHash := lastSeq(ms), ""
	f.eventually(30*time.Second, "checkpoint at the last change", func() error {
		cp := f.checkpoints()["pods."+f.ns]
		if oldHash = cp.FilterHash; cp.FilterHash == "" || cp.ResourceVersion == "" || rvNum(t, cp.ResourceVersion) < lastRV(t, ms, "pods") {
			return fmt.Errorf("checkpoint %+v", cp)
		}
		return nil
	})

	// A 410 gap: p1 leaves scope, p6 enters it, p3 is deleted while
	// out of scope of pods-err (nothing).
	r.stop(t)
	w.label("p1", "watch", "")
	w.label("p6", "watch", "yes")
	w.delete("p3")
	if _, err := e.CompactNow(ctx); err != nil {
		t.Fatal(err)
	}
	r = f.start(nil, true)
	f.expectScope("pods", after, "deleted p1 left resync", "added p6 - resync", "deleted p3 - resync")
	ms = f.waitStored(30*time.Second, func(m msg) bool { return m.Seq > after && m.Env.RelaydSource == "pods" && isSync("completed")(m) })
	for _, m := range markers(ms, "pods", "started", after) {
		if sd := syncOf(t, m); sd.Reason != "expired" {
			t.Errorf("sync.started reason %q, want expired (the test must reach the relist after a 410)", sd.Reason)
		}
	}
	if n := len(markers(ms, "pods", "completed", after)); n != 1 {
		t.Errorf("%d sync.completed of pods after the gap, want 1", n)
	}
	f.waitStored(30*time.Second, func(m msg) bool { return m.Seq > after && m.Env.RelaydSource == "pods-err-x" && isSync("completed")(m) })
	after = lastSeq(f.stored())

	// A changed filter: any watch label is in scope, Failed no longer. p2
	// (Failed, no label) leaves, p1 (watch: "" removed) stays out, p6 stays
	// in; p7 (watch=no) enters. The other sources' filters are unchanged:
	// no relist.
	w.create("p7", map[string]string{"watch": "no"})
	f.waitStored(30*time.Second, func(m msg) bool { return m.Seq > after && m.Env.RelaydSource == "pods-err" && m.Env.K8sName == "p7" })
	after = lastSeq(f.stored())
	r.stop(t)
	old := "filter: \"has(object.metadata.labels.watch) && object.metadata.labels.watch == 'yes' || object.status.phase == 'Failed'\""
	if !strings.Contains(f.cfgYAML, old) {
		t.Fatal("no pods filter in the config")
	}
	f.cfgYAML = strings.Replace(f.cfgYAML, old, `filter: "has(object.metadata.labels.watch)"`, 1)
	r = f.start(nil, true)
	f.expectScope("pods", after, "deleted p2 left resync", "added p7 entered resync")
	ms = f.waitStored(30*time.Second, func(m msg) bool { return m.Seq > after && m.Env.RelaydSource == "pods" && isSync("completed")(m) })
	started, completed := markers(ms, "pods", "started", after), markers(ms, "pods", "completed", after)
	if len(started) != 1 || len(completed) != 1 {
		t.Fatalf("config-changed relist: %d sync.started, %d sync.completed, want 1 each:\n%s", len(started), len(completed), dump(ms))
	}
	sd := syncOf(t, completed[0])
	if sd.Reason != "config-changed" || syncOf(t, started[0]).Reason != "config-changed" {
		t.Errorf("relist reason %q, want config-changed", sd.Reason)
	}
	if c := sd.Counts; c.Added != 1 || c.Deleted != 1 || c.Modified != 0 {
		t.Errorf("config-changed relist counts %+v, want 1 added, 1 deleted", c)
	}
	for _, src := range []string{"pods-err", "pods-err-x"} {
		if n := len(markers(ms, src, "started", after)); n != 0 {
			t.Errorf("%s: %d relists after a restart with its filter unchanged", src, n)
		}
	}
	// Unchanged since: a restart relists nothing, and the new scope holds.
	after = lastSeq(ms)
	f.eventually(30*time.Second, "checkpoint under the new filter", func() error {
		if cp := f.checkpoints()["pods."+f.ns]; cp.ResourceVersion == "" || rvNum(t, cp.ResourceVersion) < lastRV(t, ms, "pods") || cp.FilterHash == oldHash || cp.FilterHash == "" {
			return fmt.Errorf("checkpoint %+v", cp)
		}
		return nil
	})
	r.stop(t)
	f.start(nil, true)
	w.label("p1", "watch", "again")
	ms = f.expectScope("pods", after, "added p1 entered watch")
	if n := len(markers(ms, "pods", "started", after)); n != 0 {
		t.Errorf("pods: %d relists after a restart with its filter unchanged:\n%s", n, dump(ms))
	}
}

// Across kill -9: scope changes acked just before relayd is killed (its
// checkpoint and index bucket possibly behind: the replay and the start-up
// catch-up), or with a current checkpoint (the index bucket alone knows
// the scope), and changes made while it is down are each stored once,
// with their relaydscope; the graceful stop at the end holds.
func TestFilterScopeAcrossKill9(t *testing.T) {
	f := newFixture(t, env, natsSrv, `
  - name: cms
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]
    filter: "has(object.metadata.labels) && 'in' in object.metadata.labels"`)
	ctx := t.Context()
	cms := f.cs.CoreV1().ConfigMaps(f.ns)
	label := func(name string, in bool) {
		t.Helper()
		cm, err := cms.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if in {
			cm.Labels = map[string]string{"in": "1"}
		} else {
			cm.Labels = nil
		}
		if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	p := f.binary()
	p.start()
	f.eventually(30*time.Second, "first checkpoint", func() error {
		cm, err := cms.Get(ctx, "cp", metav1.GetOptions{})
		if err != nil || cm.Data["cms."+f.ns] == "" {
			return fmt.Errorf("no checkpoint yet (%v)", err)
		}
		return nil
	})
	f.createCM("a", map[string]string{"in": "1"}, nil)
	f.createCM("b", nil, nil)
	f.expectScope("cms", 0, "added a - watch")
	// Kill as soon as the scope changes are stored.
	label("a", false)
	label("b", true)
	f.expectScope("cms", 0, "added a - watch", "deleted a left watch", "added b entered watch")
	p.kill()
	// While down: back in, back out, a new one in, one out.
	label("a", true)
	label("b", false)
	f.createCM("c", map[string]string{"in": "1"}, nil)
	f.createCM("d", nil, nil)
	p.start()
	f.expectScope("cms", 0, "added a - watch", "deleted a left watch", "added b entered watch",
		"added a entered watch", "deleted b left watch", "added c - watch")
	// Kill with a current checkpoint: the index bucket alone knows that
	// a left scope and d entered it.
	label("a", false)
	label("d", true)
	ms := f.expectScope("cms", 0, "added a - watch", "deleted a left watch", "added b entered watch",
		"added a entered watch", "deleted b left watch", "added c - watch", "deleted a left watch", "added d entered watch")
	f.eventually(30*time.Second, "checkpoint at the last change", func() error {
		if cp := f.checkpoints()["cms."+f.ns]; rvNum(t, cp.ResourceVersion) < lastRV(t, ms, "cms") {
			return fmt.Errorf("checkpoint %+v", cp)
		}
		return nil
	})
	p.kill()
	label("a", true)
	label("d", false)
	p.start()
	ms = f.expectScope("cms", 0, "added a - watch", "deleted a left watch", "added b entered watch",
		"added a entered watch", "deleted b left watch", "added c - watch", "deleted a left watch", "added d entered watch",
		"added a entered watch", "deleted d left watch")
	p.stop()
	ids := map[string]int{}
	for _, m := range ms {
		if ids[m.MsgID]++; ids[m.MsgID] > 1 {
			t.Errorf("Nats-Msg-Id %s stored twice", m.MsgID)
		}
	}
}

// The start-up catch-up applies scope changes by their type: a scope-left
// delete removes the object from the index, a scope-entered add puts it
// there. The crash state (a kill -9 after both PubAcks and before their
// index writes) is built by hand as in
// TestIndexBehindTheStreamIsCaughtUpBeforeARelist: the checkpoint put back
// before them, a's entry restored, b's purged. While relayd is down b is
// deleted and the position compacted away: the relist must report b's
// delete (the catch-up indexed b) and nothing of a, changed meanwhile out
// of scope (the catch-up removed it; otherwise, listed and out of scope,
// it would leave scope a second time).
func TestCatchUpAppliesScopeChanges(t *testing.T) {
	noCache := testenv.StartT(t, testenv.Options{DisableWatchCache: true})
	f := newFixture(t, noCache, natsSrv, `
  - name: cms
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]
    filter: "has(object.metadata.labels) && 'in' in object.metadata.labels"`)
	ctx := t.Context()
	key := "cms." + f.ns
	a := f.createCM("a", map[string]string{"in": "1"}, nil)
	r := f.start(nil, true)
	f.waitStored(20*time.Second, isSync("completed"))
	f.eventually(20*time.Second, "checkpoint with a stream sequence", func() error {
		if p := f.checkpoints()[key]; p.Index == nil || p.StreamSeq == 0 {
			return fmt.Errorf("checkpoint %+v", p)
		}
		return nil
	})
	cp, err := f.cs.CoreV1().ConfigMaps(f.ns).Get(ctx, "cp", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	before := cp.Data[key]
	aKey := index.Key(index.Prefix("cms", f.ns), string(a.UID))
	aEntry, err := f.indexBucket().Get(ctx, aKey)
	if err != nil {
		t.Fatal(err)
	}

	b := f.createCM("b", nil, nil)
	b = f.updateCM(b, "v", "1") // not yet in scope: nothing
	b.Labels = map[string]string{"in": "1"}
	if b, err = f.cs.CoreV1().ConfigMaps(f.ns).Update(ctx, b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	a.Labels = nil
	if a, err = f.cs.CoreV1().ConfigMaps(f.ns).Update(ctx, a, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.expectScope("cms", 0, "added a - initial", "added b entered watch", "deleted a left watch")
	r.stop(t)

	f.editCheckpoint(func(data map[string]string) { data[key] = before })
	if _, err := f.indexBucket().Put(ctx, aKey, aEntry.Value()); err != nil {
		t.Fatal(err)
	}
	if err := f.indexBucket().Purge(ctx, index.Key(index.Prefix("cms", f.ns), string(b.UID))); err != nil {
		t.Fatal(err)
	}
	f.deleteCM("b")
	f.updateCM(a, "v", "2") // still out of scope, at a version no event had
	if _, err := noCache.CompactNow(ctx); err != nil {
		t.Fatal(err)
	}
	all := f.stored()
	after := all[len(all)-1].Seq
	f.start(nil, true)
	ms := f.waitStored(30*time.Second, func(m msg) bool { return m.Seq > after && isSync("completed")(m) })
	if sd := syncOf(t, markers(ms, "cms", "started", after)[0]); sd.Reason != "expired" {
		t.Errorf("sync.started reason %q, want expired (the test must reach the relist after a 410)", sd.Reason)
	}
	if got := scopeEvents(ms, "cms", after); strings.Join(got, "\n") != "deleted b - resync" {
		t.Errorf("after the relist:\n%s\nwant: deleted b - resync", strings.Join(got, "\n"))
	}
}
