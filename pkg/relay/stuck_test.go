package relay_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relayd/relayd/pkg/event"
	"github.com/relayd/relayd/pkg/watch"
)

// holdObject is a watch.ObjectHook that holds the handling of the object
// named name of source src until release is closed: a watch stuck in one
// object (a filter evaluation, an encode, an index lookup that does not
// end), made deterministic.
type holdObject struct {
	src, name string
	entered   chan struct{} // closed when the handling of the object began
	release   chan struct{}
	once      sync.Once
}

func (h *holdObject) HandlingObject(w *watch.Watch, m *event.Meta) {
	if w.Source().Name != h.src || m.Name != h.name {
		return
	}
	h.once.Do(func() { close(h.entered) })
	<-h.release
}

// A watch stuck in one object's handling for longer than the stall bound
// (5s) is seen: its heartbeats are withheld (counted as stalled in
// relayd_heartbeats_total) while another source's watch keeps publishing
// its heartbeats and relaying its changes; relayd_watch_stalled counts the
// stuck watch; /readyz stays ready (a stuck watch is not a reason to take
// relayd out of service or restart it: docs/OPERATIONS.md,
// "RelaydWatchStalled"). Once the handling ends, everything resumes and
// nothing is lost.
func TestStuckWatch(t *testing.T) {
	alongside(t)
	f := newFixture(t, env, natsSrv, `
  - name: cms
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]
    labelSelector: side=a
  - name: others
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]
    labelSelector: side=b`)
	f.cfgYAML = strings.Replace(f.cfgYAML, "heartbeatInterval: 0\nsources:", "heartbeatInterval: 1s\nsources:", 1)
	hold := &holdObject{src: "cms", name: "poison", entered: make(chan struct{}), release: make(chan struct{})}
	f.objectHook = hold
	r := f.start(nil, true)
	var released sync.Once
	release := func() { released.Do(func() { close(hold.release) }) }
	t.Cleanup(release) // before relayd stops (cleanups run last first)

	a := map[string]string{"side": "a"}
	b := map[string]string{"side": "b"}
	before := f.createCM("before", a, nil)
	f.waitStored(30*time.Second, isEvent("added", "before", before.ResourceVersion))
	f.waitBeatOf("cms", f.ns, func(beat) error { return nil })
	gauge := func(src string) float64 {
		return metricValue(t, r.reg, "relayd_watch_stalled", map[string]string{"source": src})
	}
	stalledCount := func() float64 {
		return metricValue(t, r.reg, "relayd_heartbeats_total", map[string]string{"source": "cms", "result": "stalled"})
	}
	if g := gauge("cms"); g != 0 {
		t.Fatalf("relayd_watch_stalled{cms} = %v before any stall, want 0 (pre-created)", g)
	}
	stalled0 := stalledCount()

	// The watch of cms takes poison and stays in its handling.
	poison := f.createCM("poison", a, nil)
	select {
	case <-hold.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the watch of cms never began handling poison")
	}
	f.eventually(30*time.Second, "relayd_watch_stalled{cms} 1", func() error {
		if g := gauge("cms"); g != 1 {
			return fmt.Errorf("relayd_watch_stalled{cms} = %v", g)
		}
		return nil
	})
	if g := gauge("others"); g != 0 {
		t.Errorf("relayd_watch_stalled{others} = %v, want 0", g)
	}
	if err := r.readyErr(); err != nil {
		t.Errorf("/readyz while a watch is stuck: %v (want ready)", err)
	}

	// Barrier: the walk counted cms stuck at some tick T. Any heartbeat of
	// cms was published at a tick before T, on the same connection as the
	// heartbeats of others: two heartbeats of others stored after this
	// point (one per tick) mean the second was published at T or later,
	// and everything published before it is stored before it.
	seq0 := lastSeq(f.stored())
	beatsOf := func(ms []msg, source string, after uint64) []beat {
		var out []beat
		for _, bt := range heartbeats(t, f, ms) {
			if bt.Env.RelaydSource == source && bt.Seq > after {
				out = append(out, bt)
			}
		}
		return out
	}
	var from uint64
	f.eventually(30*time.Second, "two heartbeats of others after the stall was counted", func() error {
		obs := beatsOf(f.stored(), "others", seq0)
		if len(obs) < 2 {
			return fmt.Errorf("%d", len(obs))
		}
		from = obs[1].Seq
		return nil
	})

	// Meanwhile others relays its changes and keeps its heartbeats; cms
	// publishes none.
	var bs []func(msg) bool
	for i := range 5 {
		cm := f.createCM(fmt.Sprintf("b-%d", i), b, nil)
		bs = append(bs, isEvent("added", cm.Name, cm.ResourceVersion))
	}
	f.waitStored(30*time.Second, bs...)
	var during []msg
	f.eventually(30*time.Second, "3 more heartbeats of others while cms is stuck", func() error {
		during = f.stored()
		if n := len(beatsOf(during, "others", from)); n < 3 {
			return fmt.Errorf("%d", n)
		}
		return nil
	})
	if cb := beatsOf(during, "cms", from); len(cb) > 0 {
		t.Errorf("%d heartbeats of cms while its watch was stuck (first at %d)", len(cb), cb[0].Seq)
	}
	for _, m := range during {
		if m.Env.K8sName == "poison" {
			t.Errorf("poison stored (%d) while its handling was held", m.Seq)
		}
	}
	if got := stalledCount(); got < stalled0+3 {
		t.Errorf("relayd_heartbeats_total{cms,stalled} went from %v to %v over at least 3 withheld heartbeats", stalled0, got)
	}
	if g := gauge("cms"); g != 1 {
		t.Errorf("relayd_watch_stalled{cms} = %v while still stuck, want 1", g)
	}

	// Released: poison goes out, the gauge drops, the heartbeats of cms
	// resume, and cms relays what came after.
	release()
	f.waitStored(30*time.Second, isEvent("added", "poison", poison.ResourceVersion))
	after := f.createCM("after", a, nil)
	f.waitStored(30*time.Second, isEvent("added", "after", after.ResourceVersion))
	f.waitBeat("cms", f.ns, after.ResourceVersion)
	f.eventually(30*time.Second, "relayd_watch_stalled{cms} 0", func() error {
		if g := gauge("cms"); g != 0 {
			return fmt.Errorf("relayd_watch_stalled{cms} = %v", g)
		}
		return nil
	})

	// Nothing lost, nothing twice.
	seen := map[string]int{}
	for _, m := range f.stored() {
		if strings.Contains(m.Env.Type, ".object.") {
			seen[m.Env.RelaydSource+"/"+m.Env.K8sName]++
		}
	}
	want := []string{"cms/before", "cms/poison", "cms/after"}
	for i := range 5 {
		want = append(want, fmt.Sprintf("others/b-%d", i))
	}
	var problems []error
	for _, k := range want {
		if seen[k] != 1 {
			problems = append(problems, fmt.Errorf("%s stored %d times", k, seen[k]))
		}
	}
	if len(seen) != len(want) {
		problems = append(problems, fmt.Errorf("stored objects %v, want %v", seen, want))
	}
	if err := errors.Join(problems...); err != nil {
		t.Error(err)
	}
}
