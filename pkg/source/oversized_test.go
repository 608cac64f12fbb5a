package source

// Input over watch.maxObjectBytes, from a fake apiserver: a real one does
// not send a watch frame or a LIST item that never ends. The watcher must
// stop reading at the bound (the fake counts what it could send), fail the
// attempt with an error naming the source, the resource and the size read,
// count it (restart reason "oversized") and try again with backoff from
// its position. A LIST page over the bound, made of items under it, is
// asked for again with fewer items. pkg/relay tests the same through relayd
// with the real apiserver beside it.

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
)

// testMaxObject is the watchers' MaxObjectBytes in these tests.
const testMaxObject = 1 << 20

// endlessStop is where the fake gives up on an endless value: far past
// what a bounded reader takes, so that one that is not bounded shows.
const endlessStop = 64 << 20

// socketBuf is the size of the fake's send and the client's receive
// socket buffers (Linux autotunes them to a few MiB on loopback, which
// would hide how much the client read).
const socketBuf = 128 << 10

// socketSlack is what the fake's writes may get ahead of what the client
// read: both socket buffers (Linux doubles what is asked for and adds its
// bookkeeping), the HTTP server's and client's buffers and the fake's last
// chunk.
const socketSlack = 1 << 20

// newTightWatcher is newWatcher with socket buffers of socketBuf.
func newTightWatcher(t *testing.T, h http.Handler, o Options) (*Watcher, *Metrics) {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.Listener = smallBuffers{srv.Listener}
	srv.Start()
	t.Cleanup(srv.Close)
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return c, c.(*net.TCPConn).SetReadBuffer(socketBuf)
	}
	return watcherFor(t, &rest.Config{Host: srv.URL, Dial: dial}, o)
}

// smallBuffers gives the connections it accepts a send buffer of socketBuf.
type smallBuffers struct{ net.Listener }

func (l smallBuffers) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return c, c.(*net.TCPConn).SetWriteBuffer(socketBuf)
}

// writeEndless writes prefix and then fill to w until the client stops
// reading (a write fails) or endlessStop bytes went out, and returns how
// many bytes went out.
func writeEndless(w http.ResponseWriter, prefix string, fill byte) int64 {
	served, err := fmt.Fprint(w, prefix)
	if err != nil {
		return int64(served)
	}
	chunk := []byte(strings.Repeat(string(fill), 32<<10))
	total := int64(served)
	for total < endlessStop {
		n, err := w.Write(chunk)
		total += int64(n)
		if err != nil {
			break
		}
		w.(http.Flusher).Flush()
	}
	return total
}

// served records what the fake sent per request.
type served struct {
	mu   sync.Mutex
	reqs []string    // "watch rv=…", "list limit=… continue=…"
	at   []time.Time // when each came
	n    []int64     // bytes sent for each
}

func (s *served) add(req string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reqs = append(s.reqs, req)
	s.at = append(s.at, time.Now())
	s.n = append(s.n, 0)
	return len(s.reqs) - 1
}

func (s *served) set(i int, n int64) {
	s.mu.Lock()
	s.n[i] = n
	s.mu.Unlock()
}

func (s *served) get() ([]string, []int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.reqs...), append([]int64(nil), s.n...)
}

func (s *served) times() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.at...)
}

// loggedRestarts returns the "watch failed; retrying" entries.
func loggedRestarts(t *testing.T, logs *observer.ObservedLogs) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, e := range logs.FilterMessage("watch failed; retrying").All() {
		out = append(out, e.ContextMap())
	}
	return out
}

