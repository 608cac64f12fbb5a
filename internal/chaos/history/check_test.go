package history

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// syn builds synthetic histories: objects written by a writer, seen by the
// reference, relayed to a stream.
type syn struct {
	h     History
	rv    int64
	seq   uint64
	uid   map[string]string
	epoch uint64 // of the events published: the last sync.started's
}

// t0 is when the synthetic stream starts: message seq is stored at
// t0 + seq×10ms.
var t0 = time.Date(2026, 11, 24, 8, 0, 0, 0, time.UTC)

func stored(seq uint64) time.Time { return t0.Add(time.Duration(seq) * 10 * time.Millisecond) }

func newSyn() *syn {
	return &syn{h: History{Scenario: "synthetic", Sources: []string{"cms"}, DuplicateWindow: 10 * time.Minute}, rv: 100, uid: map[string]string{}, epoch: 1}
}

// fault records a fault injected right after the last message so far
// (before the next one is stored).
func (s *syn) fault(kind string, rev int64) {
	s.h.Faults = append(s.h.Faults, Fault{At: stored(s.seq).Add(5 * time.Millisecond), Kind: kind, Rev: rev})
}

// write makes a change to object name (create, update or delete) and
// returns the reference change.
func (s *syn) write(op, name string) Change {
	s.rv++
	if op == "create" {
		s.uid[name] = fmt.Sprintf("uid-%s-%d", name, s.rv)
	}
	typ := map[string]string{"create": Added, "update": Modified, "delete": Deleted}[op]
	ch := Change{Source: "cms", UID: s.uid[name], Namespace: "ns", Name: name, RV: s.rv, Type: typ}
	w := Write{Source: "cms", Op: op, Namespace: "ns", Name: name, UID: ch.UID, At: time.Now()}
	if op != "delete" {
		w.RV = s.rv
	}
	s.h.Writes = append(s.h.Writes, w)
	s.h.Reference = append(s.h.Reference, ch)
	return ch
}

func (s *syn) publish(ch Change, origin string) Event {
	s.seq++
	id := fmt.Sprintf("%s/%d", ch.UID, ch.RV)
	if ch.Type == Deleted {
		id += "/deleted"
	}
	e := Event{Seq: s.seq, Source: ch.Source, ID: id, MsgID: ch.Source + "/" + id, Stored: stored(s.seq), Kind: "object", Type: ch.Type, UID: ch.UID, Namespace: ch.Namespace, Name: ch.Name, RV: ch.RV, Origin: origin, Epoch: s.epoch}
	s.h.Stream = append(s.h.Stream, e)
	return e
}

// sample is a checkpoint sample read right after message seq was stored.
func (s *syn) sample(seq uint64, rv int64) Sample {
	at := stored(seq).Add(6 * time.Millisecond)
	return Sample{At: at, Read: at.Add(time.Millisecond), Source: "cms", CheckpointRV: rv, StreamLastSeq: seq}
}

func (s *syn) unknownDelete(last Change) {
	s.seq++
	id := fmt.Sprintf("%s/%d/deleted", last.UID, last.RV)
	s.h.Stream = append(s.h.Stream, Event{Seq: s.seq, Source: "cms", ID: id, MsgID: "cms/" + id, Stored: stored(s.seq), Kind: "object", Type: Deleted,
		UID: last.UID, Namespace: "ns", Name: last.Name, RV: last.RV, Origin: "resync", Unknown: true, Epoch: s.epoch})
}

func (s *syn) marker(kind, reason string, epoch uint64, from, to int64) {
	if kind == "sync.started" {
		s.epoch = epoch
	}
	s.seq++
	id := fmt.Sprintf("sync/ns/%d/%s", epoch, strings.TrimPrefix(kind, "sync."))
	s.h.Stream = append(s.h.Stream, Event{Seq: s.seq, Source: "cms", ID: id, MsgID: "cms/" + id, Stored: stored(s.seq), Kind: kind, Reason: reason, Epoch: epoch, From: from, To: to})
}

// final records the final LIST from the reference, and one checkpoint
// sample (at the first position, so never ahead) after everything so far.
func (s *syn) final() {
	s.h.Samples = []Sample{s.sample(s.seq, 100)}
	s.h.SampleAttempts, s.h.SampleErrors = 1, 0
	s.h.Final = nil
	last := map[string]Change{}
	var order []string
	for _, ch := range s.h.Reference {
		if _, ok := last[ch.UID]; !ok {
			order = append(order, ch.UID)
		}
		last[ch.UID] = ch
	}
	for _, uid := range order {
		if ch := last[uid]; ch.Type != Deleted {
			s.h.Final = append(s.h.Final, Object{Source: ch.Source, UID: uid, Namespace: ch.Namespace, Name: ch.Name, RV: ch.RV})
		}
	}
	s.h.FinalRV = s.rv
}

// clean is a run where every change is relayed once, in order.
func clean() *syn {
	s := newSyn()
	for _, op := range [][2]string{{"create", "a"}, {"create", "b"}, {"update", "a"}, {"update", "b"}, {"delete", "b"}, {"create", "c"}, {"update", "a"}} {
		s.publish(s.write(op[0], op[1]), "watch")
	}
	s.final()
	return s
}

func checks(r Report) map[string]int {
	out := map[string]int{}
	for _, f := range r.Failures {
		out[f.Check]++
	}
	return out
}

func wantOnly(t *testing.T, r Report, want map[string]int) {
	t.Helper()
	got := checks(r)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("failures %v, want %v\n%s", got, want, r.Summary())
	}
}

