package relay_test

// Bad input against the real servers: names at the length limits
// and with unusual characters, a CRD deleted while watched, a namespace
// deleted while watched, RBAC revoked mid-run. The rule: a clear error that
// names the problem and where it is, never a panic, a crash loop or a
// silent drop, and nothing acknowledged is ever lost.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/relayd/relayd/internal/indexcheck"
	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/pkg/event"
	"github.com/relayd/relayd/pkg/relay"
)

// startLogged is start with relayd's warnings and errors also recorded, so
// that a test can check what an operator reads in the log.
func (f *fixture) startLogged(rc *rest.Config, wantReady bool) (*running, *observer.ObservedLogs) {
	f.t.Helper()
	if rc == nil {
		rc = f.env.AdminConfig()
	}
	core, logs := observer.New(zapcore.WarnLevel)
	log := zap.New(zapcore.NewTee(zaptest.NewLogger(f.t, zaptest.Level(zap.WarnLevel)).Core(), core))
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan error, 1), reg: prometheus.NewRegistry()}
	addrs := make(chan string, 1)
	go func() {
		r.done <- relay.Run(ctx, relay.Options{
			Config: f.config(), RestConfig: rc, Logger: log, Registry: r.reg,
			MetricsAddr: "127.0.0.1:0", HealthAddr: "127.0.0.1:0",
			Ready:      func(_, h string) { addrs <- h },
			IndexCheck: indexcheck.NewHook,
		})
	}()
	select {
	case r.healthAddr = <-addrs:
	case err := <-r.done:
		f.t.Fatalf("relay.Run returned at start: %v", err)
	}
	f.t.Cleanup(func() { r.stop(f.t) })
	if wantReady {
		f.eventually(30*time.Second, "relayd ready", r.readyErr)
	}
	return r, logs
}

// logged returns the "error" fields of the log entries with message msg
// whose error contains sub.
func logged(logs *observer.ObservedLogs, msg, sub string) []string {
	var out []string
	for _, e := range logs.FilterMessage(msg).All() {
		if s, _ := e.ContextMap()["error"].(string); strings.Contains(s, sub) {
			out = append(out, s)
		}
	}
	return out
}

// restarts sums relayd_watch_restarts_total of a source over reasons.
func restarts(t *testing.T, reg *prometheus.Registry, source string, reasons ...string) float64 {
	t.Helper()
	var sum float64
	for _, r := range reasons {
		if v := metricValue(t, reg, "relayd_watch_restarts_total", map[string]string{"source": source, "reason": r}); v > 0 {
			sum += v
		}
	}
	return sum
}

// eventsByUID returns the stored object events of a source by uid.
func eventsByUID(ms []msg, source string) map[string][]msg {
	out := map[string][]msg{}
	for _, m := range ms {
		if m.Env.RelaydSource == source && strings.Contains(m.Env.Type, ".object.") {
			out[m.Env.K8sUID] = append(out[m.Env.K8sUID], m)
		}
	}
	return out
}

func evType(m msg) string { return m.Env.Type[strings.LastIndex(m.Env.Type, ".")+1:] }

