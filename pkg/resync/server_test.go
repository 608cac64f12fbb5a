package resync

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/relayd/relayd/pkg/event"
	"github.com/relayd/relayd/pkg/watch"
)

// fakeWatch is a Target that records what it was asked; running, when
// set, is the id of a resync it is still running.
type fakeWatch struct {
	ns      string
	running string
	asked   []watch.Request
}

func (f *fakeWatch) Namespace() string { return f.ns }

func (f *fakeWatch) Resyncing() string { return f.running }

func (f *fakeWatch) Resync(r watch.Request) (string, error) {
	if f.running != "" && f.running != r.ID {
		return f.running, watch.ErrResyncRunning
	}
	f.asked = append(f.asked, r)
	return "", nil
}

func ask(t *testing.T, s *Server, ts []Target, req Request) Reply {
	t.Helper()
	b, _ := json.Marshal(req)
	rep, ok := s.serve("cms", ts, "_INBOX.op.1", b)
	if !ok {
		t.Fatalf("request %+v on an inbox was not answered", req)
	}
	return rep
}

// The server's decisions that a real relayd does not make on cue: a
// resync refused while another runs (and its id then not remembered), the
// duplicate's reply with the counts of the watches already completed, and
// the refusals of a bad id and of a namespace the source does not watch.
func TestServerDecisions(t *testing.T) {
	s := NewServer(ServerOptions{Logger: zap.NewNop()})
	a, b := &fakeWatch{ns: "a"}, &fakeWatch{ns: "b", running: "other"}
	ts := []Target{a, b}

	if rep := ask(t, s, ts, Request{ID: "r1"}); rep.Error != `source "cms": resync "other" is still running; retry when it completed` {
		t.Errorf("while another resync runs: %+v", rep)
	}
	if len(a.asked) != 0 {
		t.Errorf("while b runs another resync, a was asked %v: the source half-accepted the request", a.asked)
	}
	b.running = ""
	rep := ask(t, s, ts, Request{ID: "r1", Full: true})
	if rep.Error != "" || rep.Duplicate || len(rep.Namespaces) != 2 {
		t.Fatalf("r1 once b is free: %+v (the refused r1 must not count as accepted)", rep)
	}
	a.asked[len(a.asked)-1].Done(event.SyncCounts{Total: 3, Unchanged: 3})
	rep = ask(t, s, ts, Request{ID: "r1", Full: true})
	if !rep.Duplicate || len(rep.Completed) != 1 || rep.Completed["a"].Total != 3 || len(b.asked) != 1 {
		t.Errorf("r1 again: %+v, b asked %d times; want a duplicate with a's counts, b asked once", rep, len(b.asked))
	}
	if rep := ask(t, s, ts, Request{ID: "bad id"}); rep.Error != `request id "bad id": want 1 to 64 characters of A-Z a-z 0-9 . _ -` {
		t.Errorf("bad id: %+v", rep)
	}
	if rep := ask(t, s, ts, Request{ID: "r2", Namespace: "zzz"}); rep.Error != `source "cms" does not watch namespace "zzz" (it watches a, b)` {
		t.Errorf("unwatched namespace: %+v", rep)
	}
	if rep := ask(t, s, []Target{&fakeWatch{}}, Request{ID: "r3", Namespace: "zzz"}); rep.Error != `source "cms" watches all namespaces (or a cluster-scoped kind) in one watch: --namespace cannot narrow its resync` {
		t.Errorf("narrowing an all-namespaces watch: %+v", rep)
	}
}

