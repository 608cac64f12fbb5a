package index

import (
	"context"
	"errors"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/internal/testenv"
)

// rawBucket is a bucket on a real server, and its KeyValue to write values
// of any form into.
func rawBucket(t *testing.T, keyID string) (*Bucket, jetstream.KeyValue) {
	t.Helper()
	ctx := context.Background()
	nc, err := nats.Connect(testenv.NATST(t, testenv.NATSOptions{}).URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Open(ctx, js, BucketOptions{Name: "layouts", Create: true, FingerprintKeyID: keyID})
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, "layouts")
	if err != nil {
		t.Fatal(err)
	}
	return b, kv
}

// TestLoadReadsEveryLayout: Load reads a value the way encoding/json does
// whether it is in the layout relayd writes (read without encoding/json)
// or in any other JSON form of the same members (spaces, another order,
// escapes, another case of a member's name), and refuses the same ones.
func TestLoadReadsEveryLayout(t *testing.T) {
	const keyID = "dcd201a6c8c10f67"
	b, kv := rawBucket(t, keyID)
	p := Prefix("cms", "")
	for _, w := range []struct{ uid, value string }{
		{uid(1), `{"uid":"` + uid(1) + `","namespace":"shop","name":"web-0","resourceVersion":"10","fingerprint":"00000000000000ff","fingerprintKeyID":"` + keyID + `","v":1}`},
		{uid(2), `{"uid":"` + uid(2) + `","name":"node-1","resourceVersion":"11"}`},
		{"not-a-uuid", `{"uid":"not-a-uuid","namespace":"ns","name":"b","resourceVersion":"opaque-rv","v":1}`},
		{uid(3), `{ "name" : "web-3", "resourceVersion":"12", "uid":"` + uid(3) + `", "namespace":"shop", "v":1 }`},
		{uid(4), `{"uid":"` + uid(4) + `","namespace":"shop","name":"a\u002db","resourceVersion":"13","v":1}`},
		{uid(5), `{"UID":"` + uid(5) + `","Namespace":"shop","name":"web-5","resourceVersion":"14","extra":[1,2]}`},
		{uid(6), `{"uid":"` + uid(6) + `","namespace":"shop","name":"web-6","resourceVersion":"15","fingerprint":"ABCDEF0123456789","fingerprintKeyID":"0000000000000000","v":1}`},
		{uid(7), `{"uid":"` + uid(7) + `","namespace":"shop","name":"web-7","resourceVersion":"16","v":2}`},
		{uid(8), `{"uid":"` + uid(8) + `","namespace":"shop","name":"web-8","resourceVersion":"17","fingerprint":"xyz","v":1}`},
		{uid(9), `{"uid":"` + uid(9) + `","namespace":"shop","name":"","resourceVersion":"18","v":1}`},
	} {
		if _, err := kv.Put(context.Background(), Key(p, w.uid), []byte(w.value)); err != nil {
			t.Fatal(err)
		}
	}
	x := New()
	l, err := b.Load(context.Background(), p, x)
	var corrupt *CorruptError
	if !errors.As(err, &corrupt) || len(corrupt.Keys) != 3 ||
		corrupt.Keys[0] != Key(p, uid(7)) || corrupt.Keys[1] != Key(p, uid(8)) || corrupt.Keys[2] != Key(p, uid(9)) {
		t.Fatalf("Load: %v; want the entries of uids 7 (a newer version), 8 (a bad fingerprint) and 9 (no name) corrupt", err)
	}
	if l.Objects != 7 || x.Len() != 7 || len(l.OtherKey) != 1 || l.OtherKey[0] != uid(6) {
		t.Errorf("Load: %+v, %d indexed; want 7 objects, uid 6 fingerprinted under another key", l, x.Len())
	}
	for _, want := range []Object{
		{UID: uid(1), Namespace: "shop", Name: "web-0", ResourceVersion: "10", Fingerprint: 0xff},
		{UID: uid(2), Name: "node-1", ResourceVersion: "11"},
		{UID: "not-a-uuid", Namespace: "ns", Name: "b", ResourceVersion: "opaque-rv"},
		{UID: uid(3), Namespace: "shop", Name: "web-3", ResourceVersion: "12"},
		{UID: uid(4), Namespace: "shop", Name: "a-b", ResourceVersion: "13"},
		{UID: uid(5), Namespace: "shop", Name: "web-5", ResourceVersion: "14"},
		{UID: uid(6), Namespace: "shop", Name: "web-6", ResourceVersion: "15"},
	} {
		if got, ok := x.Get(want.UID); !ok || got != want {
			t.Errorf("uid %s loaded as %+v (found %v), want %+v", want.UID, got, ok, want)
		}
	}
}

// TestLoadKeepsNoEntryBytes: what Load indexes (names, a uid that is not a
// UUID, a resourceVersion that is not a number) is copied out of the
// entries it read, and loading an entry in relayd's layout allocates only
// the object's name (plus the index's own growth), not a string per member.
func TestLoadKeepsNoEntryBytes(t *testing.T) {
	b, kv := rawBucket(t, "")
	p := Prefix("cms", "")
	objs := []Object{
		{UID: "not-a-uuid", Namespace: "ns", Name: "b", ResourceVersion: "opaque-rv"},
		{UID: uid(1), Name: "node-1", ResourceVersion: "11"},
		{UID: uid(2), Namespace: "shop", Name: "web-2", ResourceVersion: "12", Fingerprint: 7},
	}
	var entries []jetstream.KeyValueEntry
	for _, o := range objs {
		m := b.PutMsg(p, o)
		if _, err := kv.Put(context.Background(), Key(p, o.UID), m.Data); err != nil {
			t.Fatal(err)
		}
		e, err := kv.Get(context.Background(), Key(p, o.UID))
		if err != nil {
			t.Fatal(err)
		}
		entries = append(entries, e)
	}
	x := New()
	var l Loaded
	var corrupt *CorruptError
	for _, e := range entries {
		b.loadEntry(e, x, &l, &corrupt)
	}
	// Allocations: one name per object (the index's own growth aside: the
	// object is removed again after each run).
	e, u := entries[2], objs[2].UID
	allocs := testing.AllocsPerRun(100, func() {
		b.loadEntry(e, x, &l, &corrupt)
		x.Delete(u)
	})
	if allocs != 1 {
		t.Errorf("loading an entry in relayd's layout makes %.0f allocations, want 1 (its name)", allocs)
	}
	b.loadEntry(e, x, &l, &corrupt)
	for _, e := range entries {
		v := e.Value()
		for i := range v {
			v[i] = 'x'
		}
	}
	for _, want := range objs {
		if got, ok := x.Get(want.UID); !ok || got != want {
			t.Errorf("uid %s reads %+v (found %v) once its entry's bytes are overwritten, want %+v", want.UID, got, ok, want)
		}
	}
}
