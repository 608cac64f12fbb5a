package consumernode

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/relayd/relayd/internal/testutil"
)

// The Node.js consumer's decoding (the CloudEvents SDK's HTTP binding,
// ce-* headers percent-decoded, relaydepoch and the flags typed) and
// checks accept every golden message of pkg/event (relayd's encoder's
// output, both modes), read each as what its name says, and read a
// message's binary and structured forms alike.
func TestNodeConsumerReadsTheGoldenMessages(t *testing.T) {
	buildConsumer(t)
	golden := filepath.Join(testutil.RepoRootT(t), "pkg", "event", "testdata", "golden")
	files, err := os.ReadDir(golden)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("node", filepath.Join("test", "golden.mjs"), golden)
	cmd.Dir = exampleDir(t)
	b, err := cmd.Output()
	if err != nil {
		t.Fatalf("node test/golden.mjs: %v", err)
	}
	type result struct {
		File, Kind, Scope, Reason, Error string
		Epoch                            float64
		FinalUnknown, HasData            bool
	}
	byFile := map[string]result{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var r result
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("golden.mjs printed %q: %v", line, err)
		}
		byFile[r.File] = r
	}
	if len(byFile) != len(files) || len(files) < 20 {
		t.Fatalf("%d results for %d golden files", len(byFile), len(files))
	}
	for _, f := range files {
		name := f.Name()
		r := byFile[name]
		if r.Error != "" {
			t.Errorf("%s refused: %s", name, r.Error)
			continue
		}
		want := "object"
		switch {
		case strings.Contains(name, "sync-started"):
			want = "sync.started"
		case strings.Contains(name, "sync-completed"):
			want = "sync.completed"
		}
		scope := ""
		if _, s, ok := strings.Cut(name, "scope-"); ok {
			scope = strings.TrimSuffix(s, ".msg")
		}
		if r.Kind != want || r.Scope != scope || r.Epoch < 1 || r.FinalUnknown != strings.Contains(name, "final-state-unknown") ||
			r.HasData == strings.Contains(name, "unencodable") || (want != "object") != (r.Reason != "") {
			t.Errorf("%s read as %+v", name, r)
		}
		if rest, ok := strings.CutPrefix(name, "binary-"); ok {
			s, ok := byFile["structured-"+rest]
			if r.File, s.File = "", ""; ok && s != r {
				t.Errorf("%s read as %+v, its structured form as %+v", name, r, s)
			}
		}
	}
}
