package watch

// The engine's decisions, with fakes for everything it talks to: no
// servers, well under a second. The real-server tests of pkg/relay prove
// the same behaviour end to end.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/relayd/relayd/pkg/checkpoint"
	"github.com/relayd/relayd/pkg/config"
	"github.com/relayd/relayd/pkg/event"
	"github.com/relayd/relayd/pkg/index"
	"github.com/relayd/relayd/pkg/sink"
	"github.com/relayd/relayd/pkg/source"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakePipe records what is submitted.
type fakePipe struct {
	mu        sync.Mutex
	entries   []sink.Entry
	drains    int
	order     []string // "submit <i>" and "drain", in call order
	watermark string
	wmEpoch   uint64
}

func (p *fakePipe) Submit(_ context.Context, e sink.Entry) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.entries = append(p.entries, e)
	p.order = append(p.order, fmt.Sprintf("submit %d", len(p.entries)-1))
	return nil
}

func (p *fakePipe) Drain(context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drains++
	p.order = append(p.order, "drain")
	return nil
}

func (p *fakePipe) Watermark() (string, uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.watermark, p.wmEpoch
}

func (p *fakePipe) Close() {}

func (p *fakePipe) Progress() sink.Progress { return sink.Progress{} }

type fakePositions map[string]checkpoint.Position

func (f fakePositions) Get(key string) (checkpoint.Position, bool)    { p, ok := f[key]; return p, ok }
func (f fakePositions) Stored(key string) (checkpoint.Position, bool) { return f.Get(key) }
func (f fakePositions) Advance(key string, p checkpoint.Position, _ bool) {
	f[key] = p
}

// fakeBucket holds index entries in memory; its messages say what they
// write ("put <key> <rv>", "delete <key>", "epoch <key> <n>").
type fakeBucket struct {
	gen      index.Generation
	objects  map[string][]index.Object // prefix -> objects
	epoch    uint64
	watched  bool     // the epoch key holds 0 (a watch started from now)
	corrupt  []string // keys Load reports as unreadable
	otherKey []string // uids Load reports fingerprinted under another key
	puts     []index.Object
	loads    int
}

func (b *fakeBucket) Name() string { return "IX" }
func (b *fakeBucket) Generation(context.Context) (index.Generation, error) {
	return b.gen, nil
}

func (b *fakeBucket) Load(_ context.Context, prefix string, x *index.Index) (index.Loaded, error) {
	b.loads++
	l := index.Loaded{Objects: len(b.objects[prefix])}
	for _, o := range b.objects[prefix] {
		if slices.Contains(b.otherKey, o.UID) {
			o.Fingerprint = 0
			l.OtherKey = append(l.OtherKey, o.UID)
		}
		x.Put(o)
	}
	if len(b.corrupt) > 0 {
		return l, &index.CorruptError{Keys: b.corrupt, Err: errors.New("bad value")}
	}
	return l, nil
}

func (b *fakeBucket) Epoch(context.Context, string) (uint64, bool, error) {
	return b.epoch, b.epoch > 0 || b.watched, nil
}
func (b *fakeBucket) PutMsg(prefix string, o index.Object) *event.Message {
	b.puts = append(b.puts, o)
	return &event.Message{Subject: "put " + index.Key(prefix, o.UID) + " " + o.ResourceVersion}
}
func (b *fakeBucket) DeleteMsg(prefix, uid string) *event.Message {
	return &event.Message{Subject: "delete " + index.Key(prefix, uid)}
}
func (b *fakeBucket) DeleteKeyMsg(key string) *event.Message {
	return &event.Message{Subject: "delete " + key}
}
func (b *fakeBucket) EpochMsg(prefix string, epoch uint64) *event.Message {
	return &event.Message{Subject: fmt.Sprintf("epoch %s %d", prefix, epoch)}
}

// fakeStream returns fixed catch-up fixes and records where it was asked
// to read from.
type fakeStream struct {
	fixes []index.Fix
	from  []uint64
	last  map[string]string // CatchUpResult.Last (the replay fences)
}

