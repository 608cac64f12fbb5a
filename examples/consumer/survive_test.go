package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/internal/testutil"
	"github.com/relayd/relayd/pkg/event"
)

// syncBuffer is a bytes.Buffer safe for a writer and a reader at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func connect(t *testing.T) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(natsSrv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// newStream creates a stream of relayd's subjects for cluster, as relayd
// would (a short duplicate window: the tests replay on purpose).
func newStream(t *testing.T, js jetstream.JetStream, name, cluster string) {
	t.Helper()
	if _, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: name, Subjects: []string{"k8s." + cluster + ".>"}}); err != nil {
		t.Fatal(err)
	}
}

// publish stores m on the stream, as relayd would.
func publish(t *testing.T, js jetstream.JetStream, m event.Message) uint64 {
	t.Helper()
	ack, err := js.PublishMsg(t.Context(), &nats.Msg{Subject: m.Subject, Header: nats.Header(m.Header), Data: m.Data})
	if err != nil {
		t.Fatal(err)
	}
	if ack.Duplicate {
		t.Fatalf("%s: dropped as a duplicate", m.Subject)
	}
	return ack.Sequence
}

// edited is a structured-mode message with its CloudEvent edited.
func edited(t *testing.T, m event.Message, edit func(ce map[string]any)) event.Message {
	t.Helper()
	var ce map[string]any
	if err := json.Unmarshal(m.Data, &ce); err != nil {
		t.Fatal(err)
	}
	edit(ce)
	data, err := json.Marshal(ce)
	if err != nil {
		t.Fatal(err)
	}
	m.Data = data
	return m
}

// advisories collects JetStream's advisories of one kind (MSG_TERMINATED,
// MSG_NAKED) for a durable consumer: the server's own record of what the
// consumer did with each message.
type advisories struct {
	mu   sync.Mutex
	seen []advisory
}

type advisory struct {
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries uint64 `json:"deliveries"`
	Reason     string `json:"reason"`
}

