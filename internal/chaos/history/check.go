package history

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"
)

// Finding is one violation found by Check.
type Finding struct {
	// Check names the property: lost, gap-state, gap-delete, bracket,
	// order, phantom, final, checkpoint-ahead, samples, reference,
	// duplicate, relist, exit, untraced, unflagged (trace.go), shaping
	// (shaping.go), scope (scope.go), full (a full resync that did not
	// republish an object), evidence (evidence.go: the run
	// lacks what it exists for).
	Check  string `json:"check"`
	Source string `json:"source"`
	UID    string `json:"uid,omitempty"`
	Name   string `json:"name,omitempty"`
	RV     int64  `json:"rv,omitempty"`
	Detail string `json:"detail"`
}

func (f Finding) String() string {
	return fmt.Sprintf("%s: %s %s (uid %s) rv %d: %s", f.Check, f.Source, f.Name, f.UID, f.RV, f.Detail)
}

// Report is the outcome of Check.
type Report struct {
	ReferenceChanges int `json:"referenceChanges"` // changes the reference watch saw
	StreamMessages   int `json:"streamMessages"`   // every message, markers included
	ObjectMessages   int `json:"objectMessages"`   // object events, duplicates included
	Duplicates       int `json:"duplicates"`       // messages whose id was already on the stream (inside the duplicate window: also a failure)
	// CoveredByResync counts reference changes missing from the stream
	// inside a gap that a resync marker covers (and whose gap state checked).
	CoveredByResync int `json:"coveredByResync"`
	// GapDeletes counts objects deleted inside a gap whose delete a resync
	// reported (final state unknown).
	GapDeletes int `json:"gapDeletes"`
	// RedundantDeletes counts resync deletes (final state unknown) of
	// objects whose delete was already on the stream.
	RedundantDeletes int `json:"redundantDeletes"`
	// Resyncs counts sync.completed markers by reason.
	Resyncs map[string]int `json:"resyncs"`
	// Relists counts sync.started markers by what explained them
	// ("<reason> by <fault kind>", "initial by first start").
	Relists map[string]int `json:"relists,omitempty"`
	// Exits counts relayd's exits during the run; UnexplainedExits those
	// the run did not ask for (each also a failure).
	Exits            int `json:"exits"`
	UnexplainedExits int `json:"unexplainedExits"`
	// Samples counts checkpoint samples checked; SampleAttempts,
	// SampleErrors and SampleUnavailable are the sampler's tries, failed
	// tries and tries that found a server unavailable (History).
	Samples           int `json:"samples"`
	SampleAttempts    int `json:"sampleAttempts"`
	SampleErrors      int `json:"sampleErrors"`
	SampleUnavailable int `json:"sampleUnavailable"`
	// RedoneLists counts lists that redid an aborted list of their source
	// (same position and reason): the same relist, not another one.
	RedoneLists int `json:"redoneLists,omitempty"`
	// FullResyncs counts valid, completed full requested lists;
	// FullRepublished the objects they republished (checkFull).
	FullResyncs     int `json:"fullResyncs,omitempty"`
	FullRepublished int `json:"fullRepublished,omitempty"`
	// Shaping counts what the shaping checks saw (shaping.go).
	Shaping ShapingReport `json:"shaping"`
	// Scope counts what the filter checks saw (scope.go); zero without
	// filtered sources.
	Scope    ScopeReport `json:"scope"`
	Failures []Finding   `json:"failures,omitempty"`

	// Unencodable counts object events flagged relaydunencodable (first
	// occurrences) of the objects History.Unencodable names;
	// UnencodableTraced the reference changes such an event traced
	// (trace.go).
	Unencodable       int `json:"unencodable,omitempty"`
	UnencodableTraced int `json:"unencodableTraced,omitempty"`
}

// OK reports whether no property was violated.
func (r Report) OK() bool { return len(r.Failures) == 0 }

// Lost counts reference changes that are neither on the stream nor covered
// by a resync.
func (r Report) Lost() int { return r.count("lost") }

func (r Report) count(check string) int {
	n := 0
	for _, f := range r.Failures {
		if f.Check == check {
			n++
		}
	}
	return n
}

