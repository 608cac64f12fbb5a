package main

import (
	"strings"
	"testing"
)

// Lines as `relayd tail` prints them (pkg/tail.Format).
const (
	lineSync    = `06:24:33.469  sync.completed  source=widgets namespace=- epoch=1 reason=initial from="" to="217" counts={"total":0}`
	lineInitial = `06:24:33.467  added           Namespace              default                                  rv=14       origin=initial`
	lineAdded   = `06:24:33.473  added           ConfigMap              demo/cart                                rv=218      origin=watch`
)

func TestParseTailLine(t *testing.T) {
	e, ok := parseTailLine(lineSync)
	if !ok || e.Type != "sync.completed" || e.Source != "widgets" || e.NS != "-" || !e.isSync() {
		t.Errorf("sync line: got %+v, %v", e, ok)
	}
	e, ok = parseTailLine(lineInitial)
	if !ok || e.Type != "added" || e.key() != "Namespace default" || e.Origin != "initial" {
		t.Errorf("initial line: got %+v, %v", e, ok)
	}
	e, ok = parseTailLine(lineAdded)
	if !ok || e.key() != "ConfigMap demo/cart" || e.Origin != "watch" {
		t.Errorf("watch line: got %+v, %v", e, ok)
	}
	if _, ok := parseTailLine("2026-11-22T06:24:33Z  undecodable message on k8s.x: boom"); ok {
		t.Error("an undecodable-message line parsed as an event")
	}
}

func TestCheckLive(t *testing.T) {
	want := []expectation{{"ConfigMap demo/cart", []string{"added", "deleted"}}}
	never := []forbidden{{"ConfigMap demo/ignored", "no label"}}
	ev := func(typ, key, origin string) tailEvent {
		kind, name, _ := strings.Cut(key, " ")
		return tailEvent{Type: typ, Kind: kind, Name: name, Origin: origin}
	}
	for _, tc := range []struct {
		name      string
		evs       []tailEvent
		ok, final bool
		msg       string
	}{
		{"complete", []tailEvent{ev("added", "Namespace x", "initial"), ev("added", "ConfigMap demo/cart", "watch"), ev("deleted", "ConfigMap demo/cart", "watch")}, true, true, ""},
		{"missing", []tailEvent{ev("added", "ConfigMap demo/cart", "watch")}, false, false, "still missing deleted"},
		{"wrong order", []tailEvent{ev("deleted", "ConfigMap demo/cart", "watch"), ev("added", "ConfigMap demo/cart", "watch")}, false, true, "want added, deleted"},
		{"forbidden", []tailEvent{ev("added", "ConfigMap demo/ignored", "watch")}, false, true, "although no label"},
		{"unexpected", []tailEvent{ev("added", "ConfigMap demo/cart", "watch"), ev("deleted", "ConfigMap demo/cart", "watch"), ev("added", "Secret demo/s", "watch")}, false, true, "unexpected events added"},
	} {
		final, err := checkLive(tc.evs, want, never)
		if (err == nil) != tc.ok || final != tc.final || (err != nil && !strings.Contains(err.Error(), tc.msg)) {
			t.Errorf("%s: got final=%v err=%v", tc.name, final, err)
		}
	}
}
