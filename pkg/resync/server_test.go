package resync

import (
	"encoding/json"
	"testing"

	"go.uber.org/zap"

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
	return s.handle("cms", ts, b)
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
