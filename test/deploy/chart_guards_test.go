package deploy

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// secretSourceValues: one source of Secrets (names only), whose grant
// (list and watch on secrets, cluster-wide) the chart binds to relayd's
// ServiceAccount.
const secretSourceValues = "config: {sources: [{name: secrets, resource: {version: v1, resource: secrets}, payload: reference}]}\n"

// TestHelmChartRefusesTheDefaultServiceAccountAndRelaydEnv: the chart
// never binds its grants to the namespace's "default" ServiceAccount
// (which every pod of the namespace without one of its own runs as),
// whether named by serviceAccount.name (with create false or true) or by
// a release named "default"; and it refuses RELAYD_* names in extraEnv
// (relayd's own variables: the test switches of test builds). The values
// schema refuses the values (naming them), and with the schema skipped
// the templates refuse them too, naming the value and the fix.
func TestHelmChartRefusesTheDefaultServiceAccountAndRelaydEnv(t *testing.T) {
	const schemaErr = "values don't meet the specifications of the schema(s)"
	for _, tc := range []struct {
		name, release, values string
		schema                string // in the schema's error; "" when the schema cannot see it
		chart                 string // the templates' error
	}{
		{"an existing default ServiceAccount", "relayd", "serviceAccount: {create: false, name: default}\n" + secretSourceValues,
			"at '/serviceAccount/name'", `serviceAccount.name is "default": relayd would run as the namespace's default ServiceAccount`},
		{"a created default ServiceAccount", "relayd", "serviceAccount: {create: true, name: default}\n" + secretSourceValues,
			"at '/serviceAccount/name'", `serviceAccount.name is "default": relayd would run as the namespace's default ServiceAccount`},
		{"a release named default", "default", secretSourceValues,
			"", `the release is named "default", and so would be its ServiceAccount`},
		{"the index check in extraEnv", "relayd", "extraEnv: [{name: RELAYD_INDEX_CHECK, value: '1'}]\n",
			"at '/extraEnv/0/name'", "extraEnv[0].name RELAYD_INDEX_CHECK: RELAYD_* variables are relayd's own"},
		{"failpoints in extraEnv", "relayd", "extraEnv: [{name: HTTPS_PROXY, value: 'http://proxy:3128'}, {name: RELAYD_FAILPOINTS, value: 'sink-after-ack=kill'}]\n",
			"at '/extraEnv/1/name'", "extraEnv[1].name RELAYD_FAILPOINTS: RELAYD_* variables are relayd's own"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := helm(t, []string{"template", tc.release, chartDir, "-n", "relayd"}, tc.values)
			want := tc.chart
			if tc.schema != "" {
				want = tc.schema
				if err == nil || !strings.Contains(err.Error(), schemaErr) {
					t.Errorf("helm template: %v; want the schema's error", err)
				}
			}
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("helm template: %v; want an error with %q", err, want)
			}
			if tc.release != "default" { // helm lint names the release itself
				// helm lint prints the chart's problems on stdout.
				if out, err := helm(t, []string{"lint", "--strict", chartDir}, tc.values); err == nil || !strings.Contains(string(out), want) {
					t.Errorf("helm lint --strict: %v\n%s\nwant an error with %q", err, out, want)
				}
			}
			_, err = helm(t, []string{"template", tc.release, chartDir, "-n", "relayd", "--skip-schema-validation"}, tc.values)
			if err == nil || !strings.Contains(err.Error(), tc.chart) {
				t.Errorf("helm template --skip-schema-validation: %v; want an error with %q", err, tc.chart)
			}
		})
	}

	// Next to them, what is fine: a ServiceAccount of relayd's own, bound
	// the Secrets grant, and other extraEnv names.
	objs := renderChart(t, "relayd", "relayd", "serviceAccount: {create: false, name: relayd-sa}\nextraEnv: [{name: HTTPS_PROXY, value: 'http://proxy:3128'}, {name: MY_RELAYD_X, value: '1'}]\n"+secretSourceValues)
	var bound []string
	for _, o := range ofKind(objs, "ClusterRoleBinding") {
		for _, s := range typed[rbacv1.ClusterRoleBinding](t, o).Subjects {
			bound = append(bound, s.Kind+" "+s.Namespace+"/"+s.Name)
		}
	}
	if !slices.Equal(bound, []string{"ServiceAccount relayd/relayd-sa"}) {
		t.Errorf("the ClusterRoleBinding binds %q, want ServiceAccount relayd/relayd-sa", bound)
	}
	if p := permissions(t, objs); !slices.ContainsFunc(p, func(p permission) bool { return p.resource == "secrets" && p.verb == "watch" }) {
		t.Errorf("permissions %v: no watch on secrets", p)
	}
}