func TestCleanHistoryPasses(t *testing.T) {
	s := clean()
	r := Check(&s.h)
	wantOnly(t, r, map[string]int{})
	if r.ReferenceChanges != 7 || r.ObjectMessages != 7 || r.Duplicates != 0 || !r.OK() {
		t.Errorf("report %+v", r)
	}
}

func TestLossIsCaught(t *testing.T) {
	s := newSyn()
	s.publish(s.write("create", "a"), "watch")
	s.write("update", "a") // never relayed
	s.publish(s.write("update", "a"), "watch")
	s.final()
	r := Check(&s.h)
	wantOnly(t, r, map[string]int{"lost": 1})
	if r.Lost() != 1 {
		t.Errorf("Lost() = %d", r.Lost())
	}
}

func TestLostDeleteIsCaughtByLossAndFinalState(t *testing.T) {
	s := newSyn()
	s.publish(s.write("create", "a"), "watch")
	s.write("delete", "a")
	s.final()
	wantOnly(t, Check(&s.h), map[string]int{"lost": 1, "final": 1})
}

func TestReorderIsCaught(t *testing.T) {
	s := newSyn()
	a1 := s.write("create", "a")
	a2 := s.write("update", "a")
	s.publish(a2, "watch")
	s.publish(a1, "watch")
	s.final()
	// The stream's last word on a is also stale.
	wantOnly(t, Check(&s.h), map[string]int{"order": 1, "final": 1})
}

func TestPhantomWriteIsCaught(t *testing.T) {
	s := clean()
	// A message for a version that never existed.
	s.publish(Change{Source: "cms", UID: s.uid["a"], Namespace: "ns", Name: "a", RV: 999, Type: Modified}, "watch")
	// And one for an object that never existed.
	s.publish(Change{Source: "cms", UID: "ghost", Namespace: "ns", Name: "ghost", RV: 5, Type: Added}, "watch")
	r := Check(&s.h)
	if got := checks(r); got["phantom"] != 2 {
		t.Errorf("phantom findings %d, want 2\n%s", got["phantom"], r.Summary())
	}
}

func TestPhantomResyncDeleteIsCaught(t *testing.T) {
	s := clean()
	s.fault(FaultEtcdCompact, s.rv+1)
	// A "final state unknown" delete of an object that still exists.
	s.marker("sync.started", "expired", 2, s.rv, s.rv)
	s.unknownDelete(Change{Source: "cms", UID: s.uid["a"], Name: "a", RV: s.h.Reference[6].RV})
	s.marker("sync.completed", "expired", 2, s.rv, s.rv)
	wantOnly(t, Check(&s.h), map[string]int{"phantom": 1, "final": 1})
}

func TestStaleFinalStateIsCaught(t *testing.T) {
	s := clean()
	// The object changed after the run; the stream's last word is stale.
	s.write("update", "c")
	s.final()
	s.h.Reference = s.h.Reference[:len(s.h.Reference)-1] // and the reference missed it too
	s.h.Writes = s.h.Writes[:len(s.h.Writes)-1]
	wantOnly(t, Check(&s.h), map[string]int{"final": 1})
}

// A message id stored again inside the duplicate window: JetStream should
// have dropped it.
func TestDuplicatesInsideTheWindowFail(t *testing.T) {
	s := clean()
	s.publish(s.h.Reference[0], "watch")
	s.publish(s.h.Reference[0], "watch")
	r := Check(&s.h)
	if r.Duplicates != 2 {
		t.Errorf("duplicates %d, want 2", r.Duplicates)
	}
	// The old version arrived again after newer ones: a duplicate (not a
	// first occurrence out of order), inside the window.
	wantOnly(t, r, map[string]int{"duplicate": 2})
	// Without a recorded window or stored times, a duplicate counts as
	// inside it.
	s.h.DuplicateWindow = 0
	wantOnly(t, Check(&s.h), map[string]int{"duplicate": 2})
}

// A message without a Nats-Msg-Id cannot be deduplicated by JetStream:
// a replay of it is stored again under an id the duplicate rule would
// not match, so its absence is itself a failure.
func TestMessageWithoutMsgIDFails(t *testing.T) {
	s := clean()
	e := s.publish(s.h.Reference[0], "watch")
	s.h.Stream[len(s.h.Stream)-1].MsgID = ""
	r := Check(&s.h)
	wantOnly(t, r, map[string]int{"duplicate": 2}) // the replay, and its missing id
	if !strings.Contains(r.Summary(), fmt.Sprintf("seq %d", e.Seq)) || !strings.Contains(r.Summary(), "without a Nats-Msg-Id") {
		t.Errorf("the finding does not name the message: %s", r.Summary())
	}
}

// A replay stored after the duplicate window has passed is legitimate
// (at least once): counted, not failed.
func TestDuplicatesOutsideTheWindowAreCountedNotFailed(t *testing.T) {
	s := clean()
	e := s.publish(s.h.Reference[0], "watch")
	s.h.Stream[len(s.h.Stream)-1].Stored = s.h.Stream[0].Stored.Add(11 * time.Minute)
	r := Check(&s.h)
	if r.Duplicates != 1 {
		t.Errorf("duplicates %d, want 1 (seq %d)", r.Duplicates, e.Seq)
	}
	wantOnly(t, r, map[string]int{})
}

