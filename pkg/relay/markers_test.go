package relay_test

import (
	"encoding/json"
	"testing"
	"time"
)

// markerResource is what a sync marker's data says about the watch, for a
// consumer's reconcile LIST (docs/CONSUMING.md, "The sync markers").
type markerResource struct {
	Namespace     string  `json:"namespace"`
	Reason        string  `json:"reason"`
	Group         *string `json:"group"`
	Version       string  `json:"version"`
	Resource      string  `json:"resource"`
	Kind          string  `json:"kind"`
	Namespaced    *bool   `json:"namespaced"`
	LabelSelector string  `json:"labelSelector"`
	FieldSelector string  `json:"fieldSelector"`
}

// The sync markers of a relist name the watched resource (group, version,
// resource, kind, scope) and the source's selectors, for a core kind with a
// label selector, a CRD of a dotted group, and a cluster-scoped core kind
// with a field selector: on the initial snapshot and on the relist after
// the object index was lost (reason index-lost, the one a consumer must
// reconcile by LIST).
func TestSyncMarkersNameTheResource(t *testing.T) {
	f := newFixture(t, env, natsSrv, `
  - name: cms
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]
    labelSelector: app=x
  - name: widgets
    apiVersion: example.com/v1
    kind: Widget
    namespaces: [$NS]
  - name: nss
    apiVersion: v1
    kind: Namespace
    fieldSelector: metadata.name=$NS`)
	installWidgetCRD(t, f)
	f.createCM("a", map[string]string{"app": "x"}, nil)
	sources := []string{"cms", "widgets", "nss"}
	completedOf := func(src string, after uint64) func(msg) bool {
		return func(m msg) bool { return m.Seq > after && m.Env.RelaydSource == src && isSync("completed")(m) }
	}
	waitAll := func(after uint64) []msg {
		var want []func(msg) bool
		for _, src := range sources {
			want = append(want, completedOf(src, after))
		}
		return f.waitStored(60*time.Second, want...)
	}
	str, yes, no := func(s string) *string { return &s }, true, false
	want := map[string]markerResource{
		"cms":     {Namespace: f.ns, Group: str(""), Version: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespaced: &yes, LabelSelector: "app=x"},
		"widgets": {Namespace: f.ns, Group: str("example.com"), Version: "v1", Resource: "widgets", Kind: "Widget", Namespaced: &yes},
		"nss":     {Group: str(""), Version: "v1", Resource: "namespaces", Kind: "Namespace", Namespaced: &no, FieldSelector: "metadata.name=" + f.ns},
	}
	check := func(ms []msg, after uint64, reason string) {
		t.Helper()
		for _, src := range sources {
			for _, phase := range []string{"started", "completed"} {
				got := markers(ms, src, phase, after)
				if len(got) == 0 {
					t.Fatalf("%s: no sync.%s after seq %d:\n%s", src, phase, after, dump(ms))
				}
				var d markerResource
				if err := json.Unmarshal(got[0].Env.Data, &d); err != nil {
					t.Fatal(err)
				}
				w := want[src]
				w.Reason = reason
				if d.Group == nil || d.Namespaced == nil || *d.Group != *w.Group || *d.Namespaced != *w.Namespaced ||
					d.Namespace != w.Namespace || d.Reason != w.Reason || d.Version != w.Version || d.Resource != w.Resource ||
					d.Kind != w.Kind || d.LabelSelector != w.LabelSelector || d.FieldSelector != w.FieldSelector {
					t.Errorf("%s sync.%s (reason %s) data %s, want %s", src, phase, reason, got[0].Env.Data, show(w))
				}
			}
		}
	}

	r := f.start(nil, true)
	check(waitAll(0), 0, "initial")
	r.stop(t)
	if err := f.js.DeleteKeyValue(t.Context(), "relayd-index-"+f.cluster); err != nil {
		t.Fatal(err)
	}
	all := f.stored()
	before := all[len(all)-1].Seq
	r = f.start(nil, true)
	check(waitAll(before), before, "index-lost")
	r.stop(t)
}

func show(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
