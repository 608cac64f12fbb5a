package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/relayd/relayd/internal/testutil"
	"github.com/relayd/relayd/pkg/shard"
)

const (
	chartDir = "deploy/helm/relayd"
	// chartDefault and chartAllOptions name the chart's renders in
	// `shipped` (the static tests of every shipped render): the default
	// values, and the values file that turns every option on.
	chartDefault    = chartDir
	chartAllOptions = chartDir + "/ci/all-options-values.yaml"
)

// chartRenders: the values of each named chart render, for loadBundle.
var chartRenders = map[string]func(t testing.TB) []string{
	chartDefault:    func(testing.TB) []string { return nil },
	chartAllOptions: func(t testing.TB) []string { return []string{repoFile(t, chartAllOptions)} },
}

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

// helm runs helm with args in the repository root, each values document
// given in a file of its own (-f, in order); it returns stdout, or an error
// carrying stderr.
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
		return out, fmt.Errorf("helm %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out, nil
}

// renderChart is `helm template <release> deploy/helm/relayd -n <ns>` with
// the values documents, decoded.
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
	if len(objs) == 0 {
		t.Fatal("helm template rendered nothing")
	}
	return objs
}

// valuesDoc marshals values for helm -f.
func valuesDoc(t testing.TB, values map[string]any) string {
	t.Helper()
	out, err := yaml.Marshal(values)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// yamlMap decodes one YAML mapping.
func yamlMap(t testing.TB, doc string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// kustomizeValues are chart values equivalent to the kustomize render b:
// its config as `config`, the plural resource of each of its kind-named
// sources (ConfigMaps and Deployments), and extra. (Helm merges them over
// the chart's defaults; the config comparison shows any default key that
// the kustomize config lacks.)
func kustomizeValues(t testing.TB, b *bundle, extra map[string]any) map[string]any {
	t.Helper()
	v := map[string]any{
		"config": yamlMap(t, b.configMap.Data[b.configKey]),
		"rbac":   map[string]any{"resources": map[string]any{"configmaps": "configmaps", "deployments": "deployments"}},
	}
	for k, x := range extra {
		v[k] = x
	}
	return v
}

// checkConfig runs the real binary's `relayd check-config` on a config.
func checkConfig(t testing.TB, doc string) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(f, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(relaydBin(t), "check-config", "-c", f).CombinedOutput(); err != nil || !strings.Contains(string(out), "SUCCESS") {
		t.Errorf("relayd check-config on the chart's config: %v\n%s\n%s", err, out, doc)
	}
}

// TestHelmChartMatchesKustomize: with the same config, the chart renders
// what deploy/base, deploy/overlays/ha (sharding, 3 replicas) and
// deploy/overlays/nats-secure (the NATS Secret mounted) render: the same
// permissions, the same config, the same pod (security contexts, probes,
// resources, env, args, ports, volumes and mounts, grace period, strategy,
// replicas), the same Service ports, checkpoint ConfigMap, Leases and
// PodDisruptionBudget.
func TestHelmChartMatchesKustomize(t *testing.T) {
	for _, tc := range []struct {
		dir   string
		extra map[string]any
	}{
		{baseDir, nil},
		{haDir, map[string]any{"replicas": 3}},
		{natsSecureDir, map[string]any{"natsSecret": map[string]any{"name": natsSecretName}}},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			k := loadBundle(t, tc.dir)
			c := bundleOf(t, chartDir, renderChart(t, "relayd", k.namespace(), valuesDoc(t, kustomizeValues(t, k, tc.extra))))

			perms := func(b *bundle) []string {
				var out []string
				for _, p := range permissions(t, b.objs) {
					out = append(out, fmt.Sprintf("%s %s: %s %s.%s %v", p.roleKind, p.namespace, p.verb, p.resource, p.group, p.resourceNames))
				}
				slices.Sort(out)
				return out
			}
			if kp, cp := perms(k), perms(c); !slices.Equal(kp, cp) {
				t.Errorf("permissions differ:\nkustomize %q\nHelm      %q", kp, cp)
			}
			if kc, cc := yamlMap(t, k.configMap.Data[k.configKey]), yamlMap(t, c.configMap.Data[c.configKey]); !reflect.DeepEqual(kc, cc) {
				t.Errorf("config differs:\nkustomize %v\nHelm      %v", kc, cc)
			}

			// Volumes and mounts, with the config ConfigMap's (generated,
			// hashed) name left out.
			volumes := func(b *bundle) []string {
				var out []string
				for _, v := range b.deployment.Spec.Template.Spec.Volumes {
					switch {
					case v.ConfigMap != nil && v.ConfigMap.Name == b.configMap.Name:
						out = append(out, v.Name+": the config ConfigMap")
					case v.Secret != nil:
						mode := "default"
						if v.Secret.DefaultMode != nil {
							mode = fmt.Sprintf("%#o", *v.Secret.DefaultMode)
						}
						out = append(out, fmt.Sprintf("%s: Secret %s mode %s items %v optional %v", v.Name, v.Secret.SecretName, mode, v.Secret.Items, v.Secret.Optional))
					default:
						out = append(out, fmt.Sprintf("%s: %+v", v.Name, v.VolumeSource))
					}
				}
				return out
			}
			kd, cd := k.deployment.Spec, c.deployment.Spec
			kp, cp := kd.Template.Spec, cd.Template.Spec
			for _, x := range []struct {
				what       string
				kust, helm any
			}{
				{"pod securityContext", kp.SecurityContext, cp.SecurityContext},
				{"container securityContext", k.container.SecurityContext, c.container.SecurityContext},
				{"liveness probe", k.container.LivenessProbe, c.container.LivenessProbe},
				{"readiness probe", k.container.ReadinessProbe, c.container.ReadinessProbe},
				{"resources", k.container.Resources, c.container.Resources},
				{"env", k.container.Env, c.container.Env},
				{"ports", k.container.Ports, c.container.Ports},
				{"args", k.container.Args, c.container.Args},
				{"command", k.container.Command, c.container.Command},
				{"imagePullPolicy", k.container.ImagePullPolicy, c.container.ImagePullPolicy},
				{"volume mounts", k.container.VolumeMounts, c.container.VolumeMounts},
				{"volumes", volumes(k), volumes(c)},
				{"pod automountServiceAccountToken", kp.AutomountServiceAccountToken, cp.AutomountServiceAccountToken},
				{"ServiceAccount automountServiceAccountToken", k.sa.AutomountServiceAccountToken, c.sa.AutomountServiceAccountToken},
				{"serviceAccountName is the ServiceAccount", kp.ServiceAccountName == k.sa.Name, cp.ServiceAccountName == c.sa.Name},
				{"enableServiceLinks", kp.EnableServiceLinks, cp.EnableServiceLinks},
				{"terminationGracePeriodSeconds", kp.TerminationGracePeriodSeconds, cp.TerminationGracePeriodSeconds},
				{"strategy", kd.Strategy, cd.Strategy},
				{"replicas", kd.Replicas, cd.Replicas},
				{"Service ports", k.service.Spec.Ports, c.service.Spec.Ports},
				{"checkpoint ConfigMap", []any{k.checkpointCM.Namespace, k.checkpointCM.Name, k.checkpointCM.Data}, []any{c.checkpointCM.Namespace, c.checkpointCM.Name, c.checkpointCM.Data}},
			} {
				if !reflect.DeepEqual(x.kust, x.helm) {
					t.Errorf("%s differs:\nkustomize %+v\nHelm      %+v", x.what, x.kust, x.helm)
				}
			}

			names := func(b *bundle, kind string) []string {
				var out []string
				for _, o := range ofKind(b.objs, kind) {
					out = append(out, o.GetNamespace()+"/"+o.GetName())
				}
				slices.Sort(out)
				return out
			}
			if kl, cl := names(k, "Lease"), names(c, "Lease"); !slices.Equal(kl, cl) {
				t.Errorf("Leases differ: kustomize %v, Helm %v", kl, cl)
			}
			kpdb, cpdb := ofKind(k.objs, "PodDisruptionBudget"), ofKind(c.objs, "PodDisruptionBudget")
			if len(kpdb) != len(cpdb) {
				t.Fatalf("kustomize renders %d PodDisruptionBudgets, Helm %d", len(kpdb), len(cpdb))
			}
			for i := range kpdb {
				kb, cb := typed[policyv1.PodDisruptionBudget](t, kpdb[i]), typed[policyv1.PodDisruptionBudget](t, cpdb[i])
				if !reflect.DeepEqual(kb.Spec.MaxUnavailable, cb.Spec.MaxUnavailable) || !reflect.DeepEqual(kb.Spec.MinAvailable, cb.Spec.MinAvailable) {
					t.Errorf("PodDisruptionBudget differs: kustomize %+v, Helm %+v", kb.Spec, cb.Spec)
				}
				sel, err := metav1.LabelSelectorAsSelector(cb.Spec.Selector)
				if err != nil || !sel.Matches(labels.Set(cd.Template.Labels)) {
					t.Errorf("the chart's PodDisruptionBudget selects %v, not the pods %v (%v)", cb.Spec.Selector, cd.Template.Labels, err)
				}
			}
		})
	}
}

