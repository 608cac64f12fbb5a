package relay_test

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/internal/testutil"
)

// The byte bounds of docs/CONFIGURATION.md, "Memory is bounded by bytes",
// shown end to end: relayd (in-process, or the binary in a 256 MiB memory
// cgroup) against a real apiserver and a nats-server that is stopped while
// changes keep coming and started again. What relayd holds is read from
// the gauges it exports for it, sampled all along by a goroutine:
// relayd_publish_in_flight_bytes (per source; every source here has one
// watch) and relayd_publish_process_in_flight_bytes (every watch). The
// gauges rise only once the bytes are held and fall before they are given
// back (pkg/sink), so no sample can show more than the bounds allow unless
// relayd held more.

const (
	bytesGauge        = "relayd_publish_in_flight_bytes"
	processBytesGauge = "relayd_publish_process_in_flight_bytes"
)

// gatherFunc returns relayd's metric families by name.
type gatherFunc func() (map[string]*dto.MetricFamily, error)

// gatherInProcess reads an in-process relay's registry.
func gatherInProcess(r *running) gatherFunc {
	return func() (map[string]*dto.MetricFamily, error) {
		fams, err := r.reg.Gather()
		out := make(map[string]*dto.MetricFamily, len(fams))
		for _, f := range fams {
			out[f.GetName()] = f
		}
		return out, err
	}
}

// gatherHTTP scrapes a relayd binary's /metrics.
func gatherHTTP(s *served) gatherFunc {
	return func() (map[string]*dto.MetricFamily, error) {
		resp, err := http.Get("http://" + s.addr + "/metrics")
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		parser := expfmt.NewTextParser(model.UTF8Validation)
		return parser.TextToMetricFamilies(resp.Body)
	}
}

// inFlight is one reading of the byte gauges.
type inFlight struct {
	bySource map[string]float64
	process  float64
}

func readInFlight(g gatherFunc) (inFlight, error) {
	fams, err := g()
	if err != nil {
		return inFlight{}, err
	}
	in := inFlight{bySource: map[string]float64{}}
	if f, ok := fams[bytesGauge]; ok {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "source" {
					in.bySource[l.GetValue()] = m.GetGauge().GetValue()
				}
			}
		}
	}
	f, ok := fams[processBytesGauge]
	if !ok || len(f.GetMetric()) != 1 {
		return in, fmt.Errorf("no %s", processBytesGauge)
	}
	in.process = f.GetMetric()[0].GetGauge().GetValue()
	return in, nil
}

// byteSampler reads the byte gauges over and over in a goroutine, keeping
// the highest value of each.
type byteSampler struct {
	mu      sync.Mutex
	n, errs int
	max     inFlight
	pid     int   // if set, relayd's anonymous memory is sampled too
	anonKiB int64 // the highest RssAnon sampled
	stop    chan struct{}
	done    chan struct{}
}

func sampleInFlight(t *testing.T, g gatherFunc, pid int, every time.Duration) *byteSampler {
	s := &byteSampler{max: inFlight{bySource: map[string]float64{}}, pid: pid, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tk := time.NewTicker(every)
		defer tk.Stop()
		for {
			in, err := readInFlight(g)
			var anon int64
			if s.pid != 0 {
				anon, _ = procStatusKiB(s.pid, "RssAnon")
			}
			s.mu.Lock()
			s.anonKiB = max(s.anonKiB, anon)
			if err != nil {
				s.errs++
			} else {
				s.n++
				s.max.process = max(s.max.process, in.process)
				for src, v := range in.bySource {
					s.max.bySource[src] = max(s.max.bySource[src], v)
				}
			}
			s.mu.Unlock()
			select {
			case <-tk.C:
			case <-s.stop:
				return
			}
		}
	}()
	t.Cleanup(s.close)
	return s
}

func (s *byteSampler) close() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
}

// highest returns the highest values sampled so far and the number of samples.
func (s *byteSampler) highest() (in inFlight, samples, errs int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	in = inFlight{bySource: map[string]float64{}, process: s.max.process}
	for k, v := range s.max.bySource {
		in.bySource[k] = v
	}
	return in, s.n, s.errs
}

func mib(v float64) string { return fmt.Sprintf("%.2f MiB", v/(1<<20)) }

// boundsCase is a run of boundedOutage.
type boundsCase struct {
	sources           []string // source s watches the ConfigMaps labelled grp=s
	perWatch, process int64    // nats.maxInFlightBytesPerWatch, nats.maxInFlightBytes
	objects           int      // per source
}

