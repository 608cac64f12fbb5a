package observability

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"text/template"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.yaml.in/yaml/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/relayd/relayd/internal/testutil"
	"github.com/relayd/relayd/pkg/config"
	"github.com/relayd/relayd/pkg/relay"
)

// relayConfig is the config of the relayd under test; one source watching
// ConfigMaps in the test namespace. The cluster is named after the
// namespace: its stream's subjects must not overlap a stream of an earlier
// run on the same NATS server (go test -count).
const relayConfig = `
cluster: {{.NS}}
nats:
  url: {{.URL}}
  publishTimeout: 2s
  maxInFlight: 64
  stream:
    name: {{.Stream}}
    create: true
    duplicateWindow: 10m
checkpoint:
  namespace: {{.NS}}
  name: cp
  flushInterval: 200ms
watch:
  timeout: 60s
sources:
  - name: cms
    apiVersion: v1
    kind: ConfigMap
    namespaces: [{{.NS}}]
`

// The scrape config of the Prometheus under test: relayd as job "relayd"
// (what the ServiceMonitor produces), with a namespace label as the
// ServiceMonitor's target labels would add, and the shipped rules loaded.
const promConfig = `
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - {{.Rules}}
scrape_configs:
  - job_name: relayd
    scrape_interval: 1s
    scrape_timeout: 1s
    static_configs:
      - targets: ['{{.Target}}']
        labels:
          namespace: relayd-test
`

// httpc never keeps connections, so nothing outlives the test (goleak).
var httpc = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

func render(t *testing.T, tmpl string, data any) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := template.Must(template.New("").Parse(tmpl)).Execute(&b, data); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func httpGet(u string) (int, []byte, error) {
	resp, err := httpc.Get(u)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// startRelay runs relay.Run in-process on a fresh registry and returns the
// metrics address once relayd is ready.
func startRelay(t *testing.T, ns string) (string, *prometheus.Registry) {
	t.Helper()
	cfgYAML := render(t, relayConfig, map[string]string{
		"URL": natsSrv.URL(), "Stream": fmt.Sprintf("OBS%d", time.Now().UnixNano()%1e9), "NS": ns,
	})
	cfg, err := config.Parse(cfgYAML, "test.yaml")
	if err != nil {
		t.Fatalf("config: %v\n%s", err, cfgYAML)
	}
	reg := prometheus.NewRegistry()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	type addrs struct{ metrics, health string }
	ready := make(chan addrs, 1)
	go func() {
		done <- relay.Run(ctx, relay.Options{
			Config: cfg, RestConfig: env.AdminConfig(), Registry: reg,
			Logger:      zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)),
			MetricsAddr: "127.0.0.1:0", HealthAddr: "127.0.0.1:0",
			Ready: func(m, h string) { ready <- addrs{m, h} },
		})
	}()
	var a addrs
	select {
	case a = <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("relay.Run returned at start: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("relay.Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("relay.Run did not return within 30s of cancel")
		}
	})
	testutil.Eventually(t, 30*time.Second, "relayd ready", func() error {
		code, body, err := httpGet("http://" + a.health + "/readyz")
		if err != nil {
			return err
		}
		if code != http.StatusOK {
			return fmt.Errorf("readyz %d: %s", code, body)
		}
		return nil
	})
	return a.metrics, reg
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startPrometheus runs a real prometheus scraping target every second and
// returns its base URL. It is killed (by PID) in cleanup, and by the kernel
// if the test binary dies first.
func startPrometheus(t *testing.T, target string) string {
	t.Helper()
	bin := tool(t, "prometheus")
	dir := t.TempDir()
	cfgFile := filepath.Join(dir, "prometheus.yml")
	cfg := render(t, promConfig, map[string]string{
		"Rules": filepath.Join(testutil.RepoRootT(t), rulesFile), "Target": target,
	})
	if err := os.WriteFile(cfgFile, cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	logFile := filepath.Join(dir, "prometheus.log")
	out, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin,
		"--config.file="+cfgFile,
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr,
		"--log.level=warn",
	)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		out.Close()
		t.Fatalf("start %s: %v", bin, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		out.Close()
		close(exited)
	}()
	pid := cmd.Process.Pid
	t.Cleanup(func() {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		<-exited
		if t.Failed() {
			if b, err := os.ReadFile(logFile); err == nil {
				t.Logf("prometheus log:\n%s", b)
			}
		}
	})
	base := "http://" + addr
	testutil.Eventually(t, 30*time.Second, "prometheus ready", func() error {
		select {
		case <-exited:
			b, _ := os.ReadFile(logFile)
			t.Fatalf("prometheus exited:\n%s", b)
		default:
		}
		code, body, err := httpGet(base + "/-/ready")
		if err != nil {
			return err
		}
		if code != http.StatusOK {
			return fmt.Errorf("/-/ready %d: %s", code, body)
		}
		return nil
	})
	return base
}