// Names at and beyond the subject limit, with dots and with every kind of
// character a Kubernetes name may hold: each change arrives once per
// change, carries the real name in k8sname, and its subject decodes back to
// that name or (only when the encoded subject would exceed
// event.MaxSubjectLen) carries the name's hash token.
func TestNamesAtTheLimitsAreRelayedAndTheirSubjectsDecode(t *testing.T) {
	f := newFixture(t, env, natsSrv, `
  - name: cms
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS, LONGNS]
  - name: widgets
    apiVersion: example.com/v1
    kind: Widget
    namespaces: [$NS]
  - name: roles
    apiVersion: rbac.authorization.k8s.io/v1
    kind: Role
    namespaces: [$NS]`)
	ctx := t.Context()
	// A namespace name at its limit (a DNS label: 63 bytes).
	longNS := (f.ns + "-" + strings.Repeat("n", 63))[:63]
	f.cfgYAML = strings.ReplaceAll(f.cfgYAML, "LONGNS", longNS)
	if _, err := f.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: longNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dyn := installWidgetCRD(t, f)
	r := f.start(nil, true)

	// ConfigMap and custom resource names are DNS subdomains: at most 253
	// bytes, dots allowed anywhere between labels.
	plain := strings.Repeat("p", 253)
	fewDots := strings.Repeat("m", 123) + "." + strings.Repeat("m", 123) + ".x-y.z"
	allDots := strings.Repeat("d.", 126) + "d" // 126 dots: 505 bytes encoded
	for _, n := range []string{plain, fewDots, allDots} {
		if len(n) != 253 {
			t.Fatalf("test name of %d bytes", len(n))
		}
	}
	// Role names are only path segments: no '/', no '%', not "." or "..";
	// anything else goes, including spaces, wildcards, non-ASCII and the
	// subject placeholder "_".
	roleNames := []string{
		"system:controller:relayd test",
		"star*gt>dot.tab\tü日本",
		"_",
		"..a",
		strings.Repeat("é", 200), // 400 bytes, 1200 encoded
	}

	type obj struct {
		source, ns, name, uid string
		rvs                   []string // added, modified
	}
	var objs []*obj
	for _, ns := range []string{f.ns, longNS} {
		for _, name := range []string{plain, fewDots, allDots} {
			cm, err := f.cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
			if err != nil {
				t.Fatalf("create ConfigMap %q in %s: %v", name, ns, err)
			}
			o := &obj{source: "cms", ns: ns, name: name, uid: string(cm.UID), rvs: []string{cm.ResourceVersion}}
			cm.Data = map[string]string{"k": "v"}
			if cm, err = f.cs.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			o.rvs = append(o.rvs, cm.ResourceVersion)
			if err := f.cs.CoreV1().ConfigMaps(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			objs = append(objs, o)
		}
	}
	wname := strings.Repeat("w", 100) + "." + strings.Repeat("w", 100) + "." + strings.Repeat("w", 51)
	w, err := dyn.Resource(widgetGVR).Namespace(f.ns).Create(ctx, widget(f.ns, wname, map[string]any{"size": 1}), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create Widget with a %d-byte name: %v", len(wname), err)
	}
	o := &obj{source: "widgets", ns: f.ns, name: wname, uid: string(w.GetUID()), rvs: []string{w.GetResourceVersion()}}
	w.Object["spec"] = map[string]any{"size": 2}
	if w, err = dyn.Resource(widgetGVR).Namespace(f.ns).Update(ctx, w, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	o.rvs = append(o.rvs, w.GetResourceVersion())
	if err := dyn.Resource(widgetGVR).Namespace(f.ns).Delete(ctx, wname, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	objs = append(objs, o)
	for _, name := range roleNames {
		role, err := f.cs.RbacV1().Roles(f.ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create Role %q: %v", name, err)
		}
		o := &obj{source: "roles", ns: f.ns, name: name, uid: string(role.UID), rvs: []string{role.ResourceVersion}}
		role.Rules = []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}}}
		if role, err = f.cs.RbacV1().Roles(f.ns).Update(ctx, role, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		o.rvs = append(o.rvs, role.ResourceVersion)
		if err := f.cs.RbacV1().Roles(f.ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		objs = append(objs, o)
	}

	// Every change of every object, in order, exactly once.
	var got []msg
	f.eventually(30*time.Second, "every change of every object", func() error {
		got = f.stored()
		byUID := map[string]map[string][]msg{}
		for _, src := range []string{"cms", "widgets", "roles"} {
			byUID[src] = eventsByUID(got, src)
		}
		for _, o := range objs {
			evs := byUID[o.source][o.uid]
			var seq []string
			for _, m := range evs {
				seq = append(seq, evType(m)+"@"+m.Env.K8sResourceVersion)
			}
			want := []string{"added@" + o.rvs[0], "modified@" + o.rvs[1]}
			if len(seq) != 3 || !slices.Equal(seq[:2], want) || !strings.HasPrefix(seq[2], "deleted@") {
				return fmt.Errorf("%s %q in %s: events %v, want %v then deleted", o.source, o.name, o.ns, seq, want)
			}
		}
		return nil
	})

	hashed := 0
	for _, o := range objs {
		for _, m := range eventsByUID(got, o.source)[o.uid] {
			if m.Env.K8sName != o.name || m.Env.K8sNamespace != o.ns {
				t.Errorf("%s: k8sname %q k8snamespace %q, want %q in %q", m.Subject, m.Env.K8sName, m.Env.K8sNamespace, o.name, o.ns)
			}
			p, err := event.ParseSubject(m.Subject)
			if err != nil {
				t.Errorf("subject of %q does not parse: %v", o.name, err)
				continue
			}
			if p.Namespace != o.ns || p.Cluster != f.cluster || string(p.Type) != evType(m) {
				t.Errorf("subject %q parses to %+v", m.Subject, p)
			}
			// The subject the name would have without the fallback.
			full := len(m.Subject)
			if p.NameHash != "" {
				full += len(event.EncodeToken(o.name)) - len(p.NameHash)
			}
			switch {
			case full > event.MaxSubjectLen:
				if p.NameHash == "" || p.NameHash != event.HashToken(o.name) {
					t.Errorf("%q: subject %q (%d bytes unhashed) carries no hash token of the name", o.name, m.Subject, full)
				}
				hashed++
			case p.Name != o.name || p.NameHash != "":
				t.Errorf("%q: subject %q decodes to name %q (hash %q)", o.name, m.Subject, p.Name, p.NameHash)
			}
		}
	}
	// allDots in the long namespace and the long Role name take the fallback:
	// both paths of the subject are covered.
	if hashed == 0 || hashed == 3*len(objs) {
		t.Errorf("%d of %d events hashed, want both hashed and decodable subjects", hashed, 3*len(objs))
	}
	if v := restarts(t, r.reg, "cms", "error", "panic", "forbidden", "not-found", "resolve"); v != 0 {
		t.Errorf("the cms source restarted %v times on unusual names", v)
	}
}

// installCRD installs a namespaced CRD <plural>.<group> (kind kind, version
// v1, any spec) and waits until it is served and in discovery.
func installCRD(t *testing.T, f *fixture, dyn dynamic.Interface, group, kind, plural string) schema.GroupVersionResource {
	t.Helper()
	crdGVR := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	crd := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
		"metadata": map[string]any{"name": plural + "." + group},
		"spec": map[string]any{
			"group": group, "scope": "Namespaced",
			"names": map[string]any{"plural": plural, "kind": kind},
			"versions": []any{map[string]any{
				"name": "v1", "served": true, "storage": true,
				"schema": map[string]any{"openAPIV3Schema": map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
			}},
		},
	}}
	if _, err := dyn.Resource(crdGVR).Create(t.Context(), crd, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	gvr := schema.GroupVersionResource{Group: group, Version: "v1", Resource: plural}
	f.eventually(30*time.Second, "CRD "+plural+"."+group+" served", func() error {
		if _, err := dyn.Resource(gvr).List(t.Context(), metav1.ListOptions{Limit: 1}); err != nil {
			return err
		}
		rl, err := f.cs.Discovery().ServerResourcesForGroupVersion(group + "/v1")
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(rl.APIResources, func(r metav1.APIResource) bool { return r.Kind == kind }) {
			return fmt.Errorf("discovery does not list %s yet", kind)
		}
		return nil
	})
	return gvr
}

func deleteCRD(t *testing.T, f *fixture, dyn dynamic.Interface, name string) {
	t.Helper()
	crdGVR := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	if err := dyn.Resource(crdGVR).Delete(t.Context(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.eventually(30*time.Second, "CRD "+name+" gone", func() error {
		_, err := dyn.Resource(crdGVR).Get(t.Context(), name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (%v)", err)
	})
}

// Deleting a CRD deletes its custom resources first (the apiserver's CRD
// finalizer), and those deletes are watch events like any other: relayd
// relays them. Then the kind is gone: the watch ends, re-resolving fails
// with an error naming the source and the missing apiVersion, the source is
// down and retried with backoff (no hot loop), other sources keep relaying,
// and re-creating the CRD lets the source resume by itself.
func TestCRDDeletedWhileWatched(t *testing.T) {
	f := newFixture(t, env, natsSrv, `
  - name: gadgets
    apiVersion: GROUP/v1
    kind: Gadget
    namespaces: [$NS]
  - name: cms
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]`)
	ctx := t.Context()
	group := f.cluster + ".badinput.example.com" // unique per fixture: CRDs are cluster-wide
	f.cfgYAML = strings.ReplaceAll(f.cfgYAML, "GROUP", group)
	dyn, err := dynamic.NewForConfig(f.env.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	gvr := installCRD(t, f, dyn, group, "Gadget", "gadgets")
	gadget := func(name string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": group + "/v1", "kind": "Gadget",
			"metadata": map[string]any{"name": name, "namespace": f.ns}, "spec": map[string]any{"n": name},
		}}
	}
	r, logs := f.startLogged(nil, true)
	var uids []string
	for _, name := range []string{"g1", "g2"} {
		g, err := dyn.Resource(gvr).Namespace(f.ns).Create(ctx, gadget(name), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		uids = append(uids, string(g.GetUID()))
	}
	f.waitStored(20*time.Second, isEvent("added", "g1", ""), isEvent("added", "g2", ""))

	deleteCRD(t, f, dyn, "gadgets."+group)
	// The custom resources' deletes are relayed.
	got := f.waitStored(20*time.Second, isEvent("deleted", "g1", ""), isEvent("deleted", "g2", ""))
	for i, uid := range uids {
		if evs := eventsByUID(got, "gadgets")[uid]; len(evs) != 2 || evType(evs[1]) != "deleted" || evs[1].Env.RelaydOrigin != "watch" {
			t.Errorf("g%d: %d events %s, want added then deleted (origin watch)", i+1, len(evs), dump(evs))
		}
	}

	// Then the source is down and says why, naming itself and the kind.
	f.eventually(20*time.Second, "gadgets reported down", func() error {
		if v := metricValue(t, r.reg, "relayd_source_up", map[string]string{"source": "gadgets"}); v != 0 {
			return fmt.Errorf("relayd_source_up{gadgets} = %v", v)
		}
		if v := restarts(t, r.reg, "gadgets", "not-found", "resolve"); v < 1 {
			return fmt.Errorf("relayd_watch_restarts_total{gadgets,not-found|resolve} = %v", v)
		}
		if l := logged(logs, "source stopped; restarting", `source "gadgets": apiVersion `+group+`/v1 is not served by the apiserver`); len(l) == 0 {
			return fmt.Errorf("no error log naming the source and the missing apiVersion")
		}
		return nil
	})
	// Retried with backoff (watch.relistBackoff: 100ms doubling to 2s), not
	// in a loop: over 3s, at most a few attempts.
	before := restarts(t, r.reg, "gadgets", "not-found", "resolve", "error")
	time.Sleep(3 * time.Second)
	if n := restarts(t, r.reg, "gadgets", "not-found", "resolve", "error") - before; n > 5 {
		t.Errorf("%v restarts of gadgets in 3s with a 2s backoff cap: a hot loop", n)
	}
	if err := r.healthErr(); err != nil {
		t.Errorf("healthz with a deleted CRD: %v", err)
	}
	// The other source keeps relaying.
	cm := f.createCM("still-relayed", nil, nil)
	f.waitStored(20*time.Second, isEvent("added", "still-relayed", cm.ResourceVersion))

	// The CRD comes back: the source resumes without a restart of relayd.
	installCRD(t, f, dyn, group, "Gadget", "gadgets")
	g3, err := dyn.Resource(gvr).Namespace(f.ns).Create(ctx, gadget("g3"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got = f.waitStored(30*time.Second, isEvent("added", "g3", g3.GetResourceVersion()))
	f.eventually(20*time.Second, "gadgets up again", func() error {
		if v := metricValue(t, r.reg, "relayd_source_up", map[string]string{"source": "gadgets"}); v != 1 {
			return fmt.Errorf("relayd_source_up{gadgets} = %v", v)
		}
		return nil
	})
	// What happens on the way back: the re-created kind's watch cache starts
	// at the present, so the source's position (the last delete) is 410
	// Expired and it relists, bracketed by sync markers. The relist is
	// compared with the object index: g1 and g2 were already published as
	// deleted, so nothing is published twice.
	if v := metricValue(t, r.reg, "relayd_relists_total", map[string]string{"source": "gadgets", "reason": "expired"}); v != 1 {
		t.Errorf("relayd_relists_total{gadgets,expired} = %v, want 1 (the old position is gone with the old kind)", v)
	}
	var gadgets []string
	markers := 0
	for _, m := range got {
		switch {
		case m.Env.RelaydSource != "gadgets":
		case strings.Contains(m.Env.Type, ".object."):
			gadgets = append(gadgets, evType(m)+" "+m.Env.K8sName)
		case strings.HasSuffix(m.Env.Type, ".sync.completed"):
			markers++
		}
	}
	if want := []string{"added g1", "added g2", "deleted g1", "deleted g2", "added g3"}; !slices.Equal(gadgets, want) {
		t.Errorf("gadget events %v, want %v\n%s", gadgets, want, dump(got))
	}
	if markers != 2 { // the initial snapshot and the relist after the CRD came back
		t.Errorf("%d sync.completed markers for gadgets, want 2\n%s", markers, dump(got))
	}
}

// A watched namespace is deleted, then re-created. The test apiserver runs
// no namespace controller, so the test does its job: delete the namespace's
// objects, then remove the namespace's finalizer. The deletes are relayed;
// a watch of a namespace that does not exist is legal (it is empty) and
// stays established, so the source is not restarted and objects of the
// re-created namespace are relayed.
func TestNamespaceDeletedWhileWatched(t *testing.T) {
	f := newFixture(t, env, natsSrv, `
  - name: gone
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS-x]`)
	ctx := t.Context()
	x := f.ns + "-x"
	mkNS := func() {
		t.Helper()
		if _, err := f.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: x}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	mk := func(name string) *corev1.ConfigMap {
		t.Helper()
		cm, err := f.cs.CoreV1().ConfigMaps(x).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return cm
	}
	mkNS()
	r := f.start(nil, true)
	a, b := mk("a"), mk("b")
	f.waitStored(20*time.Second, isEvent("added", "a", a.ResourceVersion), isEvent("added", "b", b.ResourceVersion))

	if err := f.cs.CoreV1().Namespaces().Delete(ctx, x, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// The namespace controller's work: delete the content, then finalize.
	if err := f.cs.CoreV1().ConfigMaps(x).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	ns, err := f.cs.CoreV1().Namespaces().Get(ctx, x, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns.Spec.Finalizers = nil
	if _, err := f.cs.CoreV1().Namespaces().Finalize(ctx, ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.eventually(20*time.Second, "namespace gone", func() error {
		if _, err := f.cs.CoreV1().Namespaces().Get(ctx, x, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("namespace %s: %v", x, err)
		}
		return nil
	})
	f.waitStored(20*time.Second, isEvent("deleted", "a", ""), isEvent("deleted", "b", ""))
	time.Sleep(time.Second)
	if v := metricValue(t, r.reg, "relayd_source_up", map[string]string{"source": "gone"}); v != 1 {
		t.Errorf("relayd_source_up{gone} = %v while its namespace does not exist, want 1 (an empty watch)", v)
	}
	if v := restarts(t, r.reg, "gone", "not-found", "forbidden", "error", "resolve", "panic"); v != 0 {
		t.Errorf("the source restarted %v times after its namespace was deleted", v)
	}

	mkNS()
	c := mk("c")
	got := f.waitStored(20*time.Second, isEvent("added", "c", c.ResourceVersion))
	var seq []string
	for _, m := range got {
		if strings.Contains(m.Env.Type, ".object.") {
			seq = append(seq, evType(m)+" "+m.Env.K8sName+" "+m.Env.RelaydOrigin)
		}
	}
	// Each change once, all from the one watch.
	want := []string{"added a watch", "added b watch", "deleted a watch", "deleted b watch", "added c watch"}
	if !slices.Equal(seq, want) {
		t.Errorf("events %v, want %v", seq, want)
	}
}

// RBAC is revoked while relayd runs (the RoleBinding giving list/watch on
// the ConfigMaps and get/update on the checkpoint is deleted), then
// restored. An established watch is not cut by the apiserver: it runs to its
// timeout, and the next request is refused. Then the source is down with an
// error naming the source, the verb and the resource, retried with backoff;
// the checkpoint never moves back; once the binding is back, the source
// resumes from its position and every change made meanwhile is delivered.
func TestRBACRevokedMidRun(t *testing.T) {
	alongside(t)
	f := newFixture(t, env, natsSrv, `
  - name: cms
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]`)
	// The shortest watch.timeout the config allows, so that the watch opened
	// before the revocation ends soon after it.
	f.cfgYAML = strings.Replace(f.cfgYAML, "  timeout: 60s\n", "  timeout: 30s\n", 1)
	ctx := t.Context()
	if _, err := f.cs.CoreV1().ConfigMaps(f.ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cp"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.cs.RbacV1().Roles(f.ns).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "relayd"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"list", "watch"}},
			{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{"cp"}, Verbs: []string{"get", "update"}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "relayd"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "relayd"},
		Subjects:   []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: testenv.RestrictedUser}},
	}
	bind := func() {
		t.Helper()
		if _, err := f.cs.RbacV1().RoleBindings(f.ns).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	bind()
	ref := f.reference("")
	r, logs := f.startLogged(f.env.RestrictedConfig(), true)
	a := f.createCM("a", nil, nil)
	f.waitStored(20*time.Second, isEvent("added", "a", a.ResourceVersion))
	key := "cms." + f.ns
	f.checkpointWithin(key, a.ResourceVersion, "")
	before := f.checkpoints()[key].ResourceVersion

	if err := f.cs.RbacV1().RoleBindings(f.ns).Delete(ctx, "relayd", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	revokedAt := time.Now()
	// Once the apiserver's authorizer has seen it, the identity is refused.
	restricted, err := kubernetes.NewForConfig(f.env.RestrictedConfig())
	if err != nil {
		t.Fatal(err)
	}
	f.eventually(10*time.Second, "revocation in effect", func() error {
		if _, err := restricted.CoreV1().ConfigMaps(f.ns).Get(ctx, "cp", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
			return fmt.Errorf("get cp as %s: %v", testenv.RestrictedUser, err)
		}
		return nil
	})
	// The open watch still delivers until it times out.
	b := f.createCM("b", nil, nil)
	f.waitStored(20*time.Second, isEvent("added", "b", b.ResourceVersion))

	const refused = `source "cms": list/watch configmaps (v1) in namespace `
	f.eventually(45*time.Second, "the refused watch reported", func() error {
		if v := restarts(t, r.reg, "cms", "forbidden"); v < 1 {
			return fmt.Errorf("relayd_watch_restarts_total{cms,forbidden} = %v", v)
		}
		return nil
	})
	t.Logf("watch refused %v after the revocation", time.Since(revokedAt).Round(time.Second))
	errs := logged(logs, "source stopped; restarting", refused+f.ns+`: configmaps is forbidden: User "`+testenv.RestrictedUser+`" cannot watch resource "configmaps"`)
	if len(errs) == 0 {
		t.Errorf("no error log naming the source, the verb and the resource; source logs: %v", logged(logs, "source stopped; restarting", ""))
	}
	if v := metricValue(t, r.reg, "relayd_source_up", map[string]string{"source": "cms"}); v != 0 {
		t.Errorf("relayd_source_up{cms} = %v while forbidden, want 0", v)
	}
	// /readyz is about start-up (docs/OPERATIONS.md, "Operations": ready once every source's first watch is
	// established); a source refused later is reported by relayd_source_up,
	// relayd_watch_restarts_total and the log above, and relayd stays ready.
	if err := r.readyErr(); err != nil {
		t.Errorf("readyz while forbidden after a successful start: %v, want ready", err)
	}
	if err := r.healthErr(); err != nil {
		t.Errorf("healthz while forbidden: %v (a crash loop in the making)", err)
	}

	// Changes while relayd cannot read them.
	c := f.createCM("c", nil, nil)
	a = f.updateCM(a, "k", "v")
	f.deleteCM("b")
	n0 := restarts(t, r.reg, "cms", "forbidden")
	time.Sleep(3 * time.Second)
	if n := restarts(t, r.reg, "cms", "forbidden") - n0; n > 5 {
		t.Errorf("%v forbidden restarts in 3s with a 2s backoff cap: a hot loop", n)
	}
	if got := f.checkpoints()[key].ResourceVersion; rvNum(t, got) < rvNum(t, before) || rvNum(t, got) >= rvNum(t, c.ResourceVersion) {
		t.Errorf("checkpoint %s while forbidden, want at least %s and before the unread %s", got, before, c.ResourceVersion)
	}
	for _, m := range f.stored() {
		if m.Env.K8sName == "c" {
			t.Fatalf("c published while relayd was forbidden to read it?")
		}
	}

	// The checkpoint ConfigMap is forbidden too: writes fail, are counted and
	// logged naming the ConfigMap and the verb, and are retried.
	if v := metricValue(t, r.reg, "relayd_checkpoint_errors_total", nil); v < 1 {
		t.Errorf("relayd_checkpoint_errors_total = %v while get/update on it is forbidden", v)
	}
	if l := logged(logs, "checkpoint write failed; retrying on the next tick", `relayd may not "get" ConfigMap `+f.ns+`/cp: configmaps "cp" is forbidden`); len(l) == 0 {
		t.Errorf("no checkpoint error naming the ConfigMap and the verb")
	}

	bind()
	f.waitEveryChange(ref, 30*time.Second)
	f.eventually(20*time.Second, "source up again", func() error {
		if v := metricValue(t, r.reg, "relayd_source_up", map[string]string{"source": "cms"}); v != 1 {
			return fmt.Errorf("relayd_source_up{cms} = %v", v)
		}
		return nil
	})
	f.checkpointWithin(key, a.ResourceVersion, "")
	// Resumed from its position: the changes made meanwhile came from the
	// watch, not from a relist.
	for c, n := range storedChanges(f.stored(), false) {
		if n != 1 {
			t.Errorf("%+v stored %d times", c, n)
		}
	}
	if v := metricValue(t, r.reg, "relayd_relists_total", map[string]string{"source": "cms", "reason": "expired"}); v > 0 {
		t.Errorf("relisted (%v) instead of resuming from the checkpoint", v)
	}
}
