package relay_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/relayd/relayd/internal/testenv"
)

var widgetGVR = testenv.WidgetGVR

// installWidgetCRD installs widgets.example.com (shared by tests) and
// returns a dynamic client.
func installWidgetCRD(t *testing.T, f *fixture) dynamic.Interface {
	t.Helper()
	if err := f.env.InstallWidgetCRD(t.Context()); err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(f.env.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	return dyn
}

func widget(ns, name string, spec map[string]any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "example.com/v1", "kind": "Widget",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec":     spec,
	}}
}

func TestEveryEventTypeForBuiltinAndCRD(t *testing.T) { forEachVersion(t, everyEventType) }

func everyEventType(t *testing.T, e *testenv.Env) {
	f := newFixture(t, e, natsSrv, `
  - name: cms
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]
  - name: widgets
    apiVersion: example.com/v1
    kind: Widget
    namespaces: [$NS]`)
	dyn := installWidgetCRD(t, f)
	ctx := t.Context()

	// Exists before relayd starts: published with origin "initial".
	pre := f.createCM("pre", nil, map[string]string{"a": "1"})
	r := f.start(nil, true)

	cm := f.createCM("live", nil, map[string]string{"a": "1"})
	cm = f.updateCM(cm, "a", "2")
	f.deleteCM("live")

	w, err := dyn.Resource(widgetGVR).Namespace(f.ns).Create(ctx, widget(f.ns, "w1", map[string]any{"size": 1}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w.Object["spec"] = map[string]any{"size": 2}
	w2, err := dyn.Resource(widgetGVR).Namespace(f.ns).Update(ctx, w, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := dyn.Resource(widgetGVR).Namespace(f.ns).Delete(ctx, "w1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	got := f.waitStored(30*time.Second,
		isSync("started"), isSync("completed"),
		isEvent("added", "pre", pre.ResourceVersion),
		isEvent("added", "live", ""), isEvent("modified", "live", cm.ResourceVersion), isEvent("deleted", "live", ""),
		isEvent("added", "w1", w.GetResourceVersion()), isEvent("modified", "w1", w2.GetResourceVersion()), isEvent("deleted", "w1", ""),
	)

	for _, m := range got {
		e := m.Env
		if e.SpecVersion != "1.0" || !strings.HasPrefix(e.Source, "/relayd/"+f.cluster+"/") {
			t.Errorf("bad envelope: %+v", e)
		}
		if !strings.Contains(e.Type, ".object.") {
			continue
		}
		wantID := e.K8sUID + "/" + e.K8sResourceVersion
		if strings.HasSuffix(e.Type, ".deleted") {
			wantID += "/deleted"
		}
		if e.ID != wantID || m.MsgID != "k8s."+f.cluster+"/"+e.RelaydSource+"/"+wantID {
			t.Errorf("%s: id %q msgid %q, want %q", m.Subject, e.ID, m.MsgID, wantID)
		}
		wantOrigin := "watch"
		if e.K8sName == "pre" {
			wantOrigin = "initial"
		}
		if e.RelaydOrigin != wantOrigin {
			t.Errorf("%s: origin %q, want %q", m.Subject, e.RelaydOrigin, wantOrigin)
		}
		typ := e.Type[strings.LastIndex(e.Type, ".")+1:]
		switch e.K8sKind {
		case "ConfigMap":
			want := fmt.Sprintf("k8s.%s.core.v1.configmaps.%s.%s.%s", f.cluster, f.ns, e.K8sName, typ)
			if m.Subject != want || e.Subject != fmt.Sprintf("/api/v1/namespaces/%s/configmaps/%s", f.ns, e.K8sName) {
				t.Errorf("subject %q / %q, want %q", m.Subject, e.Subject, want)
			}
		case "Widget":
			want := fmt.Sprintf("k8s.%s.example%%2Ecom.v1.widgets.%s.%s.%s", f.cluster, f.ns, e.K8sName, typ)
			if m.Subject != want || e.Subject != fmt.Sprintf("/apis/example.com/v1/namespaces/%s/widgets/%s", f.ns, e.K8sName) {
				t.Errorf("subject %q / %q, want %q", m.Subject, e.Subject, want)
			}
		}
		// Full payload: the object without managedFields.
		var obj map[string]any
		if err := json.Unmarshal(e.Data, &obj); err != nil {
			t.Fatalf("data: %v", err)
		}
		md := obj["metadata"].(map[string]any)
		if _, has := md["managedFields"]; has {
			t.Errorf("%s: managedFields not stripped", m.Subject)
		}
		if md["resourceVersion"] != e.K8sResourceVersion {
			t.Errorf("%s: data rv %v != %s", m.Subject, md["resourceVersion"], e.K8sResourceVersion)
		}
	}
	// Per-object order on the stream: added < modified < deleted.
	for _, name := range []string{"live", "w1"} {
		var seq []string
		for _, m := range got {
			if m.Env.K8sName == name {
				seq = append(seq, m.Env.Type[strings.LastIndex(m.Env.Type, ".")+1:])
			}
		}
		if strings.Join(seq, ",") != "added,modified,deleted" {
			t.Errorf("%s: order %v", name, seq)
		}
	}
	if v := metricValue(t, r.reg, "relayd_events_total", map[string]string{"source": "cms", "type": "deleted", "origin": "watch"}); v != 1 {
		t.Errorf("relayd_events_total{cms,deleted,watch} = %v, want 1", v)
	}
	// Sync markers are not object events: no series with an empty type.
	if v := metricValue(t, r.reg, "relayd_events_total", map[string]string{"type": ""}); v != -1 {
		t.Errorf("relayd_events_total has a series with an empty type (value %v)", v)
	}

	// The checkpoint reaches the last acked position of each watch.
	f.eventually(10*time.Second, "checkpoint written", func() error {
		cps := f.checkpoints()
		if cps["cms."+f.ns].ResourceVersion == "" || cps["widgets."+f.ns].ResourceVersion == "" {
			return fmt.Errorf("checkpoints %v", cps)
		}
		return nil
	})
	// Both versions serve streaming lists by default (versionTraits): the
	// snapshot came from one, and no paginated LIST was needed.
	requireStreamingLists(t, e, "configmaps", f.ns, 1)
	requireStreamingLists(t, e, "widgets", f.ns, 1)
}
