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
	if code := run([]string{"check-config", "-c", "../../config.example.yaml"}, &out, &errb); code != 0 {
		t.Fatalf("example config: exit %d\n%s%s", code, out.String(), errb.String())
	}
	if !strings.Contains(out.String(), "SUCCESS") {
		t.Errorf("output %q lacks SUCCESS", out.String())
	}
	out.Reset()
	if code := run([]string{"check-config", "-c", bad}, &out, &errb); code != 1 {
		t.Fatalf("bad config: exit %d, want 1", code)
	}
	for _, want := range []string{"FAILED", "bad.yaml:2: sourcez: unknown key", "sources: at least one source is required"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if code := run([]string{"check-config"}, &out, &errb); code != 2 {
		t.Errorf("no file: exit %d, want 2", code)
	}
}

func TestVersionAndUnknownCommand(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"version"}, &out, &errb); code != 0 || !strings.HasPrefix(out.String(), "relayd ") {
		t.Errorf("version: exit %d, %q", code, out.String())
	}
	if code := run([]string{"frobnicate"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), `unknown command "frobnicate"`) {
		t.Errorf("unknown command: exit %d, %q", code, errb.String())
	}
}

func TestRunWithBadConfigFailsClearly(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"run", "-c", filepath.Join(t.TempDir(), "missing.yaml"), "--log-format", "console"}, &out, &errb); code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	if !strings.Contains(errb.String(), "missing.yaml") {
		t.Errorf("log does not name the file:\n%s", errb.String())
	}
}
