package history

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// bracket is one list of a source: its sync.started and, once it
// completed, its sync.completed (first occurrences).
type bracket struct {
	started   Event
	completed *Event
	problems  []string // why its markers are not a valid gap
}

func (b *bracket) problem(format string, args ...any) {
	b.problems = append(b.problems, fmt.Sprintf(format, args...))
}

// checkBrackets checks every list's markers (see the package
// documentation, "bracketed gaps") and keeps the valid, completed ones as
// the gaps that may cover lost changes.
func (c *checker) checkBrackets() {
	byKey := map[[2]string]*bracket{}
	var all []*bracket
	for _, e := range c.starts {
		b := &bracket{started: e}
		byKey[[2]string{e.Source, fmt.Sprint(e.Epoch)}] = b
		all = append(all, b)
	}
	for _, e := range c.completes {
		b := byKey[[2]string{e.Source, fmt.Sprint(e.Epoch)}]
		if b == nil {
			c.fail(Finding{Check: "bracket", Source: e.Source, RV: e.From,
				Detail: fmt.Sprintf("sync.completed (reason %s, epoch %d, seq %d) without a sync.started of its epoch", e.Reason, e.Epoch, e.Seq)})
			continue
		}
		b.completed = &e
		s := b.started
		if e.Seq < s.Seq {
			b.problem("sync.completed (seq %d) before its sync.started (seq %d)", e.Seq, s.Seq)
		}
		if e.From != s.From || e.Reason != s.Reason {
			b.problem("sync.completed says reason %s from %d, its sync.started reason %s from %d", e.Reason, e.From, s.Reason, s.From)
		}
	}
	c.checkListEvents(byKey)
	prev := map[string]*bracket{} // source -> its previous list
	head := map[*bracket]uint64{} // list -> sync.started seq of the first list it redoes
	for i, b := range all {
		head[b] = b.started.Seq
		if p := prev[b.started.Source]; p != nil && p.completed == nil && p.started.From == b.started.From && p.started.Reason == b.started.Reason {
			head[b] = head[p]
		}
		prev[b.started.Source] = b
		c.checkPosition(b)
		if b.completed == nil {
			c.checkAborted(b, all[i+1:])
		}
		s := b.started
		if len(b.problems) > 0 {
			c.fail(Finding{Check: "bracket", Source: s.Source, RV: s.From,
				Detail: fmt.Sprintf("list (reason %s, epoch %d, sync.started seq %d): %s", s.Reason, s.Epoch, s.Seq, strings.Join(b.problems, "; "))})
			continue
		}
		if b.completed != nil {
			d := b.completed
			c.gaps[s.Source] = append(c.gaps[s.Source], gap{from: d.From, to: d.To, startedSeq: s.Seq, firstSeq: head[b], doneSeq: d.Seq, reason: d.Reason, epoch: d.Epoch, full: d.Full || s.Full})
		}
	}
}

// checkListEvents: every list event (origin resync or initial) of an epoch
// is stored after that epoch's sync.started and, once it completed, before
// its sync.completed.
func (c *checker) checkListEvents(byKey map[[2]string]*bracket) {
	keys := make([][2]string, 0, len(c.events))
	for k := range c.events {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i][0]+keys[i][1] < keys[j][0]+keys[j][1] })
	for _, k := range keys {
		for _, e := range c.events[k] {
			if e.Origin != "resync" && e.Origin != "initial" {
				continue
			}
			f := Finding{Check: "bracket", Source: e.Source, UID: e.UID, Name: e.Name, RV: e.RV}
			b := byKey[[2]string{e.Source, fmt.Sprint(e.Epoch)}]
			switch {
			case b == nil:
				f.Detail = fmt.Sprintf("%s %s (origin %s, epoch %d, seq %d) without a sync.started of its epoch", e.Type, e.ID, e.Origin, e.Epoch, e.Seq)
			case e.Seq < b.started.Seq:
				f.Detail = fmt.Sprintf("%s %s (origin %s, epoch %d, seq %d) before its sync.started (seq %d)", e.Type, e.ID, e.Origin, e.Epoch, e.Seq, b.started.Seq)
			case b.completed != nil && e.Seq > b.completed.Seq:
				f.Detail = fmt.Sprintf("%s %s (origin %s, epoch %d, seq %d) after its sync.completed (seq %d)", e.Type, e.ID, e.Origin, e.Epoch, e.Seq, b.completed.Seq)
			default:
				continue
			}
			c.fail(f)
			if b != nil {
				b.problem("an event of it is outside its markers (seq %d)", e.Seq)
			}
		}
	}
}

