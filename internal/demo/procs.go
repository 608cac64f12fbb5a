package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// printer writes whole lines to the demo's stdout; the demo itself, relayd
// and relayd tail write concurrently.
type printer struct {
	mu sync.Mutex
	w  io.Writer
}

func (p *printer) line(prefix, s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintln(p.w, prefix+s)
}

// banner announces a step.
func (p *printer) banner(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "\n==> "+format+"\n", args...)
}

// say prints an indented note.
func (p *printer) say(format string, args ...any) {
	for _, l := range strings.Split(fmt.Sprintf(format, args...), "\n") {
		p.line("    ", l)
	}
}

// child is relayd or relayd tail, started by the demo. It has its own
// process group (so a Ctrl-C reaches only the demo, which then stops it in
// order) and gets SIGKILL if the demo dies, so it never outlives it.
type child struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	err  error         // Wait's result, valid after done
}

// startChild starts bin with every output line printed under prefix;
// onStdout, when set, also receives each stdout line.
func startChild(out *printer, name, prefix, bin string, args []string, onStdout func(string)) (*child, error) {
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, done: make(chan struct{})}
	copyLines := func(r io.Reader, fn func(string)) {
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			out.line(prefix, sc.Text())
			if fn != nil {
				fn(sc.Text())
			}
		}
	}
	var wg sync.WaitGroup
	wg.Go(func() { copyLines(stdout, onStdout) })
	wg.Go(func() { copyLines(stderr, nil) })
	go func() {
		wg.Wait() // Wait closes the pipes: read them to the end first
		c.err = cmd.Wait()
		close(c.done)
	}()
	return c, nil
}

func (c *child) pid() int { return c.cmd.Process.Pid }

func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// errKilled says that a child had to be killed after its grace period.
var errKilled = errors.New("did not stop within its grace period; killed")

// stop sends SIGTERM to the child's process group, then SIGKILL after
// grace, and returns how it ended (nil: exit status 0).
func (c *child) stop(grace time.Duration) error {
	if !c.exited() {
		_ = syscall.Kill(-c.pid(), syscall.SIGTERM)
		select {
		case <-c.done:
		case <-time.After(grace):
			_ = syscall.Kill(-c.pid(), syscall.SIGKILL)
			<-c.done
			return errKilled
		}
	}
	return c.err
}
