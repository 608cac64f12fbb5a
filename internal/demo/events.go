package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// tailEvent is one line printed by `relayd tail` (pkg/tail.Format), split
// back into its fields:
//
//	15:04:05.000  added           ConfigMap              demo/cart      rv=123      origin=watch
//	15:04:05.000  sync.completed  source=widgets namespace=- epoch=1 reason=initial from="" to="42" counts={"total":0}
type tailEvent struct {
	Type   string // added, modified, deleted, sync.started, sync.completed
	Kind   string // object events
	Name   string // object events: namespace/name, or name when cluster-scoped
	Origin string // object events: watch, initial, resync
	Source string // sync events
	NS     string // sync events: the watch's namespace, "-" for all/cluster
}

func (e tailEvent) isSync() bool { return strings.HasPrefix(e.Type, "sync.") }

// key names the object of an object event, e.g. "ConfigMap demo/cart".
func (e tailEvent) key() string { return e.Kind + " " + e.Name }

func parseTailLine(line string) (tailEvent, bool) {
	f := strings.Fields(line)
	if len(f) < 4 {
		return tailEvent{}, false
	}
	e := tailEvent{Type: f[1]}
	if e.isSync() {
		for _, kv := range f[2:] {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "source":
				e.Source = v
			case "namespace":
				e.NS = v
			}
		}
		return e, e.Source != ""
	}
	if len(f) < 6 {
		return tailEvent{}, false
	}
	e.Kind, e.Name = f[2], f[3]
	for _, kv := range f[4:] {
		if v, ok := strings.CutPrefix(kv, "origin="); ok {
			e.Origin = v
		}
	}
	return e, e.Origin != ""
}

// eventLog collects what tail printed and lets the demo wait for it.
type eventLog struct {
	mu      sync.Mutex
	events  []tailEvent
	bad     []string      // lines that could not be parsed
	changed chan struct{} // closed and replaced on every line
}

func newEventLog() *eventLog { return &eventLog{changed: make(chan struct{})} }

func (l *eventLog) add(line string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e, ok := parseTailLine(line); ok {
		l.events = append(l.events, e)
	} else {
		l.bad = append(l.bad, line)
	}
	close(l.changed)
	l.changed = make(chan struct{})
}

func (l *eventLog) snapshot() ([]tailEvent, []string, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.events), slices.Clone(l.bad), l.changed
}

// waitFor calls check with the events so far, and again on every new line,
// until it returns nil or a final error, or ctx ends; abort ends the wait
// early with the error it returns (e.g. relayd exited). It returns check's
// last error.
func (l *eventLog) waitFor(ctx context.Context, abort func() error, check func([]tailEvent) (final bool, err error)) error {
	for {
		evs, _, changed := l.snapshot()
		final, err := check(evs)
		if err == nil || final {
			return err
		}
		if aerr := abort(); aerr != nil {
			return fmt.Errorf("%w\n%v", aerr, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w\n%v", ctx.Err(), err)
		case <-changed:
		case <-time.After(250 * time.Millisecond): // for abort
		}
	}
}

// expectation is the sequence of live events one object must produce.
type expectation struct {
	Key   string   // "ConfigMap demo/cart"
	Types []string // in order
}

// forbidden are objects the demo changes that relayd must not publish.
type forbidden struct {
	Key, Why string
}

// checkLive compares the live (origin=watch) events with the expectations.
// It returns nil when every object produced exactly its sequence and
// nothing else was published, otherwise a description of the difference;
// final reports that waiting longer cannot help (something wrong already
// arrived).
func checkLive(evs []tailEvent, want []expectation, never []forbidden) (final bool, err error) {
	got := map[string][]string{}
	var order []string
	for _, e := range evs {
		if e.isSync() || e.Origin != "watch" {
			continue
		}
		if _, ok := got[e.key()]; !ok {
			order = append(order, e.key())
		}
		got[e.key()] = append(got[e.key()], e.Type)
	}
	var problems []string
	for _, w := range want {
		g := got[w.Key]
		switch {
		case slices.Equal(g, w.Types):
		case len(g) < len(w.Types) && slices.Equal(g, w.Types[:len(g)]):
			problems = append(problems, fmt.Sprintf("%s: still missing %s (got %s)", w.Key, strings.Join(w.Types[len(g):], ", "), listOrNone(g)))
		default:
			problems = append(problems, fmt.Sprintf("%s: got %s, want %s", w.Key, listOrNone(g), strings.Join(w.Types, ", ")))
			final = true
		}
	}
	for _, n := range never {
		if g, ok := got[n.Key]; ok {
			problems = append(problems, fmt.Sprintf("%s: published (%s) although %s", n.Key, strings.Join(g, ", "), n.Why))
			final = true
		}
	}
	for _, k := range order {
		if !slices.ContainsFunc(want, func(w expectation) bool { return w.Key == k }) &&
			!slices.ContainsFunc(never, func(n forbidden) bool { return n.Key == k }) {
			problems = append(problems, fmt.Sprintf("%s: unexpected events %s", k, strings.Join(got[k], ", ")))
			final = true
		}
	}
	if len(problems) == 0 {
		return true, nil
	}
	return final, fmt.Errorf("%s", "  - "+strings.Join(problems, "\n  - "))
}

func listOrNone(s []string) string {
	if len(s) == 0 {
		return "nothing"
	}
	return strings.Join(s, ", ")
}
