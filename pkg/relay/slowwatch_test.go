package relay_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/pkg/event"
)

// slowWatchOutageEnv sets how long NATS stays away in
// TestSlowWatchResumesAfterTheAPIServerClosesIt (a Go duration). Unset, it
// is the CI size (20 s); the scale goal's run is
//
//	RELAYD_SLOW_WATCH_OUTAGE=60s go test -p 1 -run TestSlowWatch ./pkg/relay
//
// (docs/OPERATIONS.md, "A watch that stops reading"). An outage longer
// than the apiserver's watch cache holds (about 130 s at 100 changes/s)
// ends in a 410 and a relist of reason expired, which the test then allows
// and checks (markers, each object's last version).
const slowWatchOutageEnv = "RELAYD_SLOW_WATCH_OUTAGE"

// The slow watcher: while NATS is away relayd stops reading its watch
// (backpressure), and the apiserver's watch cache closes a watcher whose
// buffer stays full beyond its dispatch budget ("Forcing ... watcher close
// due to unresponsiveness"). relayd must then resume from the position it
// read last, which the watch cache still holds: no relist, no loss, no
// change stored twice, each object's changes in order.
//
// Against its own kube-apiserver (watch cache on, as testenv runs it, and
// --v=1 so that its log says when it closes a watcher) and its own
// nats-server; a writer updates 100 ConfigMaps of 8 KiB at 100 changes/s
// before, during and after the outage.
func TestSlowWatchResumesAfterTheAPIServerClosesIt(t *testing.T) {
	alongside(t)
	outage := 20 * time.Second
	v := os.Getenv(slowWatchOutageEnv)
	if v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("%s=%q: %v", slowWatchOutageEnv, v, err)
		}
		outage = d
	}
	e := testenv.StartT(t, testenv.Options{ExtraAPIServerArgs: []string{"--v=1"}})
	n := testenv.NATST(t, testenv.NATSOptions{})
	f := newFixture(t, e, n, `
  - name: cms
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]`)
	ref := f.reference("")
	const objects = 100
	// Random data: the apiserver gzips a response for a client that
	// accepts it (relayd's LIST pages do), and repeated bytes would shrink
	// 8 KiB to a few dozen on the wire.
	cms := make([]*corev1.ConfigMap, objects)
	for i := range cms {
		pad := make([]byte, 6<<10)
		_, _ = rand.Read(pad)
		cms[i] = f.createCM(fmt.Sprintf("sw-%03d", i), nil, map[string]string{"v": "0", "pad": base64.StdEncoding.EncodeToString(pad)})
	}
	s := serve(t, f.binary())
	f.eventually(60*time.Second, "relayd ready", s.ready)
	f.waitStored(60*time.Second, isSync("completed"))

	w := startWriter(f, cms, 100)
	time.Sleep(5 * time.Second) // changes relayd stores as they come
	n.Stop()
	stopped := time.Now()
	t.Logf("NATS stopped at %s for %v; %d changes written so far", time.Now().UTC().Format("15:04:05.000"), outage, w.count())
	time.Sleep(outage)
	if v == "" {
		// On a slow machine the writer is slower and the apiserver's
		// buffers take longer to fill: NATS stays away until it closed
		// the watch (what this test is about), up to a minute more.
		for end := time.Now().Add(time.Minute); terminatedWatchers(t, f) == 0 && time.Now().Before(end); {
			time.Sleep(time.Second)
		}
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Logf("NATS started again after %v; %d changes written so far", time.Since(stopped).Round(time.Millisecond), w.count())
	time.Sleep(5 * time.Second) // changes made while relayd catches up
	if err := w.stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("writer stopped after %d changes", w.count())

	// Each object's last version, which a relist would publish too: the
	// checks below then say what happened on the way.
	f.eventually(3*time.Minute, "each object's last version on the stream", func() error {
		have := map[change]bool{}
		for _, o := range f.storedOutline() {
			have[o.c] = true
		}
		last := map[string]change{}
		for _, c := range ref.changes() {
			last[c.uid] = c
		}
		for _, c := range last {
			if !have[c] && !have[change{c.uid, c.rv, "added"}] {
				return fmt.Errorf("missing %+v", c)
			}
		}
		return nil
	})
	// An outage set longer than the watch cache's history ends in a 410
	// and a relist: allowed there, when the apiserver said so (its "too old
	// resource version", in relayd's log); the CI size stays well inside.
	mayRelist := v != "" && strings.Contains(s.p.log(), `"error":"too old resource version:`)
	checkSlowWatchStream(t, f, ref, objects, mayRelist)
	reportSlowWatch(t, f, e, s, mayRelist)
}

