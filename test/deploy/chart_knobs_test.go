package deploy

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
)

// sameJSON: a and b are the same JSON value (a rendered field against the
// values that set it, whatever the YAML style or the Go type).
func sameJSON(t testing.TB, a, b any) bool {
	t.Helper()
	ja, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	jb, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	var va, vb any
	if err := json.Unmarshal(ja, &va); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(jb, &vb); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprint(va) == fmt.Sprint(vb)
}

// subjects: every binding's subjects, as "<binding kind> <ns>/<name>:
// <kind> <ns>/<name>".
func subjects(t testing.TB, objs []*unstructured.Unstructured) []string {
	t.Helper()
	var out []string
	for _, o := range objs {
		var subs []rbacv1.Subject
		switch o.GetKind() {
		case "RoleBinding":
			subs = typed[rbacv1.RoleBinding](t, o).Subjects
		case "ClusterRoleBinding":
			subs = typed[rbacv1.ClusterRoleBinding](t, o).Subjects
		default:
			continue
		}
		for _, s := range subs {
			out = append(out, fmt.Sprintf("%s %s/%s: %s %s/%s", o.GetKind(), o.GetNamespace(), o.GetName(), s.Kind, s.Namespace, s.Name))
		}
	}
	return out
}

// TestHelmChartKnobs: every pod, ServiceAccount and ServiceMonitor option
// of ci/all-options-values.yaml lands where Kubernetes reads it (each
// object decoded strictly into its Go type, so a misplaced field fails):
// podAnnotations and podLabels on the pod template next to the chart's
// (the selector still selects the pods), priorityClassName,
// topologySpreadConstraints (one without a labelSelector gets this
// release's pods' labels), nodeSelector, tolerations, affinity,
// imagePullSecrets, the ServiceAccount's name and annotations (the pod
// runs as it and every binding binds it), extraEnv after the chart's
// variables, extraVolumes and extraVolumeMounts after the chart's,
// logFormat as --log-format, podSecurityContext and securityContext merged
// over the chart's defaults, and the ServiceMonitor's interval,
// scrapeTimeout, relabelings and metricRelabelings.
func TestHelmChartKnobs(t *testing.T) {
	v := yamlMap(t, repoFile(t, chartAllOptions))
	b := loadBundle(t, chartAllOptions)
	d := b.deployment
	pod := d.Spec.Template
	ps := pod.Spec
	c := b.container

	if pod.Annotations["example.com/team"] != "platform" || len(pod.Annotations["checksum/config"]) != 64 {
		t.Errorf("pod annotations %v, want podAnnotations' example.com/team: platform next to checksum/config", pod.Annotations)
	}
	if pod.Labels["example.com/cost-center"] != "4711" {
		t.Errorf("pod labels %v, want podLabels' example.com/cost-center: \"4711\"", pod.Labels)
	}
	if sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector); err != nil || !sel.Matches(labels.Set(pod.Labels)) {
		t.Errorf("the Deployment's selector %v does not select its pods %v (%v)", d.Spec.Selector, pod.Labels, err)
	}
	if ps.PriorityClassName != "platform-critical" {
		t.Errorf("priorityClassName %q, want platform-critical", ps.PriorityClassName)
	}
	for _, k := range []struct {
		key  string
		got  any
		want any
	}{
		{"nodeSelector", ps.NodeSelector, v["nodeSelector"]},
		{"tolerations", ps.Tolerations, v["tolerations"]},
		{"affinity", ps.Affinity, v["affinity"]},
		{"imagePullSecrets", ps.ImagePullSecrets, v["imagePullSecrets"]},
		{"extraVolumes", ps.Volumes[len(ps.Volumes)-1:], v["extraVolumes"]},
		{"extraVolumeMounts", c.VolumeMounts[len(c.VolumeMounts)-1:], v["extraVolumeMounts"]},
		{"extraEnv", c.Env[3:], v["extraEnv"]},
	} {
		if !sameJSON(t, k.got, k.want) {
			t.Errorf("%s renders %+v, want the values' %v", k.key, k.got, k.want)
		}
	}
	var chartEnv []string
	for _, e := range c.Env[:3] {
		chartEnv = append(chartEnv, e.Name)
	}
	if !slices.Equal(chartEnv, []string{"POD_NAMESPACE", "POD_NAME", "GOMEMLIMIT"}) {
		t.Errorf("the chart's variables %v, want them first, extraEnv after", chartEnv)
	}

	tsc := ps.TopologySpreadConstraints
	if len(tsc) != 2 {
		t.Fatalf("topologySpreadConstraints %+v, want the values' two", tsc)
	}
	if sel := tsc[0].LabelSelector; tsc[0].TopologyKey != "topology.kubernetes.io/zone" || tsc[0].WhenUnsatisfiable != corev1.ScheduleAnyway || tsc[0].MaxSkew != 1 ||
		sel == nil || !sameJSON(t, sel.MatchLabels, d.Spec.Selector.MatchLabels) {
		t.Errorf("topologySpreadConstraints[0] %+v, want the zone constraint with the release's pod selector %v filled in", tsc[0], d.Spec.Selector.MatchLabels)
	}
	if sel := tsc[1].LabelSelector; tsc[1].TopologyKey != "kubernetes.io/hostname" || sel == nil || !sameJSON(t, sel.MatchLabels, map[string]string{"app.kubernetes.io/name": "relayd"}) {
		t.Errorf("topologySpreadConstraints[1] %+v, want its own labelSelector kept", tsc[1])
	}

	sa := v["serviceAccount"].(map[string]any)
	if b.sa.Name != sa["name"] || !sameJSON(t, b.sa.Annotations, sa["annotations"]) || ps.ServiceAccountName != b.sa.Name {
		t.Errorf("ServiceAccount %s (annotations %v), pod runs as %q; want serviceAccount.name %v with %v", b.sa.Name, b.sa.Annotations, ps.ServiceAccountName, sa["name"], sa["annotations"])
	}
	subs := subjects(t, b.objs)
	if len(subs) == 0 {
		t.Error("the chart renders no binding")
	}
	for _, s := range subs {
		if !strings.HasSuffix(s, ": ServiceAccount "+b.namespace()+"/"+b.sa.Name) {
			t.Errorf("%s: want the ServiceAccount %s/%s", s, b.namespace(), b.sa.Name)
		}
	}

	if got := flagValue(c.Args, "log-format"); got != v["logFormat"] {
		t.Errorf("--log-format=%q, want logFormat %v", got, v["logFormat"])
	}

	psc := ps.SecurityContext
	if psc == nil || psc.FSGroup == nil || *psc.FSGroup != 1000650000 || psc.FSGroupChangePolicy == nil || *psc.FSGroupChangePolicy != corev1.FSGroupChangeOnRootMismatch ||
		psc.RunAsUser == nil || *psc.RunAsUser != 65532 || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
		t.Errorf("pod securityContext %+v, want podSecurityContext's fsGroup 1000650000 and fsGroupChangePolicy merged over the defaults (uid 65532, runAsNonRoot)", psc)
	}
	sc := c.SecurityContext
	if sc == nil || sc.Privileged == nil || *sc.Privileged || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("container securityContext %+v, want securityContext's privileged: false merged over the defaults", sc)
	}

	want := v["monitoring"].(map[string]any)["serviceMonitor"].(map[string]any)
	sm := find(t, b.objs, "ServiceMonitor", "relayd")
	eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	if len(eps) != 1 {
		t.Fatalf("ServiceMonitor endpoints %v, want one", eps)
	}
	ep := eps[0].(map[string]any)
	for _, k := range []string{"interval", "scrapeTimeout", "relabelings", "metricRelabelings"} {
		if !sameJSON(t, ep[k], want[k]) {
			t.Errorf("ServiceMonitor endpoint %s = %v, want monitoring.serviceMonitor.%s %v", k, ep[k], k, want[k])
		}
	}
}

