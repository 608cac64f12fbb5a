package checkpoint

import (
	"fmt"
	"sync"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// shardData reads every checkpoint ConfigMap of a store with shards.
func shardData(t *testing.T, admin *kubernetes.Clientset, ns string, shards int) []map[string]string {
	t.Helper()
	out := make([]map[string]string, shards)
	for i, name := range ShardNames(cmName, shards) {
		cm, err := admin.CoreV1().ConfigMaps(ns).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		out[i] = cm.Data
	}
	return out
}

// nsKey is the key of watch i of a source "pods" with many namespaces.
func nsKey(i int) string { return Key("pods", fmt.Sprintf("team-%04d", i)) }

// A checkpoint with more watches than one ConfigMap is planned to hold is
// spread over several, each key in the one ShardOf names and nowhere else; a
// fresh store reads every key back, and a flush writes only the ConfigMaps
// whose keys changed.
func TestShardedCheckpointSpansConfigMaps(t *testing.T) {
	const watches, perConfigMap = 300, 100
	shards := ShardCount(watches, perConfigMap)
	if shards != 3 {
		t.Fatalf("ShardCount(%d, %d) = %d, want 3", watches, perConfigMap, shards)
	}
	admin := env.Clientset(t, false)
	ns := env.Namespace(t)
	cc := &counting{ConfigMapsGetter: admin.CoreV1()}
	s := newStore(t, cc, ns, func(o *Options) { o.Shards = shards })
	mustLoad(t, s)
	for i := range watches {
		s.Advance(nsKey(i), pos(fmt.Sprint(1000+i), 1), false)
	}
	if err := s.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := cc.ok.Load(); got != int64(shards) {
		t.Errorf("first flush: %d ConfigMap updates, want %d (one per ConfigMap)", got, shards)
	}
	data := shardData(t, admin, ns, shards)
	total := 0
	for i, d := range data {
		total += len(d)
		if len(d) == 0 || len(d) >= watches {
			t.Errorf("ConfigMap %s holds %d keys: the keys are not spread", ShardName(cmName, i), len(d))
		}
		for k := range d {
			if ShardOf(k, shards) != i {
				t.Errorf("key %q is in ConfigMap %s, ShardOf says %d", k, ShardName(cmName, i), ShardOf(k, shards))
			}
		}
	}
	if total != watches {
		t.Errorf("the ConfigMaps hold %d keys, want %d", total, watches)
	}

	fresh := newStore(t, admin.CoreV1(), ns, func(o *Options) { o.Shards = shards })
	mustLoad(t, fresh)
	for i := range watches {
		wantPos(t, fresh, nsKey(i), fmt.Sprint(1000+i), 1)
	}

	// One key changes: one ConfigMap is written, the others are not.
	before := cc.ok.Load()
	s.Advance(nsKey(7), pos("5000", 1), false)
	if err := s.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := cc.ok.Load() - before; got != 1 {
		t.Errorf("a flush of one changed key made %d ConfigMap updates, want 1", got)
	}
	if got := shardData(t, admin, ns, shards)[ShardOf(nsKey(7), shards)][nsKey(7)]; got == "" || mustDecode(t, got).ResourceVersion != "5000" {
		t.Errorf("key %q after the second flush: %q", nsKey(7), got)
	}
}

func mustDecode(t *testing.T, raw string) Position {
	t.Helper()
	p, err := decode(raw)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Replicas share the sharded ConfigMaps and never clobber each other's
// keys, however their flushes interleave.
func TestTwoReplicasKeepEachOthersKeysSharded(t *testing.T) {
	const shards = 3
	admin := env.Clientset(t, false)
	ns := env.Namespace(t)
	a := newStore(t, admin.CoreV1(), ns, func(o *Options) { o.Shards = shards })
	b := newStore(t, admin.CoreV1(), ns, func(o *Options) { o.Shards = shards })
	mustLoad(t, a)
	mustLoad(t, b)
	const rounds, keys = 10, 30
	var wg sync.WaitGroup
	for _, r := range []struct {
		s      *Store
		prefix string
	}{{a, "a"}, {b, "b"}} {
		wg.Go(func() {
			for i := 1; i <= rounds || r.s.dirtyKeys() > 0; i++ {
				if i <= rounds {
					for k := range keys {
						r.s.Advance(fmt.Sprintf("%s%d", r.prefix, k), pos(fmt.Sprint(i), 0), false)
					}
				}
				if err := r.s.Flush(t.Context()); err != nil && (!apierrors.IsConflict(err) || i > 10*rounds) {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	fresh := newStore(t, admin.CoreV1(), ns, func(o *Options) { o.Shards = shards })
	mustLoad(t, fresh)
	for _, p := range []string{"a", "b"} {
		for k := range keys {
			wantPos(t, fresh, fmt.Sprintf("%s%d", p, k), fmt.Sprint(rounds), 0)
		}
	}
}

// dirtyKeys counts the keys not yet written (tests).
func (s *Store) dirtyKeys() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, st := range s.keys {
		if st.dirty() {
			n++
		}
	}
	return n
}

// The older layout (every key in the one ConfigMap, as every relayd before
// sharding wrote it) is read after an upgrade to several ConfigMaps: every
// watch resumes from it; a key's next write puts it into its own
// ConfigMap and removes the older copy, so the first ConfigMap does not
// keep the whole older checkpoint.
func TestOlderSingleConfigMapLayoutIsReadAndMoved(t *testing.T) {
	const watches, shards = 120, 3
	admin := env.Clientset(t, false)
	ns := env.Namespace(t)
	old := newStore(t, admin.CoreV1(), ns, nil) // one ConfigMap: the older layout
	mustLoad(t, old)
	for i := range watches {
		old.Advance(nsKey(i), pos(fmt.Sprint(100+i), 2), false)
	}
	if err := old.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := len(shardData(t, admin, ns, 1)[0]); n != watches {
		t.Fatalf("older layout: %d keys in %s, want %d", n, cmName, watches)
	}

	s := newStore(t, admin.CoreV1(), ns, func(o *Options) { o.Shards = shards })
	mustLoad(t, s)
	for i := range watches {
		wantPos(t, s, nsKey(i), fmt.Sprint(100+i), 2)
	}
	for i := range watches {
		s.Advance(nsKey(i), pos(fmt.Sprint(200+i), 2), false)
	}
	if err := s.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	for i, d := range shardData(t, admin, ns, shards) {
		for k := range d {
			if ShardOf(k, shards) != i {
				t.Errorf("key %q still in ConfigMap %s after its write to %s", k, ShardName(cmName, i), ShardName(cmName, ShardOf(k, shards)))
			}
		}
	}
	fresh := newStore(t, admin.CoreV1(), ns, func(o *Options) { o.Shards = shards })
	mustLoad(t, fresh)
	for i := range watches {
		wantPos(t, fresh, nsKey(i), fmt.Sprint(200+i), 2)
	}
}

func TestShardNamesAndCount(t *testing.T) {
	for _, c := range []struct{ watches, per, want int }{{0, 1000, 1}, {1, 1000, 1}, {1000, 1000, 1}, {1001, 1000, 2}, {10000, 1000, 10}, {10000, DefaultWatchesPerConfigMap, 20}, {300, 100, 3}} {
		if got := ShardCount(c.watches, c.per); got != c.want {
			t.Errorf("ShardCount(%d, %d) = %d, want %d", c.watches, c.per, got, c.want)
		}
	}
	if got := fmt.Sprint(ShardNames("cp", 3)); got != "[cp cp-1 cp-2]" {
		t.Errorf("ShardNames(cp, 3) = %s", got)
	}
	// The hash is part of the format: every replica and every later
	// version must put a key into the same ConfigMap.
	for k, want := range map[string]int{"pods": 5, "pods.team-0000": 3, "deploys.shop": 5, "cms.kube-system": 7} {
		if got := ShardOf(k, 10); got != want {
			t.Errorf("ShardOf(%q, 10) = %d, want %d (FNV-1a 32 modulo the count)", k, got, want)
		}
	}
	if got := fmt.Sprint(ShardNames("cp", 1)); got != "[cp]" {
		t.Errorf("ShardNames(cp, 1) = %s: one shard must be the older layout's one ConfigMap", got)
	}
}