// Summary is a one-paragraph account of the report.
func (r Report) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d reference changes, %d stream messages (%d object events, %d duplicates, %d redundant resync deletes), %d covered by a resync, %d gap deletes reported, resyncs %v, relists %v (%d aborted lists redone), %d exits (%d unexplained), %d checkpoint samples (%d of %d tries failed, %d with a server unavailable)",
		r.ReferenceChanges, r.StreamMessages, r.ObjectMessages, r.Duplicates, r.RedundantDeletes, r.CoveredByResync, r.GapDeletes, r.Resyncs, r.Relists, r.RedoneLists, r.Exits, r.UnexplainedExits, r.Samples, r.SampleErrors, r.SampleAttempts, r.SampleUnavailable)
	if r.FullResyncs > 0 {
		fmt.Fprintf(&b, ", %d full resyncs republished %d objects", r.FullResyncs, r.FullRepublished)
	}
	if r.Unencodable > 0 || r.UnencodableTraced > 0 {
		fmt.Fprintf(&b, ", %d unencodable changes traced by %d flagged events", r.UnencodableTraced, r.Unencodable)
	}
	b.WriteString(r.Shaping.summary())
	if r.Scope != (ScopeReport{}) {
		b.WriteString(r.Scope.summary())
	}
	if r.OK() {
		b.WriteString(": OK")
		return b.String()
	}
	by := map[string]int{}
	for _, f := range r.Failures {
		by[f.Check]++
	}
	fmt.Fprintf(&b, ": %d failures %v", len(r.Failures), by)
	for i, f := range r.Failures {
		if i == 20 {
			fmt.Fprintf(&b, "\n  ... %d more", len(r.Failures)-i)
			break
		}
		b.WriteString("\n  " + f.String())
	}
	return b.String()
}

// key identifies a change on the stream: deletes and the other types are
// told apart because a delete's resourceVersion is that of the deletion.
type key struct {
	src, uid string
	rv       int64
	del      bool
}

// gap is a valid, completed list (see checkBrackets).
type gap struct {
	from, to            int64
	startedSeq, doneSeq uint64
	// firstSeq is the sync.started of the first list this one redoes
	// (startedSeq if none): an aborted list's events count as this one's.
	firstSeq uint64
	reason   string
	epoch    uint64
	full     bool // a requested list that publishes every object (checkFull)
}

type checker struct {
	h   *History
	rep Report

	first     map[key]uint64         // first sequence of each change on the stream
	unknown   map[[2]string]uint64   // src/uid -> first resync delete (final state unknown)
	byUID     map[[2]string][]Change // reference changes per object, by rv
	events    map[[2]string][]Event  // first occurrences of object events per object, in stream order
	gaps      map[string][]gap       // per source: valid, completed lists
	refKeys   map[key]Change
	starts    []Event // first occurrences of sync.started, in stream order
	completes []Event // first occurrences of sync.completed, in stream order

	indexLost map[[2]string]bool // objects whose delete an index-lost relist may not report (shaping.go)

	expected   []Change           // the reference mapped through the sources' filters (scope.go)
	wantScope  map[key]string     // expected changes that enter or leave scope -> relaydscope
	scopeMoves map[string]*[2]int // per filtered source: expected changes entering, leaving scope
}

// Check checks h; see the package documentation for the properties.
func Check(h *History) Report {
	c := &checker{
		h:       h,
		first:   map[key]uint64{},
		unknown: map[[2]string]uint64{},
		byUID:   map[[2]string][]Change{},
		events:  map[[2]string][]Event{},
		gaps:    map[string][]gap{},
		refKeys: map[key]Change{},
	}
	c.rep.Resyncs = map[string]int{}
	c.rep.Relists = map[string]int{}
	c.index()
	c.expect()
	c.checkReference()
	c.checkBrackets()
	c.checkLost()
	c.checkPhantomsAndOrder()
	c.checkFinal()
	c.checkSamples()
	c.checkSampling()
	c.checkRelists()
	c.checkExits()
	c.checkTraces()
	c.checkShaping()
	c.checkFull()
	c.checkEvidence()
	rank := map[string]int{"reference": 0, "exit": 1, "lost": 2, "untraced": 3, "gap-delete": 3, "gap-state": 4, "bracket": 5, "phantom": 6, "order": 7, "final": 8, "checkpoint-ahead": 9, "samples": 10, "relist": 11, "duplicate": 12, "unflagged": 13, "shaping": 14, "scope": 14, "full": 14, "evidence": 15}
	sort.SliceStable(c.rep.Failures, func(i, j int) bool { return rank[c.rep.Failures[i].Check] < rank[c.rep.Failures[j].Check] })
	return c.rep
}