// queryResult is an /api/v1/query answer.
type queryResult struct {
	Status    string `json:"status"`
	ErrorType string `json:"errorType"`
	Error     string `json:"error"`
	Data      struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	} `json:"data"`
}

type sample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

// query evaluates expr at now; an error means it did not parse or evaluate.
func query(base, expr string) ([]sample, error) {
	code, body, err := httpGet(base + "/api/v1/query?query=" + url.QueryEscape(expr))
	if err != nil {
		return nil, err
	}
	var r queryResult
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("HTTP %d, undecodable answer %q: %v", code, body, err)
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("%s: %s", r.ErrorType, r.Error)
	}
	switch r.Data.ResultType {
	case "vector":
		var s []sample
		if err := json.Unmarshal(r.Data.Result, &s); err != nil {
			return nil, err
		}
		return s, nil
	case "scalar":
		var v [2]any
		if err := json.Unmarshal(r.Data.Result, &v); err != nil {
			return nil, err
		}
		return []sample{{Value: v}}, nil
	default:
		return nil, fmt.Errorf("result type %s", r.Data.ResultType)
	}
}

func value(s sample) float64 {
	str, _ := s.Value[1].(string)
	f, _ := strconv.ParseFloat(str, 64)
	return f
}

// atLeast waits until expr returns a series with a value >= min.
func atLeast(t *testing.T, base, expr string, min float64) {
	t.Helper()
	testutil.Eventually(t, 60*time.Second, expr+" >= "+fmt.Sprint(min), func() error {
		s, err := query(base, expr)
		if err != nil {
			return err
		}
		for _, x := range s {
			if value(x) >= min {
				return nil
			}
		}
		return fmt.Errorf("got %v", s)
	})
}