// gapRun: a, b, d published; relayd is away while a changes twice, b is
// deleted, c is created and e created and deleted; then a 410 resync
// publishes a's and c's state and b's delete (final state unknown).
func gapRun(withDelete, withState bool) (*syn, Change) {
	s := newSyn()
	a := s.write("create", "a")
	s.publish(a, "watch")
	b := s.write("create", "b")
	s.publish(b, "watch")
	from := s.rv
	s.write("update", "a")
	a3 := s.write("update", "a")
	s.write("delete", "b")
	c := s.write("create", "c")
	s.write("create", "e")
	s.write("delete", "e")
	to := s.rv
	s.fault(FaultEtcdCompact, to) // relayd was away; etcd compacted at to
	s.marker("sync.started", "expired", 2, from, to)
	if withState {
		s.publish(a3, "resync")
	}
	s.publish(c, "resync")
	if withDelete {
		s.unknownDelete(b)
	}
	s.marker("sync.completed", "expired", 2, from, to)
	s.publish(s.write("update", "c"), "watch")
	s.final()
	return s, b
}

func TestGapCoveredByResyncPasses(t *testing.T) {
	s, _ := gapRun(true, true)
	r := Check(&s.h)
	wantOnly(t, r, map[string]int{})
	if r.CoveredByResync != 4 || r.GapDeletes != 1 || r.Resyncs["expired"] != 1 {
		t.Errorf("covered %d (want 4: a's first gap version, b's delete, e's create and delete), gap deletes %d, resyncs %v", r.CoveredByResync, r.GapDeletes, r.Resyncs)
	}
}

func TestDeleteInGapNotReportedIsCaught(t *testing.T) {
	s, _ := gapRun(false, true)
	wantOnly(t, Check(&s.h), map[string]int{"gap-delete": 1, "final": 1})
}

func TestGapStateMissingIsCaught(t *testing.T) {
	s, _ := gapRun(true, false)
	r := Check(&s.h)
	// a's two gap versions are each reported, and a's last word is stale.
	wantOnly(t, r, map[string]int{"gap-state": 2, "final": 1})
}

func TestChangeOutsideTheResyncRangeIsLost(t *testing.T) {
	s, _ := gapRun(true, true)
	// Shrink the resync's range: the first gap change is no longer covered.
	for i := range s.h.Stream {
		if strings.HasPrefix(s.h.Stream[i].Kind, "sync.") {
			s.h.Stream[i].From++
		}
	}
	wantOnly(t, Check(&s.h), map[string]int{"lost": 1})
}

func TestCheckpointAheadIsCaught(t *testing.T) {
	s := clean()
	// Sampled while the stream held the first 3 messages: a checkpoint at
	// the third change is fine, one at the fourth is ahead.
	s.h.Samples = []Sample{
		{Source: "cms", CheckpointRV: s.h.Reference[2].RV, StreamLastSeq: 3},
		{Source: "cms", CheckpointRV: s.h.Reference[3].RV, StreamLastSeq: 3},
	}
	r := Check(&s.h)
	wantOnly(t, r, map[string]int{"checkpoint-ahead": 1})
	if r.Samples != 2 {
		t.Errorf("samples %d", r.Samples)
	}
}

// A sample whose stream info is behind what JetStream had stored when the
// checkpoint was read (a stream leader just elected after a quorum loss
// answers with the state it has applied) is judged by the stored times: a
// checkpoint at a change stored before the read is not ahead; one at a
// change stored after it still is.
func TestCheckpointJudgedByStoredTimesWhenTheStreamInfoLags(t *testing.T) {
	s := clean()
	s.h.Samples = []Sample{
		{Source: "cms", Read: stored(4), CheckpointRV: s.h.Reference[3].RV, StreamLastSeq: 2},
		{Source: "cms", Read: stored(4).Add(-time.Millisecond), CheckpointRV: s.h.Reference[3].RV, StreamLastSeq: 2},
	}
	r := Check(&s.h)
	wantOnly(t, r, map[string]int{"checkpoint-ahead": 1})
	if f := r.Failures[0]; !strings.Contains(f.Detail, "with the stream at seq 2") {
		t.Errorf("finding %v, want the second sample's", f)
	}
}

func TestCheckpointAheadOfAResyncIsCaught(t *testing.T) {
	s, _ := gapRun(true, true)
	var started, completed uint64
	for _, e := range s.h.Stream {
		switch e.Kind {
		case "sync.started":
			started = e.Seq
		case "sync.completed":
			completed = e.Seq
		}
	}
	to := s.h.Stream[completed-1].To
	// At the resync's position once everything is stored: fine. Right
	// after sync.started, before the resync's objects: ahead.
	s.h.Samples = append(s.h.Samples, s.sample(completed, to), s.sample(started, to))
	wantOnly(t, Check(&s.h), map[string]int{"checkpoint-ahead": 1})
}

func TestIncompleteReferenceIsCaught(t *testing.T) {
	s := clean()
	s.h.Reference = s.h.Reference[1:] // the reference missed a's creation
	r := Check(&s.h)
	if checks(r)["reference"] != 1 {
		t.Errorf("reference findings: %v", r.Summary())
	}
}

func TestSaveLoadRoundTrip(t *testing.T) {
	s, _ := gapRun(false, true)
	p := filepath.Join(t.TempDir(), "h.json")
	if err := s.h.Save(p); err != nil {
		t.Fatal(err)
	}
	h, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	a, b := Check(&s.h), Check(h)
	if a.Summary() != b.Summary() || a.OK() {
		t.Errorf("re-check differs or passes:\n%s\n%s", a.Summary(), b.Summary())
	}
}

