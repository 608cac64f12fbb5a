package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

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

// Start starts relayd run.
func (p *Relayd) Start() {
	p.tb.Helper()
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
