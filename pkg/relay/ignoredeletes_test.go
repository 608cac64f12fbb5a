package relay_test

import (
	"context"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/pkg/event"
)

// ignoreRig writes the objects of one source of
// TestIgnoreChangesNeverSuppressesDeletes: ignored changes only touch the
// source's ignoreChanges path, watched ones another field. Each write
// returns the resourceVersion the apiserver gave it, and the rig keeps the
// object it returned.
type ignoreRig struct {
	source string // the source's name, which is also its resource
	create func(ctx context.Context, name string) (metav1.Object, error)
	// ignored changes the ignored path, watched a watched field.
	ignored, watched func(ctx context.Context, o metav1.Object, v string) (metav1.Object, error)
	del              func(ctx context.Context, name string) error
	objs             map[string]metav1.Object
	known            map[string]bool // resourceVersions the test wrote or read
}

func (r *ignoreRig) keep(t *testing.T, o metav1.Object, err error) string {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", r.source, err)
	}
	r.objs[o.GetName()] = o
	r.known[o.GetResourceVersion()] = true
	return o.GetResourceVersion()
}

// podRig: Pods with ignoreChanges: [status]; the watched field is the
// container's image. A Pod on no node is deleted without a grace period,
// but the apiserver first marks it (deletionTimestamp, a modified event of
// its own), then removes it.
func podRig(cs typedcorev1.CoreV1Interface, ns string) *ignoreRig {
	pods := cs.Pods(ns)
	no := false
	return &ignoreRig{
		source: "pods", objs: map[string]metav1.Object{}, known: map[string]bool{},
		create: func(ctx context.Context, name string) (metav1.Object, error) {
			return pods.Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec: corev1.PodSpec{AutomountServiceAccountToken: &no, Containers: []corev1.Container{{Name: "c", Image: "example/app:0"}}}}, metav1.CreateOptions{})
		},
		ignored: func(ctx context.Context, o metav1.Object, v string) (metav1.Object, error) {
			p := o.(*corev1.Pod)
			p.Status.Message = "heartbeat " + v
			p.Status.Conditions = []corev1.PodCondition{{Type: "Ready", Status: corev1.ConditionFalse, Reason: "Heartbeat" + v}}
			return pods.UpdateStatus(ctx, p, metav1.UpdateOptions{})
		},
		watched: func(ctx context.Context, o metav1.Object, v string) (metav1.Object, error) {
			p := o.(*corev1.Pod)
			p.Spec.Containers[0].Image = "example/app:" + v
			return pods.Update(ctx, p, metav1.UpdateOptions{})
		},
		del: func(ctx context.Context, name string) error { return pods.Delete(ctx, name, metav1.DeleteOptions{}) },
	}
}

// cmRig: ConfigMaps with ignoreChanges: [data]; the watched field is a
// label. A ConfigMap's delete is one write.
func cmRig(cs typedcorev1.CoreV1Interface, ns string) *ignoreRig {
	cms := cs.ConfigMaps(ns)
	return &ignoreRig{
		source: "configmaps", objs: map[string]metav1.Object{}, known: map[string]bool{},
		create: func(ctx context.Context, name string) (metav1.Object, error) {
			return cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"v": "0"}},
				Data: map[string]string{"heartbeat": "0"}}, metav1.CreateOptions{})
		},
		ignored: func(ctx context.Context, o metav1.Object, v string) (metav1.Object, error) {
			c := o.(*corev1.ConfigMap)
			c.Data = map[string]string{"heartbeat": v}
			return cms.Update(ctx, c, metav1.UpdateOptions{})
		},
		watched: func(ctx context.Context, o metav1.Object, v string) (metav1.Object, error) {
			c := o.(*corev1.ConfigMap)
			c.Labels["v"] = v
			return cms.Update(ctx, c, metav1.UpdateOptions{})
		},
		del: func(ctx context.Context, name string) error { return cms.Delete(ctx, name, metav1.DeleteOptions{}) },
	}
}

// events lists the source's object events after seq as objectEvents
// does, with "?" for a resourceVersion the test never saw: a delete's own,
// and that of a Pod's deletion mark.
func (r *ignoreRig) events(ms []msg, after uint64) []string {
	out := objectEvents(ms, r.source, after)
	for i, s := range out {
		head, rest, _ := strings.Cut(s, "@")
		rv, tail, _ := strings.Cut(rest, " ")
		if !r.known[rv] {
			out[i] = head + "@? " + tail
		}
	}
	sort.Strings(out)
	return out
}

