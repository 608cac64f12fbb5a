package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/testenv"
)

// freeAddr returns a loopback address with a port free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// A kind no apiserver serves (misspelled) is reported at start with the
// nearest served kind: in the log and in /readyz, naming the source; the
// source stays down, relayd keeps running (no crash loop) and its other
// source's watch is established (/readyz does not name it).
func TestMisspelledKindIsReportedWithASuggestion(t *testing.T) {
	env := testenv.StartT(t, testenv.Options{})
	nats := testenv.NATST(t, testenv.NATSOptions{})
	dir := t.TempDir()
	kc, cfg, logPath := filepath.Join(dir, "kubeconfig"), filepath.Join(dir, "config.yaml"), filepath.Join(dir, "relayd.log")
	if err := env.WriteKubeconfig(kc, false); err != nil {
		t.Fatal(err)
	}
	doc := fmt.Sprintf(`cluster: dev
nats: {url: %q, stream: {name: K8S, create: true}}
checkpoint: {namespace: default, name: relayd-kind-test}
sources:
  - {name: deploys, apiVersion: apps/v1, kind: Deploymnet}
  - {name: cms, apiVersion: v1, kind: ConfigMpa}
  - {name: secrets-meta, apiVersion: v1, kind: Secret, payload: metadata}
`, nats.URL())
	if err := os.WriteFile(cfg, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	health := freeAddr(t)
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(testenv.RelaydBin(t), "run", "-c", cfg, "--kubeconfig", kc,
		"--metrics-bind-address", "", "--health-probe-bind-address", health)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("relayd log:\n%s", b)
		}
	}()

	wants := []string{
		`source "deploys": kind Deploymnet is not served in apps/v1; did you mean Deployment?`,
		`source "cms": kind ConfigMpa is not served in v1; did you mean ConfigMap?`,
	}
	var readyz string
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case err := <-exited:
			t.Fatalf("relayd exited (%v): a misspelled kind must not stop it", err)
		default:
		}
		if resp, err := http.Get("http://" + health + "/readyz"); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			readyz = fmt.Sprintf("%d %s", resp.StatusCode, b)
		}
		log, _ := os.ReadFile(logPath)
		found := 0
		for _, w := range wants {
			if strings.Contains(readyz, w) && strings.Contains(unquote(string(log)), w) {
				found++
			}
		}
		// The good source's watch is established meanwhile (it may start
		// after the misspelled ones are reported): /readyz then names only
		// those.
		if found == len(wants) && !strings.Contains(readyz, "secrets-meta") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 60s, /readyz and the log do not both name the sources with a suggestion %q, or /readyz still names the good source secrets-meta:\n/readyz: %s", wants, readyz)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("/readyz: %s", readyz)
	if !strings.HasPrefix(readyz, "503 ") {
		t.Errorf("/readyz = %s; want 503 naming the misspelled sources", readyz)
	}
}
