package source

// Bad frames on a watch stream, from a fake apiserver: a real one does not
// send garbage, cut a frame in half, send an ERROR frame with an arbitrary
// code or an object without metadata on demand. In every case the watcher
// must name the problem, keep its position (the last good resourceVersion)
// and retry with backoff, or stop with a permanent error that names the
// source; it must never skip past the bad frame, panic or spin.

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"k8s.io/apimachinery/pkg/util/wait"
)

const cm6 = `{"type":"ADDED","object":{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"b","namespace":"ns","uid":"u2","resourceVersion":"6"}}}`

// scripted serves the i-th watch request with bodies[i] (the last one
// again for later requests) and records each request's resourceVersion.
type scripted struct {
	bodies []string
	mu     sync.Mutex
	rvs    []string
}

func (s *scripted) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	i := len(s.rvs)
	s.rvs = append(s.rvs, r.URL.Query().Get("resourceVersion"))
	s.mu.Unlock()
	if r.URL.Query().Get("watch") != "true" {
		http.Error(w, "unexpected request", http.StatusBadRequest)
		return
	}
	body := s.bodies[min(i, len(s.bodies)-1)]
	w.Header().Set("Content-Type", "application/json")
	_, _ = fmt.Fprint(w, body)
}

func (s *scripted) requests() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.rvs...)
}

func TestBadWatchFramesAreRetriedFromTheLastGoodPosition(t *testing.T) {
	tests := []struct {
		name   string
		bad    string // sent after one good frame (rv 6)
		reason string // relayd_watch_restarts_total reason
		logged string // in the "watch failed; retrying" log line's error
	}{
		{"non-JSON", "<html>502 Bad Gateway</html>\n", ReasonError, "invalid character '<' looking for beginning of value"},
		{"truncated", `{"type":"MODIFIED","object":{"metadata":{"name":"b","resourceVer`, ReasonClosed, "unexpected EOF"},
		{"not a frame", `{"kind":"Status","code":500}` + "\n", ReasonError, "bad watch frame: watch frame has no type"},
		{"object without metadata", `{"type":"MODIFIED","object":{"kind":"ConfigMap"}}` + "\n", ReasonError, "bad object in MODIFIED watch frame: missing metadata"},
		{"unknown type", `{"type":"RENAMED","object":{"metadata":{"resourceVersion":"7"}}}` + "\n", ReasonError, `unknown watch event type "RENAMED"`},
		{"500 status", `{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"etcdserver: request timed out","reason":"InternalError","code":500}}` + "\n", ReasonError, "etcdserver: request timed out"},
		{"status without a message", `{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"code":503}}` + "\n", ReasonError, "503"},
		{"ERROR without a Status", `{"type":"ERROR","object":{"spec":{"a":[1]}}}` + "\n", ReasonError, "ERROR watch frame"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := &scripted{bodies: []string{cm6 + "\n" + tc.bad}}
			core, logs := observer.New(zapcore.WarnLevel)
			wt, m := newWatcher(t, srv, Options{Backoff: wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Steps: 1 << 30, Cap: time.Minute}})
			wt.log = zap.New(core).With(zap.String("source", "s"))
			ctx, cancel := context.WithTimeout(t.Context(), 1500*time.Millisecond)
			defer cancel()
			var got []string
			err := wt.Run(ctx, Start{ResourceVersion: "5"}, func(_ context.Context, it *Item) error {
				got = append(got, it.ResourceVersion)
				return nil
			})
			if err != context.DeadlineExceeded {
				t.Fatalf("Run = %v, want it to keep retrying until the context ends", err)
			}
			// The first watch starts at the checkpoint, every retry at the last
			// good frame: nothing after it is skipped.
			reqs := srv.requests()
			if len(reqs) < 2 || reqs[0] != "5" {
				t.Fatalf("watch requests from %v, want 5 then retries", reqs)
			}
			for _, rv := range reqs[1:] {
				if rv != "6" {
					t.Fatalf("retried from %q (all: %v), want the last good resourceVersion 6", rv, reqs)
				}
			}
			// 100+200+400+800 ms of backoff in 1.5 s: a handful of attempts.
			if len(reqs) > 6 {
				t.Errorf("%d watch requests in 1.5s with 100ms doubling backoff: a hot loop", len(reqs))
			}
			if pos, _ := wt.Position(); pos != "6" {
				t.Errorf("position %q, want 6", pos)
			}
			for _, rv := range got {
				if rv != "6" {
					t.Errorf("handler saw %q: the bad frame was delivered as an item", rv)
				}
			}
			if n := testutil.ToFloat64(m.WatchRestarts.WithLabelValues("s", tc.reason)); n < 1 || int(n) > len(reqs)+1 {
				t.Errorf("watch_restarts{%s} = %v for %d requests", tc.reason, n, len(reqs))
			}
			entries := logs.FilterMessage("watch failed; retrying").All()
			if len(entries) == 0 {
				t.Fatalf("nothing logged; logs: %v", logs.All())
			}
			e := entries[0].ContextMap()
			if msg, _ := e["error"].(string); !strings.Contains(msg, tc.logged) || e["source"] != "s" || e["reason"] != tc.reason {
				t.Errorf("logged %v, want source s, reason %s and an error containing %q", e, tc.reason, tc.logged)
			}
		})
	}
}

