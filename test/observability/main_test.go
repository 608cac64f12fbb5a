package observability

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/internal/testutil"
)

var (
	env     *testenv.Env
	natsSrv *testenv.NATS
)

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, testenv.Options{}, &env, &natsSrv))
}

// repoFile reads a file relative to the repository root.
func repoFile(t *testing.T, rel string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testutil.RepoRootT(t), rel))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// prometheusRequire finds the pinned Prometheus module in tools/prometheus/go.mod.
var prometheusRequire = regexp.MustCompile(`(?m)^\s*github\.com/prometheus/prometheus (v0\.([1-9])([0-9][0-9])\.([0-9]+))\b`)

// tool finds a Prometheus binary (prometheus or promtool): the one
// hack/prometheus-bin.sh builds from the version pinned in
// tools/prometheus/go.mod, under .cache/prometheus/<module version>/, or
// $RELAYD_PROMETHEUS / $RELAYD_PROMTOOL. It must report that version
// (module v0.3MM.P is release 3.MM.P). Missing or another version is a
// failure, never a skip.
func tool(t *testing.T, name string) string {
	t.Helper()
	m := prometheusRequire.FindSubmatch(repoFile(t, "tools/prometheus/go.mod"))
	if m == nil {
		t.Fatal("tools/prometheus/go.mod does not require github.com/prometheus/prometheus at a v0.3MM.P version")
	}
	minor, _ := strconv.Atoi(string(m[3]))
	release := fmt.Sprintf("%s.%d.%s", m[2], minor, m[4])
	bin := os.Getenv("RELAYD_" + strings.ToUpper(name))
	if bin == "" {
		bin = filepath.Join(testutil.RepoRootT(t), ".cache", "prometheus", string(m[1]), name)
	}
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s not runnable at %s (%v): run `make prometheus-bin` (builds it from tools/prometheus)", name, release, bin, err)
	}
	first, _, _ := strings.Cut(string(out), "\n")
	if want := name + ", version " + release + " "; !strings.HasPrefix(first, want) {
		t.Fatalf("%s reports %q, tools/prometheus/go.mod pins %s (release %s): run `make prometheus-bin`", bin, first, m[1], release)
	}
	return bin
}