// blobBytes is the size of each object's payload in boundedOutage: a
// message is a little larger (envelope, metadata).
const blobBytes = 100 << 10

// boundedOutage runs relayd in-process with c's bounds and sources, makes
// c.objects ConfigMaps of ~100 KiB per source, stops NATS and changes every
// object once (more than the bounds hold), waits until relayd holds what a
// bound allows (full: true for the in-flight reading once a bound is
// reached), starts NATS again and changes every object once more while it
// catches up. It checks that every change reaches the stream once, in
// order, and that nothing is left in flight, and returns the highest
// readings the sampler saw from before the outage until then.
func boundedOutage(t *testing.T, c boundsCase, full func(inFlight) error) (highest inFlight, samples int) {
	n := testenv.NATST(t, testenv.NATSOptions{})
	var srcs strings.Builder
	for _, s := range c.sources {
		fmt.Fprintf(&srcs, "  - name: %s\n    apiVersion: v1\n    kind: ConfigMap\n    namespaces: [$NS]\n    labelSelector: grp=%s\n", s, s)
	}
	f := newFixture(t, env, n, srcs.String())
	f.setNATS(fmt.Sprintf("  maxInFlightBytesPerWatch: %d\n  maxInFlightBytes: %d\n", c.perWatch, c.process))
	// A publish that timed out while NATS is down is not retried until it
	// is back; 10 s lets the watch read the outage's changes first on a
	// loaded machine (the window fills with them, not with timeouts).
	f.cfgYAML = strings.Replace(f.cfgYAML, "  publishTimeout: 2s\n", "  publishTimeout: 10s\n", 1)
	ref := f.reference("")
	r := f.start(nil, true)
	g := gatherInProcess(r)

	blob := strings.Repeat("x", blobBytes)
	var cms []*corev1.ConfigMap
	for _, s := range c.sources {
		for i := range c.objects {
			cms = append(cms, f.createCM(fmt.Sprintf("%s-%03d", s, i), map[string]string{"grp": s}, map[string]string{"v": "0", "blob": blob}))
		}
	}
	f.waitEveryChangeHeaders(ref, 2*time.Minute)
	f.eventually(30*time.Second, "nothing in flight before the outage", func() error { return nothingInFlight(g) })
	sampler := sampleInFlight(t, g, 0, 5*time.Millisecond)

	n.Stop()
	for i := range cms {
		cms[i] = f.updateCM(cms[i], "v", "1")
	}
	f.eventually(60*time.Second, "a byte bound reached while NATS is down", func() error {
		in, err := readInFlight(g)
		if err != nil {
			return err
		}
		return full(in)
	})
	// The outage goes on for longer than publishTimeout, so that
	// publishes time out (and are not retried) while it is sampled.
	time.Sleep(12 * time.Second)
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	for i := range cms {
		cms[i] = f.updateCM(cms[i], "v", "2")
	}
	f.waitEveryChangeHeaders(ref, 2*time.Minute)
	f.eventually(30*time.Second, "nothing in flight once NATS is back and every change is stored", func() error { return nothingInFlight(g) })
	sampler.close()
	highest, samples, errs := sampler.highest()
	if samples < 100 {
		t.Errorf("only %d samples of the byte gauges (%d failed reads)", samples, errs)
	}
	if got, want := f.assertOnceInOrder(ref), len(cms)*3; got < want {
		t.Errorf("reference saw %d changes, want at least %d", got, want)
	}
	return highest, samples
}

// nothingInFlight is nil when both byte gauges read 0.
func nothingInFlight(g gatherFunc) error {
	in, err := readInFlight(g)
	if err != nil {
		return err
	}
	if in.process != 0 {
		return fmt.Errorf("%s = %v, want 0", processBytesGauge, in.process)
	}
	for s, v := range in.bySource {
		if v != 0 {
			return fmt.Errorf("%s{source=%q} = %v, want 0", bytesGauge, s, v)
		}
	}
	return nil
}

