package checkpoint

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/relayd/relayd/internal/testutil"
	"github.com/relayd/relayd/pkg/index"
)

// The checkpoint ConfigMap's keys and values are a contract between relayd
// versions: an upgraded relayd resumes from what an older one wrote, and a
// rolled-back one from what a newer one wrote (docs/DEPLOY.md, "Upgrade and
// rollback: formats"). testdata/golden holds:
//
//   - keys.txt: the data key of an all-namespaces and of a per-namespace
//     watch;
//   - position-v1*.json: values as this version writes them (format version
//     1: "v":1 last);
//   - position-v0-*.json: values as older relayds wrote them, frozen:
//     without "v", from the first layout (resourceVersion, epoch, updated)
//     through the index reference to the stream sequence. -update never
//     rewrites these.
//
// TestCheckpointGoldenFiles checks that the current code writes the
// keys.txt and position-v1 bytes and reads every file;
// TestCheckpointGoldenThroughConfigMap does both through a real ConfigMap
// and checks that a value of a newer format version stops Load with an
// error naming the ConfigMap, the key and the version. Regenerate the
// current files after an intended change with
//
//	go test ./pkg/checkpoint -run TestCheckpointGoldenFiles -update
//
// and freeze the replaced forms as position-v<N>-*.json: ConfigMaps keep
// them.
var update = flag.Bool("update", false, "rewrite the current-format files of testdata/golden")

const goldenDir = "testdata/golden"

type goldenPosition struct {
	file    string
	key     string
	pos     Position // what decode reads
	current bool     // written by this version (encode must produce it)
}

var goldenUpdated = time.Date(2026, 11, 23, 10, 15, 2, 123456789, time.UTC)

var goldenPositions = []goldenPosition{
	{"position-v1.json", "deploys", Position{ResourceVersion: "48213", Epoch: 2, Updated: goldenUpdated,
		Index: &index.Ref{Generation: "2026-11-23T09:00:00.5Z", Seq: 812}, StreamSeq: 4410}, true},
	// A filtered source's: the filter's hash (optional).
	{"position-v1-filter.json", "pods.edge", Position{ResourceVersion: "48214", Epoch: 3, Updated: goldenUpdated,
		Index: &index.Ref{Generation: "2026-11-23T09:00:00.5Z", Seq: 813}, StreamSeq: 4411, FilterHash: "5d1c0b2a9e8f7364"}, true},
	// No index reference and no stream sequence (both optional).
	{"position-v1-minimal.json", "cms.shop", Position{ResourceVersion: "7", Updated: goldenUpdated}, true},
	// The first layout.
	{"position-v0-first.json", "pods.shop", Position{ResourceVersion: "39999", Epoch: 1, Updated: time.Date(2026, 11, 20, 8, 0, 0, 0, time.UTC)}, false},
	// With the object index's reference.
	{"position-v0-index.json", "pods.web", Position{ResourceVersion: "40000", Epoch: 3, Updated: time.Date(2026, 11, 21, 8, 0, 0, 5e8, time.UTC),
		Index: &index.Ref{Generation: "2026-11-21T07:59:59.123456Z", Seq: 90}}, false},
	// With the stream sequence the index catches up from.
	{"position-v0-stream-seq.json", "nodes", Position{ResourceVersion: "40001", Epoch: 4, Updated: time.Date(2026, 11, 22, 8, 0, 0, 0, time.UTC),
		Index: &index.Ref{Generation: "2026-11-21T07:59:59.123456Z", Seq: 95}, StreamSeq: 1234}, false},
}

// newerValue is a value of a format version this relayd does not know.
const newerValue = `{"resourceVersion":"50000","epoch":5,"updated":"2026-11-24T08:00:00Z","v":2}`

func goldenKeys() []byte {
	var b bytes.Buffer
	for _, c := range []struct{ source, ns string }{{"deploys", ""}, {"cms", "shop"}} {
		fmt.Fprintf(&b, "%s\t%s\t%s\n", c.source, c.ns, Key(c.source, c.ns))
	}
	return b.Bytes()
}

func checkGolden(t *testing.T, name string, written []byte) {
	t.Helper()
	testutil.Golden(t, filepath.Join(goldenDir, name), written, *update, "the checkpoint format")
}

