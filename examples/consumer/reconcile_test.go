package main

import (
	"fmt"
	"slices"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The reconcile path (docs/CONSUMING.md, "Keeping a view of the cluster",
// rule 5) with the real relayd: relayd relays, the consumer builds its
// view; relayd is stopped, its object index bucket deleted and ConfigMaps
// deleted while it is down; restarted, relayd relists with reason
// index-lost and cannot publish those deletes (it no longer knows the
// objects). The consumer's reconcile against a LIST removes exactly them,
// and its view equals a LIST of the cluster.
func TestReconcileAfterIndexLost(t *testing.T) {
	ctx := t.Context()
	ns, cpNS := env.Namespace(t), env.Namespace(t)
	cs := env.Clientset(t, false)
	nc, err := nats.Connect(natsSrv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	lister, err := NewLister(writeKubeconfig(t))
	if err != nil {
		t.Fatal(err)
	}
	c := &cms{t: t, cs: cs, ns: ns}
	for i := range 5 {
		c.create(fmt.Sprintf("cm-%d", i))
	}
	n := runs.Add(1)
	l := &lane{mode: "structured", cluster: fmt.Sprint("exr", n), stream: fmt.Sprint("EXR", n)}
	l.relayd = env.Relayd(t, relaydConfig(l, ns, cpNS))
	l.relayd.IndexCheck()
	l.relayd.Start()
	if l.view, err = OpenView(ctx, js, "view-"+l.cluster); err != nil {
		t.Fatal(err)
	}
	startConsumer(t, js, l, lister)
	t.Cleanup(func() { stopConsumer(t, l) })
	lanes := []*lane{l}
	c.update("cm-0")
	waitViews(t, cs, ns, lanes, "after the initial snapshot and a change")
	waitCheckpoints(t, cs, cpNS, ns, lanes, c.lastRV)

	l.relayd.Stop()
	if err := js.DeleteKeyValue(ctx, "relayd-index-"+l.cluster); err != nil {
		t.Fatal(err)
	}
	c.delete("cm-1")
	c.delete("cm-2")
	c.update("cm-3")
	c.create("cm-new")
	l.mu.Lock()
	before := len(l.applied)
	l.mu.Unlock()
	l.relayd.Start()
	waitViews(t, cs, ns, lanes, "after relayd lost its index")

	if gaps := l.gaps(); !slices.Equal(gaps, []string{"initial", "index-lost"}) {
		t.Errorf("relists %v, want [initial index-lost]", gaps)
	}
	l.mu.Lock()
	after := slices.Clone(l.applied[before:])
	l.mu.Unlock()
	reconciled, deletes := 0, 0
	for _, a := range after {
		if a.Gap == "index-lost" {
			reconciled += a.Reconciled
		}
		if a.Action == Delete {
			deletes++
		}
	}
	if reconciled != 2 {
		t.Errorf("the reconcile after index-lost removed %d entries, want 2 (cm-1, cm-2)", reconciled)
	}
	if deletes != 0 {
		t.Errorf("%d deletes applied after the restart: relayd knew the objects, the reconcile was not needed", deletes)
	}
}
