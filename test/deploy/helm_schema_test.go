package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/relayd/relayd/internal/testutil"
)

// chartSchemaErr starts helm's message for values its schema refuses.
const chartSchemaErr = "values don't meet the specifications of the schema(s)"

// TestHelmSchemaRefusesWhatCheckConfigRefuses: the chart's values schema
// (its config part generated from pkg/config, docs/CONFIGURATION.md
// "Editor and chart schema") refuses a mistake in config, naming the key,
// in `helm template` and `helm lint --strict`; without the schema the chart
// renders it, and relayd check-config refuses the config the pod would
// read. A typo such as `namespace:` for `namespaces:` would otherwise give
// the source a ClusterRole (every namespace) and a pod that crash-loops.
func TestHelmSchemaRefusesWhatCheckConfigRefuses(t *testing.T) {
	for _, tc := range []struct{ name, values, schema, checkConfig string }{
		{"namespace for namespaces in a source",
			"config: {sources: [{name: orders, apiVersion: v1, kind: ConfigMap, namespace: shop}]}\nrbac: {resources: {orders: configmaps}}\n",
			"at '/config/sources/0': additional properties 'namespace' not allowed",
			`sources[0].namespace: unknown key (did you mean "namespaces"?)`},
		{"unknown key in config", "config: {sourcez: []}\n",
			"at '/config': additional properties 'sourcez' not allowed", `sourcez: unknown key (did you mean "sources"?)`},
		{"unknown key under config.nats", "config: {nats: {urls: [nats://a:4222]}}\n",
			"at '/config/nats': additional properties 'urls' not allowed", `nats.urls: unknown key (did you mean "url"?)`},
		{"unknown key under config.checkpoint", "config: {checkpoint: {interval: 5s}}\n",
			"at '/config/checkpoint': additional properties 'interval' not allowed", "checkpoint.interval: unknown key"},
		{"unknown key under config.watch", "config: {watch: {timout: 5m}}\n",
			"at '/config/watch': additional properties 'timout' not allowed", `watch.timout: unknown key (did you mean "timeout"?)`},
		{"a string for an integer", "config: {nats: {maxInFlight: lots}}\n",
			"at '/config/nats/maxInFlight': got string, want integer", `nats.maxInFlight: expected an integer, got "lots"`},
		{"not a CloudEvents mode", "config: {cloudevents: {mode: batch}}\n",
			"at '/config/cloudevents/mode': value must be one of 'structured', 'binary'", `cloudevents.mode: "batch" is not a valid mode`},
		{"a duration in words", "config: {watch: {timeout: 5 minutes}}\n",
			"at '/config/watch/timeout': '5 minutes' does not match pattern", `watch.timeout: invalid duration "5 minutes"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, args := range [][]string{{"template", "relayd", chartDir}, {"lint", "--strict", chartDir}} {
				out, err := helm(t, args, tc.values)
				msg := string(out)
				if err != nil {
					msg += err.Error()
				}
				if err == nil || !strings.Contains(msg, chartSchemaErr) || !strings.Contains(msg, tc.schema) {
					t.Errorf("helm %s: %v\n%s\nwant the schema's error %q", args[0], err, out, tc.schema)
				}
			}
			// Without the schema: the config the pod would read.
			out, err := helm(t, []string{"template", "relayd", chartDir, "-n", "relayd", "--skip-schema-validation"}, tc.values)
			if err != nil {
				t.Fatal(err)
			}
			doc := renderedConfig(t, out)
			f := filepath.Join(t.TempDir(), "config.yaml")
			if err := os.WriteFile(f, []byte(doc), 0o600); err != nil {
				t.Fatal(err)
			}
			res, err := exec.Command(relaydBin(t), "check-config", "-c", f).CombinedOutput()
			if err == nil || !strings.Contains(string(res), "FAILED") || !strings.Contains(string(res), tc.checkConfig) {
				t.Errorf("relayd check-config on the rendered config: %v\n%s\nwant FAILED naming %q; the config:\n%s", err, res, tc.checkConfig, doc)
			}
		})
	}
}

// renderedConfig is the config file of a chart render: the data of its
// config ConfigMap.
func renderedConfig(t *testing.T, render []byte) string {
	t.Helper()
	objs, err := decodeObjects(render)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range ofKind(objs, "ConfigMap") {
		if o.GetLabels()["app.kubernetes.io/component"] == "config" {
			cm := typed[corev1.ConfigMap](t, o)
			if doc, ok := cm.Data["config.yaml"]; ok {
				return doc
			}
		}
	}
	t.Fatalf("no config ConfigMap with config.yaml in the render:\n%s", render)
	return ""
}

// TestHelmSchemaAcceptsTheRepositorysConfigs: the chart's schema accepts
// each config file the repository ships as chart config (a failure the
// chart itself reports, such as a kind-named source without its
// rbac.resources entry, is not the schema's).
func TestHelmSchemaAcceptsTheRepositorysConfigs(t *testing.T) {
	files := []string{"config.example.yaml", "deploy/base/config.yaml"}
	overlays, err := filepath.Glob(filepath.Join(testutil.RepoRootT(t), "deploy/overlays/*/config.yaml"))
	if err != nil || len(overlays) == 0 {
		t.Fatalf("no deploy/overlays/*/config.yaml (%v)", err)
	}
	for _, o := range overlays {
		rel, _ := filepath.Rel(testutil.RepoRootT(t), o)
		files = append(files, rel)
	}
	for _, f := range files {
		values := valuesDoc(t, map[string]any{"config": yamlMap(t, repoFile(t, f))})
		out, err := helm(t, []string{"template", "relayd", chartDir}, values)
		if err != nil && strings.Contains(err.Error(), chartSchemaErr) {
			t.Errorf("%s: the chart's schema refuses it: %v\n%s", f, err, out)
		}
	}
}
