package deploy

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/relayd/relayd/internal/testutil"
)

const chartDir = "deploy/helm/relayd"

var helmRequire = regexp.MustCompile(`(?m)^\s*helm\.sh/helm/v3 (v\S+)`)

// helmBin is the helm that hack/helm-bin.sh builds: the version pinned in
// tools/helm/go.mod, under .cache/helm/ (or $RELAYD_HELM). Missing or
// another version is a failure, never a skip.
func helmBin(t testing.TB) string {
	t.Helper()
	m := helmRequire.FindStringSubmatch(repoFile(t, "tools/helm/go.mod"))
	if m == nil {
		t.Fatal("tools/helm/go.mod does not require helm.sh/helm/v3")
	}
	version := m[1]
	bin := os.Getenv("RELAYD_HELM")
	if bin == "" {
		bin = filepath.Join(testutil.RepoRootT(t), ".cache", "helm", version, "helm")
	}
	out, err := exec.Command(bin, "version", "--template", "{{.Version}}").Output()
	if err != nil {
		t.Fatalf("helm %s not runnable at %s (%v): run `make helm-bin` (builds it from tools/helm)", version, bin, err)
	}
	if got := strings.TrimSpace(string(out)); got != version {
		t.Fatalf("%s reports %q, tools/helm/go.mod pins %s: run `make helm-bin`", bin, got, version)
	}
	return bin
}