// TestHelmChartConfigIsTheValuesConfig: the config ConfigMap holds exactly
// the values' `config`, with checkpoint.name (and with sharding
// sharding.leasePrefix) named after the release where unset (no chart-only key leaks into relayd's strict
// decoder, numbers stay as written; the all-options file sets every key of
// the default config, so the merge adds nothing), the real `relayd
// check-config` accepts it, and a change of it, and only of it, changes
// the pod template's checksum (a rollout).
func TestHelmChartConfigIsTheValuesConfig(t *testing.T) {
	for _, name := range []string{chartDefault, chartAllOptions} {
		t.Run(name, func(t *testing.T) {
			values := repoFile(t, chartDir+"/values.yaml")
			if name != chartDefault {
				values = repoFile(t, name)
			}
			b := loadBundle(t, name)
			doc := b.configMap.Data[b.configKey]
			// The chart names the checkpoint ConfigMap (and with sharding
			// the Leases) after the release where the values do not.
			want := yamlMap(t, values)["config"].(map[string]any)
			if cp, _ := want["checkpoint"].(map[string]any); cp["name"] == nil {
				if cp == nil {
					cp = map[string]any{}
				}
				cp["name"] = "relayd-checkpoint"
				want["checkpoint"] = cp
			}
			if sh, _ := want["sharding"].(map[string]any); sh["enabled"] == true && sh["leasePrefix"] == nil {
				sh["leasePrefix"] = "relayd"
			}
			if got := yamlMap(t, doc); !reflect.DeepEqual(got, want) {
				t.Errorf("the rendered config is not the values' config:\nrendered %v\nvalues   %v", got, want)
			}
			checkConfig(t, doc)
		})
	}

	checksum := func(values ...string) string {
		d := typed[appsv1.Deployment](t, find(t, renderChart(t, "relayd", "relayd", values...), "Deployment", ""))
		sum := d.Spec.Template.Annotations["checksum/config"]
		if len(sum) != 64 {
			t.Fatalf("pod template annotation checksum/config = %q, want a sha256", sum)
		}
		return sum
	}
	before := checksum()
	if checksum("config: {cluster: changed}\n") == before {
		t.Error("a config change does not change the pod template: no rollout")
	}
	if checksum("logLevel: debug\n") != before {
		t.Error("a change outside config changes the config checksum")
	}
}

// namespacedValues: ConfigMaps of one namespace only, named by kind (the
// plural in rbac.resources), and Deployments of all namespaces, named by
// resource; a cluster name of their own, so that the stream subjects and
// the index bucket are not the kustomize tests'.
func namespacedValues(watched string) string {
	return `config:
  cluster: helm-test
  nats:
    url: nats://nats.invalid:4222
    stream: {name: K8S, create: true}
  sources:
    - {name: configmaps, apiVersion: v1, kind: ConfigMap, namespaces: [` + watched + `]}
    - {name: deployments, resource: {group: apps, version: v1, resource: deployments}}
rbac:
  resources: {configmaps: configmaps}
`
}