// makeChanges creates, updates and deletes ConfigMaps in ns.
func makeChanges(t *testing.T, cs kubernetes.Interface, ns string, round int) {
	t.Helper()
	ctx := t.Context()
	cms := cs.CoreV1().ConfigMaps(ns)
	for i := range 5 {
		name := fmt.Sprintf("cm-%d-%d", round, i)
		cm, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"v": "1"}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cm.Data["v"] = "2"
		if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			if err := cms.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// grafanaVars substitutes Grafana's variables in expr: ranges as Grafana
// would pick them at a 15s interval, template variables by the (regexp-quoted)
// values in vars. An unknown variable is left alone, so the query fails.
func grafanaVars(expr string, vars map[string]string) string {
	builtin := map[string]string{"__rate_interval": "1m", "__interval": "15s", "__range": "5m"}
	return variableRe.ReplaceAllStringFunc(expr, func(m string) string {
		name := variableRe.FindStringSubmatch(m)[1]
		if v, ok := builtin[name]; ok {
			return v
		}
		if v, ok := vars[name]; ok {
			// A regexp (the variables are used with =~) in a PromQL string.
			return strings.ReplaceAll(regexp.QuoteMeta(v), `\`, `\\`)
		}
		return m
	})
}

// thresholdRe is a comparison against a number literal: what the test
// removes from an alert expression to see the series it compares.
var thresholdRe = regexp.MustCompile(`\s*(==|!=|>=|<=|>|<)\s*(bool\s+)?[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?\b`)

// labelValuesRe is Grafana's label_values(selector, label) variable query.
var labelValuesRe = regexp.MustCompile(`^label_values\((.+),\s*(\w+)\)$`)

func TestQueriesAgainstRealPrometheus(t *testing.T) {
	ns := fmt.Sprintf("obs-%d", time.Now().UnixNano()%1e6)
	cs, err := kubernetes.NewForConfig(env.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Objects before relayd starts: its initial snapshot publishes them.
	makeChanges(t, cs, ns, 0)
	target, _ := startRelay(t, ns)
	base := startPrometheus(t, target)

	// Scraped, and then real changes relayed while Prometheus watches.
	atLeast(t, base, `up{job="relayd"}`, 1)
	makeChanges(t, cs, ns, 1)
	makeChanges(t, cs, ns, 2)
	atLeast(t, base, `sum(relayd_events_total{job="relayd", origin="watch"})`, 25)
	atLeast(t, base, `sum(relayd_events_total{job="relayd", origin="initial"})`, 1)
	atLeast(t, base, `sum(relayd_publish_lag_seconds_count{job="relayd"})`, 25)
	atLeast(t, base, `sum(relayd_checkpoint_writes_total{job="relayd"})`, 1)
	// relayd_ready follows /readyz (startRelay waited for its 200).
	atLeast(t, base, `relayd_ready{job="relayd"}`, 1)
	// Rates over 1m need a few scrapes in the window after the changes.
	atLeast(t, base, `count_over_time(up{job="relayd"}[1m])`, 5)
	time.Sleep(3 * time.Second)

	t.Run("dashboard", func(t *testing.T) {
		d := loadDashboard(t)
		n := 0
		// Each variable query, in order, gets the value it offers first, so
		// the panels are evaluated as an operator would see them, and a
		// misspelt label in a matcher finds nothing.
		vars := map[string]string{}
		for _, v := range d.Templating.List {
			if v.Type != "query" {
				continue
			}
			m := labelValuesRe.FindStringSubmatch(v.Definition)
			if m == nil {
				t.Errorf("variable %s: query %q is not label_values(selector, label)", v.Name, v.Definition)
				continue
			}
			expr := grafanaVars(m[1], vars)
			s, err := query(base, expr)
			if err != nil {
				t.Errorf("variable %s: %s: %v", v.Name, expr, err)
				continue
			}
			for _, x := range s {
				if val := x.Metric[m[2]]; val != "" {
					vars[v.Name] = val
					break
				}
			}
			if _, ok := vars[v.Name]; !ok {
				t.Errorf("variable %s: %s has no series with label %s: %v", v.Name, expr, m[2], s)
			}
			n++
		}
		for _, p := range allPanels(d.Panels) {
			for _, tg := range p.Targets {
				expr := grafanaVars(tg.Expr, vars)
				s, err := query(base, expr)
				switch {
				case err != nil:
					t.Errorf("panel %q %s: %s: %v", p.Title, tg.RefID, expr, err)
				case len(s) == 0:
					t.Errorf("panel %q %s: no series: %s", p.Title, tg.RefID, expr)
				}
				n++
			}
		}
		t.Logf("%d dashboard queries evaluated with %v", n, vars)
	})

	t.Run("alerts", func(t *testing.T) {
		var rf ruleGroups
		if err := yaml.Unmarshal(repoFile(t, rulesFile), &rf); err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, g := range rf.Groups {
			rules, _ := g["rules"].([]any)
			for _, r := range rules {
				rule := r.(map[string]any)
				name, _ := rule["alert"].(string)
				if name == "" {
					name, _ = rule["record"].(string)
				}
				expr, _ := rule["expr"].(string)
				if _, err := query(base, expr); err != nil {
					t.Errorf("%s: %s: %v", name, expr, err)
					continue
				}
				input := thresholdRe.ReplaceAllString(expr, "")
				if input == expr {
					t.Errorf("%s: no comparison against a number to remove: %s", name, expr)
				}
				s, err := query(base, input)
				switch {
				case err != nil:
					t.Errorf("%s: input %s: %v", name, input, err)
				case len(s) == 0:
					t.Errorf("%s: input has no series: %s", name, input)
				default:
					t.Logf("%s: %d series in %s", name, len(s), input)
				}
				n++
			}
		}
		if n == 0 {
			t.Fatal("no rules")
		}
	})

	t.Run("rules loaded", func(t *testing.T) {
		testutil.Eventually(t, 30*time.Second, "every rule evaluated without error", func() error {
			_, body, err := httpGet(base + "/api/v1/rules")
			if err != nil {
				return err
			}
			var r struct {
				Data struct {
					Groups []struct {
						Rules []struct {
							Name      string `json:"name"`
							Health    string `json:"health"`
							LastError string `json:"lastError"`
						} `json:"rules"`
					} `json:"groups"`
				} `json:"data"`
			}
			if err := json.Unmarshal(body, &r); err != nil {
				return err
			}
			n := 0
			for _, g := range r.Data.Groups {
				for _, rule := range g.Rules {
					n++
					if rule.Health != "ok" {
						return fmt.Errorf("rule %s: health %q %s", rule.Name, rule.Health, rule.LastError)
					}
				}
			}
			if n == 0 {
				return fmt.Errorf("no rules loaded: %s", body)
			}
			return nil
		})
	})
}
