// Package record produces the histories that internal/chaos/history
// checks, from real servers: a seeded writer, a reference history read
// from etcd itself, a reader of the whole JetStream stream, a checkpoint
// sampler and a final consistent LIST.
package record

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/relayd/relayd/internal/chaos/history"
)

// Kind is one kind of object the writer writes, and the relayd source that
// watches it.
type Kind struct {
	Source     string
	GVR        schema.GroupVersionResource
	APIVersion string
	Kind       string
	// Body fills the object's content for write number i.
	Body func(obj *unstructured.Unstructured, i int)
	// Name, if set, names the kind's object n (default "<source>-<n>").
	Name func(n int) string
	// Namespace, if set, is where the objects of this kind are written
	// (else WriterOptions.Namespace).
	Namespace string
	// Objects, if set, is the number of names of this kind (else
	// WriterOptions.Objects): fewer names, more updates per object.
	Objects int
	// Status, if set, fills the object's status for write number i: the
	// kind has a status subresource, and half of the writer's updates are
	// status-only updates through it (op "status").
	Status func(obj *unstructured.Unstructured, i int)
}

// name is the name of the kind's object n.
func (k Kind) name(n int) string {
	if k.Name != nil {
		return k.Name(n)
	}
	return fmt.Sprintf("%s-%d", k.Source, n)
}

// ns is where the writer writes k's objects.
func (k Kind) ns(def string) string {
	if k.Namespace != "" {
		return k.Namespace
	}
	return def
}

// ConfigMaps is the ConfigMap kind (data.i changes on every update).
func ConfigMaps(source string) Kind {
	return Kind{Source: source, GVR: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, APIVersion: "v1", Kind: "ConfigMap",
		Body: func(o *unstructured.Unstructured, i int) {
			_ = unstructured.SetNestedStringMap(o.Object, map[string]string{"i": strconv.Itoa(i)}, "data")
		}}
}

// Widgets is the test CRD's kind (spec.size changes on every update).
func Widgets(source string, gvr schema.GroupVersionResource) Kind {
	return Kind{Source: source, GVR: gvr, APIVersion: gvr.Group + "/" + gvr.Version, Kind: "Widget",
		Body: func(o *unstructured.Unstructured, i int) {
			_ = unstructured.SetNestedField(o.Object, int64(i), "spec", "size")
			_ = unstructured.SetNestedField(o.Object, []string{"red", "green", "blue"}[i%3], "spec", "color")
		}}
}

// WriterOptions bound the writer.
type WriterOptions struct {
	Seed      uint64
	Namespace string
	Kinds     []Kind
	Objects   int           // names per kind
	MaxWrites int           // stop after this many attempted writes
	Duration  time.Duration // and after this long
	Pace      time.Duration // pause between writes (jittered ±50%)
	// Timeout of one write.
	Timeout time.Duration
	// Done, if set, is asked between writes with the number acknowledged
	// so far; true ends the run early (MaxWrites and Duration still bound
	// it). Unlike cancelling ctx it never cuts a write short.
	Done func(acked int) bool
}

// Writer creates, updates and deletes objects at random (seeded) and
// records every write, acknowledged or not.
type Writer struct {
	o   WriterOptions
	dyn dynamic.Interface

	mu      sync.Mutex
	writes  []history.Write
	ackedBy map[string]int // source -> acknowledged writes
}

// NewWriter returns a writer using dyn.
func NewWriter(dyn dynamic.Interface, o WriterOptions) *Writer {
	if o.Timeout == 0 {
		o.Timeout = 5 * time.Second
	}
	return &Writer{o: o, dyn: dyn}
}

type objState struct {
	obj     *unstructured.Unstructured // nil: does not exist
	unknown bool                       // the last write's outcome is unknown: GET first
}