// builtinClusterNames are names of the cluster-scoped RBAC objects
// Kubernetes itself creates (and system:* ones).
var builtinClusterNames = []string{"cluster-admin", "admin", "edit", "view"}

// TestHelmChartClusterScopedNamesAreNeverBuiltIn: a release named like a
// built-in ClusterRole renders its cluster-scoped objects as
// relayd:<namespace>:<release>, never a built-in name; two releases of one
// name in two namespaces render different cluster-scoped names. Applied
// server-side (forced, as `kubectl apply --server-side --force-conflicts`
// and GitOps do) to a real apiserver, the built-in cluster-admin keeps its
// rules, and each release's ClusterRoleBinding binds its own namespace's
// ServiceAccount, which may list and watch Deployments everywhere.
func TestHelmChartClusterScopedNamesAreNeverBuiltIn(t *testing.T) {
	for _, release := range builtinClusterNames {
		for _, o := range renderChart(t, release, "relayd") {
			if o.GetNamespace() != "" {
				continue
			}
			if n := o.GetName(); slices.Contains(builtinClusterNames, n) || strings.HasPrefix(n, "system:") || n != "relayd:relayd:"+release {
				t.Errorf("release %s: %s is named %q, want relayd:relayd:%s", release, describe(o), n, release)
			}
		}
	}

	stamp := time.Now().UnixNano() // new per run: -count=N works
	namespaces := []string{fmt.Sprintf("relayd-a-%d", stamp), fmt.Sprintf("relayd-b-%d", stamp)}
	c := newCluster(t, env)
	seen := map[string]string{}
	for _, ns := range namespaces {
		objs := renderChart(t, "cluster-admin", ns)
		for _, o := range objs {
			if o.GetNamespace() == "" {
				if other, ok := seen[o.GetKind()+" "+o.GetName()]; ok {
					t.Errorf("namespaces %s and %s both render %s", other, ns, describe(o))
				}
				seen[o.GetKind()+" "+o.GetName()] = ns
			} else {
				c.ensureNamespace(t, o.GetNamespace())
			}
		}
		for _, o := range objs {
			c.apply(t, o)
		}
	}
	admin, err := c.cs.RbacV1().ClusterRoles().Get(t.Context(), "cluster-admin", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(admin.Rules) == 0 || !slices.Contains(admin.Rules[0].Verbs, "*") || admin.Labels["app.kubernetes.io/instance"] != "" {
		t.Errorf("the built-in cluster-admin was changed: rules %v, labels %v", admin.Rules, admin.Labels)
	}
	for _, ns := range namespaces {
		name := "relayd:" + ns + ":cluster-admin"
		b, err := c.cs.RbacV1().ClusterRoleBindings().Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("ClusterRoleBinding %s: %v", name, err)
		}
		if b.RoleRef.Name != name || len(b.Subjects) != 1 || b.Subjects[0].Namespace != ns || b.Subjects[0].Name != "cluster-admin" {
			t.Errorf("ClusterRoleBinding %s: roleRef %v, subjects %v; want %s and ServiceAccount %s/cluster-admin", name, b.RoleRef, b.Subjects, name, ns)
		}
		as := tokenClient(t, env, c.serviceAccountToken(t, ns, "cluster-admin"))
		waitAccess(t, as, permission{verb: "watch", group: "apps", resource: "deployments"}, true)
		waitAccess(t, as, permission{verb: "list", group: "", resource: "secrets"}, false)
	}
}
