package main

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/pkg/event"
)

// tailEnv is a production-like NATS for `relayd tail -c`: TLS with a
// private CA that verifies client certificates, NKey users only, and
// JetStream in domain "hub". The tail user may only publish to the
// JetStream API of that domain and subscribe to the events and to inboxes
// with the config's inbox prefix, so a tail that ignored nats.jsDomain or
// nats.inboxPrefix would be refused.
type tailEnv struct {
	dir      string
	pki      *testenv.PKI
	nats     *testenv.NATS
	tailSeed string // the seed file of the tail user
	pub      *nats.Conn
	js       jetstream.JetStream // the publisher's, in domain hub
}

func startTailEnv(t *testing.T) *tailEnv {
	t.Helper()
	e := &tailEnv{dir: t.TempDir()}
	var err error
	if e.pki, err = testenv.NewPKI(e.dir); err != nil {
		t.Fatal(err)
	}
	seed, tailUser, err := testenv.NewNkeyUser(e.dir, "tail")
	if err != nil {
		t.Fatal(err)
	}
	e.tailSeed = seed
	pubSeed, pubUser, err := testenv.NewNkeyUser(e.dir, "publisher")
	if err != nil {
		t.Fatal(err)
	}
	e.nats = testenv.NATST(t, testenv.NATSOptions{
		TLS: &testenv.NATSTLS{CertFile: e.pki.ServerCertFile, KeyFile: e.pki.ServerKeyFile, CAFile: e.pki.CAFile, Verify: true},
		Nkeys: []*server.NkeyUser{
			{Nkey: tailUser, Permissions: &server.Permissions{
				Publish:   &server.SubjectPermission{Allow: []string{"$JS.API.>", "$JS.*.API.>"}},
				Subscribe: &server.SubjectPermission{Allow: []string{"k8s.dev.>", "_INBOX_tail.>"}},
			}},
			{Nkey: pubUser},
		},
		JetStreamDomain: "hub",
	})
	nkey, err := nats.NkeyOptionFromSeed(pubSeed)
	if err != nil {
		t.Fatal(err)
	}
	e.pub, err = nats.Connect(e.nats.URL(), nkey, nats.RootCAs(e.pki.CAFile), nats.ClientCert(e.pki.ClientCertFile, e.pki.ClientKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.pub.Close)
	if e.js, err = jetstream.NewWithDomain(e.pub, "hub"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := e.js.CreateStream(ctx, jetstream.StreamConfig{Name: "K8S", Subjects: []string{"k8s.dev.>"}}); err != nil {
		t.Fatal(err)
	}
	return e
}

// config writes a relayd config whose nats block is the environment's
// production one, changed by edit, and returns its path.
func (e *tailEnv) config(t *testing.T, edit func(map[string]string)) string {
	t.Helper()
	keys := map[string]string{
		"url":            e.nats.URL(),
		"nkeySeedFile":   e.tailSeed,
		"tls.caFile":     e.pki.CAFile,
		"tls.certFile":   e.pki.ClientCertFile,
		"tls.keyFile":    e.pki.ClientKeyFile,
		"tls.serverName": "nats.test",
		"jsDomain":       "hub",
		"inboxPrefix":    "_INBOX_tail",
	}
	if edit != nil {
		edit(keys)
	}
	return writeTailConfig(t, keys)
}

// writeTailConfig writes a minimal valid relayd config (cluster dev,
// stream K8S) with the given nats keys ("tls.x" in the tls block).
func writeTailConfig(t *testing.T, keys map[string]string) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("cluster: dev\nnats:\n  stream: {name: K8S}\n")
	var tlsKeys strings.Builder
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		if name, ok := strings.CutPrefix(k, "tls."); ok {
			fmt.Fprintf(&tlsKeys, "    %s: %q\n", name, keys[k])
		} else {
			fmt.Fprintf(&b, "  %s: %q\n", k, keys[k])
		}
	}
	if tlsKeys.Len() > 0 {
		b.WriteString("  tls:\n" + tlsKeys.String())
	}
	b.WriteString("checkpoint: {namespace: default}\nsources:\n  - {name: cms, apiVersion: v1, kind: ConfigMap}\n")
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// publish sends a relayd event for ConfigMap ns/<name>, as relayd does,
// and waits for the stream's acknowledgement.
func (e *tailEnv) publish(t *testing.T, name, rv string) {
	t.Helper()
	enc, err := event.NewEncoder(event.EncoderOptions{Prefix: "k8s", Cluster: "dev", Source: "cms"})
	if err != nil {
		t.Fatal(err)
	}
	m, err := enc.Encode(&event.Change{Type: event.Added, Origin: event.OriginWatch, Epoch: 1, Time: time.Now(),
		Resource: event.Resource{Version: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespaced: true},
		Meta:     event.Meta{UID: "uid-" + name, Namespace: "ns", Name: name, ResourceVersion: rv}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := e.js.PublishMsg(ctx, &nats.Msg{Subject: m.Subject, Header: nats.Header(m.Header), Data: m.Data}); err != nil {
		t.Fatal(err)
	}
}

// tailResult is the outcome of one cmdTail run.
type tailResult struct {
	code        int
	out, stderr string
}

// startTail runs cmdTail with args in the background.
func startTail(args ...string) <-chan tailResult {
	done := make(chan tailResult, 1)
	go func() {
		var out, errb bytes.Buffer
		code := tailCommand(args, &out, &errb, noEnv)
		done <- tailResult{code, out.String(), errb.String()}
	}()
	return done
}

func waitTail(t *testing.T, done <-chan tailResult) tailResult {
	t.Helper()
	select {
	case r := <-done:
		return r
	case <-time.After(30 * time.Second):
		t.Fatal("relayd tail did not finish within 30s")
		return tailResult{}
	}
}

// `relayd tail -c` connects with the whole nats block (TLS with a private
// CA and a client certificate, an NKey seed, the JetStream domain and the
// inbox prefix), follows the config's subject live, and with --replay
// replays the config's stream.
func TestTailWithConfig(t *testing.T) {
	e := startTailEnv(t)
	cfg := e.config(t, nil)
	e.publish(t, "a", "11")
	e.publish(t, "b", "12")

	t.Run("replay", func(t *testing.T) {
		r := waitTail(t, startTail("-c", cfg, "--replay", "--count", "2"))
		if r.code != 0 {
			t.Fatalf("exit %d\n%s", r.code, r.stderr)
		}
		lines := strings.Split(strings.TrimSpace(r.out), "\n")
		if len(lines) != 2 || !strings.Contains(lines[0], "ConfigMap") || !strings.Contains(lines[0], "ns/a") ||
			!strings.Contains(lines[0], "rv=11") || !strings.Contains(lines[1], "ns/b") {
			t.Errorf("output:\n%s", r.out)
		}
	})

	t.Run("live", func(t *testing.T) {
		done := startTail("--config", cfg, "--count", "1")
		waitSubscribed(t, e.nats, "k8s.dev.>", done)
		e.publish(t, "c", "13")
		r := waitTail(t, done)
		if r.code != 0 {
			t.Fatalf("exit %d\n%s", r.code, r.stderr)
		}
		// Live only: the stored events a and b are not shown.
		if lines := strings.Split(strings.TrimSpace(r.out), "\n"); len(lines) != 1 || !strings.Contains(lines[0], "ns/c") {
			t.Errorf("output:\n%s", r.out)
		}
	})

	t.Run("subject and stream flags override the config", func(t *testing.T) {
		r := waitTail(t, startTail("-c", cfg, "--stream", "K8S", "--subject", "k8s.dev.core.v1.configmaps.>", "--count", "3"))
		if r.code != 0 {
			t.Fatalf("exit %d\n%s", r.code, r.stderr)
		}
		if n := strings.Count(r.out, "ConfigMap"); n != 3 {
			t.Errorf("%d events, want 3:\n%s", n, r.out)
		}
	})
}

// waitSubscribed waits until relayd tail's connection subscribes to
// subject (or tail exited early).
func waitSubscribed(t *testing.T, n *testenv.NATS, subject string, done <-chan tailResult) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case r := <-done:
			t.Fatalf("relayd tail exited %d before subscribing\n%s", r.code, r.stderr)
		default:
		}
		cz, err := n.Server().Connz(&server.ConnzOptions{Subscriptions: true})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cz.Conns {
			if c.Name == "relayd-tail" && slices.Contains(c.Subs, subject) {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("relayd tail did not subscribe to %s within 20s", subject)
}

// Every failure is one line on stderr naming the setting, exit 1; a URL is
// never shown with its credentials.
func TestTailFailuresNameTheSetting(t *testing.T) {
	e := startTailEnv(t)
	dir := t.TempDir()
	missingSeed := filepath.Join(dir, "missing.nk")
	otherSeed, _, err := testenv.NewNkeyUser(dir, "stranger")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"missing config file", []string{"-c", filepath.Join(dir, "nope.yaml")},
			[]string{filepath.Join(dir, "nope.yaml")}},
		{"missing nkey seed file", []string{"-c", e.config(t, func(k map[string]string) { k["nkeySeedFile"] = missingSeed })},
			[]string{"nats.nkeySeedFile", missingSeed}},
		{"seed of an unknown user", []string{"-c", e.config(t, func(k map[string]string) { k["nkeySeedFile"] = otherSeed })},
			[]string{"cannot connect to NATS at " + e.nats.URL(), "NATS refused the credentials", "nats.nkeySeedFile " + otherSeed}},
		{"wrong CA", []string{"-c", e.config(t, func(k map[string]string) { k["tls.caFile"] = e.pki.OtherCAFile })},
			[]string{"not trusted", "nats.tls.caFile " + e.pki.OtherCAFile}},
		{"--creds replaces the config's nkey", []string{"-c", e.config(t, func(k map[string]string) { k["nkeySeedFile"] = missingSeed }),
			"--creds", filepath.Join(dir, "missing.creds")},
			[]string{"--creds", filepath.Join(dir, "missing.creds")}},
		{"another JetStream domain", []string{"-c", e.config(t, func(k map[string]string) { k["jsDomain"] = "elsewhere" }), "--replay"},
			[]string{"stream K8S", `nats.jsDomain "elsewhere"`}},
		{"stream not found", []string{"-c", e.config(t, nil), "--stream", "NOPE"},
			[]string{"stream NOPE", `check the stream name and nats.jsDomain "hub"`}},
		{"--server overrides nats.url", []string{"-c", e.config(t, nil), "--server", "tls://127.0.0.1:1"},
			[]string{"cannot connect to NATS at tls://127.0.0.1:1", "--server"}},
		{"--server nats:// with the config's nats.tls is TLS", []string{"-c", e.config(t, nil), "--server", "nats://127.0.0.1:1"},
			[]string{"cannot connect to NATS at nats://127.0.0.1:1", "--server"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := waitTail(t, startTail(tc.args...))
			t.Log(strings.TrimSpace(r.stderr))
			if r.code != 1 {
				t.Fatalf("exit %d, want 1\n%s", r.code, r.stderr)
			}
			if lines := strings.Split(strings.TrimSpace(r.stderr), "\n"); len(lines) != 1 {
				t.Errorf("%d lines, want one:\n%s", len(lines), r.stderr)
			}
			for _, want := range tc.want {
				if !strings.Contains(r.stderr, want) {
					t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
				}
			}
			if strings.Contains(r.stderr, "s3cret") {
				t.Errorf("stderr shows the credentials:\n%s", r.stderr)
			}
			if r.out != "" {
				t.Errorf("stdout: %q", r.out)
			}
		})
	}
}

// Settings that check-config would refuse are refused before connecting,
// exit 2, in one line naming the flag: credentials in --server (shown
// redacted), credentials over a connection that is not TLS (unless
// --allow-plaintext-credentials accepts them, with a warning).
func TestTailChecksItsSettings(t *testing.T) {
	dir := t.TempDir()
	creds := filepath.Join(dir, "missing.creds")
	plainCfg := filepath.Join(dir, "plain.yaml")
	if err := os.WriteFile(plainCfg, []byte("cluster: dev\nsources: [{name: cms, apiVersion: v1, kind: ConfigMap}]\n"+
		"nats: {url: 'nats://127.0.0.1:1', tokenFile: '"+filepath.Join(dir, "token")+"', allowPlaintextCredentials: true, stream: {name: K8S}}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tlsCfg := writeTailConfig(t, map[string]string{"url": "tls://127.0.0.1:1", "tokenFile": filepath.Join(dir, "token")})
	for _, tc := range []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"credentials in --server, with a config", []string{"-c", tlsCfg, "--server", "tls://relayd:s3cret@127.0.0.1:1"}, 2,
			[]string{`relayd tail: --server: "tls://xxxxx@127.0.0.1:1" holds credentials`}},
		{"a token in --server", []string{"--server", "nats://t0ken-s3cret@127.0.0.1:1"}, 2,
			[]string{`relayd tail: --server: "nats://xxxxx@127.0.0.1:1" holds credentials`}},
		{"--creds over nats://", []string{"--server", "nats://127.0.0.1:1", "--creds", creds}, 2,
			[]string{`relayd tail: --server: "nats://127.0.0.1:1" is not TLS, so --creds would authenticate an unencrypted connection`, "--allow-plaintext-credentials"}},
		{"the config's token, --server nats://", []string{"-c", tlsCfg, "--server", "nats://127.0.0.1:1"}, 2,
			[]string{`relayd tail: --server: "nats://127.0.0.1:1" is not TLS, so nats.tokenFile would authenticate`, "nats.allowPlaintextCredentials"}},
		{"--creds over nats://, accepted", []string{"--server", "nats://127.0.0.1:1", "--creds", creds, "--allow-plaintext-credentials"}, 1,
			[]string{`relayd tail: warning: "nats://127.0.0.1:1" is not TLS, so --creds would authenticate an unencrypted connection`, "relayd tail: --creds: open " + creds}},
		{"the config's token over nats://, accepted by the config", []string{"-c", plainCfg}, 1,
			[]string{`relayd tail: warning: "nats://127.0.0.1:1" is not TLS, so nats.tokenFile would authenticate an unencrypted connection`, "relayd tail: nats.tokenFile: open"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := waitTail(t, startTail(tc.args...))
			t.Log(strings.TrimSpace(r.stderr))
			if r.code != tc.code {
				t.Errorf("exit %d, want %d", r.code, tc.code)
			}
			for _, want := range tc.want {
				if !strings.Contains(r.stderr, want) {
					t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
				}
			}
			if lines := strings.Split(strings.TrimSpace(r.stderr), "\n"); tc.code == 2 && len(lines) != 1 {
				t.Errorf("%d lines, want one:\n%s", len(lines), r.stderr)
			}
			if strings.Contains(r.stderr, "s3cret") {
				t.Errorf("stderr shows the credentials:\n%s", r.stderr)
			}
		})
	}
}

func TestTailUsage(t *testing.T) {
	for _, arg := range []string{"-h", "--help"} {
		var out, errb bytes.Buffer
		if code := tailCommand([]string{arg}, &out, &errb, noEnv); code != 0 || errb.Len() > 0 {
			t.Errorf("tail %s: exit %d, want 0 (stderr %q)", arg, code, errb.String())
		}
		for _, want := range []string{"Usage: relayd tail [-c config.yaml]", "--replay", "-c, --config", "<prefix>.<cluster>.>", "NATS_CONTEXT"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("tail %s: usage lacks %q:\n%s", arg, want, out.String())
			}
		}
	}
	for _, args := range [][]string{{"--replay"}, {"-c", "x.yaml", "--replay", "--stream", "K8S"}, {"--frobnicate"}} {
		var out, errb bytes.Buffer
		if code := tailCommand(args, &out, &errb, noEnv); code != 2 {
			t.Errorf("tail %q: exit %d, want 2\n%s", args, code, errb.String())
		}
	}
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}, {"run", "-h"}, {"check-config", "--help"}} {
		var out, errb bytes.Buffer
		if code := run(args, nil, &out, &errb); code != 0 {
			t.Errorf("relayd %q: exit %d, want 0\n%s", args, code, errb.String())
		}
		if out.Len()+errb.Len() == 0 {
			t.Errorf("relayd %q: no usage printed", args)
		}
	}
}