// checkPosition: a list's fromResourceVersion is relayd's position, at or
// after the last checkpoint of the source read (sampled) before
// sync.started was stored, and the last one written (the ConfigMap's
// writes the reference saw) before it; only a list without a position
// (initial, no-checkpoint) starts from none.
func (c *checker) checkPosition(b *bracket) {
	s := b.started
	if s.From == 0 {
		if s.Reason != "initial" && s.Reason != "no-checkpoint" {
			b.problem("reason %s without a fromResourceVersion", s.Reason)
		}
		return
	}
	if s.Stored.IsZero() {
		return
	}
	var last *Sample
	for i, x := range c.h.Samples {
		read := x.Read
		if read.IsZero() {
			read = x.At
		}
		if x.Source == s.Source && read.Before(s.Stored) && (last == nil || x.At.After(last.At)) {
			last = &c.h.Samples[i]
		}
	}
	if last != nil && s.From < last.CheckpointRV {
		b.problem("fromResourceVersion %d is before the checkpoint %d read at %s, before sync.started was stored at %s",
			s.From, last.CheckpointRV, last.At.Format("15:04:05.000"), s.Stored.Format("15:04:05.000"))
	}
	// The checkpoint as written: the source's key after the last write of
	// the ConfigMap seen before sync.started was stored (written at or
	// before it was seen). A write that removed the key (a deleted
	// checkpoint) bounds nothing.
	var written *CheckpointWrite
	for i, w := range c.h.Checkpoints {
		if w.Source == s.Source && w.Seen.Before(s.Stored) && (written == nil || w.Rev > written.Rev) {
			written = &c.h.Checkpoints[i]
		}
	}
	if written != nil && s.From < written.CheckpointRV {
		b.problem("fromResourceVersion %d is before the checkpoint %d written at revision %d (seen %s), before sync.started was stored at %s",
			s.From, written.CheckpointRV, written.Rev, written.Seen.Format("15:04:05.000"), s.Stored.Format("15:04:05.000"))
	}
}

// checkAborted: a list without sync.completed was aborted (its list failed,
// or relayd crashed) and must be redone: a later list of the source from
// the same position for the same reason (relayd's epoch moves on with every
// list, after a crash too: see docs/GUARANTEES.md, the `_epoch` key).
//
// A requested list is the exception: the request dies with the process
// that took it (`relayd resync` reports the failure), so nothing redoes
// it; its events are versions and deletes of their own, and it covers
// nothing.
func (c *checker) checkAborted(b *bracket, later []*bracket) {
	if b.started.Reason == "requested" {
		return
	}
	for _, n := range later {
		if n.started.Source != b.started.Source {
			continue
		}
		if n.started.From != b.started.From || n.started.Reason != b.started.Reason {
			b.problem("never completed, and the next list of the source (epoch %d) is reason %s from %d, not the same list redone",
				n.started.Epoch, n.started.Reason, n.started.From)
		}
		return
	}
	b.problem("never completed (no sync.completed of its epoch, and no later list of the source redid it)")
}

// retried reports whether the list that sync.started e begins redoes an
// aborted list (see checkAborted): it is then the same relist, not
// another one.
func (c *checker) retried(e Event, prev map[string]*Event, completed map[[2]string]bool) bool {
	p := prev[e.Source]
	return p != nil && !completed[[2]string{p.Source, fmt.Sprint(p.Epoch)}] && p.From == e.From && p.Reason == e.Reason
}

// crashes are the times relayd died during the run: its recorded exits,
// or (in histories recorded before exits were kept) its kill -9 faults.
func (c *checker) crashes() []time.Time {
	var out []time.Time
	if c.h.Exits != nil {
		for _, x := range c.h.Exits {
			out = append(out, x.At)
		}
		return out
	}
	for _, f := range c.h.Faults {
		if f.Kind == "kill-9" || f.Kind == "kill-9-down" {
			out = append(out, f.At)
		}
	}
	return out
}

// checkSampling: every source has a checkpoint sample, at most half of the
// sampler's tries that the servers answered failed, and every fault is
// followed by a sample (so that checkpoint-ahead checked something around
// it).
func (c *checker) checkSampling() {
	h := c.h
	c.rep.SampleAttempts, c.rep.SampleErrors, c.rep.SampleUnavailable = h.SampleAttempts, h.SampleErrors, h.SampleUnavailable
	per := map[string]int{}
	var last time.Time
	for _, s := range h.Samples {
		per[s.Source]++
		if s.At.After(last) {
			last = s.At
		}
	}
	for _, src := range h.Sources {
		if per[src] == 0 {
			c.fail(Finding{Check: "samples", Source: src, Detail: fmt.Sprintf("no checkpoint sample of the source (%d tries, %d failed)", h.SampleAttempts, h.SampleErrors)})
		}
	}
	// Tries while a server was down cannot sample (they fail fast, so a
	// restart scenario has most of its tries fail): they are excused, and
	// every fault must still be followed by a sample.
	answered, failed := h.SampleAttempts-h.SampleUnavailable, h.SampleErrors-h.SampleUnavailable
	if h.SampleAttempts > 0 && 2*failed > answered {
		c.fail(Finding{Check: "samples", Source: "sampler", Detail: fmt.Sprintf("%d of the %d checkpoint sampling tries the servers answered yielded no sample of some source (more than half; %d more tries found a server unavailable)", failed, answered, h.SampleUnavailable)})
	}
	for _, f := range h.Faults {
		if f.Kind != "error" && !last.After(f.At) {
			c.fail(Finding{Check: "samples", Source: "sampler", Detail: fmt.Sprintf("no checkpoint sample after the fault %s at %s", f.Kind, f.At.Format("15:04:05.000"))})
		}
	}
}
