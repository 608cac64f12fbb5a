package main

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/relayd/relayd/internal/testutil"
)

// With a filtered source, the example consumer's view holds exactly the
// objects in the filter's scope: a scope-left delete (relaydscope left)
// removes an object that still exists, a scope-entered add (relaydscope
// entered) adds one that existed; in both CloudEvents modes. Every message
// is then checked against the JSON Schema and decoded by CloudEvents
// sdk-go (conformance_test.go), those with relaydscope included.
func TestViewFollowsAFilter(t *testing.T) {
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
	run := runs.Add(1)
	lanes := []*lane{
		{mode: "structured", cluster: fmt.Sprint("exfs", run), stream: fmt.Sprint("EXFS", run)},
		{mode: "binary", cluster: fmt.Sprint("exfb", run), stream: fmt.Sprint("EXFB", run)},
	}
	for _, l := range lanes {
		l.relayd = env.Relayd(t, relaydConfig(l, ns, cpNS)+
			"    filter: \"has(object.metadata.labels) && 'in' in object.metadata.labels\"\n")
		l.relayd.IndexCheck()
		l.relayd.Start()
		if l.view, err = OpenView(ctx, js, "view-"+l.cluster); err != nil {
			t.Fatal(err)
		}
		startConsumer(t, js, l, nil)
	}
	t.Cleanup(func() {
		for _, l := range lanes {
			stopConsumer(t, l)
		}
	})
	cms := cs.CoreV1().ConfigMaps(ns)
	set := func(name string, in bool) {
		t.Helper()
		cm, err := cms.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cm.Labels = nil
		if in {
			cm.Labels = map[string]string{"in": "1"}
		}
		if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitScope := func(when string) {
		t.Helper()
		for _, l := range lanes {
			testutil.Eventually(t, 60*time.Second, l.mode+" view equals the filter's scope "+when, func() error {
				list, err := cms.List(ctx, metav1.ListOptions{LabelSelector: "in"})
				if err != nil {
					return err
				}
				want := map[string]string{}
				for _, cm := range list.Items {
					want[string(cm.UID)] = cm.Name + "@" + cm.ResourceVersion
				}
				entries, err := l.view.Entries(ctx, "cms")
				if err != nil {
					return err
				}
				got := map[string]string{}
				for _, e := range entries {
					if !e.Deleted {
						got[e.UID] = e.Name + "@" + e.ResourceVersion
					}
				}
				if !maps.Equal(got, want) {
					return fmt.Errorf("view %v\nscope %v", slices.Sorted(maps.Values(got)), slices.Sorted(maps.Values(want)))
				}
				return nil
			})
		}
	}
	for _, l := range lanes {
		testutil.Eventually(t, 60*time.Second, l.mode+": the initial snapshot is consumed", func() error {
			if l.seen(func(a Applied) bool { return a.Gap == "initial" }) == 0 {
				return fmt.Errorf("no sync.completed of reason initial yet")
			}
			return nil
		})
	}
	for _, name := range []string{"a", "b", "c"} {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"v": "0"}}
		if name != "c" {
			cm.Labels = map[string]string{"in": "1"}
		}
		if _, err := cms.Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitScope("after creates")
	set("a", false) // leaves
	set("c", true)  // enters
	waitScope("after a left and c entered")
	for _, l := range lanes {
		left := l.seen(func(a Applied) bool { return a.Event.RelaydScope == "left" && a.Action == Delete })
		entered := l.seen(func(a Applied) bool { return a.Event.RelaydScope == "entered" && a.Action != Delete })
		if left != 1 || entered != 1 {
			t.Errorf("%s: %d scope-left deletes and %d scope-entered adds applied, want 1 each", l.mode, left, entered)
		}
	}
	checkStreams(t, js, lanes, "added", "deleted", "added relaydscope=entered", "deleted relaydscope=left")
}