func (c *checker) fail(f Finding) { c.rep.Failures = append(c.rep.Failures, f) }

func (c *checker) index() {
	h := c.h
	c.rep.ReferenceChanges = len(h.Reference)
	c.rep.StreamMessages = len(h.Stream)
	for _, ch := range h.Reference {
		k := [2]string{ch.Source, ch.UID}
		c.byUID[k] = append(c.byUID[k], ch)
		c.refKeys[key{ch.Source, ch.UID, ch.RV, ch.Type == Deleted}] = ch
	}
	for _, l := range c.byUID {
		sort.SliceStable(l, func(i, j int) bool { return l[i].RV < l[j].RV })
	}
	seen := map[string]Event{} // Nats-Msg-Id -> its first message
	stream := append([]Event(nil), h.Stream...)
	sort.SliceStable(stream, func(i, j int) bool { return stream[i].Seq < stream[j].Seq })
	withIDs := false // the history kept Nats-Msg-Ids (older ones did not)
	for _, e := range stream {
		withIDs = withIDs || e.MsgID != ""
	}
	for _, e := range stream {
		id := e.MsgID
		if id == "" {
			id = e.Source + "/" + e.ID
			if withIDs {
				// Without an id JetStream cannot drop its replays, and the
				// duplicate rule below could not see them either.
				c.fail(Finding{Check: "duplicate", Source: e.Source, UID: e.UID, Name: e.Name, RV: e.RV,
					Detail: fmt.Sprintf("message at seq %d (%s %s) was stored without a Nats-Msg-Id", e.Seq, e.Kind, e.ID)})
			}
		}
		if first, dup := seen[id]; dup {
			c.rep.Duplicates++
			if e.Kind == "object" {
				c.rep.ObjectMessages++
			}
			c.duplicate(first, e)
			continue
		}
		seen[id] = e
		switch e.Kind {
		case "object":
			c.rep.ObjectMessages++
			c.countScope(e)
			k := [2]string{e.Source, e.UID}
			c.events[k] = append(c.events[k], e)
			if e.Unknown {
				if _, ok := c.unknown[k]; !ok {
					c.unknown[k] = e.Seq
				}
				continue
			}
			sk := key{e.Source, e.UID, e.RV, e.Type == Deleted}
			if _, ok := c.first[sk]; !ok {
				c.first[sk] = e.Seq
			}
		case "sync.started":
			c.starts = append(c.starts, e)
		case "sync.completed":
			c.rep.Resyncs[e.Reason]++
			c.completes = append(c.completes, e)
		}
	}
}

// checkReference: every acknowledged write is in the reference; every
// reference change comes from a write the writer attempted. Otherwise the
// reference (the basis of every other check) is not trustworthy.
func (c *checker) checkReference() {
	acked := map[key]bool{}
	ackedDel := map[[2]string]bool{}
	tried := map[[3]string]bool{}
	for _, w := range c.h.Writes {
		tried[[3]string{w.Source, w.Namespace, w.Name}] = true
		if !w.Acked() {
			continue
		}
		switch w.Op {
		case "delete":
			if w.UID != "" {
				ackedDel[[2]string{w.Source, w.UID}] = true
			}
			found := false
			for _, ch := range c.byUID[[2]string{w.Source, w.UID}] {
				found = found || ch.Type == Deleted
			}
			if w.UID != "" && !found {
				c.fail(Finding{Check: "reference", Source: w.Source, UID: w.UID, Name: w.Name, Detail: "acknowledged delete missing from the reference history"})
			}
		default:
			acked[key{w.Source, w.UID, w.RV, false}] = true
			if _, ok := c.refKeys[key{w.Source, w.UID, w.RV, false}]; !ok {
				c.fail(Finding{Check: "reference", Source: w.Source, UID: w.UID, Name: w.Name, RV: w.RV, Detail: "acknowledged " + w.Op + " missing from the reference history"})
			}
		}
	}
	for _, ch := range c.h.Reference {
		ok := tried[[3]string{ch.Source, ch.Namespace, ch.Name}]
		if !ok {
			c.fail(Finding{Check: "reference", Source: ch.Source, UID: ch.UID, Name: ch.Name, RV: ch.RV, Detail: "reference change of an object the writer never wrote"})
		}
	}
}