// TestPerWatchByteBoundHoldsThroughAnOutage: one watch with
// maxInFlightBytesPerWatch 2 MiB; 30 changes of ~100 KiB while NATS is
// down fill it (what is held comes within two messages of the bound) and
// never over it, through the outage and the catch-up; afterwards nothing
// is in flight and every change is on the stream once.
func TestPerWatchByteBoundHoldsThroughAnOutage(t *testing.T) {
	alongside(t)
	const bound = 2 << 20
	c := boundsCase{sources: []string{"cms"}, perWatch: bound, process: 48 << 20, objects: 30}
	highest, samples := boundedOutage(t, c, func(in inFlight) error {
		if v := in.bySource["cms"]; v < bound-2*blobBytes {
			return fmt.Errorf("%s = %s, want within two messages of the bound (%s)", bytesGauge, mib(v), mib(bound))
		}
		return nil
	})
	got := highest.bySource["cms"]
	t.Logf("highest of %d samples: %s in flight for the watch (bound %s), %s for the process", samples, mib(got), mib(bound), mib(highest.process))
	if got > bound {
		t.Errorf("%s reached %s (%v bytes), over nats.maxInFlightBytesPerWatch (%s)", bytesGauge, mib(got), got, mib(bound))
	}
	if got < bound-2*blobBytes {
		t.Errorf("%s never came within two messages of the bound: highest %s of %s, the test did not fill the window", bytesGauge, mib(got), mib(bound))
	}
}

// TestProcessByteBoundHoldsAcrossWatches: four watches (four sources) with
// 2 MiB each but 5 MiB for the process, less than the 8 MiB the four
// could hold; 80 changes of ~100 KiB while NATS is down fill the process's
// bound and never exceed it, nor any watch its own.
func TestProcessByteBoundHoldsAcrossWatches(t *testing.T) {
	alongside(t)
	const perWatch, bound = 2 << 20, 5 << 20
	c := boundsCase{sources: []string{"a", "b", "c", "d"}, perWatch: perWatch, process: bound, objects: 20}
	highest, samples := boundedOutage(t, c, func(in inFlight) error {
		if in.process < bound-2*blobBytes {
			return fmt.Errorf("%s = %s, want within two messages of the bound (%s)", processBytesGauge, mib(in.process), mib(bound))
		}
		return nil
	})
	t.Logf("highest of %d samples: %s in flight for the process (bound %s); per watch (bound %s) %s", samples, mib(highest.process), mib(bound), mib(perWatch), perSourceMiB(highest))
	if highest.process > bound {
		t.Errorf("%s reached %s (%v bytes), over nats.maxInFlightBytes (%s)", processBytesGauge, mib(highest.process), highest.process, mib(bound))
	}
	if highest.process < bound-2*blobBytes {
		t.Errorf("%s never came within two messages of the bound: highest %s of %s, the test did not fill it", processBytesGauge, mib(highest.process), mib(bound))
	}
	for _, s := range c.sources {
		if v := highest.bySource[s]; v > perWatch {
			t.Errorf("%s{source=%q} reached %s, over nats.maxInFlightBytesPerWatch (%s)", bytesGauge, s, mib(v), mib(perWatch))
		}
	}
}

// memCgroup is a memory cgroup made for one test, v1 or v2.
type memCgroup struct {
	dir string
	v2  bool
}

// newMemCgroup makes a memory cgroup limited to limit bytes, removed at
// the end of the test (once its process is gone), or says why the machine
// does not allow it.
func newMemCgroup(t *testing.T, limit int64) (*memCgroup, error) {
	name := fmt.Sprintf("relayd-test-%d-%d", os.Getpid(), fixtureSeq.Add(1))
	var why []error
	for _, c := range []struct {
		root, limitFile string
		v2              bool
	}{
		{"/sys/fs/cgroup", "memory.max", true},                    // v2, unified
		{"/sys/fs/cgroup/unified", "memory.max", true},            // v2, hybrid
		{"/sys/fs/cgroup/memory", "memory.limit_in_bytes", false}, // v1
	} {
		dir := filepath.Join(c.root, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			why = append(why, err)
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, c.limitFile)); err != nil {
			why = append(why, fmt.Errorf("%s: no memory controller (%w)", c.root, err))
			os.Remove(dir)
			continue
		}
		t.Cleanup(func() {
			for i := 0; i < 50 && os.Remove(dir) != nil; i++ {
				time.Sleep(100 * time.Millisecond)
			}
		})
		if err := os.WriteFile(filepath.Join(dir, c.limitFile), []byte(strconv.FormatInt(limit, 10)), 0o644); err != nil {
			return nil, fmt.Errorf("%s: %w", c.limitFile, err)
		}
		return &memCgroup{dir: dir, v2: c.v2}, nil
	}
	return nil, errors.Join(why...)
}

// wrap is a command line prefix that moves the process into the cgroup
// before it execs relayd, so that all of relayd's memory is charged to it.
func (c *memCgroup) wrap() []string {
	return []string{"/bin/sh", "-c", `echo $$ > "$0" && exec "$@"`, filepath.Join(c.dir, "cgroup.procs")}
}

