package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/internal/testutil"
	"github.com/relayd/relayd/pkg/event"
	"github.com/relayd/relayd/pkg/stream"
)

// docs/CONSUMING.md, "Bootstrapping a new consumer", with the real relayd
// on a stream that keeps 30 messages (discard old: messages leave it as
// they would by maxAge). The consumer builds its view and stops; while it
// is down a ConfigMap is created, one deleted, one changed, and another
// changed 40 times, so the stream no longer holds the messages after the
// last one the consumer acknowledged. Restarted, the consumer compares the
// stream's first sequence with the position it recorded and loads the
// view by a LIST of the source its sync markers named (the delete and
// the create are no longer on the stream); its view then equals a LIST. A
// new consumer (another durable, an empty view) started on that stream
// begins after its last message and loads its view by a LIST of the
// --follow scope: its view equals a LIST too.
func TestStreamLostMessagesTheConsumerDidNotRead(t *testing.T) {
	ctx := t.Context()
	ns, cpNS := env.Namespace(t), env.Namespace(t)
	cs := env.Clientset(t, false)
	nc, err := nats.Connect(natsSrv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	lister, err := NewLister(writeKubeconfig(t))
	if err != nil {
		t.Fatal(err)
	}
	c := &cms{t: t, cs: cs, ns: ns}
	for i := range 4 {
		c.create(fmt.Sprintf("cm-%d", i))
	}
	n := runs.Add(1)
	l := &lane{mode: "structured", cluster: fmt.Sprint("exl", n), stream: fmt.Sprint("EXL", n)}
	// The stream as relayd creates it, but keeping 30 messages and
	// dropping the oldest.
	cfg := stream.Want{Name: l.stream, Subject: "k8s." + l.cluster + ".>", DuplicateWindow: 2 * time.Minute, MaxAge: time.Hour, MaxBytes: -1,
		Storage: jetstream.FileStorage}.Config()
	cfg.MaxMsgs, cfg.Discard = 30, jetstream.DiscardOld
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	l.relayd = env.Relayd(t, relaydConfig(l, ns, cpNS))
	l.relayd.Start()
	if l.view, err = OpenView(ctx, js, "view-"+l.cluster); err != nil {
		t.Fatal(err)
	}
	lanes := []*lane{l}
	start := func(l *lane, durable string, follow []Scope) {
		ctx, cancel := context.WithCancel(context.Background())
		l.stop, l.done = cancel, make(chan error, 1)
		o := Options{JS: js, Stream: l.stream, Durable: durable, Cluster: l.cluster, View: l.view, Lister: lister, Follow: follow,
			Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Applied: l.record}
		go func() { l.done <- Run(ctx, o) }()
	}
	start(l, "example", nil)
	t.Cleanup(func() { stopConsumer(t, l) })
	waitViews(t, cs, ns, lanes, "after the initial snapshot")
	stopConsumer(t, l)
	pos, ok, err := l.view.Position(ctx, "example")
	if err != nil || !ok {
		t.Fatalf("no position recorded at stop (%v)", err)
	}

	c.create("cm-new")
	c.delete("cm-1")
	c.update("cm-2")
	for range 40 {
		c.update("cm-3")
	}
	s, err := js.Stream(ctx, l.stream)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 60*time.Second, "relayd published the last change", func() error {
		m, err := s.GetLastMsgForSubject(ctx, "k8s."+l.cluster+".core.v1.configmaps."+ns+".cm-3.modified")
		if err != nil {
			return err
		}
		if id := m.Header.Get("Nats-Msg-Id"); !strings.HasSuffix(id, "/"+c.lastRV) {
			return fmt.Errorf("last cm-3 message %s, want resourceVersion %s", id, c.lastRV)
		}
		return nil
	})
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.FirstSeq <= pos+1 {
		t.Fatalf("the stream starts at %d, the consumer stopped at %d: no message was lost", info.State.FirstSeq, pos)
	}
	l.mu.Lock()
	before := len(l.applied)
	l.mu.Unlock()

	start(l, "example", nil)
	waitViews(t, cs, ns, lanes, "after the stream lost messages the consumer had not read")
	if n := l.seen(func(a Applied) bool {
		return a.Relist == "lost-messages" && a.Scope.Resource == "configmaps" && a.Scope.Namespace == ns
	}); n != 1 {
		t.Errorf("%d LISTs of reason lost-messages of source cms in %s, want 1", n, ns)
	}
	l.mu.Lock()
	after := l.applied[before:]
	l.mu.Unlock()
	for _, a := range after {
		if a.Event.K8sName == "cm-1" || (a.Event.K8sName == "cm-new" && a.Action == Store) {
			t.Errorf("%s %s came from the stream (seq %d): it should have left it", a.Event.Type, a.Event.K8sName, a.Seq)
		}
	}
	stopConsumer(t, l)

	fresh := &lane{mode: "new consumer", cluster: l.cluster, stream: l.stream}
	if fresh.view, err = OpenView(ctx, js, "view-new-"+l.cluster); err != nil {
		t.Fatal(err)
	}
	start(fresh, "example-new", []Scope{{Source: "cms", Version: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespace: ns}})
	t.Cleanup(func() { stopConsumer(t, fresh) })
	waitViews(t, cs, ns, []*lane{fresh}, "a new consumer on a stream that lost its beginning")
	if n := fresh.seen(func(a Applied) bool { return a.Relist == "bootstrap" }); n != 1 {
		t.Errorf("%d LISTs of reason bootstrap, want 1", n)
	}
	if n := fresh.seen(func(a Applied) bool { return a.Seq != 0 && a.Seq <= info.State.LastSeq }); n != 0 {
		t.Errorf("the new consumer applied %d messages stored before it started: it should start after the stream's last", n)
	}
	// The LISTs are recorded as positions: a later start lists no more.
	if p, _, err := fresh.view.Position(ctx, "example-new"); err != nil || p < info.State.LastSeq {
		t.Errorf("the new consumer's position is %d (%v), want at least the stream's last sequence when it started, %d", p, err, info.State.LastSeq)
	}
	if p, _, err := l.view.Position(ctx, "example"); err != nil || p < info.State.FirstSeq-1 {
		t.Errorf("the restarted consumer's position is %d (%v), want at least %d (before the stream's first sequence)", p, err, info.State.FirstSeq-1)
	}
}

