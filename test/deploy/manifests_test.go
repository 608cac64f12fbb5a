package deploy

import (
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/restmapper"

	"github.com/relayd/relayd/internal/testutil"
	"github.com/relayd/relayd/pkg/config"
)

const (
	baseDir       = "deploy/base"
	overlayDir    = "deploy/overlays/example"
	haDir         = "deploy/overlays/ha"
	natsSecureDir = "deploy/overlays/nats-secure"
)

// shipped are the renders that the static tests check: the kustomize base
// and overlays, and the Helm chart with its default values and with every
// option on (chartRenders).
var shipped = []string{baseDir, overlayDir, haDir, natsSecureDir, chartDefault, chartAllOptions}

// TestRBACIsLeastPrivilege: no wildcards, no create (or any other write but
// update), no secrets, no non-resource URLs; ClusterRoles only list and
// watch; Roles only get and update named objects that the manifests ship
// (the checkpoint ConfigMap, the sharding Leases), or list and watch in a
// namespace that a source restricted to namespaces watches.
func TestRBACIsLeastPrivilege(t *testing.T) {
	mapper := discoveryMapper(t)
	for _, dir := range shipped {
		t.Run(dir, func(t *testing.T) {
			b := loadBundle(t, dir)
			rules := roleRules(t, b.objs)
			kinds := map[string]int{}
			for o := range rules {
				kinds[o.GetKind()]++
			}
			clusterRoles := 0
			watchedNamespaces := sets.New[string]()
			for _, src := range b.cfg.Sources {
				if src.AllNamespaces() {
					clusterRoles = 1
				}
				watchedNamespaces.Insert(src.Namespaces...)
			}
			if kinds["ClusterRole"] != clusterRoles || kinds["Role"] < 1 {
				t.Errorf("want %d ClusterRole (sources of all namespaces) and at least one Role, rendered %v", clusterRoles, kinds)
			}
			checkpointGranted := sets.New[string]()
			for o, rs := range rules {
				if len(rs) == 0 {
					t.Errorf("%s has no rules", describe(o))
				}
				for i, r := range rs {
					where := describe(o) + " rule " + strconv.Itoa(i)
					for _, f := range [][]string{r.APIGroups, r.Resources, r.Verbs, r.ResourceNames} {
						for _, s := range f {
							if strings.Contains(s, "*") {
								t.Errorf("%s: wildcard %q", where, s)
							}
						}
					}
					if len(r.NonResourceURLs) > 0 {
						t.Errorf("%s: nonResourceURLs %q", where, r.NonResourceURLs)
					}
					if len(r.APIGroups) == 0 || len(r.Resources) == 0 || len(r.Verbs) == 0 {
						t.Errorf("%s: empty apiGroups, resources or verbs", where)
					}
					for _, res := range r.Resources {
						if res == "secrets" || strings.Contains(res, "/") {
							t.Errorf("%s: grants %q (no secrets, no subresources)", where, res)
						}
					}
					for _, v := range r.Verbs {
						if v == "create" {
							t.Errorf("%s: grants create: ship the object instead (RBAC cannot limit create by resourceNames)", where)
						}
					}
					switch o.GetKind() {
					case "ClusterRole":
						if extra := sets.New(r.Verbs...).Difference(sets.New("list", "watch")); extra.Len() > 0 {
							t.Errorf("%s: verbs %v beyond list and watch", where, sets.List(extra))
						}
						if len(r.ResourceNames) > 0 {
							t.Errorf("%s: resourceNames on a list/watch rule match nothing useful", where)
						}
					case "Role":
						if len(r.ResourceNames) == 0 && watchedNamespaces.Has(o.GetNamespace()) {
							// The list and watch of the sources restricted to this namespace.
							if extra := sets.New(r.Verbs...).Difference(sets.New("list", "watch")); extra.Len() > 0 {
								t.Errorf("%s: verbs %v beyond list and watch in watched namespace %s", where, sets.List(extra), o.GetNamespace())
							}
							break
						}
						if extra := sets.New(r.Verbs...).Difference(sets.New("get", "update")); extra.Len() > 0 {
							t.Errorf("%s: verbs %v beyond get and update", where, sets.List(extra))
						}
						if len(r.ResourceNames) == 0 {
							t.Errorf("%s: a Role rule must name its objects (resourceNames)", where)
						}
						// Every named object is shipped: relayd may not create it.
						for _, g := range r.APIGroups {
							for _, res := range r.Resources {
								gvk, err := mapper.KindFor(schema.GroupVersionResource{Group: g, Resource: res})
								if err != nil {
									t.Errorf("%s: %s.%s: %v", where, res, g, err)
									continue
								}
								for _, name := range r.ResourceNames {
									shipped := false
									for _, x := range b.objs {
										shipped = shipped || (x.GroupVersionKind().GroupKind() == gvk.GroupKind() &&
											x.GetName() == name && x.GetNamespace() == o.GetNamespace())
									}
									if !shipped {
										t.Errorf("%s: grants %s on %s %s/%s, which the manifests do not ship", where, r.Verbs, gvk.Kind, o.GetNamespace(), name)
									}
									if g == "" && res == "configmaps" && name == b.checkpointCM.Name && o.GetNamespace() == b.checkpointCM.Namespace {
										checkpointGranted.Insert(r.Verbs...)
									}
								}
							}
						}
					}
				}
			}
			if !checkpointGranted.Equal(sets.New("get", "update")) {
				t.Errorf("the Roles grant %v on the checkpoint ConfigMap %s/%s, want exactly get and update",
					sets.List(checkpointGranted), b.checkpointCM.Namespace, b.checkpointCM.Name)
			}
			for _, p := range permissions(t, b.objs) {
				t.Logf("granted: %s", p)
			}
		})
	}
}