func (s *fakeStream) CatchUp(_ context.Context, _ *zap.Logger, x *index.Index, c index.CatchUpOf) (index.CatchUpResult, error) {
	s.from = append(s.from, c.From)
	for _, f := range s.fixes {
		if f.Deleted {
			x.Delete(f.UID)
		} else {
			x.Put(f.Object)
		}
	}
	return index.CatchUpResult{To: 100, Read: len(s.fixes), Fixes: s.fixes, Last: s.last}, nil
}

// fakeWatcher delivers its items to the handler on its first run, records
// every Start, and then returns err (nil: waits for the context).
type fakeWatcher struct {
	items   []source.Item
	onStart func(source.Start)
	panics  bool
	err     error
}

func (f *fakeWatcher) Run(ctx context.Context, st source.Start, h source.Handler) error {
	f.onStart(st)
	if f.panics {
		panic("boom")
	}
	for i := range f.items {
		if err := h(ctx, &f.items[i]); err != nil {
			return err
		}
	}
	if f.err != nil {
		return f.err
	}
	<-ctx.Done()
	return ctx.Err()
}

// rig is a watch with fakes.
type rig struct {
	w        *Watch
	pipe     *fakePipe
	pos      fakePositions
	bucket   *fakeBucket
	stream   *fakeStream
	m        *Metrics
	mu       sync.Mutex
	starts   []source.Start
	watchers []*fakeWatcher // handed out in order; the last one again after
	next     int            // the next of watchers to hand out
	resolves int
}

const testConfig = `
cluster: test
nats:
  url: nats://127.0.0.1:4222
  stream:
    name: K8S
checkpoint:
  namespace: relayd
  name: relayd-checkpoint
sources:
  - name: cms
    apiVersion: v1
    kind: ConfigMap
    ignoreChanges: ["metadata.annotations"]
  - name: quiet
    apiVersion: v1
    kind: ConfigMap
    eventTypes: [added, deleted]
`

func newRig(t *testing.T, srcName string, watchers ...*fakeWatcher) *rig {
	t.Helper()
	return newRigWith(t, testConfig, srcName, watchers...)
}

// newRigWith is newRig with the configuration cfgYAML.
func newRigWith(t testing.TB, cfgYAML, srcName string, watchers ...*fakeWatcher) *rig {
	t.Helper()
	cfg, err := config.Parse([]byte(cfgYAML), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var src *config.Source
	for i := range cfg.Sources {
		if cfg.Sources[i].Name == srcName {
			src = &cfg.Sources[i]
		}
	}
	shaping, err := event.NewShaping(src.Shaping())
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{pipe: &fakePipe{}, pos: fakePositions{}, bucket: &fakeBucket{gen: index.Generation{ID: "g1", LastSeq: 7}, objects: map[string][]index.Object{}},
		stream: &fakeStream{}, m: newMetrics(t), watchers: watchers}
	for _, fw := range watchers {
		fw.onStart = func(st source.Start) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.starts = append(r.starts, st)
		}
	}
	r.w = New(Options{
		Source: src, Namespace: "ns", Config: cfg, Logger: zap.NewNop(), Metrics: r.m,
		Shaping: shaping, MaxPayload: 1 << 20,
		Backoff:   wait.Backoff{Duration: time.Millisecond, Factor: 1, Steps: 1 << 30},
		Pipelines: r, Positions: r.pos, Events: r.stream, Bucket: r.bucket,
		Ready: r, Resolver: r, Watchers: r, Self: r,
	})
	return r
}

// The rig is the watch's pipelines, readiness, resolver, watcher factory
// and self filter.

func (r *rig) NewPipe(string, Acked) Pipe                  { return r.pipe }
func (r *rig) Wait(context.Context) error                  { return nil }
func (r *rig) IsSelf(_ event.Resource, m *event.Meta) bool { return m.Name == "relayd-checkpoint" }

func (r *rig) Resolve(*config.Source) (event.Resource, error) {
	r.resolves++
	return cmResource, nil
}

func (r *rig) NewWatcher(source.Options) (Watcher, error) {
	fw := r.watchers[min(r.next, len(r.watchers)-1)]
	r.next++
	return fw, nil
}

var cmResource = event.Resource{Version: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespaced: true}