// Run writes until MaxWrites, Duration, Done or ctx ends. Failed writes are
// recorded and the writer carries on (the apiserver may be down: that is
// the point).
func (w *Writer) Run(ctx context.Context) {
	rng := rand.New(rand.NewPCG(w.o.Seed, w.o.Seed^0x9e3779b97f4a7c15))
	state := map[string]*objState{}
	deadline := time.Now().Add(w.o.Duration)
	// Failed writes do not count towards MaxWrites (the apiserver may be
	// down for a while); Duration bounds those.
	for i, acked := 0, 0; acked < w.o.MaxWrites && time.Now().Before(deadline) && ctx.Err() == nil && (w.o.Done == nil || !w.o.Done(acked)); i++ {
		k := w.o.Kinds[rng.IntN(len(w.o.Kinds))]
		name := k.name(rng.IntN(cmp.Or(k.Objects, w.o.Objects)))
		st := state[k.Source+"/"+name]
		if st == nil {
			st = &objState{}
			state[k.Source+"/"+name] = st
		}
		deleteRoll := rng.IntN(5) == 0
		statusRoll := k.Status != nil && rng.IntN(2) == 0
		pause := w.o.Pace
		if w.one(ctx, k, name, st, i, deleteRoll, statusRoll) {
			acked++
			w.mu.Lock()
			if w.ackedBy == nil {
				w.ackedBy = map[string]int{}
			}
			w.ackedBy[k.Source]++
			w.mu.Unlock()
		} else {
			pause += 100 * time.Millisecond
		}
		if pause > 0 {
			d := pause/2 + time.Duration(rng.Int64N(int64(pause)))
			select {
			case <-ctx.Done():
			case <-time.After(d):
			}
		}
	}
}

// AckedBy is how many writes of each source were acknowledged so far.
func (w *Writer) AckedBy() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.ackedBy)
}

// one makes one write and reports whether it was acknowledged.
func (w *Writer) one(ctx context.Context, k Kind, name string, st *objState, i int, deleteRoll, statusRoll bool) bool {
	ctx, cancel := context.WithTimeout(ctx, w.o.Timeout)
	defer cancel()
	rc := w.dyn.Resource(k.GVR).Namespace(k.ns(w.o.Namespace))
	if st.unknown {
		obj, err := rc.Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			st.obj, st.unknown = nil, false
		case err != nil:
			return false // still unknown; try again later
		default:
			st.obj, st.unknown = obj, false
		}
	}
	rec := history.Write{Source: k.Source, Namespace: k.ns(w.o.Namespace), Name: name, At: time.Now()}
	var out *unstructured.Unstructured
	var err error
	switch {
	case st.obj == nil:
		rec.Op = "create"
		obj := &unstructured.Unstructured{Object: map[string]any{}}
		obj.SetAPIVersion(k.APIVersion)
		obj.SetKind(k.Kind)
		obj.SetName(name)
		obj.SetNamespace(k.ns(w.o.Namespace))
		k.Body(obj, i)
		out, err = rc.Create(ctx, obj, metav1.CreateOptions{})
	case deleteRoll:
		rec.Op, rec.UID = "delete", string(st.obj.GetUID())
		uid := st.obj.GetUID()
		err = rc.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	case statusRoll:
		rec.Op, rec.UID = "status", string(st.obj.GetUID())
		obj := st.obj.DeepCopy()
		k.Status(obj, i)
		out, err = rc.UpdateStatus(ctx, obj, metav1.UpdateOptions{})
	default:
		rec.Op, rec.UID = "update", string(st.obj.GetUID())
		obj := st.obj.DeepCopy()
		k.Body(obj, i)
		out, err = rc.Update(ctx, obj, metav1.UpdateOptions{})
	}
	if err != nil {
		rec.Err = err.Error()
		st.unknown = true
	} else if out != nil {
		rec.UID = string(out.GetUID())
		if rec.RV, err = history.ParseRV(out.GetResourceVersion()); err != nil {
			rec.Err = err.Error()
		}
		st.obj = out
	} else {
		st.obj = nil
	}
	w.mu.Lock()
	w.writes = append(w.writes, rec)
	w.mu.Unlock()
	return rec.Err == ""
}

// Writes returns the writes so far.
func (w *Writer) Writes() []history.Write {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]history.Write(nil), w.writes...)
}
