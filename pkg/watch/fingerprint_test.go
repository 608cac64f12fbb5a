package watch

import (
	"testing"

	"github.com/relayd/relayd/pkg/checkpoint"
	"github.com/relayd/relayd/pkg/event"
	"github.com/relayd/relayd/pkg/index"
	"github.com/relayd/relayd/pkg/source"
)

// A fingerprint key is set (or changed) over a bucket whose fingerprints
// were made without it: the loaded entry's fingerprint is unknown, so the
// watch rewrites the entry without it first, publishes the next change of
// the object even when it is confined to ignoreChanges (once), stores the
// keyed fingerprint with it, and suppresses the ignored-only change after
// that.
func TestFingerprintsOfAnotherKeyAreDropped(t *testing.T) {
	pre := index.Prefix("cms", "ns")
	fw := &fakeWatcher{}
	r := newRig(t, "cms", fw)
	key, err := event.NewFingerprintKey([]byte("a fingerprint key for the test"))
	if err != nil {
		t.Fatal(err)
	}
	r.w.fp = event.NewFingerprinter(key)
	at21 := r.obj(t, "u-e", "e", "21", "x")
	unkeyed := at21.Fingerprint(r.w.o.Shaping)
	r.bucket.objects[pre] = []index.Object{{UID: "u-e", Namespace: "ns", Name: "e", ResourceVersion: "21", Fingerprint: unkeyed}}
	r.bucket.otherKey = []string{"u-e"}
	at22 := r.obj(t, "u-e", "e", "22", "y")
	fw.items = []source.Item{
		{Kind: source.ItemObject, Type: event.Modified, Origin: event.OriginWatch, ResourceVersion: "22", Object: at22},
		{Kind: source.ItemObject, Type: event.Modified, Origin: event.OriginWatch, ResourceVersion: "23", Object: r.obj(t, "u-e", "e", "23", "z")},
	}
	r.pos[checkpoint.Key("cms", "ns")] = checkpoint.Position{ResourceVersion: "21", Epoch: 1,
		Index: &index.Ref{Generation: "g1", Seq: 7}, StreamSeq: 40}
	r.run(t, 1)
	sameLines(t, "entries", describe(t, r.pipe.entries), []string{
		"[put " + pre + ".u-e 21]",
		"modified watch e@22 [put " + pre + ".u-e 22] →22",
		"→23",
	})
	if len(r.bucket.puts) != 2 || r.bucket.puts[0].Fingerprint != 0 {
		t.Fatalf("bucket writes %+v, want the loaded entry without its fingerprint first", r.bucket.puts)
	}
	keyed := r.w.fp.Fingerprint(&at22)
	if got := r.bucket.puts[1].Fingerprint; got != keyed || got == at22.Fingerprint(r.w.o.Shaping) {
		t.Errorf("the published version's fingerprint %#x, want the keyed %#x (not the unkeyed %#x)", got, keyed, at22.Fingerprint(r.w.o.Shaping))
	}
}