// run runs the watch until the watchers ran n times in all.
func (r *rig) run(t *testing.T, n int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.w.Supervise(ctx) }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		r.mu.Lock()
		started := len(r.starts)
		r.mu.Unlock()
		if started >= n || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	// Let the last run deliver its items (a fake delivers them at once).
	time.Sleep(20 * time.Millisecond)
	cancel()
	<-done
	if len(r.starts) < n {
		t.Fatalf("the watcher ran %d times, want %d", len(r.starts), n)
	}
}

// obj parses a ConfigMap as the watcher does, with the source's shaping
// (which gives it the fingerprint of ignoreChanges).
func (r *rig) obj(t *testing.T, uid, name, rv, annotation string) event.Object {
	t.Helper()
	raw := fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":%q,"namespace":"ns","uid":%q,"resourceVersion":%q,"annotations":{"a":%q}},"data":{"k":"v"}}`,
		name, uid, rv, annotation)
	o, err := event.ParseObjectShaped([]byte(raw), r.w.o.Shaping)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// describe renders the entries as one line each: the published event (its
// type, origin, name and final-state flag, or the marker), the index write,
// and the position.
func describe(t *testing.T, entries []sink.Entry) []string {
	t.Helper()
	var out []string
	for _, e := range entries {
		var parts []string
		if e.Msg != nil {
			env, err := event.DecodeMessage(e.Msg.Header, e.Msg.Data)
			if err != nil {
				t.Fatal(err)
			}
			typ := env.Type[strings.LastIndex(env.Type, ".")+1:]
			if strings.Contains(env.Type, ".sync.") {
				parts = append(parts, "sync."+typ)
			} else {
				s := typ + " " + env.RelaydOrigin + " " + env.K8sName + "@" + env.K8sResourceVersion
				if env.RelaydFinalUnknown {
					s += " finalunknown"
				}
				parts = append(parts, s)
			}
		}
		if e.FollowUp != nil {
			parts = append(parts, "["+e.FollowUp.Subject+"]")
		}
		if e.ResourceVersion != "" {
			parts = append(parts, "→"+e.ResourceVersion)
		}
		if len(parts) == 0 {
			parts = append(parts, "(empty)")
		}
		out = append(out, strings.Join(parts, " "))
	}
	return out
}