func TestEndlessWatchFrameIsCutAtTheBoundAndRetried(t *testing.T) {
	var s served
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("watch") != "true" {
			http.Error(w, "unexpected request", http.StatusBadRequest)
			return
		}
		i := s.add("watch rv=" + r.URL.Query().Get("resourceVersion"))
		w.Header().Set("Content-Type", "application/json")
		s.set(i, writeEndless(w, cm6+"\n"+`{"type":"MODIFIED","object":{"apiVersion":"v1","kind":"ConfigMap","data":{"k":"`, 'x'))
	})
	core, logs := observer.New(zapcore.WarnLevel)
	wt, m := newTightWatcher(t, h, Options{Namespace: "ns", MaxObjectBytes: testMaxObject,
		Backoff: wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Steps: 1 << 30, Cap: time.Minute}})
	wt.log = zap.New(core).With(zap.String("source", "s"))
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	var got []string
	err := wt.Run(ctx, Start{ResourceVersion: "5"}, func(_ context.Context, it *Item) error {
		got = append(got, it.ResourceVersion)
		return nil
	})
	if err != context.DeadlineExceeded {
		t.Fatalf("Run = %v, want it to keep retrying until the context ends", err)
	}
	reqs, n := s.get()
	t.Logf("requests %v, bytes sent %v", reqs, n)
	// 100+200+400+800 ms of backoff in 2 s: a handful of attempts, each
	// from the last good frame.
	if len(reqs) < 2 || len(reqs) > 6 {
		t.Fatalf("%d watch requests in 2s with 100ms doubling backoff, want 2..6: %v", len(reqs), reqs)
	}
	for i, r := range reqs {
		if want := map[bool]string{true: "watch rv=5", false: "watch rv=6"}[i == 0]; r != want {
			t.Errorf("request %d: %s, want %s", i, r, want)
		}
	}
	for i, b := range n[:len(n)-1] { // the last may still be running
		if b > testMaxObject+socketSlack {
			t.Errorf("request %d: the fake sent %d bytes, want at most the bound %d plus the socket buffers %d", i, b, testMaxObject, socketSlack)
		}
	}
	for _, rv := range got {
		if rv != "6" {
			t.Errorf("handler saw %q: part of the endless frame was delivered", rv)
		}
	}
	if v := testutil.ToFloat64(m.WatchRestarts.WithLabelValues("s", ReasonOversized)); int(v) < len(reqs)-1 || int(v) > len(reqs) {
		t.Errorf("watch_restarts{oversized} = %v for %d requests", v, len(reqs))
	}
	logged := loggedRestarts(t, logs)
	if len(logged) == 0 {
		t.Fatalf("nothing logged; logs: %v", logs.All())
	}
	want := `source "s": list/watch configmaps (v1) in namespace ns: watch frame larger than watch.maxObjectBytes allows (1048576 bytes): stopped reading it after 1048577 bytes`
	if e := logged[0]; e["error"] != want || e["reason"] != ReasonOversized || e["source"] != "s" {
		t.Errorf("logged %v, want error %q, reason oversized, source s", e, want)
	}
}

// listItem is item i of the fake's LIST: a ConfigMap of about size bytes.
func listItem(i, size int) string {
	head := fmt.Sprintf(`{"metadata":{"name":"cm-%d","namespace":"ns","uid":"u-%d","resourceVersion":"%d"},"data":{"k":"`, i, i, i+1)
	return head + strings.Repeat("v", max(size-len(head)-3, 0)) + `"}}`
}

// pagedList is a fake apiserver that refuses the streaming list and serves
// LIST pages of items (limit and continue honoured), item endless (if >= 0)
// never ending; its watch says nothing until the client leaves.
type pagedList struct {
	items, size, endless int
	served
}

