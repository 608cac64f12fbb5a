package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	yaml "go.yaml.in/yaml/v3"

	"github.com/relayd/relayd/internal/testutil"
)

// No credential in a URL, whatever its shape, reaches what the commands
// print: check-config's report, the "invalid config" log line of relayd
// run, relayd tail's error for --server (with and without -c).
func TestHostileURLsAreNeverShown(t *testing.T) {
	dir := t.TempDir()
	good := writeTailConfig(t, map[string]string{"url": "nats://127.0.0.1:1"})
	for i, h := range testutil.HostileURLs() {
		t.Run(h.Name, func(t *testing.T) {
			doc, err := yaml.Marshal(map[string]any{
				"cluster": "dev",
				"nats":    map[string]any{"url": h.URL, "stream": map[string]any{"name": "K8S"}},
				"sources": []any{map[string]any{"name": "p", "apiVersion": "v1", "kind": "Pod"}},
			})
			if err != nil {
				t.Fatal(err)
			}
			cfg := filepath.Join(dir, strings.Repeat("c", i+1)+".yaml")
			if err := os.WriteFile(cfg, doc, 0o600); err != nil {
				t.Fatal(err)
			}
			for _, args := range [][]string{
				{"check-config", "-c", cfg},
				{"run", "-c", cfg},
				{"run", "-c", cfg, "--log-format", "console"},
				{"tail", "--server", h.URL, "--count", "1"},
				{"tail", "-c", good, "--server", h.URL, "--count", "1"},
			} {
				var out, errb bytes.Buffer
				done := make(chan int, 1)
				go func() { done <- run(args, nil, &out, &errb) }()
				var code int
				select {
				case code = <-done:
				case <-time.After(30 * time.Second):
					t.Fatalf("relayd %q: still running after 30s", args)
				}
				all := out.String() + errb.String()
				t.Logf("relayd %q: exit %d\n%s", args[:1], code, all)
				if code == 0 || strings.TrimSpace(all) == "" {
					t.Errorf("relayd %q: exit %d, output %q; want a failure saying why", args, code, all)
				}
				if strings.Contains(all, testutil.URLSecret) {
					t.Errorf("relayd %s shows the secret:\n%s", args[0], all)
				}
			}
		})
	}
}
