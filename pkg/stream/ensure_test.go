package stream

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/relayd/relayd/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testenv.LeakOptions()...) }

func connectAs(t *testing.T, n *testenv.NATS, user string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(n.URL(), nats.UserInfo(user, user))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// A stream made elsewhere with every setting the server takes away from its
// default, created and read back through the raw JetStream API (the
// server's JSON, not nats.go's StreamConfig): Ensure adds relayd's subject
// and the server's configuration differs in "subjects" only, key by key.
// A mirror or a sealed stream cannot take relayd's messages: Ensure says so
// and changes nothing at all.
// relayd's account has no JetStream of its own: it reaches the JetStream of
// another account as the domain "shared" ($JS.shared.API.>, a service
// import), so
// a request of Ensure on any other API prefix fails.
func TestEnsureChangesOnlyTheSubjects(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n := testenv.NATST(t, testenv.NATSOptions{ConfigText: `
accounts {
  JS: {
    jetstream: enabled
    users: [{user: admin, password: admin}]
    exports: [{service: "$JS.API.>"}]
  }
  APP: {
    users: [{user: relayd, password: relayd}]
    imports: [{service: {account: JS, subject: "$JS.API.>"}, to: "$JS.shared.API.>"}]
  }
}
`})
	admin := connectAs(t, n, "admin")
	streams := testenv.StreamsAwayFromDefaults("ORIGIN", func(v string) (string, []string) {
		return "EVENTS_" + v, []string{"audit." + v + ".>", "other." + v + ".*"}
	})
	befores, defaults, err := testenv.CreateRawStreams(ctx, admin, "$JS.API.", "ORIGIN", streams)
	if err != nil {
		t.Fatal(err)
	}
	if missing := testenv.UncoveredStreamSettings(befores, defaults); len(missing) > 0 {
		t.Fatalf("settings of the server's StreamConfig no stream holds away from its default: %q", missing)
	}
	// The check itself: a stream at its defaults leaves them uncovered,
	// nested ones too.
	if none := testenv.UncoveredStreamSettings([]map[string]json.RawMessage{defaults}, defaults); !slices.Contains(none, "StreamConfig.allow_msg_counter") ||
		!slices.Contains(none, "StreamSource.consumer") || !slices.Contains(none, "StreamConsumerSource.deliver_subject") || slices.Contains(none, "Placement.preferred") {
		t.Fatalf("UncoveredStreamSettings of a stream at its defaults: %q", none)
	}
	js, err := jetstream.NewWithDomain(connectAs(t, n, "relayd"), "shared")
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range streams {
		t.Run(s.Variant, func(t *testing.T) {
			before := befores[i]
			w := Want{Name: s.Name, Subject: "k8s." + s.Variant + ".>", Create: true, DuplicateWindow: 10 * time.Minute,
				Replicas: 1, Storage: jetstream.FileStorage, MaxAge: 168 * time.Hour, MaxBytes: -1}
			res, err := Ensure(ctx, js, w)
			after, ierr := testenv.JSRequest(ctx, admin, "$JS.API.STREAM.INFO."+s.Name, nil)
			if ierr != nil {
				t.Fatal(ierr)
			}
			var subjects, want []string
			_ = json.Unmarshal(before["subjects"], &want)
			if err := json.Unmarshal(after["subjects"], &subjects); err != nil && s.Variant != "mirror" {
				t.Fatalf("subjects after: %v", err)
			}
			switch s.Variant {
			case "mirror", "sealed": // relayd does not try: unready, saying why
				why := map[string]string{"mirror": "is a mirror of ORIGIN", "sealed": "is sealed: it takes no messages"}[s.Variant]
				if err != nil || res.Updated || !strings.Contains(res.Blocker, why) {
					t.Errorf("Ensure on a %s: %v, updated %v, blocker %q (want one saying %q)", s.Variant, err, res.Updated, res.Blocker, why)
				}
			default:
				if err != nil || !res.Updated || res.Blocker != "" {
					t.Fatalf("Ensure: %v, updated %v, blocker %q", err, res.Updated, res.Blocker)
				}
				want = append(want, w.Subject)
			}
			if !slices.Equal(subjects, want) {
				t.Errorf("subjects %q, want %q", subjects, want)
			}
			if diff := testenv.DiffConfigs(before, after, "subjects"); len(diff) > 0 {
				t.Errorf("Ensure changed more than the subjects of the stream:\n%s", strings.Join(diff, "\n"))
			}
		})
	}
}

// The same on a JetStream cluster, for the two settings a single server
// does not take: a stream with 3 replicas placed in the cluster by name.
func TestEnsureChangesOnlyTheSubjectsReplicated(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := testenv.StartNATSCluster(3, testenv.NATSClusterOptions{Name: "shared"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Shutdown)
	nc, err := nats.Connect(c.URLs())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	var s testenv.RawStream
	for _, v := range testenv.StreamsAwayFromDefaults("ORIGIN", func(v string) (string, []string) {
		return "EVENTS_" + v, []string{"audit." + v + ".>"}
	}) {
		if v.Variant == "limits" {
			s = v
		}
	}
	s.Config["num_replicas"] = 3
	s.Config["placement"] = map[string]any{"cluster": "shared"} // tags would need servers with them
	befores, _, err := testenv.CreateRawStreams(ctx, nc, "$JS.API.", "ORIGIN", []testenv.RawStream{s})
	if err != nil {
		t.Fatal(err)
	}
	before := befores[0]
	if string(before["num_replicas"]) != "3" || string(before["placement"]) != `{"cluster":"shared"}` {
		t.Fatalf("created with replicas %s, placement %s", before["num_replicas"], before["placement"])
	}
	if _, err := c.WaitStreamLeader(s.Name, time.Minute); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	w := Want{Name: s.Name, Subject: "k8s.replicated.>", Create: true, DuplicateWindow: 10 * time.Minute,
		Replicas: 3, Storage: jetstream.FileStorage, MaxAge: 168 * time.Hour, MaxBytes: -1}
	if res, err := Ensure(ctx, js, w); err != nil || !res.Updated || res.Blocker != "" {
		t.Fatalf("Ensure: %v, updated %v, blocker %q", err, res.Updated, res.Blocker)
	}
	after, err := testenv.JSRequest(ctx, nc, "$JS.API.STREAM.INFO."+s.Name, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(after["subjects"]); got != `["audit.limits.\u003e","k8s.replicated.\u003e"]` {
		t.Errorf("subjects %s", got)
	}
	if diff := testenv.DiffConfigs(before, after, "subjects"); len(diff) > 0 {
		t.Errorf("Ensure changed more than the subjects of the stream:\n%s", strings.Join(diff, "\n"))
	}
}

// fakeJetStream answers the JetStream API for one stream, under prefix, as a
// server newer than nats.go would: its config holds settings that nats.go
// (and nats-server v2.15.2) do not know. A real server cannot do that (it
// refuses keys it does not know), hence the fake. Each STREAM.UPDATE body is
// recorded and becomes the config, unless refuse is set.
type fakeJetStream struct {
	mu      sync.Mutex
	cfg     map[string]json.RawMessage
	updates []map[string]json.RawMessage
	refuse  string // description of the API error STREAM.UPDATE answers with
}

func (f *fakeJetStream) serve(t *testing.T, nc *nats.Conn, prefix, name string) {
	t.Helper()
	reply := func(m *nats.Msg, typ string) {
		b, err := json.Marshal(map[string]any{"type": "io.nats.jetstream.api.v1." + typ, "config": f.cfg,
			"created": time.Now().UTC(), "ts": time.Now().UTC(), "state": map[string]any{"messages": 0}})
		if err != nil {
			t.Error(err)
		}
		_ = m.Respond(b)
	}
	sub, err := nc.Subscribe(prefix+"STREAM.*."+name, func(m *nats.Msg) {
		f.mu.Lock()
		defer f.mu.Unlock()
		switch m.Subject {
		case prefix + "STREAM.INFO." + name:
			reply(m, "stream_info_response")
		case prefix + "STREAM.UPDATE." + name:
			var cfg map[string]json.RawMessage
			if err := json.Unmarshal(m.Data, &cfg); err != nil {
				t.Errorf("update body: %v: %s", err, m.Data)
			}
			f.updates = append(f.updates, cfg)
			if f.refuse != "" {
				_ = m.Respond([]byte(`{"type":"io.nats.jetstream.api.v1.stream_update_response","error":{"code":500,"err_code":10052,"description":"` + f.refuse + `"}}`))
				return
			}
			f.cfg = cfg
			reply(m, "stream_update_response")
		default:
			t.Errorf("unexpected JetStream API request %s", m.Subject)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
}

// futureConfig is a stream config from a server newer than nats.go: keys it
// does not model, at the top and nested in one it does.
const futureConfig = `{"name":"EVENTS","subjects":["audit.>"],"retention":"limits","max_consumers":-1,` +
	`"max_msgs":-1,"max_bytes":-1,"max_age":0,"max_msgs_per_subject":-1,"discard":"new","storage":"file",` +
	`"num_replicas":1,"duplicate_window":600000000000,"compression":"none","allow_direct":false,` +
	`"mirror_direct":false,"sealed":false,"deny_delete":false,"deny_purge":false,"allow_rollup_hdrs":false,` +
	`"consumer_limits":{},"placement":{"tags":["ssd"],"spread":"zones"},` +
	`"future_retention":{"mode":"tiered","tiers":[{"after":3600000000000,"storage":"s3"}]},"future_flag":true}`

// Settings of a newer server than nats.go knows survive Ensure: what it
// sends back is the server's JSON with only "subjects" changed, every other
// key byte for byte, on the API prefix relayd is configured with.
func TestEnsureKeepsSettingsNATSGoDoesNotModel(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n := testenv.NATST(t, testenv.NATSOptions{})
	nc, err := nats.Connect(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.NewWithAPIPrefix(nc, "NEWER.API")
	if err != nil {
		t.Fatal(err)
	}
	w := want()
	t.Run("added", func(t *testing.T) {
		f := &fakeJetStream{}
		if err := json.Unmarshal([]byte(futureConfig), &f.cfg); err != nil {
			t.Fatal(err)
		}
		f.serve(t, nc, "NEWER.API.", w.Name)
		res, err := Ensure(ctx, js, w)
		if err != nil || !res.Updated {
			t.Fatalf("Ensure: %v, updated %v", err, res.Updated)
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		if len(f.updates) != 1 {
			t.Fatalf("%d updates, want 1", len(f.updates))
		}
		var orig map[string]json.RawMessage
		_ = json.Unmarshal([]byte(futureConfig), &orig)
		if diff := testenv.DiffConfigs(orig, f.updates[0], "subjects"); len(diff) > 0 {
			t.Errorf("the update changed more than the subjects:\n%s", strings.Join(diff, "\n"))
		}
		if got := string(f.updates[0]["subjects"]); got != `["audit.\u003e","k8s.east.\u003e"]` {
			t.Errorf("subjects sent: %s", got)
		}
	})
	t.Run("refused", func(t *testing.T) {
		f := &fakeJetStream{refuse: "stream configuration update can not change future_flag"}
		if err := json.Unmarshal([]byte(futureConfig), &f.cfg); err != nil {
			t.Fatal(err)
		}
		f.serve(t, nc, "NEWER.API.", w.Name)
		_, err := Ensure(ctx, js, w)
		var apiErr *jetstream.APIError
		if !errors.As(err, &apiErr) || apiErr.ErrorCode != 10052 ||
			!strings.Contains(err.Error(), `stream EVENTS: add subject "k8s.east.>"`) || !strings.Contains(err.Error(), f.refuse) {
			t.Fatalf("Ensure: %v, want the server's refusal as a *jetstream.APIError naming the stream", err)
		}
	})
}

func TestAPIPrefix(t *testing.T) {
	for _, c := range []struct {
		o    jetstream.JetStreamOptions
		want string
	}{
		{jetstream.JetStreamOptions{}, "$JS.API."},
		{jetstream.JetStreamOptions{Domain: "hub"}, "$JS.hub.API."},
		{jetstream.JetStreamOptions{APIPrefix: "A.API"}, "A.API."},
		{jetstream.JetStreamOptions{APIPrefix: "A.API."}, "A.API."},
	} {
		if got := apiPrefix(c.o); got != c.want {
			t.Errorf("apiPrefix(%+v) = %q, want %q", c.o, got, c.want)
		}
	}
}
