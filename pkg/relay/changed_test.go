package relay_test

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/relayd/relayd/internal/testenv"
)

// changedSources: the same Deployments with changedPaths in a full and a
// metadata payload (which then reads whole objects), and without any.
const changedSources = `
  - name: deploys
    apiVersion: apps/v1
    kind: Deployment
    namespaces: [$NS]
    changedPaths: [spec, status, metadata.labels]
  - name: deploys-meta
    apiVersion: apps/v1
    kind: Deployment
    namespaces: [$NS]
    payload: metadata
    changedPaths: [spec, metadata.labels]
  - name: deploys-plain
    apiVersion: apps/v1
    kind: Deployment
    namespaces: [$NS]`

// Each modified event says which changedPaths changed since the version
// published before (docs/CONSUMING.md, "What changed"), in both content
// modes: a spec, a labels, a status and an annotations-only update; a
// change while relayd is stopped (the answer comes from the index bucket
// after the restart); two changes across a 410 gap (the resynced object
// names both paths); and, after the source's changedPaths changed, every
// path said unknown once. A source without changedPaths never carries
// the extensions.
func TestEventsSayWhatChanged(t *testing.T) {
	noCache := testenv.StartT(t, testenv.Options{DisableWatchCache: true})
	for _, mode := range []string{"structured", "binary"} {
		t.Run(mode, func(t *testing.T) { whatChanged(t, noCache, mode) })
	}
}

// changedWant is what an event must carry: relaydchanged and
// relaydchangedunknown, and its origin.
type changedWant struct{ changed, unknown, origin string }

