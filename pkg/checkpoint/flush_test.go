package checkpoint

import (
	"maps"
	"reflect"
	"testing"
	"time"
)

// merge sets this store's keys, keeps every other key, and names the keys
// another writer changed since this store read them; no servers needed.
func TestMerge(t *testing.T) {
	todo := func(kv ...string) []pending {
		var out []pending
		for i := 0; i < len(kv); i += 2 {
			out = append(out, pending{key: kv[i], raw: kv[i+1]})
		}
		return out
	}
	for _, tt := range []struct {
		name        string
		data        map[string]string // in the ConfigMap now
		todo        []pending
		prev        map[string]string // last read or written by this store
		want        map[string]string
		overwritten []overwrite
	}{
		{name: "nil data (recreated or empty ConfigMap)",
			todo: todo("pods", "p2"),
			want: map[string]string{"pods": "p2"}},
		{name: "other replicas' keys kept",
			data: map[string]string{"pods": "p1", "nodes": "n7", "cms.team-a": "c3"},
			todo: todo("pods", "p2"),
			prev: map[string]string{"pods": "p1"},
			want: map[string]string{"pods": "p2", "nodes": "n7", "cms.team-a": "c3"}},
		{name: "new key",
			data: map[string]string{"nodes": "n7"},
			todo: todo("pods", "p1"),
			prev: map[string]string{"pods": ""},
			want: map[string]string{"pods": "p1", "nodes": "n7"}},
		{name: "changed by another writer: overwritten and named",
			data:        map[string]string{"pods": "theirs", "nodes": "n7"},
			todo:        todo("nodes", "n8", "pods", "mine"),
			prev:        map[string]string{"pods": "p1", "nodes": "n7"},
			want:        map[string]string{"pods": "mine", "nodes": "n8"},
			overwritten: []overwrite{{key: "pods", found: "theirs", writing: "mine"}}},
		{name: "written by another writer where this store read none",
			data:        map[string]string{"pods": "theirs"},
			todo:        todo("pods", "mine"),
			prev:        map[string]string{"pods": ""},
			want:        map[string]string{"pods": "mine"},
			overwritten: []overwrite{{key: "pods", found: "theirs", writing: "mine"}}},
		{name: "deleted by another writer: written, not named",
			data: map[string]string{"nodes": "n7"},
			todo: todo("pods", "p2"),
			prev: map[string]string{"pods": "p1"},
			want: map[string]string{"pods": "p2", "nodes": "n7"}},
		{name: "several changed: named in todo's order",
			data:        map[string]string{"a": "x", "b": "y"},
			todo:        todo("a", "a2", "b", "b2"),
			prev:        map[string]string{"a": "a1", "b": "b1"},
			want:        map[string]string{"a": "a2", "b": "b2"},
			overwritten: []overwrite{{key: "a", found: "x", writing: "a2"}, {key: "b", found: "y", writing: "b2"}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before := maps.Clone(tt.data)
			got, overwritten := merge(tt.data, tt.todo, tt.prev)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("data %v, want %v", got, tt.want)
			}
			if !reflect.DeepEqual(overwritten, tt.overwritten) {
				t.Errorf("overwritten %+v, want %+v", overwritten, tt.overwritten)
			}
			if !maps.Equal(tt.data, before) {
				t.Errorf("merge changed its input: %v, was %v", tt.data, before)
			}
		})
	}
}

// due decides which keys a flush writes: dirty ones, bookmark-only
// progress only once BookmarkPersistInterval has passed or when forced.
func TestDue(t *testing.T) {
	now := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	const interval = 2 * time.Minute
	for _, tt := range []struct {
		name  string
		k     keyState
		force bool
		want  bool
	}{
		{name: "clean", k: keyState{gen: 3, normalGen: 3, persistedGen: 3}},
		{name: "clean, forced", k: keyState{gen: 3, normalGen: 3, persistedGen: 3}, force: true},
		{name: "never advanced", k: keyState{}, force: true},
		{name: "event progress", k: keyState{gen: 4, normalGen: 4, persistedGen: 3, storedAt: now}, want: true},
		{name: "event then bookmark progress", k: keyState{gen: 5, normalGen: 4, persistedGen: 3, storedAt: now}, want: true},
		{name: "bookmark-only, stored recently", k: keyState{gen: 4, normalGen: 3, persistedGen: 3, storedAt: now.Add(-interval + time.Second)}},
		{name: "bookmark-only, stored recently, forced", k: keyState{gen: 4, normalGen: 3, persistedGen: 3, storedAt: now.Add(-interval + time.Second)}, force: true, want: true},
		{name: "bookmark-only, interval passed", k: keyState{gen: 4, normalGen: 3, persistedGen: 3, storedAt: now.Add(-interval)}, want: true},
		{name: "bookmark-only, never stored", k: keyState{gen: 1}, want: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.k.due(tt.force, now, interval); got != tt.want {
				t.Errorf("due(force=%v) = %v, want %v", tt.force, got, tt.want)
			}
		})
	}
}
