package history

import (
	"strings"
	"testing"
)

// wantEvidence checks that h fails exactly the evidence rule, n times,
// with findings that say what lacks (every one of want).
func wantEvidence(t *testing.T, name string, h *History, n int, want ...string) {
	t.Helper()
	r := Check(h)
	if got := checks(r); got["evidence"] != n || len(got) != 1 && n > 0 {
		t.Errorf("%s: failures %v, want evidence ×%d only\n%s", name, got, n, r.Summary())
	}
	for _, w := range want {
		if !strings.Contains(r.Summary(), w) {
			t.Errorf("%s: the findings do not say %q:\n%s", name, w, r.Summary())
		}
	}
}

func TestEmptyHistoryFails(t *testing.T) {
	r := Check(&History{})
	if r.OK() {
		t.Fatalf("an empty history passes: %s", r.Summary())
	}
	wantOnly(t, r, map[string]int{"evidence": 4})
	for _, w := range []string{"names no sources", "no reference changes", "the stream is empty", "no checkpoint samples"} {
		if !strings.Contains(r.Summary(), w) {
			t.Errorf("the findings do not say %q:\n%s", w, r.Summary())
		}
	}
	// Sources, but nothing else: each source lacks its changes and events
	// (and its samples).
	r = Check(&History{Sources: []string{"cms"}})
	wantOnly(t, r, map[string]int{"evidence": 5, "samples": 1})
}

func TestEverySourceHasChangesAndEvents(t *testing.T) {
	s := clean()
	s.h.Sources = append(s.h.Sources, "widgets")
	s.h.Samples = append(s.h.Samples, Sample{At: s.h.Samples[0].At, Read: s.h.Samples[0].Read, Source: "widgets", CheckpointRV: 1, StreamLastSeq: s.seq})
	wantEvidence(t, "a source nobody wrote", &s.h, 2, "no reference change of the source", "no object event of the source on the stream")
}

// Each fault of a kind that always causes its relist must be followed by
// one it explains; checkpoint-deleted (a running relayd may write the key
// again before it is killed) needs one per run.
func TestFaultsCauseTheirRelists(t *testing.T) {
	for _, c := range []struct{ reason, fault string }{
		{"expired", FaultEtcdCompact},
		{"index-lost", FaultBucketDeleted},
		{"no-checkpoint", FaultCheckpointDeleted},
	} {
		// The fault's relist seen: passes (and one without any relist
		// fails).
		s := relistRun(c.reason, func(s *syn, from int64) { s.fault(c.fault, from+1) })
		wantEvidence(t, c.fault+" relisted", &s.h, 0)
		s = relistRun(c.reason, func(s *syn, from int64) { s.fault(c.fault, from+1) })
		s.h.Stream = s.h.Stream[:3]
		s.h.Stream = append(s.h.Stream, Event{Seq: 10, Source: "cms", ID: "x", MsgID: "cms/x", Stored: stored(10), Kind: "object", Type: Modified,
			UID: s.uid["b"], Namespace: "ns", Name: "b", RV: s.rv, Origin: "watch", Epoch: 1})
		wantEvidence(t, c.fault+" without a relist", &s.h, 1, c.fault, "no relist (reason "+c.reason+")")

		// A second fault of the kind after the relist, followed by none.
		s = relistRun(c.reason, func(s *syn, from int64) { s.fault(c.fault, from+1) })
		s.fault(c.fault, s.rv+1)
		s.final()
		n := 1
		if c.fault == FaultCheckpointDeleted {
			n = 0 // one of them caused its relist
		}
		wantEvidence(t, "a second "+c.fault+" without a relist", &s.h, n)
	}
	// A restart of the apiserver's watch cache need not cause a 410.
	s := clean()
	s.fault(FaultAPIServerRestart, s.rv+1)
	s.final()
	wantEvidence(t, "apiserver-restart without a relist", &s.h, 0)
	// A relist from a position the compaction did not expire is not its
	// evidence.
	s = relistRun("expired", func(s *syn, from int64) {
		s.fault(FaultAPIServerRestart, from+1)
		s.fault(FaultEtcdCompact, from)
	})
	wantEvidence(t, "a compaction older than the relist's position", &s.h, 1, "etcd-compact")
}