// slowWriter updates its ConfigMaps round-robin at a fixed rate, from
// several goroutines (each owns some objects, so its updates never
// conflict).
type slowWriter struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	n      atomic.Int64
	errMu  sync.Mutex
	err    error
}

func startWriter(f *fixture, cms []*corev1.ConfigMap, perSecond int) *slowWriter {
	ctx, cancel := context.WithCancel(f.t.Context())
	w := &slowWriter{cancel: cancel}
	const workers = 4
	tick := time.NewTicker(time.Second / time.Duration(perSecond))
	tokens := make(chan struct{})
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				close(tokens)
				return
			case <-tick.C:
				select {
				case tokens <- struct{}{}:
				default: // the writers are behind: the rate is a ceiling
				}
			}
		}
	}()
	for k := range workers {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			for i := k; ; i += workers {
				if _, ok := <-tokens; !ok {
					return
				}
				j := i % len(cms)
				cm := cms[j].DeepCopy()
				cm.Data["v"] = fmt.Sprint(w.n.Add(1))
				out, err := f.cs.CoreV1().ConfigMaps(cm.Namespace).Update(ctx, cm, metav1.UpdateOptions{})
				if err != nil {
					if ctx.Err() == nil {
						w.errMu.Lock()
						w.err = fmt.Errorf("update %s: %w", cm.Name, err)
						w.errMu.Unlock()
						cancel()
					}
					return
				}
				cms[j] = out
			}
		}()
	}
	return w
}

func (w *slowWriter) count() int64 { return w.n.Load() }

func (w *slowWriter) stop() error {
	w.cancel()
	w.wg.Wait()
	w.errMu.Lock()
	defer w.errMu.Unlock()
	return w.err
}

// outlined is one message of the stream, from its subject and Nats-Msg-Id:
// an object change (c set) or a sync marker (marker "started" or
// "completed").
type outlined struct {
	seq    uint64
	c      change
	marker string
}