// readField reads "<key> N" from a flat-keyed cgroup file.
func (c *memCgroup) readField(file, key string) (int64, error) {
	b, err := os.ReadFile(filepath.Join(c.dir, file))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, key+" "); ok {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("%s: no %s", file, key)
}

// oomKills is the number of processes the kernel killed in the cgroup for
// want of memory.
func (c *memCgroup) oomKills() (int64, error) {
	if c.v2 {
		return c.readField("memory.events", "oom_kill")
	}
	return c.readField("memory.oom_control", "oom_kill")
}

// peak is the cgroup's highest memory charge (process memory and the page
// cache of the files it wrote: relayd's log).
func (c *memCgroup) peak() (int64, error) {
	file := "memory.max_usage_in_bytes"
	if c.v2 {
		file = "memory.peak"
	}
	b, err := os.ReadFile(filepath.Join(c.dir, file))
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// relaydGone is an error once relayd was OOM-killed in cg (if set) or has
// exited: waiting on it cannot help then.
func relaydGone(pid int, cg *memCgroup) error {
	if cg != nil {
		if n, err := cg.oomKills(); err == nil && n > 0 {
			return fmt.Errorf("relayd OOM-killed in its memory cgroup (oom_kill %d)", n)
		}
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return fmt.Errorf("relayd exited: %w", err)
	}
	if i := strings.LastIndexByte(string(b), ')'); i > 0 && i+2 < len(b) && b[i+2] == 'Z' {
		return errors.New("relayd exited")
	}
	return nil
}

// TestMemoryIsBoundedByBytes: the relayd binary with the default byte
// bounds (16 MiB per watch, 48 MiB for the process) and maxInFlight (256),
// and the Deployment's GOMEMLIMIT (its 256 MiB limit), runs four watches
// of 40 ConfigMaps each. While NATS is down every object grows to ~900 KiB:
// 144 MiB of changes, which relayd would hold twice (its window and the
// NATS client's reconnect buffer) without the bounds. The process's bound
// is reached and never exceeded, nor a watch's. Where the machine lets the
// test make a memory cgroup (v1 or v2, writable), relayd runs in one
// limited to 256 MiB from its first instruction, as in a pod, and is never
// OOM-killed (the cgroup's peak is logged); elsewhere the test says so and
// checks relayd's anonymous memory (RssAnon, sampled) against 256 MiB.
// Nothing is lost. With GOMEMLIMIT at the limit the Go runtime collects
// lazily until it nears it, so the peak sits close to 256 MiB whatever the
// live heap: the test shows the fit, not a margin.
func TestMemoryIsBoundedByBytes(t *testing.T) {
	alongside(t)
	const (
		perWatch, bound = 16 << 20, 48 << 20 // the defaults: not in the config below
		limit           = 256 << 20
		objects, big    = 40, 900 << 10 // per source
	)
	n := testenv.NATST(t, testenv.NATSOptions{})
	sources := []string{"a", "b", "c", "d"}
	var srcs strings.Builder
	for _, s := range sources {
		fmt.Fprintf(&srcs, "  - name: %s\n    apiVersion: v1\n    kind: ConfigMap\n    namespaces: [$NS]\n    labelSelector: grp=%s\n", s, s)
	}
	f := newFixture(t, env, n, srcs.String())
	f.cfgYAML = strings.Replace(f.cfgYAML, "  maxInFlight: 64\n", "  maxInFlight: 256\n", 1) // the default, not the suite's 64
	f.cfgYAML = strings.Replace(f.cfgYAML, "  publishTimeout: 2s\n", "  publishTimeout: 10s\n", 1)
	ref := f.reference("")
	cg, err := newMemCgroup(t, limit)
	var wrap []string
	if err != nil {
		t.Logf("NO MEMORY CGROUP (%v): relayd runs unconfined; its sampled RssAnon is checked against 256 MiB instead", err)
		cg = nil
	} else {
		wrap = cg.wrap()
		t.Logf("relayd runs in memory cgroup %s (v2 %v), limit 256 MiB", cg.dir, cg.v2)
	}
	s := serveWrapped(t, f.binary(), wrap, "GOMEMLIMIT="+strconv.Itoa(limit)) // as the Deployment sets it, from limits.memory
	pid := s.p.cmd.Process.Pid
	gone := func() error { return relaydGone(pid, cg) }
	testutil.EventuallyUnless(t, 60*time.Second, "relayd ready", gone, s.ready)

	var cms []*corev1.ConfigMap
	for _, src := range sources {
		for i := range objects {
			cms = append(cms, f.createCM(fmt.Sprintf("%s-%03d", src, i), map[string]string{"grp": src}, map[string]string{"v": "0"}))
		}
	}
	f.waitEveryChangeHeaders(ref, 2*time.Minute)
	g := gatherHTTP(s)
	sampler := sampleInFlight(t, g, pid, 20*time.Millisecond)

	n.Stop()
	// One writer per source, so that all four watches fill at once.
	var wg sync.WaitGroup
	errs := make(chan error, len(sources))
	blob := strings.Repeat("y", big)
	for w := range sources {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w * objects; i < (w+1)*objects; i++ {
				cm := cms[i].DeepCopy()
				cm.Data["blob"], cm.Data["v"] = blob, "1"
				if _, err := f.cs.CoreV1().ConfigMaps(f.ns).Update(t.Context(), cm, metav1.UpdateOptions{}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	testutil.EventuallyUnless(t, 90*time.Second, "the process's byte bound reached while NATS is down", gone, func() error {
		in, err := readInFlight(g)
		if err == nil && in.process < bound-2*big {
			err = fmt.Errorf("%s = %s, want within two messages of %s", processBytesGauge, mib(in.process), mib(bound))
		}
		return err
	})
	time.Sleep(12 * time.Second) // publishes time out (not retried while disconnected)
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyUnless(t, 3*time.Minute, "every change on the stream", gone, func() error {
		have := map[change]bool{}
		for _, sc := range f.storedHeaders() {
			have[sc.c] = true
		}
		for _, c := range ref.changes() {
			if !have[c] {
				return fmt.Errorf("missing %+v", c)
			}
		}
		return nil
	})
	testutil.EventuallyUnless(t, 30*time.Second, "nothing in flight", gone, func() error { return nothingInFlight(g) })
	sampler.close()
	highest, samples, serrs := sampler.highest()
	hwm, err := procStatusKiB(pid, "VmHWM")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("NATS down, %d changes of ~900 KiB over 4 watches: highest of %d samples (%d failed) %s in flight for the process (bound %s), per watch %s (bound %s); relayd VmHWM %.1f MiB, RssAnon peak %.1f MiB (sampled)",
		len(cms), samples, serrs, mib(highest.process), mib(bound), perSourceMiB(highest), mib(perWatch), float64(hwm)/1024, float64(sampler.anonKiB)/1024)
	anonMiB := float64(sampler.anonKiB) / 1024
	if cg != nil {
		// The cgroup is the limit: the kernel reclaims what it can (page
		// cache) and kills only when anonymous memory does not fit.
		peak, perr := cg.peak()
		kills, kerr := cg.oomKills()
		t.Logf("memory cgroup %s: peak %.1f MiB of 256 MiB (%v), oom_kill %d (%v); relayd's sampled RssAnon peak %.1f MiB",
			cg.dir, float64(peak)/(1<<20), perr, kills, kerr, anonMiB)
		if kerr != nil || kills != 0 {
			t.Errorf("relayd's memory cgroup: oom_kill %d (%v), want 0", kills, kerr)
		}
	} else if anonMiB >= limit>>20 {
		// No cgroup: what a 256 MiB limit could not reclaim is relayd's
		// anonymous memory. VmHWM also counts the binary's mapped pages
		// (~20 MiB), which a cgroup reclaims under pressure.
		t.Errorf("relayd's anonymous memory (RssAnon, sampled) reached %.1f MiB, want under 256 MiB (VmHWM %.1f MiB)", anonMiB, float64(hwm)/1024)
	}
	if highest.process > bound {
		t.Errorf("%s reached %s, over the default nats.maxInFlightBytes (%s)", processBytesGauge, mib(highest.process), mib(bound))
	}
	if highest.process < bound-2*big {
		t.Errorf("%s never came within two messages of %s (highest %s): the test did not fill the window", processBytesGauge, mib(bound), mib(highest.process))
	}
	for _, src := range sources {
		if v := highest.bySource[src]; v > perWatch {
			t.Errorf("%s{source=%q} reached %s, over the default nats.maxInFlightBytesPerWatch (%s)", bytesGauge, src, mib(v), mib(perWatch))
		}
	}
	f.assertOnceInOrder(ref)
	s.p.stop()
}

// perSourceMiB formats the highest reading of each source.
func perSourceMiB(in inFlight) string {
	var b strings.Builder
	for _, s := range []string{"a", "b", "c", "d", "cms"} {
		if v, ok := in.bySource[s]; ok {
			fmt.Fprintf(&b, "%s=%s ", s, mib(v))
		}
	}
	return strings.TrimSpace(b.String())
}
