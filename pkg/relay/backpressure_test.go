package relay_test

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/pkg/index"
)

// Backpressure and memory bounds, shown on the relayd binary (its RSS is
// its own) against a real apiserver and a nats-server that is stopped while
// changes keep coming: see docs/GUARANTEES.md (backpressure, not loss) and
// the nats.maxInFlight* keys.

// served is a relayd binary with its metrics and probes on a known address.
type served struct {
	p    *relaydProc
	addr string
}

// serve starts p with metrics and probes on one free loopback port, with
// the given extra environment.
func serve(t *testing.T, p *relaydProc, env ...string) *served {
	t.Helper()
	return serveWrapped(t, p, nil, env...)
}

// serveWrapped is serve with relayd's command line run by wrap (a command
// that ends by exec'ing its arguments), if set.
func serveWrapped(t *testing.T, p *relaydProc, wrap []string, env ...string) *served {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	argv := append(append([]string(nil), wrap...), p.bin, "run", "-c", p.conf, "--kubeconfig", p.kc,
		"--metrics-bind-address", addr, "--health-probe-bind-address", addr, "--log-level", "info")
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(append(os.Environ(), testenv.IndexCheckEnv+"=1"), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	logf, err := os.OpenFile(filepath.Join(p.dir, "relayd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p.cmd = cmd
	return &served{p: p, addr: addr}
}

func (s *served) ready() error {
	if st := s.p.cmd.ProcessState; st != nil {
		return fmt.Errorf("relayd exited: %v", st)
	}
	resp, err := http.Get("http://" + s.addr + "/readyz")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("readyz: %s", resp.Status)
	}
	return nil
}

// metric returns the value of the series name{labels} scraped from relayd.
func (s *served) metric(name string, labels map[string]string) (float64, error) {
	resp, err := http.Get("http://" + s.addr + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return 0, err
	}
	fam, ok := fams[name]
	if !ok {
		return 0, fmt.Errorf("no metric %s", name)
	}
next:
	for _, m := range fam.GetMetric() {
		for k, v := range labels {
			if !hasLabel(m, k, v) {
				continue next
			}
		}
		switch {
		case m.GetGauge() != nil:
			return m.GetGauge().GetValue(), nil
		case m.GetCounter() != nil:
			return m.GetCounter().GetValue(), nil
		}
	}
	return 0, fmt.Errorf("no series %s%v", name, labels)
}

func hasLabel(m *dto.Metric, k, v string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == k {
			return l.GetValue() == v
		}
	}
	return false
}

// rss samples a process's resident set size from /proc.
type rss struct {
	pid     int
	mu      sync.Mutex
	samples []int64 // KiB
	stop    chan struct{}
	done    chan struct{}
}

func sampleRSS(t *testing.T, pid int, every time.Duration) *rss {
	r := &rss{pid: pid, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(r.done)
		tk := time.NewTicker(every)
		defer tk.Stop()
		for {
			if kb, err := procStatusKiB(pid, "VmRSS"); err == nil {
				r.mu.Lock()
				r.samples = append(r.samples, kb)
				r.mu.Unlock()
			}
			select {
			case <-tk.C:
			case <-r.stop:
				return
			}
		}
	}()
	t.Cleanup(r.close)
	return r
}

func (r *rss) close() {
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	<-r.done
}

// summary is the number of samples and the highest, in MiB.
func (r *rss) summary() (n int, maxMiB float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.samples {
		maxMiB = max(maxMiB, float64(s)/1024)
	}
	return len(r.samples), maxMiB
}

// procStatusKiB reads a "<field>: N kB" line of /proc/<pid>/status.
func procStatusKiB(pid int, field string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, pid)
}

// storedChange is an object event on the stream, read from its subject and
// Nats-Msg-Id (<source>/<uid>/<resourceVersion>[/deleted]) only: payloads
// of a megabyte are not fetched.
type storedChange struct {
	c   change
	seq uint64
}

// storedHeaders is the stream's object changes in stream order (its
// outline without the sync markers).
func (f *fixture) storedHeaders() []storedChange {
	f.t.Helper()
	var out []storedChange
	for _, o := range f.storedOutline() {
		if o.marker == "" {
			out = append(out, storedChange{o.c, o.seq})
		}
	}
	return out
}

