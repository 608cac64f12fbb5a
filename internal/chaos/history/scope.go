package history

import (
	"fmt"
	"sort"
)

// The relaydscope values (docs/CONSUMING.md, "Filters: entering and
// leaving scope").
const (
	ScopeEntered = "entered"
	ScopeLeft    = "left"
)

// Filter is a source's filter: the CEL expression relayd runs and its Go
// equivalent, which the checker evaluates on the labels the reference
// recorded of every version (Change.Labels), independently of relayd's
// CEL: an object is in scope when its label Label has the value Value.
type Filter struct {
	Expr  string `json:"expr"`
	Label string `json:"label"`
	Value string `json:"value"`
}

// Matches reports whether an object with labels is in the filter's scope.
func (f Filter) Matches(labels map[string]string) bool {
	v, ok := labels[f.Label]
	return ok && v == f.Value
}

// ScopeReport counts what the filter checks saw (filtered sources only).
type ScopeReport struct {
	// OutOfScope counts reference changes of objects out of scope before
	// and after them (nothing expected on the stream); Entered and Left
	// the changes that made an object enter and leave scope (an added
	// with relaydscope entered, a deleted with relaydscope left
	// expected).
	OutOfScope int `json:"outOfScope"`
	Entered    int `json:"entered"`
	Left       int `json:"left"`
	// EnteredEvents and LeftEvents count the stream's events (first
	// occurrences) flagged relaydscope entered and left.
	EnteredEvents int `json:"enteredEvents"`
	LeftEvents    int `json:"leftEvents"`
}

func (s ScopeReport) summary() string {
	return fmt.Sprintf(", filters: %d changes out of scope, %d entered and %d left scope (%d entered and %d left events on the stream)",
		s.OutOfScope, s.Entered, s.Left, s.EnteredEvents, s.LeftEvents)
}

// filtered reports whether src has a filter.
func (c *checker) filtered(src string) bool {
	_, ok := c.h.Filters[src]
	return ok
}

// inScope reports whether version ch (not a delete) is in its source's
// scope: always without a filter.
func (c *checker) inScope(ch Change) bool {
	f, ok := c.h.Filters[ch.Source]
	return !ok || (ch.Type != Deleted && f.Matches(ch.Labels))
}

// expect maps the reference history through the sources' filters into the
// changes the stream must have (c.expected, in resourceVersion order; for
// a source without a filter, its reference changes): per object, with
// "in scope" false before its creation,
//
//   - created in scope: added; created out of scope: nothing;
//   - modified, in scope before and after: modified; in scope before, not
//     after: a delete at that resourceVersion (relaydscope left); out of
//     scope before, in after: an added (relaydscope entered); out of scope
//     before and after: nothing;
//   - deleted in scope: deleted; deleted out of scope: nothing.
//
// A scope-left delete then counts like a delete for every check (lost,
// gap, order, final, checkpoint-ahead): its key is a delete's.
func (c *checker) expect() {
	c.wantScope = map[key]string{}
	for _, ch := range c.h.Reference {
		if !c.filtered(ch.Source) {
			c.expected = append(c.expected, ch)
		}
	}
	keys := make([][2]string, 0, len(c.byUID))
	for k := range c.byUID {
		if c.filtered(k[0]) {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i][0]+keys[i][1] < keys[j][0]+keys[j][1] })
	var scoped []Change
	for _, k := range keys {
		in := false
		for _, x := range c.byUID[k] {
			now := x.Type != Deleted && c.inScope(x)
			want, scope := x, ""
			switch {
			case !in && !now:
				c.rep.Scope.OutOfScope++
				in = now
				continue
			case x.Type == Modified && in && !now:
				want.Type, scope = Deleted, ScopeLeft
				c.rep.Scope.Left++
				c.transitions(k[0])[1]++
			case x.Type == Modified && !in && now:
				want.Type, scope = Added, ScopeEntered
				c.rep.Scope.Entered++
				c.transitions(k[0])[0]++
			}
			in = now
			scoped = append(scoped, want)
			if scope != "" {
				c.wantScope[key{want.Source, want.UID, want.RV, want.Type == Deleted}] = scope
			}
		}
	}
	sort.SliceStable(scoped, func(i, j int) bool { return scoped[i].RV < scoped[j].RV })
	c.expected = append(c.expected, scoped...)
}