// TestHelmChartKnobsOff: rbac.create: false renders no Role, ClusterRole
// or binding (the checkpoint ConfigMap and the Leases still); an existing
// ServiceAccount (serviceAccount.create: false) is not rendered, the pod
// runs as it and the bindings bind it, and without its name the chart
// fails saying so; OpenShift's form of the security context
// (podSecurityContext runAsUser and runAsGroup null) renders no uid, gid
// or fsGroup, even with the NATS Secret, and keeps the rest; the chart and
// the schema refuse what would break the pod, naming the value.
func TestHelmChartKnobsOff(t *testing.T) {
	sharded := "config: {sharding: {enabled: true}}\n"
	objs := renderChart(t, "relayd", "relayd", sharded, "rbac: {create: false}\n")
	for _, kind := range []string{"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"} {
		if n := len(ofKind(objs, kind)); n > 0 {
			t.Errorf("rbac.create: false renders %d %s", n, kind)
		}
	}
	if len(ofKind(objs, "Lease")) != 2 {
		t.Errorf("rbac.create: false renders Leases %v, want the two sources'", ofKind(objs, "Lease"))
	}
	find(t, objs, "ConfigMap", "relayd-checkpoint")

	objs = renderChart(t, "relayd", "relayd", sharded, "serviceAccount: {create: false, name: platform-relayd}\n")
	if n := len(ofKind(objs, "ServiceAccount")); n > 0 {
		t.Errorf("serviceAccount.create: false renders %d ServiceAccounts", n)
	}
	if sa := typed[appsv1.Deployment](t, find(t, objs, "Deployment", "")).Spec.Template.Spec.ServiceAccountName; sa != "platform-relayd" {
		t.Errorf("the pod runs as %q, want serviceAccount.name platform-relayd", sa)
	}
	subs := subjects(t, objs)
	if len(subs) != 3 { // ClusterRole, checkpoint, Leases (the defaults' sources are of all namespaces)
		t.Errorf("bindings %q, want the ClusterRole's, the checkpoint's and the Leases'", subs)
	}
	for _, s := range subs {
		if !strings.HasSuffix(s, ": ServiceAccount relayd/platform-relayd") {
			t.Errorf("%s: want the ServiceAccount relayd/platform-relayd", s)
		}
	}

	objs = renderChart(t, "relayd", "relayd", "natsSecret: {name: relayd-nats}\npodSecurityContext: {runAsUser: null, runAsGroup: null}\n")
	psc := typed[appsv1.Deployment](t, find(t, objs, "Deployment", "")).Spec.Template.Spec.SecurityContext
	if psc == nil || psc.RunAsUser != nil || psc.RunAsGroup != nil || psc.FSGroup != nil ||
		psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("OpenShift's form: pod securityContext %+v, want no runAsUser, runAsGroup or fsGroup, and runAsNonRoot and seccomp RuntimeDefault kept", psc)
	}
	objs = renderChart(t, "relayd", "relayd", "natsSecret: {name: relayd-nats}\n")
	if psc := typed[appsv1.Deployment](t, find(t, objs, "Deployment", "")).Spec.Template.Spec.SecurityContext; psc == nil || psc.FSGroup == nil || *psc.FSGroup != 65532 {
		t.Errorf("with natsSecret: pod securityContext %+v, want fsGroup 65532 (runAsGroup)", psc)
	}

	const schemaErr = "values don't meet the specifications of the schema(s)"
	for _, tc := range []struct{ name, values, want string }{
		{"an existing ServiceAccount without its name", "serviceAccount: {create: false}\n", "serviceAccount.create is false: give serviceAccount.name"},
		{"a pod label of the selector", "podLabels: {app.kubernetes.io/instance: other}\n", "podLabels.app.kubernetes.io/instance: the chart sets this label"},
		{"the config checksum annotation", "podAnnotations: {checksum/config: x}\n", "podAnnotations.checksum/config: the chart sets this annotation"},
		{"a variable of the chart", "extraEnv: [{name: GOMEMLIMIT, value: 1GiB}]\n", "extraEnv[0].name GOMEMLIMIT: the chart sets this variable"},
		{"a volume of the chart", "extraVolumes: [{name: config, emptyDir: {}}]\n", "extraVolumes[0].name config: the chart's own volume"},
		{"a log format relayd lacks", "logFormat: text\n", "'/logFormat'"},
		{"a pull secret as a string", "imagePullSecrets: [my-registry]\n", "'/imagePullSecrets/0'"},
		{"the ServiceMonitor as a boolean", "monitoring: {serviceMonitor: true}\n", "'/monitoring/serviceMonitor'"},
		{"a scrape interval that is no duration", "monitoring: {serviceMonitor: {enabled: true, interval: often}}\n", "'/monitoring/serviceMonitor/interval'"},
		{"a spread constraint without its key", "topologySpreadConstraints: [{maxSkew: 1, whenUnsatisfiable: ScheduleAnyway}]\n", "'/topologySpreadConstraints/0'"},
		{"an unknown serviceAccount key", "serviceAccount: {automount: true}\n", schemaErr},
	} {
		_, err := helm(t, []string{"template", "relayd", chartDir}, tc.values)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want an error with %q", tc.name, err, tc.want)
		}
	}
}