func whatChanged(t *testing.T, e *testenv.Env, mode string) {
	f := newFixture(t, e, natsSrv, changedSources+"\ncloudevents:\n  mode: "+mode)
	ctx := t.Context()
	deploys := f.cs.AppsV1().Deployments(f.ns)
	sources := []string{"deploys", "deploys-meta", "deploys-plain"}
	want := map[string]map[string]changedWant{} // source -> rv -> want
	expect := func(rv, origin string, w ...changedWant) {
		for i, src := range sources {
			if want[src] == nil {
				want[src] = map[string]changedWant{}
			}
			x := changedWant{origin: origin}
			if i < len(w) {
				x = w[i]
				x.origin = origin
			}
			want[src][rv] = x
		}
	}
	var d *appsv1.Deployment
	write := func(what string, edit func(d *appsv1.Deployment), status bool) {
		t.Helper()
		var err error
		if d, err = deploys.Get(ctx, "web", metav1.GetOptions{}); err != nil {
			t.Fatal(err)
		}
		edit(d)
		if status {
			d, err = deploys.UpdateStatus(ctx, d, metav1.UpdateOptions{})
		} else {
			d, err = deploys.Update(ctx, d, metav1.UpdateOptions{})
		}
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	waitAll := func(rv string) {
		t.Helper()
		var preds []func(msg) bool
		for _, src := range sources {
			preds = append(preds, func(m msg) bool { return m.Env.RelaydSource == src && m.Env.K8sResourceVersion == rv })
		}
		f.waitStored(30*time.Second, preds...)
	}
	replicas := func(n int32) func(*appsv1.Deployment) { return func(d *appsv1.Deployment) { d.Spec.Replicas = &n } }

	r := f.start(nil, true)
	one := int32(1)
	var err error
	d, err = deploys.Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Labels: map[string]string{"app": "web"}},
		Spec: appsv1.DeploymentSpec{Replicas: &one, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web"}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "example/app:1"}}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	expect(d.ResourceVersion, "watch") // added: nothing to compare with
	write("spec", replicas(2), false)
	expect(d.ResourceVersion, "watch", changedWant{changed: "spec"}, changedWant{changed: "spec"})
	write("labels", func(d *appsv1.Deployment) { d.Labels["tier"] = "front" }, false)
	expect(d.ResourceVersion, "watch", changedWant{changed: "metadata.labels"}, changedWant{changed: "metadata.labels"})
	write("status", func(d *appsv1.Deployment) { d.Status.ObservedGeneration = d.Generation; d.Status.Replicas = 2 }, true)
	expect(d.ResourceVersion, "watch", changedWant{changed: "status"})
	write("annotations", func(d *appsv1.Deployment) { d.Annotations = map[string]string{"note": "x"} }, false)
	expect(d.ResourceVersion, "watch")
	waitAll(d.ResourceVersion)

	// A change while relayd is stopped: after the restart, the answer
	// comes from the index the bucket kept.
	r.stop(t)
	write("spec while stopped", replicas(3), false)
	expect(d.ResourceVersion, "watch", changedWant{changed: "spec"}, changedWant{changed: "spec"})
	r = f.start(nil, true)
	waitAll(d.ResourceVersion)
	v6 := d.ResourceVersion
	f.eventually(30*time.Second, "checkpoints at the last change", func() error {
		cps := f.checkpoints()
		for _, src := range sources {
			if cp := cps[src+"."+f.ns]; cp.ResourceVersion == "" || rvNum(t, cp.ResourceVersion) < rvNum(t, v6) {
				return fmt.Errorf("%s: checkpoint %+v", src, cp)
			}
		}
		return nil
	})

	// A 410 gap with two changes: the resynced object names both paths.
	r.stop(t)
	before := f.stored()
	after := before[len(before)-1].Seq
	write("status in the gap", func(d *appsv1.Deployment) { d.Status.Replicas = 3 }, true)
	write("labels in the gap", func(d *appsv1.Deployment) { d.Labels["tier"] = "back" }, false)
	expect(d.ResourceVersion, "resync", changedWant{changed: "status,metadata.labels"}, changedWant{changed: "metadata.labels"})
	if _, err := e.CompactNow(ctx); err != nil {
		t.Fatal(err)
	}
	r = f.start(nil, true)
	ms := f.waitStored(60*time.Second, func(m msg) bool { return m.Seq > after && isSync("completed")(m) && m.Env.RelaydSource == "deploys" })
	for _, m := range markers(ms, "deploys", "started", after) {
		if sd := syncOf(t, m); sd.Reason != "expired" {
			t.Errorf("sync.started reason %q, want expired (the test must reach the relist after a 410)", sd.Reason)
		}
	}
	waitAll(d.ResourceVersion)

	// Other changedPaths: nothing earlier is comparable, said once.
	r.stop(t)
	f.cfgYAML = strings.Replace(f.cfgYAML, "changedPaths: [spec, status, metadata.labels]", "changedPaths: [spec, status, metadata.labels, metadata.annotations]", 1)
	f.start(nil, true)
	write("spec after new changedPaths", replicas(4), false)
	expect(d.ResourceVersion, "watch", changedWant{unknown: "spec,status,metadata.labels,metadata.annotations"}, changedWant{changed: "spec"})
	write("annotations after new changedPaths", func(d *appsv1.Deployment) { d.Annotations["note"] = "y" }, false)
	expect(d.ResourceVersion, "watch", changedWant{changed: "metadata.annotations"})
	waitAll(d.ResourceVersion)

	// Every event of web, on every source, is what was expected, and every
	// expected event is on the stream.
	got := map[string]map[string]changedWant{}
	var log []string
	for _, m := range f.stored() {
		if !strings.Contains(m.Env.Type, ".object.") || m.Env.K8sName != "web" {
			continue
		}
		src := m.Env.RelaydSource
		if got[src] == nil {
			got[src] = map[string]changedWant{}
		}
		g := changedWant{m.Env.RelaydChanged, m.Env.RelaydChangedUnknown, m.Env.RelaydOrigin}
		got[src][m.Env.K8sResourceVersion] = g
		log = append(log, fmt.Sprintf("%s %s@%s %+v", src, m.Env.Type[strings.LastIndexByte(m.Env.Type, '.')+1:], m.Env.K8sResourceVersion, g))
		if w, ok := want[src][m.Env.K8sResourceVersion]; !ok {
			t.Errorf("%s: event of web@%s, a version this test did not expect on the stream", src, m.Env.K8sResourceVersion)
		} else if g != w {
			t.Errorf("%s: web@%s carries relaydchanged %q, relaydchangedunknown %q, origin %s; want %q, %q, %s",
				src, m.Env.K8sResourceVersion, g.changed, g.unknown, g.origin, w.changed, w.unknown, w.origin)
		}
	}
	for src, ws := range want {
		for rv := range ws {
			if _, ok := got[src][rv]; !ok {
				t.Errorf("%s: no event of web@%s", src, rv)
			}
		}
	}
	sort.Strings(log)
	t.Logf("%s: %d events of web:\n%s", mode, len(log), strings.Join(log, "\n"))
}