// TestHelmChartRBACIsEnoughAndEveryPermissionIsNeeded: the chart, installed
// on a real apiserver (server-side apply) and run as the chart's
// ServiceAccount, watching ConfigMaps of one namespace (a Role there) and
// Deployments of all (the ClusterRole): relayd relays a change of each to
// NATS and writes its checkpoint; without any one permission the chart
// computed, relayd fails naming it. The same check as for the kustomize
// base.
func TestHelmChartRBACIsEnoughAndEveryPermissionIsNeeded(t *testing.T) {
	watched := fmt.Sprintf("helm-watched-%d", time.Now().UnixNano()) // new per run: -count=N works
	objs := renderChart(t, "relayd-helm", "relayd-helm", namespacedValues(watched))
	var roles []string
	for _, p := range permissions(t, objs) {
		roles = append(roles, fmt.Sprintf("%s %s/%s: %s %s", p.roleKind, p.namespace, p.roleName, p.verb, p.resource))
	}
	want := []string{
		"ClusterRole /relayd:relayd-helm:relayd-helm: list deployments",
		"ClusterRole /relayd:relayd-helm:relayd-helm: watch deployments",
		"Role " + watched + "/relayd-helm-watch: list configmaps",
		"Role " + watched + "/relayd-helm-watch: watch configmaps",
		"Role relayd-helm/relayd-helm-checkpoint: get configmaps",
		"Role relayd-helm/relayd-helm-checkpoint: update configmaps",
	}
	sort.Strings(roles)
	if !slices.Equal(roles, want) {
		t.Fatalf("the chart grants %q, want %q", roles, want)
	}
	in := newInstallOfBundle(t, env, natsSrv.URL(), bundleOf(t, chartDir, objs), nil)
	// As applied, in full: resourceNames included.
	core, list, rw := []string{""}, []string{"list", "watch"}, []string{"get", "update"}
	checkAppliedRules(t, in.c, objs, []string{
		rule("ClusterRole /relayd:relayd-helm:relayd-helm", []string{"apps"}, []string{"deployments"}, nil, list),
		rule("Role "+watched+"/relayd-helm-watch", core, []string{"configmaps"}, nil, list),
		rule("Role relayd-helm/relayd-helm-checkpoint", core, []string{"configmaps"}, []string{"relayd-helm-checkpoint"}, rw),
	})
	checkRBACIsEnoughAndMinimal(t, in)
}

// TestHelmLintSchemaAndFailures: helm lint --strict passes with the
// default values and with every option on; the values schema refuses a
// wrong type and an unknown value with helm's schema error; the chart
// refuses, naming the value, what it cannot render safely.
func TestHelmLintSchemaAndFailures(t *testing.T) {
	for _, values := range [][]string{nil, {repoFile(t, chartAllOptions)}} {
		if out, err := helm(t, []string{"lint", "--strict", chartDir}, values...); err != nil {
			t.Errorf("helm lint: %v\n%s", err, out)
		} else if !strings.Contains(string(out), "1 chart(s) linted, 0 chart(s) failed") {
			t.Errorf("helm lint says:\n%s", out)
		}
	}

	// Each case's values go on top of the chart's defaults (ConfigMaps and
	// Deployments, by resource); helm merges maps and replaces lists.
	const schemaErr = "values don't meet the specifications of the schema(s)"
	for _, tc := range []struct{ name, values, want string }{
		{"wrong type", "replicas: two\n", schemaErr},
		{"wrong type, named", "replicas: two\n", "'/replicas'"},
		{"unknown value", "replica: 2\n", schemaErr},
		{"unknown value, named", "replica: 2\n", "'replica'"},
		{"not an enum value", "logLevel: verbose\n", "'/logLevel'"},
		{"a filter on Secrets without allowSecretData",
			"config: {sources: [{name: s, resource: {version: v1, resource: secrets}, payload: reference, filter: 'true'}]}\n", "'/config/sources/0/filter'"},
		{"managedFields of Secrets without allowSecretData",
			"config: {sources: [{name: s, apiVersion: v1, kind: Secret, payload: metadata, keepManagedFields: true}]}\nrbac: {resources: {s: secrets}}\n", "'/config/sources/0/keepManagedFields'"},
		{"a source both by kind and by resource",
			"config: {sources: [{name: configmaps, apiVersion: v1, kind: ConfigMap, resource: {version: v1, resource: configmaps}}]}\n",
			`source "configmaps": name it either by resource: or by apiVersion + kind, not both`},
		{"a source by neither", "config: {sources: [{name: widgets, apiVersion: example.com/v1}]}\n",
			`source "widgets": name its resource, by resource: {group, version, resource} or by apiVersion + kind`},
		{"kind without an RBAC resource", "config: {sources: [{name: widgets, apiVersion: example.com/v1, kind: Widget}]}\n",
			`source "widgets": give rbac.resources.widgets (the plural resource name of kind Widget in example.com/v1, as ` + "`kubectl api-resources`" + ` lists it) for a source named by apiVersion and kind`},
		{"RBAC resource of no source", "rbac: {resources: {confgimaps: configmaps}}\n", `rbac.resources.confgimaps: no source is named "confgimaps"`},
		{"RBAC resource of a source named by resource", "rbac: {resources: {deployments: deployments}}\n", `rbac.resources.deployments: source "deployments" is named by resource:`},
		{"two replicas without sharding", "replicas: 2\n", "replicas > 1 needs config.sharding.enabled: true"},
		{"grace period below the drain timeout", "config: {shutdown: {drainTimeout: 1m}}\n", "terminationGracePeriodSeconds 45 is below config.shutdown.drainTimeout (60s) + 10s"},
		{"NATS file without the Secret", "config: {nats: {credentialsFile: /etc/relayd-nats/relayd.creds}}\n",
			`config.nats.credentialsFile is "/etc/relayd-nats/relayd.creds", but natsSecret.name is empty`},
		{"NATS file outside the Secret", "natsSecret: {name: relayd-nats}\nconfig: {nats: {tls: {caFile: /etc/ssl/ca.crt}}}\n",
			`config.nats.tls.caFile "/etc/ssl/ca.crt" is not a file of the Secret relayd-nats mounted at natsSecret.mountPath /etc/relayd-nats`},
		{"NetworkPolicy without the apiserver's address",
			"networkPolicy: {enabled: true, nats: {cidrs: [10.1.0.0/16]}, prometheus: {namespaceSelector: {matchLabels: {a: b}}}}\n", "networkPolicy.apiServer.cidrs"},
		{"NetworkPolicy without NATS",
			"networkPolicy: {enabled: true, apiServer: {cidrs: [10.0.0.1/32]}, prometheus: {namespaceSelector: {matchLabels: {a: b}}}}\n", "networkPolicy.nats: give cidrs or a namespaceSelector/podSelector"},
		{"NetworkPolicy without Prometheus",
			"networkPolicy: {enabled: true, apiServer: {cidrs: [10.0.0.1/32]}, nats: {cidrs: [10.1.0.0/16]}}\n", "networkPolicy.prometheus: give a namespaceSelector and/or podSelector"},
		{"NetworkPolicy without DNS",
			"networkPolicy: {enabled: true, apiServer: {cidrs: [10.0.0.1/32]}, nats: {cidrs: [10.1.0.0/16]}, prometheus: {namespaceSelector: {matchLabels: {a: b}}}, dns: null}\n",
			"networkPolicy.dns: give a namespaceSelector and/or podSelector"},
		// A value set to null is dropped by helm's merge, after which the
		// schema cannot see it: the chart still names it, and never renders
		// a rule without a port (which would admit every port).
		{"NetworkPolicy with NATS null",
			"networkPolicy: {enabled: true, apiServer: {cidrs: [10.0.0.1/32]}, nats: null, prometheus: {namespaceSelector: {matchLabels: {a: b}}}}\n",
			"networkPolicy.nats: give cidrs or a namespaceSelector/podSelector"},
		{"NetworkPolicy without the apiserver's port",
			"networkPolicy: {enabled: true, apiServer: {cidrs: [10.0.0.1/32], port: null}, nats: {cidrs: [10.1.0.0/16]}, prometheus: {namespaceSelector: {matchLabels: {a: b}}}}\n",
			"networkPolicy.apiServer.port: give the apiserver's port"},
		{"NetworkPolicy without the NATS port",
			"networkPolicy: {enabled: true, apiServer: {cidrs: [10.0.0.1/32]}, nats: {cidrs: [10.1.0.0/16], port: null}, prometheus: {namespaceSelector: {matchLabels: {a: b}}}}\n",
			"networkPolicy.nats.port: give the NATS client port"},
	} {
		_, err := helm(t, []string{"template", "relayd", chartDir}, tc.values)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want an error with %q", tc.name, err, tc.want)
		}
	}
}

