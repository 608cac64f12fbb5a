package observability

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/relayd/relayd/internal/testutil"
)

const (
	rulesFile      = "deploy/prometheus/relayd-rules.yaml"
	rulesTestFile  = "deploy/prometheus/relayd-rules_test.yaml"
	dashboardFile  = "deploy/grafana/relayd.json"
	componentDir   = "deploy/monitoring"
	dashboardCopy  = "deploy/monitoring/relayd.json"
	promRuleFile   = "deploy/monitoring/prometheusrule.yaml"
	serviceMonFile = "deploy/monitoring/servicemonitor.yaml"
)

func TestRulesUnit(t *testing.T) {
	promtool := tool(t, "promtool")
	root := testutil.RepoRootT(t)
	for _, args := range [][]string{
		{"check", "rules", rulesFile},
		{"test", "rules", rulesTestFile},
	} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// ruleGroups is the part of a rule file the two shipped forms share.
type ruleGroups struct {
	Groups []map[string]any `yaml:"groups"`
}

func TestPrometheusRuleMatchesPlainRules(t *testing.T) {
	var plain ruleGroups
	if err := yaml.Unmarshal(repoFile(t, rulesFile), &plain); err != nil {
		t.Fatal(err)
	}
	var pr struct {
		APIVersion string `yaml:"apiVersion"`
		Kind       string `yaml:"kind"`
		Spec       struct {
			Groups []map[string]any `yaml:"groups"`
		} `yaml:"spec"`
	}
	if err := yaml.Unmarshal(repoFile(t, promRuleFile), &pr); err != nil {
		t.Fatal(err)
	}
	if pr.APIVersion != "monitoring.coreos.com/v1" || pr.Kind != "PrometheusRule" {
		t.Errorf("%s is %s %s, want monitoring.coreos.com/v1 PrometheusRule", promRuleFile, pr.APIVersion, pr.Kind)
	}
	if len(plain.Groups) == 0 {
		t.Fatalf("%s has no groups", rulesFile)
	}
	if !reflect.DeepEqual(plain.Groups, pr.Spec.Groups) {
		a, _ := yaml.Marshal(plain.Groups)
		b, _ := yaml.Marshal(pr.Spec.Groups)
		t.Errorf("spec.groups of %s differ from the groups of %s:\n--- plain\n%s\n--- PrometheusRule\n%s", promRuleFile, rulesFile, a, b)
	}
	// Every alert carries a severity and both annotations (STYLE.md).
	for _, g := range plain.Groups {
		rules, _ := g["rules"].([]any)
		for _, r := range rules {
			rule := r.(map[string]any)
			name, _ := rule["alert"].(string)
			if name == "" {
				continue
			}
			if !strings.HasPrefix(name, "Relayd") {
				t.Errorf("alert %s: want the Relayd prefix", name)
			}
			labels, _ := rule["labels"].(map[string]any)
			if s, _ := labels["severity"].(string); s != "critical" && s != "warning" && s != "info" {
				t.Errorf("alert %s: severity %q", name, s)
			}
			ann, _ := rule["annotations"].(map[string]any)
			for _, k := range []string{"summary", "description"} {
				if s, _ := ann[k].(string); s == "" {
					t.Errorf("alert %s: no %s annotation", name, k)
				}
			}
			if !bytes.Contains(repoFile(t, rulesTestFile), []byte("alertname: "+name+"\n")) {
				t.Errorf("alert %s has no promtool unit test in %s", name, rulesTestFile)
			}
		}
	}
}

func TestMonitoringComponent(t *testing.T) {
	var k struct {
		APIVersion string   `yaml:"apiVersion"`
		Kind       string   `yaml:"kind"`
		Resources  []string `yaml:"resources"`
		Generators []struct {
			Name    string   `yaml:"name"`
			Files   []string `yaml:"files"`
			Options struct {
				DisableNameSuffixHash bool              `yaml:"disableNameSuffixHash"`
				Labels                map[string]string `yaml:"labels"`
			} `yaml:"options"`
		} `yaml:"configMapGenerator"`
	}
	if err := yaml.Unmarshal(repoFile(t, filepath.Join(componentDir, "kustomization.yaml")), &k); err != nil {
		t.Fatal(err)
	}
	if k.APIVersion != "kustomize.config.k8s.io/v1alpha1" || k.Kind != "Component" {
		t.Errorf("kustomization is %s %s, want kustomize.config.k8s.io/v1alpha1 Component", k.APIVersion, k.Kind)
	}
	if want := []string{"servicemonitor.yaml", "prometheusrule.yaml"}; !reflect.DeepEqual(k.Resources, want) {
		t.Errorf("resources %v, want %v", k.Resources, want)
	}
	if len(k.Generators) != 1 {
		t.Fatalf("configMapGenerator: %d entries, want 1", len(k.Generators))
	}
	g := k.Generators[0]
	if !reflect.DeepEqual(g.Files, []string{"relayd.json"}) || !g.Options.DisableNameSuffixHash || g.Options.Labels["grafana_dashboard"] != "1" {
		t.Errorf("dashboard generator %+v: want files [relayd.json], disableNameSuffixHash, label grafana_dashboard: \"1\"", g)
	}
	// kustomize loads files only inside the component, so it ships a copy.
	if !bytes.Equal(repoFile(t, dashboardFile), repoFile(t, dashboardCopy)) {
		t.Errorf("%s differs from %s: cp %[2]s %[1]s", dashboardCopy, dashboardFile)
	}

	var sm struct {
		Kind string `yaml:"kind"`
		Spec struct {
			Selector struct {
				MatchLabels map[string]string `yaml:"matchLabels"`
			} `yaml:"selector"`
			Endpoints []struct {
				Port        string `yaml:"port"`
				Relabelings []struct {
					TargetLabel string `yaml:"targetLabel"`
					Replacement string `yaml:"replacement"`
				} `yaml:"relabelings"`
			} `yaml:"endpoints"`
		} `yaml:"spec"`
	}
	if err := yaml.Unmarshal(repoFile(t, serviceMonFile), &sm); err != nil {
		t.Fatal(err)
	}
	if sm.Kind != "ServiceMonitor" || sm.Spec.Selector.MatchLabels["app.kubernetes.io/name"] != "relayd" ||
		len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "metrics" {
		t.Errorf("ServiceMonitor %+v: want selector app.kubernetes.io/name: relayd and one endpoint on port metrics", sm)
	}
	// The alert rules select job="relayd"; the ServiceMonitor must produce it.
	if len(sm.Spec.Endpoints) == 1 {
		rl := sm.Spec.Endpoints[0].Relabelings
		if len(rl) != 1 || rl[0].TargetLabel != "job" || rl[0].Replacement != "relayd" {
			t.Errorf("ServiceMonitor relabelings %+v: want job set to relayd", rl)
		}
	}
}

// dashboard is the part of the Grafana model the tests look at.
type dashboard struct {
	UID        string          `json:"uid"`
	Title      string          `json:"title"`
	Inputs     json.RawMessage `json:"__inputs"`
	Templating struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"`
			Definition string          `json:"definition"`
			Datasource *datasourceRef  `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

type datasourceRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type panel struct {
	ID         int            `json:"id"`
	Title      string         `json:"title"`
	Type       string         `json:"type"`
	Datasource *datasourceRef `json:"datasource"`
	Targets    []struct {
		RefID      string         `json:"refId"`
		Expr       string         `json:"expr"`
		Datasource *datasourceRef `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // collapsed rows
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	raw := repoFile(t, dashboardFile)
	if !json.Valid(raw) {
		t.Fatalf("%s is not valid JSON", dashboardFile)
	}
	var d dashboard
	dec := json.NewDecoder(bytes.NewReader(raw))
	if err := dec.Decode(&d); err != nil {
		t.Fatal(err)
	}
	return d
}

// allPanels flattens rows.
func allPanels(ps []panel) []panel {
	var out []panel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, allPanels(p.Panels)...)
	}
	return out
}