// transitions returns src's counts of expected changes entering (0) and
// leaving (1) its filter's scope.
func (c *checker) transitions(src string) *[2]int {
	if c.scopeMoves == nil {
		c.scopeMoves = map[string]*[2]int{}
	}
	if c.scopeMoves[src] == nil {
		c.scopeMoves[src] = &[2]int{}
	}
	return c.scopeMoves[src]
}

// describe names an expected change in a finding: its type, and its
// relaydscope if it has one.
func (c *checker) describe(ch Change) string {
	if s := c.wantScope[key{ch.Source, ch.UID, ch.RV, ch.Type == Deleted}]; s != "" {
		return ch.Type + " (relaydscope " + s + ")"
	}
	return ch.Type
}

// wasIn reports whether the object k was in relayd's view of the filter's
// scope when the list g began (its last event, first occurrences, before
// g.firstSeq is not a delete) or came into it inside the list (an added
// or modified event of it in the list, at or before limit: an aborted
// list's). A relist publishes a delete only for an object its index
// holds, and the index holds what relayd published.
func (c *checker) wasIn(k [2]string, g gap, limit uint64) bool {
	in := false
	for _, e := range c.events[k] {
		switch {
		case e.Seq < g.firstSeq:
			in = e.Type != Deleted
		case e.Seq <= limit && e.Type != Deleted:
			return true
		}
	}
	return in
}

// gapScope is gapState for a filtered source whose object is out of
// scope at the list's toResourceVersion (state, not a delete): if relayd
// had it in scope before the list, some delete of it (relaydscope left,
// or a resync delete) must be inside the list.
func (c *checker) gapScope(state Change, g gap, limit uint64) (string, bool) {
	k := [2]string{state.Source, state.UID}
	if !c.wasIn(k, g, limit) {
		return "", false // out of relayd's scope before and after: nothing to publish
	}
	for _, e := range c.events[k] {
		if e.Type == Deleted && g.firstSeq < e.Seq && e.Seq <= limit {
			return "", e.Unknown
		}
	}
	if c.indexLostDelete(state, g) {
		return "", false
	}
	return fmt.Sprintf("out of the filter's scope at the resync's toResourceVersion %d (rv %d; it left scope inside the resync %s, epoch %d, %d..%d) but no delete on the stream between its markers",
		g.to, state.RV, g.reason, g.epoch, g.from, g.to), false
}

