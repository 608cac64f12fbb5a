package checkpoint

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/relayd/relayd/pkg/index"
)

func TestLoadCreatesMissingConfigMap(t *testing.T) {
	admin := env.Clientset(t, false)
	ns := env.Namespace(t)
	s := newStore(t, admin.CoreV1(), ns, nil)
	mustLoad(t, s)

	cm := getCM(t, admin, ns)
	if got := cm.Labels["app.kubernetes.io/managed-by"]; got != "relayd" {
		t.Errorf("label app.kubernetes.io/managed-by = %q, want relayd", got)
	}
	if len(cm.Data) != 0 {
		t.Errorf("created ConfigMap has data %v, want none", cm.Data)
	}
	if _, ok := s.Get("anything"); ok {
		t.Error("Get on an empty checkpoint returned a position")
	}
	// A second replica loads the existing one.
	mustLoad(t, newStore(t, admin.CoreV1(), ns, nil))
}

func TestLoadRestrictedMissingConfigMapSaysWhatToDo(t *testing.T) {
	restricted := env.Clientset(t, true)
	ns := env.Namespace(t)
	grant(t, restricted, ns, "get", "update")

	err := newStore(t, restricted.CoreV1(), ns, nil).Load(t.Context())
	want := fmt.Sprintf(`checkpoint ConfigMap %s/relayd-checkpoint does not exist and relayd may not create it: create it (deploy/ ships one) or grant "create" on configmaps`, ns)
	if err == nil || err.Error() != want {
		t.Fatalf("got %v\nwant %s", err, want)
	}
}

// The production RBAC: get+update on the one pre-created ConfigMap, no create.
func TestLoadRestrictedExistingConfigMap(t *testing.T) {
	admin, restricted := env.Clientset(t, false), env.Clientset(t, true)
	ns := env.Namespace(t)
	if _, err := admin.CoreV1().ConfigMaps(ns).Create(t.Context(), &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: cmName},
		Data:       map[string]string{"other": `{"resourceVersion":"7","epoch":1,"updated":"2026-11-20T08:00:00Z"}`},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	grant(t, restricted, ns, "get", "update")

	s := newStore(t, restricted.CoreV1(), ns, nil)
	mustLoad(t, s)
	wantPos(t, s, "other", "7", 1)
	s.Advance("pods", pos("100", 0), false)
	if err := s.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	cm := getCM(t, admin, ns)
	if _, ok := cm.Labels["app.kubernetes.io/managed-by"]; ok {
		t.Error("relayd labelled a ConfigMap it did not create")
	}
	fresh := newStore(t, restricted.CoreV1(), ns, nil)
	mustLoad(t, fresh)
	wantPos(t, fresh, "pods", "100", 0)
	wantPos(t, fresh, "other", "7", 1)
}

func TestLoadRestrictedWithoutRBACNamesVerb(t *testing.T) {
	restricted := env.Clientset(t, true)
	ns := env.Namespace(t)
	err := newStore(t, restricted.CoreV1(), ns, nil).Load(t.Context())
	if err == nil || !strings.Contains(err.Error(), `may not "get" ConfigMap `+ns+"/"+cmName) {
		t.Fatalf("got %v, want an error naming the get verb and %s/%s", err, ns, cmName)
	}
}

func TestLoadRestrictedGetOnlyNamesUpdate(t *testing.T) {
	admin, restricted := env.Clientset(t, false), env.Clientset(t, true)
	ns := env.Namespace(t)
	if _, err := admin.CoreV1().ConfigMaps(ns).Create(t.Context(), &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: cmName}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	grant(t, restricted, ns, "get")
	err := newStore(t, restricted.CoreV1(), ns, nil).Load(t.Context())
	if err == nil || !strings.Contains(err.Error(), `may not "update" ConfigMap `+ns+"/"+cmName) {
		t.Fatalf("got %v, want an error naming the update verb (found by the dry-run probe)", err)
	}
}

