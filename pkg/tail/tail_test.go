package tail

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/pkg/event"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testenv.LeakOptions()...) }

// Run replays a real stream and prints one line per event: object events
// with kind, namespace/name, resourceVersion, origin and their flags; sync
// markers with reason, from/to and counts.
func TestRunReplaysTheStream(t *testing.T) {
	n := testenv.NATST(t, testenv.NATSOptions{})
	nc, err := nats.Connect(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "K8S", Subjects: []string{"k8s.dev.>"}}); err != nil {
		t.Fatal(err)
	}
	for _, binary := range []bool{false, true} {
		enc, err := event.NewEncoder(event.EncoderOptions{Prefix: "k8s", Cluster: "dev", Source: "cms", Binary: binary})
		if err != nil {
			t.Fatal(err)
		}
		at := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
		res := event.Resource{Version: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespaced: true}
		msgs := []event.Message{enc.Control(event.SyncEvent{Namespace: "ns", Epoch: 2, Reason: "expired", FromResourceVersion: "10", Time: at})}
		for _, c := range []event.Change{
			{Type: event.Modified, Origin: event.OriginResync, Epoch: 2, Time: at, Resource: res,
				Meta: event.Meta{UID: "u1", Namespace: "ns", Name: "a", ResourceVersion: "12"}},
			{Type: event.Deleted, Origin: event.OriginResync, Epoch: 2, Time: at, Resource: res, FinalStateUnknown: true,
				Meta: event.Meta{UID: "u2", Namespace: "ns", Name: "b", ResourceVersion: "9"}},
			{Type: event.Deleted, Origin: event.OriginResync, Epoch: 2, Time: at, Resource: res, Scope: event.ScopeLeft,
				Meta: event.Meta{UID: "u3", Namespace: "ns", Name: "c", ResourceVersion: "11"}},
		} {
			m, err := enc.Encode(&c)
			if err != nil {
				t.Fatal(err)
			}
			msgs = append(msgs, m)
		}
		msgs = append(msgs, enc.Control(event.SyncEvent{Completed: true, Namespace: "ns", Epoch: 2, Reason: "expired",
			FromResourceVersion: "10", ToResourceVersion: "13", Counts: event.SyncCounts{Modified: 1, Deleted: 1, Total: 1}, Time: at}))
		for _, m := range msgs {
			m.MsgID = "" // the two rounds publish the same ids
			delete(m.Header, jetstream.MsgIDHeader)
			if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: m.Subject, Header: nats.Header(m.Header), Data: m.Data}); err != nil {
				t.Fatal(err)
			}
		}
	}
	var out bytes.Buffer
	if err := Run(ctx, Options{URL: n.URL(), Subject: "k8s.dev.>", Stream: "K8S", Count: 10, Out: &out}); err != nil {
		t.Fatal(err)
	}
	want := []string{
		`10:00:00.000  sync.started    source=cms namespace=ns epoch=2 reason=expired from="10"`,
		`10:00:00.000  modified        ConfigMap              ns/a                                     rv=12       origin=resync`,
		`10:00:00.000  deleted         ConfigMap              ns/b                                     rv=9        origin=resync (final state unknown)`,
		`10:00:00.000  deleted         ConfigMap              ns/c                                     rv=11       origin=resync (left the filter)`,
		`10:00:00.000  sync.completed  source=cms namespace=ns epoch=2 reason=expired from="10" to="13" counts={"added":0,"modified":1,"deleted":1,"unchanged":0,"total":1}`,
	}
	got := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(got) != 10 {
		t.Fatalf("%d lines, want 10:\n%s", len(got), out.String())
	}
	for i, line := range got {
		if line != want[i%5] {
			t.Errorf("line %d (binary mode %v):\n got %s\nwant %s", i, i >= 5, line, want[i%5])
		}
	}
	if s := Format("k8s.dev.x", nil, []byte("not json")); !strings.Contains(s, "undecodable message on k8s.dev.x") {
		t.Errorf("undecodable: %s", s)
	}
}

