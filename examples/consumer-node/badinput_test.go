package consumernode

import (
	"encoding/json"
	"fmt"
	"path/filepath"
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

// The Node.js consumer against a stream holding what relayd publishes and
// what it never would (docs/CONSUMING.md, "Bad input"): the good messages
// are applied and printed with the hostile object name escaped, a replay
// of an older version is skipped, and an undecodable message, an unknown
// type, another cluster's envelope, a message on another object's subject
// and an event whose resourceVersion cannot be compared are each
// terminated at their first delivery (the server's MSG_TERMINATED
// advisories); the view holds the object at its newest version only.
func TestNodeConsumerTerminatesWhatIsNotRelayds(t *testing.T) {
	script := buildConsumer(t)
	n := runs.Add(1)
	cluster, stream := fmt.Sprint("ndu", n), fmt.Sprint("NDU", n)
	nc, err := nats.Connect(natsSrv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: stream, Subjects: []string{"k8s." + cluster + ".>"}}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var terminated []uint64
	sub, err := nc.Subscribe("$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED."+stream+".node", func(m *nats.Msg) {
		var ad struct {
			StreamSeq  uint64 `json:"stream_seq"`
			Deliveries uint64 `json:"deliveries"`
		}
		if err := json.Unmarshal(m.Data, &ad); err != nil || ad.Deliveries != 1 {
			t.Errorf("advisory %s (%v): want a termination at the first delivery", m.Data, err)
		}
		mu.Lock()
		defer mu.Unlock()
		terminated = append(terminated, ad.StreamSeq)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	publish := func(m event.Message) uint64 {
		t.Helper()
		ack, err := js.PublishMsg(t.Context(), &nats.Msg{Subject: m.Subject, Header: nats.Header(m.Header), Data: m.Data})
		if err != nil || ack.Duplicate {
			t.Fatalf("%s: %v (duplicate %v)", m.Subject, err, ack != nil && ack.Duplicate)
		}
		return ack.Sequence
	}

	evil := "evil\x1b[2J\x1b]0;owned\a\u202e"
	var bad []uint64
	for i, binary := range []bool{false, true} {
		// Each mode its own object: the same one would be a duplicate.
		e, ua := encoder(t, cluster, binary), fmt.Sprint("ua-", binary)
		publish(encode(t, e, change(event.Added, evil, ua, "10")))
		foreign := encode(t, encoder(t, "other", binary), change(event.Added, "web", "uf"+ua, "10"))
		foreign.Subject = strings.Replace(foreign.Subject, "k8s.other.", "k8s."+cluster+".", 1)
		misfiled := encode(t, e, change(event.Added, "db", "ub"+ua, "10"))
		misfiled.Subject = encode(t, e, change(event.Added, evil, ua, "10")).Subject
		badType := encode(t, e, change(event.Modified, evil, ua, "11"))
		if binary {
			badType.Header["ce-type"] = []string{"k8s.object.exploded"}
		} else {
			badType.Data = []byte(strings.Replace(string(badType.Data), `"k8s.object.modified"`, `"k8s.object.exploded"`, 1))
		}
		garbage := encode(t, e, change(event.Added, "g", "ug"+ua, "10"))
		garbage.Data = []byte(`{"specversion":"1.0",`)
		if binary {
			delete(garbage.Header, "ce-id")
		}
		bad = append(bad, publish(garbage), publish(badType), publish(foreign), publish(misfiled),
			publish(encode(t, e, change(event.Modified, evil, ua, "abc"))))
		publish(encode(t, e, change(event.Modified, evil, ua, "12")))
		// A replay of the older added, outside the duplicate window (no
		// Nats-Msg-Id): skipped by its resourceVersion.
		replay := encode(t, e, change(event.Added, evil, ua, "10"))
		delete(replay.Header, event.HeaderMsgID)
		publish(replay)
		publish(e.Control(event.SyncEvent{Namespace: "shop", Epoch: uint64(i + 1), Reason: "expired"}))
	}

	l := &lane{mode: "bad-input", cluster: cluster, stream: stream, state: filepath.Join(t.TempDir(), "view.json")}
	l.start(t, js, script, "")
	t.Cleanup(func() {
		l.kill()
		if t.Failed() {
			t.Logf("consumer stdout:\n%s\nstderr:\n%s", l.stdout.text(), l.stderr.String())
		}
	})
	testutil.EventuallyUnless(t, 30*time.Second, "every message settled", l.alive, func() error {
		mu.Lock()
		defer mu.Unlock()
		if got := len(l.stdout.parsed(t)); got != 8 || len(terminated) != len(bad) {
			return fmt.Errorf("%d lines printed, want 8; %d messages terminated, want %d", got, len(terminated), len(bad))
		}
		return nil
	})
	mu.Lock()
	slices.Sort(terminated)
	if !slices.Equal(terminated, bad) {
		t.Errorf("terminated %v, want %v", terminated, bad)
	}
	mu.Unlock()
	var actions []string
	for _, o := range l.stdout.parsed(t) {
		actions = append(actions, o.Event+":"+o.Action)
		if o.Name != "" && o.Name != evil {
			t.Errorf("name printed as %q", o.Name)
		}
	}
	want := []string{"added:store", "modified:store", "added:skip", "sync.started:", "added:store", "modified:store", "added:skip", "sync.started:"}
	if !slices.Equal(actions, want) {
		t.Errorf("applied %v, want %v", actions, want)
	}
	for _, s := range []string{l.stdout.text(), l.stderr.String()} {
		if strings.ContainsAny(s, "\x1b\a\u202e") {
			t.Errorf("raw control characters reach the terminal: %q", s)
		}
	}
	if n := strings.Count(l.stderr.String(), "terminated"); n != len(bad) {
		t.Errorf("%d terminations logged, want %d", n, len(bad))
	}
	view, err := l.viewAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(view) != 2 || view["cms/ua-false"] != evil+"@12" || view["cms/ua-true"] != evil+"@12" {
		t.Errorf("view %q, want cms/ua-false and cms/ua-true at 12 only", view)
	}
}

func encoder(t *testing.T, cluster string, binary bool) *event.Encoder {
	t.Helper()
	e, err := event.NewEncoder(event.EncoderOptions{Cluster: cluster, Source: "cms", Binary: binary})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// change is a ConfigMap change in namespace shop as relayd would publish it.
func change(typ event.Type, name, uid, rv string) *event.Change {
	return &event.Change{Type: typ, Origin: event.OriginWatch, Payload: event.PayloadReference,
		Resource: event.Resource{Version: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespaced: true},
		Meta:     event.Meta{Namespace: "shop", Name: name, UID: uid, ResourceVersion: rv}}
}

func encode(t *testing.T, e *event.Encoder, c *event.Change) event.Message {
	t.Helper()
	m, err := e.Encode(c)
	if err != nil {
		t.Fatal(err)
	}
	return m
}