// checkScopeEvent checks one stream event (first occurrence, not a resync
// delete) of a filtered source against the reference version it names
// (ref, found by its resourceVersion whatever the event's type) and
// returns a phantom and a scope finding detail ("" when fine):
//
//   - an added or modified event names a version in scope (phantom);
//   - a delete names the deletion of an object in scope at its last
//     version, or a version out of scope of an object that was in scope
//     at an earlier version (a scope-left delete); phantom otherwise: an
//     event of an object that was not in scope then;
//   - relaydscope is left on a scope-left delete, entered on a watch
//     added of a modification (the object entered scope) and on every
//     added of a config-changed relist (an object in the new scope relayd
//     had not published), absent otherwise: another relist (origin
//     resync) cannot tell an object created during its gap from one that
//     entered scope, and says nothing (docs/CONSUMING.md, "Filters:
//     entering and leaving scope").
func (c *checker) checkScopeEvent(e Event) (phantom, scope string) {
	k := [2]string{e.Source, e.UID}
	var ref *Change
	everIn, lastIn := false, false // in scope at some, at the last version before e's
	for i, x := range c.byUID[k] {
		if x.RV == e.RV && (x.Type == Deleted) == (e.Type == Deleted) {
			ref = &c.byUID[k][i]
			break
		}
		if x.RV == e.RV && e.Type == Deleted {
			ref = &c.byUID[k][i] // a version, not the deletion: scope-left
			break
		}
		lastIn = x.Type != Deleted && c.inScope(x)
		everIn = everIn || lastIn
	}
	if ref == nil {
		return fmt.Sprintf("%s %s (seq %d, origin %s) matches no reference change", e.Type, e.ID, e.Seq, e.Origin), ""
	}
	if ref.Name != e.Name || ref.Namespace != e.Namespace {
		return fmt.Sprintf("seq %d names %s/%s, the reference %s/%s", e.Seq, e.Namespace, e.Name, ref.Namespace, ref.Name), ""
	}
	want := ""
	switch {
	case e.Type != Deleted && !c.inScope(*ref):
		return fmt.Sprintf("%s %s (seq %d, origin %s) of a version out of the filter's scope", e.Type, e.ID, e.Seq, e.Origin), ""
	case e.Type == Deleted && ref.Type != Deleted && c.inScope(*ref):
		return fmt.Sprintf("delete %s (seq %d, origin %s) of a version in the filter's scope that was not deleted", e.ID, e.Seq, e.Origin), ""
	case e.Type == Deleted && ref.Type != Deleted && !everIn:
		return fmt.Sprintf("scope-left delete %s (seq %d, origin %s) of an object never in the filter's scope before", e.ID, e.Seq, e.Origin), ""
	case e.Type == Deleted && ref.Type == Deleted && !lastIn:
		return fmt.Sprintf("delete %s (seq %d, origin %s) of an object out of the filter's scope when it was deleted", e.ID, e.Seq, e.Origin), ""
	case e.Type == Deleted && ref.Type != Deleted:
		want = ScopeLeft
	case e.Type == Added && ref.Type == Modified && e.Origin == "watch",
		e.Type == Added && e.Origin == "resync" && c.listReason(e) == "config-changed":
		want = ScopeEntered
	}
	if e.Scope != want {
		scope = fmt.Sprintf("%s %s (seq %d, origin %s) has relaydscope %q, want %q", e.Type, e.ID, e.Seq, e.Origin, e.Scope, want)
	}
	return "", scope
}

// listReason is the reason of the list (sync.started of its source and
// epoch) an event belongs to, "" if none.
func (c *checker) listReason(e Event) string {
	for _, s := range c.starts {
		if s.Source == e.Source && s.Epoch == e.Epoch {
			return s.Reason
		}
	}
	return ""
}

// checkFilteredEvent is the phantom rule for an event of a filtered
// source (checkScopeEvent), and the scope rule.
func (c *checker) checkFilteredEvent(e Event, f Finding) {
	phantom, scope := c.checkScopeEvent(e)
	if phantom != "" {
		f.Check, f.Detail = "phantom", phantom
		c.fail(f)
	}
	if scope != "" {
		f.Check, f.Detail = "scope", scope
		c.fail(f)
	}
}

// countScope counts the stream's scope events, and fails relaydscope on
// a source without a filter.
func (c *checker) countScope(e Event) {
	switch e.Scope {
	case "":
		return
	case ScopeEntered:
		c.rep.Scope.EnteredEvents++
	case ScopeLeft:
		c.rep.Scope.LeftEvents++
	}
	if !c.filtered(e.Source) {
		c.fail(Finding{Check: "scope", Source: e.Source, UID: e.UID, Name: e.Name, RV: e.RV,
			Detail: fmt.Sprintf("%s %s (seq %d) has relaydscope %q, but its source has no filter", e.Type, e.ID, e.Seq, e.Scope)})
	}
}

// finalInScope reports whether the final LIST's object o is in its
// source's scope (its version o.RV in the reference; an unknown version
// counts as in scope, so that the final check looks at it).
func (c *checker) finalInScope(o Object) bool {
	if !c.filtered(o.Source) {
		return true
	}
	for _, x := range c.byUID[[2]string{o.Source, o.UID}] {
		if x.RV == o.RV && x.Type != Deleted {
			return c.inScope(x)
		}
	}
	return true
}
