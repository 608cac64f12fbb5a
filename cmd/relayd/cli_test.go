package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/testenv"
)

// binResult is the outcome of one run of bin/relayd.
type binResult struct {
	code           int
	stdout, stderr string
}

// runBin runs $RELAYD_BIN with args (and stdin, when not ""), in an
// environment without NATS_* variables, and returns its exit code and
// output.
func runBin(t *testing.T, stdin string, args ...string) binResult {
	t.Helper()
	// A guard against a hang (relayd run that should have stopped), not a
	// timed assertion.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, testenv.RelaydBin(t), args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "NATS_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("relayd %q: still running after a minute, killed\n%s", args, errb.String())
	}
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("relayd %q: %v", args, err)
	}
	return binResult{cmd.ProcessState.ExitCode(), out.String(), errb.String()}
}

// Every command's --help (and -h, and `relayd help CMD`) is on stdout with
// exit 0, and says what the command does, its flags in GNU style and an
// example; relayd --help lists the exit codes.
func TestHelpOfEveryCommand(t *testing.T) {
	want := map[string][]string{
		"":             {"Usage: relayd <command> [flags]", "Commands:", "Exit codes:", "  2  usage error", "Examples:"},
		"run":          {"Usage: relayd run", "Run the relay", "-c, --config string", "--kubeconfig string", "--context string", "--log-format string", "-h, --help", "Examples:\n  relayd run -c"},
		"check-config": {"Usage: relayd check-config", "Validate config files", "-c, --config stringArray", `"-" reads standard input`, "Examples:\n  relayd check-config -c"},
		"tail":         {"Usage: relayd tail", "Print relayd's events", "-c, --config string", "--replay", "NATS_CONTEXT", "Examples:\n  relayd tail -c"},
		"version":      {"Usage: relayd version", "Print relayd's version", "Examples:\n  relayd version"},
	}
	for cmd, wants := range want {
		var argss [][]string
		if cmd == "" {
			argss = [][]string{{"--help"}, {"-h"}, {"help"}}
		} else {
			argss = [][]string{{cmd, "--help"}, {cmd, "-h"}, {"help", cmd}}
		}
		for _, args := range argss {
			r := runBin(t, "", args...)
			if r.code != 0 || r.stderr != "" {
				t.Errorf("relayd %q: exit %d, stderr %q; want 0 and nothing on stderr", args, r.code, r.stderr)
			}
			for _, w := range wants {
				if !strings.Contains(r.stdout, w) {
					t.Errorf("relayd %q: help lacks %q:\n%s", args, w, r.stdout)
				}
			}
		}
	}
}

// Usage errors go to stderr, name the problem and exit 2; nothing on
// stdout. Go's single-dash long flags (-config, -log-level=x) still parse.
func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--frobnicate"}, "relayd run: unknown flag: --frobnicate\nRun 'relayd run --help' for usage.\n"},
		{[]string{"run", "-c"}, "relayd run: flag needs an argument: 'c' in -c\n"},
		{[]string{"run", "extra"}, `relayd run: unexpected argument "extra"`},
		{[]string{"run", "-c", "x.yaml", "--log-format", "xml"}, `relayd run: --log-format: "xml" is not json or console`},
		{[]string{"check-config"}, "relayd check-config: no file given (-c FILE)"},
		{[]string{"check-config", "--nope"}, "relayd check-config: unknown flag: --nope"},
		{[]string{"tail", "--output", "yaml"}, `relayd tail: --output "yaml": want text or json`},
		{[]string{"tail", "--replay"}, "relayd tail: --replay needs -c config.yaml"},
		{[]string{"version", "x"}, `relayd version: unexpected argument "x"`},
		{[]string{"frobnicate"}, `relayd: unknown command "frobnicate"`},
		{[]string{}, "Usage: relayd <command>"},
	} {
		r := runBin(t, "", tc.args...)
		if r.code != 2 || r.stdout != "" || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("relayd %q: exit %d, stdout %q, stderr:\n%s\nwant exit 2 and stderr holding %q", tc.args, r.code, r.stdout, r.stderr, tc.want)
		}
	}
	// -config and -log-format=console, as the flag package took them.
	r := runBin(t, "", "run", "-config", filepath.Join(t.TempDir(), "missing.yaml"), "-log-format=console")
	if r.code != 1 || !strings.Contains(r.stderr, "missing.yaml: no such file") || strings.Contains(r.stderr, `{"level"`) {
		t.Errorf("single-dash long flags: exit %d\n%s", r.code, r.stderr)
	}
}