// onStream reports whether change ch is on the stream at or before seq.
func (c *checker) onStream(ch Change, limit uint64) bool {
	s, ok := c.first[key{ch.Source, ch.UID, ch.RV, ch.Type == Deleted}]
	return ok && s <= limit
}

// inList reports whether change ch is first on the stream inside the list
// g (after its sync.started, or that of the aborted list it redoes) at or
// before limit.
func (c *checker) inList(ch Change, g gap, limit uint64) bool {
	s, ok := c.first[key{ch.Source, ch.UID, ch.RV, ch.Type == Deleted}]
	return ok && g.firstSeq < s && s <= limit
}

// covering finds a valid, completed list (gap) of ch's source whose range
// covers ch, that began at or before limit and published the object's
// state between its markers (at or before limit). inRange: some valid
// gap's range covers ch; detail: why none of those published the state
// ("" when one did); reported: a resync delete reported the object gone.
func (c *checker) covering(ch Change, limit uint64) (inRange bool, detail string, reported bool) {
	for _, g := range c.gaps[ch.Source] {
		if g.from >= ch.RV || ch.RV > g.to || g.firstSeq > limit {
			continue
		}
		d, rep := c.gapState(ch, g, min(g.doneSeq, limit))
		if d == "" {
			return true, "", rep
		}
		if !inRange {
			inRange, detail = true, d
		}
	}
	return inRange, detail, false
}

// gapState checks that the object of ch has, inside the list g and at or
// before limit, its state as of the resync g: that version, or a delete if
// it was gone by then (unless nothing of it was ever published). It
// returns a failure detail, "" when fine, and whether a resync delete
// reported it.
func (c *checker) gapState(ch Change, g gap, limit uint64) (string, bool) {
	k := [2]string{ch.Source, ch.UID}
	var state *Change
	for i, x := range c.byUID[k] {
		if x.RV <= g.to {
			state = &c.byUID[k][i]
		}
	}
	if state == nil {
		return fmt.Sprintf("no reference state at the resync's toResourceVersion %d", g.to), false
	}
	if state.Type != Deleted && !c.inScope(*state) {
		return c.gapScope(*state, g, limit)
	}
	if state.Type != Deleted {
		if !c.stateInList(*state, g, limit) {
			return fmt.Sprintf("resync (%s, epoch %d, %d..%d, seq %d..%d) covers it but the object's state at %d (rv %d) is not on the stream between its markers", g.reason, g.epoch, g.from, g.to, g.firstSeq, g.doneSeq, g.to, state.RV), false
		}
		return "", false
	}
	published := false
	for _, e := range c.events[k] {
		published = published || (e.Type != Deleted && e.Seq <= limit)
	}
	if c.filtered(ch.Source) {
		// Objects leave and enter scope: only one relayd had in scope
		// before the list needs its delete.
		published = c.wasIn(k, g, limit)
	}
	if !published {
		return "", false // created and deleted inside the gap: no trace is right
	}
	if c.inList(*state, g, limit) {
		return "", false
	}
	if s, ok := c.unknown[k]; ok && g.firstSeq < s && s <= limit {
		return "", true
	}
	if c.indexLostDelete(*state, g) {
		return "", false
	}
	return fmt.Sprintf("deleted inside the resync (%s, epoch %d, %d..%d) but no delete on the stream", g.reason, g.epoch, g.from, g.to), false
}

func (c *checker) checkLost() {
	gapDeletes := map[[2]string]bool{}
	for _, ch := range c.expected {
		if !c.required(ch) {
			c.confined(ch)
			continue
		}
		if c.onStream(ch, math.MaxUint64) {
			continue
		}
		ok, detail, reported := c.covering(ch, math.MaxUint64)
		if !ok {
			c.fail(Finding{Check: "lost", Source: ch.Source, UID: ch.UID, Name: ch.Name, RV: ch.RV, Detail: c.describe(ch) + " not on the stream and not covered by a valid resync"})
			continue
		}
		c.rep.CoveredByResync++
		if detail != "" {
			check := "gap-state"
			if strings.Contains(detail, "no delete on the stream") {
				check = "gap-delete"
			}
			c.fail(Finding{Check: check, Source: ch.Source, UID: ch.UID, Name: ch.Name, RV: ch.RV, Detail: detail})
		}
		if reported {
			gapDeletes[[2]string{ch.Source, ch.UID}] = true
		}
	}
	c.rep.GapDeletes = len(gapDeletes)
}

