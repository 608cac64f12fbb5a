package testenv

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"
)

// Server faults for the reliability suite (internal/chaos): "kill, don't
// stop". Unlike RestartAPIServer (SIGTERM: a graceful shutdown that closes
// watches and drains requests), these kill with SIGKILL, so clients see
// connections die mid-request, and start the server again on the same
// port, certificates and data.

// KillAPIServer kills kube-apiserver with SIGKILL (its process group) and
// waits for it to be gone; StartAPIServer brings it back on the same port.
func (e *Env) KillAPIServer() {
	if e.apiserver != nil {
		e.apiserver.kill()
		e.apiserver = nil
	}
}

// KillRestartAPIServer is KillAPIServer followed at once by
// StartAPIServer: it returns when the new kube-apiserver is ready.
func (e *Env) KillRestartAPIServer(ctx context.Context) error {
	e.KillAPIServer()
	return e.StartAPIServer(ctx)
}

// KillEtcd kills etcd with SIGKILL and waits for it to be gone. Its data
// directory is kept: etcd runs with --unsafe-no-fsync, which loses writes
// only when the machine (not the process) dies, so StartEtcdAgain finds
// every acknowledged revision.
func (e *Env) KillEtcd() {
	if e.etcd != nil {
		e.etcd.kill()
		e.etcd = nil
	}
}

// StartEtcdAgain starts etcd after KillEtcd on the same data directory and
// ports, and waits until it is healthy. kube-apiserver (left running)
// reconnects by itself.
func (e *Env) StartEtcdAgain(ctx context.Context) error {
	if e.etcd != nil {
		return errors.New("testenv: etcd is already running")
	}
	if e.etcdURL == "" || e.etcdPeer == 0 {
		return errors.New("testenv: etcd was never started")
	}
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", e.etcdPeer)
	args := []string{
		"--name", "testenv", "--data-dir", filepath.Join(e.dir, "etcd-data"),
		"--listen-client-urls", e.etcdURL, "--advertise-client-urls", e.etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "testenv=" + peerURL,
		"--unsafe-no-fsync", "--log-level", "warn",
	}
	var lastErr error
	// The port may still be held for a moment by the killed process's
	// sockets; the new etcd exits then, and is started again.
	for attempt := 0; attempt < 5; attempt++ {
		p, err := startProc(filepath.Join(e.binDir, "etcd"), args, filepath.Join(e.dir, "etcd.log"))
		if err != nil {
			return err
		}
		t0 := time.Now()
		if lastErr = waitHTTP(ctx, p, e.etcdURL+"/health", nil, 30*time.Second); lastErr == nil {
			e.etcd = p
			e.logf("testenv: etcd ready again at %s in %v", e.etcdURL, time.Since(t0).Round(time.Millisecond))
			return nil
		}
		p.kill()
		if ctx.Err() != nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("testenv: etcd did not become healthy again on %s: %w (log: %s)", e.etcdURL, lastErr, filepath.Join(e.dir, "etcd.log"))
}

// WaitAPIServerReady polls kube-apiserver's /readyz until it answers 200
// (after an etcd restart it is unready until it reached etcd again).
func (e *Env) WaitAPIServerReady(ctx context.Context, timeout time.Duration) error {
	if e.apiserver == nil {
		return errors.New("testenv: kube-apiserver is not running")
	}
	url := fmt.Sprintf("https://127.0.0.1:%d/readyz", e.apiPort)
	if err := waitHTTP(ctx, e.apiserver, url, insecureClient(), timeout); err != nil {
		return fmt.Errorf("testenv: kube-apiserver not ready: %w", err)
	}
	return nil
}
