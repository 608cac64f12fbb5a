package main

import (
	"errors"
	"testing"
)

// Every row of the ordering rule (docs/CONSUMING.md, "Keeping a view of the
// cluster", rules 2 and 3), without servers.
func TestDecide(t *testing.T) {
	live := func(rv string) *Entry { return &Entry{ResourceVersion: rv} }
	dead := func(rv string) *Entry { return &Entry{ResourceVersion: rv, Deleted: true} }
	for _, tc := range []struct {
		name string
		held *Entry
		typ  string
		rv   string
		want Action
	}{
		{"first sight of an object", nil, "added", "10", Store},
		{"first sight, a modified (the added is older than the stream)", nil, "modified", "10", Store},
		{"first sight is a delete: tombstone", nil, "deleted", "10", Delete},
		{"newer version", live("10"), "modified", "11", Store},
		{"versions compare as integers, not strings", live("9"), "modified", "10", Store},
		{"duplicate (same id)", live("10"), "modified", "10", Skip},
		{"replay of an older version", live("11"), "modified", "10", Skip},
		{"replayed added after a modified", live("11"), "added", "10", Skip},
		{"delete of the held version (a relist's final-state-unknown delete)", live("10"), "deleted", "10", Delete},
		{"delete at a newer version", live("10"), "deleted", "12", Delete},
		{"delete older than the held version (replayed)", live("12"), "deleted", "10", Skip},
		{"duplicate delete", dead("10"), "deleted", "10", Skip},
		{"an older added after the delete stays dead", dead("10"), "added", "9", Skip},
		{"the same version after the delete stays dead", dead("10"), "modified", "10", Skip},
		{"newer version after a relist's delete (matches the selector again)", dead("10"), "modified", "15", Store},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Decide(tc.held, tc.typ, tc.rv)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("Decide(%+v, %s, %s) = %v, want %v", tc.held, tc.typ, tc.rv, got, tc.want)
			}
		})
	}
	if _, err := Decide(live("10"), "modified", "abc"); !errors.Is(err, ErrIncomparable) {
		t.Errorf("a resourceVersion that is not an integer: %v, want ErrIncomparable", err)
	}
}

// The --follow flag's form.
func TestParseScope(t *testing.T) {
	for in, want := range map[string]Scope{
		"cms=v1/configmaps@shop":        {Source: "cms", Version: "v1", Resource: "configmaps", Namespace: "shop"},
		"deploys=apps/v1/deployments":   {Source: "deploys", Group: "apps", Version: "v1", Resource: "deployments"},
		"w=example.com/v1/widgets@demo": {Source: "w", Group: "example.com", Version: "v1", Resource: "widgets", Namespace: "demo"},
	} {
		if got, err := ParseScope(in); err != nil || got != want {
			t.Errorf("ParseScope(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "cms", "cms=configmaps", "=v1/configmaps", "cms=a/b/c/d", "c.ms=v1/configmaps"} {
		if s, err := ParseScope(in); err == nil {
			t.Errorf("ParseScope(%q) = %+v, want an error", in, s)
		}
	}
}
