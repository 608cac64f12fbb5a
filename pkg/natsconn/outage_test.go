package natsconn

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/internal/testutil"
	"github.com/relayd/relayd/pkg/config"
)

// A NATS server that is down for a few seconds, before the first
// connection and again once connected, is logged once when the failures
// start and once when they end, not at every attempt; Reason says why
// meanwhile, and "" once connected, and OnReason was last called with what
// Reason says (readiness is fed by it). Up's channel is closed while
// connected, open while not, and closed by the reconnection.
func TestOutageIsLoggedOnce(t *testing.T) {
	srv, err := testenv.StartNATS(testenv.NATSOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	core, logs := observer.New(zapcore.InfoLevel)
	var mu sync.Mutex
	reported := "never called"
	reportedIs := func(want string) error {
		mu.Lock()
		defer mu.Unlock()
		if reported != want {
			return fmt.Errorf("OnReason last called with %q, want %q (Reason)", reported, want)
		}
		return nil
	}
	c, err := New(Options{
		OnReason: func(r string) {
			mu.Lock()
			defer mu.Unlock()
			reported = r
		},
		Config: &config.NATS{URL: srv.URL()},
		Name:   "outage-test",
		Logger: zap.New(zapcore.NewTee(core, zaptest.NewLogger(t).Core())),
		Extra:  []nats.Option{nats.ReconnectWait(100 * time.Millisecond)},
	})
	if err != nil {
		t.Fatal(err)
	}

	// Down before the first connection: Dial retries (retry.NATS: 0.1s,
	// 0.2s, 0.4s...).
	srv.Stop()
	type dialed struct {
		nc  *nats.Conn
		err error
	}
	done := make(chan dialed, 1)
	go func() {
		nc, err := c.Dial(context.Background())
		done <- dialed{nc, err}
	}()
	time.Sleep(2500 * time.Millisecond)
	if c.Reason() == "" || c.Reason() == "connecting" {
		t.Errorf("Reason while the server is down: %q, want the connection error", c.Reason())
	}
	testutil.Eventually(t, 5*time.Second, "OnReason told of the failure", func() error { return reportedIs(c.Reason()) })
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	var d dialed
	select {
	case d = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Dial did not connect within 30s of the server's start")
	}
	if d.err != nil {
		t.Fatal(d.err)
	}
	t.Cleanup(d.nc.Close)
	if r := c.Reason(); r != "" {
		t.Errorf("Reason once connected: %q", r)
	}
	if !closed(c.Up()) {
		t.Error("Up not closed once connected")
	}
	if err := reportedIs(""); err != nil {
		t.Error(err)
	}
	checkOneRun(t, logs.TakeAll(), "cannot connect to NATS", 3)

	// Down once connected: nats.go reconnects every 100ms.
	srv.Stop()
	testutil.Eventually(t, 10*time.Second, "disconnected", func() error {
		if c.Reason() == "" {
			return errNotYet
		}
		return reportedIs(c.Reason())
	})
	up := c.Up()
	if closed(up) {
		t.Error("Up closed while disconnected")
	}
	time.Sleep(2 * time.Second)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, "reconnected", func() error {
		if logs.FilterMessage("cannot reconnect to NATS: recovered").Len() == 0 {
			return errNotYet
		}
		return nil
	})
	if r := c.Reason(); r != "" {
		t.Errorf("Reason once reconnected: %q", r)
	}
	select {
	case <-up:
	case <-time.After(10 * time.Second):
		t.Error("the channel Up gave while disconnected was not closed by the reconnection")
	}
	testutil.Eventually(t, 10*time.Second, "OnReason told of the reconnection", func() error { return reportedIs("") })
	all := logs.TakeAll()
	if n := countMessage(all, "disconnected from NATS; publishes are held back until it returns"); n != 1 {
		t.Errorf("%d disconnection lines, want 1", n)
	}
	checkOneRun(t, all, "cannot reconnect to NATS", 5)
}

var errNotYet = errors.New("not yet")

func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func countMessage(entries []observer.LoggedEntry, msg string) int {
	n := 0
	for _, e := range entries {
		if e.Message == msg {
			n++
		}
	}
	return n
}

// checkOneRun fails unless entries hold one run of failures logged as msg:
// one error line when it started, naming the error, one "<msg>: recovered"
// line counting at least minFailures attempts and naming the server, and
// no other error line.
func checkOneRun(t *testing.T, entries []observer.LoggedEntry, msg string, minFailures int64) {
	t.Helper()
	var started, ended []observer.LoggedEntry
	for _, e := range entries {
		switch {
		case e.Message == msg:
			started = append(started, e)
		case e.Message == msg+": recovered":
			ended = append(ended, e)
		case e.Level >= zapcore.ErrorLevel:
			t.Errorf("unexpected error line %q %v", e.Message, e.ContextMap())
		}
	}
	if len(started) != 1 || started[0].Level != zapcore.ErrorLevel || started[0].ContextMap()["error"] == "" {
		t.Errorf("%d lines %q, want 1 at error level with the error: %v", len(started), msg, started)
	}
	if len(ended) != 1 {
		t.Fatalf("%d lines %q, want 1: %v", len(ended), msg+": recovered", ended)
	}
	fields := ended[0].ContextMap()
	if n, _ := fields["failures"].(int64); n < minFailures {
		t.Errorf("recovered after %d failures, want at least %d (one per attempt)", n, minFailures)
	}
	if fields["url"] == "" || fields["url"] == nil {
		t.Errorf("recovered line without the server's url: %v", fields)
	}
}
