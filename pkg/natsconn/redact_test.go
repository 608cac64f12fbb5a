package natsconn

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/relayd/relayd/internal/testutil"
	"github.com/relayd/relayd/pkg/config"
)

// No credential in a URL, whatever its shape, reaches what a Conn says:
// New's error, Reason, OnReason, the log; nor Explain's text for the
// error nats.go returns for that URL (a *url.Error echoes the URL, and its
// inner error parts of it).
func TestHostileURLsNeverReachErrorsOrLogs(t *testing.T) {
	for _, h := range testutil.HostileURLs() {
		t.Run(h.Name, func(t *testing.T) {
			n := &config.NATS{URL: h.URL}
			var mu sync.Mutex
			var said []string
			say := func(s string) {
				mu.Lock()
				said = append(said, s)
				mu.Unlock()
			}
			if nc, err := nats.Connect(h.URL, nats.Timeout(time.Second)); err != nil {
				say(Explain(n, err))
			} else {
				nc.Close()
			}
			core, logs := observer.New(zapcore.DebugLevel)
			c, err := New(Options{Config: n, Logger: zap.New(core), OnReason: say})
			if err != nil {
				say(err.Error())
			} else {
				ctx, cancel := context.WithTimeout(t.Context(), 1500*time.Millisecond)
				if nc, err := c.Dial(ctx); err == nil {
					nc.Close()
				}
				cancel()
				say(c.Reason())
				for _, e := range logs.All() {
					say(e.Message + " " + fmt.Sprint(e.ContextMap()))
				}
			}
			mu.Lock()
			defer mu.Unlock()
			all := strings.Join(said, "\n")
			if strings.TrimSpace(all) == "" {
				t.Fatal("nothing said about the URL")
			}
			if strings.Contains(all, testutil.URLSecret) {
				t.Errorf("the secret is shown:\n%s", all)
			}
		})
	}
}
