package relay_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// author is what an event must say about who made a change, computed here
// from the managedFields the apiserver returned for the write and for the
// write before it (docs/CONSUMING.md, "Who changed it"): the entries that
// are new or differ from the previous version's in anything but their
// fields, or, for the first version relayd sees, the entries of the newest
// second; item for item.
type author struct{ manager, operation, subresource string }

func authorOf(prev, cur []metav1.ManagedFieldsEntry, first bool) author {
	var named []metav1.ManagedFieldsEntry
	if first {
		var newest time.Time
		for _, e := range cur {
			switch {
			case e.Time == nil:
			case e.Time.After(newest):
				newest, named = e.Time.Time, []metav1.ManagedFieldsEntry{e}
			case e.Time.Time.Equal(newest):
				named = append(named, e)
			}
		}
	} else {
		header := func(e metav1.ManagedFieldsEntry) metav1.ManagedFieldsEntry { e.FieldsV1 = nil; return e }
		for _, e := range cur {
			if !slices.ContainsFunc(prev, func(p metav1.ManagedFieldsEntry) bool { return equality.Semantic.DeepEqual(header(p), header(e)) }) {
				named = append(named, e)
			}
		}
	}
	var a author
	var m, o, s []string
	sub := false
	for _, e := range named {
		m, o, s = append(m, e.Manager), append(o, string(e.Operation)), append(s, e.Subresource)
		sub = sub || e.Subresource != ""
	}
	a.manager, a.operation = strings.Join(m, ","), strings.Join(o, ",")
	if sub {
		a.subresource = strings.Join(s, ",")
	}
	return a
}

func (m msg) author() author {
	return author{m.Env.K8sManager, m.Env.K8sOperation, m.Env.K8sSubresource}
}