// scopeLister is a Lister that records the scopes asked for and lists
// nothing: the reconcile's choice of what to LIST, for a marker of an
// older relayd that no real relayd of this version writes.
type scopeLister struct {
	mu     sync.Mutex
	scopes []Scope
}

func (l *scopeLister) List(_ context.Context, s Scope, _ string) ([]Listed, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.scopes = append(l.scopes, s)
	return nil, nil
}

func (l *scopeLister) asked() []Scope {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.scopes)
}

// The reconcile after index-lost lists the resource, namespace and
// selectors the sync marker names, and records that scope in the view;
// after a marker without them (an older relayd) it lists the resource of
// the entries it holds of that source and namespace.
func TestReconcileListsWhatTheMarkerNames(t *testing.T) {
	n := runs.Add(1)
	cluster, streamName := fmt.Sprint("exm", n), fmt.Sprint("EXM", n)
	_, js := connect(t)
	newStream(t, js, streamName, cluster)
	view, err := OpenView(t.Context(), js, fmt.Sprint("view-exm", n))
	if err != nil {
		t.Fatal(err)
	}
	e := encoder(t, cluster, "cms", false)
	publish(t, js, encode(t, e, change(event.Added, "shop", "a", "ua", "10")))
	publish(t, js, e.Control(event.SyncEvent{Completed: true, Namespace: "shop", Epoch: 2, Reason: "index-lost", ToResourceVersion: "20",
		Resource: cmResource, LabelSelector: "app=x"}))
	publish(t, js, encode(t, e, change(event.Added, "shop", "b", "ub", "30")))
	publish(t, js, e.Control(event.SyncEvent{Completed: true, Namespace: "shop", Epoch: 3, Reason: "index-lost", ToResourceVersion: "40"}))

	lister := &scopeLister{}
	var applied atomic.Int64
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{JS: js, Stream: streamName, Durable: "exm", Cluster: cluster, View: view, Lister: lister,
			Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Applied: func(Applied) { applied.Add(1) }})
	}()
	testutil.Eventually(t, 30*time.Second, "every message applied", func() error {
		if n := applied.Load(); n != 4 {
			return fmt.Errorf("%d applied, want 4", n)
		}
		return nil
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	want := []Scope{
		{Source: "cms", Version: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespace: "shop", LabelSelector: "app=x"},
		{Source: "cms", Version: "v1", Resource: "configmaps", Namespace: "shop"},
	}
	if got := lister.asked(); !slices.Equal(got, want) {
		t.Errorf("LISTed %+v, want %+v", got, want)
	}
	if got, err := view.Scopes(t.Context()); err != nil || !slices.Equal(got, want[:1]) {
		t.Errorf("scopes recorded %+v (%v), want %+v", got, err, want[:1])
	}
	for _, uid := range []string{"ua", "ub"} {
		if e, err := view.Get(t.Context(), "cms", uid); err != nil || e == nil || !e.Deleted {
			t.Errorf("entry %s: %+v (%v), want a tombstone (the LIST lacks it)", uid, e, err)
		}
	}
}
