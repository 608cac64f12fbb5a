package deploy

import (
	"path"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/relayd/relayd/pkg/config"
)

// bundle is one rendered kustomization, with the objects relayd's
// deployment is made of resolved and cross-checked: the Deployment's -c path
// lies in a volume mount whose ConfigMap (the generated config) has that key.
type bundle struct {
	dir  string
	objs []*unstructured.Unstructured

	sa           *corev1.ServiceAccount
	deployment   *appsv1.Deployment
	container    corev1.Container
	service      *corev1.Service
	configMap    *corev1.ConfigMap // the generated config ConfigMap
	configKey    string            // its key that relayd reads
	configPath   string            // the -c argument
	mountPath    string            // where configMap is mounted
	checkpointCM *corev1.ConfigMap
	cfg          *config.Config // parsed config (checkpoint.namespace unresolved)
}

// loadBundle renders the kustomization in dir, or, for a name of
// chartRenders, the Helm chart with those values.
func loadBundle(t testing.TB, dir string) *bundle {
	t.Helper()
	if values, ok := chartRenders[dir]; ok {
		return bundleOf(t, dir, renderChart(t, "relayd", "relayd", values(t)...))
	}
	return bundleOf(t, dir, render(t, dir))
}

// bundleOf resolves the bundle of already rendered objects (the Helm
// chart's); dir names them in messages.
func bundleOf(t testing.TB, dir string, objs []*unstructured.Unstructured) *bundle {
	t.Helper()
	b := &bundle{dir: dir, objs: objs}
	b.sa = typed[corev1.ServiceAccount](t, find(t, b.objs, "ServiceAccount", ""))
	b.deployment = typed[appsv1.Deployment](t, find(t, b.objs, "Deployment", ""))
	b.service = typed[corev1.Service](t, find(t, b.objs, "Service", ""))
	cs := b.deployment.Spec.Template.Spec.Containers
	if len(cs) != 1 {
		t.Fatalf("%s: Deployment has %d containers, want 1", dir, len(cs))
	}
	b.container = cs[0]

	b.configPath = flagValue(b.container.Args, "c", "config")
	if b.configPath == "" {
		t.Fatalf("%s: the container's args %q do not set -c/--config", dir, b.container.Args)
	}
	var volName string
	for _, m := range b.container.VolumeMounts {
		if strings.HasPrefix(b.configPath, strings.TrimSuffix(m.MountPath, "/")+"/") {
			volName, b.mountPath = m.Name, m.MountPath
			b.configKey = strings.TrimPrefix(b.configPath, strings.TrimSuffix(m.MountPath, "/")+"/")
		}
	}
	if volName == "" {
		t.Fatalf("%s: config path %s is in no volume mount of the container", dir, b.configPath)
	}
	for _, v := range b.deployment.Spec.Template.Spec.Volumes {
		if v.Name == volName {
			if v.ConfigMap == nil {
				t.Fatalf("%s: volume %q (holding %s) is not a ConfigMap volume", dir, volName, b.configPath)
			}
			b.configMap = typed[corev1.ConfigMap](t, find(t, b.objs, "ConfigMap", v.ConfigMap.Name))
		}
	}
	if b.configMap == nil {
		t.Fatalf("%s: volume %q not found in the pod spec", dir, volName)
	}
	data, ok := b.configMap.Data[b.configKey]
	if !ok {
		t.Fatalf("%s: ConfigMap %s has no key %q (the Deployment reads %s)", dir, b.configMap.Name, b.configKey, b.configPath)
	}
	cfg, err := config.Parse([]byte(data), dir+"/"+path.Base(b.configPath))
	if err != nil {
		t.Fatalf("shipped config is invalid: %v", err)
	}
	b.cfg = cfg
	b.checkpointCM = typed[corev1.ConfigMap](t, find(t, b.objs, "ConfigMap", cfg.Checkpoint.Name))
	return b
}

// namespace is where the bundle installs relayd.
func (b *bundle) namespace() string { return b.sa.Namespace }

// serviceAccountUser is the RBAC user name of relayd's ServiceAccount.
func (b *bundle) serviceAccountUser() string {
	return "system:serviceaccount:" + b.sa.Namespace + ":" + b.sa.Name
}

// flagValue returns the value of -name/--name (either spelling of each
// alias, "-x v" or "-x=v") in args, "" if absent.
func flagValue(args []string, names ...string) string {
	for i, a := range args {
		for _, n := range names {
			for _, p := range []string{"-" + n, "--" + n} {
				if a == p && i+1 < len(args) {
					return args[i+1]
				}
				if v, ok := strings.CutPrefix(a, p+"="); ok {
					return v
				}
			}
		}
	}
	return ""
}

// permission is one verb on one resource granted by one rule of a Role or
// ClusterRole: the unit the RBAC test takes away.
type permission struct {
	roleKind, roleName, namespace string
	rule                          int
	group, resource, verb         string
	resourceNames                 []string
}

func (p permission) String() string {
	s := p.verb + " " + p.resource
	if p.group != "" {
		s += "." + p.group
	}
	if len(p.resourceNames) > 0 {
		s += " " + strings.Join(p.resourceNames, ",")
	}
	return s + " (" + p.roleKind + " " + p.roleName + ")"
}

// roleRules returns the rules of every Role and ClusterRole rendered.
func roleRules(t testing.TB, objs []*unstructured.Unstructured) map[*unstructured.Unstructured][]rbacv1.PolicyRule {
	t.Helper()
	out := map[*unstructured.Unstructured][]rbacv1.PolicyRule{}
	for _, o := range objs {
		switch o.GetKind() {
		case "ClusterRole":
			r := typed[rbacv1.ClusterRole](t, o)
			if r.AggregationRule != nil {
				t.Errorf("ClusterRole %s aggregates other roles: its permissions are not visible in the manifest", o.GetName())
			}
			out[o] = r.Rules
		case "Role":
			out[o] = typed[rbacv1.Role](t, o).Rules
		}
	}
	return out
}

// permissions expands every rendered rule into single permissions.
func permissions(t testing.TB, objs []*unstructured.Unstructured) []permission {
	t.Helper()
	var out []permission
	for o, rules := range roleRules(t, objs) {
		for i, r := range rules {
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					for _, v := range r.Verbs {
						out = append(out, permission{roleKind: o.GetKind(), roleName: o.GetName(), namespace: o.GetNamespace(),
							rule: i, group: g, resource: res, verb: v, resourceNames: r.ResourceNames})
					}
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b permission) int { return strings.Compare(a.String(), b.String()) })
	return out
}
