package event_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/relayd/relayd/internal/testutil"
)

// docs/CONSUMING.md, "Sample messages", shows every golden message of
// testdata/golden byte for byte (a fenced block after
// "<!-- golden: <file> -->", holding the file and a final newline before
// the closing fence): the samples a consumer reads are what this version
// writes, and a change of the wire format (-update) fails here until the
// document shows it.
func TestConsumingDocSamples(t *testing.T) {
	path := filepath.Join(testutil.RepoRootT(t), "docs", "CONSUMING.md")
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	samples := testutil.DocSamples(t, string(doc), "golden")
	files, err := filepath.Glob(filepath.Join("testdata", "golden", "*.msg"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no testdata/golden/*.msg (%v)", err)
	}
	var names []string
	for _, f := range files {
		name := filepath.Base(f)
		names = append(names, name)
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := samples[name]
		if !ok {
			t.Errorf("docs/CONSUMING.md has no sample of %s: add\n<!-- golden: %s -->\n```text\n%s\n```", f, name, b)
			continue
		}
		if want := string(b) + "\n"; got != want {
			t.Errorf("docs/CONSUMING.md's sample of %s differs from the file (%s):\n doc: %q\nfile: %q", name, firstDiff(got, want), got, want)
		}
	}
	for name := range samples {
		if !slices.Contains(names, name) {
			t.Errorf("docs/CONSUMING.md shows a sample of %s, which is not a golden file", name)
		}
	}
}

// firstDiff says where a and b first differ.
func firstDiff(a, b string) string {
	line := 1
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return fmt.Sprintf("line %d, byte %d", line, i)
		}
		if a[i] == '\n' {
			line++
		}
	}
	return fmt.Sprintf("one is a prefix of the other (lengths %d and %d)", len(a), len(b))
}
