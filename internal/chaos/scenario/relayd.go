package scenario

import (
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/relayd/relayd/internal/chaos/history"
)

// BuildRelayd builds cmd/relayd with -race (cgo on) and -tags
// failpoints,testbuild into dir: the failpoints, and the index
// consistency check that the runs turn on (RELAYD_INDEX_CHECK=1, honoured
// only by a testbuild build; the build is refused unless `relayd
// version` says testbuild=true). The chaos runs also set
// GORACE=halt_on_error=1, so a data race ends relayd at once, with the
// report in its log: an exit the run did not ask for, which fails it.
func BuildRelayd(repoRoot, dir string) (string, error) {
	out := filepath.Join(dir, "relayd-failpoints-race")
	cmd := exec.Command("go", "build", "-race", "-tags", "failpoints,testbuild", "-o", out, "./cmd/relayd")
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build -race -tags failpoints,testbuild ./cmd/relayd: %v\n%s", err, b)
	}
	if v, err := exec.Command(out, "version").Output(); err != nil || !strings.Contains(string(v), "testbuild=true") || !strings.Contains(string(v), "failpoints=true") {
		return "", fmt.Errorf("%s version: %q, %v; want failpoints=true and testbuild=true (the runs need the failpoints and the index consistency check)", out, v, err)
	}
	return out, nil
}

// StatSources stats go.mod, go.sum and every Go file under cmd/, pkg/ and
// internal/. go test caches a test's result keyed on its package's
// dependencies and on the files the test stat'ed or opened while it ran
// (not in TestMain before m.Run); a relayd that BuildRelayd built in a
// subprocess is neither, so a test that runs it calls this, or a changed
// relayd would get the previous run's cached "ok". (Blank-importing
// relayd's packages into the test does not do it: a change to a function
// body that the test binary never calls left `go test` reporting
// "(cached)".)
func StatSources(repoRoot string) error {
	for _, f := range []string{"go.mod", "go.sum"} {
		if _, err := os.Stat(filepath.Join(repoRoot, f)); err != nil {
			return err
		}
	}
	for _, dir := range []string{"cmd", "pkg", "internal"} {
		err := filepath.WalkDir(filepath.Join(repoRoot, dir), func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || filepath.Ext(path) != ".go" {
				return err
			}
			_, err = os.Stat(path)
			return err
		})
		if err != nil {
			return fmt.Errorf("relayd sources: %w", err)
		}
	}
	return nil
}

// hitRe matches the hit-count placeholders of a failpoint spec.
var hitRe = regexp.MustCompile(`\{n(?::(\d+)-(\d+))?\}`)

// proc is relayd run as a pod would be: a keeper restarts it whenever it
// exits on its own (kill -9, a failpoint, a crash), after a short delay.
// Every exit is recorded (history.Exit) with how it ended, whether the run
// sent the SIGKILL, the failpoint kill line relayd printed, if any, and the
// tail of its log: the checker fails the run on any exit it did not ask
// for.
type proc struct {
	bin, conf, kc, log string

	mu         sync.Mutex
	cmd        *exec.Cmd
	exited     chan struct{}
	failpoints string     // "{n}" / "{n:LO-HI}" become a random hit count in [5, 40) / [LO, HI) at each start
	rng        *rand.Rand // for {n}; used under mu
	keep       bool       // restart after an exit
	restarts   int
	crashes    int  // exits by an armed failpoint's kill
	hold       bool // no restart until released
	killing    bool // the run sent SIGKILL to the current process
	curFP      string
	logOff     int64 // size of the log when the current process started
	exits      []history.Exit
	keeperDone chan struct{}
}

func (p *proc) startLocked() error {
	cmd := exec.Command(p.bin, "run", "-c", p.conf, "--kubeconfig", p.kc,
		"--metrics-bind-address", "127.0.0.1:0", "--health-probe-bind-address", "127.0.0.1:0", "--log-level", "info")
	// The index consistency check after every relist (pkg/relay), and a
	// data race ends relayd at once (see BuildRelayd).
	cmd.Env = append(os.Environ(), "RELAYD_INDEX_CHECK=1", "GORACE=halt_on_error=1")
	fp := p.failpoints
	if p.rng != nil {
		fp = hitRe.ReplaceAllStringFunc(fp, func(m string) string {
			lo, hi := 5, 40
			if sub := hitRe.FindStringSubmatch(m); sub[1] != "" {
				lo, _ = strconv.Atoi(sub[1])
				hi, _ = strconv.Atoi(sub[2])
			}
			return strconv.Itoa(lo + p.rng.IntN(max(hi-lo, 1)))
		})
	}
	if fp != "" {
		cmd.Env = append(cmd.Env, "RELAYD_FAILPOINTS="+fp)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	logf, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	if st, err := logf.Stat(); err == nil {
		p.logOff = st.Size()
	}
	fmt.Fprintf(logf, "=== %s start (failpoints %q)\n", time.Now().Format(time.RFC3339Nano), fp)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return err
	}
	p.cmd = cmd
	p.curFP = fp
	p.killing = false
	exited := make(chan struct{})
	p.exited = exited
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	return nil
}