// The reply subjects of the attacks relayd's answer must never reach (an
// event of this cluster's stream and of another cluster's, an index
// entry, the JetStream API), and the inboxes it answers on.
func TestReplyPolicy(t *testing.T) {
	p := ReplyPolicy{Inboxes: []string{"_INBOX", "_INBOX_operator", "ops.inbox"}, Never: []string{"k8s", "k8s-ctl"}}
	for _, reply := range []string{
		"_INBOX.abc", "_INBOX.abc.1", "_INBOX_operator.x.y", "ops.inbox.z",
	} {
		if why := p.Check(reply); why != "" {
			t.Errorf("%q refused: %s", reply, why)
		}
	}
	for reply, want := range map[string]string{
		"k8s.my-cluster.configmaps.default.forged":        `is under relayd's own k8s`,
		"k8s.west.configmaps.default.forged":              `is under relayd's own k8s`,
		"k8s-ctl.my-cluster.resync.cms":                   `is under relayd's own k8s-ctl`,
		"$KV.relayd-index-my-cluster._epoch.configmaps._": `is a system subject`,
		"$JS.API.STREAM.PURGE.K8S":                        `is a system subject`,
		"$O.bucket.x":                                     `is a system subject`,
		"$SYS.REQ.SERVER.PING":                            `is a system subject`,
		"":                                                `has no reply subject`,
		"_INBOX":                                          `under none of the inbox prefixes`,
		"_INBOX.":                                         `is not a literal subject`,
		"_INBOX.>":                                        `is not a literal subject`,
		"_INBOX.*.x":                                      `is not a literal subject`,
		"_INBOX.a b":                                      `is not a literal subject`,
		"_INBOXX.a":                                       `under none of the inbox prefixes relayd answers on (_INBOX, _INBOX_operator, ops.inbox; resync.requesterInboxPrefixes)`,
		"ops.a":                                           `under none of the inbox prefixes`,
		"K8S.x":                                           `under none of the inbox prefixes`,
	} {
		if why := p.Check(reply); !strings.Contains(why, want) {
			t.Errorf("%q: %q, want it refused: …%s…", reply, why, want)
		}
	}
	// A reply subject a stream relayd knows captures: refused.
	p.Captured = func() []string { return []string{"other.>", "_INBOX.captured.*", "_INBOX_operator.>"} }
	for reply, want := range map[string]string{
		"_INBOX.captured.x":   `is captured by a stream (its subject "_INBOX.captured.*")`,
		"_INBOX_operator.x":   `is captured by a stream (its subject "_INBOX_operator.>")`,
		"_INBOX.captured.x.y": ``,
		"_INBOX.captured":     ``,
		"_INBOX.abc":          ``,
	} {
		if why := p.Check(reply); (want == "") != (why == "") || !strings.Contains(why, want) {
			t.Errorf("%q with streams capturing %v: %q, want %q", reply, p.Captured(), why, want)
		}
	}
	// An inbox prefix under relayd's own subjects is still refused there.
	p = ReplyPolicy{Inboxes: []string{"k8s"}, Never: []string{"k8s"}}
	if why := p.Check("k8s.my-cluster.x"); why == "" {
		t.Error("an inbox prefix over relayd's event prefix let a reply through")
	}
}

// A request whose reply subject is refused is neither answered nor acted
// on, counted, and logged in summary: the first at once, the next ones at
// most once a minute with their number.
func TestServerRefusesReplySubjects(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	m.InitSource("cms")
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	s := NewServer(ServerOptions{Logger: zap.New(core), Metrics: m, Now: func() time.Time { return now },
		Replies: ReplyPolicy{Inboxes: []string{"_INBOX"}, Never: []string{"k8s", "k8s-ctl"}}})
	w := &fakeWatch{ns: "a"}
	body, _ := json.Marshal(Request{ID: "f1", Full: true})
	forged := []string{"k8s.my-cluster.configmaps.default.forged", "k8s.west.configmaps.default.forged",
		"$KV.relayd-index-my-cluster._epoch.configmaps._", "$JS.API.STREAM.PURGE.K8S", ""}
	for _, reply := range forged {
		if rep, ok := s.serve("cms", []Target{w}, reply, body); ok {
			t.Errorf("reply subject %q: answered %+v", reply, rep)
		}
	}
	if len(w.asked) != 0 {
		t.Errorf("requests with refused reply subjects made the watch relist: %+v", w.asked)
	}
	if got := testutil.ToFloat64(m.Requests.WithLabelValues("cms", ResultBadReply)); got != float64(len(forged)) {
		t.Errorf("relayd_resync_requests_total{result=bad_reply} = %v, want %d", got, len(forged))
	}
	lines := logs.FilterMessageSnippet("not answered and not acted on").All()
	if len(lines) != 1 || lines[0].ContextMap()["replySubject"] != forged[0] || lines[0].ContextMap()["requests"] != int64(1) {
		t.Fatalf("log after %d refusals within a minute: %+v; want one line naming the first reply subject", len(forged), lines)
	}
	now = now.Add(time.Minute)
	s.serve("cms", []Target{w}, "k8s.my-cluster.x", body)
	lines = logs.FilterMessageSnippet("not answered and not acted on").All()
	if len(lines) != 2 || lines[1].ContextMap()["replySubject"] != "k8s.my-cluster.x" || lines[1].ContextMap()["requests"] != int64(len(forged)) {
		t.Fatalf("a minute later: %+v; want a second line summing up the %d refusals since the first", lines, len(forged))
	}
	// The same request on an inbox: answered and accepted.
	if rep, ok := s.serve("cms", []Target{w}, "_INBOX.op.7", body); !ok || rep.Error != "" || len(w.asked) != 1 {
		t.Errorf("on an inbox: answered %v, %+v, watch asked %d times", ok, rep, len(w.asked))
	}
	if got := testutil.ToFloat64(m.Requests.WithLabelValues("cms", ResultAccepted)); got != 1 {
		t.Errorf("relayd_resync_requests_total{result=accepted} = %v, want 1", got)
	}
}

