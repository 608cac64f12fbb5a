// Package hack_test tests the scripts of hack/ that make runs.
package hack_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// A fake go: it logs its calls with the folder they ran in, passes every
// command but build to the real go (so the script resolves the pinned
// version from tools/prometheus/go.mod with go itself), and for build writes,
// at the -o path, a binary that prints the version line of Prometheus's
// binaries with the version the script stamped through -ldflags (or
// $FAKE_VERSION, to play a build that stamps something else). Building the
// real binaries takes minutes; `make prometheus-bin` does that, and
// test/observability checks what it built.
const fakeGo = `#!/bin/sh
echo "go $* [in $(pwd)]" >> "$FAKE_LOG"
[ "$1" = build ] || exec "$REAL_GO" "$@"
out=""; ver=""; prev=""; pkg=""
for a in "$@"; do
	case "$prev" in
	-o) out=$a ;;
	-ldflags) ver=$(printf '%s\n' "$a" | sed -n 's/.*common\/version\.Version=\([^ ]*\).*/\1/p') ;;
	esac
	prev=$a; pkg=$a
done
[ -n "$FAKE_VERSION" ] && ver=$FAKE_VERSION
printf '#!/bin/sh\necho "%s, version %s (branch: , revision: fake)"\necho "  go version: fake"\n' "${pkg##*/}" "$ver" > "$out"
chmod 755 "$out"
`

type promFixture struct {
	root, log, prometheus, promtool string
	env                             []string
}

// newPromFixture puts the fake go first in PATH and points the script's
// outputs ($RELAYD_PROMETHEUS, $RELAYD_PROMTOOL) into a temp dir, so that
// the repository's .cache is never touched.
func newPromFixture(t *testing.T) *promFixture {
	t.Helper()
	realGo, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go is needed to run hack/prometheus-bin.sh: %v", err)
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "go"), []byte(fakeGo), 0o755); err != nil {
		t.Fatal(err)
	}
	f := &promFixture{root: root, log: filepath.Join(dir, "log"),
		prometheus: filepath.Join(dir, "out", "prometheus"), promtool: filepath.Join(dir, "out", "promtool")}
	f.env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"),
		"REAL_GO="+realGo, "FAKE_LOG="+f.log,
		"RELAYD_PROMETHEUS="+f.prometheus, "RELAYD_PROMTOOL="+f.promtool)
	return f
}

// run runs hack/prometheus-bin.sh with extra environment, returning its
// stdout, its stderr and its error.
func (f *promFixture) run(t *testing.T, env ...string) (string, string, error) {
	t.Helper()
	cmd := exec.Command(filepath.Join(f.root, "hack", "prometheus-bin.sh"))
	cmd.Env = append(append([]string{}, f.env...), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// builds returns the go build calls the fake go logged.
func (f *promFixture) builds(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(f.log)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "go build ") {
			out = append(out, l)
		}
	}
	return out
}

var promRequire = regexp.MustCompile(`(?m)^\s*github\.com/prometheus/prometheus v0\.([1-9])([0-9][0-9])\.([0-9]+)\b`)

// pinnedRelease is the Prometheus release of the module version
// tools/prometheus/go.mod pins (v0.3MM.P is 3.MM.P).
func pinnedRelease(t *testing.T, root string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "tools", "prometheus", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := promRequire.FindStringSubmatch(string(b))
	if m == nil {
		t.Fatal("tools/prometheus/go.mod does not require github.com/prometheus/prometheus at a v0.3MM.P version")
	}
	minor, _ := strconv.Atoi(m[2])
	return fmt.Sprintf("%s.%d.%s", m[1], minor, m[3])
}

func versionLine(t *testing.T, bin string) string {
	t.Helper()
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatalf("%s --version: %v", bin, err)
	}
	first, _, _ := strings.Cut(string(out), "\n")
	return first
}

func TestPrometheusBinBuildsThePinnedVersionOnce(t *testing.T) {
	f := newPromFixture(t)
	release := pinnedRelease(t, f.root)
	stdout, stderr, err := f.run(t)
	if err != nil {
		t.Fatalf("first run: %v\n%s", err, stderr)
	}
	if want := f.prometheus + "\n" + f.promtool + "\n"; stdout != want {
		t.Errorf("first run printed %q, want the two paths %q", stdout, want)
	}
	builds := f.builds(t)
	if len(builds) != 2 {
		t.Fatalf("first run: %d go builds, want 2 (prometheus, promtool):\n%s", len(builds), strings.Join(builds, "\n"))
	}
	mod := filepath.Join(f.root, "tools", "prometheus")
	for i, name := range []string{"prometheus", "promtool"} {
		if b := builds[i]; !strings.HasSuffix(b, " github.com/prometheus/prometheus/cmd/"+name+" [in "+mod+"]") {
			t.Errorf("build %d is %q, want cmd/%s built in %s", i, b, name, mod)
		}
	}
	for _, bin := range []string{f.prometheus, f.promtool} {
		if got, want := versionLine(t, bin), filepath.Base(bin)+", version "+release+" "; !strings.HasPrefix(got, want) {
			t.Errorf("%s reports %q, want it to start with %q", bin, got, want)
		}
	}

	stdout2, stderr2, err := f.run(t)
	if err != nil {
		t.Fatalf("second run: %v\n%s", err, stderr2)
	}
	if stdout2 != stdout {
		t.Errorf("second run printed %q, first %q", stdout2, stdout)
	}
	if again := f.builds(t); len(again) != 2 {
		t.Errorf("second run built again (%d go builds in all, want the first run's 2); stderr:\n%s", len(again), stderr2)
	}
}

// A binary of another version at the path (Debian's prometheus 2.42, say)
// is replaced; the one that reports the pinned version is kept.
func TestPrometheusBinReplacesAnotherVersion(t *testing.T) {
	f := newPromFixture(t)
	if _, stderr, err := f.run(t); err != nil {
		t.Fatalf("first run: %v\n%s", err, stderr)
	}
	old := "#!/bin/sh\necho 'prometheus, version 2.42.0+ds (branch: debian/sid, revision: 2.42.0+ds-5+deb12u1)'\n"
	if err := os.WriteFile(f.prometheus, []byte(old), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, stderr, err := f.run(t); err != nil {
		t.Fatalf("second run: %v\n%s", err, stderr)
	}
	builds := f.builds(t)
	if len(builds) != 3 || !strings.Contains(builds[2], "/cmd/prometheus [in ") {
		t.Errorf("after prometheus 2.42 was put in place: go builds %q, want a third one, of cmd/prometheus only", builds)
	}
	if got, want := versionLine(t, f.prometheus), "prometheus, version "+pinnedRelease(t, f.root)+" "; !strings.HasPrefix(got, want) {
		t.Errorf("%s reports %q after the run, want %q…", f.prometheus, got, want)
	}
}

// A build that does not stamp the pinned version fails the script: the
// tests would otherwise run whatever it made.
func TestPrometheusBinFailsOnAnotherVersionBuilt(t *testing.T) {
	f := newPromFixture(t)
	stdout, stderr, err := f.run(t, "FAKE_VERSION=3.0.0")
	if err == nil {
		t.Fatalf("the script succeeded with binaries that report 3.0.0; stdout:\n%s", stdout)
	}
	if want := "does not report " + pinnedRelease(t, f.root); !strings.Contains(stderr, want) {
		t.Errorf("stderr does not say %q:\n%s", want, stderr)
	}
}
