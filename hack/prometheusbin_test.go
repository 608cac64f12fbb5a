// Package hack_test tests the scripts of hack/ that make runs.
package hack_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A fake apt-get: it logs its calls, asks the policy file the way the
// package's postinst does (invoke-rc.d), and on install writes a fake
// prometheus and promtool. With $FAKE_APT_HOLD it stops mid-install until
// that file exists, so that the test can interrupt the script there.
const fakeAptGet = `#!/bin/sh
echo "apt-get $*" >> "$FAKE_LOG"
case "$1" in
update) exit 0 ;;
install) ;;
*) echo "fake apt-get: unexpected $1" >&2; exit 1 ;;
esac
echo $$ > "$FAKE_APT_PID"
"$RELAYD_POLICY_RC_D" prometheus start
echo "policy-rc.d prometheus start: exit $?" >> "$FAKE_LOG"
echo installing >> "$FAKE_LOG"
if [ -n "$FAKE_APT_HOLD" ]; then
	while [ ! -e "$FAKE_APT_HOLD" ]; do sleep 0.05; done
fi
for b in prometheus promtool; do
	printf '#!/bin/sh\necho "%s, version 0.0.0-fake"\n' $b > "$FAKE_BIN/$b"
	chmod 755 "$FAKE_BIN/$b"
done
echo installed >> "$FAKE_LOG"
`

const site = "#!/bin/sh\n# the site's own policy\nexit 0\n"

type fixture struct {
	dir, bin, policy, log, hold, aptPid string
	out                                 string // the script's output (a file: an orphaned apt-get may keep it open)
}

// newFixture makes a PATH of only the tools the script needs (so that a
// real prometheus, apt-get or sudo is never found) plus the fake apt-get,
// and a policy file path in a temp dir, holding original when it is not "".
func newFixture(t *testing.T, original string) *fixture {
	t.Helper()
	dir := t.TempDir()
	f := &fixture{dir: dir, bin: filepath.Join(dir, "bin"), policy: filepath.Join(dir, "sbin", "policy-rc.d"),
		log: filepath.Join(dir, "log"), hold: filepath.Join(dir, "hold"), aptPid: filepath.Join(dir, "apt.pid"), out: filepath.Join(dir, "out")}
	for _, d := range []string{f.bin, filepath.Dir(f.policy)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, tool := range []string{"bash", "sh", "grep", "cp", "mv", "rm", "id", "tee", "chmod", "head", "env", "sleep"} {
		p, err := exec.LookPath(tool)
		if err != nil {
			t.Fatalf("%s is needed to run hack/prometheus-bin.sh: %v", tool, err)
		}
		if err := os.Symlink(p, filepath.Join(f.bin, tool)); err != nil {
			t.Fatal(err)
		}
	}
	write(t, filepath.Join(f.bin, "apt-get"), fakeAptGet, 0o755)
	write(t, filepath.Join(f.bin, "sudo"), "#!/bin/sh\nexec \"$@\"\n", 0o755) // when the test does not run as root
	if original != "" {
		write(t, f.policy, original, 0o750)
	}
	return f
}

func write(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil { // WriteFile's mode is subject to the umask
		t.Fatal(err)
	}
}

// start starts hack/prometheus-bin.sh, its output going to f.out; hold
// makes the fake apt-get wait mid-install.
func (f *fixture) start(t *testing.T, hold bool) *exec.Cmd {
	t.Helper()
	out, err := os.Create(f.out)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = out.Close() }()
	cmd := exec.Command("./prometheus-bin.sh")
	cmd.Env = []string{"PATH=" + f.bin, "RELAYD_POLICY_RC_D=" + f.policy, "FAKE_LOG=" + f.log, "FAKE_BIN=" + f.bin, "FAKE_APT_PID=" + f.aptPid}
	if hold {
		cmd.Env = append(cmd.Env, "FAKE_APT_HOLD="+f.hold)
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start hack/prometheus-bin.sh: %v", err)
	}
	return cmd
}