// badConfig has three problems on three lines; one of them holds quotes,
// which a JSON log would escape.
const badConfig = `cluster: dev
nats:
  url: "nats://127.0.0.1:4222"
  tokenFile: /s/token
  stream: {name: K8S}
sources:
  - {name: cms, apiVersion: v1, kind: ConfigMap, payload: everything}
watch: {timeout: 5 minutes}
`

// relayd run with a config that does not load prints its problems as
// plain lines on stderr, one problem each, also when the log is JSON; and
// exits 1.
func TestRunPrintsConfigProblemsAsLines(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte(badConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, format := range []string{"json", "console"} {
		r := runBin(t, "", "run", "-c", cfg, "--log-format", format)
		if r.code != 1 {
			t.Fatalf("--log-format %s: exit %d, want 1\n%s", format, r.code, r.stderr)
		}
		lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
		want := []string{
			"relayd: invalid config " + cfg + ":",
			"  " + cfg + `:8: watch.timeout: invalid duration "5 minutes" (use Go syntax such as "30s", "5m" or "1h30m")`,
			"  " + cfg + `:3: nats.url: "nats://127.0.0.1:4222" is not TLS, so nats.tokenFile would authenticate an unencrypted connection (use tls:// or wss://, or a nats.tls key; or set nats.allowPlaintextCredentials to accept that)`,
			"  " + cfg + `:7: sources[0].payload: "everything" is not a valid payload (must be full, metadata or reference)`,
		}
		if len(lines) < len(want)+1 {
			t.Fatalf("--log-format %s: %d lines, want a log line and %d more:\n%s", format, len(lines), len(want), r.stderr)
		}
		if !strings.Contains(lines[0], "invalid config") || !strings.Contains(lines[0], `"problems": 3`) && !strings.Contains(lines[0], `"problems":3`) {
			t.Errorf("--log-format %s: first line %q, want the log entry naming 3 problems", format, lines[0])
		}
		if got := lines[1:]; strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("--log-format %s: problem lines\n%s\nwant\n%s", format, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	}
}

// check-config -c - reads the config from stdin.
func TestCheckConfigFromStdin(t *testing.T) {
	good, err := os.ReadFile("../../config.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	r := runBin(t, string(good), "check-config", "-c", "-")
	if r.code != 0 || r.stdout != "Checking <stdin>\n  SUCCESS\n" {
		t.Errorf("good config on stdin: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = runBin(t, badConfig, "check-config", "-c", "-")
	if r.code != 1 || !strings.Contains(r.stdout, "Checking <stdin>\n  FAILED:\n    <stdin>:8: watch.timeout: invalid duration \"5 minutes\"") ||
		!strings.Contains(r.stdout, "\n    <stdin>:3: nats.url: ") {
		t.Errorf("bad config on stdin: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// File settings given as relative paths are warned about by check-config
// and at start; absolute ones are not.
func TestRelativeFileSettingsAreWarnedAbout(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	doc := "cluster: dev\nsources: [{name: cms, apiVersion: v1, kind: ConfigMap}]\nnats:\n  url: tls://nats:4222\n" +
		"  credentialsFile: secrets/nats.creds\n  tls:\n    caFile: ./ca.pem\n    certFile: /abs/cert.pem\n    keyFile: /abs/key.pem\n  stream: {name: K8S}\n"
	if err := os.WriteFile(cfg, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	warn := func(line int, key, path string) string {
		return cfg + ":" + string(rune('0'+line)) + ": " + key + `: "` + path +
			`" is a relative path, read from relayd's working directory (in a pod, the image's); use an absolute path such as the mount path of its Secret`
	}
	w1, w2 := warn(5, "nats.credentialsFile", "secrets/nats.creds"), warn(7, "nats.tls.caFile", "./ca.pem")
	r := runBin(t, "", "check-config", "-c", cfg)
	if want := "Checking " + cfg + "\n  SUCCESS\n  WARNING: " + w1 + "\n  WARNING: " + w2 + "\n"; r.code != 0 || r.stdout != want {
		t.Errorf("check-config: exit %d\n%s\nwant\n%s", r.code, r.stdout, want)
	}
	r = runBin(t, "", "run", "-c", cfg, "--kubeconfig", filepath.Join(dir, "none"), "--log-format", "console")
	for _, w := range []string{w1, w2} {
		if !strings.Contains(r.stderr, "config warning") || !strings.Contains(unquote(r.stderr), w) {
			t.Errorf("run: exit %d, log lacks the warning %q:\n%s", r.code, w, r.stderr)
		}
	}
}

// --context picks a context of the kubeconfig; a context it does not have
// is an error naming it.
func TestRunContext(t *testing.T) {
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	doc := `apiVersion: v1
kind: Config
clusters:
- {name: a, cluster: {server: "https://a.example:6443"}}
- {name: b, cluster: {server: "https://b.example:6443"}}
users:
- {name: u, user: {token: x}}
contexts:
- {name: ctx-a, context: {cluster: a, user: u}}
- {name: ctx-b, context: {cluster: b, user: u}}
current-context: ctx-a
`
	if err := os.WriteFile(kc, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	for ctx, want := range map[string]string{"": "https://a.example:6443", "ctx-b": "https://b.example:6443"} {
		cfg, err := kubeConfig(kc, ctx)
		if err != nil || cfg.Host != want {
			t.Errorf("--context %q: %v, host %v; want %s", ctx, err, cfg, want)
		}
	}
	good := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(good, []byte("cluster: dev\nsources: [{name: cms, apiVersion: v1, kind: ConfigMap}]\nnats: {url: nats://127.0.0.1:1, stream: {name: K8S}}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := runBin(t, "", "run", "-c", good, "--kubeconfig", kc, "--context", "ctx-nope", "--log-format", "console")
	if r.code != 1 || !strings.Contains(r.stderr, "no Kubernetes credentials") || !strings.Contains(unquote(r.stderr), `context "ctx-nope" does not exist`) {
		t.Errorf("--context ctx-nope: exit %d\n%s", r.code, r.stderr)
	}
}

// A source of Secrets with a filter or keepManagedFields and without
// allowSecretData is refused by check-config and by run (both through
// config.Load's validation), naming each key.
func TestSecretGuardsRefuseFilterAndManagedFields(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	doc := "cluster: dev\nnats: {url: nats://127.0.0.1:4222, stream: {name: K8S}}\nsources:\n" +
		"  - {name: secrets, apiVersion: v1, kind: Secret, payload: metadata, filter: \"object.data.password.startsWith('YQ')\"}\n" +
		"  - {name: secret-refs, resource: {version: v1, resource: secrets}, payload: reference, keepManagedFields: true}\n"
	if err := os.WriteFile(cfg, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	want := []string{
		cfg + `:4: sources[0].filter: evaluates the Secret's data (relayd reads whole Secrets, and whether an object is published, enters or leaves scope tells something about its values); remove it, or set sources[0].allowSecretData: true`,
		cfg + `:5: sources[1].keepManagedFields: true publishes the name of every data key of the Secret (managedFields lists each field a writer set); leave it false, or set sources[1].allowSecretData: true`,
	}
	r := runBin(t, "", "check-config", "-c", cfg)
	if w := "Checking " + cfg + "\n  FAILED:\n    " + want[0] + "\n    " + want[1] + "\n"; r.code != 1 || r.stdout != w {
		t.Errorf("check-config: exit %d\n%s%s\nwant exit 1 and\n%s", r.code, r.stdout, r.stderr, w)
	}
	r = runBin(t, "", "run", "-c", cfg, "--kubeconfig", filepath.Join(dir, "none"), "--log-format", "console")
	if r.code != 1 || !strings.Contains(r.stderr, "  "+want[0]+"\n  "+want[1]+"\n") {
		t.Errorf("run: exit %d, want 1 and the two problems:\n%s", r.code, r.stderr)
	}
}
