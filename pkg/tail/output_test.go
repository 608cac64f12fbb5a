package tail

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/pkg/event"
)

// publishMixed publishes, in both CloudEvents modes, events of two sources,
// two namespaces and two kinds, plus sync markers, one of them of an
// all-namespaces watch; one Widget's name holds an escape sequence and a
// C1 control character.
func publishMixed(t *testing.T, ctx context.Context, js jetstream.JetStream) int {
	t.Helper()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "K8S", Subjects: []string{"k8s.dev.>"}}); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	cm := event.Resource{Version: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespaced: true}
	widget := event.Resource{Group: "example.com", Version: "v1", Resource: "widgets", Kind: "Widget", Namespaced: true}
	n := 0
	for _, binary := range []bool{false, true} {
		for _, src := range []string{"cms", "widgets"} {
			enc, err := event.NewEncoder(event.EncoderOptions{Prefix: "k8s", Cluster: "dev", Source: src, Binary: binary})
			if err != nil {
				t.Fatal(err)
			}
			res, name := cm, "a"
			if src == "widgets" {
				res, name = widget, "evil\x1b[31m\u009b"
			}
			msgs := []event.Message{enc.Control(event.SyncEvent{Namespace: "", Epoch: 1, Reason: "initial", Time: at})}
			for i, ns := range []string{"shop", "other"} {
				data := `{"apiVersion":"` + res.APIVersion() + `","kind":"` + res.Kind + `","metadata":{"name":` + quote(name) + `}}`
				m, err := enc.Encode(&event.Change{Type: event.Added, Origin: event.OriginInitial, Epoch: 1, Time: at, Resource: res,
					Meta: event.Meta{UID: src + ns, Namespace: ns, Name: name, ResourceVersion: strconv.Itoa(10 + i)}, Payload: event.PayloadFull, Data: []byte(data)})
				if err != nil {
					t.Fatal(err)
				}
				msgs = append(msgs, m)
			}
			for _, m := range msgs {
				delete(m.Header, jetstream.MsgIDHeader)
				if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: m.Subject, Header: nats.Header(m.Header), Data: m.Data}); err != nil {
					t.Fatal(err)
				}
				n++
			}
		}
	}
	return n
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// --output json prints one CloudEvent per line in structured form, the
// same for both modes; the filter selects by source, namespace and kind
// (sync markers of an all-namespaces watch pass a namespace filter); no
// raw control character reaches the output in either format.
func TestRunJSONFilterAndEscaping(t *testing.T) {
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
	total := publishMixed(t, ctx, js)

	run := func(o Options) []string {
		t.Helper()
		var out bytes.Buffer
		o.URL, o.Subject, o.Stream, o.Out = n.URL(), "k8s.dev.>", "K8S", &out
		rctx, cancel := context.WithTimeout(ctx, 3*time.Second) // ends the follow after the replay
		defer cancel()
		if err := Run(rctx, o); err != nil {
			t.Fatal(err)
		}
		if bytes.ContainsAny(out.Bytes(), "\x1b\u009b") {
			t.Errorf("raw control characters in the output:\n%q", out.String())
		}
		return strings.Split(strings.TrimSpace(out.String()), "\n")
	}

	lines := run(Options{JSON: true, Count: total})
	if len(lines) != total {
		t.Fatalf("%d lines, want %d", len(lines), total)
	}
	var evs []map[string]any
	for _, l := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("not one JSON document per line: %v\n%s", err, l)
		}
		evs = append(evs, m)
	}
	// The binary half prints exactly what the structured half prints.
	for i := range total / 2 {
		if !reflect.DeepEqual(evs[i], evs[i+total/2]) {
			t.Errorf("event %d: binary mode\n %v\nstructured mode\n %v", i, evs[i+total/2], evs[i])
		}
	}
	if evs[0]["relaydepoch"] != float64(1) || evs[0]["type"] != "k8s.source.sync.started" {
		t.Errorf("first event %v", evs[0])
	}
	if !strings.Contains(strings.Join(lines, "\n"), `evil\u001b[31m\u009b`) {
		t.Errorf("the escaped Widget name is not in the JSON output:\n%s", strings.Join(lines, "\n"))
	}

	for _, tc := range []struct {
		f    Filter
		want []string // text lines' distinguishing part, both modes
	}{
		{Filter{Source: "cms"}, []string{"sync.started    source=cms", "ConfigMap              shop/a", "ConfigMap              other/a"}},
		{Filter{Namespace: "shop"}, []string{"source=cms namespace=-", "shop/a", "source=widgets namespace=-", `"shop/evil\x1b[31m\u009b"`}},
		{Filter{Kind: "widget"}, []string{"source=cms namespace=-", "source=widgets namespace=-", `"shop/evil\x1b[31m\u009b"`, `"other/evil\x1b[31m\u009b"`}},
		{Filter{Source: "widgets", Namespace: "other", Kind: "Widget"}, []string{"source=widgets namespace=-", `"other/evil\x1b[31m\u009b"`}},
	} {
		got := run(Options{Filter: tc.f, Count: 2 * len(tc.want)})
		if len(got) != 2*len(tc.want) {
			t.Errorf("%+v: %d lines, want %d:\n%s", tc.f, len(got), 2*len(tc.want), strings.Join(got, "\n"))
			continue
		}
		for i, l := range got {
			if !strings.Contains(l, tc.want[i%len(tc.want)]) {
				t.Errorf("%+v: line %d %q lacks %q", tc.f, i, l, tc.want[i%len(tc.want)])
			}
		}
	}
}

// JSONLine and Format escape what a terminal would act on; printable
// values are left alone.
func TestSafe(t *testing.T) {
	for in, want := range map[string]string{
		"web-1":          "web-1",
		"ünïcode ok":     "ünïcode ok",
		"a\x1b[2Jb":      `"a\x1b[2Jb"`,
		"csi\u009b1m":    `"csi\u009b1m"`,
		"bad\xffbyte":    `"bad\xffbyte"`,
		"tab\tnewline\n": `"tab\tnewline\n"`,
	} {
		if got := safe(in); got != want {
			t.Errorf("safe(%q) = %s, want %s", in, got, want)
		}
	}
	if got := string(escapeForTerminal([]byte("{\"n\":\"x\u007f\u0085\xfe\"}"))); got != `{"n":"x\u007f\u0085\ufffd"}` {
		t.Errorf("escapeForTerminal: %s", got)
	}
}
