package consumernode

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/relayd/relayd/internal/testutil"
)

// minNodeMajor is the oldest Node.js the example runs on (package.json's
// engines; cloudevents 10 wants 20 or later).
const minNodeMajor = 20

// exampleDir is this directory, where package.json is.
func exampleDir(t *testing.T) string {
	return filepath.Join(testutil.RepoRootT(t), "examples", "consumer-node")
}

// buildConsumer installs the example's npm packages and compiles it, and
// returns the path of the compiled consumer (dist/consumer.js). node and
// npm are required: the example is run by `make test`, so their absence
// fails the test, naming what to install. Both steps are skipped when
// their inputs did not change since the last success: npm ci when
// node_modules was installed from this package-lock.json (a stamp with the
// lockfile's hash), tsc when dist was compiled from these sources.
func buildConsumer(t *testing.T) string {
	t.Helper()
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed (not in PATH): the Node.js example consumer (examples/consumer-node) is run by `make test`; install Node.js %d or later with npm", tool, minNodeMajor)
		}
	}
	v, err := exec.Command("node", "--version").Output()
	if err != nil {
		t.Fatalf("node --version: %v", err)
	}
	major, err := strconv.Atoi(strings.TrimPrefix(strings.SplitN(strings.TrimSpace(string(v)), ".", 2)[0], "v"))
	if err != nil || major < minNodeMajor {
		t.Fatalf("node --version says %q: the Node.js example consumer (examples/consumer-node) needs Node.js %d or later", strings.TrimSpace(string(v)), minNodeMajor)
	}
	dir := exampleDir(t)
	lockHash := hashFiles(t, dir, "package-lock.json", "package.json", ".npmrc")
	stamp := filepath.Join(dir, "node_modules", ".relayd-lock-hash")
	if b, err := os.ReadFile(stamp); err != nil || string(b) != lockHash {
		runIn(t, dir, "npm", "ci")
		// A go.mod makes node_modules a module of its own, which the go
		// tool's ./... pattern leaves out: a .go file in an npm package
		// is never compiled as one of relayd's packages.
		if err := os.WriteFile(filepath.Join(dir, "node_modules", "go.mod"), []byte("module nodemodules\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(stamp, []byte(lockHash), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	srcHash := lockHash + hashFiles(t, dir, append(sources(t, dir), "tsconfig.json")...)
	built := filepath.Join(dir, "dist", ".relayd-src-hash")
	if b, err := os.ReadFile(built); err != nil || string(b) != srcHash {
		runIn(t, dir, "npx", "--no-install", "tsc", "-p", ".")
		if err := os.WriteFile(built, []byte(srcHash), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, "dist", "consumer.js")
}

func runIn(t *testing.T, dir, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s in %s: %v\n%s", name, strings.Join(args, " "), dir, err, out.String())
	}
}

// sources lists src/*.ts, relative to dir.
func sources(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(filepath.Join(dir, "src"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".ts") {
			rel, _ := filepath.Rel(dir, p)
			out = append(out, rel)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

// hashFiles is the SHA-256 of the files' names and contents.
func hashFiles(t *testing.T, dir string, names ...string) string {
	t.Helper()
	h := sha256.New()
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(h, "%s %d\n", n, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))
}
