package stream

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"

	"github.com/relayd/relayd/internal/retry"
	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/internal/testutil"
)

// Against a real nats-server: while the stream is missing (and relayd may
// not create it) Keep checks again with the retry.Setup policy, whose cap
// is no longer than CheckInterval, so the stream an administrator then
// creates is found, and reported usable, after a few of its short waits
// (well before a CheckInterval); a failing stream is checked several times
// meanwhile.
func TestKeepChecksSoonerWhileUnusable(t *testing.T) {
	if c := retry.Setup().Cap; c > CheckInterval {
		t.Fatalf("retry.Setup's cap %v is longer than CheckInterval %v: a failing stream would be checked less often than a usable one", c, CheckInterval)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := testenv.NATST(t, testenv.NATSOptions{})
	nc, err := nats.Connect(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var reasons []string
	last := func() (string, int) {
		mu.Lock()
		defer mu.Unlock()
		if len(reasons) == 0 {
			return "none yet", 0
		}
		return reasons[len(reasons)-1], len(reasons)
	}
	want := Want{Name: "EV", Subject: "ev.c.>", Storage: jetstream.MemoryStorage}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Keep(ctx, js, want, zaptest.NewLogger(t), func(r string, _ []string) {
			mu.Lock()
			defer mu.Unlock()
			reasons = append(reasons, r)
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	notYet := errors.New("not yet")
	testutil.Eventually(t, 20*time.Second, "three checks of the missing stream", func() error {
		if r, n := last(); r == "" || r == "none yet" || n < 3 {
			return notYet
		}
		return nil
	})
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EV", Subjects: []string{"ev.c.>"}, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, CheckInterval-5*time.Second, "the created stream reported usable", func() error {
		if r, _ := last(); r != "" {
			return notYet
		}
		return nil
	})
}
