package config

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	yaml "go.yaml.in/yaml/v3"

	"github.com/relayd/relayd/internal/testutil"
)

// hostileConfig is a valid config but for nats.url, which is url.
func hostileConfig(t *testing.T, url string) []byte {
	t.Helper()
	doc, err := yaml.Marshal(map[string]any{
		"cluster": "dev",
		"nats":    map[string]any{"url": url, "stream": map[string]any{"name": "K8S"}},
		"sources": []any{map[string]any{"name": "p", "apiVersion": "v1", "kind": "Pod"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return doc
}

// No credential in a URL, whatever its shape, reaches RedactURL's result,
// a validation problem or check-config's report; each says where it was
// hidden.
func TestHostileURLsAreRedacted(t *testing.T) {
	dir := t.TempDir()
	for i, h := range testutil.HostileURLs() {
		t.Run(h.Name, func(t *testing.T) {
			if got := RedactURL(h.URL); strings.Contains(got, testutil.URLSecret) || !strings.Contains(got, "xxxxx") {
				t.Errorf("RedactURL(%q) = %q", h.URL, got)
			}
			doc := hostileConfig(t, h.URL)
			_, err := Parse(doc, "x.yaml")
			if err == nil {
				t.Fatalf("%q accepted", h.URL)
			}
			if msg := err.Error(); strings.Contains(msg, testutil.URLSecret) || !strings.Contains(msg, "nats.url") || !strings.Contains(msg, "xxxxx") {
				t.Errorf("Parse: %s", msg)
			}
			path := filepath.Join(dir, strings.Repeat("c", i+1)+".yaml")
			if err := os.WriteFile(path, doc, 0o600); err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			if CheckFiles(&out, path) {
				t.Fatalf("check-config passed:\n%s", out.String())
			}
			if strings.Contains(out.String(), testutil.URLSecret) {
				t.Errorf("check-config shows the secret:\n%s", out.String())
			}
		})
	}
}
