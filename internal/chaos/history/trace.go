package history

import (
	"fmt"
	"math"
	"strings"
)

// checkTraces: a change whose event exceeds the NATS max payload even with
// the reference payload is never skipped without a trace on the stream
// (docs/GUARANTEES.md, "Other decisions an operator should know"). For
// every object History.Unencodable names:
//
//   - each of its reference changes is on the stream as an event flagged
//     relaydunencodable (check "untraced"), unless a resync covers the
//     change: then checkLost's gap rules apply, and the resync's own
//     events of the object are held to the next rule;
//   - each of its events on the stream is flagged (check "unflagged"): the
//     run's max payload fits them only without data, so one with data
//     means the run is not testing what it claims.
//
// Report.Unencodable counts the flagged events (first occurrences) and
// Report.UnencodableTraced the reference changes they traced.
func (c *checker) checkTraces() {
	if len(c.h.Unencodable) == 0 {
		return
	}
	named := map[[2]string]bool{}
	for _, n := range c.h.Unencodable {
		src, name, ok := strings.Cut(n, "/")
		if !ok || src == "" || name == "" {
			c.fail(Finding{Check: "untraced", Detail: fmt.Sprintf("History.Unencodable entry %q is not <source>/<name>", n)})
			continue
		}
		named[[2]string{src, name}] = true
	}
	flagged := map[key]bool{}
	for _, evs := range c.events {
		for _, e := range evs {
			if !named[[2]string{e.Source, e.Name}] {
				continue
			}
			if !e.Unencodable {
				c.fail(Finding{Check: "unflagged", Source: e.Source, UID: e.UID, Name: e.Name, RV: e.RV,
					Detail: fmt.Sprintf("%s at seq %d has no relaydunencodable flag, though the max payload fits this object's events only without data", e.Type, e.Seq)})
				continue
			}
			c.rep.Unencodable++
			if !e.Unknown {
				flagged[key{e.Source, e.UID, e.RV, e.Type == Deleted}] = true
			}
		}
	}
	for _, ch := range c.h.Reference {
		if !named[[2]string{ch.Source, ch.Name}] {
			continue
		}
		if flagged[key{ch.Source, ch.UID, ch.RV, ch.Type == Deleted}] {
			c.rep.UnencodableTraced++
			continue
		}
		if c.onStream(ch, math.MaxUint64) {
			continue // on the stream unflagged: reported above
		}
		if covered, _, _ := c.covering(ch, math.MaxUint64); covered {
			continue // checked by the lost and gap rules
		}
		c.fail(Finding{Check: "untraced", Source: ch.Source, UID: ch.UID, Name: ch.Name, RV: ch.RV,
			Detail: ch.Type + " of an object whose events fit the max payload only without data has no trace on the stream (no event flagged relaydunencodable)"})
	}
}
