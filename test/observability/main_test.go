package observability

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
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

// tool finds a Prometheus binary; missing is a failure, never a skip.
func tool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			t.Fatalf("%s not found in PATH: run `make prometheus-bin` (installs Debian's prometheus package)", name)
		}
		t.Fatal(err)
	}
	return p
}