func sameLines(t *testing.T, what string, got, want []string) {
	t.Helper()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("%s:\n got:\n  %s\nwant:\n  %s", what, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// A relist is compared with the index: an unchanged object is not
// republished, a changed and a new one are, an indexed object the list did
// not contain is published as deleted with its final state unknown; the
// epoch is written to the bucket before sync.started (both gated on one
// key), and sync.completed carries the counts and moves the position.
func TestRelistIsComparedWithTheIndex(t *testing.T) {
	pre := index.Prefix("cms", "ns")
	fw := &fakeWatcher{}
	r := newRig(t, "cms", fw)
	fw.items = []source.Item{
		{Kind: source.ItemSyncStarted, Epoch: 3, Sync: event.SyncEvent{Namespace: "ns", Epoch: 3, Reason: event.RelistExpired}},
		{Kind: source.ItemObject, Type: event.Added, Origin: event.OriginResync, Epoch: 3, Object: r.obj(t, "u-a", "a", "10", "x")},
		{Kind: source.ItemObject, Type: event.Added, Origin: event.OriginResync, Epoch: 3, Object: r.obj(t, "u-b", "b", "15", "x")},
		{Kind: source.ItemObject, Type: event.Added, Origin: event.OriginResync, Epoch: 3, Object: r.obj(t, "u-d", "d", "16", "x")},
		{Kind: source.ItemSyncCompleted, Epoch: 3, ResourceVersion: "20",
			Sync: event.SyncEvent{Completed: true, Namespace: "ns", Epoch: 3, Reason: event.RelistExpired, ToResourceVersion: "20"}},
	}
	r.bucket.objects[pre] = []index.Object{
		{UID: "u-a", Namespace: "ns", Name: "a", ResourceVersion: "10"},
		{UID: "u-b", Namespace: "ns", Name: "b", ResourceVersion: "11"},
		{UID: "u-c", Namespace: "ns", Name: "c", ResourceVersion: "12"},
	}
	r.pos[checkpoint.Key("cms", "ns")] = checkpoint.Position{ResourceVersion: "12", Epoch: 2,
		Index: &index.Ref{Generation: "g1", Seq: 7}, StreamSeq: 40}
	r.run(t, 1)
	sameLines(t, "entries", describe(t, r.pipe.entries), []string{
		"[epoch " + pre + " 3]",
		"sync.started",
		"modified resync b@15 [put " + pre + ".u-b 15]",
		"added resync d@16 [put " + pre + ".u-d 16]",
		"deleted resync c@12 finalunknown [delete " + pre + ".u-c]",
		"sync.completed →20",
	})
	if e := r.pipe.entries; e[0].ObjectKey != epochGate || e[1].ObjectKey != epochGate {
		t.Errorf("the epoch write and sync.started must share the gate key: %q, %q", e[0].ObjectKey, e[1].ObjectKey)
	}
	// A retried publish is stored after the ones behind it: the markers
	// bracket the list on the stream only if sync.started is acked before
	// the first listed object and every listed object before sync.completed.
	sameLines(t, "submits and drains", r.pipe.order, []string{
		"submit 0", "submit 1", "drain", "submit 2", "submit 3", "submit 4", "drain", "submit 5",
	})
	env, err := event.DecodeMessage(r.pipe.entries[5].Msg.Header, r.pipe.entries[5].Msg.Data)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"total":3`, `"unchanged":1`, `"added":1`, `"modified":1`, `"deleted":1`} {
		if !strings.Contains(string(env.Data), want) {
			t.Errorf("sync.completed data %s lacks %s", env.Data, want)
		}
	}
	if got := r.stream.from; len(got) != 1 || got[0] != 40 {
		t.Errorf("catch-up read from %v, want [40] (the checkpoint's stream sequence)", got)
	}
	if got := testutil.ToFloat64(r.m.TrackedObjects.WithLabelValues("cms")); got != 3 {
		t.Errorf("relayd_tracked_objects = %v, want 3 (a, b, d)", got)
	}
}

// Live changes keep the index: a change only in ignored fields moves the
// position without publishing or writing the index; a delete of an object
// the index never had is published without an index write; relayd's own
// checkpoint ConfigMap is not even a position move.
func TestLiveChangesKeepTheIndex(t *testing.T) {
	pre := index.Prefix("cms", "ns")
	fw := &fakeWatcher{}
	r := newRig(t, "cms", fw)
	fw.items = []source.Item{
		{Kind: source.ItemObject, Type: event.Added, Origin: event.OriginWatch, ResourceVersion: "21", Object: r.obj(t, "u-e", "e", "21", "x")},
		{Kind: source.ItemObject, Type: event.Modified, Origin: event.OriginWatch, ResourceVersion: "22", Object: r.obj(t, "u-e", "e", "22", "only-this")},
		{Kind: source.ItemObject, Type: event.Deleted, Origin: event.OriginWatch, ResourceVersion: "23", Object: r.obj(t, "u-z", "z", "23", "x")},
		{Kind: source.ItemObject, Type: event.Modified, Origin: event.OriginWatch, ResourceVersion: "24", Object: r.obj(t, "u-self", "relayd-checkpoint", "24", "x")},
		{Kind: source.ItemBookmark, ResourceVersion: "25"},
		{Kind: source.ItemObject, Type: event.Deleted, Origin: event.OriginWatch, ResourceVersion: "26", Object: r.obj(t, "u-e", "e", "26", "x")},
	}
	r.pos[checkpoint.Key("cms", "ns")] = checkpoint.Position{ResourceVersion: "20", Epoch: 1,
		Index: &index.Ref{Generation: "g1", Seq: 7}, StreamSeq: 40}
	r.run(t, 1)
	sameLines(t, "entries", describe(t, r.pipe.entries), []string{
		"added watch e@21 [put " + pre + ".u-e 21] →21",
		"→22",
		"deleted watch z@23 →23",
		"→25",
		"deleted watch e@26 [delete " + pre + ".u-e] →26",
	})
	if got := testutil.ToFloat64(r.m.EventsSuppressed.WithLabelValues("cms")); got != 1 {
		t.Errorf("relayd_events_suppressed_total = %v, want 1", got)
	}
}

// Each submitted message keeps its own object until the pipeline is done
// with it (it retries a failed publish from the same message): the watch
// builds payloads in a buffer it reuses (structured mode), which the
// encoder copies; in binary mode the body is the payload itself, so there
// nothing is reused. Objects of growing and shrinking sizes, kept by the
// fake pipe as a slow pipeline would.
func TestEachSubmittedMessageKeepsItsObject(t *testing.T) {
	for _, mode := range []string{"structured", "binary"} {
		t.Run(mode, func(t *testing.T) {
			fw := &fakeWatcher{}
			r := newRigWith(t, testConfig+"cloudevents:\n  mode: "+mode+"\n", "cms", fw)
			sizes := []int{3000, 10, 5000, 200, 4000, 1}
			for i, n := range sizes {
				rv := strconv.Itoa(21 + i)
				fw.items = append(fw.items, source.Item{Kind: source.ItemObject, Type: event.Added, Origin: event.OriginWatch, ResourceVersion: rv,
					Object: r.obj(t, "u-"+rv, "cm-"+strconv.Itoa(i), rv, strings.Repeat(string(rune('a'+i)), n))})
			}
			r.pos[checkpoint.Key("cms", "ns")] = checkpoint.Position{ResourceVersion: "20", Epoch: 1,
				Index: &index.Ref{Generation: "g1", Seq: 7}, StreamSeq: 40}
			r.run(t, 1)
			if len(r.pipe.entries) != len(sizes) {
				t.Fatalf("%d entries, want %d", len(r.pipe.entries), len(sizes))
			}
			for i, e := range r.pipe.entries {
				env, err := event.DecodeMessage(e.Msg.Header, e.Msg.Data)
				if err != nil {
					t.Fatalf("entry %d: %v", i, err)
				}
				var d struct {
					Metadata struct {
						Name        string
						Annotations map[string]string
					}
				}
				if err := json.Unmarshal(env.Data, &d); err != nil {
					t.Fatalf("entry %d: data %.60q…: %v", i, env.Data, err)
				}
				want := strings.Repeat(string(rune('a'+i)), sizes[i])
				if d.Metadata.Name != "cm-"+strconv.Itoa(i) || d.Metadata.Annotations["a"] != want {
					t.Errorf("entry %d carries %s with annotation %.20q… (%d bytes), want cm-%d with %d bytes",
						i, d.Metadata.Name, d.Metadata.Annotations["a"], len(d.Metadata.Annotations["a"]), i, sizes[i])
				}
			}
		})
	}
}

// While the watch replays what its previous run stored after the
// checkpoint (until it passed every object's last message there), the
// positions it submits keep the checkpoint's stream sequence: a crash must
// catch up from there, or it would miss the replay's fences.
func TestReplayKeepsTheCheckpointsStreamSequence(t *testing.T) {
	fw := &fakeWatcher{}
	r := newRig(t, "cms", fw)
	fw.items = []source.Item{
		{Kind: source.ItemObject, Type: event.Modified, Origin: event.OriginWatch, ResourceVersion: "21", Object: r.obj(t, "u-f", "f", "21", "x")},
		{Kind: source.ItemObject, Type: event.Modified, Origin: event.OriginWatch, ResourceVersion: "22", Object: r.obj(t, "u-e", "e", "22", "x")},
		{Kind: source.ItemObject, Type: event.Modified, Origin: event.OriginWatch, ResourceVersion: "23", Object: r.obj(t, "u-g", "g", "23", "x")},
	}
	r.pos[checkpoint.Key("cms", "ns")] = checkpoint.Position{ResourceVersion: "20", Index: &index.Ref{Generation: "g1", Seq: 7}, StreamSeq: 40}
	r.stream.last = map[string]string{"u-e": "22"} // e's last message after the checkpoint
	r.run(t, 1)
	var got []string
	for _, e := range r.pipe.entries {
		got = append(got, fmt.Sprintf("%s cap %d", e.ResourceVersion, e.StreamSeqCap))
	}
	sameLines(t, "entries", got, []string{"21 cap 40", "22 cap 40", "23 cap 0"})
}

// A source that does not publish modified events still indexes them: the
// entry carries the index write and the position, no event.
func TestFilteredTypesStillKeepTheIndex(t *testing.T) {
	pre := index.Prefix("quiet", "ns")
	fw := &fakeWatcher{}
	r := newRig(t, "quiet", fw)
	fw.items = []source.Item{
		{Kind: source.ItemObject, Type: event.Added, Origin: event.OriginWatch, ResourceVersion: "21", Object: r.obj(t, "u-e", "e", "21", "x")},
		{Kind: source.ItemObject, Type: event.Modified, Origin: event.OriginWatch, ResourceVersion: "22", Object: r.obj(t, "u-e", "e", "22", "y")},
	}
	r.pos[checkpoint.Key("quiet", "ns")] = checkpoint.Position{ResourceVersion: "20", Index: &index.Ref{Generation: "g1", Seq: 7}, StreamSeq: 40}
	r.run(t, 1)
	sameLines(t, "entries", describe(t, r.pipe.entries), []string{
		"added watch e@21 [put " + pre + ".u-e 21] →21",
		"[put " + pre + ".u-e 22] →22",
	})
	if got := testutil.ToFloat64(r.m.EventsFiltered.WithLabelValues("quiet")); got != 1 {
		t.Errorf("relayd_events_filtered_total = %v, want 1", got)
	}
}

// Where a watch starts, by what it finds: the recovery plan's list, the
// checkpoint, the epoch floor from the bucket; the catch-up's corrections
// are written before anything else; corrupt entries are deleted and force
// an index-lost relist.
func TestStartFollowsTheRecoveryPlan(t *testing.T) {
	key, pre := checkpoint.Key("cms", "ns"), index.Prefix("cms", "ns")
	good := &index.Ref{Generation: "g1", Seq: 7}
	for _, c := range []struct {
		name    string
		pos     *checkpoint.Position
		objects int
		epoch   uint64
		corrupt []string
		fixes   []index.Fix
		want    source.Start
		from    uint64
		entries []string
	}{
		{name: "checkpoint and bucket agree", pos: &checkpoint.Position{ResourceVersion: "50", Epoch: 4, Index: good, StreamSeq: 40},
			want: source.Start{ResourceVersion: "50", Epoch: 4, Snapshot: true}, from: 40},
		{name: "the bucket recorded a later epoch", pos: &checkpoint.Position{ResourceVersion: "50", Epoch: 4, Index: good, StreamSeq: 40}, epoch: 6,
			want: source.Start{ResourceVersion: "50", Epoch: 6, Snapshot: true}, from: 40},
		{name: "first start: no checkpoint, nothing in the bucket",
			want: source.Start{Snapshot: true}},
		{name: "no checkpoint, no objects but an earlier list's epoch", epoch: 2,
			want: source.Start{Epoch: 2, Snapshot: true, Relist: event.RelistNoCheckpoint}, from: 1},
		{name: "no checkpoint, objects in the bucket", objects: 1,
			want: source.Start{Snapshot: true, Relist: event.RelistNoCheckpoint}, from: 1},
		{name: "bucket recreated", objects: 1, pos: &checkpoint.Position{ResourceVersion: "50", Epoch: 4, Index: &index.Ref{Generation: "g0", Seq: 7}, StreamSeq: 40},
			want: source.Start{ResourceVersion: "50", Epoch: 4, Snapshot: true, Relist: event.RelistIndexLost}},
		{name: "corrupt entries", objects: 1, corrupt: []string{pre + ".bad"}, pos: &checkpoint.Position{ResourceVersion: "50", Epoch: 4, Index: good, StreamSeq: 40},
			want: source.Start{ResourceVersion: "50", Epoch: 4, Snapshot: true, Relist: event.RelistIndexLost}, entries: []string{"[delete " + pre + ".bad]"}},
		{name: "catch-up corrections", pos: &checkpoint.Position{ResourceVersion: "50", Epoch: 4, Index: good, StreamSeq: 40},
			fixes: []index.Fix{{UID: "u-n", Object: index.Object{UID: "u-n", Namespace: "ns", Name: "n", ResourceVersion: "45"}}},
			want:  source.Start{ResourceVersion: "50", Epoch: 4, Snapshot: true}, from: 40, entries: []string{"[put " + pre + ".u-n 45]"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newRig(t, "cms", &fakeWatcher{})
			if c.pos != nil {
				r.pos[key] = *c.pos
			}
			for i := range c.objects {
				r.bucket.objects[pre] = append(r.bucket.objects[pre], index.Object{UID: fmt.Sprintf("u-%d", i), Namespace: "ns", Name: "x", ResourceVersion: "9"})
			}
			r.bucket.epoch, r.bucket.corrupt, r.stream.fixes = c.epoch, c.corrupt, c.fixes
			r.run(t, 1)
			if r.starts[0] != c.want {
				t.Errorf("start %+v, want %+v", r.starts[0], c.want)
			}
			if c.from != 0 && (len(r.stream.from) != 1 || r.stream.from[0] != c.from) {
				t.Errorf("catch-up from %v, want %d", r.stream.from, c.from)
			}
			sameLines(t, "entries", describe(t, r.pipe.entries), c.entries)
		})
	}
}

// A watch of a source with initial: none that starts from now records its
// epoch (0) in the bucket, acked before it watches, once: a later start
// without a checkpoint then relists (no-checkpoint) instead of starting from
// now again, which would lose the changes made meanwhile silently.
func TestStartFromNowIsRecorded(t *testing.T) {
	cfg := strings.Replace(testConfig, "    kind: ConfigMap\n    ignoreChanges", "    kind: ConfigMap\n    initial: none\n    ignoreChanges", 1)
	key, pre := checkpoint.Key("cms", "ns"), index.Prefix("cms", "ns")
	for _, c := range []struct {
		name    string
		pos     *checkpoint.Position
		watched bool
		epoch   uint64
		want    source.Start
		entries []string
	}{
		{name: "first start", want: source.Start{}, entries: []string{"[epoch " + pre + " 0]"}},
		{name: "from the checkpoint", pos: &checkpoint.Position{ResourceVersion: "50", Index: &index.Ref{Generation: "g1", Seq: 7}},
			want: source.Start{ResourceVersion: "50"}},
		{name: "checkpoint lost after a start from now", watched: true,
			want: source.Start{Relist: event.RelistNoCheckpoint}},
		{name: "checkpoint lost after a relist", epoch: 3,
			want: source.Start{Epoch: 3, Relist: event.RelistNoCheckpoint}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newRigWith(t, cfg, "cms", &fakeWatcher{})
			if c.pos != nil {
				r.pos[key] = *c.pos
			}
			r.bucket.watched, r.bucket.epoch = c.watched, c.epoch
			r.run(t, 1)
			if r.starts[0] != c.want {
				t.Errorf("start %+v, want %+v", r.starts[0], c.want)
			}
			sameLines(t, "entries", describe(t, r.pipe.entries), c.entries)
		})
	}
}

// A panic is recovered and counted; the next attempt rebuilds the watcher,
// reloads the index from the bucket once the pipeline drained, and starts
// from the acked watermark (never behind the checkpoint); the first load's
// recovery (catch-up) is not repeated.
func TestPanicIsRecoveredAndTheWatchResumesFromTheWatermark(t *testing.T) {
	r := newRig(t, "cms", &fakeWatcher{panics: true}, &fakeWatcher{})
	r.pos[checkpoint.Key("cms", "ns")] = checkpoint.Position{ResourceVersion: "50", Epoch: 4,
		Index: &index.Ref{Generation: "g1", Seq: 7}, StreamSeq: 40}
	r.pipe.watermark, r.pipe.wmEpoch = "60", 5
	r.run(t, 2)
	if got := testutil.ToFloat64(r.m.SourcePanics.WithLabelValues("cms")); got != 1 {
		t.Errorf("relayd_source_panics_total = %v, want 1", got)
	}
	if got := testutil.ToFloat64(r.m.Source.WatchRestarts.WithLabelValues("cms", ReasonPanic)); got != 1 {
		t.Errorf("relayd_watch_restarts_total{reason=panic} = %v, want 1", got)
	}
	if want := (source.Start{ResourceVersion: "60", Epoch: 5, Snapshot: true}); r.starts[1] != want {
		t.Errorf("after the panic: start %+v, want %+v", r.starts[1], want)
	}
	if r.bucket.loads != 2 || r.pipe.drains != 1 {
		t.Errorf("bucket loads %d, drains %d: want the index reloaded once, after a drain", r.bucket.loads, r.pipe.drains)
	}
	if len(r.stream.from) != 1 {
		t.Errorf("catch-ups %v: only the first load catches up", r.stream.from)
	}
	if !strings.Contains(r.w.LastError(), "panic: boom") {
		t.Errorf("LastError %q does not name the panic", r.w.LastError())
	}
}

// An error that is not a panic (a not-found collection, say) makes the
// next attempt resolve the resource and build the watcher again, and keeps
// the index as acked (no reload).
func TestErrorResolvesAgainWithoutReloadingTheIndex(t *testing.T) {
	r := newRig(t, "cms", &fakeWatcher{err: errors.New("the server could not find the requested resource")}, &fakeWatcher{})
	r.pos[checkpoint.Key("cms", "ns")] = checkpoint.Position{ResourceVersion: "50", Epoch: 4,
		Index: &index.Ref{Generation: "g1", Seq: 7}, StreamSeq: 40}
	r.run(t, 2)
	if r.resolves != 2 || r.bucket.loads != 1 {
		t.Errorf("resolves %d, bucket loads %d: want 2 and 1", r.resolves, r.bucket.loads)
	}
}

// relistHook records what it is told and fails with err.
type relistHook struct {
	r    *rig
	seen []string
	err  error
}

func (h *relistHook) AfterRelist(_ context.Context, rl Relisted) error {
	var uids []string
	rl.Index.Range(func(o index.Object) bool { uids = append(uids, o.UID); return true })
	slices.Sort(uids)
	h.seen = append(h.seen, fmt.Sprintf("%s %s/%s at %s: %s in %s, fingerprinted %v, %d entries submitted",
		rl.Watch, rl.Resource.Resource, rl.Namespace, rl.ResourceVersion, strings.Join(uids, ","), rl.IndexPrefix,
		rl.Fingerprinter != nil, len(h.r.pipe.entries)))
	return h.err
}

// The hook after a relist (the tests' index consistency check) is told the
// relist once it is compared with the index and its sync.completed
// submitted, and its error stops the attempt: the watch restarts.
func TestRelistHookSeesTheComparedRelist(t *testing.T) {
	pre := index.Prefix("cms", "ns")
	fw := &fakeWatcher{}
	r := newRig(t, "cms", fw, &fakeWatcher{})
	fw.items = []source.Item{
		{Kind: source.ItemSyncStarted, Epoch: 3, Sync: event.SyncEvent{Namespace: "ns", Epoch: 3, Reason: event.RelistExpired}},
		{Kind: source.ItemObject, Type: event.Added, Origin: event.OriginResync, Epoch: 3, Object: r.obj(t, "u-a", "a", "10", "x")},
		{Kind: source.ItemObject, Type: event.Added, Origin: event.OriginResync, Epoch: 3, Object: r.obj(t, "u-d", "d", "16", "x")},
		{Kind: source.ItemSyncCompleted, Epoch: 3, ResourceVersion: "20",
			Sync: event.SyncEvent{Completed: true, Namespace: "ns", Epoch: 3, Reason: event.RelistExpired, ToResourceVersion: "20"}},
	}
	r.bucket.objects[pre] = []index.Object{
		{UID: "u-a", Namespace: "ns", Name: "a", ResourceVersion: "10"},
		{UID: "u-c", Namespace: "ns", Name: "c", ResourceVersion: "12"},
	}
	hook := &relistHook{r: r, err: errors.New("index differs")}
	r.w.o.AfterRelist = hook
	r.run(t, 2)
	sameLines(t, "relists seen", hook.seen, []string{
		// epoch, sync.started, added d, deleted c, sync.completed
		"cms/ns configmaps/ns at 20: u-a,u-d in " + pre + ", fingerprinted true, 5 entries submitted",
	})
	if !strings.Contains(r.w.LastError(), "index differs") {
		t.Errorf("LastError %q does not carry the hook's error", r.w.LastError())
	}
}

// newMetrics returns the watches' metrics, with the source's and the
// sink's, registered on a fresh registry.
func newMetrics(t testing.TB) *Metrics {
	t.Helper()
	reg := prometheus.NewRegistry()
	src, err := source.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	snk, err := sink.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMetrics(reg, src, snk)
	if err != nil {
		t.Fatal(err)
	}
	return m
}
