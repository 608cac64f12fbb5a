package history

import (
	"fmt"
	"slices"
	"sort"
)

// relistFor is the relist reason each fault kind exists to cause, for the
// kinds that always cause one (checkEvidence). The restarts of the
// apiserver's watch cache (apiserver-restart, apiserver-kill9,
// etcd-restart) are not here: relayd's resume gets 410 only when its
// position is older than the new cache's start, which it need not be.
var relistFor = map[string]string{
	FaultEtcdCompact:       "expired",
	FaultBucketDeleted:     "index-lost",
	FaultCheckpointDeleted: "no-checkpoint",
	FaultConfigChanged:     "config-changed",
	FaultResyncRequested:   "requested",
}

// everyFault are the kinds of relistFor of which every single fault must
// be followed by a relist it explains: an etcd compaction at the current
// revision (relayd's position, a resourceVersion of one of its objects,
// is older; a resume from it gets 410 Gone), the index bucket deleted
// (relayd relists every source at its next start, which follows: the run
// kills it). A checkpoint-deleted fault is not: a running relayd may write
// the key again before it is killed (then it resumes from it); of that
// kind, at least one fault must have caused its relist. Neither is a
// config change (relayd killed during the relist of an earlier change
// relists once for both) or a resync request (one sent while relayd is
// down, or dies with it, does nothing).
var everyFault = map[string]bool{FaultEtcdCompact: true, FaultBucketDeleted: true}

// checkEvidence (check "evidence"): a run that lacks what it exists for
// proves nothing, so the lack is a failure:
//
//   - the history has sources, reference changes, stream messages and
//     checkpoint samples; every source has a reference change and an
//     object event on the stream (a filtered source, if an object is in
//     its scope at the end: expectsEvents);
//   - every fault of a kind in relistFor is followed by a relist of the
//     reason it causes that it explains (relistCauses); of the kinds not
//     in everyFault, at least one fault per kind;
//   - a source with a filter has changes that made objects enter and
//     leave its scope (each then judged by the lost, gap and scope rules:
//     on the stream, flagged where relayd can tell, or covered by a
//     relist, which cannot tell an object that entered from one created
//     in its gap and flags neither — so the flagged events themselves are
//     counted, not required);
//   - a source whose messages the reader probes (drop paths, a metadata or
//     reference payload) has probed messages;
//   - objects named unencodable have events flagged relaydunencodable.
func (c *checker) checkEvidence() {
	h := c.h
	lack := func(src, format string, args ...any) {
		c.fail(Finding{Check: "evidence", Source: src, Detail: fmt.Sprintf(format, args...)})
	}
	if len(h.Sources) == 0 {
		lack("", "the history names no sources")
	}
	if len(h.Reference) == 0 {
		lack("", "no reference changes: the reference watch saw no write")
	}
	if len(h.Stream) == 0 {
		lack("", "the stream is empty")
	}
	if len(h.Samples) == 0 {
		lack("sampler", "no checkpoint samples: checkpoint-ahead checked nothing")
	}
	refs, events, scope, probed := map[string]int{}, map[string]int{}, map[string][2]int{}, map[string]int{}
	for _, ch := range h.Reference {
		refs[ch.Source]++
	}
	for _, evs := range c.events {
		for _, e := range evs {
			events[e.Source]++
			n := scope[e.Source]
			switch e.Scope {
			case ScopeEntered:
				n[0]++
			case ScopeLeft:
				n[1]++
			}
			scope[e.Source] = n
			if e.Content != nil {
				probed[e.Source]++
			}
		}
	}
	for _, src := range h.Sources {
		if refs[src] == 0 {
			lack(src, "no reference change of the source: the writer wrote none of its objects")
		}
		if events[src] == 0 && c.expectsEvents(src) {
			lack(src, "no object event of the source on the stream")
		}
	}
	for _, src := range sortedKeys(h.Filters) {
		m, n := c.transitions(src), scope[src]
		if m[0] == 0 || m[1] == 0 {
			lack(src, "filtered source: %d changes made an object enter its filter's scope and %d leave it, want both (%d events flagged relaydscope entered and %d left on the stream)", m[0], m[1], n[0], n[1])
		}
	}
	for _, src := range sortedKeys(h.Shaping) {
		if h.Shaping[src].Probed() && probed[src] == 0 {
			lack(src, "shaped source (drop %v, payload %q): no message of it was probed", h.Shaping[src].Drop, h.Shaping[src].Payload)
		}
	}
	if len(h.Unencodable) > 0 && c.rep.Unencodable == 0 {
		lack("", "%d objects named unencodable, but no event flagged relaydunencodable on the stream", len(h.Unencodable))
	}
	c.checkRelistEvidence()
}

// checkRelistEvidence: the relists the faults of relistFor cause were seen
// (see checkEvidence).
func (c *checker) checkRelistEvidence() {
	explains := map[int]bool{} // fault index -> explains some relist on the stream
	watchSeen := map[string]bool{}
	for _, e := range c.streamOrder() {
		if e.Kind == "object" && e.Origin == "watch" {
			watchSeen[e.Source] = true
		}
		if e.Kind != "sync.started" {
			continue
		}
		causes, _ := c.relistCauses(e, watchSeen[e.Source], false)
		for _, i := range causes {
			explains[i] = true
		}
	}
	kindSeen := map[string]bool{}
	for i, f := range c.h.Faults {
		if explains[i] {
			kindSeen[f.Kind] = true
		}
	}
	reported := map[string]bool{}
	for i, f := range c.h.Faults {
		want, ok := relistFor[f.Kind]
		if !ok || explains[i] {
			continue
		}
		switch {
		case everyFault[f.Kind]:
			c.fail(Finding{Check: "evidence", Source: "faults", RV: f.Rev,
				Detail: fmt.Sprintf("fault %s (%s) at %s was followed by no relist (reason %s) that it explains", f.Kind, f.Detail, f.At.Format("15:04:05.000"), want)})
		case !kindSeen[f.Kind] && !reported[f.Kind]:
			reported[f.Kind] = true
			c.fail(Finding{Check: "evidence", Source: "faults",
				Detail: fmt.Sprintf("%d %s faults, and no relist (reason %s) explained by any of them", c.countFaults(f.Kind), f.Kind, want)})
		}
	}
}

func (c *checker) countFaults(kind string) int {
	n := 0
	for _, f := range c.h.Faults {
		if f.Kind == kind {
			n++
		}
	}
	return n
}

// streamOrder is the stream's first occurrences of every message id, in
// stream order.
func (c *checker) streamOrder() []Event {
	stream := append([]Event(nil), c.h.Stream...)
	sort.SliceStable(stream, func(i, j int) bool { return stream[i].Seq < stream[j].Seq })
	seen := map[string]bool{}
	out := stream[:0]
	for _, e := range stream {
		id := cmpOr(e.MsgID, e.Source+"/"+e.ID)
		if !seen[id] {
			seen[id] = true
			out = append(out, e)
		}
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// expectsEvents reports whether source src must have object events on the
// stream: every source without a filter, and a filtered source with an
// object in its scope at the end (the final LIST), which a consumer's view
// holds only through an event. A filtered source whose objects entered and
// left scope only inside gaps (a kill -9, a 410) has nothing to publish:
// each relist found its scope as the object index had it.
func (c *checker) expectsEvents(src string) bool {
	if !c.filtered(src) {
		return true
	}
	for _, o := range c.h.Final {
		if o.Source == src && c.finalInScope(o) {
			return true
		}
	}
	return false
}