var (
	rangeFnRe   = regexp.MustCompile(`\b(rate|irate|increase|delta|idelta|deriv|changes|resets|[a-z]+_over_time)\s*\(`)
	rangeSelRe  = regexp.MustCompile(`\[([^\]]+)\]`)
	variableRe  = regexp.MustCompile(`\$\{?(\w+)\}?`)
	dashVarUsed = []string{"job", "namespace"}
)

func TestDashboard(t *testing.T) {
	d := loadDashboard(t)
	if d.UID == "" || d.UID != "relayd-overview" {
		t.Errorf("uid %q, want the fixed uid relayd-overview", d.UID)
	}
	if d.Title == "" {
		t.Error("no title")
	}
	if len(d.Inputs) > 0 {
		t.Error("__inputs present: use the datasource template variable instead")
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
		if v.Type == "query" && (v.Datasource == nil || v.Datasource.UID != "${datasource}") {
			t.Errorf("variable %s: datasource %+v, want uid ${datasource}", v.Name, v.Datasource)
		}
	}
	if vars["datasource"] != "datasource" {
		t.Errorf("no template variable datasource of type datasource (have %v)", vars)
	}
	for _, v := range dashVarUsed {
		if vars[v] != "query" {
			t.Errorf("no query template variable %s (have %v)", v, vars)
		}
	}

	ids := map[int]string{}
	targets := 0
	for _, p := range allPanels(d.Panels) {
		if other, dup := ids[p.ID]; dup {
			t.Errorf("panel id %d used by %q and %q", p.ID, other, p.Title)
		}
		ids[p.ID] = p.Title
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: datasource %+v, want uid ${datasource}", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no targets", p.Title)
		}
		for _, tg := range p.Targets {
			targets++
			where := p.Title + "/" + tg.RefID
			if tg.Datasource == nil || tg.Datasource.UID != "${datasource}" {
				t.Errorf("%s: target datasource %+v, want uid ${datasource}", where, tg.Datasource)
			}
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("%s: empty expr", where)
			}
			if rangeFnRe.MatchString(tg.Expr) {
				for _, m := range rangeSelRe.FindAllStringSubmatch(tg.Expr, -1) {
					if m[1] != "$__rate_interval" {
						t.Errorf("%s: range [%s], want [$__rate_interval]: %s", where, m[1], tg.Expr)
					}
				}
			}
			for _, m := range variableRe.FindAllStringSubmatch(tg.Expr, -1) {
				if _, ok := vars[m[1]]; !ok && !strings.HasPrefix(m[1], "__") {
					t.Errorf("%s: unknown variable $%s", where, m[1])
				}
			}
			for _, v := range dashVarUsed {
				if !strings.Contains(tg.Expr, v+`=~"$`+v+`"`) {
					t.Errorf("%s: does not filter by $%s: %s", where, v, tg.Expr)
				}
			}
		}
	}
	if targets == 0 {
		t.Fatal("no targets")
	}
}

// TestOperationsAlertTable keeps the alert table in docs/OPERATIONS.md's
// "## Metrics" section in step with the rules.
func TestOperationsAlertTable(t *testing.T) {
	var rf ruleGroups
	if err := yaml.Unmarshal(repoFile(t, rulesFile), &rf); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for _, g := range rf.Groups {
		rules, _ := g["rules"].([]any)
		for _, r := range rules {
			rule := r.(map[string]any)
			if name, _ := rule["alert"].(string); name != "" {
				labels, _ := rule["labels"].(map[string]any)
				want[name], _ = labels["severity"].(string)
			}
		}
	}
	got := map[string]string{}
	for _, cells := range operationsTable(t, "| alert | severity | fires when |") {
		if len(cells) != 3 {
			t.Errorf("docs/OPERATIONS.md alert row %v: want 3 cells", cells)
			continue
		}
		got[strings.Trim(cells[0], "`")] = cells[1]
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("docs/OPERATIONS.md alert table %v, rules %v", got, want)
	}
}
