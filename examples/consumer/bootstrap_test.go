package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/internal/testutil"
	"github.com/relayd/relayd/pkg/stream"
)

// docs/CONSUMING.md, "Resync on request": a new consumer without
// apiserver access (no Lister) on a stream that lost its beginning starts
// after the stream's last message and loads its view by a full resync of
// its source on request, in both content modes: its view then equals a
// LIST, and every object it holds came from the stream after its start.
func TestBootstrapFromAFullResync(t *testing.T) {
	for _, mode := range []string{"structured", "binary"} {
		t.Run(mode, func(t *testing.T) {
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
			c := &cms{t: t, cs: cs, ns: ns}
			for i := range 4 {
				c.create(fmt.Sprintf("cm-%d", i))
			}
			n := runs.Add(1)
			l := &lane{mode: mode, cluster: fmt.Sprint("exb", n), stream: fmt.Sprint("EXB", n)}
			cfg := stream.Want{Name: l.stream, Subject: "k8s." + l.cluster + ".>", DuplicateWindow: 2 * time.Minute, MaxAge: time.Hour, MaxBytes: -1,
				Storage: jetstream.FileStorage}.Config()
			cfg.MaxMsgs, cfg.Discard = 30, jetstream.DiscardOld
			if _, err := js.CreateStream(ctx, cfg); err != nil {
				t.Fatal(err)
			}
			l.relayd = env.Relayd(t, relaydConfig(l, ns, cpNS))
			l.relayd.Start()
			s, err := js.Stream(ctx, l.stream)
			if err != nil {
				t.Fatal(err)
			}
			// The updates go through the watch, after the initial list.
			testutil.Eventually(t, 60*time.Second, "relayd's initial list", func() error {
				_, err := s.GetLastMsgForSubject(ctx, "k8s."+l.cluster+"._relayd.cms.sync.completed")
				return err
			})
			for range 40 {
				c.update("cm-3")
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
			if info.State.FirstSeq <= 1 {
				t.Fatalf("the stream starts at %d: it lost nothing", info.State.FirstSeq)
			}
			if l.view, err = OpenView(ctx, js, "view-"+l.cluster); err != nil {
				t.Fatal(err)
			}
			runCtx, cancel := context.WithCancel(context.Background())
			l.stop, l.done = cancel, make(chan error, 1)
			o := Options{JS: js, Stream: l.stream, Durable: "boot", Cluster: l.cluster, View: l.view, BootstrapResync: []string{"cms"},
				Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Applied: l.record}
			go func() { l.done <- Run(runCtx, o) }()
			t.Cleanup(func() { stopConsumer(t, l) })
			waitViews(t, cs, ns, []*lane{l}, "a new consumer bootstrapped by a full resync")
			if n := l.seen(func(a Applied) bool {
				return a.Relist == "bootstrap-resync" && a.Scope.Source == "cms" && a.Reconciled == 4
			}); n != 1 {
				t.Errorf("%d full resyncs of source cms listing 4 objects, want 1", n)
			}
			if n := l.seen(func(a Applied) bool { return a.Seq != 0 && a.Seq <= info.State.LastSeq }); n != 0 {
				t.Errorf("the new consumer applied %d messages stored before it started: it should start after the stream's last", n)
			}
			if n := l.seen(func(a Applied) bool {
				return a.Action == Store && a.Event.RelaydOrigin == "resync" && strings.Contains(a.Event.ID, "/full/")
			}); n != 4 {
				t.Errorf("the view stored %d objects of the full resync, want 4", n)
			}
		})
	}
}