// storedOutline reads the whole stream, headers only.
func (f *fixture) storedOutline() []outlined {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(f.t.Context(), time.Minute)
	defer cancel()
	s, err := f.js.Stream(ctx, f.stream)
	if err != nil {
		f.t.Fatal(err)
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{HeadersOnly: true})
	if err != nil {
		f.t.Fatal(err)
	}
	defer func() {
		if info := c.CachedInfo(); info != nil {
			_ = s.DeleteConsumer(context.Background(), info.Name)
		}
	}()
	info, err := s.Info(ctx)
	if err != nil {
		f.t.Fatal(err)
	}
	var out []outlined
	for seq := uint64(0); seq < info.State.LastSeq; {
		batch, err := c.FetchNoWait(500)
		if err != nil {
			f.t.Fatal(err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			md, err := m.Metadata()
			if err != nil {
				f.t.Fatal(err)
			}
			seq = md.Sequence.Stream
			subj := m.Subject()
			typ := subj[strings.LastIndexByte(subj, '.')+1:]
			parts := strings.Split(m.Headers().Get(jetstream.MsgIDHeader), "/")
			switch {
			case strings.HasSuffix(subj, ".sync."+typ):
				out = append(out, outlined{seq: seq, marker: typ})
			case (typ == "added" || typ == "modified" || typ == "deleted") && len(parts) >= 4:
				out = append(out, outlined{seq: seq, c: change{parts[2], parts[3], typ}})
			}
		}
		if err := batch.Error(); err != nil {
			f.t.Fatal(err)
		}
		if got == 0 {
			time.Sleep(50 * time.Millisecond)
		}
	}
	return out
}

// markerReason reads the reason of the sync marker stored at seq.
func (f *fixture) markerReason(seq uint64) string {
	f.t.Helper()
	s, err := f.js.Stream(f.t.Context(), f.stream)
	if err != nil {
		f.t.Fatal(err)
	}
	rm, err := s.GetMsg(f.t.Context(), seq)
	if err != nil {
		f.t.Fatal(err)
	}
	env, err := event.DecodeMessage(rm.Header, rm.Data)
	if err != nil {
		f.t.Fatalf("marker %d: %v", seq, err)
	}
	var d markerResource
	if err := json.Unmarshal(env.Data, &d); err != nil {
		f.t.Fatalf("marker %d data: %v", seq, err)
	}
	return d.Reason
}

// checkSlowWatchStream checks the stream against the reference history:
// each object's last change stored; no (object, resourceVersion) stored
// twice; each object's changes in resourceVersion order; sync markers
// paired, each with a reason, and none but the initial list's; and, with
// no relist, every change stored. mayRelist: relists of reason expired
// are allowed (the position left the watch cache), and changes they skip.
func checkSlowWatchStream(t *testing.T, f *fixture, ref *reference, objects int, mayRelist bool) {
	t.Helper()
	out := f.storedOutline()
	want := ref.changes()
	stored := map[[2]string]int{}
	lastRV := map[string]int64{}
	var started []uint64
	open := false
	markers := map[string]int{}
	for _, o := range out {
		if o.marker != "" {
			if (o.marker == "started") == open {
				t.Errorf("sync.%s at %d: markers not paired (a list open: %v)", o.marker, o.seq, open)
			}
			open = o.marker == "started"
			reason := f.markerReason(o.seq)
			if reason == "" {
				t.Errorf("sync.%s at %d has no reason", o.marker, o.seq)
			}
			if open {
				started = append(started, o.seq)
				markers[reason]++
			}
			continue
		}
		k := [2]string{o.c.uid, o.c.rv}
		if stored[k]++; stored[k] == 2 {
			t.Errorf("object %s resourceVersion %s stored twice (again at %d)", o.c.uid, o.c.rv, o.seq)
		}
		if rv := rvNum(t, o.c.rv); rv < lastRV[o.c.uid] {
			t.Errorf("object %s: resourceVersion %s stored at %d after %d", o.c.uid, o.c.rv, o.seq, lastRV[o.c.uid])
		} else {
			lastRV[o.c.uid] = rv
		}
	}
	if open {
		t.Errorf("a sync.started (at %d) without its sync.completed", started[len(started)-1])
	}
	final := map[string]change{}
	for _, c := range want {
		final[c.uid] = c
	}
	if len(final) != objects {
		t.Fatalf("the reference saw %d objects, want %d", len(final), objects)
	}
	for _, c := range final {
		if stored[[2]string{c.uid, c.rv}] == 0 {
			t.Errorf("object %s: its final version %s is not stored", c.uid, c.rv)
		}
	}
	// The claim: the closed watch resumed from its position, so the only
	// list is the initial one and every change is stored.
	if mayRelist && len(started) == 1+markers["expired"] && markers["initial"] == 1 {
		t.Logf("the position left the watch cache (410): %d relists of reason expired, with their markers", markers["expired"])
	} else if len(started) != 1 || markers["initial"] != 1 {
		t.Errorf("relists (sync.started by reason): %v, want only the initial list: the closed watch was not resumed from its position", markers)
	}
	missing := 0
	for _, c := range want {
		if stored[[2]string{c.uid, c.rv}] == 0 {
			missing++
		}
	}
	if missing > 0 && !(mayRelist && markers["expired"] > 0) {
		t.Errorf("%d of %d changes not stored", missing, len(want))
	}
	t.Logf("stream: %d messages, %d changes of %d objects (reference: %d), sync lists by reason %v", len(out), len(stored), len(final), len(want), markers)
}

// terminatedWatchers is the apiserver's count of ConfigMap watchers it
// closed for unresponsiveness (apiserver_terminated_watchers_total).
func terminatedWatchers(t *testing.T, f *fixture) float64 {
	t.Helper()
	raw, err := f.cs.RESTClient().Get().AbsPath("/metrics").DoRaw(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, `apiserver_terminated_watchers_total{group="",resource="configmaps"} `); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return n
		}
	}
	return 0
}