func (c *checker) checkPhantomsAndOrder() {
	keys := make([][2]string, 0, len(c.events))
	for k := range c.events {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i][0]+keys[i][1] < keys[j][0]+keys[j][1] })
	for _, k := range keys {
		var maxRV int64
		deletedAt := uint64(0) // seq of the first delete of the object on the stream
		for _, e := range c.events[k] {
			f := Finding{Source: e.Source, UID: e.UID, Name: e.Name, RV: e.RV}
			if e.Unknown && deletedAt != 0 {
				// A resync reported again a delete that was already on the
				// stream (relayd crashed after publishing the watch delete
				// and before its index recorded it): redundant, not a
				// step back in the object's history.
				c.rep.RedundantDeletes++
				continue
			}
			if e.Type == Deleted && deletedAt == 0 {
				deletedAt = e.Seq
			}
			if e.Type != Deleted {
				deletedAt = 0 // back in a filter's scope
			}
			switch {
			case e.Unknown:
				_, existed := c.refKeys[key{e.Source, e.UID, e.RV, false}]
				deleted := false
				for _, ch := range c.byUID[k] {
					deleted = deleted || (ch.Type == Deleted && ch.RV > e.RV)
				}
				if !existed || !deleted {
					f.Check, f.Detail = "phantom", fmt.Sprintf("resync delete (seq %d): version existed %v, object deleted later %v", e.Seq, existed, deleted)
					c.fail(f)
				}
			case c.filtered(e.Source):
				c.checkFilteredEvent(e, f)
			default:
				ch, ok := c.refKeys[key{e.Source, e.UID, e.RV, e.Type == Deleted}]
				if !ok {
					f.Check, f.Detail = "phantom", fmt.Sprintf("%s %s (seq %d, origin %s) matches no reference change", e.Type, e.ID, e.Seq, e.Origin)
					c.fail(f)
				} else if ch.Name != e.Name || ch.Namespace != e.Namespace {
					f.Check, f.Detail = "phantom", fmt.Sprintf("seq %d names %s/%s, the reference %s/%s", e.Seq, e.Namespace, e.Name, ch.Namespace, ch.Name)
					c.fail(f)
				}
			}
			if e.RV < maxRV {
				f.Check, f.Detail = "order", fmt.Sprintf("%s at seq %d after resourceVersion %d", e.Type, e.Seq, maxRV)
				c.fail(f)
			}
			maxRV = max(maxRV, e.RV)
		}
	}
}

func (c *checker) checkFinal() {
	final := map[[2]string]Object{}
	for _, o := range c.h.Final {
		final[[2]string{o.Source, o.UID}] = o
	}
	for k, evs := range c.events {
		last := evs[len(evs)-1]
		o, exists := final[k]
		f := Finding{Check: "final", Source: last.Source, UID: last.UID, Name: last.Name, RV: last.RV}
		gone := "not in the final LIST"
		if exists && !c.finalInScope(o) {
			// Out of its filter's scope: as good as gone for the source.
			exists, gone = false, fmt.Sprintf("out of the filter's scope in the final LIST (at %d)", o.RV)
		}
		switch {
		case last.Type == Deleted && exists:
			f.Detail = fmt.Sprintf("last event is a delete (seq %d) but the final LIST has it at %d", last.Seq, o.RV)
			c.fail(f)
		case last.Type != Deleted && !exists && !c.indexLost[k]:
			f.Detail = fmt.Sprintf("last event is %s (seq %d) but the object is %s", last.Type, last.Seq, gone)
			c.fail(f)
		case last.Type != Deleted && exists && !c.sameState(k, last.RV, o.RV):
			f.Detail = fmt.Sprintf("last event (seq %d) has resourceVersion %d, the final LIST %d", last.Seq, last.RV, o.RV)
			c.fail(f)
		}
	}
	for k, o := range final {
		if _, ok := c.events[k]; !ok && c.finalInScope(o) {
			c.fail(Finding{Check: "final", Source: o.Source, UID: o.UID, Name: o.Name, RV: o.RV, Detail: "in the final LIST but never on the stream"})
		}
	}
}