func TestRedundantResyncDeleteIsCountedNotFailed(t *testing.T) {
	s := newSyn()
	a := s.write("create", "a")
	s.publish(a, "watch")
	s.publish(s.write("delete", "a"), "watch")
	// relayd crashed before its index recorded the delete: the next
	// relist reports it again, with the last version it had indexed.
	s.fault(FaultEtcdCompact, s.rv)
	s.marker("sync.started", "expired", 2, a.RV, s.rv)
	s.unknownDelete(a)
	s.marker("sync.completed", "expired", 2, a.RV, s.rv)
	s.final()
	r := Check(&s.h)
	wantOnly(t, r, map[string]int{})
	if r.RedundantDeletes != 1 {
		t.Errorf("redundant deletes %d, want 1", r.RedundantDeletes)
	}
}

// relistRun: a clean run whose relayd relisted (reason) from the position
// after its first three changes, after faults were injected; the relist
// finds every object unchanged.
func relistRun(reason string, faults func(s *syn, from int64)) *syn {
	s := newSyn()
	s.publish(s.write("create", "a"), "watch")
	s.publish(s.write("create", "b"), "watch")
	s.publish(s.write("update", "a"), "watch")
	from := s.rv
	faults(s, from)
	s.marker("sync.started", reason, 2, from, from)
	s.marker("sync.completed", reason, 2, from, from)
	s.publish(s.write("update", "b"), "watch")
	s.final()
	return s
}

func TestRelistExplainedByAnEarlierFaultPasses(t *testing.T) {
	for _, c := range []struct{ reason, fault string }{
		{"expired", FaultEtcdCompact},
		{"expired", FaultAPIServerRestart},
		{"expired", FaultAPIServerKill9},
		{"expired", FaultEtcdRestart},
		{"no-checkpoint", FaultCheckpointDeleted},
		{"index-lost", FaultBucketDeleted},
	} {
		s := relistRun(c.reason, func(s *syn, from int64) { s.fault(c.fault, from+1) })
		r := Check(&s.h)
		wantOnly(t, r, map[string]int{})
		if want := c.reason + " by " + c.fault; r.Relists[want] != 1 {
			t.Errorf("%s after %s: relists %v, want %q once", c.reason, c.fault, r.Relists, want)
		}
	}
}

// A kill -9 (or a failpoint crash, a NATS restart, a network fault) with a
// current checkpoint and index must resume without a relist.
func TestRelistAfterOnlyAKillFails(t *testing.T) {
	for _, kind := range []string{"kill-9", "kill-9-down", "nats-stop", "proxy-reset", "sigstop"} {
		s := relistRun("expired", func(s *syn, from int64) { s.fault(kind, 0) })
		r := Check(&s.h)
		wantOnly(t, r, map[string]int{"relist": 1})
		if f := r.Failures; len(f) == 1 && !strings.Contains(f[0].Detail, "explained by no fault") {
			t.Errorf("%s: finding does not say why: %s", kind, f[0])
		}
	}
}

func TestRelistWithTheWrongFaultFails(t *testing.T) {
	// A fault that always causes a relist of its reason and was followed
	// by none also lacks its evidence.
	for _, c := range []struct {
		reason, fault string
		evidence      int
	}{
		{"expired", FaultCheckpointDeleted, 1},
		{"expired", FaultBucketDeleted, 1},
		{"no-checkpoint", FaultEtcdCompact, 1},
		{"index-lost", FaultAPIServerKill9, 0},
		{"closed", FaultAPIServerKill9, 0}, // not a reason relayd relists for
	} {
		s := relistRun(c.reason, func(s *syn, from int64) { s.fault(c.fault, from+1) })
		want := map[string]int{"relist": 1}
		if c.evidence > 0 {
			want["evidence"] = c.evidence
		}
		wantOnly(t, Check(&s.h), want)
	}
}

// The fault must come before the relist, and must have ended history after
// the relist's position.
func TestRelistBeforeTheFaultOrFromAfterItFails(t *testing.T) {
	s := relistRun("expired", func(s *syn, from int64) {})
	s.h.Faults = []Fault{{At: s.h.Stream[len(s.h.Stream)-1].Stored.Add(time.Millisecond), Kind: FaultEtcdCompact, Rev: s.rv + 1}}
	wantOnly(t, Check(&s.h), map[string]int{"relist": 1, "evidence": 1}) // and the compaction caused no relist

	// Compacted (or the watch cache restarted) at or before the position
	// the relist started from: that position had not expired.
	s = relistRun("expired", func(s *syn, from int64) { s.fault(FaultEtcdCompact, from) })
	wantOnly(t, Check(&s.h), map[string]int{"relist": 1, "evidence": 1})
	s = relistRun("expired", func(s *syn, from int64) { s.fault(FaultAPIServerKill9, from-1) })
	wantOnly(t, Check(&s.h), map[string]int{"relist": 1})
}

func TestInitialListOnlyAtTheFirstStart(t *testing.T) {
	// The first start: an initial list before any watch event passes.
	s := newSyn()
	s.marker("sync.started", "initial", 1, 0, s.rv)
	s.marker("sync.completed", "initial", 1, 0, s.rv)
	s.publish(s.write("create", "a"), "watch")
	s.final()
	r := Check(&s.h)
	wantOnly(t, r, map[string]int{})
	if r.Relists["initial by first start"] != 1 {
		t.Errorf("relists %v", r.Relists)
	}
	// A second initial list later (the checkpoint was lost without a
	// fault saying so) fails.
	s.marker("sync.started", "initial", 2, 0, s.rv)
	s.marker("sync.completed", "initial", 2, 0, s.rv)
	wantOnly(t, Check(&s.h), map[string]int{"relist": 1})
}

