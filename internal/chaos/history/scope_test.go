package history

import (
	"strings"
	"testing"
)

// filtering is a synthetic run whose source cms has a filter: tier=gold.
func filtering() *syn {
	s := newSyn()
	s.h.Filters = map[string]Filter{"cms": {Expr: "object.metadata.labels['tier'] == 'gold'", Label: "tier", Value: "gold"}}
	return s
}

// tier makes a change to object name whose version has label tier=t ("":
// no labels), and returns it.
func (s *syn) tier(op, name, t string) Change {
	s.write(op, name)
	ch := &s.h.Reference[len(s.h.Reference)-1]
	if t != "" && op != "delete" {
		ch.Labels = map[string]string{"tier": t}
	}
	return *ch
}

// scoped publishes ch as an event of type typ with relaydscope scope.
func (s *syn) scoped(ch Change, typ, scope, origin string) {
	ch.Type = typ
	s.publish(ch, origin)
	s.h.Stream[len(s.h.Stream)-1].Scope = scope
}

// scopeRun: a enters and leaves scope, is modified out of scope and
// deleted in scope; b lives and dies out of scope; c enters scope; d
// leaves it for good. Every expected event is on the stream, unless skip
// names it ("a-left", "a-entered", "d-left"); extra publishes what
// relayd must not ("a-out": a's change out of scope as a modified,
// "b-left": a scope-left delete of b, "b-delete": b's delete).
func scopeRun(skip, extra string) *syn {
	s := filtering()
	pub := func(name string, ch Change, typ, scope string) {
		if name == "" || name != skip {
			s.scoped(ch, typ, scope, "watch")
		}
	}
	pub("", s.tier("create", "a", "gold"), Added, "")
	pub("", s.tier("update", "a", "gold"), Modified, "")
	pub("a-left", s.tier("update", "a", "silver"), Deleted, ScopeLeft)
	out := s.tier("update", "a", "")
	if extra == "a-out" {
		s.scoped(out, Modified, "", "watch")
	}
	pub("a-entered", s.tier("update", "a", "gold"), Added, ScopeEntered)
	pub("", s.tier("delete", "a", ""), Deleted, "")
	s.tier("create", "b", "silver")
	if b := s.tier("update", "b", "bronze"); extra == "b-left" {
		s.scoped(b, Deleted, ScopeLeft, "watch")
	}
	if b := s.tier("delete", "b", ""); extra == "b-delete" {
		s.scoped(b, Deleted, "", "watch")
	}
	s.tier("create", "c", "")
	pub("", s.tier("update", "c", "gold"), Added, ScopeEntered)
	pub("", s.tier("create", "d", "gold"), Added, "")
	pub("d-left", s.tier("update", "d", "silver"), Deleted, ScopeLeft)
	s.tier("update", "d", "silver")
	s.final()
	return s
}

func TestFilterScopeChangesPass(t *testing.T) {
	s := scopeRun("", "")
	r := Check(&s.h)
	wantOnly(t, r, map[string]int{})
	want := ScopeReport{OutOfScope: 6, Entered: 2, Left: 2, EnteredEvents: 2, LeftEvents: 2}
	if r.Scope != want {
		t.Errorf("scope report %+v, want %+v", r.Scope, want)
	}
	if !strings.Contains(r.Summary(), "2 entered and 2 left scope") {
		t.Errorf("summary: %s", r.Summary())
	}
}

func TestFilterScopeChangeMissingIsLost(t *testing.T) {
	r := Check(&scopeRun("a-left", "").h)
	wantOnly(t, r, map[string]int{"lost": 1})
	if f := r.Failures[0]; f.Name != "a" || !strings.Contains(f.Detail, "deleted (relaydscope left) not on the stream") {
		t.Errorf("finding %s", f)
	}
	wantOnly(t, Check(&scopeRun("a-entered", "").h), map[string]int{"lost": 1})
	// d's last word says it is in scope; the final LIST has it out.
	wantOnly(t, Check(&scopeRun("d-left", "").h), map[string]int{"lost": 1, "final": 1})
}

func TestFilterOutOfScopeEventsArePhantoms(t *testing.T) {
	wantOnly(t, Check(&scopeRun("", "a-out").h), map[string]int{"phantom": 1})
	wantOnly(t, Check(&scopeRun("", "b-left").h), map[string]int{"phantom": 1})
	wantOnly(t, Check(&scopeRun("", "b-delete").h), map[string]int{"phantom": 1})
}