func watchAdvisories(t *testing.T, nc *nats.Conn, what, stream, durable string) *advisories {
	t.Helper()
	a := &advisories{}
	sub, err := nc.Subscribe("$JS.EVENT.ADVISORY.CONSUMER."+what+"."+stream+"."+durable, func(m *nats.Msg) {
		var ad advisory
		if err := json.Unmarshal(m.Data, &ad); err != nil {
			t.Errorf("advisory %s: %v", m.Data, err)
			return
		}
		a.mu.Lock()
		defer a.mu.Unlock()
		a.seen = append(a.seen, ad)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return a
}

func (a *advisories) list() []advisory {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.seen)
}

// hasControl reports a byte that a terminal would act on, or a bidi
// override.
func hasControl(s string) bool {
	for _, r := range s {
		if r != '\n' && (r < 0x20 || r == 0x7f || r >= 0x80 && r < 0xa0 || r == '\u202e' || r == '\u202d') {
			return true
		}
	}
	return false
}

// The command (run, as `consumer` runs it) against a stream holding what
// relayd publishes and what it never would: the good messages are applied
// and printed, their hostile object name escaped; an undecodable message,
// an unknown type, another cluster's envelope, a message on another
// object's subject and an event that cannot be ordered are each terminated
// at their first delivery (the server's MSG_TERMINATED advisories), none
// redelivered, and nothing of theirs reaches the view or the terminal raw.
func TestUnusableMessagesAreTerminatedAndOutputIsEscaped(t *testing.T) {
	n := runs.Add(1)
	cluster, stream, durable, bucket := fmt.Sprint("exu", n), fmt.Sprint("EXU", n), "cli", fmt.Sprint("view-exu", n)
	nc, js := connect(t)
	newStream(t, js, stream, cluster)
	terminated := watchAdvisories(t, nc, "MSG_TERMINATED", stream, durable)

	e := encoder(t, cluster, "cms", false)
	evil := "evil\x1b[2J\x1b]0;owned\a\u202e"
	a10 := encode(t, e, change(event.Added, "shop", evil, "ua", "10"))
	good := []uint64{publish(t, js, a10)}
	garbage := a10
	garbage.Data, garbage.Header = []byte(`{"specversion":"1.0",`), map[string][]string{"Content-Type": {event.ContentTypeCloudEvents}}
	foreign := encode(t, encoder(t, "other", "cms", false), change(event.Added, "shop", "web", "uf", "10"))
	foreign.Subject = strings.Replace(foreign.Subject, "k8s.other.", "k8s."+cluster+".", 1)
	misfiled := encode(t, e, change(event.Added, "shop", "db", "ub", "10"))
	misfiled.Subject = a10.Subject
	bad := []uint64{
		publish(t, js, garbage),
		publish(t, js, edited(t, encode(t, e, change(event.Modified, "shop", evil, "ua", "11")), func(ce map[string]any) { ce["type"] = "k8s.object.exploded" })),
		publish(t, js, foreign),
		publish(t, js, misfiled),
		publish(t, js, encode(t, e, change(event.Modified, "shop", evil, "ua", "abc"))),
	}
	good = append(good,
		publish(t, js, encode(t, e, change(event.Modified, "shop", evil, "ua", "12"))),
		publish(t, js, e.Control(event.SyncEvent{Namespace: "shop", Epoch: 1, Reason: "expired"})))

	var stdout, stderr syncBuffer
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--server", natsSrv.URL(), "--stream", stream, "--cluster", cluster, "--durable", durable, "--bucket", bucket}, &stdout, &stderr)
	}()
	testutil.Eventually(t, 30*time.Second, "every message settled", func() error {
		if n := strings.Count(stdout.String(), "\n"); n != len(good) {
			return fmt.Errorf("%d lines printed, want %d:\n%s", n, len(good), stdout.String())
		}
		if n := len(terminated.list()); n != len(bad) {
			return fmt.Errorf("%d messages terminated, want %d", n, len(bad))
		}
		return nil
	})
	cancel()
	if code := <-done; code != 0 {
		t.Errorf("consumer exited %d:\n%s", code, stderr.String())
	}

	var termSeqs []uint64
	for _, ad := range terminated.list() {
		termSeqs = append(termSeqs, ad.StreamSeq)
		if ad.Deliveries != 1 || ad.Reason == "" {
			t.Errorf("message %d terminated at delivery %d, reason %q; want at its first, with a reason", ad.StreamSeq, ad.Deliveries, ad.Reason)
		}
	}
	slices.Sort(termSeqs)
	if !slices.Equal(termSeqs, bad) {
		t.Errorf("terminated %v, want %v", termSeqs, bad)
	}
	cons, err := js.Consumer(t.Context(), stream, durable)
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if info.NumAckPending != 0 || info.NumRedelivered != 0 || info.AckFloor.Stream != good[len(good)-1] {
		t.Errorf("consumer: %d pending, %d redelivered, ack floor %d; want 0, 0, %d", info.NumAckPending, info.NumRedelivered, info.AckFloor.Stream, good[len(good)-1])
	}

	out := stdout.String()
	if hasControl(out) || hasControl(stderr.String()) {
		t.Errorf("raw control characters reach the terminal:\nstdout %q\nstderr %q", out, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	wantName := `"shop/evil\x1b[2J\x1b]0;owned\a\u202e"`
	if len(lines) != 3 || !strings.Contains(lines[0], "store  added ConfigMap "+wantName+" rv=10") ||
		!strings.Contains(lines[1], "store  modified ConfigMap "+wantName+" rv=12") || !strings.Contains(lines[2], "source.sync.started") {
		t.Errorf("printed:\n%s", out)
	}
	if n := strings.Count(stderr.String(), "terminated"); n != len(bad) {
		t.Errorf("%d terminations logged, want %d:\n%s", n, len(bad), stderr.String())
	}

	_, js2 := connect(t)
	view, err := OpenView(t.Context(), js2, bucket)
	if err != nil {
		t.Fatal(err)
	}
	entries, err := view.Entries(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].UID != "ua" || entries[0].Name != evil || entries[0].ResourceVersion != "12" {
		t.Errorf("view %+v, want ua at 12 only", entries)
	}
}

// A message the view cannot store (its bucket is gone) is given back with
// the durable consumer's back-off and, at MaxDeliver, terminated with an
// error log naming it; once the bucket is back the next message is applied.
// The durable consumer carries MaxDeliver and BackOff.
func TestRetriesWithBackOffThenGivesUp(t *testing.T) {
	n := runs.Add(1)
	cluster, stream, durable, bucket := fmt.Sprint("exm", n), fmt.Sprint("EXM", n), "retry", fmt.Sprint("view-exm", n)
	nc, js := connect(t)
	newStream(t, js, stream, cluster)
	terminated := watchAdvisories(t, nc, "MSG_TERMINATED", stream, durable)
	naked := watchAdvisories(t, nc, "MSG_NAKED", stream, durable)
	view, err := OpenView(t.Context(), js, bucket)
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteKeyValue(t.Context(), bucket); err != nil {
		t.Fatal(err)
	}
	var log syncBuffer
	var mu sync.Mutex
	var applied []Applied
	backOff := []time.Duration{200 * time.Millisecond, 400 * time.Millisecond}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{JS: js, Stream: stream, Durable: durable, Cluster: cluster, View: view, Log: slog.New(slog.NewTextHandler(&log, nil)),
			BackOff: backOff, MaxDeliver: 3, Applied: func(a Applied) { mu.Lock(); defer mu.Unlock(); applied = append(applied, a) }})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	testutil.Eventually(t, 10*time.Second, "the durable consumer", func() error {
		cons, err := js.Consumer(t.Context(), stream, durable)
		if err != nil {
			return err
		}
		cfg := cons.CachedInfo().Config
		if cfg.MaxDeliver != 3 || !slices.Equal(cfg.BackOff, backOff) {
			return fmt.Errorf("MaxDeliver %d, BackOff %v; want 3, %v", cfg.MaxDeliver, cfg.BackOff, backOff)
		}
		return nil
	})

	e := encoder(t, cluster, "cms", false)
	start := time.Now()
	lost := publish(t, js, encode(t, e, change(event.Added, "shop", "web", "u1", "10")))
	testutil.Eventually(t, 20*time.Second, "the message terminated", func() error {
		if len(terminated.list()) == 0 {
			return errors.New("not yet")
		}
		return nil
	})
	took := time.Since(start)
	if ads := terminated.list(); len(ads) != 1 || ads[0].StreamSeq != lost || ads[0].Deliveries != 3 || !strings.Contains(ads[0].Reason, "MaxDeliver") {
		t.Errorf("terminated %+v, want message %d at its third delivery, reason MaxDeliver", ads, lost)
	}
	if ads := naked.list(); len(ads) != 2 || ads[0].Deliveries != 1 || ads[1].Deliveries != 2 {
		t.Errorf("given back %+v, want at deliveries 1 and 2", ads)
	}
	if min := backOff[0] + backOff[1]; took < min {
		t.Errorf("three deliveries in %v, under the back-off's %v", took, min)
	}
	if l := log.String(); !strings.Contains(l, `level=ERROR msg="not applied after the last delivery: terminated`) || strings.Count(l, "redelivered later") != 2 {
		t.Errorf("log:\n%s", l)
	}

	if _, err := OpenView(t.Context(), js, bucket); err != nil {
		t.Fatal(err)
	}
	next := publish(t, js, encode(t, e, change(event.Added, "shop", "db", "u2", "11")))
	testutil.Eventually(t, 10*time.Second, "the next message applied", func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(applied) != 1 || applied[0].Seq != next || applied[0].Action != Store {
			return fmt.Errorf("applied %+v", applied)
		}
		return nil
	})
	if held, err := view.Get(t.Context(), "cms", "u2"); err != nil || held == nil {
		t.Errorf("view holds %+v (%v) for the next message", held, err)
	}
}