// Per source one resync at a time (whatever its namespaces), and full
// resyncs at least MinFullInterval apart from the start and from the
// completion of the last; the same id again stays a duplicate.
func TestServerRateLimits(t *testing.T) {
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)
	s := NewServer(ServerOptions{Logger: zap.NewNop(), Metrics: m, MinFullInterval: 5 * time.Minute, Now: func() time.Time { return now }})
	a, b := &fakeWatch{ns: "a"}, &fakeWatch{ns: "b"}
	ts := []Target{a, b}
	complete := func(w *fakeWatch, total int64) {
		r := w.asked[len(w.asked)-1]
		w.running = ""
		r.Done(event.SyncCounts{Total: total})
	}

	// Namespace a's resync runs: namespace b's is refused, b not asked.
	if rep := ask(t, s, ts, Request{ID: "n1", Namespace: "a"}); rep.Error != "" {
		t.Fatalf("n1: %+v", rep)
	}
	a.running = "n1"
	if rep := ask(t, s, ts, Request{ID: "n2", Namespace: "b"}); rep.Error != `source "cms": resync "n1" is still running; retry when it completed` || len(b.asked) != 0 {
		t.Errorf("n2 while n1 runs: %+v, b asked %d times", rep, len(b.asked))
	}
	if rep := ask(t, s, ts, Request{ID: "n1", Namespace: "a"}); !rep.Duplicate {
		t.Errorf("n1 again while it runs: %+v, want the duplicate", rep)
	}
	complete(a, 1)

	// A full one; the next full within 5 minutes of its start is refused.
	if rep := ask(t, s, ts, Request{ID: "f1", Full: true}); rep.Error != "" {
		t.Fatalf("f1: %+v", rep)
	}
	a.running, b.running = "f1", "f1"
	now = now.Add(time.Minute)
	complete(a, 2)
	if rep := ask(t, s, ts, Request{ID: "f2", Full: true}); rep.Error != `source "cms": resync "f1" is still running; retry when it completed` {
		t.Errorf("f2 while f1 runs: %+v", rep)
	}
	now = now.Add(time.Minute) // f1 completes 2 minutes after its start
	complete(b, 3)
	now = now.Add(4 * time.Minute) // 6 minutes after f1's start, 4 after its completion
	rep := ask(t, s, ts, Request{ID: "f2", Full: true})
	want := `source "cms": the last full resync started or completed at 2026-01-02T03:02:00Z; the next is allowed from 2026-01-02T03:07:00Z, in 1m0s (resync.minFullInterval 5m0s); a resync without --full is allowed now`
	if rep.Error != want || !rep.NextFull.Equal(time.Date(2026, 1, 2, 3, 7, 0, 0, time.UTC)) {
		t.Errorf("f2 4 minutes after f1 completed:\n got %+v\nwant error %q, nextFull 03:07:00", rep, want)
	}
	// The same id as the full one before: the duplicate, not refused.
	if rep := ask(t, s, ts, Request{ID: "f1", Full: true}); rep.Error != "" || !rep.Duplicate || rep.Completed["b"].Total != 3 {
		t.Errorf("f1 again: %+v, want the duplicate with its counts", rep)
	}
	// Without --full: allowed.
	if rep := ask(t, s, ts, Request{ID: "d1"}); rep.Error != "" || len(a.asked) != 3 {
		t.Errorf("d1 (not full) after the refused f2: %+v", rep)
	}
	complete(a, 2)
	complete(b, 3)
	now = now.Add(time.Minute) // 5 minutes after f1 completed
	if rep := ask(t, s, ts, Request{ID: "f2", Full: true}); rep.Error != "" || rep.Duplicate {
		t.Errorf("f2 5 minutes after f1 completed: %+v, want it accepted", rep)
	}
	for result, want := range map[string]float64{ResultAccepted: 4, ResultDuplicate: 2, ResultRunning: 2, ResultTooSoon: 1, ResultInvalid: 0, ResultBadReply: 0} {
		if got := testutil.ToFloat64(m.Requests.WithLabelValues("cms", result)); got != want {
			t.Errorf("relayd_resync_requests_total{result=%s} = %v, want %v", result, got, want)
		}
	}
}
