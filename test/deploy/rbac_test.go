package deploy

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.yaml.in/yaml/v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/pkg/checkpoint"
)

// install is deploy/base applied to one apiserver, plus what it takes to
// run the real relayd binary the way the Deployment would: as the rendered
// ServiceAccount (a TokenRequest token), with the container's args and env,
// and the config ConfigMap projected into a folder standing for the mount.
// Only the NATS URL (the test server) and the listen addresses (free
// loopback ports) differ from the shipped pod.
type install struct {
	b          *bundle
	e          *testenv.Env
	c          *cluster
	natsURL    string
	as         kubernetes.Interface // the ServiceAccount's own client
	bin        string
	kubeconfig string
	mount      string
	envv       []string
	grace      time.Duration
	editCfg    func(root *yaml.Node)
}

func newInstall(t *testing.T, e *testenv.Env, natsURL string) *install {
	t.Helper()
	return newInstallOf(t, e, natsURL, baseDir, nil)
}

// newInstallOf installs the kustomization in dir; editCfg, if set, may
// change the config further (only timings, in the tests).
func newInstallOf(t *testing.T, e *testenv.Env, natsURL, dir string, editCfg func(root *yaml.Node)) *install {
	t.Helper()
	return newInstallOfBundle(t, e, natsURL, loadBundle(t, dir), editCfg)
}

// newInstallOfBundle installs rendered objects (the Helm chart's).
func newInstallOfBundle(t *testing.T, e *testenv.Env, natsURL string, b *bundle, editCfg func(root *yaml.Node)) *install {
	t.Helper()
	in := &install{b: b, e: e, c: newCluster(t, e), natsURL: natsURL, bin: relaydBin(t), editCfg: editCfg}
	ns := in.b.namespace()
	in.c.ensureNamespace(t, ns)
	in.applyAll(t)
	token := in.c.serviceAccountToken(t, ns, in.b.sa.Name)
	in.as = tokenClient(t, e, token)
	tmp := t.TempDir()
	in.kubeconfig = writeKubeconfig(t, e, tmp, in.b.serviceAccountUser(), token)
	in.mount = mkdir(t, filepath.Join(tmp, "mount"))
	in.project(t)
	in.envv = containerEnv(t, in.b)
	in.grace = time.Duration(*in.b.deployment.Spec.Template.Spec.TerminationGracePeriodSeconds) * time.Second
	return in
}

// applyAll applies every rendered object as rendered (server-side); only
// the config ConfigMap gets the test's NATS URL. RBAC, ServiceAccount and
// the checkpoint ConfigMap are exactly what kustomize (or helm) produced.
// The namespaces they are in are created first (the Roles of a source
// restricted to namespaces live in those).
func (in *install) applyAll(t *testing.T) {
	t.Helper()
	for _, o := range in.b.objs {
		if ns := o.GetNamespace(); ns != "" {
			in.c.ensureNamespace(t, ns)
		}
	}
	for _, o := range in.b.objs {
		if o.GetKind() == "ConfigMap" && o.GetName() == in.b.configMap.Name {
			o = in.configObject(t)
		}
		in.c.apply(t, o)
	}
}

// configObject is the config ConfigMap with the test NATS URL.
func (in *install) configObject(t *testing.T) *unstructured.Unstructured {
	t.Helper()
	o := find(t, in.b.objs, "ConfigMap", in.b.configMap.Name).DeepCopy()
	doc := editConfig(t, in.b.configMap.Data[in.b.configKey], func(root *yaml.Node) {
		setKey(t, mapValue(t, root, "nats"), "url", in.natsURL)
		if in.editCfg != nil {
			in.editCfg(root)
		}
	})
	if err := unstructured.SetNestedField(o.Object, doc, "data", in.b.configKey); err != nil {
		t.Fatal(err)
	}
	return o
}

