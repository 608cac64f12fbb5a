package index

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/pkg/event"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testenv.LeakOptions()...) }

func connect(t *testing.T) jetstream.JetStream {
	t.Helper()
	n := testenv.NATST(t, testenv.NATSOptions{})
	nc, err := nats.Connect(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

func publish(t *testing.T, js jetstream.JetStream, m *event.Message) uint64 {
	t.Helper()
	msg := &nats.Msg{Subject: m.Subject, Data: m.Data, Header: nats.Header(m.Header)}
	ack, err := js.PublishMsg(context.Background(), msg)
	if err != nil {
		t.Fatalf("publish %s: %v", m.Subject, err)
	}
	return ack.Sequence
}

// The bucket against a real nats-server: created with expiring delete
// markers, written with the messages the sink publishes, read back per watch
// prefix, and a new generation after it is deleted and recreated.
func TestBucketRoundTrip(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js := connect(t)

	_, err := Open(ctx, js, BucketOptions{Name: "relayd-index-test"})
	if !errors.Is(err, ErrBucketNotFound) || !strings.Contains(err.Error(), `"relayd-index-test"`) || !strings.Contains(err.Error(), "nats.index.create") {
		t.Fatalf("missing bucket without create: %v", err)
	}
	b, err := Open(ctx, js, BucketOptions{Name: "relayd-index-test", Create: true, MarkerTTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if !b.ExpiringMarkers() {
		t.Error("a bucket relayd creates should have expiring delete markers")
	}
	g0, err := b.Generation(ctx)
	if err != nil {
		t.Fatal(err)
	}

	pods, other := Prefix("pods", "default"), Prefix("pods", "")
	objs := []Object{
		{UID: uid(1), Namespace: "default", Name: "a", ResourceVersion: "10"},
		{UID: uid(2), Namespace: "default", Name: "b", ResourceVersion: "11"},
		{UID: "weird uid/with.dots", Namespace: "default", Name: "c", ResourceVersion: "x-12"},
	}
	for _, o := range objs {
		publish(t, js, b.PutMsg(pods, o))
	}
	publish(t, js, b.PutMsg(other, Object{UID: uid(3), Name: "node-1", ResourceVersion: "13"}))
	publish(t, js, b.PutMsg(pods, Object{UID: uid(1), Namespace: "default", Name: "a", ResourceVersion: "14", Fingerprint: 0x00c0ffee12345678}))
	publish(t, js, b.DeleteMsg(pods, uid(2)))

	x := New()
	n, err := loadN(b.Load(ctx, pods, x))
	if err != nil || n != 2 || x.Len() != 2 {
		t.Fatalf("Load = %d, %v (Len %d); want 2 objects", n, err, x.Len())
	}
	if o, _ := x.Get(uid(1)); o.ResourceVersion != "14" || o.Name != "a" || o.Namespace != "default" || o.Fingerprint != 0x00c0ffee12345678 {
		t.Errorf("uid 1 loaded as %+v", o)
	}
	if o, ok := x.Get("weird uid/with.dots"); !ok || o.ResourceVersion != "x-12" {
		t.Errorf("hashed-key object loaded as %+v %v", o, ok)
	}
	if _, ok := x.Get(uid(2)); ok {
		t.Error("deleted object loaded")
	}
	y := New()
	if n, err := loadN(b.Load(ctx, Prefix("other", "default"), y)); n != 0 || err != nil {
		t.Errorf("empty prefix: %d, %v", n, err)
	}

	if ep, ok, err := b.Epoch(ctx, pods); ep != 0 || ok || err != nil {
		t.Errorf("epoch before any: %d, recorded %v, %v", ep, ok, err)
	}
	publish(t, js, b.EpochMsg(pods, 0))
	if ep, ok, err := b.Epoch(ctx, pods); ep != 0 || !ok || err != nil {
		t.Errorf("epoch 0 recorded: %d, recorded %v, %v; want 0, recorded", ep, ok, err)
	}
	publish(t, js, b.EpochMsg(pods, 7))
	last := publish(t, js, b.EpochMsg(pods, 8))
	if ep, ok, err := b.Epoch(ctx, pods); ep != 8 || !ok || err != nil {
		t.Errorf("epoch: %d, recorded %v, %v; want 8", ep, ok, err)
	}
	if n, err := loadN(b.Load(ctx, pods, New())); n != 2 || err != nil {
		t.Errorf("the epoch key is not an object: loaded %d, %v", n, err)
	}

	g1, _ := b.Generation(ctx)
	if g1.ID != g0.ID || g1.LastSeq != last {
		t.Errorf("generation %+v, want ID %s and LastSeq %d", g1, g0.ID, last)
	}
	// The purge marker expires (the key disappears from the stream).
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := js.Stream(ctx, "KV_relayd-index-test")
		if err != nil {
			t.Fatal(err)
		}
		si, _ := info.Info(ctx, jetstream.WithSubjectFilter("$KV.relayd-index-test.>"))
		if _, ok := si.State.Subjects["$KV.relayd-index-test."+Key(pods, uid(2))]; !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("delete marker did not expire within 10s (marker TTL 1s)")
		}
		time.Sleep(200 * time.Millisecond)
	}

	// A corrupt value names its key.
	if _, err := js.Publish(ctx, "$KV.relayd-index-test."+Key(pods, uid(9)), []byte("{not json")); err != nil {
		t.Fatal(err)
	}
	var ce *CorruptError
	if n, err := loadN(b.Load(ctx, pods, New())); !errors.As(err, &ce) || !strings.Contains(err.Error(), uid(9)) || n != 2 ||
		len(ce.Keys) != 1 || ce.Keys[0] != Key(pods, uid(9)) {
		t.Errorf("corrupt entry: loaded %d, %v", n, err)
	}
	publish(t, js, b.DeleteKeyMsg(ce.Keys[0]))
	if n, err := loadN(b.Load(ctx, pods, New())); n != 2 || err != nil {
		t.Errorf("after deleting the corrupt key: %d, %v", n, err)
	}

	// Deleted and recreated: another generation, empty.
	if err := js.DeleteKeyValue(ctx, "relayd-index-test"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond) // creation times have nanosecond resolution
	b2, err := Open(ctx, js, BucketOptions{Name: "relayd-index-test", Create: true})
	if err != nil {
		t.Fatal(err)
	}
	g2, _ := b2.Generation(ctx)
	if g2.ID == g0.ID || g2.LastSeq != 0 {
		t.Errorf("recreated bucket generation %+v, old %+v", g2, g0)
	}
}

// A bucket created by someone else without per-message TTLs gets plain
// delete markers (a TTL header would be refused).
func TestBucketWithoutTTL(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js := connect(t)
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "plain"}); err != nil {
		t.Fatal(err)
	}
	b, err := Open(ctx, js, BucketOptions{Name: "plain"})
	if err != nil {
		t.Fatal(err)
	}
	if b.ExpiringMarkers() {
		t.Fatal("plain bucket reported expiring markers")
	}
	p := Prefix("cms", "ns")
	publish(t, js, b.PutMsg(p, Object{UID: uid(1), Namespace: "ns", Name: "a", ResourceVersion: "1"}))
	publish(t, js, b.DeleteMsg(p, uid(1)))
	if n, err := loadN(b.Load(ctx, p, New())); n != 0 || err != nil {
		t.Fatalf("after delete: %d, %v", n, err)
	}
}

// loadN is Load's object count and error.
func loadN(l Loaded, err error) (int, error) { return l.Objects, err }