// Deletes are never suppressed by ignoreChanges (docs/GUARANTEES.md,
// "Change filtering"), against the real servers, for Pods with
// ignoreChanges: [status] and ConfigMaps with ignoreChanges: [data].
// Ignored-only updates are suppressed, watched ones published. A watch
// DELETED is published for an object whose only changes were ignored
// (quiet) and for one whose final state differs from the version last
// published only in ignored paths (live): the deleted object's fingerprint
// is the one in the index (for ConfigMaps: the delete follows the ignored
// change directly; a Pod's delete follows its published deletion mark).
// After a 410 (relayd stopped, objects deleted, etcd compacted, watch cache
// off), the relist publishes a delete with final state unknown, at the
// version last published, for an object whose ignored change was
// suppressed while relayd ran (gone-a) and for one whose ignored change
// came in the gap (gone-b); an object with only an ignored change in the
// gap is unchanged (kept).
func TestIgnoreChangesNeverSuppressesDeletes(t *testing.T) {
	alongside(t)
	noCache := testenv.StartT(t, testenv.Options{DisableWatchCache: true})
	f := newFixture(t, noCache, natsSrv, `
  - name: pods
    apiVersion: v1
    kind: Pod
    namespaces: [$NS]
    ignoreChanges: [status]
  - name: configmaps
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]
    labelSelector: v
    ignoreChanges: [data]`)
	ctx := t.Context()
	// No controller-manager here: the ServiceAccount admission plugin
	// needs the namespace's default ServiceAccount to exist.
	if _, err := f.cs.CoreV1().ServiceAccounts(f.ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rigs := []*ignoreRig{podRig(f.cs.CoreV1(), f.ns), cmRig(f.cs.CoreV1(), f.ns)}
	type step func(r *ignoreRig) string
	create := func(name string) step {
		return func(r *ignoreRig) string { o, err := r.create(ctx, name); return r.keep(t, o, err) }
	}
	ignored := func(name, v string) step {
		return func(r *ignoreRig) string { o, err := r.ignored(ctx, r.objs[name], v); return r.keep(t, o, err) }
	}
	watched := func(name, v string) step {
		return func(r *ignoreRig) string { o, err := r.watched(ctx, r.objs[name], v); return r.keep(t, o, err) }
	}
	del := func(name string) step {
		return func(r *ignoreRig) string {
			if err := r.del(ctx, name); err != nil {
				t.Fatalf("%s: delete %s: %v", r.source, name, err)
			}
			return ""
		}
	}
	// rv[source][label] is the resourceVersion a step returned.
	rv := map[string]map[string]string{}
	do := func(label string, s step) {
		for _, r := range rigs {
			if rv[r.source] == nil {
				rv[r.source] = map[string]string{}
			}
			rv[r.source][label] = s(r)
		}
	}
	for _, name := range []string{"quiet", "live", "gone-a", "gone-b", "kept"} {
		do(name, create(name))
	}
	run := f.start(nil, true)
	f.waitStored(30*time.Second, func(m msg) bool { return isSync("completed")(m) && m.Env.RelaydSource == "pods" },
		func(m msg) bool { return isSync("completed")(m) && m.Env.RelaydSource == "configmaps" })

	// Live: suppressed ignored-only updates, published watched ones, deletes.
	do("", ignored("quiet", "1"))
	do("", ignored("quiet", "2"))
	do("", ignored("live", "1"))
	do("live watched", watched("live", "2"))
	do("", ignored("live", "3"))
	do("gone-a watched", watched("gone-a", "2"))
	do("", ignored("gone-a", "3"))
	do("", del("quiet"))
	do("", del("live"))
	do("marker", create("marker")) // after the deletes: a checkpoint past it is past them
	for _, r := range rigs {
		f.checkpointWithin(r.source+"."+f.ns, rv[r.source]["marker"], "")
	}
	all := f.stored()
	for _, r := range rigs {
		v := rv[r.source]
		want := []string{
			"added gone-a@" + v["gone-a"] + " initial",
			"added gone-b@" + v["gone-b"] + " initial",
			"added kept@" + v["kept"] + " initial",
			"added live@" + v["live"] + " initial",
			"added marker@" + v["marker"] + " watch",
			"added quiet@" + v["quiet"] + " initial",
			"deleted live@? watch",
			"deleted quiet@? watch",
			"modified gone-a@" + v["gone-a watched"] + " watch",
			"modified live@" + v["live watched"] + " watch",
		}
		if r.source == "pods" { // the deletion marks
			want = append(want, "modified live@? watch", "modified quiet@? watch")
		}
		sort.Strings(want)
		if got := r.events(all, 0); strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("%s: events while relayd ran:\n%s\nwant:\n%s", r.source, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		if n := metricValue(t, run.reg, "relayd_events_suppressed_total", map[string]string{"source": r.source}); n != 5 {
			t.Errorf("relayd_events_suppressed_total{%s} = %v, want 5 (the ignored-only updates, no delete)", r.source, n)
		}
	}
	run.stop(t)

	// The gap: ignored-only changes and deletes, then a compaction past
	// relayd's position: the resumed watch gets a 410 and relayd relists.
	before := all[len(all)-1].Seq
	do("", ignored("gone-b", "1"))
	do("", ignored("kept", "1"))
	do("", del("gone-a"))
	do("", del("gone-b"))
	if _, err := noCache.CompactNow(ctx); err != nil {
		t.Fatal(err)
	}
	run = f.start(nil, true)
	ms := f.waitStored(60*time.Second, func(m msg) bool { return m.Seq > before && isSync("completed")(m) && m.Env.RelaydSource == "pods" },
		func(m msg) bool {
			return m.Seq > before && isSync("completed")(m) && m.Env.RelaydSource == "configmaps"
		})
	run.stop(t)
	for _, r := range rigs {
		started, completed := markers(ms, r.source, "started", before), markers(ms, r.source, "completed", before)
		if len(started) != 1 || len(completed) != 1 {
			t.Errorf("%s: %d sync.started and %d sync.completed after the gap, want one each", r.source, len(started), len(completed))
			continue
		}
		if d := syncOf(t, started[0]); d.Reason != "expired" {
			t.Errorf("%s: relist after the gap: reason %q, want expired (the test must reach the relist after a 410)", r.source, d.Reason)
		}
		if d := syncOf(t, completed[0]); d.Counts != (event.SyncCounts{Deleted: 2, Unchanged: 2, Total: 2}) {
			t.Errorf("%s: relist after the gap: counts %+v, want 2 deleted and 2 unchanged (kept, marker) of 2 listed", r.source, d.Counts)
		}
		want := []string{
			"deleted gone-a@" + rv[r.source]["gone-a watched"] + " resync unknown",
			"deleted gone-b@" + rv[r.source]["gone-b"] + " resync unknown",
		}
		if got := r.events(ms, before); strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("%s: events after the gap:\n%s\nwant:\n%s", r.source, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	}
	if t.Failed() {
		t.Logf("stream:\n%s", dump(f.stored()))
	}
}