// TestRolesGrantExactlyTheWatchedResources resolves every source of the
// shipped config through the real apiserver's discovery (as relayd does)
// and requires list+watch on exactly those resources, nothing more: in the
// ClusterRole for a source of all namespaces, in a Role of each namespace
// for a source restricted to namespaces (one watch per namespace).
func TestRolesGrantExactlyTheWatchedResources(t *testing.T) {
	mapper := discoveryMapper(t)
	for _, dir := range shipped {
		t.Run(dir, func(t *testing.T) {
			b := loadBundle(t, dir)
			want := sets.New[string]()
			resources := watchedResources(t, mapper, b.cfg)
			for _, src := range b.cfg.Sources {
				gr := resources[src.Name]
				scopes := []string{"cluster-wide"}
				if !src.AllNamespaces() {
					scopes = src.Namespaces
				}
				for _, scope := range scopes {
					want.Insert(scope+": list "+gr.Resource+"."+gr.Group, scope+": watch "+gr.Resource+"."+gr.Group)
				}
			}
			got := sets.New[string]()
			for _, p := range permissions(t, b.objs) {
				switch {
				case p.roleKind == "ClusterRole":
					got.Insert("cluster-wide: " + p.verb + " " + p.resource + "." + p.group)
				case p.verb == "list" || p.verb == "watch":
					got.Insert(p.namespace + ": " + p.verb + " " + p.resource + "." + p.group)
				}
			}
			if !got.Equal(want) {
				t.Errorf("the roles grant %v; the config's sources need exactly %v (missing %v, extra %v)",
					sets.List(got), sets.List(want), sets.List(want.Difference(got)), sets.List(got.Difference(want)))
			}
		})
	}
}