func TestUnplannedExitFails(t *testing.T) {
	s := clean()
	s.h.Exits = []Exit{
		{At: t0, Status: "signal: killed", Killed: true, Planned: true},                                                                                  // kill -9 by the run
		{At: t0, Status: "signal: killed", Killed: true, Failpoints: "sink-after-ack=kill,n=7", FailpointKill: "failpoint sink-after-ack: kill (hit 7)"}, // armed failpoint
		{At: t0, Status: "exit status 2", Failpoints: "sink-after-ack=kill,n=7", LogTail: "panic: runtime error: index out of range [3] with length 3"},
		{At: t0, Status: "exit status 1", LogTail: `{"level":"error","msg":"relayd stopped","error":"index consistency check failed for cms/ns: ..."}`},
		{At: t0, Status: "signal: killed", Killed: true, LogTail: "(killed by someone else)"},                         // a SIGKILL the run did not send
		{At: t0, Status: "signal: killed", Killed: true, Failpoints: "sink-after-ack=kill,n=7", LogTail: "(no line)"}, // armed, but did not fire
	}
	r := Check(&s.h)
	wantOnly(t, r, map[string]int{"exit": 4})
	if r.Exits != 6 || r.UnexplainedExits != 4 {
		t.Errorf("exits %d, unexplained %d; want 6, 4", r.Exits, r.UnexplainedExits)
	}
	for _, want := range []string{"panic: runtime error", "index consistency check failed", "exit status 2", "no failpoint armed"} {
		if !strings.Contains(r.Summary(), want) {
			t.Errorf("the failures do not show %q:\n%s", want, r.Summary())
		}
	}
}

func TestSamplingIsRequired(t *testing.T) {
	s := clean()
	wantOnly(t, Check(&s.h), map[string]int{})

	// No sample of a source: checkpoint-ahead checked nothing.
	s.h.Sources = []string{"cms", "widgets"}
	r := Check(&s.h)
	wantOnly(t, r, map[string]int{"samples": 1, "evidence": 2}) // nor a change or an event of it
	if !strings.Contains(r.Summary(), "widgets") {
		t.Errorf("the finding does not name the source:\n%s", r.Summary())
	}
	s.h.Sources = []string{"cms"}

	// More than half the tries the servers answered failed (a skipped key
	// counts as failed); tries while a server was down are excused.
	for _, c := range []struct {
		errs, unavailable int
		fails             bool
	}{
		{6, 0, true}, {5, 0, false}, // of 10 answered
		{7, 3, true},                 // 4 of 7 answered
		{7, 6, false}, {7, 7, false}, // 1 of 4 answered; none of 3
		{9, 9, false}, {9, 7, true}, // none of 1; 2 of 3 answered
	} {
		s.h.SampleAttempts, s.h.SampleErrors, s.h.SampleUnavailable = 10, c.errs, c.unavailable
		want := map[string]int{}
		if c.fails {
			want["samples"] = 1
		}
		wantOnly(t, Check(&s.h), want)
	}
	s.h.SampleAttempts, s.h.SampleErrors, s.h.SampleUnavailable = 10, 5, 0

	// A fault after the last sample: nothing was sampled after it.
	at := stored(s.seq).Add(time.Second)
	s.h.Faults = append(s.h.Faults, Fault{At: at, Kind: "kill-9"})
	wantOnly(t, Check(&s.h), map[string]int{"samples": 1})
	s.h.Samples = append(s.h.Samples, Sample{At: at.Add(time.Millisecond), Source: "cms", CheckpointRV: 100, StreamLastSeq: s.seq})
	wantOnly(t, Check(&s.h), map[string]int{})
	// Errors injecting a fault are not faults.
	s.h.Faults = append(s.h.Faults, Fault{At: stored(s.seq).Add(time.Second), Kind: "error"})
	wantOnly(t, Check(&s.h), map[string]int{})

	// A history recorded before tries were counted still loads and checks
	// (its failure rate is unknown); one without samples fails.
	p := filepath.Join(t.TempDir(), "h.json")
	s.h.SampleAttempts, s.h.SampleErrors, s.h.SampleUnavailable = 0, 0, 0
	if err := s.h.Save(p); err != nil {
		t.Fatal(err)
	}
	h, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	wantOnly(t, Check(h), map[string]int{})
	h.Samples = nil
	wantOnly(t, Check(h), map[string]int{"samples": 2, "evidence": 1}) // none of cms, none after the kill, none at all
}

// wrongFrom: a's second version is lost by the watch (before the position
// relayd had when it relisted); a resync's markers claim a range that
// starts before it.
func wrongFrom(startedFrom, completedFrom int64) *syn {
	s := newSyn()
	s.publish(s.write("create", "a"), "watch")
	s.h.Samples = []Sample{s.sample(s.seq, s.rv)} // the checkpoint reached a's creation
	s.write("update", "a")                        // lost: relayd's watch skipped it
	s.publish(s.write("create", "b"), "watch")
	from := s.rv
	a4 := s.write("update", "a")
	s.fault(FaultEtcdCompact, s.rv)
	s.marker("sync.started", "expired", 2, from+startedFrom, s.rv)
	s.publish(a4, "resync")
	s.marker("sync.completed", "expired", 2, from+completedFrom, s.rv)
	samples := s.h.Samples
	s.final()
	s.h.Samples = append(samples, s.h.Samples...)
	return s
}

