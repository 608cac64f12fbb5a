package relay_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/pkg/index"
)

// TestLeafNodeToHub: relayd connects to a leaf node that has a JetStream of
// its own (domain "leaf") and keeps its stream and its object index in the
// hub's JetStream (nats.jsDomain: hub), as docs/DEPLOY.md's leaf node
// topology describes. nats-server denies the JetStream API and the
// key-value subjects ($JS.API.>, $KV.>) across the leaf connection, so
// everything relayd sends to JetStream, index writes included, must go
// through the hub's domain ($JS.hub.API.…). It relays into the hub's
// stream, keeps the index in the hub's bucket, and recovers a 410 (etcd
// compacted past its checkpoint, watch cache off) from that index with an
// exact delete for the object deleted during the gap.
func TestLeafNodeToHub(t *testing.T) {
	alongside(t)
	hub, leaf := testenv.NATSHubLeafT(t, "hub", "leaf")
	noCache := testenv.StartT(t, testenv.Options{DisableWatchCache: true})
	f := newFixture(t, noCache, leaf, cmSource)
	ctx := t.Context()
	// The test reads through the hub's domain, from the leaf, as relayd.
	hubJS, err := jetstream.NewWithDomain(f.nc, "hub")
	if err != nil {
		t.Fatal(err)
	}
	leafJS := f.js // the leaf's own JetStream
	f.js = hubJS
	f.setNATS("  jsDomain: hub")
	bucket := "relayd-index-" + f.cluster

	a := f.createCM("a", nil, nil)
	d := f.createCM("d", nil, nil)
	r := f.start(nil, true)
	b := f.createCM("b", nil, nil)
	f.waitStored(60*time.Second, isEvent("added", "a", a.ResourceVersion), isEvent("added", "d", d.ResourceVersion),
		isEvent("added", "b", b.ResourceVersion), isSync("completed"))

	// The stream and the bucket are the hub's, not the leaf's: asked on a
	// connection to the hub itself, and on the leaf's own JetStream.
	hnc, err := nats.Connect(hub.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hnc.Close)
	hubLocal, err := jetstream.New(hnc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hubLocal.Stream(ctx, f.stream); err != nil {
		t.Errorf("stream %s in the hub: %v", f.stream, err)
	}
	kv, err := hubLocal.KeyValue(ctx, bucket)
	if err != nil {
		t.Fatalf("bucket %s in the hub: %v", bucket, err)
	}
	if _, err := leafJS.Stream(ctx, f.stream); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("stream %s in the leaf's own JetStream: %v, want not found", f.stream, err)
	}
	if _, err := leafJS.KeyValue(ctx, bucket); !errors.Is(err, jetstream.ErrBucketNotFound) {
		t.Errorf("bucket %s in the leaf's own JetStream: %v, want not found", bucket, err)
	}
	// The leaf passes nothing of the hub's JetStream but its domain: the
	// key-value subject published on the leaf reaches no stream.
	if _, err := hubJS.Publish(ctx, "$KV."+bucket+".probe", nil); !errors.Is(err, jetstream.ErrNoStreamResponse) {
		t.Errorf("a raw $KV publish on the leaf: %v, want no response from stream (the leaf denies $KV.> to the hub)", err)
	}

	f.indexHolds(kv, map[*corev1.ConfigMap]bool{a: true, b: true, d: true})
	key := "cms." + f.ns
	f.eventually(20*time.Second, "checkpoint with the index generation", func() error {
		if cp := f.checkpoints()[key]; cp.ResourceVersion == "" || cp.Index == nil || cp.Index.Generation == "" {
			return fmt.Errorf("%+v", cp)
		}
		return nil
	})
	r.stop(t)
	all := f.stored()
	before := all[len(all)-1].Seq

	// The gap: d deleted, c created, and etcd compacted past the checkpoint.
	f.deleteCM("d")
	c := f.createCM("c", nil, nil)
	if _, err := noCache.CompactNow(ctx); err != nil {
		t.Fatal(err)
	}
	r = f.start(nil, true)
	ms := f.waitStored(60*time.Second, func(m msg) bool { return m.Seq > before && isSync("completed")(m) })
	want := []string{"added c@" + c.ResourceVersion + " resync", "deleted d@" + d.ResourceVersion + " resync unknown"}
	if got := objectEvents(ms, "cms", before); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("events after the gap:\n%s\nwant:\n%s\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"), dump(ms))
	}
	if st := markers(ms, "cms", "started", before); len(st) == 0 || syncOf(t, st[0]).Reason != "expired" {
		t.Errorf("no sync.started with reason expired after the gap:\n%s", dump(ms))
	}
	if v := metricValue(t, r.reg, "relayd_relists_total", map[string]string{"source": "cms", "reason": "expired"}); v != 1 {
		t.Errorf("relayd_relists_total{cms,expired} = %v, want 1", v)
	}
	f.indexHolds(kv, map[*corev1.ConfigMap]bool{a: true, b: true, c: true, d: false})
}

// indexHolds waits until the bucket holds each object whose value is true
// at its resourceVersion, and none whose value is false.
func (f *fixture) indexHolds(kv jetstream.KeyValue, objs map[*corev1.ConfigMap]bool) {
	f.t.Helper()
	f.eventually(20*time.Second, "the index entries in the hub's bucket", func() error {
		for o, present := range objs {
			k := index.Key(index.Prefix("cms", f.ns), string(o.UID))
			e, err := kv.Get(f.t.Context(), k)
			switch {
			case !present && errors.Is(err, jetstream.ErrKeyNotFound):
				continue
			case !present:
				return fmt.Errorf("%s (%s): %v, want deleted", o.Name, k, err)
			case err != nil:
				return fmt.Errorf("%s (%s): %w", o.Name, k, err)
			}
			var v struct {
				Name            string `json:"name"`
				ResourceVersion string `json:"resourceVersion"`
			}
			if err := json.Unmarshal(e.Value(), &v); err != nil || v.Name != o.Name || v.ResourceVersion != o.ResourceVersion {
				return fmt.Errorf("%s (%s): %s (%v), want resourceVersion %s", o.Name, k, e.Value(), err, o.ResourceVersion)
			}
		}
		return nil
	})
}