// Options.JetStream chooses the JetStream API Run replays the stream
// through (here one in the server's domain); a failed connection is a
// *ConnectError that never shows a URL's credentials.
func TestRunJetStreamOptionAndConnectError(t *testing.T) {
	n := testenv.NATST(t, testenv.NATSOptions{JetStreamDomain: "hub"})
	nc, err := nats.Connect(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.NewWithDomain(nc, "hub")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "K8S", Subjects: []string{"k8s.dev.>"}}); err != nil {
		t.Fatal(err)
	}
	enc, err := event.NewEncoder(event.EncoderOptions{Prefix: "k8s", Cluster: "dev", Source: "cms"})
	if err != nil {
		t.Fatal(err)
	}
	m := enc.Control(event.SyncEvent{Namespace: "ns", Epoch: 1, Reason: "initial", Time: time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)})
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: m.Subject, Header: nats.Header(m.Header), Data: m.Data}); err != nil {
		t.Fatal(err)
	}
	inDomain := func(domain string) func(*nats.Conn) (jetstream.JetStream, error) {
		return func(nc *nats.Conn) (jetstream.JetStream, error) { return jetstream.NewWithDomain(nc, domain) }
	}

	var out bytes.Buffer
	if err := Run(ctx, Options{URL: n.URL(), Subject: "k8s.dev.>", Stream: "K8S", Count: 1, Out: &out, JetStream: inDomain("hub")}); err != nil {
		t.Fatal(err)
	}
	if want := "10:00:00.000  sync.started    source=cms namespace=ns epoch=1 reason=initial"; !strings.HasPrefix(out.String(), want) {
		t.Errorf("output %q, want %q…", out.String(), want)
	}
	err = Run(ctx, Options{URL: n.URL(), Stream: "K8S", Count: 1, Out: &out, JetStream: inDomain("elsewhere")})
	if !errors.Is(err, nats.ErrNoResponders) {
		t.Errorf("another domain: %v, want no responders", err)
	}

	err = Run(ctx, Options{URL: "nats://relayd:s3cret@127.0.0.1:1, nats://t0ken@127.0.0.1:2", Out: &out})
	var ce *ConnectError
	if !errors.As(err, &ce) || !errors.Is(err, nats.ErrNoServers) {
		t.Fatalf("closed ports: %v, want a *ConnectError", err)
	}
	// Everything up to the last '@' is hidden (a password may hold a comma).
	if want := "nats://xxxxx@127.0.0.1:2"; ce.RedactedURL() != want || !strings.Contains(err.Error(), want) ||
		strings.Contains(err.Error(), "s3cret") || strings.Contains(err.Error(), "t0ken") {
		t.Errorf("error %q, want the URLs as %s", err, want)
	}
}

// Since and Until bound a replay by the time JetStream stored the messages:
// Run starts at the first message stored at or after Since and returns by
// itself before the first stored after Until.
func TestRunReplaysATimeWindow(t *testing.T) {
	n := testenv.NATST(t, testenv.NATSOptions{})
	nc, err := nats.Connect(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "K8S", Subjects: []string{"k8s.dev.>"}})
	if err != nil {
		t.Fatal(err)
	}
	enc, err := event.NewEncoder(event.EncoderOptions{Prefix: "k8s", Cluster: "dev", Source: "cms"})
	if err != nil {
		t.Fatal(err)
	}
	res := event.Resource{Version: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespaced: true}
	// Three batches, stored at least 50 ms apart: a, b, c.
	var first [3]time.Time // when JetStream stored each batch's first message
	for b, name := range []string{"a", "b", "c"} {
		if b > 0 {
			time.Sleep(50 * time.Millisecond)
		}
		for i := range 2 {
			c := event.Change{Type: event.Modified, Origin: event.OriginWatch, Epoch: 1, Resource: res,
				Meta: event.Meta{UID: name, Namespace: "ns", Name: name, ResourceVersion: fmt.Sprint(10*b + i + 1)}}
			m, err := enc.Encode(&c)
			if err != nil {
				t.Fatal(err)
			}
			ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: m.Subject, Header: nats.Header(m.Header), Data: m.Data})
			if err != nil {
				t.Fatal(err)
			}
			if i == 0 {
				raw, err := s.GetMsg(ctx, ack.Sequence)
				if err != nil {
					t.Fatal(err)
				}
				first[b] = raw.Time
			}
		}
	}
	rvs := func(out string) []string {
		var got []string
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			if i := strings.Index(line, "rv="); i >= 0 {
				got = append(got, strings.Fields(line[i:])[0])
			}
		}
		return got
	}
	for _, c := range []struct {
		name         string
		since, until time.Time
		count        int
		want         []string
	}{
		{"since b, until just before c: b only, and Run returns by itself", first[1], first[2].Add(-time.Nanosecond), 0, []string{"rv=11", "rv=12"}},
		{"since b, no until: b and c", first[1], time.Time{}, 4, []string{"rv=11", "rv=12", "rv=21", "rv=22"}},
		{"until before b, no since: from the first message", time.Time{}, first[1].Add(-time.Nanosecond), 0, []string{"rv=1", "rv=2"}},
		{"until in the future: returns when its time has come and nothing is left", first[2], time.Now().Add(1500 * time.Millisecond), 0, []string{"rv=21", "rv=22"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var out bytes.Buffer
			if err := Run(ctx, Options{URL: n.URL(), Subject: "k8s.dev.>", Stream: "K8S", Since: c.since, Until: c.until, Count: c.count, Out: &out}); err != nil {
				t.Fatal(err)
			}
			if ctx.Err() != nil {
				t.Fatalf("Run returned at the test's deadline, not by itself")
			}
			if got := rvs(out.String()); strings.Join(got, " ") != strings.Join(c.want, " ") {
				t.Errorf("printed %v, want %v:\n%s", got, c.want, out.String())
			}
		})
	}
}