// TestBindingsGrantTheRolesToTheServiceAccount: every binding names a
// rendered role and exactly relayd's ServiceAccount, in its namespace (also
// after an overlay moves the namespace).
func TestBindingsGrantTheRolesToTheServiceAccount(t *testing.T) {
	for _, dir := range shipped {
		t.Run(dir, func(t *testing.T) {
			b := loadBundle(t, dir)
			bound := sets.New[string]()
			check := func(o *unstructured.Unstructured, ref rbacv1.RoleRef, subjects []rbacv1.Subject) {
				// A RoleBinding's Role is the one of that name in its own
				// namespace (the chart renders one per watched namespace).
				var role *unstructured.Unstructured
				for _, r := range ofKind(b.objs, ref.Kind) {
					if r.GetName() == ref.Name && r.GetNamespace() == o.GetNamespace() {
						role = r
					}
				}
				if role == nil {
					t.Errorf("%s binds %s %s, which is not rendered in its namespace", describe(o), ref.Kind, ref.Name)
					return
				}
				bound.Insert(describe(role))
				want := []rbacv1.Subject{{Kind: "ServiceAccount", Name: b.sa.Name, Namespace: b.sa.Namespace}}
				if !reflect.DeepEqual(subjects, want) {
					t.Errorf("%s subjects = %+v, want %+v", describe(o), subjects, want)
				}
			}
			for _, o := range ofKind(b.objs, "ClusterRoleBinding") {
				rb := typed[rbacv1.ClusterRoleBinding](t, o)
				check(o, rb.RoleRef, rb.Subjects)
			}
			for _, o := range ofKind(b.objs, "RoleBinding") {
				rb := typed[rbacv1.RoleBinding](t, o)
				check(o, rb.RoleRef, rb.Subjects)
			}
			for o := range roleRules(t, b.objs) {
				if !bound.Has(describe(o)) {
					t.Errorf("%s is bound by no binding", describe(o))
				}
			}
			if b.cfg.Checkpoint.Namespace != "" && b.cfg.Checkpoint.Namespace != b.namespace() {
				t.Errorf("config checkpoint.namespace %q, but relayd runs in %q", b.cfg.Checkpoint.Namespace, b.namespace())
			}
		})
	}
}

