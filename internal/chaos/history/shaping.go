package history

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// Marker starts every value the writer puts where relayd must never
// publish it: a dropped path, or the spec and status of a source with a
// metadata payload. The reader records whether a message contains it.
const Marker = "chaos-secret-"

// Shaping is how relayd shapes a source's events (its config), as far as
// the checker needs it (docs/CONFIGURATION.md, "Payload safety" and
// "Change filtering").
type Shaping struct {
	// Payload is the source's payload mode ("" is full).
	Payload string `json:"payload,omitempty"`
	// Drop are the source's drop paths (member names joined by dots).
	Drop []string `json:"drop,omitempty"`
	// IgnoreChanges are the source's ignoreChanges paths; the reference
	// then records a digest of each version without them (Change.Digest).
	IgnoreChanges []string `json:"ignoreChanges,omitempty"`
}

// Probed reports whether the reader probes the source's messages: it
// drops paths or does not publish the whole object.
func (s Shaping) Probed() bool {
	return len(s.Drop) > 0 || (s.Payload != "" && s.Payload != "full")
}

// Content is what the reader found in an object message of a source whose
// payload or drop paths are checked (nil: not probed).
type Content struct {
	// Payload is the message's relaydpayload.
	Payload string `json:"payload,omitempty"`
	// Members are the top-level members of its data.
	Members []string `json:"members,omitempty"`
	// Present are the source's drop paths found in its data.
	Present []string `json:"present,omitempty"`
	// Marker: the message (data or headers) contains Marker.
	Marker bool `json:"marker,omitempty"`
}

// ShapingReport counts what the shaping checks saw.
type ShapingReport struct {
	// Probed counts object messages whose content was checked (drop
	// paths, metadata payload).
	Probed int `json:"probed"`
	// Confined counts reference changes of ignoreChanges sources that
	// changed only ignored paths (not required on the stream);
	// Suppressed those of them that are not on it.
	Confined   int `json:"confined"`
	Suppressed int `json:"suppressed"`
	// IndexLostDeletes counts objects deleted inside an index-lost resync
	// whose delete is not on the stream: docs/GUARANTEES.md, "When the
	// bucket is missing, recreated, behind or corrupt" allows it (the
	// index that knew them is gone; the sync markers say so).
	IndexLostDeletes int `json:"indexLostDeletes"`
}

func (s ShapingReport) summary() string {
	return fmt.Sprintf(", shaping: %d messages probed, %d changes confined to ignored paths (%d not published), %d deletes inside index-lost resyncs not reported",
		s.Probed, s.Confined, s.Suppressed, s.IndexLostDeletes)
}

// payloadMembers are the only top-level members a metadata or reference
// payload may carry (docs/CONSUMING.md).
var payloadMembers = map[string][]string{
	"metadata":  {"apiVersion", "kind", "metadata"},
	"reference": {"apiVersion", "kind", "name", "namespace", "uid", "resourceVersion"},
}

// checkShaping: no message of a source with drop paths carries one of
// them or the marker value written there; no message of a source with a
// metadata or reference payload carries anything but apiVersion, kind and
// metadata, or the marker written into its spec and status. Every message,
// whatever its origin (watch, resync, initial) and type (deletes too).
func (c *checker) checkShaping() {
	for _, e := range c.h.Stream {
		sh, ok := c.h.Shaping[e.Source]
		if !ok || !sh.Probed() || e.Kind != "object" {
			continue
		}
		if e.Content == nil {
			c.fail(Finding{Check: "shaping", Source: e.Source, UID: e.UID, Name: e.Name, RV: e.RV, Detail: fmt.Sprintf("seq %d: the reader did not probe its content", e.Seq)})
			continue
		}
		c.rep.Shaping.Probed++
		f := Finding{Check: "shaping", Source: e.Source, UID: e.UID, Name: e.Name, RV: e.RV}
		var bad []string
		if len(e.Content.Present) > 0 {
			bad = append(bad, fmt.Sprintf("dropped paths %v present", e.Content.Present))
		}
		if sh.Payload == "metadata" || sh.Payload == "reference" {
			// A resync delete (final state unknown) carries a reference
			// payload whatever the source's (docs/GUARANTEES.md).
			want := sh.Payload
			if e.Unknown {
				want = "reference"
			}
			if e.Content.Payload != want {
				bad = append(bad, fmt.Sprintf("payload %q, want %q", e.Content.Payload, want))
			}
			for _, m := range e.Content.Members {
				if !slices.Contains(payloadMembers[want], m) {
					bad = append(bad, fmt.Sprintf("member %q in a %s payload", m, want))
				}
			}
		}
		if e.Content.Marker {
			bad = append(bad, fmt.Sprintf("a value relayd must not publish (%q…) is in the message", Marker))
		}
		if len(bad) > 0 {
			f.Detail = fmt.Sprintf("%s %s (seq %d, origin %s): %s", e.Type, e.ID, e.Seq, e.Origin, strings.Join(bad, "; "))
			c.fail(f)
		}
	}
}