func (f *fixture) output(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(f.out)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func (f *fixture) logText(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(f.log)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return string(b)
}

// waitInstalling waits until the fake apt-get is mid-install, and checks
// that the placeholder forbade the service start.
func (f *fixture) waitInstalling(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(f.logText(t), "installing\n") {
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("the fake apt-get did not start installing within 60s; log:\n%s\noutput:\n%s", f.logText(t), f.output(t))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(f.logText(t), "policy-rc.d prometheus start: exit 101\n") {
		t.Errorf("during the install policy-rc.d did not forbid the start (exit 101); log:\n%s", f.logText(t))
	}
}

// aptStopped checks that the fake apt-get is no longer running, killing it
// if it is (it is this test's grandchild).
func (f *fixture) aptStopped(t *testing.T) bool {
	t.Helper()
	b, err := os.ReadFile(f.aptPid)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	if syscall.Kill(pid, 0) != nil {
		return true
	}
	// A zombie is stopped too; it is reaped when its parent is gone.
	if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
		if f := strings.Fields(string(st)); len(f) > 2 && f[2] == "Z" {
			return true
		}
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	return false
}

// wantRestored checks that the policy is the original again (absent when
// original is ""), and nothing of the script is left next to it.
func (f *fixture) wantRestored(t *testing.T, original string) {
	t.Helper()
	b, err := os.ReadFile(f.policy)
	switch {
	case original == "" && !errors.Is(err, os.ErrNotExist):
		t.Errorf("policy file %s: %q, %v; want it removed (there was none)", f.policy, b, err)
	case original != "" && (err != nil || string(b) != original):
		t.Errorf("policy file %s: %q, %v; want the original %q", f.policy, b, err, original)
	case original != "":
		if st, err := os.Stat(f.policy); err != nil {
			t.Error(err)
		} else if st.Mode().Perm() != 0o750 {
			t.Errorf("policy file mode %v; want the original's 0750", st.Mode().Perm())
		}
	}
	left, err := filepath.Glob(f.policy + ".*")
	if err != nil || len(left) != 0 {
		t.Errorf("left next to the policy file: %v, %v", left, err)
	}
}

func TestPrometheusBinInstallsAndRestores(t *testing.T) {
	for _, original := range []string{site, ""} {
		t.Run(fmt.Sprintf("original=%t", original != ""), func(t *testing.T) {
			f := newFixture(t, original)
			cmd := f.start(t, false)
			if err := cmd.Wait(); err != nil {
				t.Fatalf("hack/prometheus-bin.sh: %v\n%s", err, f.output(t))
			}
			log := f.logText(t)
			for _, want := range []string{"apt-get update\n", "apt-get install -y --no-install-recommends prometheus\n", "policy-rc.d prometheus start: exit 101\n", "installed\n"} {
				if !strings.Contains(log, want) {
					t.Errorf("fake apt-get log lacks %q:\n%s", want, log)
				}
			}
			if !strings.Contains(f.output(t), "prometheus, version 0.0.0-fake") {
				t.Errorf("output does not show the installed version:\n%s", f.output(t))
			}
			f.wantRestored(t, original)

			// Installed: a second run does nothing.
			if err := f.start(t, false).Wait(); err != nil {
				t.Fatalf("second run: %v\n%s", err, f.output(t))
			}
			if n := strings.Count(f.logText(t), "apt-get install"); n != 1 {
				t.Errorf("second run installed again (%d installs)", n)
			}
			f.wantRestored(t, original)
		})
	}
}

// INT, TERM or HUP mid-install: the script stops apt-get, restores the
// policy and exits 128+signal.
func TestPrometheusBinRestoresOnSignal(t *testing.T) {
	// A signal ignored when a shell starts cannot be trapped, and a child
	// inherits what its parent ignores: run under nohup, the script would
	// never see the SIGHUP and the test would hang. While this process
	// catches SIGHUP, the children it starts get the default disposition.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP} {
		for _, original := range []string{site, ""} {
			t.Run(fmt.Sprintf("%s/original=%t", sig, original != ""), func(t *testing.T) {
				f := newFixture(t, original)
				cmd := f.start(t, true)
				f.waitInstalling(t, cmd)
				if err := cmd.Process.Signal(sig); err != nil {
					t.Fatal(err)
				}
				err := cmd.Wait()
				var ee *exec.ExitError
				if !errors.As(err, &ee) || ee.ExitCode() != 128+int(sig) {
					t.Errorf("after %s: %v, want exit status %d\n%s", sig, err, 128+int(sig), f.output(t))
				}
				if !f.aptStopped(t) {
					t.Errorf("apt-get still ran after the script exited on %s", sig)
				}
				f.wantRestored(t, original)
				if strings.Contains(f.logText(t), "installed\n") {
					t.Error("the install went on after the signal")
				}
			})
		}
	}
}

// SIGKILL mid-install leaves the placeholder (nothing can run then); the
// next run puts the original back first — also when prometheus got
// installed meanwhile and it has nothing else to do.
func TestPrometheusBinRecoversAfterSIGKILL(t *testing.T) {
	for _, original := range []string{site, ""} {
		t.Run(fmt.Sprintf("original=%t", original != ""), func(t *testing.T) {
			f := newFixture(t, original)
			cmd := f.start(t, true)
			f.waitInstalling(t, cmd)
			if err := cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			_ = cmd.Wait()
			// The orphaned apt-get finishes the install, as a real one would.
			write(t, f.hold, "", 0o644)
			deadline := time.Now().Add(60 * time.Second)
			for !strings.Contains(f.logText(t), "installed\n") {
				if time.Now().After(deadline) {
					f.aptStopped(t)
					t.Fatalf("the orphaned fake apt-get did not finish within 60s:\n%s", f.logText(t))
				}
				time.Sleep(20 * time.Millisecond)
			}
			b, err := os.ReadFile(f.policy)
			if err != nil || !strings.Contains(string(b), "exit 101") {
				t.Fatalf("after SIGKILL the policy file is %q, %v; want the placeholder (exit 101)", b, err)
			}

			if err := f.start(t, false).Wait(); err != nil {
				t.Fatalf("run after SIGKILL: %v\n%s", err, f.output(t))
			}
			if !strings.Contains(f.output(t), "restoring "+f.policy+" left behind by an interrupted run") {
				t.Errorf("the run after SIGKILL did not say it restored the policy:\n%s", f.output(t))
			}
			if n := strings.Count(f.logText(t), "apt-get install"); n != 1 {
				t.Errorf("the run after SIGKILL installed again (%d installs)", n)
			}
			f.wantRestored(t, original)
		})
	}
}
