package watch

import (
	"testing"

	"github.com/relayd/relayd/pkg/config"
	"github.com/relayd/relayd/pkg/event"
)

// The table of docs/CONSUMING.md, "Filters: entering and leaving scope",
// as scopeChange decides it (the real-server tests in pkg/relay check it
// on the stream).
func TestScopeChangeTable(t *testing.T) {
	const (
		watch, resync = event.OriginWatch, event.OriginResync
		add, mod, del = event.Added, event.Modified, event.Deleted
	)
	for _, tc := range []struct {
		typ         event.Type
		origin      event.Origin
		reason      event.RelistReason
		indexed, in bool
		want        event.Type
		scope       event.Scope
		publish     bool
	}{
		{add, watch, "", false, true, add, "", true},   // created matching
		{add, watch, "", false, false, add, "", false}, // created not matching
		{mod, watch, "", true, true, mod, "", true},
		{mod, watch, "", false, true, add, event.ScopeEntered, true},
		{mod, watch, "", true, false, del, event.ScopeLeft, true},
		{mod, watch, "", false, false, mod, "", false},
		{del, watch, "", true, false, del, "", true}, // deleted while matching
		{del, watch, "", false, false, del, "", false},
		{add, resync, event.RelistExpired, false, true, add, "", true}, // created or entered in a gap: unknown
		{add, resync, event.RelistExpired, true, false, del, event.ScopeLeft, true},
		{add, resync, event.RelistExpired, true, true, add, "", true}, // the index decides added/modified/unchanged
		{add, resync, event.RelistExpired, false, false, add, "", false},
		{add, resync, event.RelistConfigChanged, false, true, add, event.ScopeEntered, true},
		{add, resync, event.RelistConfigChanged, true, false, del, event.ScopeLeft, true},
	} {
		typ, scope, publish := scopeChange(tc.typ, tc.origin, tc.indexed, tc.in, tc.reason)
		if typ != tc.want || scope != tc.scope || publish != tc.publish {
			t.Errorf("%+v: got %s %q %v", tc, typ, scope, publish)
		}
	}
}

// The hash changes with the filter and filterOnError; the default and
// include hash alike; no filter is "".
func TestScopeHash(t *testing.T) {
	h := func(f string, on config.FilterOnError) string {
		return ScopeHash(&config.Source{Filter: f, FilterOnError: on})
	}
	if h("", "") != "" || h("", config.FilterOnErrorExclude) != "" {
		t.Error("no filter must hash to \"\"")
	}
	a := h("object.x == 1", "")
	if a == "" || a != h("object.x == 1", config.FilterOnErrorInclude) {
		t.Error("the default filterOnError must hash as include")
	}
	if a == h("object.x == 1", config.FilterOnErrorExclude) || a == h("object.x == 2", "") {
		t.Error("a different filter or filterOnError must hash differently")
	}
}