func TestManyAdvancesOneWrite(t *testing.T) {
	admin := env.Clientset(t, false)
	ns := env.Namespace(t)
	cc := &counting{ConfigMapsGetter: admin.CoreV1()}
	m := newMetrics(t)
	s := newStore(t, cc, ns, func(o *Options) { o.Metrics = m })
	mustLoad(t, s)
	w := watchCM(t, admin, ns, getCM(t, admin, ns).ResourceVersion)

	keys := []string{Key("pods", ""), Key("cms", "team-a"), Key("nodes", "")}
	last := map[string]string{}
	var wg sync.WaitGroup
	var mu sync.Mutex
	for i, k := range keys {
		n := 33 + boolInt(i == 0) // 34+33+33 = 100 advances
		wg.Go(func() {
			for j := 1; j <= n; j++ {
				rv := strconv.Itoa(1000*(i+1) + j)
				s.Advance(k, pos(rv, uint64(i)), false)
				mu.Lock()
				last[k] = rv
				mu.Unlock()
			}
		})
	}
	wg.Wait()

	if err := s.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := cc.updates.Load(); got != 1 {
		t.Fatalf("%d update calls for one Flush, want 1", got)
	}
	if got := w.modifiedUntil(t, getCM(t, admin, ns).ResourceVersion); got != 1 {
		t.Fatalf("apiserver saw %d writes, want 1", got)
	}
	if ok, failed := counts(m); ok != 1 || failed != 0 {
		t.Fatalf("metrics: %d ok / %d failed writes, want 1/0", ok, failed)
	}
	// Nothing dirty: no write at all.
	if err := s.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := cc.updates.Load(); got != 1 {
		t.Fatalf("a Flush with nothing dirty wrote (%d updates)", got)
	}

	fresh := newStore(t, admin.CoreV1(), ns, nil)
	mustLoad(t, fresh)
	for i, k := range keys {
		got := wantPos(t, fresh, k, last[k], uint64(i))
		mine, _ := s.Get(k)
		if !got.Updated.Equal(mine.Updated) {
			t.Errorf("key %q: Updated %v after round trip, want %v", k, got.Updated, mine.Updated)
		}
	}
	// The stored value is compact JSON of the Position.
	raw := getCM(t, admin, ns).Data["cms.team-a"]
	if !strings.HasPrefix(raw, `{"resourceVersion":"2033","epoch":1,"updated":"`) || strings.ContainsAny(raw, " \n") {
		t.Errorf("stored value %s", raw)
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestRunCoalescesWrites(t *testing.T) {
	admin := env.Clientset(t, false)
	ns := env.Namespace(t)
	cc := &counting{ConfigMapsGetter: admin.CoreV1()}
	s := newStore(t, cc, ns, func(o *Options) { o.FlushInterval = 200 * time.Millisecond })
	mustLoad(t, s)

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()

	start := time.Now()
	n := 0
	for time.Since(start) < time.Second {
		n++
		s.Advance("busy", pos(strconv.Itoa(n), 0), false)
	}
	// On a loaded machine a write can take longer than a tick (the ticker
	// then drops ticks); wait for Run's first write rather than assume it.
	for deadline := time.Now().Add(10 * time.Second); cc.updates.Load() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("Run did not write within 10s")
		}
	}
	elapsed := time.Since(start)
	cancel()
	<-done
	writes := cc.updates.Load()
	t.Logf("%d advances, %d writes in %v", n, writes, elapsed)
	if maxWrites := int64(elapsed/(200*time.Millisecond)) + 1; writes > maxWrites {
		t.Fatalf("%d writes in %v with FlushInterval 200ms, want at most %d", writes, elapsed, maxWrites)
	}
	// Run does not flush on exit; the owner's final Flush persists the rest.
	if err := s.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	fresh := newStore(t, admin.CoreV1(), ns, nil)
	mustLoad(t, fresh)
	wantPos(t, fresh, "busy", strconv.Itoa(n), 0)
}