// checkSamples: when a checkpoint C was read, every change of that source
// at or below C was already on the stream (the stream's last sequence was
// read after the checkpoint), or covered by a resync whose state was.
func (c *checker) checkSamples() {
	bySource := map[string][]Change{}
	for _, ch := range c.expected {
		bySource[ch.Source] = append(bySource[ch.Source], ch)
	}
	storedBy := c.storedBy()
	for _, s := range c.h.Samples {
		c.rep.Samples++
		limit := max(s.StreamLastSeq, storedBy(s.Read))
		for _, ch := range bySource[s.Source] {
			if ch.RV > s.CheckpointRV || c.onStream(ch, limit) || !c.required(ch) {
				continue
			}
			ok, detail, _ := c.covering(ch, limit)
			if !ok {
				detail = c.describe(ch) + " not on the stream"
			}
			if detail != "" {
				c.fail(Finding{Check: "checkpoint-ahead", Source: ch.Source, UID: ch.UID, Name: ch.Name, RV: ch.RV,
					Detail: fmt.Sprintf("checkpoint %d read at %s with the stream at seq %d: %s", s.CheckpointRV, s.At.Format("15:04:05.000"), s.StreamLastSeq, detail)})
				break // one finding per sample
			}
		}
	}
}

// storedBy returns the highest stream sequence JetStream had stored at or
// before a time, by the stored times of the stream's messages (0 without
// them). A sample's stream info can be behind that: a stream leader just
// elected after a quorum loss answers with the state it has applied, which
// may lack messages it acknowledged before (seen in js-cluster-quorum-loss:
// info at seq 39 for 2 s while seq 42, stored 14 s earlier, was on the
// stream). The stored times are the servers' own, on the machine's clock.
func (c *checker) storedBy() func(t time.Time) uint64 {
	type stored struct {
		at  time.Time
		seq uint64
	}
	var all []stored
	for _, e := range c.h.Stream {
		if !e.Stored.IsZero() {
			all = append(all, stored{e.Stored, e.Seq})
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].at.Before(all[j].at) })
	for i := 1; i < len(all); i++ { // highest seq stored by each time
		all[i].seq = max(all[i].seq, all[i-1].seq)
	}
	return func(t time.Time) uint64 {
		i := sort.Search(len(all), func(i int) bool { return all[i].at.After(t) })
		if i == 0 {
			return 0
		}
		return all[i-1].seq
	}
}

