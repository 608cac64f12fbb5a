package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/relayd/relayd/pkg/event"
)

// encoder is relayd's own encoder (pkg/event) for source src of cluster
// cluster: the tests' messages are byte for byte what relayd publishes.
func encoder(t testing.TB, cluster, src string, binary bool) *event.Encoder {
	t.Helper()
	e, err := event.NewEncoder(event.EncoderOptions{Cluster: cluster, Source: src, Binary: binary})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

var cmResource = event.Resource{Version: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespaced: true}

// change is a ConfigMap change as relayd would publish it.
func change(typ event.Type, ns, name, uid, rv string) *event.Change {
	return &event.Change{Type: typ, Origin: event.OriginWatch, Resource: cmResource, Payload: event.PayloadReference,
		Meta: event.Meta{Namespace: ns, Name: name, UID: uid, ResourceVersion: rv}}
}

func encode(t testing.TB, e *event.Encoder, c *event.Change) event.Message {
	t.Helper()
	m, err := e.Encode(c)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestCheck: what relayd publishes passes, in both CloudEvents modes,
// whatever the object's name (escaped in the subject, hashed when too
// long); a message whose type, cluster, source, id or subject disagree
// with the envelope, or with the cluster the consumer follows, is unusable.
func TestCheck(t *testing.T) {
	const cluster = "prod"
	decode := func(m event.Message) *event.Envelope {
		env, err := event.DecodeMessage(m.Header, m.Data)
		if err != nil {
			t.Fatal(err)
		}
		return &env
	}
	msgID := func(m event.Message) string { return m.Header[event.HeaderMsgID][0] }
	for _, binary := range []bool{false, true} {
		e := encoder(t, cluster, "cms", binary)
		for _, c := range []*event.Change{
			change(event.Added, "shop", "web", "u1", "10"),
			change(event.Deleted, "shop", "web", "u1", "11"),
			change(event.Modified, "", "cluster-scoped", "u2", "12"),
			change(event.Added, "shop", "evil.\x1b[31m*>% \u202e", "u3", "13"),
			change(event.Added, "shop", strings.Repeat("long-name", 60), "u4", "14"),
		} {
			m := encode(t, e, c)
			if k, err := Check("k8s", cluster, m.Subject, msgID(m), decode(m)); err != nil || k != objectEvent {
				t.Errorf("binary=%v: %s: %v, %v; want an object event", binary, m.Subject, k, err)
			}
			// As a relayd from before the cluster was in the Nats-Msg-Id
			// wrote it (and a replay after an upgrade still does).
			e.UseLegacyMsgID(&m)
			if k, err := Check("k8s", cluster, m.Subject, msgID(m), decode(m)); err != nil || k != objectEvent {
				t.Errorf("binary=%v: %s with Nats-Msg-Id %s: %v, %v; want an object event", binary, m.Subject, msgID(m), k, err)
			}
		}
		for _, completed := range []bool{false, true} {
			m := e.Control(event.SyncEvent{Completed: completed, Namespace: "shop", Epoch: 1, Reason: "initial"})
			want := map[bool]kind{false: syncStarted, true: syncCompleted}[completed]
			if k, err := Check("k8s", cluster, m.Subject, msgID(m), decode(m)); err != nil || k != want {
				t.Errorf("binary=%v: %s: %v, %v; want %v", binary, m.Subject, k, err, want)
			}
		}
	}

	e := encoder(t, cluster, "cms", false)
	good := encode(t, e, change(event.Added, "shop", "web", "u1", "10"))
	other := encode(t, e, change(event.Added, "shop", "db", "u9", "10"))
	marker := e.Control(event.SyncEvent{Completed: true, Namespace: "shop", Epoch: 1, Reason: "index-lost"})
	for _, tc := range []struct {
		name, subject, msgID string
		edit                 func(*event.Envelope)
		cluster              string
	}{
		{name: "another cluster than the consumer follows", cluster: "staging"},
		{name: "k8scluster of another cluster", edit: func(env *event.Envelope) { env.K8sCluster = "staging" }},
		{name: "source of another cluster", edit: func(env *event.Envelope) { env.Source = "/relayd/staging/cms" }},
		{name: "source of another source", edit: func(env *event.Envelope) { env.Source = "/relayd/prod/secrets" }},
		{name: "relaydsource that is no source name", edit: func(env *event.Envelope) { env.RelaydSource, env.Source = "c.s", "/relayd/prod/c.s" }},
		{name: "an unknown type", edit: func(env *event.Envelope) { env.Type = "k8s.object.exploded" }},
		{name: "a type of another prefix", edit: func(env *event.Envelope) { env.Type = "acme.object.added" }},
		{name: "a type that is a suffix only", edit: func(env *event.Envelope) { env.Type = "x.source.sync.completed" }},
		{name: "the type disagrees with the subject", edit: func(env *event.Envelope) { env.Type, env.ID = "k8s.object.deleted", "u1/10/deleted" }},
		{name: "another object's subject", subject: other.Subject},
		{name: "another namespace", edit: func(env *event.Envelope) { env.K8sNamespace = "kube-system" }},
		{name: "another resource", edit: func(env *event.Envelope) { env.K8sResource = "secrets" }},
		{name: "another group", edit: func(env *event.Envelope) { env.K8sAPIVersion = "apps/v1" }},
		{name: "another version", edit: func(env *event.Envelope) { env.K8sAPIVersion = "v2" }},
		{name: "an object event without a uid", edit: func(env *event.Envelope) { env.K8sUID, env.ID = "", "/10" }},
		{name: "an id that is not uid/resourceVersion", edit: func(env *event.Envelope) { env.ID = "u1/9" }},
		{name: "a Nats-Msg-Id of another source", msgID: "secrets/u1/10"},
		{name: "a Nats-Msg-Id of another cluster", msgID: "k8s.dev/cms/u1/10"},
		{name: "a subject that is no object subject", subject: "k8s.prod.core.v1.configmaps.shop"},
		{name: "a subject of another prefix", subject: strings.Replace(good.Subject, "k8s.", "acme.", 1)},
		{name: "a marker on an object subject", subject: good.Subject, edit: func(env *event.Envelope) { *env = *decode(marker) }},
		{name: "a marker of another source", subject: strings.Replace(marker.Subject, "._relayd.cms.", "._relayd.secrets.", 1), edit: func(env *event.Envelope) { *env = *decode(marker) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := decode(good)
			if tc.edit != nil {
				tc.edit(env)
			}
			subject, id, cl := good.Subject, "", cluster
			if tc.subject != "" {
				subject = tc.subject
			}
			if tc.msgID != "" {
				id = tc.msgID
			}
			if tc.cluster != "" {
				cl = tc.cluster
			}
			if _, err := Check("k8s", cl, subject, id, env); !errors.Is(err, errUnusable) {
				t.Errorf("Check(%s, %+v) = %v, want an unusable message", subject, env, err)
			} else {
				t.Log(err)
			}
		})
	}
}

// TestPrintable: names and values from a message reach the terminal
// without control characters, escape sequences or bidi overrides, and
// without a space that would split a field; ordinary ones as they are.
func TestPrintable(t *testing.T) {
	for in, want := range map[string]string{
		"web-1":                 "web-1",
		"café":                  "café",
		"":                      `""`,
		"evil\x1b[31m":          `"evil\x1b[31m"`,
		"two\nlines":            `"two\nlines"`,
		"a b":                   `"a b"`,
		`say "hi"`:              `"say \"hi\""`,
		"abc\u202edef":          `"abc\u202edef"`,
		"bell\a":                `"bell\a"`,
		"\xff":                  `"\xff"`,
		"back\\slash":           `"back\\slash"`,
		"zero\u200bwidth-space": `"zero\u200bwidth-space"`,
	} {
		if got := printable(in); got != want {
			t.Errorf("printable(%q) = %s, want %s", in, got, want)
		}
	}
	line := describe(Applied{Seq: 7, Action: Store, Event: event.Envelope{Type: "k8s.object.added", K8sKind: "ConfigMap",
		K8sNamespace: "shop", K8sName: "evil\x1b]0;owned\a", K8sUID: "u1", K8sResourceVersion: "10", RelaydOrigin: "watch"}})
	if want := `7 store  added ConfigMap "shop/evil\x1b]0;owned\a" rv=10 origin=watch`; line != want {
		t.Errorf("describe = %q, want %q", line, want)
	}
}
