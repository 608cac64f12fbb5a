package index

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/internal/testenv"
)

// A bucket in the hub's JetStream domain, opened from a leaf node with a
// JetStream of its own: the writes PutMsg, DeleteMsg and EpochMsg build go
// through the hub's domain, and land under the keys' own subjects.
func TestWritesGoThroughTheDomain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, leaf := testenv.NATSHubLeafT(t, "hub", "leaf")
	nc, err := nats.Connect(leaf.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.NewWithDomain(nc, "hub")
	if err != nil {
		t.Fatal(err)
	}
	b, err := Open(ctx, js, BucketOptions{Name: "idx", Create: true})
	if err != nil {
		t.Fatal(err)
	}
	o := Object{UID: "u1", Namespace: "ns", Name: "a", ResourceVersion: "7"}
	put := b.PutMsg(Prefix("src", "ns"), o)
	if want := "$JS.hub.API.$KV.idx." + Key(Prefix("src", "ns"), "u1"); put.Subject != want {
		t.Errorf("PutMsg subject %q, want %q", put.Subject, want)
	}
	publish(t, js, put)
	publish(t, js, b.EpochMsg(Prefix("src", "ns"), 3))
	kv, err := js.KeyValue(ctx, "idx")
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, Key(Prefix("src", "ns"), "u1"))
	if err != nil {
		t.Fatal(err)
	}
	var v value
	if err := json.Unmarshal(e.Value(), &v); err != nil || v.ResourceVersion != "7" {
		t.Errorf("entry %s (%v)", e.Value(), err)
	}
	if ep, _, err := b.Epoch(ctx, Prefix("src", "ns")); err != nil || ep != 3 {
		t.Errorf("epoch %d (%v), want 3", ep, err)
	}
	publish(t, js, b.DeleteMsg(Prefix("src", "ns"), "u1"))
	if _, err := kv.Get(ctx, Key(Prefix("src", "ns"), "u1")); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("after DeleteMsg: %v, want key not found", err)
	}
	// Without the domain's prefix the leaf keeps the write: no stream
	// answers it there.
	if _, err := js.Publish(ctx, "$KV.idx."+Key(Prefix("src", "ns"), "u2"), nil); !errors.Is(err, jetstream.ErrNoStreamResponse) {
		t.Errorf("a raw $KV write on the leaf: %v, want no response from stream", err)
	}
}

func TestWriteSubjectPrefix(t *testing.T) {
	for _, c := range []struct{ domain, want string }{
		{"", "$KV.b."},
		{"hub", "$JS.hub.API.$KV.b."},
	} {
		if got := WriteSubjectPrefix(c.domain, "b"); got != c.want {
			t.Errorf("WriteSubjectPrefix(%q, b) = %q, want %q", c.domain, got, c.want)
		}
	}
}
