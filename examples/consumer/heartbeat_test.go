package main

import (
	"context"
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

// records keeps the log records of a consumer, for the test to find.
type records struct {
	mu  sync.Mutex
	all []string // "<message> source=<s> namespace=<ns>"
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *records) WithGroup(string) slog.Handler            { return r }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	line := rec.Message
	rec.Attrs(func(a slog.Attr) bool {
		if a.Key == "source" || a.Key == "namespace" {
			line += " " + a.Key + "=" + a.Value.String()
		}
		return true
	})
	r.mu.Lock()
	r.all = append(r.all, line)
	r.mu.Unlock()
	return nil
}

func (r *records) snapshot() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.all)
}

func (r *records) count(prefix string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, l := range r.all {
		if strings.HasPrefix(l, prefix) {
			n++
		}
	}
	return n
}

// The example consumer logs "heartbeat missing" for a watch whose
// heartbeats stop for 2 intervals (relayd stopped), once, and "heartbeat
// resumed" when relayd is back; against the relayd binary, in both
// CloudEvents modes.
func TestConsumerLogsAMissingHeartbeat(t *testing.T) {
	for _, mode := range []string{"structured", "binary"} {
		t.Run(mode, func(t *testing.T) { testMissingHeartbeat(t, mode) })
	}
}

func testMissingHeartbeat(t *testing.T, mode string) {
	ctx := t.Context()
	ns, cpNS := env.Namespace(t), env.Namespace(t)
	nc, err := nats.Connect(natsSrv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	run := runs.Add(1)
	l := &lane{mode: mode, cluster: fmt.Sprint("exh", run), stream: fmt.Sprint("EXH", run)}
	l.relayd = env.Relayd(t, relaydConfig(l, ns, cpNS))
	l.relayd.Start()
	if l.view, err = OpenView(ctx, js, "view-"+l.cluster); err != nil {
		t.Fatal(err)
	}
	logs := &records{}
	cctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	testutil.Eventually(t, 60*time.Second, l.stream+" exists", func() error { _, err := js.Stream(ctx, l.stream); return err })
	go func() {
		done <- Run(cctx, Options{JS: js, Stream: l.stream, Durable: "example", Cluster: l.cluster, View: l.view, Log: slog.New(logs),
			HeartbeatCheckEvery: 200 * time.Millisecond})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("consumer: %v", err)
		}
	}()
	missing, resumed := "heartbeat missing", "heartbeat resumed"
	want := " source=cms namespace=" + ns

	// Heartbeats arrive: nothing is missing. Then relayd stops.
	testutil.Eventually(t, 60*time.Second, "3 heartbeats on the stream", func() error {
		s, err := js.Stream(ctx, l.stream)
		if err != nil {
			return err
		}
		n := 0
		for seq := uint64(1); ; seq++ {
			m, err := s.GetMsg(ctx, seq)
			if err != nil {
				break
			}
			if strings.HasSuffix(m.Subject, "."+event.HeartbeatToken) {
				n++
			}
		}
		if n < 3 {
			return fmt.Errorf("%d heartbeats", n)
		}
		return nil
	})
	if n := logs.count(missing); n != 0 {
		t.Fatalf("%q logged %d times while relayd runs: %v", missing, n, logs.snapshot())
	}
	l.relayd.Stop()
	testutil.Eventually(t, 30*time.Second, "a missing heartbeat logged", func() error {
		if logs.count(missing+":") == 0 {
			return fmt.Errorf("not yet: %v", logs.snapshot())
		}
		return nil
	})
	got := logs.snapshot()
	if !slices.ContainsFunc(got, func(s string) bool { return strings.HasPrefix(s, missing) && strings.HasSuffix(s, want) }) {
		t.Errorf("no %q for%s in %v", missing, want, got)
	}

	// relayd back: resumed, and missing was logged once for the outage.
	l.relayd.Start()
	testutil.Eventually(t, 60*time.Second, "heartbeat resumed logged", func() error {
		if logs.count(resumed+want) == 0 {
			return fmt.Errorf("not yet: %v", logs.snapshot())
		}
		return nil
	})
	if n := logs.count(missing); n != 1 {
		t.Errorf("%q logged %d times for one outage, want 1: %v", missing, n, logs.snapshot())
	}
	l.relayd.Stop()
}