// noEnv is an empty environment: the tests of cmd/relayd do not depend on
// the NATS_* variables of whoever runs them.
func noEnv(string) string { return "" }

// NATS_CONTEXT: relayd tail connects with a nats CLI context (URL, NKey
// seed, CA, client certificate, JetStream domain, inbox prefix) to the
// production-like NATS, which refuses anything else; NATS_URL then
// overrides the context's url, and the failure names it.
func TestTailWithNATSContext(t *testing.T) {
	e := startTailEnv(t)
	e.publish(t, "a", "11")
	xdg := t.TempDir()
	ctxFile := filepath.Join(xdg, "nats", "context", "prod.json")
	if err := os.MkdirAll(filepath.Dir(ctxFile), 0o700); err != nil {
		t.Fatal(err)
	}
	doc := fmt.Sprintf(`{"description": "test", "url": %q, "nkey": %q, "ca": %q, "cert": %q, "key": %q,
		"jetstream_domain": "hub", "inbox_prefix": "_INBOX_tail", "token": "unused", "color_scheme": "dark"}`,
		e.nats.URL(), e.tailSeed, e.pki.CAFile, e.pki.ClientCertFile, e.pki.ClientKeyFile)
	if err := os.WriteFile(ctxFile, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"XDG_CONFIG_HOME": xdg, "NATS_CONTEXT": "prod"}
	getenv := func(k string) string { return env[k] }
	run := func(args ...string) tailResult {
		var out, errb bytes.Buffer
		code := tailCommand(args, &out, &errb, getenv)
		return tailResult{code, out.String(), errb.String()}
	}
	r := run("--stream", "K8S", "--subject", "k8s.dev.>", "--count", "1")
	if r.code != 0 || !strings.Contains(r.out, "ns/a") || !strings.Contains(r.stderr, "relayd tail: warning: context prod: token ignored") {
		t.Errorf("with NATS_CONTEXT: exit %d\nstdout: %s\nstderr: %s", r.code, r.out, r.stderr)
	}
	env["NATS_URL"] = "tls://127.0.0.1:1"
	r = run("--stream", "K8S", "--count", "1")
	if r.code != 1 || !strings.Contains(r.stderr, "cannot connect to NATS at tls://127.0.0.1:1") || !strings.Contains(r.stderr, "is $NATS_URL right") {
		t.Errorf("NATS_URL over the context: exit %d\n%s", r.code, r.stderr)
	}
}