func TestTwoReplicasKeepEachOthersKeys(t *testing.T) {
	admin := env.Clientset(t, false)
	ns := env.Namespace(t)
	ca := &counting{ConfigMapsGetter: admin.CoreV1()}
	a := newStore(t, ca, ns, nil)
	b := newStore(t, admin.CoreV1(), ns, nil)
	mustLoad(t, a)
	mustLoad(t, b)

	// Deterministic conflict: b writes between a's get and a's update.
	a.Advance("a1", pos("10", 0), false)
	b.Advance("b1", pos("20", 0), false)
	ca.setHook(func(n int64) error {
		if n == 1 {
			return b.Flush(context.Background())
		}
		return nil
	})
	if err := a.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	ca.setHook(nil)
	if ca.conflicts.Load() != 1 || ca.ok.Load() != 1 {
		t.Fatalf("a: %d conflicts, %d ok updates; want 1 conflict then 1 ok", ca.conflicts.Load(), ca.ok.Load())
	}

	// Then both flush concurrently, back to back, many rounds. Contention
	// this hard can exhaust a flush's conflict retries; like Run, the
	// replica then writes its keys with the next flush.
	const rounds = 20
	var wg sync.WaitGroup
	for _, r := range []struct {
		s    *Store
		keys []string
	}{{a, []string{"a1", "a2", "a3"}}, {b, []string{"b1", "b2"}}} {
		wg.Go(func() {
			exhausted := 0
			for i := 1; i <= rounds || exhausted > 0; i++ {
				if i <= rounds {
					for _, k := range r.keys {
						r.s.Advance(k, pos(fmt.Sprintf("%s-%d", k, i), 0), false)
					}
				}
				err := r.s.Flush(t.Context())
				switch {
				case err == nil:
					exhausted = 0
				case apierrors.IsConflict(err) && i < 10*rounds:
					exhausted++
					t.Logf("replica %s: %v", r.keys[0][:1], err)
				default:
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	t.Logf("replica a: %d conflicts retried", ca.conflicts.Load())

	fresh := newStore(t, admin.CoreV1(), ns, nil)
	mustLoad(t, fresh)
	for _, k := range []string{"a1", "a2", "a3", "b1", "b2"} {
		wantPos(t, fresh, k, fmt.Sprintf("%s-%d", k, rounds), 0)
	}
}

func TestBookmarkOnlyProgressIsThrottled(t *testing.T) {
	admin := env.Clientset(t, false)
	ns := env.Namespace(t)
	cc := &counting{ConfigMapsGetter: admin.CoreV1()}
	clock := newClock()
	s := newStore(t, cc, ns, func(o *Options) {
		o.Now = clock.Now
		o.BookmarkPersistInterval = 2 * time.Minute
	})
	mustLoad(t, s)
	tick := func() {
		t.Helper()
		if err := s.flush(t.Context(), false); err != nil { // what Run does on a tick
			t.Fatal(err)
		}
	}
	stored := func() string {
		t.Helper()
		p, err := decode(getCM(t, admin, ns).Data["k"])
		if err != nil {
			t.Fatal(err)
		}
		return p.ResourceVersion
	}

	// A key never persisted: its first bookmark position is written at once.
	s.Advance("k", pos("1", 0), true)
	tick()
	if got := cc.updates.Load(); got != 1 || stored() != "1" {
		t.Fatalf("first bookmark position: %d writes, stored %s; want 1 write of rv 1", got, stored())
	}

	// Bookmark-only progress waits for the interval ...
	clock.Add(30 * time.Second)
	s.Advance("k", pos("2", 0), true)
	tick()
	clock.Add(89 * time.Second) // 1m59s after the last write
	s.Advance("k", pos("3", 0), true)
	tick()
	if got := cc.updates.Load(); got != 1 {
		t.Fatalf("bookmark-only progress written before BookmarkPersistInterval (%d writes)", got)
	}
	clock.Add(time.Second) // 2m after the last write
	tick()
	if got := cc.updates.Load(); got != 2 || stored() != "3" {
		t.Fatalf("after the interval: %d writes, stored %s; want 2 writes, rv 3", got, stored())
	}

	// ... a normal advance does not, and it takes the bookmark progress with it.
	clock.Add(time.Second)
	s.Advance("k", pos("4", 0), true)
	s.Advance("k", pos("5", 0), false)
	s.Advance("k", pos("6", 0), true)
	tick()
	if got := cc.updates.Load(); got != 3 || stored() != "6" {
		t.Fatalf("normal advance: %d writes, stored %s; want 3 writes, rv 6", got, stored())
	}

	// Flush (shutdown) writes bookmark-only progress regardless.
	clock.Add(time.Second)
	s.Advance("k", pos("7", 0), true)
	tick()
	if got := cc.updates.Load(); got != 3 {
		t.Fatalf("bookmark-only progress written 1s after a write (%d writes)", got)
	}
	if err := s.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := cc.updates.Load(); got != 4 || stored() != "7" {
		t.Fatalf("Flush: %d writes, stored %s; want 4 writes, rv 7", got, stored())
	}
}

// The same through Run, and a restart counts the loaded position's age.
func TestRunThrottlesBookmarksAfterRestart(t *testing.T) {
	admin := env.Clientset(t, false)
	ns := env.Namespace(t)
	clock := newClock()
	first := newStore(t, admin.CoreV1(), ns, func(o *Options) { o.Now = clock.Now })
	mustLoad(t, first)
	first.Advance("k", pos("1", 0), false)
	if err := first.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}

	clock.Add(time.Minute)
	cc := &counting{ConfigMapsGetter: admin.CoreV1()}
	m := newMetrics(t)
	s := newStore(t, cc, ns, func(o *Options) {
		o.Now = clock.Now
		o.FlushInterval = 20 * time.Millisecond
		o.BookmarkPersistInterval = 2 * time.Minute
		o.Metrics = m
	})
	mustLoad(t, s)
	s.Follow("k", []string{"k"})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	defer func() { cancel(); <-done }()

	stored := func(key string) string {
		t.Helper()
		v, ok := getCM(t, admin, ns).Data[key]
		if !ok {
			return ""
		}
		p, err := decode(v)
		if err != nil {
			t.Fatal(err)
		}
		return p.ResourceVersion
	}
	// waitWrites waits until n writes succeeded.
	waitWrites := func(n int64, what string) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); cc.ok.Load() < n; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d writes, want %d", what, cc.ok.Load(), n)
			}
		}
	}
	s.Advance("k", pos("2", 0), true)
	// The barrier: progress of another key from an event, which the next
	// tick writes; that tick came after k's bookmark-only progress and
	// left it out (a write carries every key due).
	s.Advance("k2", pos("3", 0), false)
	waitWrites(1, "progress from an event not written")
	if got, k, k2 := cc.updates.Load(), stored("k"), stored("k2"); got != 1 || k != "1" || k2 != "3" {
		t.Fatalf("bookmark-only progress written 1m after the loaded position: %d writes, stored k %q, k2 %q; want 1 write, k 1, k2 3", got, k, k2)
	}
	clock.Add(time.Minute)
	waitWrites(2, "bookmark-only progress not written after the interval")
	if k := stored("k"); k != "2" {
		t.Errorf("stored k %q after the interval, want 2", k)
	}
	if got, want := testutil.ToFloat64(m.LastWrite.WithLabelValues("k")), unixSeconds(clock.Now()); got != want {
		t.Errorf("last write %v, want %v", got, want)
	}
}

