package index

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/testutil"
)

// The index bucket's keys and values are a contract between relayd
// versions: an upgraded relayd reads the bucket an older one wrote, and a
// rolled-back one reads what a newer one wrote (docs/DEPLOY.md, "Upgrade
// and rollback: formats"). testdata/golden holds:
//
//   - keys.txt: the key of an object under a namespaced and a cluster-scoped
//     watch, of a uid that is not a key token (hashed), and the epoch key;
//   - value-v1*.json and epoch.txt: values as this version writes them
//     (format version 1: "v":1 last; the fingerprint when known, and the
//     ID of its key when keyed: value-v1-keyed.json; the managedFields
//     digest when known: value-v1-managers.json, an optional member that
//     relayds before it read through encoding/json and ignore; the
//     fingerprints of the source's changedPaths when known:
//     value-v1-paths.json, "paths", the path set ID then one fingerprint
//     per path, 16 hex digits each, optional the same way);
//   - value-v0-*.json: values as older relayds wrote them, frozen: without
//     "v" and without (before the fingerprint existed) or with a
//     fingerprint. -update never rewrites these.
//
// TestIndexGoldenFiles checks that the current code writes the keys.txt,
// value-v1 and epoch.txt bytes, and, through a real JetStream bucket, that
// Load and Epoch read every file, and that a value of a newer format
// version is reported as corrupt, naming its key and version, instead of
// being read. A fingerprint is read as stored by a bucket whose
// FingerprintKeyID is the one it was written with, and as unknown (0,
// listed in Loaded.OtherKey) by any other. Regenerate the current files after an intended change with
//
//	go test ./pkg/index -run TestIndexGoldenFiles -update
//
// and freeze the replaced forms as value-v<N>-*.json: a bucket keeps them.
var update = flag.Bool("update", false, "rewrite the current-format files of testdata/golden")

const goldenDir = "testdata/golden"

type goldenValue struct {
	file    string
	prefix  string
	obj     Object // what Load reads
	current bool   // written by this version (PutMsg must produce it)
	keyID   string // the fingerprint's key ID (BucketOptions.FingerprintKeyID); "" unkeyed
}

var (
	goldenPods    = Prefix("pods", "shop")
	goldenNodes   = Prefix("nodes", "")
	goldenSecrets = Prefix("secrets", "shop")
	goldenDeploys = Prefix("deployments", "shop")
)

// goldenPathSet is a source's changedPaths ID (event.Shaping.PathSetID).
const goldenPathSet = 0x1a2b3c4d5e6f7081

// goldenKeyID is a fingerprint key ID (event.FingerprintKey.ID).
const goldenKeyID = "dcd201a6c8c10f67"

var goldenValues = []goldenValue{
	{"value-v1.json", goldenPods, Object{UID: "6f2c1d3e-9a4b-4c5d-8e7f-0a1b2c3d4e5f", Namespace: "shop", Name: "web-7d9f8-abcde", ResourceVersion: "48213", Fingerprint: 0x00c0ffee12345678}, true, ""},
	{"value-v1-no-fingerprint.json", goldenPods, Object{UID: "7a3d2e4f-0b5c-4d6e-9f80-1b2c3d4e5f60", Namespace: "shop", Name: "web-7d9f8-fghij", ResourceVersion: "48214"}, true, ""},
	{"value-v1-cluster-scoped.json", goldenNodes, Object{UID: "d41d8cd9-8f00-4b20-9e98-00998ecf8427", Name: "worker-1.eu.example", ResourceVersion: "777", Fingerprint: 0xfedcba9876543210}, true, ""},
	{"value-v1-managers.json", goldenPods, Object{UID: "1e2f3a4b-5c6d-4e7f-8091-a2b3c4d5e6f7", Namespace: "shop", Name: "web-7d9f8-klmno", ResourceVersion: "48215", Fingerprint: 0x00c0ffee12345679, Managers: 0x0001a2b3c4d5e6f7}, true, ""},
	{"value-v1-paths.json", goldenDeploys, Object{UID: "2a3b4c5d-6e7f-4a8b-9c0d-1e2f3a4b5c6d", Namespace: "shop", Name: "web", ResourceVersion: "48216",
		Paths: "\x01\x02\x03\x04\x05\x06\x07\x08\xf0\xe1\xd2\xc3\xb4\xa5\x96\x87", PathSet: goldenPathSet}, true, ""},
	{"value-v1-keyed.json", goldenSecrets, Object{UID: "0d1e2f30-4a5b-4c6d-8e9f-a0b1c2d3e4f5", Namespace: "shop", Name: "db-password", ResourceVersion: "48300", Fingerprint: 0x5e1f0a2b3c4d5e6f}, true, goldenKeyID},
	// Written from the object index's first version until the fingerprint.
	{"value-v0-before-fingerprint.json", goldenPods, Object{UID: "8b4e3f50-1c6d-4e7f-a091-2c3d4e5f6071", Namespace: "shop", Name: "db-0", ResourceVersion: "39999"}, false, ""},
	// Written from the fingerprint until the format version.
	{"value-v0-with-fingerprint.json", goldenPods, Object{UID: "9c5f4061-2d7e-4f80-b1a2-3d4e5f607182", Namespace: "shop", Name: "db-1", ResourceVersion: "40000", Fingerprint: 0x0000000000000abc}, false, ""},
}