// TestDeploymentIsRestrictedAndProbed pins the pod spec an operator relies
// on: restricted securityContext, probes on named ports, resources,
// GOMEMLIMIT and POD_NAMESPACE from the downward API, a grace period above
// the drain timeout, the ServiceAccount token mounted for relayd only.
func TestDeploymentIsRestrictedAndProbed(t *testing.T) {
	for _, dir := range shipped {
		t.Run(dir, func(t *testing.T) {
			b := loadBundle(t, dir)
			d, c := b.deployment, b.container
			pod := d.Spec.Template.Spec
			// One replica (Recreate) without sharding; several only with
			// sharding on, rolling without taking a pod away first, and
			// POD_NAME for the replica's identity in the Leases.
			switch {
			case d.Spec.Replicas == nil:
				t.Error("replicas unset")
			case !b.cfg.Sharding.Enabled && (*d.Spec.Replicas != 1 || d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType):
				t.Errorf("replicas = %d, strategy %s; want 1 and Recreate without sharding", *d.Spec.Replicas, d.Spec.Strategy.Type)
			case b.cfg.Sharding.Enabled && (*d.Spec.Replicas < 2 || d.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType ||
				d.Spec.Strategy.RollingUpdate == nil || d.Spec.Strategy.RollingUpdate.MaxUnavailable == nil || d.Spec.Strategy.RollingUpdate.MaxUnavailable.IntValue() != 0):
				t.Errorf("replicas = %d, strategy %+v; want several replicas and a RollingUpdate with maxUnavailable 0 with sharding", *d.Spec.Replicas, d.Spec.Strategy)
			}
			podName := false
			for _, e := range c.Env {
				podName = podName || (e.Name == "POD_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name")
			}
			if !podName {
				t.Error("POD_NAME is not set from metadata.name (the replica identity in the sharding Leases)")
			}
			if pod.ServiceAccountName != b.sa.Name {
				t.Errorf("serviceAccountName = %q, want %q", pod.ServiceAccountName, b.sa.Name)
			}
			if pod.AutomountServiceAccountToken == nil || !*pod.AutomountServiceAccountToken {
				t.Error("the pod must mount the ServiceAccount token (relayd's in-cluster client needs it)")
			}
			if b.sa.AutomountServiceAccountToken == nil || *b.sa.AutomountServiceAccountToken {
				t.Error("the ServiceAccount should not mount its token by default; the pod opts in")
			}

			psc := pod.SecurityContext
			if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.SeccompProfile == nil ||
				psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
				t.Errorf("pod securityContext = %+v, want runAsNonRoot and seccomp RuntimeDefault", psc)
			}
			if pod.HostNetwork || pod.HostPID || pod.HostIPC {
				t.Error("the pod uses a host namespace")
			}
			sc := c.SecurityContext
			switch {
			case sc == nil:
				t.Fatal("the container has no securityContext")
			case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
				t.Error("allowPrivilegeEscalation must be false")
			case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
				t.Error("readOnlyRootFilesystem must be true")
			case sc.Privileged != nil && *sc.Privileged:
				t.Error("privileged")
			case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0:
				t.Errorf("capabilities = %+v, want drop [ALL] and nothing added", sc.Capabilities)
			case sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault:
				t.Error("container seccompProfile must be RuntimeDefault")
			}

			ports := map[string]int32{}
			for _, p := range c.Ports {
				ports[p.Name] = p.ContainerPort
			}
			for _, pr := range []struct {
				name  string
				probe *corev1.Probe
				path  string
			}{{"liveness", c.LivenessProbe, "/healthz"}, {"readiness", c.ReadinessProbe, "/readyz"}} {
				if pr.probe == nil || pr.probe.HTTPGet == nil {
					t.Errorf("no HTTP %s probe", pr.name)
					continue
				}
				g := pr.probe.HTTPGet
				if g.Path != pr.path || g.Port.StrVal == "" {
					t.Errorf("%s probe = %s on port %s, want %s on a named port", pr.name, g.Path, g.Port.String(), pr.path)
					continue
				}
				if ports[g.Port.StrVal] != bindPort(t, c.Args, "health-probe-bind-address") {
					t.Errorf("%s probe port %q = %d, but relayd serves probes on %s", pr.name, g.Port.StrVal, ports[g.Port.StrVal],
						flagValue(c.Args, "health-probe-bind-address"))
				}
			}
			if ports["metrics"] == 0 || ports["metrics"] != bindPort(t, c.Args, "metrics-bind-address") {
				t.Errorf("container port \"metrics\" = %d, relayd serves /metrics on %q", ports["metrics"], flagValue(c.Args, "metrics-bind-address"))
			}

			for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
				if _, ok := c.Resources.Requests[res]; !ok {
					t.Errorf("no %s request", res)
				}
				if _, ok := c.Resources.Limits[res]; !ok {
					t.Errorf("no %s limit", res)
				}
			}
			envs := map[string]corev1.EnvVar{}
			for _, e := range c.Env {
				envs[e.Name] = e
			}
			if e := envs["POD_NAMESPACE"]; e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "metadata.namespace" {
				t.Errorf("POD_NAMESPACE = %+v, want the downward API's metadata.namespace", e)
			}
			if e := envs["GOMEMLIMIT"]; e.ValueFrom == nil || e.ValueFrom.ResourceFieldRef == nil ||
				e.ValueFrom.ResourceFieldRef.Resource != "limits.memory" ||
				(e.ValueFrom.ResourceFieldRef.ContainerName != "" && e.ValueFrom.ResourceFieldRef.ContainerName != c.Name) ||
				!(e.ValueFrom.ResourceFieldRef.Divisor.IsZero() || e.ValueFrom.ResourceFieldRef.Divisor.Cmp(resource.MustParse("1")) == 0) {
				t.Errorf("GOMEMLIMIT = %+v, want limits.memory of this container in bytes (divisor 1: Go reads a plain number as bytes)", e)
			}

			grace := time.Duration(0)
			if pod.TerminationGracePeriodSeconds != nil {
				grace = time.Duration(*pod.TerminationGracePeriodSeconds) * time.Second
			}
			// relayd drains for up to drainTimeout, then writes the final
			// checkpoint and stops its HTTP servers (up to 5s).
			if drain := b.cfg.Shutdown.DrainTimeout.Duration(); grace < drain+10*time.Second {
				t.Errorf("terminationGracePeriodSeconds %v is not above shutdown.drainTimeout %v plus 10s for the final checkpoint and HTTP shutdown", grace, drain)
			}
		})
	}
}

