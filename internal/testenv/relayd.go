package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// IndexCheckEnv turns on the index consistency check in a test build of
// relayd (internal/indexcheck.EnvVar; the shipped binary ignores it).
const IndexCheckEnv = "RELAYD_INDEX_CHECK"

// Relayd runs the relayd binary ($RELAYD_BIN, which `make test` builds)
// against an Env, as a pod would: its own kubeconfig (the admin identity)
// and config file in a temp dir, metrics and probes on random loopback
// ports, its log in Dir/relayd.log (appended across starts, printed when
// the test failed). It is killed at the end of the test if still running.
type Relayd struct {
	tb                           testing.TB
	Bin, Dir, Kubeconfig, Config string
	// Env is added to relayd's environment at each Start.
	Env []string
	cmd *exec.Cmd
}

// RelaydBin returns $RELAYD_BIN, failing the test when it is not set or
// not a file.
func RelaydBin(tb testing.TB) string {
	tb.Helper()
	b := os.Getenv("RELAYD_BIN")
	if b == "" {
		tb.Fatal("RELAYD_BIN is not set: run `make build` and set RELAYD_BIN=$PWD/bin/relayd (make test does both)")
	}
	if _, err := os.Stat(b); err != nil {
		tb.Fatalf("RELAYD_BIN: %v (run `make build`)", err)
	}
	return b
}

// RelaydTestBin returns the test build of relayd (-tags testbuild, which
// honours IndexCheckEnv): $RELAYD_TEST_BIN, else relayd-test next to
// $RELAYD_BIN (`make build` builds both). It fails the test unless the
// binary says it is a test build (`relayd version` prints
// testbuild=true), so a test that asks for the index check never runs
// without it.
func RelaydTestBin(tb testing.TB) string {
	tb.Helper()
	b := os.Getenv("RELAYD_TEST_BIN")
	if b == "" {
		b = filepath.Join(filepath.Dir(RelaydBin(tb)), "relayd-test")
	}
	if _, err := os.Stat(b); err != nil {
		tb.Fatalf("the test build of relayd: %v (run `make build`, which builds bin/relayd-test with -tags testbuild; or set RELAYD_TEST_BIN)", err)
	}
	MustBeTestBuild(tb, b)
	return b
}

// MustBeTestBuild fails the test unless bin says it is a test build of
// relayd (`relayd version`: testbuild=true), the only kind that runs the
// index consistency check it is asked for.
func MustBeTestBuild(tb testing.TB, bin string) {
	tb.Helper()
	out, err := exec.Command(bin, "version").Output()
	if err != nil || !strings.Contains(string(out), "testbuild=true") {
		tb.Fatalf("%s is not a test build of relayd (`relayd version`: %q, %v): it would ignore %s=1 and run without the index consistency check; build it with -tags testbuild (`make build` builds bin/relayd-test)",
			bin, strings.TrimSpace(string(out)), err, IndexCheckEnv)
	}
}

// Relayd prepares (does not start) relayd with the given config file
// contents.
func (e *Env) Relayd(tb testing.TB, config string) *Relayd {
	tb.Helper()
	p := &Relayd{tb: tb, Bin: RelaydBin(tb), Dir: tb.TempDir()}
	p.Kubeconfig, p.Config = filepath.Join(p.Dir, "kubeconfig"), filepath.Join(p.Dir, "config.yaml")
	if err := e.WriteKubeconfig(p.Kubeconfig, false); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(p.Config, []byte(config), 0o600); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if p.cmd != nil {
			p.Kill()
		}
		if tb.Failed() {
			tb.Logf("relayd log:\n%s", p.Log())
		}
	})
	return p
}

// IndexCheck makes relayd the test build (RelaydTestBin) with the index
// consistency check on: after every relist it compares its object index
// with a consistent LIST and exits on a difference.
func (p *Relayd) IndexCheck() {
	p.tb.Helper()
	p.Bin = RelaydTestBin(p.tb)
	p.Env = append(p.Env, IndexCheckEnv+"=1")
}

// Start starts relayd run. With IndexCheckEnv=1 in Env, Bin must be a test
// build (IndexCheck sets both).
func (p *Relayd) Start() {
	p.tb.Helper()
	if slices.Contains(p.Env, IndexCheckEnv+"=1") {
		MustBeTestBuild(p.tb, p.Bin)
	}
	cmd := exec.Command(p.Bin, "run", "-c", p.Config, "--kubeconfig", p.Kubeconfig,
		"--metrics-bind-address", "127.0.0.1:0", "--health-probe-bind-address", "127.0.0.1:0", "--log-level", "info")
	cmd.Env = append(os.Environ(), p.Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	logf, err := os.OpenFile(filepath.Join(p.Dir, "relayd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		p.tb.Fatal(err)
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		p.tb.Fatal(err)
	}
	p.cmd = cmd
}

// Kill is kill -9.
func (p *Relayd) Kill() {
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
	p.cmd = nil
}

// Stop is SIGTERM; relayd must exit 0.
func (p *Relayd) Stop() {
	p.tb.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	if err := p.cmd.Wait(); err != nil {
		p.tb.Errorf("relayd did not exit cleanly: %v", err)
	}
	p.cmd = nil
}

// Log returns relayd's log so far.
func (p *Relayd) Log() string {
	b, _ := os.ReadFile(filepath.Join(p.Dir, "relayd.log"))
	return string(b)
}