// Every object event says who made the change, from the managedFields the
// apiserver recorded, in both content modes and every payload: a
// server-side apply, an update by another manager right after it (the same
// second, most often: both named), a status update, a scale update, an
// object whose managedFields were removed, and a delete (named by nobody:
// managedFields record writes, not deletes).
func TestEventsSayWhoChangedTheObject(t *testing.T) {
	for _, mode := range []string{"structured", "binary"} {
		t.Run(mode, func(t *testing.T) {
			f := newFixture(t, env, natsSrv, `
  - name: deploys
    apiVersion: apps/v1
    kind: Deployment
    namespaces: [$NS]
  - name: deploys-meta
    apiVersion: apps/v1
    kind: Deployment
    namespaces: [$NS]
    payload: metadata
  - name: cms-ref
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]
    payload: reference`+"\ncloudevents:\n  mode: "+mode)
			r := f.start(nil, true)
			ctx := t.Context()
			deploys := f.cs.AppsV1().Deployments(f.ns)
			want := map[string]author{} // "name@rv" -> author
			last := map[string][]metav1.ManagedFieldsEntry{}
			note := func(name, rv string, mf []metav1.ManagedFieldsEntry) {
				prev, seen := last[name]
				want[name+"@"+rv], last[name] = authorOf(prev, mf, !seen), mf
			}

			// 1. Server-side apply by "alice".
			apply := fmt.Sprintf(`{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"web","namespace":%q},
"spec":{"replicas":1,"selector":{"matchLabels":{"app":"web"}},"template":{"metadata":{"labels":{"app":"web"}},"spec":{"containers":[{"name":"app","image":"example/app:1"}]}}}}`, f.ns)
			force := true
			d, err := deploys.Patch(ctx, "web", types.ApplyPatchType, []byte(apply), metav1.PatchOptions{FieldManager: "alice", Force: &force})
			if err != nil {
				t.Fatal(err)
			}
			note("web", d.ResourceVersion, d.ManagedFields)
			if a := want["web@"+d.ResourceVersion]; a != (author{"alice", "Apply", ""}) {
				t.Fatalf("the apiserver recorded %+v for alice's apply", a)
			}
			// 2. An update by "bob" right after.
			d.Labels = map[string]string{"team": "b"}
			if d, err = deploys.Update(ctx, d, metav1.UpdateOptions{FieldManager: "bob"}); err != nil {
				t.Fatal(err)
			}
			note("web", d.ResourceVersion, d.ManagedFields)
			// 3. A status update by "carol".
			d.Status.ObservedGeneration = d.Generation
			d.Status.Replicas = 1
			if d, err = deploys.UpdateStatus(ctx, d, metav1.UpdateOptions{FieldManager: "carol"}); err != nil {
				t.Fatal(err)
			}
			note("web", d.ResourceVersion, d.ManagedFields)
			if a := want["web@"+d.ResourceVersion]; a != (author{"carol", "Update", "status"}) {
				t.Fatalf("the apiserver recorded %+v for carol's status update", a)
			}
			// relayd restarts: what it compares the next version with comes
			// from the index bucket (without it, the scale update, whose
			// entry has no time, would name the newest second's managers).
			for _, src := range []string{"deploys", "deploys-meta"} {
				f.waitStored(30*time.Second, func(m msg) bool { return m.Env.RelaydSource == src && m.Env.K8sResourceVersion == d.ResourceVersion })
			}
			r.stop(t)
			// 4. A scale update by "dave" (the scale subresource).
			sc := &autoscalingv1.Scale{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: f.ns, ResourceVersion: d.ResourceVersion}, Spec: autoscalingv1.ScaleSpec{Replicas: 3}}
			if _, err = deploys.UpdateScale(ctx, "web", sc, metav1.UpdateOptions{FieldManager: "dave"}); err != nil {
				t.Fatal(err)
			}
			if d, err = deploys.Get(ctx, "web", metav1.GetOptions{}); err != nil {
				t.Fatal(err)
			}
			note("web", d.ResourceVersion, d.ManagedFields)
			if a := want["web@"+d.ResourceVersion]; a != (author{"dave", "Update", "scale"}) {
				b, _ := json.Marshal(d.ManagedFields)
				t.Fatalf("the apiserver recorded %+v for dave's scale update: %s", a, b)
			}
			f.start(nil, true)
			// 5. managedFields removed (a list of one empty entry resets them).
			if d, err = deploys.Patch(ctx, "web", types.MergePatchType, []byte(`{"metadata":{"managedFields":[{}]}}`), metav1.PatchOptions{FieldManager: "erin"}); err != nil {
				t.Fatal(err)
			}
			if len(d.ManagedFields) != 0 {
				t.Fatalf("managedFields not reset: %+v", d.ManagedFields)
			}
			note("web", d.ResourceVersion, d.ManagedFields)
			// 6. A ConfigMap created without managedFields (a list of one empty
			// entry), then updated (the apiserver tracks no manager for it then).
			cm, err := f.cs.CoreV1().ConfigMaps(f.ns).Create(ctx, &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Name: "plain", ManagedFields: []metav1.ManagedFieldsEntry{{}}}}, metav1.CreateOptions{FieldManager: "frank"})
			if err != nil {
				t.Fatal(err)
			}
			if len(cm.ManagedFields) != 0 {
				t.Fatalf("created with managedFields %+v", cm.ManagedFields)
			}
			note("plain", cm.ResourceVersion, cm.ManagedFields)
			cm.Data = map[string]string{"k": "v"}
			if cm, err = f.cs.CoreV1().ConfigMaps(f.ns).Update(ctx, cm, metav1.UpdateOptions{FieldManager: "grace"}); err != nil {
				t.Fatal(err)
			}
			note("plain", cm.ResourceVersion, cm.ManagedFields)

			// 7. Deletes name nobody.
			if err := deploys.Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			if err := f.cs.CoreV1().ConfigMaps(f.ns).Delete(ctx, "plain", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			deleted := func(source, name string) func(msg) bool {
				return func(m msg) bool {
					return m.Env.RelaydSource == source && m.Env.K8sName == name && strings.HasSuffix(m.Env.Type, ".deleted")
				}
			}
			ms := f.waitStored(30*time.Second, deleted("deploys", "web"), deleted("deploys-meta", "web"), deleted("cms-ref", "plain"))

			seen := map[string]int{}
			for _, m := range ms {
				if !strings.Contains(m.Env.Type, ".object.") || m.Env.K8sNamespace != f.ns {
					continue
				}
				if raw, _ := json.Marshal(m.Env.Data); strings.Contains(string(raw), "managedFields") {
					t.Errorf("%s: the payload still carries managedFields", m.Env.RelaydSource)
				}
				key := m.Env.K8sName + "@" + m.Env.K8sResourceVersion
				if strings.HasSuffix(m.Env.Type, ".deleted") {
					if m.author() != (author{}) {
						t.Errorf("%s: delete of %s names %+v, want nobody", m.Env.RelaydSource, key, m.author())
					}
					continue
				}
				w, ok := want[key]
				if !ok {
					t.Errorf("%s: event for %s, a version this test did not write", m.Env.RelaydSource, key)
					continue
				}
				if m.author() != w {
					t.Errorf("%s: %s names %+v, want %+v", m.Env.RelaydSource, key, m.author(), w)
				}
				seen[m.Env.RelaydSource]++
			}
			// Every version written reached each source's stream.
			if seen["deploys"] != 5 || seen["deploys-meta"] != 5 || seen["cms-ref"] != 2 {
				t.Errorf("checked events per source %v, want deploys 5, deploys-meta 5, cms-ref 2", seen)
			}
			t.Logf("%s: %d versions written, authors: %+v", mode, len(want), want)
		})
	}
}