func TestResyncFromMustBeRelaydsPosition(t *testing.T) {
	wantOnly(t, Check(&wrongFrom(0, 0).h), map[string]int{"lost": 1})
	// sync.completed claims an older position than its sync.started: it
	// would forgive the loss.
	wantOnly(t, Check(&wrongFrom(0, -2).h), map[string]int{"bracket": 1, "lost": 1})
	// Both markers claim a position before a checkpoint read before the
	// relist: relayd cannot have been there.
	r := Check(&wrongFrom(-3, -3).h)
	wantOnly(t, r, map[string]int{"bracket": 1, "lost": 1})
	if !strings.Contains(r.Summary(), "fromResourceVersion 100 is before the checkpoint 101") {
		t.Errorf("the finding does not say why:\n%s", r.Summary())
	}
	// A position is required, except for initial and no-checkpoint lists.
	s := relistRun("expired", func(s *syn, from int64) { s.fault(FaultEtcdCompact, from+1) })
	for i := range s.h.Stream {
		s.h.Stream[i].From = 0
	}
	wantOnly(t, Check(&s.h), map[string]int{"bracket": 1})
	s = relistRun("no-checkpoint", func(s *syn, from int64) { s.fault(FaultCheckpointDeleted, 0) })
	for i := range s.h.Stream {
		s.h.Stream[i].From = 0
	}
	wantOnly(t, Check(&s.h), map[string]int{})
}

func TestResyncEventsMustBeBetweenTheirMarkers(t *testing.T) {
	s, _ := gapRun(true, true)
	wantOnly(t, Check(&s.h), map[string]int{})
	// c's resync event stored after sync.completed: the gap is not valid,
	// so nothing it would cover is covered.
	for i, e := range s.h.Stream {
		if e.Kind == "sync.completed" {
			s.h.Stream[i].Seq, s.h.Stream[i-2].Seq = s.h.Stream[i-2].Seq, e.Seq
		}
	}
	// One finding per misplaced event, one for the list.
	wantOnly(t, Check(&s.h), map[string]int{"bracket": 3, "lost": 4})
	// A resync event of an epoch that has no markers.
	s, _ = gapRun(true, true)
	for i, e := range s.h.Stream {
		if e.Name == "c" && e.Origin == "resync" {
			s.h.Stream[i].Epoch = 7
		}
	}
	wantOnly(t, Check(&s.h), map[string]int{"bracket": 1})
}

// A change is covered only by a resync whose list published the object's
// state between its markers.
func TestGapStateAfterTheResyncIsNotCovering(t *testing.T) {
	s, _ := gapRun(true, false)
	a3 := s.h.Reference[3]
	s.publish(a3, "watch") // after sync.completed, and after c's update
	s.final()
	// Before: a's first gap version (covered) counted, the state being on
	// the stream somewhere. Now the resync did not publish it.
	wantOnly(t, Check(&s.h), map[string]int{"gap-state": 1})
}

// abortedRun: a relist from the position after the first three changes
// (after an etcd compaction) publishes a's state, is aborted (relayd
// crashes at crash, else its list fails), and is redone from the same
// position in a new epoch unless redo is false.
func abortedRun(crash, redo bool) *syn {
	s := newSyn()
	s.publish(s.write("create", "a"), "watch")
	s.publish(s.write("create", "b"), "watch")
	from := s.rv
	s.write("update", "a") // inside the gap: a's state is the next one
	a := s.write("update", "a")
	b := s.write("update", "b")
	s.fault(FaultEtcdCompact, s.rv)
	s.marker("sync.started", "expired", 2, from, s.rv)
	s.publish(a, "resync")
	if crash {
		s.h.Exits = append(s.h.Exits, Exit{At: stored(s.seq).Add(time.Millisecond), Status: "signal: killed", Killed: true, Planned: true})
	}
	if redo {
		s.marker("sync.started", "expired", 3, from, s.rv) // a unchanged
		s.publish(b, "resync")
		s.marker("sync.completed", "expired", 3, from, s.rv)
	}
	s.final()
	return s
}

func TestEveryListCompletes(t *testing.T) {
	for _, crash := range []bool{false, true} {
		r := Check(&abortedRun(crash, true).h)
		wantOnly(t, r, map[string]int{})
		// a's first gap version is covered by the redone list: a's state
		// was published by the aborted one.
		if r.RedoneLists != 1 || r.Relists["expired by etcd-compact"] != 1 || r.CoveredByResync != 1 {
			t.Errorf("crash %v: redone %d, relists %v, covered %d", crash, r.RedoneLists, r.Relists, r.CoveredByResync)
		}
		// Never redone: a gap without its sync.completed.
		r = Check(&abortedRun(crash, false).h)
		wantOnly(t, r, map[string]int{"bracket": 1, "lost": 2, "final": 1})
		if !strings.Contains(r.Summary(), "never completed") {
			t.Errorf("the finding does not say why:\n%s", r.Summary())
		}
	}
	// Redone from another position: not the same list.
	s := abortedRun(true, true)
	for i, e := range s.h.Stream {
		if e.Epoch == 3 && strings.HasPrefix(e.Kind, "sync.") {
			s.h.Stream[i].From++
		}
	}
	wantOnly(t, Check(&s.h), map[string]int{"bracket": 1, "lost": 1})
	// sync.completed without its sync.started.
	s = abortedRun(true, true)
	for i, e := range s.h.Stream {
		if e.Epoch == 3 && e.Kind == "sync.started" {
			s.h.Stream = append(s.h.Stream[:i], s.h.Stream[i+1:]...)
			break
		}
	}
	r := Check(&s.h)
	if checks(r)["bracket"] == 0 {
		t.Errorf("no bracket finding:\n%s", r.Summary())
	}
}