// TestHelmChartRefusesValuesThatWidenRBAC: a value the RBAC templates
// render (a source's group, resource, apiVersion or namespaces, a plural in
// rbac.resources, the checkpoint's or a Lease's name and namespace) that is
// not a Kubernetes name is refused by the values schema, naming it, in both
// `helm template` and `helm lint --strict`: a comma list, "*", a quote, a
// newline, a YAML injection would otherwise grant more than the source
// needs (a comma list or an injection in a resource renders a Secrets
// grant). With the schema skipped (--skip-schema-validation) the chart
// itself refuses what it would render into RBAC, naming the key. The other
// values rendered into the pod (kind, version, image, mount path) are held
// to their patterns too.
func TestHelmChartRefusesValuesThatWidenRBAC(t *testing.T) {
	const schemaErr = "values don't meet the specifications of the schema(s)"
	src := func(s string) string { return "config: {sources: [" + s + "]}\n" }
	byResource := func(group, resource string) string {
		return src(`{name: cms, resource: {group: ` + group + `, version: v1, resource: ` + resource + `}}`)
	}
	widgets := func(apiVersion, kind, plural string) string {
		return src(`{name: widgets, apiVersion: `+apiVersion+`, kind: `+kind+`}`) + "rbac: {resources: {widgets: " + plural + "}}\n"
	}
	inNamespace := func(ns string) string {
		return src(`{name: cms, resource: {group: "", version: v1, resource: configmaps}, namespaces: [` + ns + `]}`)
	}
	for _, tc := range []struct {
		name, values string
		path         string // the schema's path of the value
		chart        string // the chart's own words with the schema skipped; "" for values not rendered into RBAC
	}{
		{"a comma list as a resource", byResource(`""`, `"configmaps,secrets"`), "/config/sources/0/resource/resource", "config.sources[0].resource.resource"},
		{"a wildcard resource", byResource(`""`, `"*"`), "/config/sources/0/resource/resource", "config.sources[0].resource.resource"},
		{"a YAML injection in a resource", byResource(`""`, `"x]\n- secrets"`), "/config/sources/0/resource/resource", "config.sources[0].resource.resource"},
		{"a rule injected by a resource", byResource(`""`, `"configmaps]\n  verbs: [list, watch]\n- apiGroups: [\"\"]\n  resources: [secrets"`), "/config/sources/0/resource/resource", "config.sources[0].resource.resource"},
		{"a subresource", byResource(`""`, `pods/exec`), "/config/sources/0/resource/resource", "config.sources[0].resource.resource"},
		{"a quote in a resource", byResource(`""`, `"configmaps\""`), "/config/sources/0/resource/resource", "config.sources[0].resource.resource"},
		{"an empty resource", byResource(`""`, `""`), "/config/sources/0/resource/resource", ""},
		{"a wildcard group", byResource(`"*"`, `configmaps`), "/config/sources/0/resource/group", "config.sources[0].resource.group"},
		{"a comma list as a group", byResource(`"apps,batch"`, `deployments`), "/config/sources/0/resource/group", "config.sources[0].resource.group"},
		{"a newline in a group", byResource(`"apps\n"`, `deployments`), "/config/sources/0/resource/group", "config.sources[0].resource.group"},
		{"an upper-case group", byResource(`Apps`, `deployments`), "/config/sources/0/resource/group", "config.sources[0].resource.group"},
		{"a bracket in a version", src(`{name: cms, resource: {group: "", version: "v1]", resource: configmaps}}`), "/config/sources/0/resource/version", ""},
		{"a wildcard group by apiVersion", widgets(`"*/v1"`, `Widget`, `widgets`), "/config/sources/0/apiVersion", "config.sources[0].apiVersion"},
		{"a comma list in an apiVersion", widgets(`"example.com,apps/v1"`, `Widget`, `widgets`), "/config/sources/0/apiVersion", "config.sources[0].apiVersion"},
		{"a newline in a kind", widgets(`example.com/v1`, `"Widget\n- secrets"`, `widgets`), "/config/sources/0/kind", ""},
		{"a wildcard in rbac.resources", widgets(`example.com/v1`, `Widget`, `"*"`), "/rbac/resources/widgets", "rbac.resources.widgets"},
		{"a YAML injection in rbac.resources", widgets(`example.com/v1`, `Widget`, `"widgets]\n- secrets"`), "/rbac/resources/widgets", "rbac.resources.widgets"},
		{"a dotted plural in rbac.resources", widgets(`example.com/v1`, `Widget`, `"widgets.example.com"`), "/rbac/resources/widgets", "rbac.resources.widgets"},
		{"a comma list as a namespace", inNamespace(`"shop,kube-system"`), "/config/sources/0/namespaces/0", "config.sources[0].namespaces[0]"},
		{"a wildcard namespace", inNamespace(`"*"`), "/config/sources/0/namespaces/0", "config.sources[0].namespaces[0]"},
		{"a newline in a namespace", inNamespace(`"shop\nkind: ClusterRole"`), "/config/sources/0/namespaces/0", "config.sources[0].namespaces[0]"},
		{"a comma list as the checkpoint name", "config: {checkpoint: {name: \"relayd-checkpoint, kube-root-ca.crt\"}}\n", "/config/checkpoint/name", "config.checkpoint.name"},
		{"a rule injected by the checkpoint name", "config: {checkpoint: {name: \"relayd-checkpoint]\\n    verbs: [get, update]\\n  - apiGroups: ['']\\n    resources: [secrets\"}}\n", "/config/checkpoint/name", "config.checkpoint.name"},
		{"a wildcard checkpoint namespace", "config: {checkpoint: {namespace: \"*\"}}\n", "/config/checkpoint/namespace", "config.checkpoint.namespace"},
		{"a comma list as the Lease prefix", "config: {sharding: {enabled: true, leasePrefix: \"relayd, kube-scheduler\"}}\n", "/config/sharding/leasePrefix", "config.sharding.leasePrefix"},
		{"a quote in the image repository", "image: {repository: \"evil\\\"\\n\"}\n", "/image/repository", ""},
		{"a newline in the image tag", "image: {tag: \"1.0\\ncommand: [sh]\"}\n", "/image/tag", ""},
		{"a newline in the NATS Secret's mount path", "natsSecret: {name: relayd-nats, mountPath: \"/etc/relayd-nats\\n  readOnly: false\"}\n", "/natsSecret/mountPath", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, args := range [][]string{{"template", "relayd", chartDir}, {"lint", "--strict", chartDir}} {
				out, err := helm(t, args, tc.values)
				if err == nil {
					t.Errorf("helm %s accepts %q; the rules it renders:\n%s", args[0], tc.values, ruleLines(out))
					continue
				}
				if msg := string(out) + err.Error(); !strings.Contains(msg, schemaErr) || !strings.Contains(msg, "'"+tc.path+"'") {
					t.Errorf("helm %s: %s\nwant the schema's error naming '%s'", args[0], msg, tc.path)
				}
			}
			if tc.chart == "" {
				return
			}
			out, err := helm(t, []string{"template", "relayd", chartDir, "--skip-schema-validation"}, tc.values)
			if err == nil || !strings.Contains(err.Error(), tc.chart) {
				t.Errorf("with the schema skipped: %v; want the chart's error naming %s\n%s", err, tc.chart, out)
			}
		})
	}
}

