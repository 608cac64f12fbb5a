package relay_test

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/pkg/checkpoint"
	"github.com/relayd/relayd/pkg/event"
	"github.com/relayd/relayd/pkg/index"
)

// TestIndexBehindTheStreamIsCaughtUpBeforeARelist: relayd stopped between
// an event's PubAck and its index write leaves the bucket without the
// object and the checkpoint before it. If the object is then deleted and
// the position compacted away (410), the relist must still report the
// delete: at start relayd applies the stream's messages after the
// checkpoint's stream sequence to the index. The crash state is built by
// hand (checkpoint put back, the object's index entry purged), so that the
// test is deterministic; the chaos suite's fp-crash-after-resync reaches
// it with real kills.
func TestIndexBehindTheStreamIsCaughtUpBeforeARelist(t *testing.T) {
	noCache := testenv.StartT(t, testenv.Options{DisableWatchCache: true})
	f := newFixture(t, noCache, natsSrv, `
  - name: cms
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]`)
	ctx := t.Context()
	key := "cms." + f.ns
	f.createCM("a", nil, nil)
	r := f.start(nil, true)
	f.waitStored(20*time.Second, isSync("completed"))
	f.eventually(20*time.Second, "checkpoint with a stream sequence", func() error {
		if p := f.checkpoints()[key]; p.Index == nil || p.StreamSeq == 0 {
			return fmt.Errorf("checkpoint %+v", p)
		}
		return nil
	})
	cp, err := f.cs.CoreV1().ConfigMaps(f.ns).Get(ctx, "cp", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	before := cp.Data[key]

	x := f.createCM("x", nil, nil)
	f.waitStored(20*time.Second, isEvent("added", "x", x.ResourceVersion))
	r.stop(t)

	// The state a kill -9 after x's PubAck and before its index write
	// leaves: the checkpoint before x, no index entry for x.
	f.editCheckpoint(func(data map[string]string) { data[key] = before })
	if err := f.indexBucket().Purge(ctx, index.Key(index.Prefix("cms", f.ns), string(x.UID))); err != nil {
		t.Fatal(err)
	}

	// While relayd is down, x is deleted and the position compacted away.
	f.deleteCM("x")
	if _, err := noCache.CompactNow(ctx); err != nil {
		t.Fatal(err)
	}
	all := f.stored()
	after := all[len(all)-1].Seq
	f.start(nil, true)
	ms := f.waitStored(30*time.Second, func(m msg) bool { return m.Seq > after && isSync("completed")(m) })
	if sd := syncOf(t, markers(ms, "cms", "started", after)[0]); sd.Reason != "expired" {
		t.Errorf("sync.started reason %q, want expired (the test must reach the relist after a 410)", sd.Reason)
	}
	want := "deleted x@" + x.ResourceVersion + " resync unknown"
	if got := objectEvents(ms, "cms", after); strings.Join(got, "\n") != want {
		t.Errorf("after the relist:\n%s\nwant:\n%s", strings.Join(got, "\n"), want)
	}

	// The catch-up's consumer does not linger for nats.go's default 5
	// minutes: the server removes it CatchUpConsumerInactive after its
	// last pull.
	s, err := f.js.Stream(ctx, f.stream)
	if err != nil {
		t.Fatal(err)
	}
	consumers := 0
	infos := s.ListConsumers(ctx)
	for ci := range infos.Info() {
		consumers++
		if got := ci.Config.InactiveThreshold; got != index.CatchUpConsumerInactive {
			t.Errorf("consumer %s on the event stream: inactive threshold %v, want %v", ci.Name, got, index.CatchUpConsumerInactive)
		}
	}
	if err := infos.Err(); err != nil {
		t.Fatal(err)
	}
	if consumers == 0 {
		t.Error("no consumer on the event stream: did the start-up catch-up read it?")
	}
}

// TestIndexIsCaughtUpWhenOnlyTheCheckpointIsLost: with the checkpoint gone
// and the bucket kept, the watch relists and compares the list with the
// index (reason no-checkpoint). Nothing bounds what the bucket may lack
// (the crash state of the test above), so relayd reads the whole stream
// first: an object published but missing from the bucket, deleted while
// relayd was down, must still be reported deleted.
func TestIndexIsCaughtUpWhenOnlyTheCheckpointIsLost(t *testing.T) {
	f := newFixture(t, env, natsSrv, `
  - name: cms
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]`)
	ctx := t.Context()
	key := "cms." + f.ns
	a := f.createCM("a", nil, nil)
	r := f.start(nil, true)
	a = f.updateCM(a, "k", "1")
	a = f.updateCM(a, "k", "2")
	x := f.createCM("x", nil, nil)
	f.waitStored(20*time.Second, isEvent("modified", "a", a.ResourceVersion), isEvent("added", "x", x.ResourceVersion))
	r.stop(t)

	// x's PubAck came, its index write did not; then the checkpoint is
	// lost and x deleted while relayd is down.
	kv := f.indexBucket()
	aKey := index.Key(index.Prefix("cms", f.ns), string(a.UID))
	aBefore, err := kv.Get(ctx, aKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Purge(ctx, index.Key(index.Prefix("cms", f.ns), string(x.UID))); err != nil {
		t.Fatal(err)
	}
	f.editCheckpoint(func(data map[string]string) { delete(data, key) })
	f.deleteCM("x")
	all := f.stored()
	after := all[len(all)-1].Seq
	r = f.start(nil, true)
	ms := f.waitStored(30*time.Second, func(m msg) bool { return m.Seq > after && isSync("completed")(m) })
	r.stop(t)
	if sd := syncOf(t, markers(ms, "cms", "started", after)[0]); sd.Reason != "no-checkpoint" {
		t.Errorf("sync.started reason %q, want no-checkpoint", sd.Reason)
	}
	want := "deleted x@" + x.ResourceVersion + " resync unknown"
	if got := objectEvents(ms, "cms", after); strings.Join(got, "\n") != want {
		t.Errorf("after the relist:\n%s\nwant:\n%s", strings.Join(got, "\n"), want)
	}
	if cd := syncOf(t, markers(ms, "cms", "completed", after)[0]); cd.Counts != (event.SyncCounts{Deleted: 1, Unchanged: 1, Total: 1}) {
		t.Errorf("counts %+v, want 1 deleted, 1 unchanged", cd.Counts)
	}
	// a's three versions on the stream were read, but its entry was right:
	// the catch-up does not write it back through its older versions.
	if aAfter, err := kv.Get(ctx, aKey); err != nil {
		t.Fatal(err)
	} else if aAfter.Revision() != aBefore.Revision() {
		t.Errorf("a's index entry was rewritten by the catch-up (revision %d, was %d): %s", aAfter.Revision(), aBefore.Revision(), aAfter.Value())
	}
}

// busyQuietSources are two ConfigMap sources of the test namespace, told
// apart by the label role: busy or quiet.
const busyQuietSources = `
  - name: busy
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]
    labelSelector: role=busy
  - name: quiet
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]
    labelSelector: role=quiet`

// TestQuietSourceCheckpointsARecentStreamSeq: the stream sequence a
// checkpoint carries follows every source's PubAcks, not only its own
// source's, so a source that changes rarely does not make a restart read
// the stream from its last own message (docs/GUARANTEES.md, "How a
// gap is recovered").
func TestQuietSourceCheckpointsARecentStreamSeq(t *testing.T) {
	f := newFixture(t, env, natsSrv, busyQuietSources)
	r := f.start(nil, true)
	defer r.stop(t)
	var b *corev1.ConfigMap
	for i := range 20 {
		b = f.createCM(fmt.Sprint("b", i), map[string]string{"role": "busy"}, nil)
	}
	ms := f.waitStored(20*time.Second, isEvent("added", b.Name, b.ResourceVersion))
	busyLast := ms[len(ms)-1].Seq
	// busy's checkpoint at (or, by a bookmark, past) its last change:
	// relayd has that PubAck.
	want, _ := strconv.ParseUint(b.ResourceVersion, 10, 64)
	f.eventually(20*time.Second, "busy checkpointed at "+b.Name, func() error {
		p := f.checkpoints()["busy."+f.ns]
		if rv, err := strconv.ParseUint(p.ResourceVersion, 10, 64); err != nil || rv < want {
			return fmt.Errorf("busy at %+v, want resourceVersion %s or later", p, b.ResourceVersion)
		}
		return nil
	})
	q := f.createCM("q", map[string]string{"role": "quiet"}, nil)
	f.waitStored(20*time.Second, isEvent("added", "q", q.ResourceVersion))
	var p checkpoint.Position
	wantQ, _ := strconv.ParseUint(q.ResourceVersion, 10, 64)
	f.eventually(20*time.Second, "quiet checkpointed at q", func() error {
		p = f.checkpoints()["quiet."+f.ns]
		if rv, err := strconv.ParseUint(p.ResourceVersion, 10, 64); err != nil || rv < wantQ {
			return fmt.Errorf("quiet at %+v, want resourceVersion %s or later", p, q.ResourceVersion)
		}
		return nil
	})
	if p.StreamSeq <= busyLast {
		t.Errorf("quiet's checkpoint after q carries streamSeq %d, not past busy's last message (%d): a restart would read busy's messages again", p.StreamSeq, busyLast)
	}
}

// TestEpochIsRecordedBeforeSyncStarted: every relist's epoch is in the
// index bucket before its sync.started is on the stream. The other way
// round, relayd dying between the two would let the next relist (its
// checkpoint older) reuse the epoch, and JetStream would drop that relist's
// markers as duplicates of the dead one's. Both timestamps are the NATS
// server's, so the order is the order in which it stored them.
func TestEpochIsRecordedBeforeSyncStarted(t *testing.T) {
	f := newFixture(t, env, natsSrv, `
  - name: cms
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]`)
	ctx := t.Context()
	f.createCM("a", nil, nil)
	kv, err := f.js.KeyValue(ctx, "relayd-index-"+f.cluster)
	if err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
		t.Fatal(err)
	}
	// Two relists: the initial one, and after a restart without checkpoint.
	for run := 1; run <= 2; run++ {
		r := f.start(nil, true)
		ms := f.waitStored(20*time.Second, func(m msg) bool { return isSync("completed")(m) && m.Env.RelaydEpoch == uint64(run) })
		r.stop(t)
		started := markers(ms, "cms", "started", 0)
		if len(started) != run {
			t.Fatalf("run %d: %d sync.started markers on the stream, want %d", run, len(started), run)
		}
		st := started[run-1]
		if st.Env.RelaydEpoch != uint64(run) {
			t.Fatalf("run %d: sync.started epoch %d", run, st.Env.RelaydEpoch)
		}
		s, err := f.js.Stream(ctx, f.stream)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := s.GetMsg(ctx, st.Seq)
		if err != nil {
			t.Fatal(err)
		}
		if kv == nil {
			if kv, err = f.js.KeyValue(ctx, "relayd-index-"+f.cluster); err != nil {
				t.Fatal(err)
			}
		}
		e, err := kv.Get(ctx, index.EpochKey(index.Prefix("cms", f.ns)))
		if err != nil {
			t.Fatalf("run %d: epoch key: %v", run, err)
		}
		if string(e.Value()) != fmt.Sprint(run) {
			t.Errorf("run %d: bucket epoch %q, want %d", run, e.Value(), run)
		}
		if !e.Created().Before(raw.Time) {
			t.Errorf("run %d: epoch %d stored at %s, not before its sync.started (%s)", run, run,
				e.Created().Format(time.RFC3339Nano), raw.Time.Format(time.RFC3339Nano))
		}
		if run == 1 {
			// Lose the checkpoint: the next start relists (reason
			// no-checkpoint) and takes its epoch from the bucket.
			if err := f.cs.CoreV1().ConfigMaps(f.ns).Delete(ctx, "cp", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestCleanStopSettlesQuietWatchesPastTheStream: at a clean stop every
// drained watch's checkpoint carries a stream sequence past everything it
// published (checkpoint.Store.Settle), so the next start has nothing to
// read from the stream for it. Without it, a watch quiet since its last
// change made every restart read all the messages stored since then (at
// 1M objects most of the restart's time).
func TestCleanStopSettlesQuietWatchesPastTheStream(t *testing.T) {
	f := newFixture(t, env, natsSrv, busyQuietSources)
	r := f.start(nil, true)
	q := f.createCM("q", map[string]string{"role": "quiet"}, nil)
	f.waitStored(20*time.Second, isEvent("added", "q", q.ResourceVersion))
	var b *corev1.ConfigMap
	for i := range 20 {
		b = f.createCM(fmt.Sprint("b", i), map[string]string{"role": "busy"}, nil)
	}
	ms := f.waitStored(20*time.Second, isEvent("added", b.Name, b.ResourceVersion))
	busyLast := ms[len(ms)-1].Seq
	r.stop(t)
	p := f.checkpoints()["quiet."+f.ns]
	if p.StreamSeq <= busyLast {
		t.Errorf("after a clean stop quiet's checkpoint carries streamSeq %d, not past the stream's last message (%d): a restart reads busy's messages again", p.StreamSeq, busyLast)
	}
}