func readGolden(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(goldenDir, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// samePosition compares two positions (times with Equal).
func samePosition(a, b Position) bool {
	if a.ResourceVersion != b.ResourceVersion || a.Epoch != b.Epoch || !a.Updated.Equal(b.Updated) || a.StreamSeq != b.StreamSeq {
		return false
	}
	if a.Index == nil || b.Index == nil {
		return a.Index == nil && b.Index == nil
	}
	return *a.Index == *b.Index
}

func TestCheckpointGoldenFiles(t *testing.T) {
	checkGolden(t, "keys.txt", goldenKeys())
	for _, line := range strings.Split(strings.TrimSuffix(readGolden(t, "keys.txt"), "\n"), "\n") {
		f := strings.Split(line, "\t")
		if len(f) != 3 {
			t.Fatalf("keys.txt: line %q has %d fields, want 3", line, len(f))
		}
		if got := Key(f[0], f[1]); got != f[2] {
			t.Errorf("keys.txt: Key(%q, %q) = %q, file says %q", f[0], f[1], got, f[2])
		}
	}

	for _, g := range goldenPositions {
		if g.current {
			raw, err := encode(g.pos)
			if err != nil {
				t.Fatal(err)
			}
			checkGolden(t, g.file, []byte(raw))
		}
		p, err := decode(readGolden(t, g.file))
		if err != nil || !samePosition(p, g.pos) {
			t.Errorf("decode(%s) = %+v, %v; want %+v", g.file, p, err, g.pos)
		}
	}

	_, err := decode(newerValue)
	if err == nil || err.Error() != `checkpoint format version 2 ("v") is newer than this relayd reads (up to 1): it was written by a newer relayd` {
		t.Errorf("decode of a newer format: %v", err)
	}
}

// Through the apiserver: a ConfigMap holding every golden value loads as
// the golden positions, the store writes the current files' bytes, and a
// value of a newer format version stops Load naming the ConfigMap, the key
// and the version.
func TestCheckpointGoldenThroughConfigMap(t *testing.T) {
	admin := env.Clientset(t, false)
	ns := env.Namespace(t)
	data := map[string]string{}
	for _, g := range goldenPositions {
		data[g.key] = readGolden(t, g.file)
	}
	if _, err := admin.CoreV1().ConfigMaps(ns).Create(t.Context(), &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: cmName}, Data: data,
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	clock := &fakeClock{t: goldenUpdated}
	s := newStore(t, admin.CoreV1(), ns, func(o *Options) { o.Now = clock.Now })
	mustLoad(t, s)
	for _, g := range goldenPositions {
		if p, ok := s.Get(g.key); !ok || !samePosition(p, g.pos) {
			t.Errorf("key %q (%s) loaded as %+v (found %v), want %+v", g.key, g.file, p, ok, g.pos)
		}
	}

	// Advance sets Updated from the clock: the golden time.
	for _, g := range goldenPositions {
		if g.current {
			p := g.pos
			p.ResourceVersion += "0" // a move; the golden value is written back below
			s.Advance(g.key, p, false)
		}
	}
	if err := s.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, g := range goldenPositions {
		if g.current {
			s.Advance(g.key, g.pos, false)
		}
	}
	if err := s.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	cm := getCM(t, admin, ns)
	for _, g := range goldenPositions {
		want := readGolden(t, g.file) // the older forms are left as they are
		if got := cm.Data[g.key]; got != want {
			t.Errorf("ConfigMap key %q: %q, want %s's %q", g.key, got, g.file, want)
		}
	}

	cm.Data["newer"] = newerValue
	if _, err := admin.CoreV1().ConfigMaps(ns).Update(t.Context(), cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	err := newStore(t, admin.CoreV1(), ns, nil).Load(t.Context())
	want := fmt.Sprintf(`checkpoint: ConfigMap %s/%s key "newer": checkpoint format version 2 ("v") is newer than this relayd reads (up to 1): it was written by a newer relayd: run that relayd version or a newer one`, ns, cmName)
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("Load with a newer-format value: %v\nwant an error starting %s", err, want)
	}
}