func TestFilteredSourceShowsObjectsEnteringAndLeaving(t *testing.T) {
	s := scopeRun("", "")
	wantEvidence(t, "entered and left", &s.h, 0)

	// Objects created in scope and deleted: nothing entered or left.
	s = filtering()
	s.scoped(s.tier("create", "a", "gold"), Added, "", "watch")
	s.scoped(s.tier("update", "a", "gold"), Modified, "", "watch")
	s.scoped(s.tier("delete", "a", ""), Deleted, "", "watch")
	s.final()
	wantEvidence(t, "never entered nor left", &s.h, 1, "0 changes made an object enter its filter's scope and 0 leave it")

	// Entered only.
	s = filtering()
	s.tier("create", "a", "")
	s.scoped(s.tier("update", "a", "gold"), Added, ScopeEntered, "watch")
	s.final()
	wantEvidence(t, "entered only", &s.h, 1, "1 changes made an object enter its filter's scope and 0 leave it")

	// Left only.
	s = filtering()
	s.scoped(s.tier("create", "a", "gold"), Added, "", "watch")
	s.scoped(s.tier("update", "a", "silver"), Deleted, ScopeLeft, "watch")
	s.final()
	wantEvidence(t, "left only", &s.h, 1, "0 changes made an object enter its filter's scope and 1 leave it")
}

func TestShapedSourceIsProbed(t *testing.T) {
	for _, sh := range []Shaping{{Drop: []string{"data.secret"}}, {Payload: "metadata"}} {
		s := newSyn()
		s.h.Shaping = map[string]Shaping{"cms": sh}
		s.publish(s.write("create", "a"), "watch")
		s.final()
		s.h.Stream[0].Content = &Content{Payload: "metadata", Members: []string{"apiVersion", "kind", "metadata"}}
		wantEvidence(t, "probed", &s.h, 0)
		// The reader probed nothing of the source (its messages lack the
		// content; the shaping rule fails each, evidence the source).
		s.h.Stream[0].Content = nil
		r := Check(&s.h)
		if got := checks(r); got["evidence"] != 1 || !strings.Contains(r.Summary(), "no message of it was probed") {
			t.Errorf("%+v not probed: %v\n%s", sh, got, r.Summary())
		}
	}
	// ignoreChanges alone is not probed: nothing required.
	s := ignoring()
	s.write("create", "a")
	s.publish(s.with("x"), "watch")
	s.final()
	wantEvidence(t, "ignoreChanges", &s.h, 0)
}

func TestUnencodableObjectsAreFlagged(t *testing.T) {
	s := unencodableRun(nil, nil)
	wantEvidence(t, "flagged", &s.h, 0)
	for i := range s.h.Stream {
		s.h.Stream[i].Name = "other"
	}
	r := Check(&s.h)
	if got := checks(r); got["evidence"] != 1 || !strings.Contains(r.Summary(), "no event flagged relaydunencodable") {
		t.Errorf("no flagged event: %v\n%s", got, r.Summary())
	}
}

// A filtered source whose objects entered and left scope only inside gaps
// has nothing on the stream: that is no lack, unless an object is in its
// scope at the end (a consumer's view holds it only through an event).
func TestFilteredSourceWithoutEventsNeedsNoneInScopeAtTheEnd(t *testing.T) {
	s := filtering()
	s.tier("create", "a", "")
	s.tier("update", "a", "gold")
	s.tier("update", "a", "")
	s.final()
	// (The synthetic run has no relists, so its changes count as lost and
	// its stream as empty: only the rule under test is looked at.)
	if r := Check(&s.h); strings.Contains(r.Summary(), "no object event of the source") {
		t.Errorf("entered and left inside gaps, out of scope at the end: wanted no event:\n%s", r.Summary())
	}

	s = filtering()
	s.tier("create", "a", "")
	s.tier("update", "a", "gold")
	s.tier("update", "a", "")
	s.tier("update", "a", "gold")
	s.final()
	if r := Check(&s.h); !strings.Contains(r.Summary(), "no object event of the source on the stream") {
		t.Errorf("in scope at the end, no event: the findings do not say so:\n%s", r.Summary())
	}
}