// duplicate fails a message whose Nats-Msg-Id was stored before (first)
// inside the stream's duplicate window: JetStream should have dropped it,
// so either the window does not work or two different messages share an
// id. Outside the window a replay is legitimately stored again: counted
// only. Without stored times or a recorded window it counts as inside.
func (c *checker) duplicate(first, e Event) {
	w := c.h.DuplicateWindow
	apart := e.Stored.Sub(first.Stored)
	if w > 0 && !first.Stored.IsZero() && !e.Stored.IsZero() && apart >= w {
		return
	}
	c.fail(Finding{Check: "duplicate", Source: e.Source, UID: e.UID, Name: e.Name, RV: e.RV,
		Detail: fmt.Sprintf("message id %q stored at seq %d and again at seq %d, %v apart, inside the duplicate window %v",
			cmpOr(e.MsgID, e.Source+"/"+e.ID), first.Seq, e.Seq, apart.Round(time.Millisecond), w)})
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// relistCauses returns the faults that could explain the relist that
// sync.started e began (indices into h.Faults), or initial when it is the
// source's first list. A relist is explained by:
//
//   - initial: the source's first list, before any watch event of it (the
//     first start has no checkpoint; writes start after its checkpoint);
//   - expired (410): a fault injected before the relist that ended history
//     after the relist's fromResourceVersion: an etcd compaction at a
//     revision above it, or a restart of the apiserver's watch cache —
//     apiserver-restart, apiserver-kill9, etcd-restart (the apiserver's
//     cache re-initialises from a list after its etcd watch broke) — that
//     served again at a revision above it: a position older than the new
//     cache's start gets 410 Gone from the cache;
//   - no-checkpoint: the checkpoint (key) deleted before it;
//   - index-lost: the index bucket deleted before it;
//   - config-changed: relayd restarted with the source's filter changed
//     before it (a config-changed fault of the source);
//   - requested: `relayd resync` of the source run before it (a
//     resync-requested fault of the source).
//
// Nothing else explains a relist: in particular a kill -9 of relayd, a
// failpoint crash, a NATS restart or a network fault must resume from the
// checkpoint and the index without one. A fault's time is compared with
// the time JetStream stored sync.started (when recorded). How many
// relists one fault explains is checkRelists' business.
func (c *checker) relistCauses(e Event, watchSeen bool, firstOfSource bool) (causes []int, initial bool) {
	before := func(f Fault) bool { return e.Stored.IsZero() || f.At.Before(e.Stored) }
	for i, f := range c.h.Faults {
		if !before(f) {
			continue
		}
		switch {
		case e.Reason == "expired" && f.Rev > e.From &&
			(f.Kind == FaultEtcdCompact || f.Kind == FaultAPIServerRestart || f.Kind == FaultAPIServerKill9 || f.Kind == FaultEtcdRestart),
			e.Reason == "no-checkpoint" && f.Kind == FaultCheckpointDeleted,
			e.Reason == "index-lost" && f.Kind == FaultBucketDeleted,
			e.Reason == "config-changed" && f.Kind == FaultConfigChanged && f.Source == e.Source,
			e.Reason == "requested" && f.Kind == FaultResyncRequested && f.Source == e.Source:
			causes = append(causes, i)
		}
	}
	return causes, e.Reason == "initial" && firstOfSource && !watchSeen && e.From == 0
}

// checkRelists: every relist is explained (see relistCauses), and one
// fault explains at most one relist per source, plus one more for each
// crash of relayd after the last relist it explained (the relist redone
// because relayd died before its checkpoint recorded the list). A list
// that redoes an aborted list (retried after a failure, or after a crash,
// from the same position for the same reason) is the same relist.
func (c *checker) checkRelists() {
	watchSeen := map[string]bool{} // source -> a watch event came before
	starts := map[string]int{}
	stream := append([]Event(nil), c.h.Stream...)
	sort.SliceStable(stream, func(i, j int) bool { return stream[i].Seq < stream[j].Seq })
	seen := map[string]bool{}
	completed := map[[2]string]bool{}
	for _, e := range c.completes {
		completed[[2]string{e.Source, fmt.Sprint(e.Epoch)}] = true
	}
	prev := map[string]*Event{}          // source -> its previous sync.started
	lastUse := map[[2]string]time.Time{} // source/fault index -> the last relist it explained
	crashUsed := map[[2]string]bool{}    // source/crash index -> allowed a relist again
	crashes := c.crashes()
	for _, e := range stream {
		switch {
		case e.Kind == "object" && e.Origin == "watch":
			watchSeen[e.Source] = true
		case e.Kind == "sync.started":
			id := cmpOr(e.MsgID, e.Source+"/"+e.ID)
			if seen[id] {
				continue
			}
			seen[id] = true
			if c.retried(e, prev, completed) {
				c.rep.RedoneLists++
				prev[e.Source] = &e
				continue
			}
			prev[e.Source] = &e
			starts[e.Source]++
			causes, initial := c.relistCauses(e, watchSeen[e.Source], starts[e.Source] == 1)
			if initial {
				c.rep.Relists["initial by first start"]++
				continue
			}
			if why := c.assignRelist(e, causes, crashes, lastUse, crashUsed); why != "" {
				c.rep.Relists[why]++
				continue
			}
			c.rep.Relists[e.Reason+" unexplained"]++
			at := "at an unknown time"
			if !e.Stored.IsZero() {
				at = "stored " + e.Stored.Format("15:04:05.000")
			}
			detail := fmt.Sprintf("relist (reason %s, epoch %d, seq %d, %s) from resourceVersion %d is explained by no fault injected before it (faults: %s)",
				e.Reason, e.Epoch, e.Seq, at, e.From, c.faultSummary())
			if len(causes) > 0 {
				detail = fmt.Sprintf("relist (reason %s, epoch %d, seq %d, %s) from resourceVersion %d: a relist loop? every fault that could explain it (%d) already explained a relist of this source, with no relayd crash since",
					e.Reason, e.Epoch, e.Seq, at, e.From, len(causes))
			}
			c.fail(Finding{Check: "relist", Source: e.Source, RV: e.From, Detail: detail})
		}
	}
}

// assignRelist picks the fault that explains relist e among causes: the
// latest one that explained no relist of e's source yet, else one whose
// last relist of the source was followed by a crash of relayd (each crash
// allows one relist again). It returns the explanation, "" when none is
// left.
func (c *checker) assignRelist(e Event, causes []int, crashes []time.Time, lastUse map[[2]string]time.Time, crashUsed map[[2]string]bool) string {
	for k := len(causes) - 1; k >= 0; k-- {
		i := causes[k]
		if _, used := lastUse[[2]string{e.Source, fmt.Sprint(i)}]; !used {
			lastUse[[2]string{e.Source, fmt.Sprint(i)}] = e.Stored
			return e.Reason + " by " + c.h.Faults[i].Kind
		}
	}
	for _, i := range causes {
		since := lastUse[[2]string{e.Source, fmt.Sprint(i)}]
		for j, x := range crashes {
			ck := [2]string{e.Source, fmt.Sprint(j)}
			if crashUsed[ck] || !x.After(since) || (!e.Stored.IsZero() && !x.Before(e.Stored)) {
				continue
			}
			crashUsed[ck] = true
			lastUse[[2]string{e.Source, fmt.Sprint(i)}] = e.Stored
			return e.Reason + " by " + c.h.Faults[i].Kind + " again after a crash"
		}
	}
	return ""
}

func (c *checker) faultSummary() string {
	by := map[string]int{}
	for _, f := range c.h.Faults {
		by[f.Kind]++
	}
	if len(by) == 0 {
		return "none"
	}
	return fmt.Sprint(by)
}

// checkExits: every exit of relayd was asked for (see Exit.Explained).
func (c *checker) checkExits() {
	for _, x := range c.h.Exits {
		c.rep.Exits++
		if x.Explained() {
			continue
		}
		c.rep.UnexplainedExits++
		why := "not killed by the run"
		switch {
		case x.Killed && x.Failpoints == "":
			why = "SIGKILL the run did not send, no failpoint armed"
		case x.Killed:
			why = fmt.Sprintf("SIGKILL the run did not send, and no failpoint kill printed (armed: %s)", x.Failpoints)
		}
		c.fail(Finding{Check: "exit", Source: "relayd",
			Detail: fmt.Sprintf("relayd exited at %s (%s): %s; log tail:\n%s", x.At.Format("15:04:05.000"), x.Status, why, x.LogTail)})
	}
}

// checkFull: a full requested list (relayd resync --full) publishes every
// object of its source in scope at its toResourceVersion between its
// markers — at that version (for a source with ignoreChanges, a version
// that reads the same) — the unchanged ones too.
func (c *checker) checkFull() {
	for _, src := range sortedKeys(c.gaps) {
		for _, g := range c.gaps[src] {
			if !g.full {
				continue
			}
			c.rep.FullResyncs++
			for _, k := range c.objectsOf(src) {
				var state *Change
				for i, x := range c.byUID[k] {
					if x.RV <= g.to {
						state = &c.byUID[k][i]
					}
				}
				if state == nil || state.Type == Deleted || !c.inScope(*state) {
					continue
				}
				if c.republished(*state, g) {
					c.rep.FullRepublished++
					continue
				}
				c.fail(Finding{Check: "full", Source: src, UID: state.UID, Name: state.Name, RV: state.RV,
					Detail: fmt.Sprintf("full resync (epoch %d, %d..%d, seq %d..%d) did not republish the object at its state at %d (rv %d)", g.epoch, g.from, g.to, g.firstSeq, g.doneSeq, g.to, state.RV)})
			}
		}
	}
}

// objectsOf is the reference's objects of src, sorted.
func (c *checker) objectsOf(src string) [][2]string {
	var out [][2]string
	for k := range c.byUID {
		if k[0] == src {
			out = append(out, k)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i][1] < out[j][1] })
	return out
}

// republished reports whether an event of state's object inside g names
// state (or, with ignoreChanges, a version of its run).
func (c *checker) republished(state Change, g gap) bool {
	for _, x := range c.run(state) {
		for _, e := range c.events[[2]string{state.Source, state.UID}] {
			if e.Type != Deleted && e.RV == x.RV && g.firstSeq < e.Seq && e.Seq <= g.doneSeq {
				return true
			}
		}
	}
	return false
}