// ruleLines: the lines of a render that say what a role grants.
func ruleLines(out []byte) string {
	var keep []string
	for _, l := range strings.Split(string(out), "\n") {
		if t := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(l), "- ")); strings.HasPrefix(t, "apiGroups:") || strings.HasPrefix(t, "resources:") ||
			strings.HasPrefix(t, "resourceNames:") || strings.HasPrefix(t, "kind: ") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

// TestHelmChartRBACOfEdgeValuesOnTheAPIServer: values at the edges of what
// the schema admits (the core group, groups with dots, by resource and by
// kind, cluster-scoped kinds, two namespaces, a checkpoint name with a dot,
// sharding's Leases) render, `helm lint --strict` passes, every object is
// accepted by a real apiserver (server-side apply), and the ServiceAccount
// may do exactly what the chart computed: the apiserver's authorizer allows
// each rendered permission and refuses its neighbours (Secrets, another
// namespace, cluster-wide for a namespaced source, a write).
func TestHelmChartRBACOfEdgeValuesOnTheAPIServer(t *testing.T) {
	run := time.Now().UnixNano() // new names per run: -count=N works
	release, ns := "relayd-edge", fmt.Sprintf("relayd-edge-%d", run)
	shop, staging := fmt.Sprintf("edge-shop-%d", run), fmt.Sprintf("edge-shop-staging-%d", run)
	values := `config:
  cluster: helm-edge
  nats: {url: "nats://nats.invalid:4222", stream: {name: K8S, create: true}}
  checkpoint: {name: relayd.positions-1}
  sharding: {enabled: true, leasePrefix: relayd-edge}
  sources:
    - {name: ingresses, apiVersion: networking.k8s.io/v1, kind: Ingress}
    - {name: cms, resource: {group: "", version: v1, resource: configmaps}, namespaces: [` + shop + `, ` + staging + `]}
    - {name: pdbs, resource: {group: policy, version: v1, resource: poddisruptionbudgets}, namespaces: [` + shop + `]}
    - {name: csrs, resource: {group: certificates.k8s.io, version: v1, resource: certificatesigningrequests}}
    - {name: flows, apiVersion: flowcontrol.apiserver.k8s.io/v1, kind: FlowSchema}
rbac:
  resources: {ingresses: ingresses, flows: flowschemas}
replicas: 2
image:
  repository: registry.example.com:5000/platform/relayd
  digest: sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
natsSecret: {name: relayd.nats-1, mountPath: /etc/relayd-nats/}
`
	if out, err := helm(t, []string{"lint", "--strict", chartDir}, values); err != nil {
		t.Fatalf("helm lint: %v\n%s", err, out)
	}
	objs := renderChart(t, release, ns, values)
	var got []string
	for _, p := range permissions(t, objs) {
		got = append(got, fmt.Sprintf("%s %s: %s", p.roleKind, p.namespace, p))
	}
	leases := "relayd-edge-ingresses,relayd-edge-cms,relayd-edge-pdbs,relayd-edge-csrs,relayd-edge-flows" // in the sources' order
	want := []string{
		"ClusterRole : list certificatesigningrequests.certificates.k8s.io (ClusterRole relayd:" + ns + ":relayd-edge)",
		"ClusterRole : list flowschemas.flowcontrol.apiserver.k8s.io (ClusterRole relayd:" + ns + ":relayd-edge)",
		"ClusterRole : list ingresses.networking.k8s.io (ClusterRole relayd:" + ns + ":relayd-edge)",
		"ClusterRole : watch certificatesigningrequests.certificates.k8s.io (ClusterRole relayd:" + ns + ":relayd-edge)",
		"ClusterRole : watch flowschemas.flowcontrol.apiserver.k8s.io (ClusterRole relayd:" + ns + ":relayd-edge)",
		"ClusterRole : watch ingresses.networking.k8s.io (ClusterRole relayd:" + ns + ":relayd-edge)",
		"Role " + ns + ": get configmaps relayd.positions-1 (Role relayd-edge-checkpoint)",
		"Role " + ns + ": get leases.coordination.k8s.io " + leases + " (Role relayd-edge-leases)",
		"Role " + shop + ": list configmaps (Role relayd-edge-watch)",
		"Role " + shop + ": list poddisruptionbudgets.policy (Role relayd-edge-watch)",
		"Role " + staging + ": list configmaps (Role relayd-edge-watch)",
		"Role " + ns + ": update configmaps relayd.positions-1 (Role relayd-edge-checkpoint)",
		"Role " + ns + ": update leases.coordination.k8s.io " + leases + " (Role relayd-edge-leases)",
		"Role " + shop + ": watch configmaps (Role relayd-edge-watch)",
		"Role " + shop + ": watch poddisruptionbudgets.policy (Role relayd-edge-watch)",
		"Role " + staging + ": watch configmaps (Role relayd-edge-watch)",
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("the chart grants\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	d := typed[appsv1.Deployment](t, find(t, objs, "Deployment", release))
	if img := d.Spec.Template.Spec.Containers[0].Image; img != "registry.example.com:5000/platform/relayd@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef" {
		t.Errorf("image %q, want the repository by digest", img)
	}

	c := newCluster(t, env)
	for _, o := range objs {
		if o.GetNamespace() != "" {
			c.ensureNamespace(t, o.GetNamespace())
		}
	}
	for _, o := range objs {
		c.apply(t, o)
	}
	// As applied, in full, rules in the chart's order.
	core, list, rw := []string{""}, []string{"list", "watch"}, []string{"get", "update"}
	checkAppliedRules(t, c, objs, []string{
		rule("ClusterRole /relayd:"+ns+":"+release, []string{"networking.k8s.io"}, []string{"ingresses"}, nil, list),
		rule("ClusterRole /relayd:"+ns+":"+release, []string{"certificates.k8s.io"}, []string{"certificatesigningrequests"}, nil, list),
		rule("ClusterRole /relayd:"+ns+":"+release, []string{"flowcontrol.apiserver.k8s.io"}, []string{"flowschemas"}, nil, list),
		rule("Role "+ns+"/relayd-edge-checkpoint", core, []string{"configmaps"}, []string{"relayd.positions-1"}, rw),
		rule("Role "+ns+"/relayd-edge-leases", []string{"coordination.k8s.io"}, []string{"leases"}, strings.Split(leases, ","), rw),
		rule("Role "+shop+"/relayd-edge-watch", core, []string{"configmaps"}, nil, list),
		rule("Role "+shop+"/relayd-edge-watch", []string{"policy"}, []string{"poddisruptionbudgets"}, nil, list),
		rule("Role "+staging+"/relayd-edge-watch", core, []string{"configmaps"}, nil, list),
	})
	as := tokenClient(t, env, c.serviceAccountToken(t, ns, release))
	for _, p := range permissions(t, objs) {
		waitAccess(t, as, p, true)
	}
	for _, p := range []permission{
		{verb: "list", resource: "secrets", namespace: shop},
		{verb: "watch", resource: "secrets"},
		{verb: "list", resource: "configmaps"},
		{verb: "list", resource: "configmaps", namespace: ns},
		{verb: "list", group: "policy", resource: "poddisruptionbudgets", namespace: staging},
		{verb: "get", resource: "configmaps", namespace: ns, resourceNames: []string{"kube-root-ca.crt"}},
		{verb: "create", group: "networking.k8s.io", resource: "ingresses", namespace: shop},
		{verb: "list", group: "networking.k8s.io", resource: "networkpolicies"},
		{verb: "update", group: "coordination.k8s.io", resource: "leases", namespace: ns, resourceNames: []string{"kube-scheduler"}},
	} {
		waitAccess(t, as, p, false)
	}
}

// TestHelmChartSharding: with config.sharding.enabled the chart pre-creates
// one Lease per source (<leasePrefix>-<source>) in the checkpoint's
// namespace and grants get and update on exactly those, no more, rolls 3
// replicas one at a time and adds a PodDisruptionBudget; without sharding,
// none of it.
func TestHelmChartSharding(t *testing.T) {
	b := loadBundle(t, chartAllOptions)
	if !b.cfg.Sharding.Enabled {
		t.Fatal("the all-options values do not enable sharding")
	}
	want := sets.New[string]()
	for _, src := range b.cfg.Sources {
		want.Insert(b.namespace() + "/" + shard.LeaseName(b.cfg.Sharding.LeasePrefix, src.Name))
	}
	got := sets.New[string]()
	for _, o := range ofKind(b.objs, "Lease") {
		got.Insert(o.GetNamespace() + "/" + o.GetName())
	}
	if !got.Equal(want) || len(ofKind(b.objs, "Lease")) != want.Len() {
		t.Errorf("Leases %v, want one per source %v", sets.List(got), sets.List(want))
	}
	var names []string
	for n := range want {
		names = append(names, strings.TrimPrefix(n, b.namespace()+"/"))
	}
	slices.Sort(names)
	var leasePerms []string
	for _, p := range permissions(t, b.objs) {
		if p.resource == "leases" {
			rn := slices.Clone(p.resourceNames)
			slices.Sort(rn)
			leasePerms = append(leasePerms, fmt.Sprintf("%s %s %s/%s %s", p.roleKind, p.namespace, p.group, p.verb, strings.Join(rn, ",")))
		}
	}
	wantPerms := []string{
		"Role " + b.namespace() + " coordination.k8s.io/get " + strings.Join(names, ","),
		"Role " + b.namespace() + " coordination.k8s.io/update " + strings.Join(names, ","),
	}
	if !slices.Equal(leasePerms, wantPerms) {
		t.Errorf("Lease permissions %q, want %q", leasePerms, wantPerms)
	}
	d := b.deployment.Spec
	if *d.Replicas != 3 || d.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType || d.Strategy.RollingUpdate.MaxUnavailable.IntValue() != 0 || d.Strategy.RollingUpdate.MaxSurge.IntValue() != 1 {
		t.Errorf("sharded Deployment: replicas %d, strategy %+v", *d.Replicas, d.Strategy)
	}
	pdb := typed[policyv1.PodDisruptionBudget](t, find(t, b.objs, "PodDisruptionBudget", ""))
	if sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector); err != nil || !sel.Matches(labels.Set(d.Template.Labels)) || pdb.Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("PodDisruptionBudget %+v does not allow one of the pods %v away at a time (%v)", pdb.Spec, d.Template.Labels, err)
	}

	off := loadBundle(t, chartDefault)
	for _, p := range permissions(t, off.objs) {
		if p.resource == "leases" {
			t.Errorf("without sharding the chart grants %s", p)
		}
	}
	if n := len(ofKind(off.objs, "Lease")) + len(ofKind(off.objs, "PodDisruptionBudget")); n > 0 {
		t.Errorf("without sharding the chart renders %d Leases and PodDisruptionBudgets", n)
	}
	if d := off.deployment.Spec; *d.Replicas != 1 || d.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		t.Errorf("without sharding: replicas %d, strategy %s; want 1, Recreate", *d.Replicas, d.Strategy.Type)
	}
}