// watchedResources resolves every source of cfg to its group and resource,
// by name.
func watchedResources(t testing.TB, mapper meta.RESTMapper, cfg *config.Config) map[string]schema.GroupResource {
	t.Helper()
	out := map[string]schema.GroupResource{}
	for _, src := range cfg.Sources {
		group, version := src.GroupVersion()
		if src.Resource != nil {
			out[src.Name] = schema.GroupResource{Group: group, Resource: src.Resource.Resource}
			continue
		}
		m, err := mapper.RESTMapping(schema.GroupKind{Group: group, Kind: src.Kind}, version)
		if err != nil {
			t.Fatalf("source %q: %v", src.Name, err)
		}
		out[src.Name] = m.Resource.GroupResource()
	}
	return out
}

// discoveryMapper maps kinds and resources through the test apiserver's
// discovery, as relayd resolves its sources.
func discoveryMapper(t testing.TB) meta.RESTMapper {
	t.Helper()
	dc, err := discovery.NewDiscoveryClientForConfig(env.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	groups, err := restmapper.GetAPIGroupResources(dc)
	if err != nil {
		t.Fatal(err)
	}
	return restmapper.NewDiscoveryRESTMapper(groups)
}

// bindPort is the port of a ":8080"-style listen-address flag.
func bindPort(t testing.TB, args []string, flag string) int32 {
	t.Helper()
	v := flagValue(args, flag)
	_, p, ok := strings.Cut(v, ":")
	n, err := strconv.Atoi(p)
	if !ok || err != nil {
		t.Fatalf("--%s=%q is not host:port", flag, v)
	}
	return int32(n)
}

// TestServiceExposesMetricsToTheServiceMonitor: the ServiceMonitor of
// deploy/monitoring (enabled by the example overlay) selects the Service by
// its labels and scrapes the port named "metrics", which reaches relayd's
// /metrics listener in the pod the Service selects.
func TestServiceExposesMetricsToTheServiceMonitor(t *testing.T) {
	b := loadBundle(t, overlayDir)
	sm := find(t, b.objs, "ServiceMonitor", "")
	match, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
	if len(match) == 0 {
		t.Fatal("ServiceMonitor has no spec.selector.matchLabels")
	}
	for k, v := range match {
		if b.service.Labels[k] != v {
			t.Errorf("ServiceMonitor selects %s=%s; the Service's labels are %v", k, v, b.service.Labels)
		}
	}
	eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	if len(eps) == 0 {
		t.Fatal("ServiceMonitor has no endpoints")
	}
	for _, ep := range eps {
		port, _ := ep.(map[string]any)["port"].(string)
		found := false
		for _, p := range b.service.Spec.Ports {
			if p.Name == port {
				found = true
				if p.TargetPort.StrVal == "" {
					t.Errorf("Service port %q targets %s; use the container port's name", port, p.TargetPort.String())
				}
				ok := false
				for _, cp := range b.container.Ports {
					ok = ok || cp.Name == p.TargetPort.StrVal
				}
				if !ok {
					t.Errorf("Service port %q targets %q, which the container does not name", port, p.TargetPort.StrVal)
				}
				if p.TargetPort.StrVal != "metrics" {
					t.Errorf("Service port %q targets %q, want the container's \"metrics\" port", port, p.TargetPort.StrVal)
				}
			}
		}
		if !found {
			t.Errorf("ServiceMonitor scrapes port %q; the Service has no port of that name", port)
		}
	}
	podLabels := b.deployment.Spec.Template.Labels
	for k, v := range b.service.Spec.Selector {
		if podLabels[k] != v {
			t.Errorf("Service selects %s=%s; the pod's labels are %v", k, v, podLabels)
		}
	}
}

// TestExampleOverlay: the overlay moves everything into its namespace,
// pins the image, replaces the config and adds the monitoring component.
func TestExampleOverlay(t *testing.T) {
	base, b := loadBundle(t, baseDir), loadBundle(t, overlayDir)
	ns := find(t, b.objs, "Namespace", "")
	for _, o := range b.objs {
		switch o.GetKind() {
		case "Namespace", "ClusterRole", "ClusterRoleBinding":
			if o.GetNamespace() != "" {
				t.Errorf("%s is cluster-scoped but has a namespace", describe(o))
			}
		default:
			if o.GetNamespace() != ns.GetName() {
				t.Errorf("%s is not in the overlay's namespace %q", describe(o), ns.GetName())
			}
		}
	}
	if img := b.container.Image; !strings.HasPrefix(img, "ghcr.io/relayd/relayd:") || strings.HasSuffix(img, ":latest") {
		t.Errorf("overlay image = %q, want a pinned ghcr.io/relayd/relayd tag", img)
	}
	if b.cfg.Cluster == base.cfg.Cluster {
		t.Errorf("overlay config has the base's cluster %q: the overlay's config.yaml did not replace the base's", b.cfg.Cluster)
	}
	if !strings.HasPrefix(b.configMap.Name, "relayd-config-") {
		t.Errorf("overlay config ConfigMap %q has no content-hash suffix", b.configMap.Name)
	}
	for _, kind := range []string{"ServiceMonitor", "PrometheusRule"} {
		find(t, b.objs, kind, "")
	}
	if cm := find(t, b.objs, "ConfigMap", "relayd-grafana-dashboard"); cm.GetLabels()["grafana_dashboard"] != "1" {
		t.Error("the dashboard ConfigMap is not labelled grafana_dashboard: \"1\"")
	}
	// The overlay's config is valid as relayd sees it in the pod.
	if err := b.cfg.ResolveDefaults(func(k string) string {
		if k == config.PodNamespaceEnv {
			return ns.GetName()
		}
		return ""
	}, os.ReadFile); err != nil {
		t.Error(err)
	}
	if b.cfg.Checkpoint.Namespace != b.checkpointCM.Namespace {
		t.Errorf("relayd would look for its checkpoint in %q; it is shipped in %q", b.cfg.Checkpoint.Namespace, b.checkpointCM.Namespace)
	}
}

// TestConfigChangeRollsThePod: the config ConfigMap's name carries a hash
// of its content, so a changed config.yaml renames it and changes the pod
// template (a rollout); the checkpoint ConfigMap keeps its name and has no
// data of its own, so applying never touches relayd's positions.
func TestConfigChangeRollsThePod(t *testing.T) {
	before := loadBundle(t, baseDir)
	dir := t.TempDir()
	src := filepath.Join(testutil.RepoRootT(t), baseDir)
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if e.Name() == filepath.Base(before.configPath) {
			data = []byte(strings.Replace(string(data), "cluster: "+before.cfg.Cluster, "cluster: changed", 1))
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	after := loadBundle(t, dir)
	if after.cfg.Cluster != "changed" {
		t.Fatalf("the test did not change the config (cluster %q)", after.cfg.Cluster)
	}
	if before.configMap.Name == after.configMap.Name || !strings.HasPrefix(before.configMap.Name, "relayd-config-") {
		t.Errorf("config ConfigMap name %q -> %q: want a content-hash suffix that changes with the config", before.configMap.Name, after.configMap.Name)
	}
	if reflect.DeepEqual(before.deployment.Spec.Template, after.deployment.Spec.Template) {
		t.Error("the pod template did not change with the config: no rollout")
	}
	if before.checkpointCM.Name != after.checkpointCM.Name || before.checkpointCM.Name != before.cfg.Checkpoint.Name {
		t.Errorf("checkpoint ConfigMap %q/%q must keep the configured name %q", before.checkpointCM.Name, after.checkpointCM.Name, before.cfg.Checkpoint.Name)
	}
	if len(before.checkpointCM.Data) > 0 || len(before.checkpointCM.BinaryData) > 0 {
		t.Error("the shipped checkpoint ConfigMap has data: applying it would fight relayd's writes")
	}
	if _, has := find(t, before.objs, "ConfigMap", before.checkpointCM.Name).Object["data"]; has {
		t.Error("the shipped checkpoint ConfigMap has a data field (even empty): leave it out")
	}
}

// natsSecretName is the Secret deploy/overlays/nats-secure mounts: created
// out of band, never rendered.
const natsSecretName = "relayd-nats"

// natsSecretMount is the container's mount of the Secret natsSecretName.
func natsSecretMount(t testing.TB, b *bundle) corev1.VolumeMount {
	t.Helper()
	var vol string
	for _, v := range b.deployment.Spec.Template.Spec.Volumes {
		if v.Secret != nil && v.Secret.SecretName == natsSecretName {
			if vol != "" {
				t.Fatalf("%s: Secret %s is in two volumes", b.dir, natsSecretName)
			}
			vol = v.Name
		}
	}
	if vol == "" {
		t.Fatalf("%s: no volume of Secret %s", b.dir, natsSecretName)
	}
	var mounts []corev1.VolumeMount
	for _, m := range b.container.VolumeMounts {
		if m.Name == vol {
			mounts = append(mounts, m)
		}
	}
	if len(mounts) != 1 {
		t.Fatalf("%s: the container mounts volume %q %d times, want once", b.dir, vol, len(mounts))
	}
	return mounts[0]
}

// secretFromFile matches the --from-file keys of the kubectl command that
// creates the Secret in docs/DEPLOY.md.
var secretFromFile = regexp.MustCompile(`--from-file=([^\s\\]+)`)

// TestNATSSecureOverlay: deploy/overlays/nats-secure mounts the Secret
// relayd-nats (not rendered: no key material in the repository) read-only,
// whole (no subPath, so a rotated Secret reaches the files), readable by
// relayd's group only and by nobody else; its config passes `relayd
// check-config`, uses TLS, an NKey and the inbox prefix docs/DEPLOY.md
// grants, reads every file of its nats block from that mount, each one a
// key of the documented `kubectl create secret` command, does not create
// the stream (so relayd's user needs no STREAM.UPDATE) and draws no
// warning; and it is the base's config but for the nats connection
// settings and nats.stream.create.
func TestNATSSecureOverlay(t *testing.T) {
	base, b := loadBundle(t, baseDir), loadBundle(t, natsSecureDir)
	if secrets := ofKind(b.objs, "Secret"); len(secrets) > 0 {
		t.Errorf("the overlay renders %s: the Secret is created out of band, its values never committed", describe(secrets[0]))
	}
	pod := b.deployment.Spec.Template.Spec
	m := natsSecretMount(t, b)
	if !m.ReadOnly || m.SubPath != "" || m.SubPathExpr != "" {
		t.Errorf("Secret %s mounted %+v: want readOnly, the whole volume (a subPath mount never sees a rotated Secret)", natsSecretName, m)
	}
	for _, o := range b.container.VolumeMounts {
		if o.Name != m.Name && (strings.HasPrefix(m.MountPath+"/", o.MountPath+"/") || strings.HasPrefix(o.MountPath+"/", m.MountPath+"/")) {
			t.Errorf("the Secret's mount %s and volume %q's %s are nested", m.MountPath, o.Name, o.MountPath)
		}
	}
	for _, v := range pod.Volumes {
		if v.Name != m.Name {
			continue
		}
		s := v.Secret
		mode := int32(0o644) // the kubelet's default
		if s.DefaultMode != nil {
			mode = *s.DefaultMode
		}
		switch {
		case len(s.Items) > 0:
			t.Errorf("the Secret volume selects items %v: mount every key", s.Items)
		case s.Optional != nil && *s.Optional:
			t.Error("the Secret volume is optional: relayd would start without its credentials")
		case mode&0o222 != 0 || mode&0o007 != 0:
			t.Errorf("the Secret's files get mode %#o: want no write bits and nothing for others (0440 or 0400)", mode)
		// The files belong to root, and to the group fsGroup: relayd
		// (runAsUser 65532, not root) reads them through fsGroup.
		case pod.SecurityContext.FSGroup == nil || mode&0o040 == 0:
			t.Errorf("mode %#o, fsGroup %v: relayd (uid %v) cannot read the Secret's files; want fsGroup and group read", mode, pod.SecurityContext.FSGroup, pod.SecurityContext.RunAsUser)
		}
	}

	n := b.cfg.NATS
	if !strings.HasPrefix(n.URL, "tls://") {
		t.Errorf("nats.url %q: want tls://", n.URL)
	}
	if n.TLS.CAFile == "" || n.TLS.CertFile == "" || n.TLS.KeyFile == "" || n.NkeySeedFile == "" {
		t.Errorf("want nats.tls.caFile, certFile, keyFile and nats.nkeySeedFile set: %+v", n)
	}
	if n.Stream.Create || n.AllowPlaintextCredentials {
		t.Errorf("nats.stream.create %v, nats.allowPlaintextCredentials %v: want both false", n.Stream.Create, n.AllowPlaintextCredentials)
	}
	docPerms := docNATSPermissions(t)
	if n.InboxPrefix == "" || !slices.Contains(docPerms.sub, n.InboxPrefix+".>") {
		t.Errorf("nats.inboxPrefix %q; docs/DEPLOY.md grants subscribe on %v", n.InboxPrefix, docPerms.sub)
	}
	var documented []string
	// Shell lines, continuations joined.
	for _, line := range strings.Split(strings.ReplaceAll(repoFile(t, "docs/DEPLOY.md"), "\\\n", " "), "\n") {
		if strings.Contains(line, "create secret generic "+natsSecretName) {
			line = line[strings.Index(line, "create secret"):]
			for _, m := range secretFromFile.FindAllStringSubmatch(line, -1) {
				documented = append(documented, m[1])
			}
		}
	}
	if len(documented) == 0 {
		t.Fatalf("docs/DEPLOY.md has no `kubectl create secret generic %s --from-file=…` command", natsSecretName)
	}
	var used []string
	for key, p := range map[string]string{
		"credentialsFile": n.CredentialsFile, "nkeySeedFile": n.NkeySeedFile, "tokenFile": n.TokenFile,
		"userFile": n.UserFile, "passwordFile": n.PasswordFile,
		"tls.caFile": n.TLS.CAFile, "tls.certFile": n.TLS.CertFile, "tls.keyFile": n.TLS.KeyFile,
	} {
		if p == "" {
			continue
		}
		if path.Dir(p) != m.MountPath {
			t.Errorf("nats.%s %q is not a file of the Secret's mount %s", key, p, m.MountPath)
		}
		used = append(used, path.Base(p))
	}
	slices.Sort(used)
	slices.Sort(documented)
	if !slices.Equal(used, documented) {
		t.Errorf("the config reads %v from the Secret; docs/DEPLOY.md creates it with %v", used, documented)
	}

	// The real binary's check, on the rendered config.
	f := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(f, []byte(b.configMap.Data[b.configKey]), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(relaydBin(t), "check-config", "-c", f).CombinedOutput(); err != nil || !strings.Contains(string(out), "SUCCESS") ||
		strings.Contains(string(out), "WARNING") {
		t.Errorf("relayd check-config on the overlay's config: %v\n%s", err, out)
	}

	// The base's config but for the connection settings and stream.create.
	strip := func(doc string) map[string]any {
		var m map[string]any
		if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
			t.Fatal(err)
		}
		nats, _ := m["nats"].(map[string]any)
		for _, k := range []string{"url", "credentialsFile", "nkeySeedFile", "tokenFile", "userFile", "passwordFile", "allowPlaintextCredentials", "tls", "jsDomain", "inboxPrefix"} {
			delete(nats, k)
		}
		if s, ok := nats["stream"].(map[string]any); ok {
			delete(s, "create")
		}
		return m
	}
	if got, want := strip(b.configMap.Data[b.configKey]), strip(base.configMap.Data[base.configKey]); !reflect.DeepEqual(got, want) {
		t.Errorf("the overlay's config differs from the base's beyond the nats connection settings:\noverlay %v\nbase    %v", got, want)
	}
}