func TestFilterScopeFlag(t *testing.T) {
	for i, e := range scopeRun("", "").h.Stream {
		if e.Scope == "" {
			continue
		}
		s := scopeRun("", "")
		s.h.Stream[i].Scope = ""
		wantOnly(t, Check(&s.h), map[string]int{"scope": 1})
	}
	s := scopeRun("", "")
	s.h.Stream[0].Scope = ScopeEntered // a created in scope: a plain added
	wantOnly(t, Check(&s.h), map[string]int{"scope": 1})

	// relaydscope on a source without a filter.
	c := clean()
	c.h.Stream[0].Scope = ScopeEntered
	wantOnly(t, Check(&c.h), map[string]int{"scope": 1})
}

// scopeGap: f enters scope (watched); then relayd is away (a 410 relist)
// while a leaves scope and is modified out of it, b enters it, d leaves
// and comes back, e stays out;
// the relist publishes a's scope-left delete at its listed version
// (unless noLeft), b as an added (no relaydscope: a relist cannot tell
// an object that entered from one created in the gap) and d's new state.
func scopeGap(noLeft bool) *syn {
	s := filtering()
	s.tier("create", "f", "")
	s.scoped(s.tier("update", "f", "gold"), Added, ScopeEntered, "watch")
	s.scoped(s.tier("create", "a", "gold"), Added, "", "watch")
	s.tier("create", "b", "silver")
	s.scoped(s.tier("create", "d", "gold"), Added, "", "watch")
	s.tier("create", "e", "")
	from := s.rv
	s.tier("update", "a", "silver")
	a := s.tier("update", "a", "")
	b := s.tier("update", "b", "gold")
	s.tier("update", "d", "silver")
	d := s.tier("update", "d", "gold")
	s.tier("update", "e", "silver")
	to := s.rv
	s.fault(FaultEtcdCompact, to)
	s.marker("sync.started", "expired", 2, from, to)
	if !noLeft {
		s.scoped(a, Deleted, ScopeLeft, "resync")
	}
	s.scoped(b, Added, "", "resync")
	s.scoped(d, Modified, "", "resync")
	s.marker("sync.completed", "expired", 2, from, to)
	s.final()
	return s
}

func TestFilterGapReportsScopeChanges(t *testing.T) {
	r := Check(&scopeGap(false).h)
	wantOnly(t, r, map[string]int{})
	// a's and d's leaves (b's entry and d's return are on the stream, as
	// the relist's added and modified).
	if r.CoveredByResync != 2 {
		t.Errorf("covered by the resync %d, want 2\n%s", r.CoveredByResync, r.Summary())
	}
	r = Check(&scopeGap(true).h)
	wantOnly(t, r, map[string]int{"gap-delete": 1, "final": 1})
	if !strings.Contains(r.Failures[0].Detail, "out of the filter's scope at the resync's toResourceVersion") {
		t.Errorf("finding %s", r.Failures[0])
	}
}

// A config-changed relist flags the objects it adds (in the new scope, not
// published before) entered; another relist flags none.
func TestConfigChangedRelistFlagsEntered(t *testing.T) {
	run := func(reason, fault, scope string) *syn {
		s := filtering()
		s.tier("create", "b", "")
		s.scoped(s.tier("update", "b", "gold"), Added, ScopeEntered, "watch")
		s.scoped(s.tier("update", "b", "silver"), Deleted, ScopeLeft, "watch")
		from := s.rv
		a := s.tier("create", "a", "gold") // while relayd was down
		s.fault(fault, from+2)
		s.h.Faults[0].Source = "cms"
		s.marker("sync.started", reason, 2, from, s.rv)
		s.scoped(a, Added, scope, "resync")
		s.marker("sync.completed", reason, 2, from, s.rv)
		s.final()
		return s
	}
	wantOnly(t, Check(&run("config-changed", FaultConfigChanged, ScopeEntered).h), map[string]int{})
	wantOnly(t, Check(&run("config-changed", FaultConfigChanged, "").h), map[string]int{"scope": 1})
	wantOnly(t, Check(&run("expired", FaultEtcdCompact, "").h), map[string]int{})
	wantOnly(t, Check(&run("expired", FaultEtcdCompact, ScopeEntered).h), map[string]int{"scope": 1})
}
