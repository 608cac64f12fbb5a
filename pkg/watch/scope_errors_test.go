package watch

import (
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/relayd/relayd/internal/retry"
	"github.com/relayd/relayd/pkg/config"
	"github.com/relayd/relayd/pkg/event"
	"github.com/relayd/relayd/pkg/source"
)

// A failed evaluation is counted and logged once per object version: a
// relist that evaluates the same version again adds nothing; the next
// version counts again.
func TestFilterErrorsOncePerObjectVersion(t *testing.T) {
	s, err := NewScope(&config.Source{Name: "cms", Filter: "object.data.x == 'y'"})
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.WarnLevel)
	w := &Watch{log: zap.New(core)}
	errs := prometheus.NewCounter(prometheus.CounterOpts{Name: "errs"})
	w.scope = scopeState{s: s, errs: errs, failed: retry.NewFailures(w.log, "filter evaluation failed", retry.AtLevel(zapcore.WarnLevel))}
	item := func(rv string) *source.Item {
		obj, err := event.ParseObject([]byte(`{"metadata":{"name":"a","namespace":"ns","uid":"u1","resourceVersion":"` + rv + `"},"data":{}}`))
		if err != nil {
			t.Fatal(err)
		}
		return &source.Item{Kind: source.ItemObject, Type: event.Added, Object: obj}
	}
	for _, rv := range []string{"1", "1", "1"} {
		if !w.inScope(item(rv)) {
			t.Fatal("fail open: the object is in scope")
		}
	}
	if n := testutil.ToFloat64(errs); n != 1 {
		t.Errorf("errors counted for one version evaluated 3 times: %v, want 1", n)
	}
	if n := logs.Len(); n != 1 {
		t.Errorf("log lines for one version evaluated 3 times: %d, want 1", n)
	}
	w.inScope(item("2"))
	if n := testutil.ToFloat64(errs); n != 2 {
		t.Errorf("errors counted after a second version: %v, want 2", n)
	}
}

// The set of failed versions is one per source and bounded: a filter that
// fails on every object of a source of many watches holds at most
// maxFailedVersions entries, then starts over.
func TestFailedVersionsAreBoundedPerSource(t *testing.T) {
	s, err := NewScope(&config.Source{Name: "cms", Filter: "object.data.x == 'y'"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range maxFailedVersions {
		if !s.firstFailure("u", strconv.Itoa(i)) {
			t.Fatalf("version %d: not the first failure", i)
		}
	}
	if s.firstFailure("u", "0") || len(s.failed) != maxFailedVersions {
		t.Fatalf("after %d versions: u/0 counted again or %d kept", maxFailedVersions, len(s.failed))
	}
	if !s.firstFailure("u", "new") || len(s.failed) != 1 {
		t.Errorf("past the bound the set starts over: %d kept, want 1", len(s.failed))
	}
}
