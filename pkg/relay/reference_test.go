package relay_test

import (
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// change is one object change: the unit of the exactly-once checks.
type change struct{ uid, rv, typ string }

// reference records the changes of the fixture's ConfigMaps (except the
// checkpoint) seen by an independent, fault-free watch started before any
// write: the history relayd's stream is checked against.
type reference struct {
	stop func()
	done chan struct{}

	mu      sync.Mutex
	history []change
}

func (f *fixture) reference(labelSelector string) *reference {
	f.t.Helper()
	ctx := f.t.Context()
	list, err := f.cs.CoreV1().ConfigMaps(f.ns).List(ctx, metav1.ListOptions{LabelSelector: labelSelector})
	if err != nil {
		f.t.Fatal(err)
	}
	w, err := f.cs.CoreV1().ConfigMaps(f.ns).Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion, LabelSelector: labelSelector})
	if err != nil {
		f.t.Fatal(err)
	}
	r := &reference{stop: w.Stop, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		for ev := range w.ResultChan() {
			cm, ok := ev.Object.(*corev1.ConfigMap)
			if !ok || cm.Name == "cp" {
				continue
			}
			typ := map[watch.EventType]string{watch.Added: "added", watch.Modified: "modified", watch.Deleted: "deleted"}[ev.Type]
			r.mu.Lock()
			r.history = append(r.history, change{string(cm.UID), cm.ResourceVersion, typ})
			r.mu.Unlock()
		}
	}()
	f.t.Cleanup(r.close)
	return r
}

// changes is the history so far.
func (r *reference) changes() []change {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]change(nil), r.history...)
}

// close stops the watch and waits for it.
func (r *reference) close() {
	r.stop()
	<-r.done
}

// storedChanges counts the object events on the stream per change; only
// those of origin watch if watchOnly.
func storedChanges(ms []msg, watchOnly bool) map[change]int {
	out := map[change]int{}
	for _, m := range ms {
		if strings.Contains(m.Env.Type, ".object.") && (!watchOnly || m.Env.RelaydOrigin == "watch") {
			out[change{m.Env.K8sUID, m.Env.K8sResourceVersion, m.Env.Type[strings.LastIndex(m.Env.Type, ".")+1:]}]++
		}
	}
	return out
}

// waitEveryChange waits until every change of the reference is on the stream.
func (f *fixture) waitEveryChange(r *reference, timeout time.Duration) {
	f.t.Helper()
	f.eventually(timeout, "every change on the stream", func() error {
		want := r.changes()
		have := storedChanges(f.stored(), false)
		for _, c := range want {
			if have[c] == 0 {
				return fmt.Errorf("missing %+v (of %d changes)", c, len(want))
			}
		}
		return nil
	})
}