// A tombstone keeps an older replayed event of a deleted object out while
// it lives, and is pruned after TombstoneTTL; live entries stay.
func TestTombstonesExpire(t *testing.T) {
	n := runs.Add(1)
	cluster, stream, durable, bucket := fmt.Sprint("ext", n), fmt.Sprint("EXT", n), "ttl", fmt.Sprint("view-ext", n)
	_, js := connect(t)
	newStream(t, js, stream, cluster)
	view, err := OpenView(t.Context(), js, bucket)
	if err != nil {
		t.Fatal(err)
	}
	var log syncBuffer
	var mu sync.Mutex
	applied := map[uint64]Applied{}
	const ttl = 1500 * time.Millisecond
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{JS: js, Stream: stream, Durable: durable, Cluster: cluster, View: view, Log: slog.New(slog.NewTextHandler(&log, nil)),
			TombstoneTTL: ttl, PruneEvery: 100 * time.Millisecond, Applied: func(a Applied) { mu.Lock(); defer mu.Unlock(); applied[a.Seq] = a }})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	action := func(seq uint64) (Action, bool) {
		mu.Lock()
		defer mu.Unlock()
		a, ok := applied[seq]
		return a.Action, ok
	}
	waitAction := func(seq uint64, want Action) {
		t.Helper()
		testutil.Eventually(t, 10*time.Second, fmt.Sprintf("message %d applied", seq), func() error {
			if got, ok := action(seq); !ok || got != want {
				return fmt.Errorf("applied %v (%v), want %v", got, ok, want)
			}
			return nil
		})
	}

	e := encoder(t, cluster, "cms", false)
	publish(t, js, encode(t, e, change(event.Added, "shop", "gone", "ux", "10")))
	publish(t, js, encode(t, e, change(event.Added, "shop", "kept", "uy", "11")))
	deleted := publish(t, js, encode(t, e, change(event.Deleted, "shop", "gone", "ux", "12")))
	waitAction(deleted, Delete)
	deletedAt := time.Now()
	// A replay of the added, older than the delete (outside the duplicate
	// window, so without its Nats-Msg-Id): skipped while the tombstone lives.
	replay := encode(t, e, change(event.Added, "shop", "gone", "ux", "10"))
	delete(replay.Header, event.HeaderMsgID)
	waitAction(publish(t, js, replay), Skip)
	if held, err := view.Get(t.Context(), "cms", "ux"); err != nil || held == nil || !held.Deleted {
		t.Fatalf("view holds %+v (%v), want the tombstone", held, err)
	}

	testutil.Eventually(t, 10*time.Second, "the tombstone pruned", func() error {
		held, err := view.Get(t.Context(), "cms", "ux")
		if err != nil || held != nil {
			return fmt.Errorf("view holds %+v (%v)", held, err)
		}
		return nil
	})
	if age := time.Since(deletedAt); age < ttl {
		t.Errorf("the tombstone was pruned %v after the delete, before its TTL %v", age, ttl)
	}
	if held, err := view.Get(t.Context(), "cms", "uy"); err != nil || held == nil || held.Deleted {
		t.Errorf("the live entry: %+v (%v)", held, err)
	}
	if !strings.Contains(log.String(), "pruned expired tombstones") {
		t.Errorf("log:\n%s", log.String())
	}
}
