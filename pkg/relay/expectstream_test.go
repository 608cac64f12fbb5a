package relay_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/pkg/index"
)

// TestEventsAreStoredOnlyInRelaydsStream: relayd's stream is deleted while
// relayd runs and another stream, of another name, is created over its
// subjects. Every publish names the stream that must store it, so the other
// stream refuses relayd's events instead of storing them: nothing is
// acknowledged, the checkpoint does not pass the event, /readyz names the
// stream, and once the other stream is gone relayd recreates its own
// (nats.stream.create) and the event is stored there.
func TestEventsAreStoredOnlyInRelaydsStream(t *testing.T) {
	alongside(t)
	f := newFixture(t, env, natsSrv, cmSource)
	ctx := t.Context()
	r := f.start(nil, true)
	a := f.createCM("a", nil, nil)
	f.waitStored(30*time.Second, isEvent("added", "a", a.ResourceVersion))
	key := "cms." + f.ns
	f.checkpointWithin(key, a.ResourceVersion, "")

	other := "OTHER" + f.stream
	if err := f.js.DeleteStream(ctx, f.stream); err != nil {
		t.Fatal(err)
	}
	if _, err := f.js.CreateStream(ctx, jetstream.StreamConfig{
		Name: other, Subjects: []string{"k8s." + f.cluster + ".>"}, Duplicates: 10 * time.Minute,
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.js.DeleteStream(ctx, other) })
	b := f.createCM("b", nil, nil)
	f.checkpointHolds(key, b.ResourceVersion)
	s, err := f.js.Stream(ctx, other)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := s.Info(ctx); err != nil || info.State.Msgs != 0 {
		t.Fatalf("stream %s holds %d messages (%v), want none of relayd's", other, info.State.Msgs, err)
	}
	body := r.unreadyBecause(f, "publishes not stored", "events for stream "+f.stream+" are refused", "another stream captures their subjects", "expected stream does not match")
	t.Logf("/readyz: %s", body)
	if v := metricValue(t, r.reg, "relayd_publish_errors_total", map[string]string{"source": "cms", "reason": "wrong-stream"}); v <= 0 {
		t.Errorf(`relayd_publish_errors_total{cms,wrong-stream} = %v, want > 0`, v)
	}

	// Recovery: relayd's stream is recreated by relayd's stream check.
	if err := f.js.DeleteStream(ctx, other); err != nil {
		t.Fatal(err)
	}
	f.waitStored(90*time.Second, isEvent("added", "b", b.ResourceVersion))
	f.eventually(30*time.Second, "the checkpoint past b", func() error {
		if got := f.checkpoints()[key].ResourceVersion; got == "" || rvNum(t, got) < rvNum(t, b.ResourceVersion) {
			return fmt.Errorf("checkpoint %q, want at or past %s", got, b.ResourceVersion)
		}
		return nil
	})
	r.unreadyGone(f)
}

// TestIndexWritesWithoutTheirBucket: the index bucket is deleted while
// relayd runs. The event is stored, but its index write gets no response:
// the checkpoint does not pass it and /readyz names the bucket's stream until
// the bucket is back.
func TestIndexWritesWithoutTheirBucket(t *testing.T) {
	alongside(t)
	f := newFixture(t, env, natsSrv, cmSource)
	ctx := t.Context()
	r := f.start(nil, true)
	a := f.createCM("a", nil, nil)
	f.waitStored(30*time.Second, isEvent("added", "a", a.ResourceVersion))
	key := "cms." + f.ns
	f.checkpointWithin(key, a.ResourceVersion, "")

	bucket := "relayd-index-" + f.cluster
	kv := f.indexBucket()
	st, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config
	if err := f.js.DeleteKeyValue(ctx, bucket); err != nil {
		t.Fatal(err)
	}
	b := f.createCM("b", nil, nil)
	f.waitStored(30*time.Second, isEvent("added", "b", b.ResourceVersion))
	body := r.unreadyBecause(f, "publishes not stored", "index writes for stream "+index.StreamName(bucket)+" get no response")
	t.Logf("/readyz: %s", body)
	f.checkpointHolds(key, b.ResourceVersion)

	// The bucket is back, as relayd created it (its stream's config).
	if _, err := f.js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	f.eventually(60*time.Second, "the checkpoint past b", func() error {
		if got := f.checkpoints()[key].ResourceVersion; got == "" || rvNum(t, got) < rvNum(t, b.ResourceVersion) {
			return fmt.Errorf("checkpoint %q, want at or past %s", got, b.ResourceVersion)
		}
		return nil
	})
	if _, err := f.indexBucket().Get(ctx, index.Key(index.Prefix("cms", f.ns), string(b.UID))); err != nil {
		t.Errorf("b's index entry: %v", err)
	}
	r.unreadyGone(f)
}
