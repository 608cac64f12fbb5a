package index

import (
	"errors"
	"fmt"
	"runtime"
	"sort"
	"testing"
)

func uid(i int) string { return fmt.Sprintf("%08x-0000-4000-8000-%012x", i, i) }

func TestPutGetDelete(t *testing.T) {
	x := New()
	x.Put(Object{UID: uid(1), Namespace: "default", Name: "a", ResourceVersion: "10"})
	x.Put(Object{UID: uid(2), Name: "cluster-scoped", ResourceVersion: "11"})
	x.Put(Object{UID: "not-a-uuid", Namespace: "ns", Name: "b", ResourceVersion: "opaque-rv"})
	x.Put(Object{UID: "ABCDEFAB-0000-4000-8000-000000000001", Namespace: "ns", Name: "upper", ResourceVersion: "007"})
	if x.Len() != 4 {
		t.Fatalf("Len = %d, want 4", x.Len())
	}
	for _, want := range []Object{
		{UID: uid(1), Namespace: "default", Name: "a", ResourceVersion: "10"},
		{UID: uid(2), Name: "cluster-scoped", ResourceVersion: "11"},
		{UID: "not-a-uuid", Namespace: "ns", Name: "b", ResourceVersion: "opaque-rv"},
		{UID: "ABCDEFAB-0000-4000-8000-000000000001", Namespace: "ns", Name: "upper", ResourceVersion: "007"},
	} {
		got, ok := x.Get(want.UID)
		if !ok || got != want {
			t.Errorf("Get(%s) = %+v, %v; want %+v", want.UID, got, ok, want)
		}
	}
	x.Put(Object{UID: uid(1), Namespace: "default", Name: "a", ResourceVersion: "12"})
	if got, _ := x.Get(uid(1)); got.ResourceVersion != "12" {
		t.Errorf("after update rv = %q, want 12", got.ResourceVersion)
	}
	// A numeric rv replacing an opaque one drops the side entry.
	x.Put(Object{UID: "not-a-uuid", Namespace: "ns", Name: "b", ResourceVersion: "13"})
	if got, _ := x.Get("not-a-uuid"); got.ResourceVersion != "13" || len(x.rvs) != 1 {
		t.Errorf("rv = %q, side rvs = %d; want 13 and 1 (the upper-case uid's 007)", got.ResourceVersion, len(x.rvs))
	}
	if !x.Delete(uid(1)) || x.Delete(uid(1)) {
		t.Error("Delete should report true once, then false")
	}
	if !x.Delete("not-a-uuid") || len(x.uids) != 1 {
		t.Errorf("non-UUID side entry not removed: %d left (want 1: the upper-case uid)", len(x.uids))
	}
	if _, ok := x.Get(uid(1)); ok || x.Len() != 2 {
		t.Errorf("deleted object still there (Len %d)", x.Len())
	}
}

func TestSync(t *testing.T) {
	x := New()
	for i := 0; i < 10; i++ {
		x.Put(Object{UID: uid(i), Namespace: "ns", Name: fmt.Sprintf("o%d", i), ResourceVersion: fmt.Sprint(100 + i)})
	}
	x.BeginSync()
	got := map[Outcome][]int{}
	// 0..3 unchanged, 4..5 modified, 6..9 gone, 10..11 new.
	for i := 0; i < 12; i++ {
		if i >= 6 && i <= 9 {
			continue
		}
		rv := fmt.Sprint(100 + i)
		if i == 4 || i == 5 {
			rv = fmt.Sprint(200 + i)
		}
		out := x.Observe(Object{UID: uid(i), Namespace: "ns", Name: fmt.Sprintf("o%d", i), ResourceVersion: rv})
		got[out] = append(got[out], i)
	}
	want := map[Outcome][]int{Unchanged: {0, 1, 2, 3}, Modified: {4, 5}, Added: {10, 11}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("outcomes %v, want %v", got, want)
	}
	var gone []string
	n, _ := x.EndSync(func(o Object) error { gone = append(gone, o.Name+"@"+o.ResourceVersion); return nil })
	sort.Strings(gone)
	if n != 4 || fmt.Sprint(gone) != "[o6@106 o7@107 o8@108 o9@109]" {
		t.Fatalf("EndSync = %d %v", n, gone)
	}
	if x.Len() != 8 {
		t.Fatalf("Len = %d, want 8", x.Len())
	}
	// An interrupted sync is superseded: only the last one's marks count.
	x.BeginSync()
	x.Observe(Object{UID: uid(0), Namespace: "ns", Name: "o0", ResourceVersion: "100"})
	x.BeginSync()
	x.Observe(Object{UID: uid(1), Namespace: "ns", Name: "o1", ResourceVersion: "101"})
	if n, _ := x.EndSync(nil); n != 7 || x.Len() != 1 {
		t.Fatalf("after superseded sync: removed %d, left %d; want 7, 1", n, x.Len())
	}
	// Mark wrap-around clears old marks.
	x.mark = ^uint16(0)
	x.BeginSync()
	if n, _ := x.EndSync(nil); n != 1 {
		t.Fatalf("after wrap: removed %d, want 1", n)
	}
	// An error from gone stops the sweep and keeps that object.
	x.Put(Object{UID: uid(1), Namespace: "ns", Name: "o1", ResourceVersion: "1"})
	x.Put(Object{UID: uid(2), Namespace: "ns", Name: "o2", ResourceVersion: "2"})
	x.BeginSync()
	stop := errors.New("stop")
	if n, err := x.EndSync(func(Object) error { return stop }); n != 0 || err != stop || x.Len() != 2 {
		t.Fatalf("EndSync with failing gone: %d, %v, Len %d", n, err, x.Len())
	}
}