var forcingRE = regexp.MustCompile(`[^\n]*Forcing \S+ watcher close due to unresponsiveness[^\n]*`)

// reportSlowWatch logs what the apiserver did (its log's "Forcing ...
// watcher close" lines, its apiserver_terminated_watchers_total and the
// ConfigMaps' watch cache capacity) and
// relayd's watch restarts and relists by reason, and checks that the
// apiserver did close relayd's watch: without that this test would not
// show the resume it is about.
func reportSlowWatch(t *testing.T, f *fixture, e *testenv.Env, s *served, mayRelist bool) {
	t.Helper()
	logs, _ := filepath.Glob(filepath.Join(e.Dir(), "apiserver.*.log"))
	var forced []string
	for _, l := range logs {
		b, err := os.ReadFile(l)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range forcingRE.FindAllString(string(b), -1) {
			if strings.Contains(m, f.ns) || strings.Contains(m, "configmaps") {
				forced = append(forced, m)
			}
		}
	}
	raw, err := f.cs.RESTClient().Get().AbsPath("/metrics").DoRaw(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var terminated []string
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(line, "apiserver_terminated_watchers_total") || strings.HasPrefix(line, `watch_cache_capacity{group="",resource="configmaps"}`) {
			terminated = append(terminated, line)
		}
	}
	t.Logf("apiserver: %d \"Forcing ... watcher close\" lines for configmaps:\n  %s\napiserver metrics:\n  %s",
		len(forced), strings.Join(forced, "\n  "), strings.Join(terminated, "\n  "))
	if len(forced) == 0 {
		t.Errorf("the apiserver never closed relayd's watch for unresponsiveness: the outage did not make the slow watcher this test is about")
	}
	src := map[string]string{"source": "cms"}
	for _, name := range []string{"relayd_watch_restarts_total", "relayd_relists_total"} {
		var got []string
		for _, reason := range []string{"initial", "expired", "no-checkpoint", "index-lost", "timeout", "idle", "closed", "error", "oversized", "panic"} {
			src["reason"] = reason
			if v, err := s.metric(name, src); err == nil && v > 0 {
				got = append(got, fmt.Sprintf("%s=%v", reason, v))
			}
		}
		t.Logf("relayd %s: %s", name, strings.Join(got, " "))
	}
	if v, err := s.metric("relayd_relists_total", map[string]string{"source": "cms", "reason": "expired"}); err == nil && v > 0 && !mayRelist {
		t.Errorf("relayd_relists_total{reason=\"expired\"} = %v: relayd relisted where it should have resumed", v)
	}
	if t.Failed() || testing.Verbose() {
		for _, line := range strings.Split(s.p.log(), "\n") {
			if strings.Contains(line, "recovered") || strings.Contains(line, "watch") && (strings.Contains(line, "WARN") || strings.Contains(line, "warn") || strings.Contains(line, "relist")) {
				t.Logf("relayd: %s", line)
			}
		}
	}
}