// waitEveryChangeHeaders is waitEveryChange reading headers only.
func (f *fixture) waitEveryChangeHeaders(r *reference, timeout time.Duration) {
	f.t.Helper()
	f.eventually(timeout, "every change on the stream", func() error {
		have := map[change]bool{}
		for _, sc := range f.storedHeaders() {
			have[sc.c] = true
		}
		want := r.changes()
		for _, c := range want {
			if !have[c] {
				return fmt.Errorf("missing %+v (of %d changes)", c, len(want))
			}
		}
		return nil
	})
}

// assertOnceInOrder checks the stream against the reference: every change
// stored exactly once, and each object's changes in the reference's order.
// It returns the number of changes checked.
func (f *fixture) assertOnceInOrder(ref *reference) int {
	f.t.Helper()
	want := ref.changes()
	count := map[change]int{}
	pos := map[change]uint64{}
	for _, sc := range f.storedHeaders() {
		count[sc.c]++
		if _, seen := pos[sc.c]; !seen {
			pos[sc.c] = sc.seq
		}
	}
	for _, c := range want {
		if n := count[c]; n != 1 {
			f.t.Errorf("change %+v stored %d times, want once", c, n)
		}
	}
	last := map[string]uint64{}
	for _, c := range want {
		if s := pos[c]; s < last[c.uid] {
			f.t.Errorf("change %+v stored at %d, before an earlier change of its object (at %d)", c, s, last[c.uid])
		} else {
			last[c.uid] = s
		}
	}
	return len(want)
}

