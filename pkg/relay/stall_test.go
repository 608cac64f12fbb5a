package relay_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A full stream (discard: new) surfaces as publish errors and a stall that
// holds the checkpoint; once there is room again, nothing is missing.
func TestFullStreamStallsAndLosesNothing(t *testing.T) {
	f := newFixture(t, env, natsSrv, `
  - name: cms
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]`)
	f.cfgYAML = strings.Replace(f.cfgYAML, "    create: true\n", "    create: false\n", 1)
	ctx := t.Context()
	// Room for the initial sync markers and two objects only.
	sc := jetstream.StreamConfig{
		Name: f.stream, Subjects: []string{"k8s." + f.cluster + ".>"}, Storage: jetstream.FileStorage,
		Duplicates: 10 * time.Minute, MaxMsgs: 4, Discard: jetstream.DiscardNew,
	}
	if _, err := f.js.CreateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	r := f.start(nil, true)
	f.waitStored(20*time.Second, isSync("completed"))
	var cms []*corev1.ConfigMap
	for i := range 5 {
		cms = append(cms, f.createCM(fmt.Sprintf("cm-%d", i), nil, nil))
	}
	f.waitStored(20*time.Second, isEvent("added", "cm-1", cms[1].ResourceVersion))
	f.eventually(20*time.Second, "publish errors for the full stream", func() error {
		if v := metricValue(t, r.reg, "relayd_publish_errors_total", map[string]string{"source": "cms", "reason": "stream-full"}); v < 1 {
			return fmt.Errorf("relayd_publish_errors_total{reason=stream-full} = %v", v)
		}
		return nil
	})
	key := "cms." + f.ns
	// Stalled: the checkpoint reaches the last stored event and never the
	// first refused one while publishes are refused.
	f.checkpointWithin(key, cms[1].ResourceVersion, cms[2].ResourceVersion)
	f.checkpointHolds(key, cms[2].ResourceVersion)
	if n := len(f.stored()); n != 4 {
		t.Fatalf("stream holds %d messages, want 4 (its limit)", n)
	}

	// Room again: everything that waited arrives, in order, and the checkpoint catches up.
	sc.MaxMsgs = 100
	if _, err := f.js.UpdateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	var want []func(msg) bool
	for _, cm := range cms {
		want = append(want, isEvent("added", cm.Name, cm.ResourceVersion))
	}
	got := f.waitStored(60*time.Second, want...)
	var names []string
	for _, m := range got {
		if strings.Contains(m.Env.Type, ".object.") {
			names = append(names, m.Env.K8sName)
		}
	}
	if strings.Join(names, ",") != "cm-0,cm-1,cm-2,cm-3,cm-4" {
		t.Errorf("stored order %v", names)
	}
	f.checkpointWithin(key, cms[4].ResourceVersion, "")
}

// Bookmarks move the checkpoint of a quiet watch: nothing is published for
// it, yet after a graceful stop the stored position is past the list's.
// Periodic bookmarks may take up to about a minute to arrive.
func TestBookmarksAdvanceTheCheckpointOfAQuietWatch(t *testing.T) {
	f := newFixture(t, env, natsSrv, `
  - name: quiet
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]`)
	ctx := t.Context()
	r := f.start(nil, true)
	f.waitStored(20*time.Second, isSync("completed"))
	key := "quiet." + f.ns
	var listRV string
	f.eventually(10*time.Second, "checkpoint after the list", func() error {
		listRV = f.checkpoints()[key].ResourceVersion
		if listRV == "" {
			return fmt.Errorf("no checkpoint yet")
		}
		return nil
	})
	// Activity elsewhere moves the resource's resourceVersion; the watched
	// namespace stays quiet.
	other := f.ns + "-other"
	if _, err := f.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: other}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.cs.CoreV1().ConfigMaps(other).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "elsewhere"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.eventually(150*time.Second, "a bookmark", func() error {
		if v := metricValue(t, r.reg, "relayd_bookmarks_total", map[string]string{"source": "quiet"}); v < 1 {
			return fmt.Errorf("relayd_bookmarks_total = %v", v)
		}
		return nil
	})
	r.stop(t) // the final flush persists bookmark-only progress too
	got := f.checkpoints()[key].ResourceVersion
	if got == listRV {
		t.Fatalf("checkpoint still at the list's resourceVersion %s after a bookmark", got)
	}
	for _, m := range f.stored() {
		if strings.Contains(m.Env.Type, ".object.") {
			t.Errorf("published %s %s for a quiet namespace", m.Env.Type, m.Env.K8sName)
		}
	}
	t.Logf("checkpoint moved %s -> %s on bookmarks alone", listRV, got)
}