// relistAgain: relistRun, then n more relists from the same position, the
// first after crashes crashes of relayd (one before each relist).
func relistAgain(reason, fault string, n, crashes int) *syn {
	s := relistRun(reason, func(s *syn, from int64) { s.fault(fault, from+1) })
	from := s.h.Stream[3].From
	for i := range n {
		if i < crashes {
			s.h.Exits = append(s.h.Exits, Exit{At: stored(s.seq).Add(time.Millisecond), Status: "signal: killed", Killed: true, Planned: true})
		}
		ep := uint64(3 + i)
		s.marker("sync.started", reason, ep, from, from)
		s.marker("sync.completed", reason, ep, from, from)
	}
	s.final()
	return s
}

func TestOneFaultExplainsOneRelistPerSource(t *testing.T) {
	for _, c := range []struct{ reason, fault string }{
		{"expired", FaultEtcdCompact},
		{"expired", FaultAPIServerRestart},
		{"no-checkpoint", FaultCheckpointDeleted},
		{"index-lost", FaultBucketDeleted},
	} {
		// A loop: relisting again and again from the same position.
		r := Check(&relistAgain(c.reason, c.fault, 2, 0).h)
		wantOnly(t, r, map[string]int{"relist": 2})
		if !strings.Contains(r.Summary(), "relist loop") {
			t.Errorf("%s: the finding does not say why:\n%s", c.fault, r.Summary())
		}
		// A crash before the list's checkpoint was written: redone once.
		r = Check(&relistAgain(c.reason, c.fault, 1, 1).h)
		wantOnly(t, r, map[string]int{})
		if want := c.reason + " by " + c.fault + " again after a crash"; r.Relists[want] != 1 {
			t.Errorf("relists %v, want %q", r.Relists, want)
		}
		// One crash allows one more, not two.
		wantOnly(t, Check(&relistAgain(c.reason, c.fault, 2, 1).h), map[string]int{"relist": 1})
		wantOnly(t, Check(&relistAgain(c.reason, c.fault, 2, 2).h), map[string]int{})
	}
	// Two faults explain two relists.
	s := relistRun("expired", func(s *syn, from int64) { s.fault(FaultEtcdCompact, from+1); s.fault(FaultEtcdRestart, from+1) })
	s.marker("sync.started", "expired", 3, s.h.Stream[3].From, s.rv)
	s.marker("sync.completed", "expired", 3, s.h.Stream[3].From, s.rv)
	s.final()
	wantOnly(t, Check(&s.h), map[string]int{})
}

// A list event stored before its epoch's sync.started is outside the
// list's markers: a consumer reading the stream would take it for
// something before the gap. The list is then no valid gap.
func TestListEventBeforeItsSyncStartedFails(t *testing.T) {
	s, _ := gapRun(true, true)
	for i, e := range s.h.Stream {
		if e.Kind == "sync.started" {
			// sync.started and the list's first event (a's state) trade
			// places.
			s.h.Stream[i].Seq, s.h.Stream[i+1].Seq = s.h.Stream[i+1].Seq, e.Seq
			s.h.Stream[i].Stored, s.h.Stream[i+1].Stored = s.h.Stream[i+1].Stored, e.Stored
			break
		}
	}
	r := Check(&s.h)
	// The event, and the list it makes invalid (which then covers none of
	// the four changes it would).
	wantOnly(t, r, map[string]int{"bracket": 2, "lost": 4})
	if !strings.Contains(r.Summary(), "(origin resync, epoch 2, seq 3) before its sync.started (seq 4)") {
		t.Errorf("the finding does not say why:\n%s", r.Summary())
	}
}

// A sync.completed stored before its sync.started brackets nothing.
func TestSyncCompletedBeforeSyncStartedFails(t *testing.T) {
	s := relistRun("expired", func(s *syn, from int64) { s.fault(FaultEtcdCompact, from+1) })
	wantOnly(t, Check(&s.h), map[string]int{})
	for i, e := range s.h.Stream {
		if e.Kind == "sync.started" {
			s.h.Stream[i].Seq, s.h.Stream[i+1].Seq = s.h.Stream[i+1].Seq, e.Seq
			break
		}
	}
	r := Check(&s.h)
	wantOnly(t, r, map[string]int{"bracket": 1})
	if !strings.Contains(r.Summary(), "sync.completed (seq 4) before its sync.started (seq 5)") {
		t.Errorf("the finding does not say why:\n%s", r.Summary())
	}
}

