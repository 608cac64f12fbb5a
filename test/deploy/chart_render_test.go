package deploy

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/relayd/relayd/internal/testutil"
)

var update = flag.Bool("update", false, "rewrite test/deploy/testdata/chart-default.yaml from the current chart")

// TestHelmChartDefaultRender: `helm template relayd deploy/helm/relayd -n
// relayd` with the default values renders exactly
// testdata/chart-default.yaml. A chart change that touches what the
// defaults render shows up as a diff of that file in the same commit, so a
// new option cannot change an existing install unnoticed; `go test
// ./test/deploy -run TestHelmChartDefaultRender -update` rewrites it.
func TestHelmChartDefaultRender(t *testing.T) {
	out, err := helm(t, []string{"template", "relayd", chartDir, "-n", "relayd"})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(testutil.RepoRootT(t), "test/deploy/testdata/chart-default.yaml")
	if *update {
		if err := os.WriteFile(path, out, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	golden, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (create it with -update)", err)
	}
	if diff := lineDiff(string(golden), string(out)); diff != "" {
		t.Errorf("the default values no longer render %s (if intended, rerun with -update and commit the diff):\n%s", path, diff)
	}
}

// lineDiff lists the lines of want missing from got ("-") and the lines of
// got not in want ("+"), in order, as a multiset: enough to name what
// changed in a render; "" when they are equal.
func lineDiff(want, got string) string {
	if want == got {
		return ""
	}
	count := map[string]int{}
	for _, l := range strings.Split(got, "\n") {
		count[l]++
	}
	var out []string
	for _, l := range strings.Split(want, "\n") {
		if count[l] > 0 {
			count[l]--
			continue
		}
		out = append(out, "- "+l)
	}
	for _, l := range strings.Split(got, "\n") {
		if count[l] > 0 {
			count[l]--
			out = append(out, "+ "+l)
		}
	}
	if len(out) == 0 {
		return "(the same lines in another order)"
	}
	return strings.Join(out, "\n")
}