// helm runs helm with args on the chart, each values document given in a
// file of its own; it returns stdout, or an error carrying stderr.
func helm(t testing.TB, args []string, values ...string) ([]byte, error) {
	t.Helper()
	for i, v := range values {
		f := filepath.Join(t.TempDir(), fmt.Sprintf("values-%d.yaml", i))
		if err := os.WriteFile(f, []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
		args = append(args, "-f", f)
	}
	cmd := exec.Command(helmBin(t), args...)
	cmd.Dir = testutil.RepoRootT(t)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("helm %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out, nil
}

// renderChart is `helm template <release> deploy/helm/relayd -n <ns>`.
func renderChart(t testing.TB, release, ns string, values ...string) []*unstructured.Unstructured {
	t.Helper()
	out, err := helm(t, []string{"template", release, chartDir, "-n", ns}, values...)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeObjects(out)
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	return objs
}

// testValues: the chart's default sources (ConfigMaps named by kind,
// Deployments by resource) under a cluster name of their own, so that the
// test's stream subjects and index bucket are not the kustomize test's.
const testValues = "config:\n  cluster: helm-test\n  nats:\n    url: nats://nats.invalid:4222\n    stream: {name: K8S, create: true}\n" +
	"  sources:\n    - {name: configmaps, apiVersion: v1, kind: ConfigMap}\n    - {name: deployments, resource: {group: apps, version: v1, resource: deployments}}\n"

// The chart, installed on a real apiserver and run as the chart's
// ServiceAccount: relayd relays a change of each watched kind and writes
// its checkpoint; without any one permission the chart computed, relayd
// fails naming it. The same check as for the kustomize base.
func TestHelmChartRBACIsEnoughAndEveryPermissionIsNeeded(t *testing.T) {
	objs := renderChart(t, "relayd-helm", "relayd-helm", testValues)
	checkRBACIsEnoughAndMinimal(t, newInstallOfBundle(t, env, natsSrv.URL(), bundleOf(t, chartDir, objs), nil))
}

// The chart and the kustomize base grant the same permissions (for the
// same sources) and run the pod with the same security settings.
func TestHelmChartAgreesWithTheKustomizeBase(t *testing.T) {
	base := loadBundle(t, baseDir)
	chart := bundleOf(t, chartDir, renderChart(t, "relayd", "relayd", testValues))
	key := func(p permission) string {
		return fmt.Sprintf("%s %s/%s %s %v", p.roleKind, p.group, p.resource, p.verb, p.resourceNames)
	}
	var bp, cp []string
	for _, p := range permissions(t, base.objs) {
		bp = append(bp, key(p))
	}
	for _, p := range permissions(t, chart.objs) {
		cp = append(cp, key(p))
	}
	slices.Sort(bp)
	slices.Sort(cp)
	if !slices.Equal(bp, cp) {
		t.Errorf("permissions differ:\nkustomize base %q\nHelm chart     %q", bp, cp)
	}
	bs, cs := base.deployment.Spec.Template.Spec, chart.deployment.Spec.Template.Spec
	bc, cc := base.container, chart.container
	for _, c := range []struct {
		what       string
		base, helm any
	}{
		{"pod securityContext", bs.SecurityContext, cs.SecurityContext},
		{"container securityContext", bc.SecurityContext, cc.SecurityContext},
		{"liveness probe", bc.LivenessProbe, cc.LivenessProbe},
		{"readiness probe", bc.ReadinessProbe, cc.ReadinessProbe},
		{"resources", bc.Resources, cc.Resources},
		{"env", bc.Env, cc.Env},
		{"ports", bc.Ports, cc.Ports},
		{"args", bc.Args, cc.Args},
		{"automountServiceAccountToken", bs.AutomountServiceAccountToken, cs.AutomountServiceAccountToken},
		{"enableServiceLinks", bs.EnableServiceLinks, cs.EnableServiceLinks},
		{"terminationGracePeriodSeconds", bs.TerminationGracePeriodSeconds, cs.TerminationGracePeriodSeconds},
		{"strategy", base.deployment.Spec.Strategy, chart.deployment.Spec.Strategy},
		{"replicas", base.deployment.Spec.Replicas, chart.deployment.Spec.Replicas},
	} {
		if !reflect.DeepEqual(c.base, c.helm) {
			t.Errorf("%s differs:\nkustomize base %+v\nHelm chart     %+v", c.what, c.base, c.helm)
		}
	}
}

// helm lint passes with the default values and with every option on; the
// values schema refuses a wrong type; the chart refuses what it cannot
// compute RBAC for, and a second replica without sharding.
func TestHelmLintSchemaAndFailures(t *testing.T) {
	allOn := testValues + `replicas: 3
natsSecret: {name: relayd-nats}
monitoring: {serviceMonitor: true, prometheusRule: true, dashboard: true}
networkPolicy:
  enabled: true
  apiServer: {cidrs: [10.0.0.1/32]}
  nats: {namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: nats}}}
  prometheus: {namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: monitoring}}}
`
	allOn = strings.Replace(allOn, "  sources:", "  sharding: {enabled: true}\n  sources:", 1)
	for _, v := range []string{"", allOn} {
		var values []string
		if v != "" {
			values = []string{v}
		}
		if out, err := helm(t, []string{"lint", "--strict", chartDir}, values...); err != nil {
			t.Errorf("helm lint: %v\n%s", err, out)
		}
	}
	for _, tc := range []struct{ name, values, want string }{
		{"wrong type", testValues + "replicas: two\n", "replicas"},
		{"unknown value", testValues + "replica: 2\n", "replica"},
		{"kind without an RBAC resource", strings.Replace(testValues, "{name: configmaps, apiVersion: v1, kind: ConfigMap}", "{name: widgets, apiVersion: example.com/v1, kind: Widget}", 1),
			`source "widgets" is named by apiVersion and kind: give rbac.resources.widgets (its plural resource name`},
		{"two replicas without sharding", testValues + "replicas: 2\n", "replicas > 1 needs config.sharding.enabled: true"},
		{"NetworkPolicy without the apiserver's address", testValues + "networkPolicy: {enabled: true, nats: {cidrs: [10.1.0.0/16]}}\n", "networkPolicy.apiServer.cidrs"},
	} {
		_, err := helm(t, []string{"template", "relayd", chartDir}, tc.values)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want an error with %q", tc.name, err, tc.want)
		}
	}
}

// With sharding: one Lease per source and a Role on exactly those, a
// rolling update; the objects of every option are what they say.
func TestHelmChartShardingMonitoringAndNetworkPolicy(t *testing.T) {
	values := strings.Replace(testValues, "  sources:", "  sharding: {enabled: true, leasePrefix: rl}\n  sources:", 1) + `replicas: 3
monitoring: {serviceMonitor: true, prometheusRule: true, dashboard: true}
networkPolicy:
  enabled: true
  apiServer: {cidrs: [10.0.0.1/32], port: 6443}
  nats: {namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: nats}}, port: 4222}
  prometheus: {namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: monitoring}}}
`
	objs := renderChart(t, "relayd", "relayd", values)
	var leases []string
	for _, o := range ofKind(objs, "Lease") {
		leases = append(leases, o.GetNamespace()+"/"+o.GetName())
	}
	if want := []string{"relayd/rl-configmaps", "relayd/rl-deployments"}; !slices.Equal(leases, want) {
		t.Errorf("Leases %v, want %v", leases, want)
	}
	var leasePerms []string
	for _, p := range permissions(t, objs) {
		if p.resource == "leases" {
			leasePerms = append(leasePerms, p.verb+" "+strings.Join(p.resourceNames, ","))
		}
	}
	if want := []string{"get rl-configmaps,rl-deployments", "update rl-configmaps,rl-deployments"}; !slices.Equal(leasePerms, want) {
		t.Errorf("Lease permissions %v, want %v", leasePerms, want)
	}
	d := typed[appsv1.Deployment](t, find(t, objs, "Deployment", "relayd"))
	if *d.Spec.Replicas != 3 || d.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType || d.Spec.Strategy.RollingUpdate.MaxUnavailable.IntValue() != 0 {
		t.Errorf("sharded Deployment: replicas %d, strategy %+v", *d.Spec.Replicas, d.Spec.Strategy)
	}

	// The PrometheusRule holds exactly the rule groups of
	// deploy/prometheus/relayd-rules.yaml; the dashboard is
	// deploy/grafana/relayd.json; the chart's copies are the same files.
	for _, f := range [][2]string{{"deploy/helm/relayd/files/relayd-rules.yaml", "deploy/prometheus/relayd-rules.yaml"}, {"deploy/helm/relayd/files/relayd-dashboard.json", "deploy/grafana/relayd.json"}} {
		if repoFile(t, f[0]) != repoFile(t, f[1]) {
			t.Errorf("%s differs from %s: copy it again", f[0], f[1])
		}
	}
	var want struct {
		Groups []any `yaml:"groups"`
	}
	if err := yaml.Unmarshal([]byte(repoFile(t, "deploy/prometheus/relayd-rules.yaml")), &want); err != nil {
		t.Fatal(err)
	}
	rule := find(t, objs, "PrometheusRule", "relayd")
	got, _, _ := unstructured.NestedSlice(rule.Object, "spec", "groups")
	if len(want.Groups) == 0 || fmt.Sprint(got) != fmt.Sprint(want.Groups) {
		t.Errorf("PrometheusRule groups differ from deploy/prometheus/relayd-rules.yaml:\n%v\n%v", got, want.Groups)
	}
	dash := typed[corev1.ConfigMap](t, find(t, objs, "ConfigMap", "relayd-dashboard"))
	if dash.Labels["grafana_dashboard"] != "1" || strings.TrimSpace(dash.Data["relayd.json"]) != strings.TrimSpace(repoFile(t, "deploy/grafana/relayd.json")) {
		t.Errorf("dashboard ConfigMap: labels %v, content differs: %v", dash.Labels, dash.Data["relayd.json"] != repoFile(t, "deploy/grafana/relayd.json"))
	}
	find(t, objs, "ServiceMonitor", "relayd")

	np := typed[networkingv1.NetworkPolicy](t, find(t, objs, "NetworkPolicy", "relayd"))
	checkNetworkPolicy(t, "chart", np, "10.0.0.1/32", 6443)
}

// The kustomize Component renders the same policy.
func TestNetworkPolicyComponent(t *testing.T) {
	dir := t.TempDir()
	root := testutil.RepoRootT(t)
	rel := func(p string) string { // kustomize takes relative paths only
		r, err := filepath.Rel(dir, filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - " + rel(baseDir) +
		"\ncomponents:\n  - " + rel("deploy/components/networkpolicy") + "\n"
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(kustomizeBin(t), "build", dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kustomize build with the component: %v\n%s", err, out)
	}
	objs, err := decodeObjects(out)
	if err != nil {
		t.Fatal(err)
	}
	np := typed[networkingv1.NetworkPolicy](t, find(t, objs, "NetworkPolicy", "relayd"))
	checkNetworkPolicy(t, "component", np, "10.0.0.1/32", 443)
	d := typed[appsv1.Deployment](t, find(t, objs, "Deployment", "relayd"))
	for k, v := range np.Spec.PodSelector.MatchLabels {
		if d.Spec.Template.Labels[k] != v {
			t.Errorf("the policy selects %s=%s, the pods are labelled %v", k, v, d.Spec.Template.Labels)
		}
	}
}

// checkNetworkPolicy: ingress only to the metrics port; egress only to the
// apiserver, NATS (4222) and DNS (53 UDP and TCP).
func checkNetworkPolicy(t *testing.T, what string, np *networkingv1.NetworkPolicy, apiCIDR string, apiPort int) {
	t.Helper()
	if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}) {
		t.Errorf("%s: policyTypes %v", what, np.Spec.PolicyTypes)
	}
	if len(np.Spec.Ingress) != 1 || len(np.Spec.Ingress[0].Ports) != 1 || np.Spec.Ingress[0].Ports[0].Port.String() != "metrics" {
		t.Errorf("%s: ingress %+v, want the metrics port only", what, np.Spec.Ingress)
	}
	var egress []string
	for _, r := range np.Spec.Egress {
		var to []string
		for _, p := range r.To {
			switch {
			case p.IPBlock != nil:
				to = append(to, p.IPBlock.CIDR)
			case p.NamespaceSelector != nil:
				to = append(to, "ns="+p.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"])
			}
		}
		for _, p := range r.Ports {
			egress = append(egress, fmt.Sprintf("%v %s/%s", to, p.Port.String(), *p.Protocol))
		}
	}
	want := []string{fmt.Sprintf("[%s] %d/TCP", apiCIDR, apiPort), "[ns=nats] 4222/TCP", "[ns=kube-system] 53/UDP", "[ns=kube-system] 53/TCP"}
	if !slices.Equal(egress, want) {
		t.Errorf("%s: egress %q, want %q", what, egress, want)
	}
}
