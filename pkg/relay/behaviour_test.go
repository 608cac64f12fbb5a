package relay_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/relayd/relayd/internal/testenv"
)

func TestNATSOutageHoldsCheckpointAndLosesNothing(t *testing.T) {
	n := testenv.NATST(t, testenv.NATSOptions{})
	f := newFixture(t, env, n, `
  - name: cms
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]`)
	r := f.start(nil, true)
	x := f.createCM("x", nil, nil)
	f.waitStored(20*time.Second, isEvent("added", "x", x.ResourceVersion))
	key := "cms." + f.ns
	f.checkpointWithin(key, x.ResourceVersion, "")

	n.Stop()
	y := f.createCM("y", nil, nil)
	firstUnacked := y.ResourceVersion
	y = f.updateCM(y, "k", "v")
	z := f.createCM("z", nil, nil)
	// Several flush intervals pass: the checkpoint must not reach y, and
	// readiness reports the outage.
	f.checkpointHolds(key, firstUnacked)
	if err := r.readyErr(); err == nil || !strings.Contains(err.Error(), "NATS") {
		t.Errorf("readyz during the outage: %v, want not ready naming NATS", err)
	}
	if err := r.healthErr(); err != nil {
		t.Errorf("healthz during the outage: %v, want 200 (liveness never depends on NATS)", err)
	}

	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	f.waitStored(60*time.Second, isEvent("added", "y", ""), isEvent("modified", "y", y.ResourceVersion), isEvent("added", "z", z.ResourceVersion))
	f.checkpointWithin(key, z.ResourceVersion, "")
	if v := metricValue(t, r.reg, "relayd_publish_errors_total", map[string]string{"source": "cms"}); v <= 0 {
		t.Logf("note: no publish error counted (the outage was absorbed by the reconnect buffer)")
	}
}

