package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Child is a process started by the harness: a consumer, relayd or the
// NATS server. Its CPU time and memory are read from /proc, so each one's
// cost is measured apart from the harness and from the others.
type Child struct {
	Name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
	done  chan struct{}
	err   error
	log   *os.File
	logMu sync.Mutex
}

// StartChild starts bin with args (and extra environment) and its stderr
// (and a copy of its stdout) in logPath. The child gets SIGKILL if the
// harness dies.
func StartChild(name, bin string, args, env []string, logPath string) (*Child, error) {
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		lf.Close()
		return nil, err
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		lf.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("bench: start %s: %w", name, err)
	}
	c := &Child{Name: name, cmd: cmd, stdin: stdin, lines: make(chan string, 4096), done: make(chan struct{}), log: lf}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			c.logMu.Lock()
			fmt.Fprintln(lf, "stdout:", line)
			c.logMu.Unlock()
			select {
			case c.lines <- line:
			default:
			}
		}
		c.err = cmd.Wait()
		lf.Close()
		close(c.done)
	}()
	return c, nil
}

// Pid is the child's process id.
func (c *Child) Pid() int { return c.cmd.Process.Pid }

// Exited reports whether the child has exited.
func (c *Child) Exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// WaitLine waits for a stdout line starting with prefix and returns it.
func (c *Child) WaitLine(ctx context.Context, prefix string, timeout time.Duration) (string, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case l := <-c.lines:
			if strings.HasPrefix(l, prefix) {
				return l, nil
			}
			if strings.HasPrefix(l, "error") {
				return "", fmt.Errorf("bench: %s: %s", c.Name, l)
			}
		case <-c.done:
			return "", fmt.Errorf("bench: %s exited before printing %q: %v", c.Name, prefix, c.err)
		case <-t.C:
			return "", fmt.Errorf("bench: %s did not print %q within %v", c.Name, prefix, timeout)
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
}

// clockTick is USER_HZ, the unit of the times in /proc/<pid>/stat; it is
// 100 on every Linux architecture Go supports.
const clockTick = 10 * time.Millisecond

// CPU is the user+system CPU time the child has used so far, all its threads
// (including exited ones) together.
func (c *Child) CPU() (time.Duration, error) {
	return procCPU(c.Pid())
}

func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("bench: malformed /proc/pid/stat")
	}
	f := strings.Fields(s[i+1:])
	// Fields after the command: state(3) ... utime(14) stime(15).
	if len(f) < 13 {
		return 0, errors.New("bench: short /proc/pid/stat")
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(ut+st) * clockTick, nil
}

// Mem returns the child's resident set size and its peak (VmRSS, VmHWM) in
// bytes.
func (c *Child) Mem() (rss, hwm int64, err error) {
	return procMem(c.Pid())
}

func procMem(pid int) (rss, hwm int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		var dst *int64
		switch k {
		case "VmRSS":
			dst = &rss
		case "VmHWM":
			dst = &hwm
		default:
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			return 0, 0, err
		}
		*dst = n << 10
	}
	if rss == 0 || hwm == 0 {
		return 0, 0, fmt.Errorf("bench: no VmRSS/VmHWM in /proc/%d/status", pid)
	}
	return rss, hwm, nil
}

// PeakReset is a reset of a process's peak RSS (VmHWM): the peak before it,
// and VmHWM and VmRSS read right after it.
type PeakReset struct {
	HWMBefore, HWMAfter, RSSAfter int64
}

// hwmResetSlack is how far VmHWM may lie above VmRSS right after a reset
// (pages freed between the reset and the read) before the reset counts as
// not taken.
const hwmResetSlack = 1 << 20

// ResetPeakRSS resets the child's VmHWM to its current RSS (`echo 5 >
// /proc/<pid>/clear_refs`, Linux ≥ 4.0), so that VmHWM read later is the
// largest RSS since the reset: the kernel's high-water mark, which no
// sampling interval can miss. It fails if the kernel refuses the reset or
// VmHWM still holds an earlier, higher peak after it.
func (c *Child) ResetPeakRSS() (PeakReset, error) {
	return resetPeakRSS(c.Pid())
}

func resetPeakRSS(pid int) (PeakReset, error) {
	var r PeakReset
	_, before, err := procMem(pid)
	if err != nil {
		return r, err
	}
	r.HWMBefore = before
	f, err := os.OpenFile(fmt.Sprintf("/proc/%d/clear_refs", pid), os.O_WRONLY, 0)
	if err != nil {
		return r, fmt.Errorf("bench: reset peak RSS: %w", err)
	}
	_, err = f.WriteString("5")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return r, fmt.Errorf("bench: reset peak RSS (echo 5 > /proc/%d/clear_refs): %w", pid, err)
	}
	if r.RSSAfter, r.HWMAfter, err = procMem(pid); err != nil {
		return r, err
	}
	// The reset sets VmHWM to the RSS of the moment; one that did not take
	// leaves the earlier peak, above the RSS.
	if r.HWMAfter > r.RSSAfter+hwmResetSlack {
		return r, fmt.Errorf("bench: VmHWM of %d is %d kB after `echo 5 > clear_refs` (before: %d kB, RSS %d kB): the kernel did not reset it",
			pid, r.HWMAfter>>10, r.HWMBefore>>10, r.RSSAfter>>10)
	}
	return r, nil
}

// Stop closes the child's stdin and sends SIGTERM, then SIGKILL after
// grace, and waits for it.
func (c *Child) Stop(grace time.Duration) error {
	_ = c.stdin.Close()
	if c.Exited() {
		return c.err
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(grace):
		_ = syscall.Kill(-c.Pid(), syscall.SIGKILL)
		<-c.done
		return fmt.Errorf("bench: %s did not stop within %v; killed", c.Name, grace)
	}
	var ee *exec.ExitError
	if errors.As(c.err, &ee) && ee.Exited() && ee.ExitCode() == 0 {
		return nil
	}
	return c.err
}

// Done is closed when the child has exited.
func (c *Child) Done() <-chan struct{} { return c.done }

// freeAddr returns a free 127.0.0.1:port.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// SchedStat is the CPU time of every thread of a process and how long they
// waited in the kernel's run queue for a CPU (/proc/<pid>/task/*/schedstat).
type SchedStat struct {
	Run, Wait time.Duration
	Slices    int64
}

// Sched sums the child's threads' schedstat.
func (c *Child) Sched() (SchedStat, error) {
	return procSched(c.Pid())
}

func procSched(pid int) (SchedStat, error) {
	var s SchedStat
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return s, err
	}
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, t.Name()))
		if err != nil {
			continue // the thread exited
		}
		f := strings.Fields(string(b))
		if len(f) < 3 {
			continue
		}
		run, _ := strconv.ParseInt(f[0], 10, 64)
		wait, _ := strconv.ParseInt(f[1], 10, 64)
		n, _ := strconv.ParseInt(f[2], 10, 64)
		s.Run += time.Duration(run)
		s.Wait += time.Duration(wait)
		s.Slices += n
	}
	return s, nil
}