func TestObserveDoesNotAllocateWhenUnchanged(t *testing.T) {
	x := New()
	o := Object{UID: uid(7), Namespace: "ns", Name: "n", ResourceVersion: "12345"}
	x.Put(o)
	x.BeginSync()
	if a := testing.AllocsPerRun(100, func() { x.Observe(o) }); a != 0 {
		t.Fatalf("Observe(unchanged) allocates %.0f times", a)
	}
}

// BenchmarkIndexBytesPerObject reports the heap the index holds per object
// (runtime.MemStats, after GC) for realistic names: a Pod-like
// "<namespace>/<deployment>-<hash>-<suffix>" and an 8-digit resourceVersion.
func BenchmarkIndexBytesPerObject(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			var perObj float64
			for i := 0; i < b.N; i++ {
				objs := make([]Object, n)
				for j := range objs {
					objs[j] = Object{UID: uid(j), Namespace: fmt.Sprintf("team-%02d", j%40),
						Name: fmt.Sprintf("web-frontend-%08x-%05x", j*7919, j), ResourceVersion: fmt.Sprint(40_000_000 + j)}
				}
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				x := New()
				for _, o := range objs {
					x.Put(o)
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				perObj = float64(after.HeapAlloc-before.HeapAlloc) / float64(n)
				runtime.KeepAlive(x)
				runtime.KeepAlive(objs)
			}
			b.ReportMetric(perObj, "B/object")
		})
	}
}

// An object that changed only in ignored fields (same non-zero
// fingerprint, new resourceVersion) is Unchanged in a relist, and the index
// keeps the version that was published. A zero fingerprint (unknown, or a
// source without ignoreChanges) never matches.
func TestFingerprints(t *testing.T) {
	x := New()
	x.Put(Object{UID: uid(1), Namespace: "ns", Name: "a", ResourceVersion: "10", Fingerprint: 0xfeed})
	x.Put(Object{UID: uid(2), Namespace: "ns", Name: "b", ResourceVersion: "11"})
	if !x.Same(Object{UID: uid(1), ResourceVersion: "12", Fingerprint: 0xfeed}) {
		t.Error("Same: equal fingerprints not the same")
	}
	if x.Same(Object{UID: uid(1), ResourceVersion: "12", Fingerprint: 0xbeef}) || x.Same(Object{UID: uid(2), ResourceVersion: "12"}) ||
		x.Same(Object{UID: uid(3), ResourceVersion: "12", Fingerprint: 0xfeed}) {
		t.Error("Same: a different, zero or unknown fingerprint is the same")
	}
	x.BeginSync()
	if out := x.Observe(Object{UID: uid(1), Namespace: "ns", Name: "a", ResourceVersion: "15", Fingerprint: 0xfeed}); out != Unchanged {
		t.Errorf("same fingerprint, new rv: %s, want unchanged", out)
	}
	if got, _ := x.Get(uid(1)); got.ResourceVersion != "10" || got.Fingerprint != 0xfeed {
		t.Errorf("after an unchanged observe: %+v, want the published version 10", got)
	}
	if out := x.Observe(Object{UID: uid(2), Namespace: "ns", Name: "b", ResourceVersion: "16"}); out != Modified {
		t.Errorf("no fingerprint, new rv: %s, want modified", out)
	}
	if n, _ := x.EndSync(nil); n != 0 {
		t.Errorf("EndSync removed %d", n)
	}
	x.BeginSync()
	if out := x.Observe(Object{UID: uid(1), Namespace: "ns", Name: "a", ResourceVersion: "17", Fingerprint: 0xbeef}); out != Modified {
		t.Errorf("other fingerprint: %s, want modified", out)
	}
	if got, _ := x.Get(uid(1)); got.ResourceVersion != "17" || got.Fingerprint != 0xbeef {
		t.Errorf("after a modified observe: %+v", got)
	}
}

// A resourceVersion past 48 bits does not fit beside the sync mark: it is
// kept as a string, and marks still work.
func TestHugeResourceVersion(t *testing.T) {
	x := New()
	huge := "281474976710656" // 1<<48
	x.Put(Object{UID: uid(1), Name: "a", ResourceVersion: huge, Fingerprint: 7})
	x.Put(Object{UID: uid(2), Name: "b", ResourceVersion: "281474976710655"})
	for _, tt := range []struct{ uid, rv string }{{uid(1), huge}, {uid(2), "281474976710655"}} {
		if got, _ := x.Get(tt.uid); got.ResourceVersion != tt.rv {
			t.Errorf("%s: rv %q, want %q", tt.uid, got.ResourceVersion, tt.rv)
		}
	}
	x.BeginSync()
	if out := x.Observe(Object{UID: uid(1), Name: "a", ResourceVersion: huge}); out != Unchanged {
		t.Errorf("huge rv observed as %s", out)
	}
	if n, _ := x.EndSync(nil); n != 1 {
		t.Errorf("EndSync removed %d, want 1 (b, not observed)", n)
	}
	if got, ok := x.Get(uid(1)); !ok || got.ResourceVersion != huge || got.Fingerprint != 7 {
		t.Errorf("after the sync: %+v %v", got, ok)
	}
}