// ERROR frames with 403 or 404 are permanent for this request: Run stops
// and says which source, resource and namespace, and what the server said.
func TestPermanentErrorFramesStopTheWatcherNamingTheSource(t *testing.T) {
	for _, tc := range []struct{ code, reason, status string }{
		{"403", ReasonForbidden, `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"configmaps is forbidden: User \"relayd\" cannot watch resource \"configmaps\" in API group \"\" in the namespace \"ns\"","reason":"Forbidden","code":403}`},
		{"404", ReasonNotFound, `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the server could not find the requested resource","reason":"NotFound","code":404}`},
	} {
		t.Run(tc.code, func(t *testing.T) {
			srv := &scripted{bodies: []string{cm6 + "\n" + `{"type":"ERROR","object":` + tc.status + "}\n"}}
			wt, m := newWatcher(t, srv, Options{Namespace: "ns"})
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			err := wt.Run(ctx, Start{ResourceVersion: "5"}, func(context.Context, *Item) error { return nil })
			if err == nil || ctx.Err() != nil {
				t.Fatalf("Run = %v, want a permanent error before the deadline", err)
			}
			var want string
			if tc.code == "403" {
				want = `source "s": list/watch configmaps (v1) in namespace ns: configmaps is forbidden: User "relayd" cannot watch resource "configmaps"`
			} else {
				want = `source "s": list/watch configmaps (v1) in namespace ns: the server could not find the requested resource`
			}
			if !strings.HasPrefix(err.Error(), want) {
				t.Errorf("Run = %q\nwant %q...", err, want)
			}
			if v := testutil.ToFloat64(m.WatchRestarts.WithLabelValues("s", tc.reason)); v != 1 {
				t.Errorf("watch_restarts{%s} = %v, want 1", tc.reason, v)
			}
			if pos, _ := wt.Position(); pos != "6" {
				t.Errorf("position %q after the error, want the last good 6", pos)
			}
		})
	}
}

// A 16 MiB object (far above NATS's default max payload) comes through as
// one item, intact.
func TestHugeWatchFrameIsDelivered(t *testing.T) {
	data := strings.Repeat("x", 16<<20)
	srv := &scripted{bodies: []string{`{"type":"ADDED","object":{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"big","namespace":"ns","uid":"u3","resourceVersion":"9"},"data":{"k":"` + data + `"}}}` + "\n"}}
	wt, _ := newWatcher(t, srv, Options{})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var size int
	var name string
	err := wt.Run(ctx, Start{ResourceVersion: "5"}, func(_ context.Context, it *Item) error {
		size, name = len(it.Object.Raw), it.Object.Meta.Name
		cancel()
		return nil
	})
	if err != context.Canceled || name != "big" || size < len(data) {
		t.Fatalf("Run = %v; item %q of %d bytes, want big of more than %d", err, name, size, len(data))
	}
}

// An object change without metadata.resourceVersion (no conforming
// apiserver sends one; an aggregated API might) must not move the position
// to "": the next watch would start from "now" and skip what happened in
// between. The watch resumes from the last real resourceVersion instead.
func TestObjectWithoutResourceVersionKeepsThePosition(t *testing.T) {
	noRV := `{"type":"MODIFIED","object":{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"b","namespace":"ns","uid":"u2"}}}`
	srv := &scripted{bodies: []string{cm6 + "\n" + noRV + "\n"}}
	wt, _ := newWatcher(t, srv, Options{Backoff: wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Steps: 1 << 30, Cap: time.Minute}})
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	var items []string
	_ = wt.Run(ctx, Start{ResourceVersion: "5"}, func(_ context.Context, it *Item) error {
		items = append(items, it.Object.Meta.Name+"@"+it.ResourceVersion)
		return nil
	})
	reqs := srv.requests()
	if len(reqs) < 2 {
		t.Fatalf("requests %v, want the watch resumed after the stream ended", reqs)
	}
	for _, rv := range reqs[1:] {
		if rv != "6" {
			t.Fatalf("resumed from resourceVersion %q (requests %v), want the last real one, 6", rv, reqs)
		}
	}
	if len(items) < 2 || items[0] != "b@6" || items[1] != "b@" {
		t.Errorf("items %v, want the change without a resourceVersion delivered with no position", items)
	}
}