func TestSelectorsNamespacesAndEventTypeFilter(t *testing.T) {
	f := newFixture(t, env, natsSrv, `
  - name: web
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS, $NS-b]
    labelSelector: app=web
    fieldSelector: metadata.name!=skipme
    eventTypes: [added, deleted]`)
	for _, ns := range []string{f.ns + "-b", f.ns + "-c"} {
		if _, err := f.cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	r := f.start(nil, true)
	web := map[string]string{"app": "web"}
	mk := func(ns, name string, labels map[string]string) *corev1.ConfigMap {
		cm, err := f.cs.CoreV1().ConfigMaps(ns).Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return cm
	}
	in1 := mk(f.ns, "in-a", web)
	mk(f.ns+"-b", "in-b", web)
	mk(f.ns, "unlabelled", nil)
	mk(f.ns, "skipme", web)
	mk(f.ns+"-c", "other-ns", web)
	f.updateCM(in1, "k", "v") // modified: filtered out
	f.deleteCM("in-a")
	// The barriers: in-a's delete was written after every excluded write
	// of its namespace (unlabelled, skipme, in-a's modification), and a
	// watch publishes in resourceVersion order, so once it is stored
	// anything wrongly published of them is too; in-b's added is the last
	// write of its namespace. The namespace -c is not configured: no
	// watch of it at all (checked below by its checkpoint key).
	f.waitStored(20*time.Second, isEvent("added", "in-a", ""), isEvent("added", "in-b", ""), isEvent("deleted", "in-a", ""))
	got := f.stored()
	for _, m := range got {
		if strings.Contains(m.Env.Type, ".object.") {
			if n := m.Env.K8sName; n != "in-a" && n != "in-b" {
				t.Errorf("published %s %s/%s, which the selectors exclude", m.Env.Type, m.Env.K8sNamespace, n)
			}
			if strings.HasSuffix(m.Env.Type, ".modified") {
				t.Errorf("published a modified event despite eventTypes [added, deleted]")
			}
		}
	}
	if v := metricValue(t, r.reg, "relayd_events_filtered_total", map[string]string{"source": "web"}); v < 1 {
		t.Errorf("relayd_events_filtered_total = %v, want >= 1", v)
	}
	// One checkpoint per namespace, and the filtered event still advanced it.
	f.eventually(10*time.Second, "checkpoints per namespace", func() error {
		cps := f.checkpoints()
		if cps["web."+f.ns].ResourceVersion == "" || cps["web."+f.ns+"-b"].ResourceVersion == "" {
			return fmt.Errorf("checkpoints %v", cps)
		}
		return nil
	})
	if cps := f.checkpoints(); cps["web."+f.ns+"-c"].ResourceVersion != "" {
		t.Errorf("checkpoints %v: a watch of %s-c, which is not configured", cps, f.ns)
	}
}

func TestPayloadModesAndOversize(t *testing.T) {
	n := testenv.NATST(t, testenv.NATSOptions{MaxPayload: 8 << 10})
	f := newFixture(t, env, n, `
  - name: full
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]
  - name: meta
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]
    payload: metadata
  - name: ref
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]
    payload: reference`)
	r := f.start(nil, true)
	small := f.createCM("small", map[string]string{"l": "1"}, map[string]string{"k": "v"})
	big := f.createCM("big", nil, map[string]string{"k": strings.Repeat("x", 20<<10)})
	var want []func(msg) bool
	for _, src := range []string{"full", "meta", "ref"} {
		for _, name := range []string{"small", "big"} {
			want = append(want, func(m msg) bool { return isEvent("added", name, "")(m) && m.Env.RelaydSource == src })
		}
	}
	got := f.waitStored(20*time.Second, want...)
	seen := 0
	for _, m := range got {
		if !strings.Contains(m.Env.Type, ".object.") {
			continue
		}
		var d map[string]any
		if err := json.Unmarshal(m.Env.Data, &d); err != nil {
			t.Fatal(err)
		}
		src, name := m.Env.RelaydSource, m.Env.K8sName
		if name == "big" && src == "full" {
			if !m.Env.RelaydOversize || m.Env.RelaydPayload != "reference" || d["uid"] != string(big.UID) {
				t.Errorf("%s/big: oversize=%v payload=%s data=%v, want a reference flagged oversize", src, m.Env.RelaydOversize, m.Env.RelaydPayload, d)
			}
			seen++
			continue
		}
		if name == "big" {
			if m.Env.RelaydOversize {
				t.Errorf("%s/big flagged oversize although its %s payload fits", src, m.Env.RelaydPayload)
			}
			seen++
			continue
		}
		switch src {
		case "full":
			if d["data"] == nil || d["metadata"].(map[string]any)["managedFields"] != nil {
				t.Errorf("full payload: %v", d)
			}
		case "meta":
			md, _ := d["metadata"].(map[string]any)
			if d["data"] != nil || md == nil || md["labels"] == nil || md["managedFields"] != nil || d["kind"] != "ConfigMap" {
				t.Errorf("metadata payload: %v", d)
			}
		case "ref":
			if d["data"] != nil || d["metadata"] != nil || d["name"] != "small" || d["uid"] != string(small.UID) ||
				d["resourceVersion"] != small.ResourceVersion || d["namespace"] != f.ns || d["kind"] != "ConfigMap" {
				t.Errorf("reference payload: %v", d)
			}
		}
		seen++
	}
	if seen != 6 {
		t.Errorf("saw %d object events, want 6 (2 objects x 3 sources):\n%s", seen, dump(got))
	}
	if v := metricValue(t, r.reg, "relayd_events_oversize_total", map[string]string{"source": "full"}); v != 1 {
		t.Errorf("relayd_events_oversize_total{full} = %v, want 1", v)
	}
}

func TestForbiddenSourceIsReportedAndOthersKeepRunning(t *testing.T) {
	forEachVersion(t, forbiddenSourceIsReported)
}

func forbiddenSourceIsReported(t *testing.T, e *testenv.Env) {
	f := newFixture(t, e, natsSrv, `
  - name: cms
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]
  - name: secrets
    apiVersion: v1
    kind: Secret
    namespaces: [$NS]
    payload: metadata`)
	ctx := t.Context()
	// Production RBAC: list/watch configmaps, get/update the pre-created checkpoint.
	if _, err := f.cs.CoreV1().ConfigMaps(f.ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cp"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err := f.cs.RbacV1().Roles(f.ns).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "relayd"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"list", "watch"}},
			{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{"cp"}, Verbs: []string{"get", "update"}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.cs.RbacV1().RoleBindings(f.ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "relayd"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "relayd"},
		Subjects:   []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: testenv.RestrictedUser}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r := f.start(f.env.RestrictedConfig(), false)
	cm := f.createCM("works", nil, nil)
	f.waitStored(20*time.Second, isEvent("added", "works", cm.ResourceVersion))
	f.eventually(20*time.Second, "forbidden reported for secrets", func() error {
		if v := metricValue(t, r.reg, "relayd_watch_restarts_total", map[string]string{"source": "secrets", "reason": "forbidden"}); v < 1 {
			return fmt.Errorf("relayd_watch_restarts_total{secrets,forbidden} = %v", v)
		}
		return nil
	})
	if v := metricValue(t, r.reg, "relayd_source_up", map[string]string{"source": "secrets"}); v != 0 {
		t.Errorf("relayd_source_up{secrets} = %v, want 0", v)
	}
	if v := metricValue(t, r.reg, "relayd_source_up", map[string]string{"source": "cms"}); v != 1 {
		t.Errorf("relayd_source_up{cms} = %v, want 1", v)
	}
	if err := r.readyErr(); err == nil || !strings.Contains(err.Error(), "secrets") {
		t.Errorf("readyz = %v, want not ready naming the secrets source", err)
	}
	// RelaydNotReady and RelaydSourceDown (docs/OPERATIONS.md, "Alert runbooks") see it.
	if v := metricValue(t, r.reg, "relayd_ready", nil); v != 0 {
		t.Errorf("relayd_ready = %v while /readyz is 503, want 0", v)
	}
}

func TestPaginatedListFallbackWhenStreamingListIsRefused(t *testing.T) {
	alongside(t)
	forEachVersionStarted(t, testenv.Options{ExtraAPIServerArgs: []string{"--feature-gates=WatchList=false"}, AuditLog: true},
		paginatedListFallback)
}

func paginatedListFallback(t *testing.T, old *testenv.Env) {
	f := newFixture(t, old, natsSrv, `
  - name: cms
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]`)
	// More objects than one page (watch.pageSize is 500 by default; the
	// harness config does not change it), so use a small page via a config edit.
	f.cfgYAML = strings.Replace(f.cfgYAML, "  timeout: 60s\n", "  timeout: 60s\n  pageSize: 2\n", 1)
	var want []func(msg) bool
	for i := range 5 {
		cm := f.createCM(fmt.Sprintf("pre-%d", i), nil, nil)
		want = append(want, isEvent("added", cm.Name, cm.ResourceVersion))
	}
	f.start(nil, true)
	live := f.createCM("live", nil, nil)
	want = append(want, isSync("completed"), func(m msg) bool {
		return isEvent("added", "live", live.ResourceVersion)(m) && m.Env.RelaydOrigin == "watch"
	})
	got := f.waitStored(30*time.Second, want...)
	for _, m := range got {
		if strings.HasPrefix(m.Env.K8sName, "pre-") && m.Env.RelaydOrigin != "initial" {
			t.Errorf("%s: origin %s, want initial", m.Env.K8sName, m.Env.RelaydOrigin)
		}
	}
	// The path relayd took, as the apiserver saw it: one streaming list,
	// refused as invalid (422: sendInitialEvents without WatchList), then
	// LIST pages of 2 (5 objects or more: 3 pages, 2 with a continue token)
	// and a watch from the list's resourceVersion.
	l := relaydRequests(t, old, "configmaps", f.ns)
	t.Logf("Kubernetes %s with WatchList off, relayd's requests: %v", old.Version(), l)
	if l.streamed != 0 || len(l.refused) != 1 || l.refused[0] != 422 || l.pages < 3 || l.continued < 2 || l.resumes < 1 {
		t.Errorf("Kubernetes %s with WatchList off: %v; want 1 streaming list refused with 422, then at least 3 LIST pages (2 continued) and a watch",
			old.Version(), l)
	}
}

func TestNATSDownAtStartConnectsInTheBackground(t *testing.T) {
	n := testenv.NATST(t, testenv.NATSOptions{})
	f := newFixture(t, env, n, `
  - name: cms
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]`)
	n.Stop()
	r := f.start(nil, false) // must not fail or exit: no crash loop
	pre := f.createCM("before-nats", nil, nil)
	time.Sleep(500 * time.Millisecond)
	if err := r.readyErr(); err == nil || !strings.Contains(err.Error(), "NATS") {
		t.Errorf("readyz without NATS: %v, want not ready naming NATS", err)
	}
	if err := r.healthErr(); err != nil {
		t.Errorf("healthz without NATS: %v, want 200", err)
	}
	for _, name := range []string{"relayd_ready", "relayd_nats_connected"} {
		if v := metricValue(t, r.reg, name, nil); v != 0 {
			t.Errorf("%s = %v without NATS, want 0", name, v)
		}
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	f.eventually(30*time.Second, "ready once NATS is up", r.readyErr)
	if v := metricValue(t, r.reg, "relayd_ready", nil); v != 1 {
		t.Errorf("relayd_ready = %v once /readyz is 200, want 1", v)
	}
	live := f.createCM("after-nats", nil, nil)
	f.waitStored(30*time.Second, isEvent("added", "before-nats", pre.ResourceVersion), isEvent("added", "after-nats", live.ResourceVersion))
}

func TestCorruptCheckpointKeepsRelaydUnreadyUntilFixed(t *testing.T) {
	f := newFixture(t, env, natsSrv, `
  - name: cms
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]`)
	ctx := t.Context()
	cp, err := f.cs.CoreV1().ConfigMaps(f.ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "cp"}, Data: map[string]string{"cms." + f.ns: "not json"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r := f.start(nil, false)
	f.createCM("x", nil, nil)
	time.Sleep(time.Second)
	if err := r.readyErr(); err == nil || !strings.Contains(err.Error(), "checkpoints not loaded") {
		t.Errorf("readyz with a corrupt checkpoint: %v, want not ready: checkpoints not loaded", err)
	}
	if got := f.stored(); len(got) != 0 {
		t.Errorf("published %d messages from a corrupt checkpoint (a silent re-snapshot):\n%s", len(got), dump(got))
	}
	// The operator deletes the bad key: the source starts over per `initial`.
	delete(cp.Data, "cms."+f.ns)
	if _, err := f.cs.CoreV1().ConfigMaps(f.ns).Update(ctx, cp, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.eventually(60*time.Second, "ready after the fix", r.readyErr)
	f.waitStored(20*time.Second, isEvent("added", "x", ""), isSync("completed"))
}