// The position is judged against the checkpoint as written (every write
// of the ConfigMap), not only the nearest sample: here no sample was read
// between the checkpoint's write and the relist.
func TestResyncFromJudgedAgainstTheCheckpointAsWritten(t *testing.T) {
	s := wrongFrom(-3, -3)
	s.h.Samples = s.h.Samples[1:] // only the final sample: the write was never sampled
	// Unseen, the list from before the checkpoint covers (forgives) the
	// change relayd's watch skipped.
	none := map[string]int{}
	wantOnly(t, Check(&s.h), none)
	written := CheckpointWrite{Rev: 500, Seen: stored(1).Add(time.Millisecond), Source: "cms", CheckpointRV: 101}
	s.h.Checkpoints = []CheckpointWrite{written}
	r := Check(&s.h)
	wantOnly(t, r, map[string]int{"bracket": 1, "lost": 1})
	if !strings.Contains(r.Summary(), "fromResourceVersion 100 is before the checkpoint 101 written at revision 500") {
		t.Errorf("the finding does not say why:\n%s", r.Summary())
	}
	// The last write seen before sync.started counts: a later write that
	// removed the key (a deleted checkpoint) bounds nothing, …
	removed := written
	removed.Rev, removed.CheckpointRV = 501, 0
	s.h.Checkpoints = []CheckpointWrite{written, removed}
	wantOnly(t, Check(&s.h), none)
	// … one seen after sync.started was stored neither, …
	late := written
	late.Seen = s.h.Stream[len(s.h.Stream)-1].Stored.Add(time.Second)
	s.h.Checkpoints = []CheckpointWrite{late}
	wantOnly(t, Check(&s.h), none)
	// … nor one of another source.
	other := written
	other.Source = "widgets"
	s.h.Checkpoints = []CheckpointWrite{other}
	wantOnly(t, Check(&s.h), none)
	// At the position, it passes.
	s = wrongFrom(0, 0)
	s.h.Checkpoints = []CheckpointWrite{{Rev: 500, Seen: stored(2), Source: "cms", CheckpointRV: s.h.Stream[2].RV - 1}}
	wantOnly(t, Check(&s.h), map[string]int{"lost": 1})
}

// config-changed and requested relists are explained by their faults of
// the same source, and only by them.
func TestConfigChangedAndRequestedRelists(t *testing.T) {
	for _, c := range []struct{ reason, fault string }{
		{"config-changed", FaultConfigChanged},
		{"requested", FaultResyncRequested},
	} {
		s := relistRun(c.reason, func(s *syn, from int64) {
			s.fault(c.fault, 0)
			s.h.Faults[len(s.h.Faults)-1].Source = "cms"
		})
		r := Check(&s.h)
		wantOnly(t, r, map[string]int{})
		if want := c.reason + " by " + c.fault; r.Relists[want] != 1 {
			t.Errorf("relists %v, want %q once", r.Relists, want)
		}
		// The fault of another source explains nothing (and its own
		// relist is missing).
		s.h.Faults[0].Source = "widgets"
		wantOnly(t, Check(&s.h), map[string]int{"relist": 1, "evidence": 1})
		// Nor does another fault.
		s = relistRun(c.reason, func(s *syn, from int64) { s.fault(FaultEtcdCompact, from+1) })
		wantOnly(t, Check(&s.h), map[string]int{"relist": 1, "evidence": 1})
	}
}

// A requested list aborted by a crash is not redone (the request died
// with the process); any other aborted list still must be.
func TestAbortedRequestedListNeedNotBeRedone(t *testing.T) {
	s := newSyn()
	s.publish(s.write("create", "a"), "watch")
	from := s.rv
	s.fault(FaultResyncRequested, 0)
	s.h.Faults[0].Source = "cms"
	s.marker("sync.started", "requested", 2, from, from)
	s.h.Exits = []Exit{{At: stored(s.seq).Add(time.Millisecond), Status: "signal: killed", Killed: true, Planned: true}}
	s.publish(s.write("update", "a"), "watch")
	s.final()
	wantOnly(t, Check(&s.h), map[string]int{})
	for i := range s.h.Stream {
		if s.h.Stream[i].Kind == "sync.started" {
			s.h.Stream[i].Reason = "config-changed"
		}
	}
	s.h.Faults[0].Kind = FaultConfigChanged
	wantOnly(t, Check(&s.h), map[string]int{"bracket": 1})
}

// A full requested list republishes every object in scope at its
// toResourceVersion, the unchanged ones too.
func TestFullResyncRepublishesEveryObject(t *testing.T) {
	full := func(skip string) *syn {
		s := newSyn()
		a := s.write("create", "a")
		s.publish(a, "watch")
		b := s.write("create", "b")
		s.publish(b, "watch")
		c := s.write("create", "c")
		s.publish(c, "watch")
		s.publish(s.write("delete", "c"), "watch")
		from := s.rv
		s.fault(FaultResyncRequested, 0)
		s.h.Faults[0].Source = "cms"
		s.marker("sync.started", "requested", 2, from, from)
		s.h.Stream[len(s.h.Stream)-1].Full = true
		for _, ch := range []Change{a, b} {
			if ch.Name != skip {
				e := s.publish(ch, "resync")
				s.h.Stream[len(s.h.Stream)-1].ID = e.ID + "/full/2"
				s.h.Stream[len(s.h.Stream)-1].MsgID = e.MsgID + "/full/2"
				s.h.Stream[len(s.h.Stream)-1].Type = Modified
			}
		}
		s.marker("sync.completed", "requested", 2, from, from)
		s.h.Stream[len(s.h.Stream)-1].Full = true
		s.final()
		return s
	}
	r := Check(&full("").h)
	wantOnly(t, r, map[string]int{})
	if r.FullResyncs != 1 || r.FullRepublished != 2 {
		t.Errorf("full resyncs %d, republished %d; want 1, 2 (a and b; c was deleted)", r.FullResyncs, r.FullRepublished)
	}
	r = Check(&full("b").h)
	wantOnly(t, r, map[string]int{"full": 1})
	if !strings.Contains(r.Summary(), "did not republish the object") {
		t.Errorf("the finding does not say why:\n%s", r.Summary())
	}
	// Without --full the unchanged objects need not be published.
	s := full("b")
	for i := range s.h.Stream {
		s.h.Stream[i].Full = false
	}
	wantOnly(t, Check(&s.h), map[string]int{})
}
