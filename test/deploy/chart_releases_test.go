package deploy

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/relayd/relayd/pkg/shard"
)

// twoReleaseValues: every option on (ci/all-options-values.yaml) but the
// names that file sets by hand (the checkpoint's, the Lease prefix, the
// ServiceAccount's), which then follow the release; the prometheus-operator
// kinds off when their CRDs are not there.
func twoReleaseValues(t testing.TB, operatorCRDs bool) []string {
	t.Helper()
	v := yamlMap(t, repoFile(t, chartAllOptions))
	cfg := v["config"].(map[string]any)
	delete(cfg["checkpoint"].(map[string]any), "name")
	delete(cfg["sharding"].(map[string]any), "leasePrefix")
	delete(v["serviceAccount"].(map[string]any), "name")
	if !operatorCRDs {
		mon := v["monitoring"].(map[string]any)
		mon["serviceMonitor"].(map[string]any)["enabled"] = false
		mon["prometheusRule"] = false
	}
	return []string{valuesDoc(t, v)}
}

// objectKey: what names an object in a cluster.
func objectKey(o *unstructured.Unstructured) string {
	return o.GetAPIVersion() + " " + o.GetKind() + " " + o.GetNamespace() + "/" + o.GetName()
}

// checkReleaseOwnNames: the config relayd reads names the release's own
// checkpoint ConfigMap and Leases, the chart renders exactly those, and
// its Roles grant get and update on exactly those.
func checkReleaseOwnNames(t *testing.T, release string, objs []*unstructured.Unstructured) {
	t.Helper()
	b := bundleOf(t, release, objs) // finds the ConfigMap the config names
	if b.cfg.Checkpoint.Name != release+"-checkpoint" || b.checkpointCM.Namespace != b.namespace() {
		t.Errorf("%s: relayd's config names the checkpoint ConfigMap %q (rendered in %q), want %s-checkpoint in %s", release, b.cfg.Checkpoint.Name, b.checkpointCM.Namespace, release, b.namespace())
	}
	if b.cfg.Sharding.LeasePrefix != release {
		t.Errorf("%s: relayd's config has the Lease prefix %q, want the release's name", release, b.cfg.Sharding.LeasePrefix)
	}
	var want, got []string
	for _, src := range b.cfg.Sources {
		want = append(want, shard.LeaseName(b.cfg.Sharding.LeasePrefix, src.Name))
	}
	for _, o := range ofKind(objs, "Lease") {
		got = append(got, o.GetName())
	}
	slices.Sort(want)
	slices.Sort(got)
	if len(want) == 0 || !slices.Equal(got, want) {
		t.Errorf("%s: Leases %v, want the ones relayd's config names %v", release, got, want)
	}
	for _, p := range permissions(t, objs) {
		var names []string
		switch p.resource {
		case "configmaps":
			if p.verb != "get" && p.verb != "update" {
				continue
			}
			names = []string{b.cfg.Checkpoint.Name}
		case "leases":
			names = want
		default:
			continue
		}
		rn := slices.Clone(p.resourceNames)
		slices.Sort(rn)
		if !slices.Equal(rn, names) {
			t.Errorf("%s: %s, want it on %v only", release, p, names)
		}
	}
}

// TestHelmChartTwoReleasesInOneNamespace: two releases of the chart with
// every option on, in one namespace, render no two objects of the same
// kind, namespace and name (the checkpoint ConfigMap, the Leases, the
// roles, the ServiceAccount, the monitoring objects are all the
// release's), and each release's relayd config names its own checkpoint
// ConfigMap and Leases, which its own Roles grant. Applied server-side to
// a real apiserver, both are there side by side, each object still its
// own release's, and each ServiceAccount may update its own checkpoint and
// Leases and not the other release's.
func TestHelmChartTwoReleasesInOneNamespace(t *testing.T) {
	const a, b = "relayd-a", "relayd-b"
	seen := map[string]string{}
	for _, release := range []string{a, b} {
		objs := renderChart(t, release, "relayd", twoReleaseValues(t, true)...)
		for _, o := range objs {
			if other, ok := seen[objectKey(o)]; ok {
				t.Errorf("%s and %s both render %s", other, release, objectKey(o))
			}
			seen[objectKey(o)] = release
		}
		checkReleaseOwnNames(t, release, objs)
	}

	ns := fmt.Sprintf("relayd-two-%d", time.Now().UnixNano()) // new per run: -count=N works
	c := newCluster(t, env)
	rendered := map[string][]*unstructured.Unstructured{}
	for _, release := range []string{a, b} {
		rendered[release] = renderChart(t, release, ns, twoReleaseValues(t, false)...)
		for _, o := range rendered[release] {
			if o.GetNamespace() != "" {
				c.ensureNamespace(t, o.GetNamespace())
			}
		}
		for _, o := range rendered[release] {
			c.apply(t, o)
		}
	}
	n := 0
	for release, objs := range rendered {
		for _, o := range objs {
			got := c.get(t, o)
			if inst := got.GetLabels()["app.kubernetes.io/instance"]; inst != release {
				t.Errorf("%s of %s reads back as release %q's", describe(o), release, inst)
			}
			n++
		}
	}
	if n < 30 {
		t.Errorf("only %d objects applied; want both releases' whole render", n)
	}
	perm := func(resource, group, name string) permission {
		return permission{verb: "update", group: group, resource: resource, namespace: ns, resourceNames: []string{name}}
	}
	for _, tc := range []struct{ self, other string }{{a, b}, {b, a}} {
		as := tokenClient(t, env, c.serviceAccountToken(t, ns, tc.self))
		waitAccess(t, as, perm("configmaps", "", tc.self+"-checkpoint"), true)
		waitAccess(t, as, perm("leases", "coordination.k8s.io", tc.self+"-deployments"), true)
		waitAccess(t, as, perm("configmaps", "", tc.other+"-checkpoint"), false)
		waitAccess(t, as, perm("leases", "coordination.k8s.io", tc.other+"-deployments"), false)
	}
}

// get reads o back from the apiserver.
func (c *cluster) get(t testing.TB, o *unstructured.Unstructured) *unstructured.Unstructured {
	t.Helper()
	gvk := o.GroupVersionKind()
	m, err := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		t.Fatalf("%s: %v", describe(o), err)
	}
	var ri dynamic.ResourceInterface = c.dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		ri = c.dyn.Resource(m.Resource).Namespace(o.GetNamespace())
	}
	got, err := ri.Get(t.Context(), o.GetName(), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get %s: %v", describe(o), err)
	}
	return got
}