// TestHelmChartMonitoring: the PrometheusRule holds exactly the rule groups
// of deploy/prometheus/relayd-rules.yaml, the dashboard ConfigMap exactly
// deploy/grafana/relayd.json (labelled for the Grafana sidecar), the
// chart's copies of both are byte-identical to them, and the
// ServiceMonitor scrapes the Service's metrics port as job "relayd"; none
// of it by default.
func TestHelmChartMonitoring(t *testing.T) {
	for _, f := range [][2]string{
		{chartDir + "/files/relayd-rules.yaml", "deploy/prometheus/relayd-rules.yaml"},
		{chartDir + "/files/relayd-dashboard.json", "deploy/grafana/relayd.json"},
	} {
		if repoFile(t, f[0]) != repoFile(t, f[1]) {
			t.Errorf("%s differs from %s: copy it again (cp %s %s)", f[0], f[1], f[1], f[0])
		}
	}
	b := loadBundle(t, chartAllOptions)
	extraLabels := yamlMap(t, repoFile(t, chartAllOptions))["monitoring"].(map[string]any)["labels"].(map[string]any)

	// Compared as JSON values: the same rules whatever the YAML style.
	asJSON := func(v any) string {
		out, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	}
	rule := find(t, b.objs, "PrometheusRule", "relayd")
	got, _, _ := unstructured.NestedSlice(rule.Object, "spec", "groups")
	want, _ := yamlMap(t, repoFile(t, "deploy/prometheus/relayd-rules.yaml"))["groups"].([]any)
	if len(want) == 0 || asJSON(got) != asJSON(want) {
		t.Errorf("PrometheusRule groups differ from deploy/prometheus/relayd-rules.yaml:\n%s\n%s", asJSON(got), asJSON(want))
	}
	if spec, _, _ := unstructured.NestedMap(rule.Object, "spec"); len(spec) != 1 {
		t.Errorf("PrometheusRule spec has more than groups: %v", spec)
	}

	dash := typed[corev1.ConfigMap](t, find(t, b.objs, "ConfigMap", "relayd-dashboard"))
	if dash.Labels["grafana_dashboard"] != "1" {
		t.Errorf("dashboard ConfigMap labels %v, want grafana_dashboard: \"1\"", dash.Labels)
	}
	if dash.Data["relayd.json"] != repoFile(t, "deploy/grafana/relayd.json") {
		t.Error("the dashboard ConfigMap's relayd.json is not deploy/grafana/relayd.json")
	}

	sm := find(t, b.objs, "ServiceMonitor", "relayd")
	match, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
	for k, v := range match {
		if b.service.Labels[k] != v {
			t.Errorf("ServiceMonitor selects %s=%s; the Service's labels are %v", k, v, b.service.Labels)
		}
	}
	if jobLabel, _, _ := unstructured.NestedString(sm.Object, "spec", "jobLabel"); len(match) == 0 || b.service.Labels[jobLabel] != "relayd" {
		t.Errorf("ServiceMonitor jobLabel %q: the job label would be %q, the alert rules select job=\"relayd\"", jobLabel, b.service.Labels[jobLabel])
	}
	eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	if len(eps) != 1 || eps[0].(map[string]any)["port"] != "metrics" || eps[0].(map[string]any)["path"] != "/metrics" {
		t.Errorf("ServiceMonitor endpoints %v, want port metrics, path /metrics", eps)
	}
	if len(b.service.Spec.Ports) != 1 || b.service.Spec.Ports[0].Name != "metrics" || b.service.Spec.Ports[0].TargetPort.StrVal != "metrics" {
		t.Errorf("Service ports %+v, want one named metrics targeting the container's metrics port", b.service.Spec.Ports)
	}
	if sel, podLabels := b.service.Spec.Selector, b.deployment.Spec.Template.Labels; len(sel) == 0 || !labelsMatch(sel, podLabels) {
		t.Errorf("Service selects %v; the pods are labelled %v", sel, podLabels)
	}
	for _, o := range []*unstructured.Unstructured{sm, rule} {
		for k, v := range extraLabels {
			if o.GetLabels()[k] != v {
				t.Errorf("%s lacks monitoring.labels %s=%v: %v", describe(o), k, v, o.GetLabels())
			}
		}
	}

	def := loadBundle(t, chartDefault)
	for _, kind := range []string{"ServiceMonitor", "PrometheusRule", "NetworkPolicy"} {
		if n := len(ofKind(def.objs, kind)); n > 0 {
			t.Errorf("the default values render %d %s (optional, off by default)", n, kind)
		}
	}
	if len(ofKind(def.objs, "ConfigMap")) != 2 {
		t.Errorf("the default values render ConfigMaps %v, want the config and the checkpoint only", ofKind(def.objs, "ConfigMap"))
	}
}

