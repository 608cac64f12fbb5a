package index

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// Path fingerprints: kept per object, 8 bytes per path after the name and
// nothing else; "" (not known) until an object is stored with them, and
// again after a version stored without them; an index without paths keeps
// none whatever it is given.
func TestPaths(t *testing.T) {
	fp := func(b byte) string { return strings.Repeat(string(rune(b)), 8) + strings.Repeat("\x7f", 8) }
	x := New().WithPaths(2, 0xabc)
	x.Put(Object{UID: uid(1), Namespace: "ns", Name: "a", ResourceVersion: "10"})
	if p := x.Paths(uid(1)); p != "" {
		t.Errorf("stored without paths: Paths %q, want not known", p)
	}
	x.Put(Object{UID: uid(1), Namespace: "ns", Name: "a", ResourceVersion: "11", Paths: fp('a'), PathSet: 0xabc})
	if p := x.Paths(uid(1)); p != fp('a') {
		t.Errorf("Paths %q, want %q", p, fp('a'))
	}
	if o, _ := x.Get(uid(1)); o.Namespace != "ns" || o.Name != "a" || o.Paths != fp('a') || o.PathSet != 0xabc {
		t.Errorf("Get: %+v", o)
	}
	x.BeginSync()
	if out := x.Observe(Object{UID: uid(1), Namespace: "ns", Name: "a", ResourceVersion: "12", Paths: fp('b'), PathSet: 0xabc}); out != Modified || x.Paths(uid(1)) != fp('b') {
		t.Errorf("Observe: %s, Paths %q; want modified, %q", out, x.Paths(uid(1)), fp('b'))
	}
	x.Put(Object{UID: uid(1), Namespace: "ns", Name: "a", ResourceVersion: "13"}) // caught up from the stream: not known
	if p := x.Paths(uid(1)); p != "" {
		t.Errorf("a newer version without paths: Paths %q, want not known", p)
	}
	x.Put(Object{UID: uid(2), Name: "cluster-scoped", ResourceVersion: "1", Paths: fp('/'), PathSet: 0xabc})
	if o, _ := x.Get(uid(2)); o.Namespace != "" || o.Name != "cluster-scoped" || o.Paths != fp('/') {
		t.Errorf("cluster-scoped Get: %+v", o)
	}
	// 8 bytes per path and object, in the name's string.
	for k, e := range x.m {
		name, _ := x.split(e)
		if len(e.name) != len(name)+16 {
			t.Errorf("key %x: name string of %d bytes for %q and 2 paths, want %d", k, len(e.name), name, len(name)+16)
		}
	}
	y := New()
	y.Put(Object{UID: uid(1), Namespace: "ns", Name: "a", ResourceVersion: "10", Paths: fp('a'), PathSet: 0xabc})
	if o, _ := y.Get(uid(1)); o.Paths != "" || y.m[o.key()].name != "ns/a" {
		t.Errorf("an index without paths keeps some: %+v", o)
	}
}

func (o Object) key() key { k, _ := keyOf(o.UID); return k }

// The heap cost of the path fingerprints (docs/PERFORMANCE.md): B/object
// with 0, 1, 3 and 8 paths; the growth over paths=0 is the cost.
func BenchmarkIndexChangedPathsBytes(b *testing.B) {
	const n = 100_000
	for _, np := range []int{0, 1, 3, 8} {
		b.Run(fmt.Sprintf("paths=%d", np), func(b *testing.B) {
			var perObj float64
			for i := 0; i < b.N; i++ {
				objs := make([]Object, n)
				for j := range objs {
					objs[j] = Object{UID: uid(j), Namespace: fmt.Sprintf("team-%02d", j%40),
						Name: fmt.Sprintf("web-frontend-%08x-%05x", j*7919, j), ResourceVersion: fmt.Sprint(40_000_000 + j)}
					if np > 0 {
						objs[j].Paths, objs[j].PathSet = strings.Repeat(fmt.Sprintf("%08x", j), np), 1
					}
				}
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				x := New().WithPaths(np, 1)
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