// TestHelmChartValuesDocumented: every value of values.yaml (its top-level
// keys and the keys of its maps, down to serviceAccount.name and
// monitoring.serviceMonitor.interval, but not inside config or rbac.resources)
// has a row in the chart README's values table, and docs/DEPLOY.md names
// every top-level one.
func TestHelmChartValuesDocumented(t *testing.T) {
	readme := repoFile(t, chartDir+"/README.md")
	var rows []string
	for _, l := range strings.Split(readme, "\n") {
		if strings.HasPrefix(l, "| `") {
			rows = append(rows, strings.SplitN(l, " | ", 2)[0])
		}
	}
	deploy := repoFile(t, "docs/DEPLOY.md")
	documented := func(key string) bool {
		parent, leaf := "", key
		if i := strings.LastIndex(key, "."); i >= 0 {
			parent, leaf = key[:i], key[i+1:]
		}
		for _, r := range rows {
			// "| `a.b` / `.c` / `.d`" names a.b, a.c and a.d; "`a.*`" all of a.
			if strings.Contains(r, "`"+key+"`") || strings.Contains(r, "`"+key+".*`") || strings.Contains(r, "`"+parent+".*`") ||
				(parent != "" && strings.Contains(r, "`"+parent+".") && strings.Contains(r, "`."+leaf+"`")) {
				return true
			}
		}
		return false
	}
	var walk func(prefix string, m map[string]any)
	walk = func(prefix string, m map[string]any) {
		for k, v := range m {
			key := prefix + k
			if sub, ok := v.(map[string]any); ok && len(sub) > 0 && key != "config" && key != "resources" && key != "rbac.resources" &&
				!strings.HasPrefix(key, "networkPolicy") && !strings.HasSuffix(key, "SecurityContext") && key != "securityContext" {
				walk(key+".", sub)
				continue
			}
			if !documented(key) {
				t.Errorf("values.yaml's %s has no row in %s/README.md's values table", key, chartDir)
			}
			if prefix == "" && !strings.Contains(deploy, "`"+key) {
				t.Errorf("docs/DEPLOY.md does not name values.yaml's %s", key)
			}
		}
	}
	walk("", yamlMap(t, repoFile(t, chartDir+"/values.yaml")))
}

