package watch

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/relayd/relayd/pkg/event"
	"github.com/relayd/relayd/pkg/sink"
	"github.com/relayd/relayd/pkg/source"
)

// handlingPipe records, at each Submit, whether the watch was still
// marked as handling an object.
type handlingPipe struct {
	*fakePipe
	w      *Watch
	mu     sync.Mutex
	inside int // submits made while marked
}

func (p *handlingPipe) Submit(ctx context.Context, e sink.Entry) error {
	p.mu.Lock()
	if p.w.Handling(time.Now(), time.Hour) > 0 {
		p.inside++
	}
	p.mu.Unlock()
	return p.fakePipe.Submit(ctx, e)
}

// handlingHook records how long the handling had lasted when the hook
// ran, plays the heartbeat walk that finds the watch stuck in the object
// named stuck (a bound of 0), and panics at the object named boom.
type handlingHook struct {
	mu   sync.Mutex
	seen map[string]time.Duration
}

func (h *handlingHook) HandlingObject(w *Watch, m *event.Meta) {
	h.mu.Lock()
	h.seen[m.Name] = w.Handling(time.Now(), time.Hour)
	h.mu.Unlock()
	switch m.Name {
	case "stuck":
		w.Handling(time.Now(), 0)
	case "boom":
		panic("boom")
	}
}

// An object's handling is marked from the item's read time until its
// entry goes to the pipeline (never while the pipeline is called); an
// object the heartbeat walk marked stuck is named in the log once its
// handling ends; a panic inside a handling ends the mark; between objects
// nothing is marked.
func TestHandlingIsMarkedPerObject(t *testing.T) {
	fw := &fakeWatcher{}
	r := newRig(t, "cms", fw, &fakeWatcher{})
	readAt := time.Now().Add(time.Hour) // a read time the test can recognise
	fw.items = []source.Item{
		{Kind: source.ItemObject, Type: event.Added, Origin: event.OriginWatch, ResourceVersion: "21", Object: r.obj(t, "u-a", "a", "21", "x"), ReadAt: time.Now()},
		{Kind: source.ItemObject, Type: event.Added, Origin: event.OriginWatch, ResourceVersion: "22", Object: r.obj(t, "u-s", "stuck", "22", "x"), ReadAt: time.Now()},
		{Kind: source.ItemObject, Type: event.Added, Origin: event.OriginWatch, ResourceVersion: "23", Object: r.obj(t, "u-f", "future", "23", "x"), ReadAt: readAt},
		{Kind: source.ItemBookmark, ResourceVersion: "24"},
		{Kind: source.ItemObject, Type: event.Added, Origin: event.OriginWatch, ResourceVersion: "25", Object: r.obj(t, "u-b", "boom", "25", "x"), ReadAt: time.Now()},
	}
	hook := &handlingHook{seen: map[string]time.Duration{}}
	r.w.o.ObjectHook = hook
	pipe := &handlingPipe{fakePipe: r.pipe, w: r.w}
	r.w.pipe = pipe
	core, logs := observer.New(zap.WarnLevel)
	r.w.log = zap.New(core)
	r.run(t, 2) // the panic at boom restarts the watch

	for _, name := range []string{"a", "stuck", "boom"} {
		if d, ok := hook.seen[name]; !ok || d <= 0 {
			t.Errorf("object %s: handling %v inside it (seen %t), want > 0", name, d, ok)
		}
	}
	// Marked from the item's read time: an hour ahead, it had not begun.
	if d := hook.seen["future"]; d != 0 {
		t.Errorf("object read an hour ahead: handling %v, want 0 (from its ReadAt)", d)
	}
	if pipe.inside != 0 {
		t.Errorf("%d of %d submits made while the handling was marked: a wait for the pipeline is not the handling's", pipe.inside, len(pipe.entries))
	}
	if d := r.w.Handling(time.Now(), time.Hour); d != 0 {
		t.Errorf("after the watch stopped (last object panicked): handling %v, want 0", d)
	}
	var named []string
	for _, e := range logs.FilterMessage("an object held its watch longer than the stall bound; the watch goes on").All() {
		named = append(named, e.ContextMap()["object"].(string))
	}
	if len(named) != 1 || named[0] != "ns/stuck" {
		t.Errorf("objects named as having held their watch: %v, want [ns/stuck]", named)
	}
}

// BenchmarkHandlingMark is what marking an object's handling adds to the
// hot path: the begin and end marks of one object (handling.go), and the
// heartbeat walk's read of the mark.
func BenchmarkHandlingMark(b *testing.B) {
	r := newRigWith(b, benchConfig, "plain", &fakeWatcher{})
	w := r.w
	m := &event.Meta{Namespace: "ns", Name: "cm"}
	readAt := time.Now()
	b.Run("begin+end", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			w.beginHandling(readAt)
			w.endHandling(m)
		}
	})
	b.Run("walk-read", func(b *testing.B) {
		w.beginHandling(readAt)
		now := time.Now()
		b.ReportAllocs()
		for b.Loop() {
			if w.Handling(now, time.Hour) < 0 {
				b.Fatal("negative")
			}
		}
		w.endHandling(m)
	})
}