// start starts relayd and its keeper.
func (p *proc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.keep = true
	if err := p.startLocked(); err != nil {
		return err
	}
	p.keeperDone = make(chan struct{})
	go p.keeper()
	return nil
}

func (p *proc) keeper() {
	defer close(p.keeperDone)
	for {
		p.mu.Lock()
		exited := p.exited
		p.mu.Unlock()
		<-exited
		p.mu.Lock()
		if !p.keep {
			p.mu.Unlock()
			return
		}
		x := p.exitLocked()
		p.exits = append(p.exits, x)
		if x.Explained() && !x.Planned {
			p.crashes++
		}
		p.killing = false
		p.restarts++
		p.mu.Unlock()
		time.Sleep(200 * time.Millisecond) // a pod restart is not instant
		p.mu.Lock()
		for p.hold && p.keep {
			p.mu.Unlock()
			time.Sleep(50 * time.Millisecond)
			p.mu.Lock()
		}
		if !p.keep {
			p.mu.Unlock()
			return
		}
		if err := p.startLocked(); err != nil {
			p.keep = false
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
	}
}

// exitLocked describes the exit of the current process (exited).
func (p *proc) exitLocked() history.Exit {
	x := history.Exit{At: time.Now(), Planned: p.killing, Failpoints: p.curFP, Status: "unknown"}
	if ps := p.cmd.ProcessState; ps != nil {
		x.Status = ps.String()
		if ws, ok := ps.Sys().(syscall.WaitStatus); ok {
			x.Killed = ws.Signaled() && ws.Signal() == syscall.SIGKILL
		}
	}
	x.FailpointKill, x.LogTail = readRun(p.log, p.logOff)
	return x
}

// readRun reads one process's part of the log (from off): the failpoint
// kill line it printed, if any, and its last lines (at most 40 lines or
// 6 KiB).
func readRun(path string, off int64) (fpKill, tail string) {
	f, err := os.Open(path)
	if err != nil {
		return "", "(log unreadable: " + err.Error() + ")"
	}
	defer f.Close()
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return "", "(log unreadable: " + err.Error() + ")"
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return "", "(log unreadable: " + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	for _, l := range lines {
		if strings.HasPrefix(l, "failpoint ") && strings.Contains(l, ": kill (hit ") {
			fpKill = l
		}
	}
	lines = lines[max(0, len(lines)-40):]
	tail = strings.Join(lines, "\n")
	if len(tail) > 6<<10 {
		tail = "..." + tail[len(tail)-6<<10:]
	}
	return fpKill, tail
}

// signal sends sig to the running relayd and reports whether it reached
// a process that had not exited (between an exit and the keeper's restart
// there is none). A SIGKILL that did is recorded as the run's own
// (planned).
func (p *proc) signal(sig syscall.Signal) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		return false
	}
	if sig == syscall.SIGKILL {
		p.killing = true
	}
	return true
}

// setHold stops (true) or allows (false) restarts by the keeper.
func (p *proc) setHold(on bool) {
	p.mu.Lock()
	p.hold = on
	p.mu.Unlock()
}

// setFailpoints applies to the next start.
func (p *proc) setFailpoints(s string) {
	p.mu.Lock()
	p.failpoints = s
	p.mu.Unlock()
}

// alive reports whether relayd is running now.
func (p *proc) alive() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// term stops relayd with SIGTERM (no restart) and reports how it exited.
func (p *proc) term(timeout time.Duration) error {
	p.mu.Lock()
	p.keep = false
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	_ = cmd.Process.Signal(syscall.SIGCONT)
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		<-exited
		<-p.keeperDone
		return fmt.Errorf("relayd did not exit within %v of SIGTERM", timeout)
	}
	<-p.keeperDone
	if cmd.ProcessState.ExitCode() != 0 {
		return fmt.Errorf("relayd exited with %v after SIGTERM", cmd.ProcessState)
	}
	return nil
}

// kill is the final kill -9 for cleanup.
func (p *proc) kill() {
	p.mu.Lock()
	p.keep = false
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-exited
	if p.keeperDone != nil {
		<-p.keeperDone
	}
}

// counts: restarts by the keeper, and exits by an armed failpoint's kill.
func (p *proc) counts() (restarts, crashes int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.restarts, p.crashes
}

// exitLog is every exit recorded so far.
func (p *proc) exitLog() []history.Exit {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]history.Exit(nil), p.exits...)
}