// TestBackpressureHoldsTheWindowAndLosesNothing: with maxInFlight 8, 1,000
// changes made while NATS is stopped leave exactly 8 publishes in flight,
// the watch unread beyond them (relayd's object index and last-event time
// stop where the window filled, although 100 objects exist), the process's
// RSS bounded; once NATS is back every change is stored once, in order.
func TestBackpressureHoldsTheWindowAndLosesNothing(t *testing.T) {
	alongside(t)
	n := testenv.NATST(t, testenv.NATSOptions{})
	f := newFixture(t, env, n, `
  - name: cms
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]`)
	f.cfgYAML = strings.Replace(f.cfgYAML, "  maxInFlight: 64\n", "  maxInFlight: 8\n", 1)
	// A publish that times out pauses the watch while it is retried, so
	// the window fills only with the changes read before the first
	// timeout: 10 s lets the first 8 creates arrive on a loaded machine.
	f.cfgYAML = strings.Replace(f.cfgYAML, "  publishTimeout: 2s\n", "  publishTimeout: 10s\n", 1)
	ref := f.reference("")
	s := serve(t, f.binary())
	f.eventually(60*time.Second, "relayd ready", s.ready)
	first := f.createCM("first", nil, nil)
	f.waitStored(30*time.Second, isEvent("added", "first", first.ResourceVersion))
	// Every entry holds a window slot until it is done: the initial list's
	// sync.completed marker, and first's object index write (acked after
	// its event). NATS stops only after both, or one would hold one of the
	// 8 slots through the outage.
	f.waitStored(30*time.Second, isSync("completed"))
	kv := f.indexBucket()
	f.eventually(30*time.Second, "first's object index entry", func() error {
		_, err := kv.Get(t.Context(), index.Key(index.Prefix("cms", f.ns), string(first.UID)))
		return err
	})
	rssBefore, _ := procStatusKiB(s.p.cmd.Process.Pid, "VmRSS")
	mem := sampleRSS(t, s.p.cmd.Process.Pid, 100*time.Millisecond)
	src := map[string]string{"source": "cms"}
	// A bookmark read during the outage holds a window slot too, without a
	// publish (its position waits for the publishes before it): the
	// apiserver sends one ahead of the watch's 60 s timeout, which a slow
	// run can reach before the window fills.
	bookmarksBefore, err := s.metric("relayd_bookmarks_total", src)
	if err != nil {
		t.Fatal(err)
	}

	n.Stop()
	// 100 objects, then 9 rounds of updates: 1,000 changes. The creates
	// come first so that the window fills with 8 different objects (a
	// second change of an object waits for the first: per-object order).
	const objects, rounds = 100, 9
	cms := make([]*corev1.ConfigMap, objects)
	for i := range cms {
		cms[i] = f.createCM(fmt.Sprintf("bp-%03d", i), nil, map[string]string{"v": "0"})
	}
	for r := 1; r <= rounds; r++ {
		for i := range cms {
			cms[i] = f.updateCM(cms[i], "v", strconv.Itoa(r))
		}
	}
	var bookmarkSlots float64
	f.eventually(30*time.Second, "the publish window full", func() error {
		b, err := s.metric("relayd_bookmarks_total", src)
		if err != nil {
			return err
		}
		bookmarkSlots = b - bookmarksBefore
		v, err := s.metric("relayd_publish_in_flight", src)
		// A bookmark read before the first change of the outage holds no
		// slot (nothing before it waits): each one read since NATS
		// stopped takes at most one.
		if err == nil && (v < 8-bookmarkSlots || v > 8 || v == 0) {
			err = fmt.Errorf("relayd_publish_in_flight = %v, want 8 (nats.maxInFlight) less at most %v bookmarks read since NATS stopped", v, bookmarkSlots)
		}
		return err
	})
	// Not read ahead: relayd handles a change (indexes it) just before
	// submitting it, so while the window is full its object index holds
	// "first" plus the 8 objects in flight plus at most the one waiting
	// for a slot — not the 101 objects that exist. The watch's unread
	// frames stay in the apiserver's send buffer and the TCP window.
	time.Sleep(2 * time.Second) // a watch that read ahead would have run on meanwhile
	tracked, err := s.metric("relayd_tracked_objects", src)
	if err != nil {
		t.Fatal(err)
	}
	if tracked > 1+8-bookmarkSlots+1 {
		t.Errorf("relayd_tracked_objects = %v while NATS is down with a window of 8: the watch was read ahead", tracked)
	}
	// No retries while NATS is down (docs/CONFIGURATION.md, "Memory is bounded by bytes"):
	// each would add a copy to the client's reconnect buffer. Once the
	// first timeout is counted, the publish errors stop growing; a retry
	// would time out again within publishTimeout (10 s) plus its backoff.
	pubErrs := func() float64 {
		var sum float64
		for _, reason := range []string{"timeout", "disconnected"} {
			v, _ := s.metric("relayd_publish_errors_total", map[string]string{"source": "cms", "reason": reason}) // no series yet: 0
			sum += v
		}
		return sum
	}
	f.eventually(30*time.Second, "the first publish timeout counted", func() error {
		if pubErrs() == 0 {
			return fmt.Errorf("relayd_publish_errors_total = 0")
		}
		return nil
	})
	errsBefore := pubErrs()
	time.Sleep(12 * time.Second)
	if errsAfter := pubErrs(); errsAfter != errsBefore {
		t.Errorf("relayd_publish_errors_total went from %v to %v while NATS was down: publishes were retried while disconnected", errsBefore, errsAfter)
	}
	inflight, _ := s.metric("relayd_publish_in_flight", src)
	inBytes, _ := s.metric("relayd_publish_in_flight_bytes", src)
	t.Logf("NATS down, 1,000 changes made: in flight %v (window 8, %v held by bookmarks), %v bytes; objects indexed %v of %d", inflight, bookmarkSlots, inBytes, tracked, objects+1)

	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	f.waitEveryChangeHeaders(ref, 3*time.Minute)
	mem.close()
	samples, peak := mem.summary()
	t.Logf("relayd RSS: %.1f MiB before the outage, peak %.1f MiB over %d samples during it and the catch-up", float64(rssBefore)/1024, peak, samples)
	if peak > 128 {
		t.Errorf("relayd RSS peaked at %.1f MiB holding a window of 8 small objects", peak)
	}
	got := f.assertOnceInOrder(ref)
	t.Logf("%d changes on the stream, each once, in order per object", got)
	if got < objects*(rounds+1) {
		t.Errorf("reference saw %d changes, want at least %d", got, objects*(rounds+1))
	}
	f.eventually(30*time.Second, "nothing in flight", func() error {
		for _, m := range []string{"relayd_publish_in_flight", "relayd_publish_in_flight_bytes"} {
			if v, err := s.metric(m, src); err != nil || v != 0 {
				return fmt.Errorf("%s = %v (%v), want 0", m, v, err)
			}
		}
		return nil
	})
	s.p.stop()
}
