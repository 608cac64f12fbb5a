package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheckConfigExitCodes(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("cluster: dev\nsourcez: []\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := run([]string{"check-config", "-c", "../../config.example.yaml"}, nil, &out, &errb); code != 0 {
		t.Fatalf("example config: exit %d\n%s%s", code, out.String(), errb.String())
	}
	if !strings.Contains(out.String(), "SUCCESS") {
		t.Errorf("output %q lacks SUCCESS", out.String())
	}
	out.Reset()
	if code := run([]string{"check-config", "-c", bad}, nil, &out, &errb); code != 1 {
		t.Fatalf("bad config: exit %d, want 1", code)
	}
	for _, want := range []string{"FAILED", "bad.yaml:2: sourcez: unknown key", "sources: at least one source is required"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if code := run([]string{"check-config"}, nil, &out, &errb); code != 2 {
		t.Errorf("no file: exit %d, want 2", code)
	}
}

func TestVersionAndUnknownCommand(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"version"}, nil, &out, &errb); code != 0 || !strings.HasPrefix(out.String(), "relayd ") {
		t.Errorf("version: exit %d, %q", code, out.String())
	}
	if code := run([]string{"frobnicate"}, nil, &out, &errb); code != 2 || !strings.Contains(errb.String(), `unknown command "frobnicate"`) {
		t.Errorf("unknown command: exit %d, %q", code, errb.String())
	}
}

func TestRunWithBadConfigFailsClearly(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"run", "-c", filepath.Join(t.TempDir(), "missing.yaml"), "--log-format", "console"}, nil, &out, &errb); code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	if !strings.Contains(errb.String(), "missing.yaml") {
		t.Errorf("log does not name the file:\n%s", errb.String())
	}
}

// relayd run refuses credentials on a connection without TLS, as
// check-config does, naming nats.url, the URL and the key; with
// nats.allowPlaintextCredentials it logs a warning at start (here before
// it stops for want of Kubernetes credentials) and check-config prints it.
func TestRunAndCheckConfigOnPlaintextCredentials(t *testing.T) {
	dir := t.TempDir()
	write := func(name, extra string) string {
		p := filepath.Join(dir, name)
		doc := "cluster: dev\nsources: [{name: p, apiVersion: v1, kind: Pod}]\nnats:\n  url: nats://127.0.0.1:4222\n  tokenFile: /s/token\n  stream: {name: K8S}\n" + extra
		if err := os.WriteFile(p, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	refused, accepted := write("refused.yaml", ""), write("accepted.yaml", "  allowPlaintextCredentials: true\n")
	const problem = `nats.url: "nats://127.0.0.1:4222" is not TLS, so nats.tokenFile would authenticate an unencrypted connection`

	var out, errb bytes.Buffer
	if code := run([]string{"check-config", "-c", refused}, nil, &out, &errb); code != 1 || !strings.Contains(out.String(), "refused.yaml:4: "+problem) {
		t.Errorf("check-config: exit %d\n%s", code, out.String())
	}
	out.Reset()
	if code := run([]string{"run", "-c", refused, "--kubeconfig", filepath.Join(dir, "none")}, nil, &out, &errb); code != 1 ||
		!strings.Contains(errb.String(), `"msg":"invalid config"`) || !strings.Contains(unquote(errb.String()), problem) {
		t.Errorf("run: exit %d\n%s", code, errb.String())
	}
	errb.Reset()

	warning := `accepted.yaml:7: nats.allowPlaintextCredentials: "nats://127.0.0.1:4222" is not TLS, so nats.tokenFile would authenticate an unencrypted connection`
	if code := run([]string{"check-config", "-c", accepted}, nil, &out, &errb); code != 0 || !strings.Contains(out.String(), "  SUCCESS\n  WARNING: "+dir+"/"+warning+"\n") {
		t.Errorf("check-config: exit %d\n%s", code, out.String())
	}
	if code := run([]string{"run", "-c", accepted, "--kubeconfig", filepath.Join(dir, "none")}, nil, &out, &errb); code != 1 ||
		!strings.Contains(errb.String(), `"msg":"config warning"`) || !strings.Contains(unquote(errb.String()), warning) ||
		!strings.Contains(errb.String(), "no Kubernetes credentials") {
		t.Errorf("run: exit %d\n%s", code, errb.String())
	}
}

// unquote undoes the JSON log's escaping of quotes.
func unquote(s string) string { return strings.ReplaceAll(s, `\"`, `"`) }