const goldenEpoch = 8

// goldenKeys renders keys.txt: "<source>\t<namespace>\t<uid>\t<key>" per
// line, and the epoch key with uid "(epoch)".
func goldenKeys() []byte {
	var b bytes.Buffer
	for _, c := range []struct{ source, ns, uid string }{
		{"pods", "shop", "6f2c1d3e-9a4b-4c5d-8e7f-0a1b2c3d4e5f"},
		{"nodes", "", "d41d8cd9-8f00-4b20-9e98-00998ecf8427"},
		{"pods", "shop", "weird uid/with.dots"},
	} {
		fmt.Fprintf(&b, "%s\t%s\t%s\t%s\n", c.source, c.ns, c.uid, Key(Prefix(c.source, c.ns), c.uid))
	}
	fmt.Fprintf(&b, "%s\t%s\t%s\t%s\n", "pods", "shop", "(epoch)", EpochKey(goldenPods))
	return b.Bytes()
}

// checkGolden compares written with the golden file name, first rewriting
// it with -update when it is one this version writes.
func checkGolden(t *testing.T, name string, written []byte) {
	t.Helper()
	testutil.Golden(t, filepath.Join(goldenDir, name), written, *update, "the index format")
}

func readGolden(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(goldenDir, name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestIndexGoldenFiles(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js := connect(t)
	b, err := Open(ctx, js, BucketOptions{Name: "golden", Create: true})
	if err != nil {
		t.Fatal(err)
	}
	// The same bucket, by a relayd with a fingerprint key.
	bk, err := Open(ctx, js, BucketOptions{Name: "golden", FingerprintKeyID: goldenKeyID})
	if err != nil {
		t.Fatal(err)
	}
	views := map[string]*Bucket{"": b, goldenKeyID: bk}

	// The current code writes the golden bytes.
	checkGolden(t, "keys.txt", goldenKeys())
	for _, g := range goldenValues {
		if !g.current {
			continue
		}
		m := views[g.keyID].PutMsg(g.prefix, g.obj)
		if want := "$KV.golden." + Key(g.prefix, g.obj.UID); m.Subject != want {
			t.Errorf("%s: PutMsg subject %q, want %q", g.file, m.Subject, want)
		}
		checkGolden(t, g.file, m.Data)
	}
	checkGolden(t, "epoch.txt", b.EpochMsg(goldenPods, goldenEpoch).Data)

	// keys.txt is what Key and EpochKey compute (read back, not rendered).
	for _, line := range strings.Split(strings.TrimSuffix(string(readGolden(t, "keys.txt")), "\n"), "\n") {
		f := strings.Split(line, "\t")
		if len(f) != 4 {
			t.Fatalf("keys.txt: line %q has %d fields, want 4", line, len(f))
		}
		got := EpochKey(Prefix(f[0], f[1]))
		if f[2] != "(epoch)" {
			got = Key(Prefix(f[0], f[1]), f[2])
		}
		if got != f[3] {
			t.Errorf("keys.txt: source %q namespace %q uid %q: key %q, file says %q", f[0], f[1], f[2], got, f[3])
		}
	}

	// The current code reads every golden value, current and older, from
	// a real bucket: stored byte for byte at the object's key.
	want := map[string][]goldenValue{}
	for _, g := range goldenValues {
		if _, err := js.Publish(ctx, "$KV.golden."+Key(g.prefix, g.obj.UID), readGolden(t, g.file)); err != nil {
			t.Fatal(err)
		}
		want[g.prefix] = append(want[g.prefix], g)
	}
	if _, err := js.Publish(ctx, "$KV.golden."+EpochKey(goldenPods), readGolden(t, "epoch.txt")); err != nil {
		t.Fatal(err)
	}
	for keyID, view := range views {
		for prefix, gs := range want {
			checkGoldenLoad(t, view, keyID, prefix, gs)
		}
	}
	if ep, _, err := b.Epoch(ctx, goldenPods); ep != goldenEpoch || err != nil {
		t.Errorf("Epoch of epoch.txt: %d, %v; want %d", ep, err, goldenEpoch)
	}

	// A value of a newer format version is not read: Load reports it in a
	// CorruptError naming its key and version, and loads the others.
	newer := Prefix("pods", "newer")
	if _, err := js.Publish(ctx, "$KV.golden."+Key(newer, "1e2d3c4b-5a69-4788-9a0b-1c2d3e4f5a6b"),
		[]byte(`{"uid":"1e2d3c4b-5a69-4788-9a0b-1c2d3e4f5a6b","namespace":"newer","name":"a","resourceVersion":"5","v":2}`)); err != nil {
		t.Fatal(err)
	}
	ok := b.PutMsg(newer, Object{UID: "2f3e4d5c-6b7a-4899-ab0c-2d3e4f5a6b7c", Namespace: "newer", Name: "b", ResourceVersion: "6"})
	if _, err := js.Publish(ctx, ok.Subject, ok.Data); err != nil {
		t.Fatal(err)
	}
	x := New()
	n, err := loadN(b.Load(ctx, newer, x))
	var ce *CorruptError
	if !errors.As(err, &ce) || n != 1 || len(ce.Keys) != 1 || ce.Keys[0] != Key(newer, "1e2d3c4b-5a69-4788-9a0b-1c2d3e4f5a6b") {
		t.Fatalf("Load of a newer-format value: %d, %v; want 1 object and a CorruptError naming the key", n, err)
	}
	for _, w := range []string{"pods.newer.1e2d3c4b-5a69-4788-9a0b-1c2d3e4f5a6b", `index entry format version 2 ("v") is newer than this relayd reads (up to 1)`} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("newer-format error %q does not say %q", err, w)
		}
	}
	if _, found := x.Get("1e2d3c4b-5a69-4788-9a0b-1c2d3e4f5a6b"); found {
		t.Error("a newer-format value was loaded")
	}
}

