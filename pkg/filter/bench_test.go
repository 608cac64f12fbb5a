package filter

import (
	"encoding/json"
	"syscall"
	"testing"
	"time"

	"github.com/relayd/relayd/pkg/event"
)

// cpuTime is the process's user+system CPU time: the benchmarks report it
// per op (cpu-ns/op) next to the wall time, as this machine is shared and
// wall time under load is not the cost (GC workers' CPU counts too).
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func reportCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64(cpuTime(b)-start)/float64(b.N), "cpu-ns/op")
}

// BenchmarkFilterPod evaluates the three-clause filter (a label, a status
// field, a container image regex) on the 9 KB pod of pkg/event's
// testdata: lazy is Match on the raw bytes, decoded is the baseline that
// decodes the object into map[string]any with encoding/json first (what
// a filter over decoded objects costs per event); parsed is MatchParsed on
// the object pkg/event's parse already validated (what the watch
// calls). docs/PERFORMANCE.md,
// "Filters (CEL)".
func BenchmarkFilterPod(b *testing.B) {
	raw := readPod(b)
	f := mustCompile(b, podFilter)
	b.Run("filter=lazy", func(b *testing.B) {
		b.SetBytes(int64(len(raw)))
		b.ReportAllocs()
		start := cpuTime(b)
		for b.Loop() {
			if ok, err := f.Match(raw); !ok || err != nil {
				b.Fatal(ok, err)
			}
		}
		reportCPU(b, start)
	})
	obj, err := event.ParseObject(raw)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("filter=parsed", func(b *testing.B) {
		b.SetBytes(int64(len(raw)))
		b.ReportAllocs()
		start := cpuTime(b)
		for b.Loop() {
			if ok, err := f.MatchParsed(&obj); !ok || err != nil {
				b.Fatal(ok, err)
			}
		}
		reportCPU(b, start)
	})
	b.Run("filter=decoded", func(b *testing.B) {
		b.SetBytes(int64(len(raw)))
		b.ReportAllocs()
		start := cpuTime(b)
		for b.Loop() {
			var obj map[string]any
			if err := json.Unmarshal(raw, &obj); err != nil {
				b.Fatal(err)
			}
			if ok, err := f.matchValue(obj); !ok || err != nil {
				b.Fatal(ok, err)
			}
		}
		reportCPU(b, start)
	})
}