// project writes every key of the live config ConfigMap into the mount
// folder, as the kubelet projects a ConfigMap volume.
func (in *install) project(t *testing.T) {
	t.Helper()
	cm, err := in.c.cs.CoreV1().ConfigMaps(in.b.namespace()).Get(t.Context(), in.b.configMap.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range cm.Data {
		if err := os.WriteFile(filepath.Join(in.mount, k), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// run starts relayd with the container's args: the mount path is mapped to
// the projected folder, the listen addresses to free loopback ports.
func (in *install) run(t *testing.T) *relayd {
	t.Helper()
	return in.runAs(t, "")
}

// runAs is run with POD_NAME=pod (the replica identity), unless pod is "".
func (in *install) runAs(t *testing.T, pod string) *relayd {
	t.Helper()
	envv := in.envv
	if pod != "" {
		envv = nil
		for _, kv := range in.envv {
			if !strings.HasPrefix(kv, "POD_NAME=") {
				envv = append(envv, kv)
			}
		}
		envv = append(envv, "POD_NAME="+pod)
	}
	health, metrics := freeAddr(t), freeAddr(t)
	var args []string
	for _, a := range in.b.container.Args {
		switch {
		case strings.HasPrefix(a, "--metrics-bind-address="):
			a = "--metrics-bind-address=" + metrics
		case strings.HasPrefix(a, "--health-probe-bind-address="):
			a = "--health-probe-bind-address=" + health
		case strings.HasPrefix(a, in.b.mountPath+"/"):
			a = in.mount + strings.TrimPrefix(a, in.b.mountPath)
		}
		args = append(args, a)
	}
	args = append(args, "--kubeconfig", in.kubeconfig)
	return startRelayd(t, in.bin, args, envv, health, metrics)
}

func (in *install) waitReady(t *testing.T, r *relayd) {
	t.Helper()
	eventually(t, r, 60*time.Second, "relayd ready", func() error {
		code, body, err := r.probe("/readyz")
		if err != nil || code != 200 {
			return fmt.Errorf("/readyz %d %q %v", code, body, err)
		}
		return nil
	})
}

// without takes p away (server-side apply of the role minus p), waits
// until the authorizer denies it, runs fn, and restores the role.
func (in *install) without(t *testing.T, p permission, fn func()) {
	t.Helper()
	var role *unstructured.Unstructured // by name and namespace: the chart's watch Roles share a name
	for _, o := range ofKind(in.b.objs, p.roleKind) {
		if o.GetName() == p.roleName && o.GetNamespace() == p.namespace {
			role = o
		}
	}
	if role == nil {
		t.Fatalf("no %s %s/%s rendered", p.roleKind, p.namespace, p.roleName)
	}
	reduced := withoutPermission(t, role, p)
	all := permissions(t, in.b.objs)
	if got, want := len(permissions(t, []*unstructured.Unstructured{reduced})), countPerms(all, role)-1; got != want {
		t.Fatalf("the reduced role grants %d permissions, want %d", got, want)
	}
	in.c.apply(t, reduced)
	defer func() {
		in.c.apply(t, role)
		waitAccess(t, in.as, p, true)
	}()
	waitAccess(t, in.as, p, false)
	fn()
}

// requireAPIServerTextForList: relayd's LIST requests (the paginated
// fallback and the `initial: none` start) once read errors with client-go's
// DoRaw, which drops the apiserver's Status (a forbidden LIST was logged as
// `unknown (get configmaps)`). pkg/source now keeps the Status; false would
// accept the old form again.
const requireAPIServerTextForList = true

// expectForbidden runs relayd from an empty checkpoint (a fresh install,
// so it lists as well as watches) and requires an error log line carrying
// the apiserver's words for exactly p, and relayd's own words for what it
// was doing; /readyz must be 503 and /healthz 200 (RBAC must not make the
// kubelet restart the pod).
func (in *install) expectForbidden(t *testing.T, p permission) {
	t.Helper()
	resetCheckpoint(t, in.c, in.b.namespace(), in.b.checkpointCM.Name)
	r := in.run(t)
	apiText := fmt.Sprintf("User %q cannot %s resource %q in API group %q", in.b.serviceAccountUser(), p.verb, p.resource, p.group)
	if p.namespace != "" {
		apiText += fmt.Sprintf(" in the namespace %q", p.namespace)
	} else {
		apiText += " at the cluster scope"
	}
	accept := []string{apiText}
	qualified := p.resource
	if p.group != "" {
		qualified += "." + p.group
	}
	weakText := fmt.Sprintf("unknown (get %s)", qualified)
	if p.verb == "list" && !requireAPIServerTextForList {
		accept = append(accept, weakText)
	}
	var hit logEntry
	eventually(t, r, 30*time.Second, "an error naming "+p.String(), func() error {
		for _, e := range r.entries() {
			for _, a := range accept {
				if strings.Contains(e.text, a) {
					hit = e
					return nil
				}
			}
		}
		return fmt.Errorf("no log line contains %s", apiText)
	})
	if hit.level != "error" {
		t.Errorf("the line naming the missing permission is logged at level %q, want error: %s", hit.level, hit.raw)
	}
	// A permission without resourceNames is a source's list or watch (in
	// the ClusterRole, or in a Role of a namespace a source is restricted
	// to); a named one is the checkpoint ConfigMap or another shipped object
	// (a Lease), for which the apiserver's words above suffice.
	watchPerm := len(p.resourceNames) == 0
	switch {
	case !watchPerm:
		if p.resource != "configmaps" || !slices.Contains(p.resourceNames, in.b.checkpointCM.Name) {
			break
		}
		if obj := in.b.namespace() + "/" + in.b.checkpointCM.Name; !strings.Contains(hit.text, obj) || !strings.Contains(hit.text, `grant "get" and "update"`) {
			t.Errorf("the error does not name the checkpoint ConfigMap %s and what to grant: %s", obj, hit.text)
		}
	default:
		src := in.sourceFor(t, p)
		if !strings.Contains(hit.text, "list/watch "+p.resource) || !strings.Contains(hit.text, "source="+src) {
			t.Errorf("the error does not say that source %q was listing/watching %s: %s", src, p.resource, hit.text)
		}
		eventually(t, r, 10*time.Second, "forbidden counted", func() error {
			return r.metricAtLeast("relayd_watch_restarts_total", map[string]string{"source": src, "reason": "forbidden"}, 1)
		})
	}
	code, body, err := r.probe("/readyz")
	if err != nil || code != 503 {
		t.Errorf("/readyz = %d %q (%v), want 503", code, body, err)
	}
	if watchPerm && !strings.Contains(body, "forbidden") {
		t.Errorf("/readyz does not say why the watch is not established: %q", body)
	}
	if hc, hb, err := r.probe("/healthz"); err != nil || hc != 200 {
		t.Errorf("/healthz = %d %q (%v), want 200", hc, hb, err)
	}
	if strings.Contains(hit.text, apiText) {
		t.Logf("relayd logs [%s]: %s", hit.level, hit.text)
	} else {
		t.Logf("WEAK: relayd logs [%s] without the apiserver's reason (%s): %s", hit.level, apiText, hit.text)
	}
	t.Logf("/readyz: %d %s", code, body)
	if err := r.stop(t, in.grace); err != nil {
		t.Errorf("stop: %v", err)
	}
}

// sourceFor is the one configured source that watches p's resource where p
// grants it: all namespaces for a ClusterRole, p's namespace for a Role.
func (in *install) sourceFor(t *testing.T, p permission) string {
	t.Helper()
	var names []string
	resources := watchedResources(t, in.c.mapper, in.b.cfg)
	for _, src := range in.b.cfg.Sources {
		gr := resources[src.Name]
		if gr.Group != p.group || gr.Resource != p.resource {
			continue
		}
		if (p.namespace == "" && src.AllNamespaces()) || (p.namespace != "" && slices.Contains(src.Namespaces, p.namespace)) {
			names = append(names, src.Name)
		}
	}
	if len(names) != 1 {
		t.Fatalf("want one source watching %s.%s, found %q", p.resource, p.group, names)
	}
	return names[0]
}

// TestShippedRBACIsEnoughAndEveryPermissionIsNeeded: with the shipped RBAC
// relayd becomes ready, relays a change of every watched kind to NATS,
// writes its checkpoint and shuts down cleanly; re-applying the base keeps
// the checkpoint. Then each single permission of the rendered roles is
// taken away in turn and relayd must name exactly it.
//
// This apiserver serves streaming lists (WatchList, on by default since
// Kubernetes 1.32), which it authorizes as "watch": a snapshot start then
// needs no "list", and the test pins that. relayd LISTs when the streaming
// list is refused (older clusters, WatchList off), which
// TestListIsNeededWithoutStreamingLists proves, and to start a source with
// `initial: none`.
func TestShippedRBACIsEnoughAndEveryPermissionIsNeeded(t *testing.T) {
	in := newInstall(t, env, natsSrv.URL())
	ns, core, list, rw := in.b.namespace(), []string{""}, []string{"list", "watch"}, []string{"get", "update"}
	checkAppliedRules(t, in.c, in.b.objs, []string{
		rule("ClusterRole /relayd", core, []string{"configmaps"}, nil, list),
		rule("ClusterRole /relayd", []string{"apps"}, []string{"deployments"}, nil, list),
		rule("Role "+ns+"/relayd-checkpoint", core, []string{"configmaps"}, []string{"relayd-checkpoint"}, rw),
	})
	checkRBACIsEnoughAndMinimal(t, in)
}

// checkRBACIsEnoughAndMinimal runs relayd as the install's ServiceAccount:
// it relays a change of each watched kind and writes its checkpoint; then,
// for every permission the install grants, relayd without it fails naming
// it (or, for list with streaming lists, is ready: see below).
func checkRBACIsEnoughAndMinimal(t *testing.T, in *install) {
	b, ctx := in.b, t.Context()
	// The test changes a ConfigMap and a Deployment: in a new namespace for
	// a source of all namespaces, in the first namespace of a source
	// restricted to namespaces (which must be new to this run, so that
	// -count=N works). Every watch has a checkpoint key.
	probeNS := fmt.Sprintf("deploy-probe-%d", time.Now().UnixNano())
	probeNSOf := map[string]string{} // by resource
	var checkpointKeys []string
	resources := watchedResources(t, in.c.mapper, b.cfg)
	for _, src := range b.cfg.Sources {
		ns := probeNS
		if !src.AllNamespaces() {
			ns = src.Namespaces[0]
		}
		probeNSOf[resources[src.Name].Resource] = ns
		if src.AllNamespaces() {
			checkpointKeys = append(checkpointKeys, checkpoint.Key(src.Name, ""))
		}
		for _, watched := range src.Namespaces {
			checkpointKeys = append(checkpointKeys, checkpoint.Key(src.Name, watched))
		}
	}
	if len(b.cfg.Sources) != 2 || probeNSOf["configmaps"] == "" || probeNSOf["deployments"] == "" {
		t.Fatalf("the test makes a change of a ConfigMap and of a Deployment; the config must watch those two, it watches %v", resources)
	}
	t.Logf("relayd env: %q", in.envv)

	t.Run("shipped RBAC works", func(t *testing.T) {
		nc, err := nats.Connect(in.natsURL)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		sub, err := nc.SubscribeSync(b.cfg.StreamSubject())
		if err != nil {
			t.Fatal(err)
		}

		r := in.run(t)
		in.waitReady(t, r)

		// A change of every watched kind.
		for _, ns := range probeNSOf {
			in.c.ensureNamespace(t, ns)
		}
		if _, err := in.c.cs.CoreV1().ConfigMaps(probeNSOf["configmaps"]).Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: "probe"}, Data: map[string]string{"k": "v"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		labels := map[string]string{"app": "probe"}
		if _, err := in.c.cs.AppsV1().Deployments(probeNSOf["deployments"]).Create(ctx, &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: "probe"},
			Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
					Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "example.invalid/probe"}}}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		prefix := strings.TrimSuffix(b.cfg.StreamSubject(), ">")
		want := map[string]bool{
			prefix + "core.v1.configmaps." + probeNSOf["configmaps"] + ".probe.added":   false,
			prefix + "apps.v1.deployments." + probeNSOf["deployments"] + ".probe.added": false,
		}
		deadline := time.Now().Add(30 * time.Second)
		for slices.Contains(slices.Collect(maps.Values(want)), false) {
			msg, err := sub.NextMsg(time.Until(deadline))
			if err != nil {
				t.Fatalf("waiting for %v on NATS: %v", want, err)
			}
			if _, ok := want[msg.Subject]; !ok {
				continue
			}
			var ce struct {
				Origin string `json:"relaydorigin"`
				Name   string `json:"k8sname"`
				Source string `json:"relaydsource"`
			}
			if err := json.Unmarshal(msg.Data, &ce); err != nil {
				t.Fatalf("%s: %v", msg.Subject, err)
			}
			if ce.Origin != "watch" || ce.Name != "probe" {
				t.Errorf("%s: origin %q name %q, want a live change of probe", msg.Subject, ce.Origin, ce.Name)
			}
			want[msg.Subject] = true
			t.Logf("relayed %s (source %s, Nats-Msg-Id %s)", msg.Subject, ce.Source, msg.Header.Get("Nats-Msg-Id"))
		}

		// The checkpoint: one key per watch, written by relayd.
		eventually(t, r, 30*time.Second, "checkpoint written", func() error {
			cm, err := in.c.cs.CoreV1().ConfigMaps(b.namespace()).Get(ctx, b.checkpointCM.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			for _, key := range checkpointKeys {
				var p checkpoint.Position
				raw, ok := cm.Data[key]
				if !ok {
					return fmt.Errorf("no key %q in %v", key, cm.Data)
				}
				if err := json.Unmarshal([]byte(raw), &p); err != nil || p.ResourceVersion == "" {
					return fmt.Errorf("key %q = %q (%v)", key, raw, err)
				}
			}
			for _, mf := range cm.ManagedFields {
				if mf.Manager == "relayd" && mf.Operation == metav1.ManagedFieldsOperationUpdate {
					return nil
				}
			}
			return fmt.Errorf("no managedFields entry of relayd: %+v", cm.ManagedFields)
		})
		if err := r.stop(t, in.grace); err != nil {
			t.Fatalf("relayd did not shut down cleanly on SIGTERM: %v", err)
		}

		// Re-applying the base (server-side, as `kubectl apply
		// --server-side` would) keeps relayd's positions.
		before, err := in.c.cs.CoreV1().ConfigMaps(b.namespace()).Get(ctx, b.checkpointCM.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		in.applyAll(t)
		after, err := in.c.cs.CoreV1().ConfigMaps(b.namespace()).Get(ctx, b.checkpointCM.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !maps.Equal(before.Data, after.Data) || len(after.Data) != len(checkpointKeys) {
			t.Errorf("re-applying the base changed the checkpoint: %v -> %v", before.Data, after.Data)
		}
	})
	if t.Failed() {
		return
	}

	for _, p := range permissions(t, b.objs) {
		t.Run("without "+p.String(), func(t *testing.T) {
			in.without(t, p, func() {
				if p.verb != "list" {
					in.expectForbidden(t, p)
					return
				}
				// On a streaming-list apiserver a snapshot start is
				// authorized as "watch" alone (see the test's doc);
				// TestListIsNeededWithoutStreamingLists proves "list".
				resetCheckpoint(t, in.c, b.namespace(), b.checkpointCM.Name)
				r := in.run(t)
				eventually(t, r, 30*time.Second, "ready without "+p.String()+" (if relayd now needs list with streaming lists too, "+
					"expect a forbidden error here instead, and update the RBAC section of docs/DEPLOY.md)", func() error {
					code, body, err := r.probe("/readyz")
					if err != nil || code != 200 {
						return fmt.Errorf("/readyz %d %q %v", code, body, err)
					}
					return nil
				})
				t.Logf("without %s relayd is ready: this apiserver serves the snapshot as a streaming list (verb watch)", p)
				if err := r.stop(t, in.grace); err != nil {
					t.Errorf("stop: %v", err)
				}
			})
		})
	}
}

// TestListIsNeededWithoutStreamingLists runs the shipped config on an
// apiserver that refuses streaming lists (WatchList off, as in clusters
// before Kubernetes 1.32 or where it is disabled): relayd falls back to a
// paginated LIST, works with the shipped RBAC, and names "list" when it is
// missing.
func TestListIsNeededWithoutStreamingLists(t *testing.T) {
	relaydBin(t) // fail fast, before starting a second apiserver
	kustomizeBin(t)
	e := testenv.StartT(t, testenv.Options{ExtraAPIServerArgs: []string{"--feature-gates=WatchList=false"}})
	n := testenv.NATST(t, testenv.NATSOptions{})
	in := newInstall(t, e, n.URL())

	r := in.run(t)
	in.waitReady(t, r)
	fellBack := false
	for _, l := range r.entries() {
		fellBack = fellBack || strings.Contains(l.text, "using paginated LIST")
	}
	if !fellBack {
		t.Fatalf("relayd did not fall back to a paginated LIST; the apiserver flag did not take:\n%s", strings.Join(r.output(), "\n"))
	}
	if err := r.stop(t, in.grace); err != nil {
		t.Fatalf("stop: %v", err)
	}
	n2 := 0
	for _, p := range permissions(t, in.b.objs) {
		if p.verb != "list" {
			continue
		}
		n2++
		t.Run("without "+p.String(), func(t *testing.T) {
			in.without(t, p, func() { in.expectForbidden(t, p) })
		})
	}
	if n2 == 0 {
		t.Fatal("the shipped ClusterRole grants no list")
	}
}

func countPerms(perms []permission, role *unstructured.Unstructured) int {
	n := 0
	for _, p := range perms {
		if p.roleKind == role.GetKind() && p.roleName == role.GetName() && p.namespace == role.GetNamespace() {
			n++
		}
	}
	return n
}

// withoutPermission returns a copy of role without exactly p: p's rule is
// split per group and resource, and p's verb removed from p's part.
func withoutPermission(t testing.TB, role *unstructured.Unstructured, p permission) *unstructured.Unstructured {
	t.Helper()
	var rules []rbacv1.PolicyRule
	switch role.GetKind() {
	case "ClusterRole":
		rules = typed[rbacv1.ClusterRole](t, role).Rules
	default:
		rules = typed[rbacv1.Role](t, role).Rules
	}
	var out []any
	add := func(r rbacv1.PolicyRule) {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&r)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	for i, r := range rules {
		if i != p.rule {
			add(r)
			continue
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				verbs := r.Verbs
				if g == p.group && res == p.resource {
					verbs = slices.DeleteFunc(slices.Clone(verbs), func(v string) bool { return v == p.verb })
				}
				if len(verbs) > 0 {
					add(rbacv1.PolicyRule{APIGroups: []string{g}, Resources: []string{res}, Verbs: verbs, ResourceNames: r.ResourceNames})
				}
			}
		}
	}
	u := role.DeepCopy()
	if err := unstructured.SetNestedSlice(u.Object, out, "rules"); err != nil {
		t.Fatal(err)
	}
	return u
}

// resetCheckpoint empties the checkpoint ConfigMap (as shipped).
func resetCheckpoint(t testing.TB, c *cluster, ns, name string) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm, err := c.cs.CoreV1().ConfigMaps(ns).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cm.Data = nil
		_, err = c.cs.CoreV1().ConfigMaps(ns).Update(t.Context(), cm, metav1.UpdateOptions{FieldManager: "test-reset"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// containerEnv resolves the container's env as the kubelet would, for the
// downward-API fields the shipped Deployment uses; anything else fails, so
// a new variable is not silently left out of the test.
func containerEnv(t testing.TB, b *bundle) []string {
	t.Helper()
	var out []string
	for _, e := range b.container.Env {
		switch {
		case e.ValueFrom == nil:
			out = append(out, e.Name+"="+e.Value)
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace":
			out = append(out, e.Name+"="+b.namespace())
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
			out = append(out, e.Name+"="+b.deployment.Name+"-0") // a pod name; runAs sets others
		case e.ValueFrom.ResourceFieldRef != nil && e.ValueFrom.ResourceFieldRef.Resource == "limits.memory":
			q := b.container.Resources.Limits[corev1.ResourceMemory]
			div := int64(1)
			if d := e.ValueFrom.ResourceFieldRef.Divisor; !d.IsZero() {
				div = d.Value()
			}
			// The kubelet rounds up: ceil(limit / divisor).
			out = append(out, fmt.Sprintf("%s=%d", e.Name, (q.Value()+div-1)/div))
		default:
			t.Fatalf("env %s: the test does not know how to resolve %+v", e.Name, e.ValueFrom)
		}
	}
	return out
}

// editConfig applies edit to a config document, keeping everything else
// (comments included) as shipped.
func editConfig(t testing.TB, doc string, edit func(root *yaml.Node)) string {
	t.Helper()
	var root yaml.Node
	if err := yaml.Unmarshal([]byte(doc), &root); err != nil {
		t.Fatal(err)
	}
	if len(root.Content) != 1 || root.Content[0].Kind != yaml.MappingNode {
		t.Fatal("the config is not one YAML mapping")
	}
	edit(root.Content[0])
	out, err := yaml.Marshal(&root)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// mapValue is the value node of key in mapping m.
func mapValue(t testing.TB, m *yaml.Node, key string) *yaml.Node {
	t.Helper()
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	t.Fatalf("the config has no key %q", key)
	return nil
}

// setKey sets key in mapping m to a string value, adding it if absent.
func setKey(t testing.TB, m *yaml.Node, key, value string) {
	t.Helper()
	if m.Kind != yaml.MappingNode {
		t.Fatalf("cannot set %q: not a mapping", key)
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			m.Content[i+1].SetString(value)
			return
		}
	}
	k, v := &yaml.Node{}, &yaml.Node{}
	k.SetString(key)
	v.SetString(value)
	m.Content = append(m.Content, k, v)
}

// appliedRules reads every Role and ClusterRole of objs back from the
// apiserver and returns one line per rule, in full: the role's kind,
// namespace and name, then the rule's apiGroups, resources, resourceNames,
// verbs and nonResourceURLs as the apiserver stored them (lists in their
// order, rules in theirs); the lines sorted by role.
func appliedRules(t *testing.T, c *cluster, objs []*unstructured.Unstructured) []string {
	t.Helper()
	ctx := t.Context()
	var out []string
	add := func(kind, ns, name string, rules []rbacv1.PolicyRule) {
		var lines []string
		for _, r := range rules {
			line := rule(kind+" "+ns+"/"+name, r.APIGroups, r.Resources, r.ResourceNames, r.Verbs)
			if len(r.NonResourceURLs) > 0 {
				line = strings.TrimSuffix(line, "[]") + fmt.Sprintf("%q", r.NonResourceURLs)
			}
			lines = append(lines, line)
		}
		if len(lines) == 0 {
			lines = []string{fmt.Sprintf("%s %s/%s: no rules", kind, ns, name)}
		}
		out = append(out, lines...)
	}
	for _, o := range objs {
		switch o.GetKind() {
		case "Role":
			r, err := c.cs.RbacV1().Roles(o.GetNamespace()).Get(ctx, o.GetName(), metav1.GetOptions{})
			if err != nil {
				t.Fatalf("Role %s/%s as applied: %v", o.GetNamespace(), o.GetName(), err)
			}
			add("Role", r.Namespace, r.Name, r.Rules)
		case "ClusterRole":
			r, err := c.cs.RbacV1().ClusterRoles().Get(ctx, o.GetName(), metav1.GetOptions{})
			if err != nil {
				t.Fatalf("ClusterRole %s as applied: %v", o.GetName(), err)
			}
			add("ClusterRole", "", r.Name, r.Rules)
		}
	}
	slices.SortStableFunc(out, byRole)
	return out
}

// byRole orders rule lines of appliedRules by their role alone.
func byRole(a, b string) int {
	ra, _, _ := strings.Cut(a, ": ")
	rb, _, _ := strings.Cut(b, ": ")
	return strings.Compare(ra, rb)
}

// rule is a line of appliedRules: role is "<kind> <namespace>/<name>".
func rule(role string, apiGroups, resources, resourceNames, verbs []string) string {
	return fmt.Sprintf("%s: apiGroups=%q resources=%q resourceNames=%q verbs=%q nonResourceURLs=%q",
		role, apiGroups, resources, resourceNames, verbs, []string(nil))
}

// checkAppliedRules compares the rules of every Role and ClusterRole of
// objs as the apiserver holds them (appliedRules) with want, exactly: a
// rule line missing, added or different fails, naming each.
func checkAppliedRules(t *testing.T, c *cluster, objs []*unstructured.Unstructured, want []string) {
	t.Helper()
	got := appliedRules(t, c, objs)
	want = slices.Clone(want)
	slices.SortStableFunc(want, byRole)
	if slices.Equal(got, want) {
		return
	}
	var diff []string
	for _, l := range want {
		if !slices.Contains(got, l) {
			diff = append(diff, "- "+l)
		}
	}
	for _, l := range got {
		if !slices.Contains(want, l) {
			diff = append(diff, "+ "+l)
		}
	}
	if len(diff) == 0 {
		diff = append(diff, "(the same rules in another order)")
	}
	t.Fatalf("the RBAC rules as applied differ from the expected ones (- expected, + applied):\n%s\napplied:\n%s",
		strings.Join(diff, "\n"), strings.Join(got, "\n"))
}