func TestCorruptValueNamesTheKey(t *testing.T) {
	admin := env.Clientset(t, false)
	ns := env.Namespace(t)
	if _, err := admin.CoreV1().ConfigMaps(ns).Create(t.Context(), &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: cmName},
		Data: map[string]string{
			"good":         `{"resourceVersion":"5","epoch":0,"updated":"2026-11-20T08:00:00Z"}`,
			"bad.team-a":   `not json`,
			"empty.team-b": `{}`,
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	err := newStore(t, admin.CoreV1(), ns, nil).Load(t.Context())
	if err == nil {
		t.Fatal("Load accepted corrupt values")
	}
	for _, want := range []string{`key "bad.team-a"`, `key "empty.team-b"`, "delete the key"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
	if strings.Contains(err.Error(), `"good"`) {
		t.Errorf("error %q names the valid key", err)
	}
}

func TestSameResourceVersionIsNotDirty(t *testing.T) {
	admin := env.Clientset(t, false)
	ns := env.Namespace(t)
	cc := &counting{ConfigMapsGetter: admin.CoreV1()}
	clock := newClock()
	s := newStore(t, cc, ns, func(o *Options) { o.Now = clock.Now })
	mustLoad(t, s)

	s.Advance("k", pos("5", 1), false)
	if err := s.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	before, _ := s.Get("k")
	clock.Add(time.Minute)
	s.Advance("k", pos("5", 2), false) // same resourceVersion: no move
	s.Advance("k", pos("5", 1), true)
	if err := s.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := cc.updates.Load(); got != 1 {
		t.Fatalf("%d writes, want 1: the same resourceVersion made the key dirty", got)
	}
	if after, _ := s.Get("k"); after != before {
		t.Fatalf("position changed from %+v to %+v", before, after)
	}
	// A different string moves it, whatever its numeric value (opaque).
	s.Advance("k", pos("4", 1), false)
	if p, _ := s.Get("k"); p.ResourceVersion != "4" || !p.Updated.Equal(clock.Now()) {
		t.Fatalf("got %+v, want resourceVersion 4 updated now", p)
	}
	// The same resourceVersion with a new index generation moves it (else a
	// relist that found nothing new would leave the checkpoint pointing at
	// a lost index, and every restart would relist again); the same
	// generation does not.
	g1 := pos("4", 2)
	g1.Index = &index.Ref{Generation: "g1", Seq: 3}
	s.Advance("k", g1, false)
	if p, _ := s.Get("k"); p.Index == nil || p.Index.Generation != "g1" {
		t.Fatalf("got %+v, want generation g1", p)
	}
	g1b := pos("4", 2)
	g1b.Index = &index.Ref{Generation: "g1", Seq: 9}
	s.Advance("k", g1b, false)
	if p, _ := s.Get("k"); p.Index.Seq != 3 {
		t.Fatalf("got %+v: the same generation and resourceVersion moved it", p)
	}
}

func TestAdvanceDuringFlushStaysDirty(t *testing.T) {
	admin := env.Clientset(t, false)
	ns := env.Namespace(t)
	cc := &counting{ConfigMapsGetter: admin.CoreV1()}
	s := newStore(t, cc, ns, nil)
	mustLoad(t, s)
	s.Advance("k", pos("1", 0), false)
	cc.setHook(func(int64) error { s.Advance("k", pos("2", 0), false); return nil })
	if err := s.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	cc.setHook(nil)
	if p, _ := decode(getCM(t, admin, ns).Data["k"]); p.ResourceVersion != "1" {
		t.Fatalf("stored %q, want the snapshot taken at the start of the flush (1)", p.ResourceVersion)
	}
	if err := s.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if p, _ := decode(getCM(t, admin, ns).Data["k"]); p.ResourceVersion != "2" || cc.updates.Load() != 2 {
		t.Fatalf("stored %q after %d writes, want 2 after 2", p.ResourceVersion, cc.updates.Load())
	}
}

func TestRunRetriesFailedWrites(t *testing.T) {
	admin := env.Clientset(t, false)
	ns := env.Namespace(t)
	cc := &counting{ConfigMapsGetter: admin.CoreV1()}
	m := newMetrics(t)
	s := newStore(t, cc, ns, func(o *Options) {
		o.FlushInterval = 20 * time.Millisecond
		o.Metrics = m
	})
	mustLoad(t, s)
	unavailable := apierrors.NewServiceUnavailable("injected")
	cc.setHook(func(n int64) error {
		if n <= 3 {
			return unavailable
		}
		return nil
	})
	s.Advance("k", pos("9", 0), false)

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	deadline := time.Now().Add(5 * time.Second)
	for cc.ok.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("Run did not retry until the write succeeded")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	ok, failed := counts(m)
	if ok != 1 || failed != 3 {
		t.Fatalf("metrics: %d ok / %d failed, want 1 / 3", ok, failed)
	}
	if p, _ := decode(getCM(t, admin, ns).Data["k"]); p.ResourceVersion != "9" {
		t.Fatalf("stored %q, want 9", p.ResourceVersion)
	}
}

func TestFlushRecreatesDeletedConfigMap(t *testing.T) {
	admin := env.Clientset(t, false)
	ns := env.Namespace(t)
	s := newStore(t, admin.CoreV1(), ns, nil)
	mustLoad(t, s)
	if err := admin.CoreV1().ConfigMaps(ns).Delete(t.Context(), cmName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s.Advance("k", pos("3", 0), false)
	if err := s.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if p, err := decode(getCM(t, admin, ns).Data["k"]); err != nil || p.ResourceVersion != "3" {
		t.Fatalf("got %+v, %v", p, err)
	}
}

// Load again (after taking over a source) picks up another replica's newer
// position, but keeps a key this store advanced and has not yet written.
func TestReloadKeepsDirtyKeys(t *testing.T) {
	admin := env.Clientset(t, false)
	ns := env.Namespace(t)
	a := newStore(t, admin.CoreV1(), ns, nil)
	b := newStore(t, admin.CoreV1(), ns, nil)
	mustLoad(t, a)
	mustLoad(t, b)
	b.Advance("taken", pos("50", 3), false)
	b.Advance("mine", pos("60", 0), false)
	if err := b.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	a.Advance("mine", pos("61", 0), false)
	mustLoad(t, a)
	wantPos(t, a, "taken", "50", 3)
	wantPos(t, a, "mine", "61", 0)
}

// Unit tests (no API calls).

func TestNewNamesMissingFields(t *testing.T) {
	_, err := New(Options{FlushInterval: -1, BookmarkPersistInterval: -time.Second})
	if err == nil {
		t.Fatal("New accepted empty options")
	}
	for _, f := range []string{"Options.Client", "Options.Namespace", "Options.Name", "Options.Logger", "Options.FlushInterval", "Options.BookmarkPersistInterval"} {
		if !strings.Contains(err.Error(), f) {
			t.Errorf("error %q does not name %s", err, f)
		}
	}
	s, err := New(Options{Client: env.Clientset(t, false).CoreV1(), Namespace: "n", Name: "c", Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	if s.flushInt != DefaultFlushInterval || s.bookmarkInt != DefaultBookmarkPersistInterval {
		t.Fatalf("defaults %v %v", s.flushInt, s.bookmarkInt)
	}
}

func TestKey(t *testing.T) {
	for _, c := range []struct{ source, ns, want string }{
		{"pods", "", "pods"},
		{"pods", "kube-system", "pods.kube-system"},
	} {
		if got := Key(c.source, c.ns); got != c.want {
			t.Errorf("Key(%q, %q) = %q, want %q", c.source, c.ns, got, c.want)
		}
	}
}

func TestDecode(t *testing.T) {
	for _, bad := range []string{"", "null", "{}", `{"resourceVersion":""}`, `{"resourceVersion":5}`, `{"resourceVersion":"1"} x`, `{"resourceVersion":"1","epoch":-1}`} {
		if p, err := decode(bad); err == nil {
			t.Errorf("decode(%q) = %+v, want an error", bad, p)
		}
	}
	// Fields added by a newer relayd do not break an older one (rollback).
	p, err := decode(`{"resourceVersion":"12","epoch":3,"updated":"2026-11-20T08:00:00.5Z","future":true}`)
	if err != nil || p.ResourceVersion != "12" || p.Epoch != 3 || p.Updated.Nanosecond() != 5e8 {
		t.Fatalf("got %+v, %v", p, err)
	}
}

func TestAdvanceIgnoresEmptyResourceVersion(t *testing.T) {
	s, err := New(Options{Client: env.Clientset(t, false).CoreV1(), Namespace: "n", Name: "c", Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	s.Advance("k", Position{}, false)
	if _, ok := s.Get("k"); ok {
		t.Fatal("an empty resourceVersion became a position")
	}
	if todo, _ := s.collect(true); len(todo) != 0 {
		t.Fatalf("dirty keys %v", todo)
	}
}

func TestDiscardDropsUnwrittenProgress(t *testing.T) {
	admin := env.Clientset(t, false)
	ns := env.Namespace(t)
	cc := &counting{ConfigMapsGetter: admin.CoreV1()}
	s := newStore(t, cc, ns, nil)
	mustLoad(t, s)
	s.Advance("k", pos("5", 1), false)
	if err := s.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	s.Advance("k", pos("9", 1), false)
	s.Advance("fresh", pos("3", 1), false)
	s.Discard("k", "fresh", "unknown")
	if err := s.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := cc.updates.Load(); got != 1 {
		t.Fatalf("%d writes, want 1: discarded progress was written", got)
	}
	if p, ok := s.Get("k"); !ok || p.ResourceVersion != "5" {
		t.Fatalf("Get(k) = %+v, %v; want the stored 5", p, ok)
	}
	if p, ok := s.Get("fresh"); ok {
		t.Fatalf("Get(fresh) = %+v; want none (never stored)", p)
	}
	// Later progress is written as usual.
	s.Advance("k", pos("10", 1), false)
	if err := s.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := cc.updates.Load(); got != 2 {
		t.Fatalf("%d writes, want 2", got)
	}
}

// A replica cut off from the apiserver loses its Lease while a write is
// under way; when the partition heals, that write's conflict retry must
// not put the old position over the new owner's (docs/DEPLOY.md, "High
// availability and sharding": a replica that lost a source never moves its
// checkpoint back).
func TestDiscardDuringAConflictedWriteLeavesTheNewOwnersPosition(t *testing.T) {
	admin := env.Clientset(t, false)
	ns := env.Namespace(t)
	ca := &counting{ConfigMapsGetter: admin.CoreV1()}
	a := newStore(t, ca, ns, nil)
	b := newStore(t, admin.CoreV1(), ns, nil)
	mustLoad(t, a)
	mustLoad(t, b)

	a.Advance("k", pos("10", 1), false)
	ca.setHook(func(n int64) error {
		if n == 1 {
			// Between a's get and its update: b owns k now and writes
			// it (so a's update conflicts), and a is told it lost k.
			b.Advance("k", pos("20", 1), false)
			if err := b.Flush(context.Background()); err != nil {
				return err
			}
			a.Discard("k")
		}
		return nil
	})
	if err := a.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := ca.conflicts.Load(); got != 1 {
		t.Fatalf("a's update conflicted %d times, want 1 (the test did not interleave)", got)
	}
	if got := ca.ok.Load(); got != 0 {
		t.Errorf("a wrote %d times after it was discarded, want 0", got)
	}
	fresh := newStore(t, admin.CoreV1(), ns, nil)
	mustLoad(t, fresh)
	wantPos(t, fresh, "k", "20", 1)
}

// Settle raises only positions this process advanced: a key loaded from
// the ConfigMap and never advanced here may belong to a watch that another
// replica, or a crashed run, left behind a stream it has not read, so its
// stream sequence stays where it was stored.
func TestSettleRaisesOnlyKeysAdvancedHere(t *testing.T) {
	admin := env.Clientset(t, false)
	ns := env.Namespace(t)
	a := newStore(t, admin.CoreV1(), ns, nil)
	mustLoad(t, a)
	a.Advance("loaded", Position{ResourceVersion: "50", Epoch: 2, StreamSeq: 7}, false)
	if err := a.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}

	b := newStore(t, admin.CoreV1(), ns, nil)
	mustLoad(t, b)
	b.Advance("moved", Position{ResourceVersion: "60", Epoch: 1, StreamSeq: 9}, false)
	b.Settle("loaded", 100)
	b.Settle("moved", 100)
	b.Settle("unknown", 100)
	b.Settle("moved", 40) // never lowered
	if err := b.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}

	c := newStore(t, admin.CoreV1(), ns, nil)
	mustLoad(t, c)
	if p := wantPos(t, c, "loaded", "50", 2); p.StreamSeq != 7 {
		t.Errorf("a key never advanced here was settled: streamSeq %d, want the stored 7", p.StreamSeq)
	}
	if p := wantPos(t, c, "moved", "60", 1); p.StreamSeq != 100 {
		t.Errorf("a key advanced here: streamSeq %d after Settle(100) and Settle(40), want 100", p.StreamSeq)
	}
	if p, ok := c.Get("unknown"); ok {
		t.Errorf("Settle of an unknown key made a position: %+v", p)
	}
}