// checkGoldenLoad loads the golden values gs under prefix through view, a
// bucket with FingerprintKeyID keyID: each reads as written, but a
// fingerprint of another key reads as 0 and its uid is in OtherKey.
func checkGoldenLoad(t *testing.T, view *Bucket, keyID, prefix string, gs []goldenValue) {
	t.Helper()
	x := New()
	for _, g := range gs {
		if g.obj.PathSet != 0 {
			x.WithPaths(len(g.obj.Paths)/8, g.obj.PathSet)
		}
	}
	l, err := view.Load(context.Background(), prefix, x)
	if err != nil || l.Objects != len(gs) {
		t.Fatalf("Load(%s) of the golden values with key ID %q: %+v, %v; want %d objects", prefix, keyID, l, err, len(gs))
	}
	var otherKey []string
	for _, g := range gs {
		w := g.obj
		if w.Fingerprint != 0 && g.keyID != keyID {
			w.Fingerprint = 0
			otherKey = append(otherKey, w.UID)
		}
		if got, ok := x.Get(w.UID); !ok || got != w {
			t.Errorf("Load(%s) with key ID %q: uid %s read as %+v (found %v), want %+v", prefix, keyID, w.UID, got, ok, w)
		}
	}
	// An index of other changedPaths (or another key) loads no path
	// fingerprints: not known.
	if x.PathSet() != 0 {
		y := New().WithPaths(2, x.PathSet()+1)
		if _, err := view.Load(context.Background(), prefix, y); err != nil {
			t.Fatal(err)
		}
		for _, g := range gs {
			w := g.obj
			w.Paths, w.PathSet = "", 0
			if w.Fingerprint != 0 && g.keyID != keyID {
				w.Fingerprint = 0
			}
			if got, ok := y.Get(w.UID); !ok || got != w {
				t.Errorf("Load(%s) under another path set: uid %s read as %+v (found %v), want %+v", prefix, w.UID, got, ok, w)
			}
		}
	}
	slices.Sort(otherKey)
	slices.Sort(l.OtherKey)
	if !slices.Equal(l.OtherKey, otherKey) {
		t.Errorf("Load(%s) with key ID %q: OtherKey %q, want %q", prefix, keyID, l.OtherKey, otherKey)
	}
}
