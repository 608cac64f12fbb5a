package watch

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/relayd/relayd/pkg/event"
	"github.com/relayd/relayd/pkg/sink"
	"github.com/relayd/relayd/pkg/source"
)

// discardPipe is a pipeline that takes every entry and keeps none (the
// benchmark's).
type discardPipe struct{ n int }

func (p *discardPipe) Submit(context.Context, sink.Entry) error { p.n++; return nil }
func (p *discardPipe) Drain(context.Context) error              { return nil }
func (p *discardPipe) Watermark() (string, uint64)              { return "", 0 }
func (p *discardPipe) Close()                                   {}
func (p *discardPipe) Progress() sink.Progress                  { return sink.Progress{} }

const benchConfig = testConfig + `
  - name: plain
    apiVersion: v1
    kind: ConfigMap
`

// BenchmarkHandleObject is the watch's handling of one live change of a
// 1 KiB ConfigMap (self check, object index, encode, submit to a pipeline
// that keeps nothing): the per-object hot path, which marks each object's
// handling for the heartbeats' stall rule (handling.go).
func BenchmarkHandleObject(b *testing.B) {
	r := newRigWith(b, benchConfig, "plain", &fakeWatcher{})
	w := r.w
	pipe := &discardPipe{}
	w.pipe = pipe
	ctx := context.Background()
	if err := w.prepare(ctx); err != nil {
		b.Fatal(err)
	}
	var items [2]source.Item
	for i := range items {
		raw := fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cm","namespace":"ns","uid":"6f1c1a52-8d2b-4f7e-9a51-0d3c9e1f2a3b","resourceVersion":"%d","labels":{"app":"web"}},"data":{"k":%q}}`,
			100+i, strings.Repeat("v", 900))
		o, err := event.ParseObjectShaped([]byte(raw), w.o.Shaping)
		if err != nil {
			b.Fatal(err)
		}
		items[i] = source.Item{Kind: source.ItemObject, Type: event.Modified, Origin: event.OriginWatch, Object: o,
			ResourceVersion: fmt.Sprint(100 + i), ReadAt: time.Now()}
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if err := w.handle(ctx, &items[i&1]); err != nil {
			b.Fatal(err)
		}
		i++
	}
	if pipe.n != i {
		b.Fatalf("%d entries submitted for %d objects", pipe.n, i)
	}
}
