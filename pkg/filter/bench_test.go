package filter

import (
	"encoding/json"
	"testing"
)

// BenchmarkFilterPod evaluates the three-clause filter (a label, a status
// field, a container image regex) on the 9 KB pod of pkg/event's
// testdata: lazy is Match on the raw bytes, decoded is the baseline that
// decodes the object into map[string]any with encoding/json first (what
// a filter over decoded objects costs per event). docs/PERFORMANCE.md,
// "Filters (CEL)".
func BenchmarkFilterPod(b *testing.B) {
	raw := readPod(b)
	f := mustCompile(b, podFilter)
	b.Run("filter=lazy", func(b *testing.B) {
		b.SetBytes(int64(len(raw)))
		b.ReportAllocs()
		for b.Loop() {
			if ok, err := f.Match(raw); !ok || err != nil {
				b.Fatal(ok, err)
			}
		}
	})
	b.Run("filter=decoded", func(b *testing.B) {
		b.SetBytes(int64(len(raw)))
		b.ReportAllocs()
		for b.Loop() {
			var obj map[string]any
			if err := json.Unmarshal(raw, &obj); err != nil {
				b.Fatal(err)
			}
			if ok, err := f.matchValue(obj); !ok || err != nil {
				b.Fatal(ok, err)
			}
		}
	})
}
