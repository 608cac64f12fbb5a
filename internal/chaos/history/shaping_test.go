package history

import "testing"

// ignoring is a synthetic run whose source cms has ignoreChanges [status]:
// digest returns the digest of each change (the spec it has).
func ignoring() *syn {
	s := newSyn()
	s.h.Shaping = map[string]Shaping{"cms": {IgnoreChanges: []string{"status"}}}
	return s
}

// with sets the digest of the last reference change.
func (s *syn) with(digest string) Change {
	ch := &s.h.Reference[len(s.h.Reference)-1]
	ch.Digest = digest
	return *ch
}

func TestIgnoreChangesStatusOnlyNeedNotBePublished(t *testing.T) {
	s := ignoring()
	s.write("create", "a")
	s.publish(s.with("spec1"), "watch")
	s.write("update", "a")
	s.with("spec1") // status only: suppressed
	s.write("update", "a")
	s.publish(s.with("spec2"), "watch")
	s.write("update", "a")
	s.with("spec2") // status only, the object's final version
	s.final()
	r := Check(&s.h)
	wantOnly(t, r, map[string]int{})
	if r.Shaping.Confined != 2 || r.Shaping.Suppressed != 2 {
		t.Errorf("shaping report %+v", r.Shaping)
	}
}

func TestIgnoreChangesSpecChangeMustBePublished(t *testing.T) {
	s := ignoring()
	s.write("create", "a")
	s.publish(s.with("spec1"), "watch")
	s.write("update", "a")
	s.with("spec2") // a spec change, not relayed
	s.write("update", "a")
	s.with("spec2") // status only
	s.final()
	// The spec change is lost, and the last event (spec1) is not the
	// final state as far as the source watches it.
	wantOnly(t, Check(&s.h), map[string]int{"lost": 1, "final": 1})
}

func TestIgnoreChangesNeverExcusesAddedOrDeleted(t *testing.T) {
	s := ignoring()
	s.write("create", "a")
	s.with("spec1") // the add, not relayed
	s.write("create", "b")
	s.publish(s.with("spec1"), "watch")
	s.write("delete", "b") // not relayed
	s.final()
	wantOnly(t, Check(&s.h), map[string]int{"lost": 2, "final": 2})
}

func TestIgnoreChangesResyncMayFindTheObjectUnchanged(t *testing.T) {
	s := ignoring()
	s.write("create", "a")
	s.publish(s.with("spec1"), "watch")
	from := s.rv
	s.write("update", "a")
	s.with("spec1") // status only, inside the gap
	s.write("update", "a")
	s.with("spec1") // status only, the state at the resync's end
	s.fault(FaultEtcdCompact, s.rv)
	s.marker("sync.started", "expired", 2, from, s.rv)
	s.marker("sync.completed", "expired", 2, from, s.rv) // a unchanged: nothing published
	s.final()
	wantOnly(t, Check(&s.h), map[string]int{})

	// Without ignoreChanges the same stream lacks the state.
	s.h.Shaping = nil
	wantOnly(t, Check(&s.h), map[string]int{"final": 1, "gap-state": 2})
}

func TestShapingContent(t *testing.T) {
	s := newSyn()
	s.h.Shaping = map[string]Shaping{"cms": {Drop: []string{"data.secret"}}}
	s.publish(s.write("create", "a"), "watch")
	s.h.Stream[0].Content = &Content{Payload: "full", Members: []string{"apiVersion", "data", "kind", "metadata"}}
	s.final()
	wantOnly(t, Check(&s.h), map[string]int{})

	s.h.Stream[0].Content.Present = []string{"data.secret"}
	wantOnly(t, Check(&s.h), map[string]int{"shaping": 1})
	s.h.Stream[0].Content.Present = nil
	s.h.Stream[0].Content.Marker = true
	wantOnly(t, Check(&s.h), map[string]int{"shaping": 1})
	s.h.Stream[0].Content = nil
	wantOnly(t, Check(&s.h), map[string]int{"shaping": 1, "evidence": 1}) // not probed: no message of the source was

	s.h.Shaping = map[string]Shaping{"cms": {Payload: "metadata"}}
	s.h.Stream[0].Content = &Content{Payload: "metadata", Members: []string{"apiVersion", "kind", "metadata"}}
	wantOnly(t, Check(&s.h), map[string]int{})
	s.h.Stream[0].Content.Members = append(s.h.Stream[0].Content.Members, "spec")
	wantOnly(t, Check(&s.h), map[string]int{"shaping": 1})

	// A resync delete carries a reference payload.
	s.h.Stream[0].Unknown = true
	s.h.Stream[0].Content = &Content{Payload: "reference", Members: []string{"apiVersion", "kind", "name", "namespace", "resourceVersion", "uid"}}
	r := Check(&s.h)
	if checks(r)["shaping"] != 0 {
		t.Errorf("a resync delete's reference payload fails: %s", r.Summary())
	}
	s.h.Stream[0].Content.Members = append(s.h.Stream[0].Content.Members, "metadata")
	if r := Check(&s.h); checks(r)["shaping"] != 1 {
		t.Errorf("a reference payload with metadata passes: %s", r.Summary())
	}
}

func TestIndexLostRelistMayMissDeletes(t *testing.T) {
	run := func(reason, fault string) Report {
		s := newSyn()
		s.publish(s.write("create", "a"), "watch")
		s.publish(s.write("create", "b"), "watch")
		from := s.rv
		s.write("delete", "b") // inside the gap, not reported
		s.write("update", "a")
		s.fault(fault, 0)
		s.marker("sync.started", reason, 2, from, s.rv)
		s.publish(s.h.Reference[len(s.h.Reference)-1], "resync")
		s.marker("sync.completed", reason, 2, from, s.rv)
		s.final()
		return Check(&s.h)
	}
	r := run("index-lost", FaultBucketDeleted)
	wantOnly(t, r, map[string]int{})
	if r.Shaping.IndexLostDeletes != 1 {
		t.Errorf("shaping report %+v", r.Shaping)
	}
	wantOnly(t, run("no-checkpoint", FaultCheckpointDeleted), map[string]int{"gap-delete": 1, "final": 1})
}
