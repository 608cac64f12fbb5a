package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/version"
)

// The binary relayd ships is built without failpoints (internal/failpoint),
// and says so: `relayd version` prints failpoints=false and /metrics has
// relayd_build_info{failpoints="false"}. $RELAYD_BIN is bin/relayd, which
// `make test` builds with the Dockerfile's flags (`make build`).
func TestShippedBuildHasNoFailpoints(t *testing.T) {
	bin := os.Getenv("RELAYD_BIN")
	if bin == "" {
		t.Fatal("RELAYD_BIN is not set: run `make build` and set RELAYD_BIN=$PWD/bin/relayd (make test does both); this test checks the shipped binary, not the test's own build")
	}
	// The stat also makes go test's cache depend on the binary.
	if st, err := os.Stat(bin); err != nil || st.Mode()&0o111 == 0 {
		t.Fatalf("RELAYD_BIN=%s is not an executable file (%v): run `make build`", bin, err)
	}
	checkBuildSays(t, bin, false)
}

// A build with -tags failpoints, made the way the chaos suite makes it
// (internal/chaos/scenario.BuildRelayd: go build -race -tags
// failpoints,testbuild; without testbuild here, whose version line adds
// testbuild=true), says failpoints=true in both places.
func TestFailpointBuildSaysSo(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	statSources(t, root)
	bin := filepath.Join(t.TempDir(), "relayd-failpoints")
	// Built as the chaos suite builds it (-race): the packages are then
	// already compiled in the configuration the tests use.
	cmd := exec.Command("go", "build", "-race", "-tags", "failpoints", "-o", bin, "./cmd/relayd")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build -race -tags failpoints ./cmd/relayd: %v\n%s", err, out)
	}
	checkBuildSays(t, bin, true)
}

// statSources stats go.mod, go.sum and every Go file of the module outside
// tools/: go test caches a result keyed on the files the test stat'ed, and
// does not see what a go build in a subprocess read.
func statSources(t *testing.T, root string) {
	t.Helper()
	for _, f := range []string{"go.mod", "go.sum"} {
		if _, err := os.Stat(filepath.Join(root, f)); err != nil {
			t.Fatal(err)
		}
	}
	for _, dir := range []string{"cmd", "internal", "pkg"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") {
				return err
			}
			_, err = os.Stat(path)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// The test binary itself has no failpoints tag.
func TestVersionStringNamesFailpoints(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"version"}, nil, &out, &errb); code != 0 {
		t.Fatalf("version: exit %d: %s", code, errb.String())
	}
	if got, want := strings.TrimSpace(out.String()), version.String(); got != want || !strings.HasSuffix(got, ", failpoints=false)") {
		t.Errorf("relayd version printed %q, want %q ending in \", failpoints=false)\"", got, want)
	}
}

// checkBuildSays runs bin's `version` and `run`, and checks that both say
// failpoints=<want>.
func checkBuildSays(t *testing.T, bin string, want bool) {
	t.Helper()
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s version: %v\n%s", bin, err, out)
	}
	line := strings.TrimSpace(string(out))
	if !regexp.MustCompile(`^relayd \S+ \(commit \S+, built \S+, go\S+, failpoints=(true|false)\)$`).MatchString(line) {
		t.Fatalf("%s version printed %q: not `relayd <version> (commit <c>, built <date>, <go>, failpoints=<bool>)`", bin, line)
	}
	if wantStr := fmt.Sprintf("failpoints=%t)", want); !strings.HasSuffix(line, wantStr) {
		t.Errorf("%s version printed %q, want %s", bin, line, wantStr)
	}

	labels := buildInfoOf(t, bin)
	if got := labels["failpoints"]; got != fmt.Sprint(want) {
		t.Errorf("%s: relayd_build_info%v: failpoints=%q, want %q", bin, labels, got, fmt.Sprint(want))
	}
	for _, l := range []string{"version", "revision", "goversion"} {
		if labels[l] == "" {
			t.Errorf("%s: relayd_build_info%v has no %s label", bin, labels, l)
		}
	}
}

// buildInfoOf starts `bin run` with a valid config whose apiserver and NATS
// do not answer (relayd serves /metrics before it connects, then keeps
// retrying NATS), reads relayd_build_info's labels from /metrics and stops
// it with SIGTERM.
func buildInfoOf(t *testing.T, bin string) map[string]string {
	t.Helper()
	dir := t.TempDir()
	dead := deadAddr(t) // nothing listens there
	cfg := filepath.Join(dir, "config.yaml")
	writeFile(t, cfg, "cluster: build-info\nnats:\n  url: nats://"+dead+"\n  stream:\n    name: K8S\nsources:\n  - name: pods\n    apiVersion: v1\n    kind: Pod\n")
	kubeconfig := filepath.Join(dir, "kubeconfig")
	writeFile(t, kubeconfig, `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://`+dead+`", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`)
	metrics := deadAddr(t)
	var logs bytes.Buffer
	cmd := exec.Command(bin, "run", "-c", cfg, "--kubeconfig", kubeconfig,
		"--metrics-bind-address", metrics, "--health-probe-bind-address", "127.0.0.1:0", "--log-format", "console")
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s run: %v", bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	defer func() {
		if !stopped {
			_ = cmd.Process.Kill()
			<-exited
		}
	}()

	var body string
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for body == "" {
		select {
		case err := <-exited:
			stopped = true
			t.Fatalf("%s run exited before /metrics answered: %v\n%s", bin, err, logs.String())
		case <-ctx.Done():
			t.Fatalf("%s run: /metrics on %s did not answer within 30s\n%s", bin, metrics, logs.String())
		case <-time.After(50 * time.Millisecond):
		}
		resp, err := http.Get("http://" + metrics + "/metrics")
		if err != nil {
			continue
		}
		b, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err == nil && resp.StatusCode == http.StatusOK {
			body = string(b)
		}
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		stopped = true
		if err != nil {
			t.Errorf("%s run: exit after SIGTERM: %v\n%s", bin, err, logs.String())
		}
	case <-time.After(30 * time.Second):
		t.Errorf("%s run did not exit within 30s of SIGTERM\n%s", bin, logs.String())
	}

	m := regexp.MustCompile(`(?m)^relayd_build_info\{([^}]*)\} 1$`).FindAllStringSubmatch(body, -1)
	if len(m) != 1 {
		t.Fatalf("%s: /metrics has %d relayd_build_info series with value 1, want 1:\n%s", bin, len(m), body)
	}
	labels := map[string]string{}
	for _, kv := range regexp.MustCompile(`(\w+)="([^"]*)"`).FindAllStringSubmatch(m[0][1], -1) {
		labels[kv[1]] = kv[2]
	}
	return labels
}

// deadAddr is a loopback address that nothing listens on (it did a moment
// ago, for the kernel to pick the port).
func deadAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