func labelsMatch(selector, labels map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// TestHelmChartNetworkPolicy: with networkPolicy.enabled the chart renders
// a policy for relayd's pods that admits Prometheus on the metrics port
// only and lets relayd reach only the apiserver, NATS and DNS; a peer's
// empty selector is left out (a podSelector alone means the release's
// namespace, as Kubernetes reads it).
func TestHelmChartNetworkPolicy(t *testing.T) {
	b := loadBundle(t, chartAllOptions)
	np := typed[networkingv1.NetworkPolicy](t, find(t, b.objs, "NetworkPolicy", "relayd"))
	checkNetworkPolicy(t, "chart", np, b.deployment.Spec.Template.Labels,
		[]string{"[ns{kubernetes.io/metadata.name=monitoring} pods{app.kubernetes.io/name=prometheus}] metrics/TCP"},
		[]string{
			"[10.0.0.1/32 | 10.0.0.2/32] 6443/TCP",
			"[192.168.10.0/24 | ns{kubernetes.io/metadata.name=nats} pods{app.kubernetes.io/name=nats}] 4222/TCP",
			"[ns{kubernetes.io/metadata.name=kube-system} pods{k8s-app=kube-dns}] 53/UDP",
			"[ns{kubernetes.io/metadata.name=kube-system} pods{k8s-app=kube-dns}] 53/TCP",
		})

	objs := renderChart(t, "relayd", "relayd", `networkPolicy:
  enabled: true
  apiServer: {cidrs: [172.20.0.1/32]}
  nats: {podSelector: {matchLabels: {app: nats}}}
  prometheus: {namespaceSelector: {matchLabels: {team: obs}}}
`)
	np = typed[networkingv1.NetworkPolicy](t, find(t, objs, "NetworkPolicy", "relayd"))
	checkNetworkPolicy(t, "chart, NATS by pod selector", np, typed[appsv1.Deployment](t, find(t, objs, "Deployment", "")).Spec.Template.Labels,
		[]string{"[ns{team=obs}] metrics/TCP"},
		[]string{
			"[172.20.0.1/32] 443/TCP",
			"[pods{app=nats}] 4222/TCP",
			"[ns{kubernetes.io/metadata.name=kube-system} pods{k8s-app=kube-dns}] 53/UDP",
			"[ns{kubernetes.io/metadata.name=kube-system} pods{k8s-app=kube-dns}] 53/TCP",
		})
}

// TestNetworkPolicyComponent: the kustomize Component
// deploy/components/networkpolicy, added to an overlay of the base, builds
// and renders the chart's policy for the base's pods, with its
// placeholders; with the patch docs/DEPLOY.md shows, with the patched
// apiserver address and port.
func TestNetworkPolicyComponent(t *testing.T) {
	root := testutil.RepoRootT(t)
	build := func(overlay string) []*unstructured.Unstructured {
		dir := t.TempDir()
		rel := func(p string) string { // kustomize takes relative paths only
			r, err := filepath.Rel(dir, filepath.Join(root, p))
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		overlay = strings.ReplaceAll(overlay, "../../components/networkpolicy", rel("deploy/components/networkpolicy"))
		k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - " + rel(baseDir) + "\n" + overlay
		if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o600); err != nil {
			t.Fatal(err)
		}
		return render(t, dir)
	}
	rest := []string{
		"[ns{kubernetes.io/metadata.name=nats} pods{app.kubernetes.io/name=nats}] 4222/TCP",
		"[ns{kubernetes.io/metadata.name=kube-system} pods{k8s-app=kube-dns}] 53/UDP",
		"[ns{kubernetes.io/metadata.name=kube-system} pods{k8s-app=kube-dns}] 53/TCP",
	}
	ingress := []string{"[ns{kubernetes.io/metadata.name=monitoring}] metrics/TCP"}

	objs := build("namespace: relayd-np\ncomponents:\n  - ../../components/networkpolicy\n")
	np := typed[networkingv1.NetworkPolicy](t, find(t, objs, "NetworkPolicy", "relayd"))
	d := typed[appsv1.Deployment](t, find(t, objs, "Deployment", "relayd"))
	if np.Namespace != "relayd-np" || d.Namespace != np.Namespace {
		t.Errorf("the policy is in namespace %q, relayd in %q; want both in the overlay's relayd-np", np.Namespace, d.Namespace)
	}
	podLabels := d.Spec.Template.Labels
	checkNetworkPolicy(t, "component", np, podLabels, ingress, append([]string{"[10.0.0.1/32] 443/TCP"}, rest...))

	// The overlay of docs/DEPLOY.md's Helm section.
	var documented string
	for _, block := range strings.Split(repoFile(t, "docs/DEPLOY.md"), "```yaml\n")[1:] {
		block = block[:strings.Index(block, "```")]
		if strings.Contains(block, "components/networkpolicy") {
			documented = block
		}
	}
	if documented == "" {
		t.Fatal("docs/DEPLOY.md shows no overlay using deploy/components/networkpolicy")
	}
	objs = build(documented)
	np = typed[networkingv1.NetworkPolicy](t, find(t, objs, "NetworkPolicy", "relayd"))
	if d := find(t, objs, "Deployment", "relayd"); np.Namespace == "" || np.Namespace != d.GetNamespace() {
		t.Errorf("docs/DEPLOY.md's overlay puts the policy in namespace %q, relayd in %q", np.Namespace, d.GetNamespace())
	}
	checkNetworkPolicy(t, "component as patched in docs/DEPLOY.md", np, podLabels, ingress, append([]string{"[172.20.0.10/32] 6443/TCP"}, rest...))
}

// checkNetworkPolicy: the policy selects relayd's pods, is both Ingress and
// Egress, and has exactly the rules given, one "[peers] port/protocol" per
// port, the peers separated by " | ".
func checkNetworkPolicy(t *testing.T, what string, np *networkingv1.NetworkPolicy, podLabels map[string]string, ingress, egress []string) {
	t.Helper()
	if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}) {
		t.Errorf("%s: policyTypes %v", what, np.Spec.PolicyTypes)
	}
	if sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector); err != nil || len(np.Spec.PodSelector.MatchLabels) == 0 || !sel.Matches(labels.Set(podLabels)) {
		t.Errorf("%s: the policy selects %v, the pods are labelled %v", what, np.Spec.PodSelector, podLabels)
	}
	selector := func(prefix string, s *metav1.LabelSelector) string {
		var kv []string
		for k, v := range s.MatchLabels {
			kv = append(kv, k+"="+v)
		}
		for _, e := range s.MatchExpressions {
			kv = append(kv, fmt.Sprintf("%s %s %v", e.Key, e.Operator, e.Values))
		}
		slices.Sort(kv)
		return prefix + "{" + strings.Join(kv, ",") + "}"
	}
	describeRules := func(peersOf func(i int) []networkingv1.NetworkPolicyPeer, portsOf func(i int) []networkingv1.NetworkPolicyPort, n int) []string {
		var out []string
		for i := range n {
			var peers []string
			for _, p := range peersOf(i) {
				var parts []string
				if p.IPBlock != nil {
					parts = append(parts, p.IPBlock.CIDR)
				}
				if p.NamespaceSelector != nil {
					parts = append(parts, selector("ns", p.NamespaceSelector))
				}
				if p.PodSelector != nil {
					parts = append(parts, selector("pods", p.PodSelector))
				}
				peers = append(peers, strings.Join(parts, " "))
			}
			// Peers apart ("|": either), a peer's parts together (" ":
			// both): a namespaceSelector and a podSelector in one peer
			// admit those pods of those namespaces, in two peers far more.
			for _, p := range portsOf(i) {
				out = append(out, fmt.Sprintf("[%s] %s/%s", strings.Join(peers, " | "), p.Port.String(), *p.Protocol))
			}
		}
		return out
	}
	in := describeRules(func(i int) []networkingv1.NetworkPolicyPeer { return np.Spec.Ingress[i].From },
		func(i int) []networkingv1.NetworkPolicyPort { return np.Spec.Ingress[i].Ports }, len(np.Spec.Ingress))
	out := describeRules(func(i int) []networkingv1.NetworkPolicyPeer { return np.Spec.Egress[i].To },
		func(i int) []networkingv1.NetworkPolicyPort { return np.Spec.Egress[i].Ports }, len(np.Spec.Egress))
	if !slices.Equal(in, ingress) {
		t.Errorf("%s: ingress %q, want %q", what, in, ingress)
	}
	if !slices.Equal(out, egress) {
		t.Errorf("%s: egress %q, want %q", what, out, egress)
	}
}
