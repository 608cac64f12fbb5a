package deploy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

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

func repoFile(t testing.TB, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testutil.RepoRootT(t), rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

var kustomizeRequire = regexp.MustCompile(`(?m)^\s*sigs\.k8s\.io/kustomize/kustomize/v5 (v\S+)`)

// kustomizeBin is the kustomize that hack/kustomize-bin.sh builds: the
// version pinned in tools/kustomize/go.mod, under .cache/kustomize/ (or
// $RELAYD_KUSTOMIZE). Missing or another version is a failure, never a skip.
func kustomizeBin(t testing.TB) string {
	t.Helper()
	root := testutil.RepoRootT(t)
	m := kustomizeRequire.FindStringSubmatch(repoFile(t, "tools/kustomize/go.mod"))
	if m == nil {
		t.Fatal("tools/kustomize/go.mod does not require sigs.k8s.io/kustomize/kustomize/v5")
	}
	version := m[1]
	bin := os.Getenv("RELAYD_KUSTOMIZE")
	if bin == "" {
		bin = filepath.Join(root, ".cache", "kustomize", version, "kustomize")
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatalf("kustomize %s not runnable at %s (%v): run `make kustomize-bin` (builds it from tools/kustomize)", version, bin, err)
	}
	if got := strings.TrimSpace(string(out)); got != version {
		t.Fatalf("%s reports %q, tools/kustomize/go.mod pins %s: run `make kustomize-bin`", bin, got, version)
	}
	return bin
}

// relaydBin is bin/relayd as built by `make build` ($RELAYD_BIN): the binary
// built with the Dockerfile's flags. Missing is a failure, never a skip.
func relaydBin(t testing.TB) string {
	t.Helper()
	bin := os.Getenv("RELAYD_BIN")
	if bin == "" {
		bin = filepath.Join(testutil.RepoRootT(t), "bin", "relayd")
	}
	if st, err := os.Stat(bin); err != nil || st.Mode()&0o111 == 0 {
		t.Fatalf("relayd binary not found at %s: run `make build` (RELAYD_BIN points the tests at it)", bin)
	}
	return bin
}

// render runs `kustomize build` on dir (relative to the repository root, or
// absolute) and decodes every object.
func render(t testing.TB, dir string) []*unstructured.Unstructured {
	t.Helper()
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(testutil.RepoRootT(t), dir)
	}
	cmd := exec.Command(kustomizeBin(t), "build", dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kustomize build %s: %v\n%s", dir, err, stderr.String())
	}
	objs, err := decodeObjects(out)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	if len(objs) == 0 {
		t.Fatalf("kustomize build %s rendered nothing", dir)
	}
	return objs
}

func decodeObjects(data []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, err
		}
		if m == nil {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
}

// find returns the one object of kind (and name, unless empty); anything
// else fails the test.
func find(t testing.TB, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	var hits []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind && (name == "" || o.GetName() == name) {
			hits = append(hits, o)
		}
	}
	if len(hits) != 1 {
		t.Fatalf("want exactly one %s %q in the rendered manifests, found %d", kind, name, len(hits))
	}
	return hits[0]
}

func ofKind(objs []*unstructured.Unstructured, kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}

// typed converts u into out, failing on fields the Go type does not know
// (a typo in a manifest would otherwise be silently dropped).
func typed[T any](t testing.TB, u *unstructured.Unstructured) *T {
	t.Helper()
	out := new(T)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, out, true); err != nil {
		t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
	}
	return out
}

func describe(u *unstructured.Unstructured) string {
	if ns := u.GetNamespace(); ns != "" {
		return fmt.Sprintf("%s %s/%s", u.GetKind(), ns, u.GetName())
	}
	return fmt.Sprintf("%s %s", u.GetKind(), u.GetName())
}