// TestHelmChartLogFormatsAreRelayds: each logFormat the values schema
// admits is one the real relayd's --log-format accepts (relayd then goes
// on to read its config), and relayd refuses one the schema refuses.
func TestHelmChartLogFormatsAreRelayds(t *testing.T) {
	var schema struct {
		Properties struct {
			LogFormat struct {
				Enum []string `json:"enum"`
			} `json:"logFormat"`
		} `json:"properties"`
	}
	if err := json.Unmarshal([]byte(repoFile(t, chartDir+"/values.schema.json")), &schema); err != nil {
		t.Fatal(err)
	}
	formats := schema.Properties.LogFormat.Enum
	if !slices.Contains(formats, "json") {
		t.Fatalf("the schema's logFormat %v lacks json, the default", formats)
	}
	missing := filepath.Join(t.TempDir(), "missing.yaml")
	for _, f := range append(formats, "text") {
		out, _ := exec.Command(relaydBin(t), "run", "--log-format="+f, "-c", missing).CombinedOutput()
		refused := strings.Contains(string(out), "--log-format")
		if accepted := slices.Contains(formats, f); refused == accepted || !refused && !strings.Contains(string(out), "missing.yaml") {
			t.Errorf("relayd run --log-format=%s (the schema admits it: %v): %s", f, accepted, out)
		}
	}
}