func (p *pagedList) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	w.Header().Set("Content-Type", "application/json")
	switch {
	case q.Get("sendInitialEvents") == "true":
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"sendInitialEvents is not supported","reason":"BadRequest","code":400}`)
		return
	case q.Get("watch") == "true":
		p.add("watch rv=" + q.Get("resourceVersion"))
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		return
	}
	limit, _ := strconv.Atoi(q.Get("limit"))
	from, _ := strconv.Atoi(q.Get("continue"))
	i := p.add(fmt.Sprintf("list limit=%d continue=%d", limit, from))
	to := min(from+limit, p.items)
	cont := ""
	if to < p.items {
		cont = strconv.Itoa(to)
	}
	var b strings.Builder
	fmt.Fprintf(&b, `{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"100","continue":%q},"items":[`, cont)
	for k := from; k < to; k++ {
		if k > from {
			b.WriteString(",")
		}
		if k == p.endless {
			n, _ := fmt.Fprint(w, b.String())
			p.set(i, int64(n)+writeEndless(w, listItem(k, 0)[:60], 'v'))
			return
		}
		b.WriteString(listItem(k, p.size))
	}
	b.WriteString("]}")
	n, _ := fmt.Fprint(w, b.String())
	p.set(i, int64(n))
}

// Pages of the default 500 items of 100 KiB each are far over the bound
// (1 MiB here): each is asked for again with half as many items until it
// fits, and every item arrives once, in order.
func TestLISTPagesOverTheBoundAreAskedForWithFewerItems(t *testing.T) {
	p := &pagedList{items: 40, size: 100 << 10, endless: -1}
	wt, m := newTightWatcher(t, p, Options{MaxObjectBytes: testMaxObject})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var names []string
	_ = wt.Run(ctx, Start{Snapshot: true}, func(_ context.Context, it *Item) error {
		switch it.Kind {
		case ItemObject:
			names = append(names, it.Object.Meta.Name)
		case ItemSyncCompleted:
			cancel()
		}
		return nil
	})
	reqs, n := p.get()
	t.Logf("requests %v, bytes sent %v", reqs, n)
	if len(names) != p.items {
		t.Fatalf("%d items, want %d: %v", len(names), p.items, names)
	}
	for i, name := range names {
		if name != fmt.Sprintf("cm-%d", i) {
			t.Fatalf("item %d is %s: %v", i, name, names)
		}
	}
	// 500, 250, 125, 62, 31, 15 items are over 1 MiB + 64 KiB; 7 fit.
	want := []string{"list limit=500 continue=0", "list limit=250 continue=0", "list limit=125 continue=0",
		"list limit=62 continue=0", "list limit=31 continue=0", "list limit=15 continue=0",
		"list limit=7 continue=0", "list limit=7 continue=7", "list limit=7 continue=14", "list limit=7 continue=21",
		"list limit=7 continue=28", "list limit=7 continue=35"}
	if strings.Join(reqs, "\n") != strings.Join(want, "\n") {
		t.Errorf("requests\n%s\nwant\n%s", strings.Join(reqs, "\n"), strings.Join(want, "\n"))
	}
	if v := testutil.ToFloat64(m.WatchRestarts.WithLabelValues("s", ReasonOversized)); v != 0 {
		t.Errorf("watch_restarts{oversized} = %v, want 0: no item is over the bound", v)
	}
}

// An item that never ends: the pages shrink to one item, which is over
// the bound: the list fails (restart reason "oversized") naming the size
// read, and is made again after the backoff. No request reads much more
// than the bound.
func TestEndlessLISTItemIsCutAtTheBoundAndRetried(t *testing.T) {
	p := &pagedList{items: 10, size: 1000, endless: 3}
	core, logs := observer.New(zapcore.WarnLevel)
	const backoff = 300 * time.Millisecond
	wt, m := newTightWatcher(t, p, Options{MaxObjectBytes: testMaxObject,
		Backoff: wait.Backoff{Duration: backoff, Factor: 2, Steps: 1 << 30, Cap: time.Minute}})
	wt.log = zap.New(core).With(zap.String("source", "s"))
	restarts := m.WatchRestarts.WithLabelValues("s", ReasonOversized)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	go func() { // stop after the second failed list
		for ctx.Err() == nil && testutil.ToFloat64(restarts) < 2 {
			time.Sleep(10 * time.Millisecond)
		}
		cancel()
	}()
	var names []string
	_ = wt.Run(ctx, Start{Snapshot: true}, func(_ context.Context, it *Item) error {
		if it.Kind == ItemObject {
			names = append(names, it.Object.Meta.Name)
		}
		return nil
	})
	reqs, n := p.get()
	t.Logf("requests %v, bytes sent %v", reqs, n)
	if v := testutil.ToFloat64(restarts); v != 2 {
		t.Fatalf("watch_restarts{oversized} = %v within 20s, want 2", v)
	}
	// Each list: 500 → 250 → … → 7 items per page while the endless item
	// is in it; 3 fit; then 3 and 1 from item 3, the endless one.
	list := []string{"list limit=500 continue=0", "list limit=250 continue=0", "list limit=125 continue=0",
		"list limit=62 continue=0", "list limit=31 continue=0", "list limit=15 continue=0", "list limit=7 continue=0",
		"list limit=3 continue=0", "list limit=3 continue=3", "list limit=1 continue=3"}
	if want := append(append([]string(nil), list...), list...); strings.Join(reqs, "\n") != strings.Join(want, "\n") {
		t.Fatalf("requests\n%s\nwant\n%s", strings.Join(reqs, "\n"), strings.Join(want, "\n"))
	}
	if at := p.times(); at[len(list)].Sub(at[len(list)-1]) < backoff {
		gap := at[len(list)].Sub(at[len(list)-1])
		t.Errorf("the list was made again %v after it failed, want the backoff, %v", gap, backoff)
	}
	for i, b := range n {
		if b > testMaxObject+listPageSlack+socketSlack {
			t.Errorf("request %d (%s): the fake sent %d bytes, want at most the bound %d plus the socket buffers %d", i, reqs[i], b, testMaxObject+listPageSlack, socketSlack)
		}
	}
	logged := loggedRestarts(t, logs)
	if len(logged) == 0 {
		t.Fatalf("nothing logged; logs: %v", logs.All())
	}
	want := `source "s": list/watch configmaps (v1) in all namespaces: LIST item larger than watch.maxObjectBytes allows (1048576 bytes): stopped reading it after 1114113 bytes`
	if e := logged[0]; e["error"] != want || e["reason"] != ReasonOversized {
		t.Errorf("logged %v, want error %q, reason oversized", e, want)
	}
	// The items before the endless one arrive in each list, none after it.
	if got := strings.Join(names, " "); got != "cm-0 cm-1 cm-2 cm-0 cm-1 cm-2" {
		t.Errorf("items %s, want cm-0 cm-1 cm-2 from each list", got)
	}
}