// ignores reports whether src has ignoreChanges.
func (c *checker) ignores(src string) bool {
	return len(c.h.Shaping[src].IgnoreChanges) > 0
}

// required reports whether ch must be on the stream (or covered by a
// resync): everything but, for a source with ignoreChanges, a modified
// version whose digest (the object without the ignored paths) equals the
// previous version's. added and deleted are always required.
func (c *checker) required(ch Change) bool {
	if ch.Type != Modified || !c.ignores(ch.Source) || ch.Digest == "" {
		return true
	}
	l := c.byUID[[2]string{ch.Source, ch.UID}]
	i := slices.IndexFunc(l, func(x Change) bool { return x.RV == ch.RV && x.Type != Deleted })
	return i <= 0 || l[i-1].Type == Deleted || l[i-1].Digest != ch.Digest
}

// confined counts the changes required exempts, and those of them not on
// the stream.
func (c *checker) confined(ch Change) {
	c.rep.Shaping.Confined++
	if !c.onStream(ch, math.MaxUint64) {
		c.rep.Shaping.Suppressed++
	}
}

// run returns the versions of state's object that read the same as state
// apart from ignored paths: state itself and, for a source with
// ignoreChanges, its neighbours with the same digest (relayd publishes the
// first of them and suppresses the rest, or, in a relist, finds the
// object unchanged if the version it indexed is one of them).
func (c *checker) run(state Change) []Change {
	l := c.byUID[[2]string{state.Source, state.UID}]
	i := slices.IndexFunc(l, func(x Change) bool { return x.RV == state.RV && x.Type == state.Type })
	if i < 0 || state.Type == Deleted || !c.ignores(state.Source) || state.Digest == "" {
		return []Change{state}
	}
	lo, hi := i, i+1
	for lo > 0 && l[lo-1].Type != Deleted && l[lo-1].Digest == state.Digest {
		lo--
	}
	for hi < len(l) && l[hi].Type != Deleted && l[hi].Digest == state.Digest {
		hi++
	}
	return l[lo:hi]
}

// stateInList reports whether the object state ch (a non-delete) is on
// the stream inside the list g, at or before limit: ch itself or, with ignoreChanges, a
// version of its run.
func (c *checker) stateInList(ch Change, g gap, limit uint64) bool {
	for _, x := range c.run(ch) {
		if c.inList(x, g, limit) {
			return true
		}
	}
	return false
}

// sameState reports whether the object's version lastRV (its last event)
// is its version finalRV (the final LIST) as far as the source watches it.
func (c *checker) sameState(k [2]string, lastRV, finalRV int64) bool {
	if lastRV == finalRV {
		return true
	}
	for _, x := range c.byUID[k] {
		if x.RV == finalRV && x.Type != Deleted {
			for _, y := range c.run(x) {
				if y.RV == lastRV {
					return true
				}
			}
		}
	}
	return false
}

// indexLostDelete reports whether a delete inside g may be missing: g is
// an index-lost relist (the index that knew the object is gone). It
// records the object, whose last event then need not be a delete either.
func (c *checker) indexLostDelete(ch Change, g gap) bool {
	if g.reason != "index-lost" {
		return false
	}
	if c.indexLost == nil {
		c.indexLost = map[[2]string]bool{}
	}
	k := [2]string{ch.Source, ch.UID}
	if !c.indexLost[k] {
		c.indexLost[k] = true
		c.rep.Shaping.IndexLostDeletes++
	}
	return true
}
