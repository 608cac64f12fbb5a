package testenv

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// proc is a child process started by testenv.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	err  error         // Wait's result, valid after done
}

// startProc starts bin with its output in logFile. The child gets its own
// process group and SIGKILL when the parent dies, so a panicking or killed
// test binary never leaves servers behind.
func startProc(bin string, args []string, logFile string) (*proc, error) {
	out, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		out.Close()
		return nil, fmt.Errorf("testenv: start %s: %w", bin, err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		out.Close()
		close(p.done)
	}()
	return p, nil
}

// Pid is the child's process id.
func (p *proc) Pid() int { return p.cmd.Process.Pid }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM to the process group, and SIGKILL after grace.
func (p *proc) stop(grace time.Duration) {
	if p.exited() {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		p.kill()
	}
}

// kill sends SIGKILL to the process group and waits for the exit.
func (p *proc) kill() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

func insecureClient() *http.Client {
	// Only for polling /readyz before the CA file exists; never for API calls.
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec
}

// waitHTTP polls url until it answers 200, the process exits, or timeout.
func waitHTTP(ctx context.Context, p *proc, url string, client *http.Client, timeout time.Duration) error {
	if client == nil {
		client = http.DefaultClient
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		if p.exited() {
			return fmt.Errorf("process exited early: %v", p.err)
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				client.CloseIdleConnections()
				return nil
			}
			err = fmt.Errorf("%s: HTTP %d", url, resp.StatusCode)
		}
		last = err
		select {
		case <-ctx.Done():
			client.CloseIdleConnections()
			return errors.Join(ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
