package relay_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/pkg/index"
)

// The tests of this file run relayd against nats-servers configured like
// production NATS: TLS with a private CA, mutual TLS, NKey, user/password,
// token and operator (JWT) users, a JetStream domain, and streams that an
// administrator owns. Each bad setting must keep relayd unready with a
// reason naming the setting and the server's answer, alive (no crash
// loop), and lose nothing once it is fixed.

const cmSource = `
  - name: cms
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]`

// plainOnLoopback accepts the credentials of the tests below on the test
// server's plain connection (127.0.0.1): relayd refuses credentials
// without TLS otherwise (TestTLS and TestMutualTLS cover TLS).
const plainOnLoopback = "\n  allowPlaintextCredentials: true"

// writeFile writes a (secret) file for relayd to read.
func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// copyFile replaces dst with src's content, as a Secret update does.
func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, dst, string(b))
}

// relays creates a ConfigMap and waits for its event.
func (f *fixture) relays(name string) {
	f.t.Helper()
	cm := f.createCM(name, nil, nil)
	f.waitStored(30*time.Second, isEvent("added", name, cm.ResourceVersion))
}

// unreadyBecause waits until /readyz is 503 with every want in its body,
// checks that relayd stays alive meanwhile, and returns the body.
func (r *running) unreadyBecause(f *fixture, want ...string) string {
	f.t.Helper()
	var body string
	f.eventually(30*time.Second, fmt.Sprintf("/readyz naming %q", want), func() error {
		err := r.readyErr()
		if err == nil {
			return fmt.Errorf("ready")
		}
		body = err.Error()
		for _, w := range want {
			if !strings.Contains(body, w) {
				return fmt.Errorf("%s", body)
			}
		}
		return nil
	})
	if err := r.healthErr(); err != nil {
		f.t.Errorf("/healthz while unready: %v, want 200 (no crash loop)", err)
	}
	select {
	case err := <-r.done:
		f.t.Fatalf("relay.Run returned while NATS refused it: %v", err)
	default:
	}
	return body
}

func TestTLS(t *testing.T) {
	pki, err := testenv.NewPKI(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Run("private CA", func(t *testing.T) {
		n := testenv.NATST(t, testenv.NATSOptions{TLS: &testenv.NATSTLS{CertFile: pki.ServerCertFile, KeyFile: pki.ServerKeyFile}})
		f := newFixture(t, env, n, cmSource, nats.RootCAs(pki.CAFile))
		f.setNATS("  tls:\n    caFile: " + pki.CAFile + "\n    serverName: nats.test")
		f.start(nil, true)
		f.relays("a")
	})
	t.Run("wrong CA then fixed", func(t *testing.T) {
		n := testenv.NATST(t, testenv.NATSOptions{TLS: &testenv.NATSTLS{CertFile: pki.ServerCertFile, KeyFile: pki.ServerKeyFile}})
		f := newFixture(t, env, n, cmSource, nats.RootCAs(pki.CAFile))
		ca := filepath.Join(t.TempDir(), "ca.crt")
		copyFile(t, pki.OtherCAFile, ca)
		f.setNATS("  tls:\n    caFile: " + ca)
		r := f.start(nil, false)
		body := r.unreadyBecause(f, "NATS not connected", "nats.tls.caFile "+ca, "x509")
		t.Logf("/readyz: %s", body)
		cm := f.createCM("while-refused", nil, nil)
		copyFile(t, pki.CAFile, ca)
		f.waitStored(60*time.Second, isEvent("added", cm.Name, cm.ResourceVersion))
	})
	t.Run("a CA file that is not PEM", func(t *testing.T) {
		n := testenv.NATST(t, testenv.NATSOptions{TLS: &testenv.NATSTLS{CertFile: pki.ServerCertFile, KeyFile: pki.ServerKeyFile}})
		f := newFixture(t, env, n, cmSource, nats.RootCAs(pki.CAFile))
		ca := filepath.Join(t.TempDir(), "ca.crt")
		writeFile(t, ca, "not a certificate\n")
		f.setNATS("  tls:\n    caFile: " + ca)
		r := f.start(nil, false)
		t.Logf("/readyz: %s", r.unreadyBecause(f, "nats.tls.caFile "+ca+": no PEM certificate in it"))
		copyFile(t, pki.CAFile, ca)
		r.unreadyGone(f)
	})
}

// unreadyGone waits for /readyz 200.
func (r *running) unreadyGone(f *fixture) {
	f.t.Helper()
	f.eventually(60*time.Second, "relayd ready", func() error { return r.readyErr() })
}

func TestMutualTLS(t *testing.T) {
	pki, err := testenv.NewPKI(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	n := testenv.NATST(t, testenv.NATSOptions{TLS: &testenv.NATSTLS{
		CertFile: pki.ServerCertFile, KeyFile: pki.ServerKeyFile, CAFile: pki.CAFile, Verify: true}})
	admin := []nats.Option{nats.RootCAs(pki.CAFile), nats.ClientCert(pki.ClientCertFile, pki.ClientKeyFile)}
	t.Run("client certificate", func(t *testing.T) {
		f := newFixture(t, env, n, cmSource, admin...)
		f.setNATS(fmt.Sprintf("  tls:\n    caFile: %s\n    certFile: %s\n    keyFile: %s", pki.CAFile, pki.ClientCertFile, pki.ClientKeyFile))
		f.start(nil, true)
		f.relays("a")
	})
	t.Run("no client certificate", func(t *testing.T) {
		f := newFixture(t, env, n, cmSource, admin...)
		f.setNATS("  tls:\n    caFile: " + pki.CAFile)
		r := f.start(nil, false)
		t.Logf("/readyz: %s", r.unreadyBecause(f, "NATS not connected", "client certificate", "nats.tls.certFile and keyFile: not set"))
	})
	t.Run("expired client certificate then renewed", func(t *testing.T) {
		f := newFixture(t, env, n, cmSource, admin...)
		dir := t.TempDir()
		crt, key := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
		copyFile(t, pki.ExpiredClientCertFile, crt)
		copyFile(t, pki.ExpiredClientKeyFile, key)
		f.setNATS(fmt.Sprintf("  tls:\n    caFile: %s\n    certFile: %s\n    keyFile: %s", pki.CAFile, crt, key))
		r := f.start(nil, false)
		t.Logf("/readyz: %s", r.unreadyBecause(f, "NATS not connected", "nats.tls.certFile "+crt))
		cm := f.createCM("while-expired", nil, nil)
		// cert-manager renews: key first, then the certificate.
		copyFile(t, pki.ClientKeyFile, key)
		copyFile(t, pki.ClientCertFile, crt)
		f.waitStored(60*time.Second, isEvent("added", cm.Name, cm.ResourceVersion))
	})
	t.Run("certificate of another CA", func(t *testing.T) {
		f := newFixture(t, env, n, cmSource, admin...)
		f.setNATS(fmt.Sprintf("  tls:\n    caFile: %s\n    certFile: %s\n    keyFile: %s", pki.CAFile, pki.OtherClientCertFile, pki.OtherClientKeyFile))
		r := f.start(nil, false)
		t.Logf("/readyz: %s", r.unreadyBecause(f, "NATS not connected", "nats.tls.certFile "+pki.OtherClientCertFile))
	})
	t.Run("missing key file", func(t *testing.T) {
		f := newFixture(t, env, n, cmSource, admin...)
		missing := filepath.Join(t.TempDir(), "tls.key")
		f.setNATS(fmt.Sprintf("  tls:\n    caFile: %s\n    certFile: %s\n    keyFile: %s", pki.CAFile, pki.ClientCertFile, missing))
		r := f.start(nil, false)
		t.Logf("/readyz: %s", r.unreadyBecause(f, "nats.tls.keyFile "+missing, "no such file"))
	})
}

func TestNKeyUser(t *testing.T) {
	dir := t.TempDir()
	goodSeed, goodPub, err := testenv.NewNkeyUser(dir, "relayd")
	if err != nil {
		t.Fatal(err)
	}
	adminSeed, adminPub, err := testenv.NewNkeyUser(dir, "admin")
	if err != nil {
		t.Fatal(err)
	}
	wrongSeed, _, err := testenv.NewNkeyUser(dir, "stranger")
	if err != nil {
		t.Fatal(err)
	}
	n := testenv.NATST(t, testenv.NATSOptions{Nkeys: []*server.NkeyUser{{Nkey: goodPub}, {Nkey: adminPub}}})
	adminOpt, err := nats.NkeyOptionFromSeed(adminSeed)
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, env, n, cmSource, adminOpt)
	seed := filepath.Join(t.TempDir(), "seed")
	copyFile(t, wrongSeed, seed)
	f.setNATS("  nkeySeedFile: " + seed + plainOnLoopback)
	r := f.start(nil, false)
	t.Logf("/readyz: %s", r.unreadyBecause(f, "NATS not connected", "nats.nkeySeedFile "+seed, "uthorization"))
	cm := f.createCM("while-refused", nil, nil)
	copyFile(t, goodSeed, seed)
	f.waitStored(60*time.Second, isEvent("added", cm.Name, cm.ResourceVersion))
}

func TestUserPassword(t *testing.T) {
	n := testenv.NATST(t, testenv.NATSOptions{Users: []*server.User{
		{Username: "relayd", Password: "right"}, {Username: "admin", Password: "admin"}}})
	f := newFixture(t, env, n, cmSource, nats.UserInfo("admin", "admin"))
	dir := t.TempDir()
	user, pass := filepath.Join(dir, "username"), filepath.Join(dir, "password")
	writeFile(t, user, "relayd\n")
	writeFile(t, pass, "wrong\n")
	f.setNATS(fmt.Sprintf("  userFile: %s\n  passwordFile: %s", user, pass) + plainOnLoopback)
	r := f.start(nil, false)
	body := r.unreadyBecause(f, "NATS not connected", "nats.passwordFile "+pass, "uthorization")
	if strings.Contains(body, "wrong") || strings.Contains(body, "right") {
		t.Errorf("/readyz shows a password: %s", body)
	}
	t.Logf("/readyz: %s", body)
	cm := f.createCM("while-refused", nil, nil)
	writeFile(t, pass, "right\n")
	f.waitStored(60*time.Second, isEvent("added", cm.Name, cm.ResourceVersion))
}

// waitIndexed waits for cm's object index entry. It is relayd's last
// publish for cm (the index write follows the event's ack): after it no
// client of relayd is publishing, so a test may make the server drop
// relayd's connection. The embedded nats-server (v2.15.2) is not race-free
// when it drops a client: it reads the dropped client's message counters
// without the atomics its read loop writes them with, and a Direct Get
// reads the options that a reload replaces without their lock; -race
// reports either. Hence a plain STREAM.MSG.GET request here, not the KV
// API's Direct Get.
func (f *fixture) waitIndexed(cm *corev1.ConfigMap) {
	f.t.Helper()
	bucket := "relayd-index-" + f.cluster
	key := index.Key(index.Prefix("cms", f.ns), string(cm.UID))
	f.eventually(30*time.Second, cm.Name+"'s object index entry", func() error {
		resp, err := f.nc.RequestWithContext(f.t.Context(), "$JS.API.STREAM.MSG.GET.KV_"+bucket,
			fmt.Appendf(nil, `{"last_by_subj":"$KV.%s.%s"}`, bucket, key))
		if err != nil {
			return err
		}
		if !strings.Contains(string(resp.Data), `"message"`) {
			return fmt.Errorf("%s", resp.Data)
		}
		return nil
	})
}

// The token is rotated while relayd runs: the Secret (file) first, then the
// server, which disconnects every client of the old token. relayd reconnects
// with the new one, without a restart, and loses nothing.
func TestTokenRotation(t *testing.T) {
	n := testenv.NATST(t, testenv.NATSOptions{Token: "old-token"})
	// The test's own connection must survive the rotation: it reads the
	// token from the same file.
	tok := filepath.Join(t.TempDir(), "token")
	writeFile(t, tok, "old-token\n")
	f := newFixture(t, env, n, cmSource, nats.TokenHandler(func() string {
		b, _ := os.ReadFile(tok)
		return strings.TrimSpace(string(b))
	}), nats.IgnoreAuthErrorAbort())
	f.setNATS("  tokenFile: " + tok + plainOnLoopback)
	r := f.start(nil, true)
	before := f.createCM("before", nil, nil)
	f.waitStored(30*time.Second, isEvent("added", before.Name, before.ResourceVersion))
	f.waitIndexed(before)
	writeFile(t, tok, "new-token\n")
	reconnects := f.nc.Stats().Reconnects
	// Every connection (relayd's, the test's) is closed before the reload,
	// so that the reload finds none to disconnect itself: nats-server
	// v2.15.2 races when it does while the client's read loop runs (its
	// auth-error event reads the client's counters unlocked), and the race
	// detector fails the test. They reconnect with the new token, are
	// refused until the reload, then accepted.
	cz, err := n.Server().Connz(&server.ConnzOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ci := range cz.Conns {
		if err := n.Server().DisconnectClientByID(ci.Cid); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.Reload(func(o *server.Options) { o.Authorization = "new-token" }); err != nil {
		t.Fatal(err)
	}
	// A request sent on the test's connection before it reconnected would
	// be lost, so wait for the reconnect.
	f.eventually(30*time.Second, "the test's connection reconnects with the new token", func() error {
		if st := f.nc.Stats(); st.Reconnects == reconnects || !f.nc.IsConnected() {
			return fmt.Errorf("reconnects %d, status %v", st.Reconnects, f.nc.Status())
		}
		return nil
	})
	cm := f.createCM("after", nil, nil)
	f.waitStored(60*time.Second, isEvent("added", cm.Name, cm.ResourceVersion))
	r.unreadyGone(f)
}

// Operator mode: the account and user are JWTs; relayd logs in with a .creds
// file and creates its stream and bucket in its account.
func TestOperatorModeCreds(t *testing.T) {
	op, err := testenv.NewOperator()
	if err != nil {
		t.Fatal(err)
	}
	n := testenv.NATST(t, testenv.NATSOptions{Operator: op})
	dir := t.TempDir()
	adminCreds, err := op.UserCreds(dir, "admin", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	creds, err := op.UserCreds(dir, "relayd", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, env, n, cmSource, nats.UserCredentials(adminCreds))
	f.setNATS("  credentialsFile: " + creds + plainOnLoopback)
	f.start(nil, true)
	f.relays("a")
	// The admin is in the same account: it sees the stream and bucket.
	if _, err := f.js.Stream(t.Context(), f.stream); err != nil {
		t.Errorf("stream %s in the account: %v", f.stream, err)
	}
	f.indexBucket()
}

// A JetStream domain (a leaf node's hub): the stream lives in the domain.
func TestJetStreamDomain(t *testing.T) {
	n := testenv.NATST(t, testenv.NATSOptions{JetStreamDomain: "hub"})
	f := newFixture(t, env, n, cmSource)
	js, err := jetstream.NewWithDomain(f.nc, "hub")
	if err != nil {
		t.Fatal(err)
	}
	f.js = js
	f.setNATS("  jsDomain: hub")
	f.start(nil, true)
	f.relays("a") // read back through the domain's API
	if d := n.Server().JetStreamConfig().Domain; d != "hub" {
		t.Errorf("server domain %q", d)
	}
}

// Two clusters share one stream that an administrator made for something
// else too, with settings away from their defaults (created and read back
// through the raw JetStream API: the server's JSON, not nats.go's
// StreamConfig): each relayd adds its subject and changes nothing else
// (docs/GUARANTEES.md, "A shared stream": relayd uses STREAM.UPDATE only
// to add its subject). The server's configuration before and after is
// compared key by key, in full, but for "subjects", which must be the
// administrator's plus the two relayds'; both relay.
func TestSharedStreamIsNeverClobbered(t *testing.T) {
	east := newFixture(t, env, natsSrv, cmSource)
	west := newFixture(t, env, natsSrv, cmSource)
	name := "EVENTS" + east.stream
	east.useStream(name)
	west.useStream(name)
	ctx := t.Context()
	if _, err := testenv.JSRequest(ctx, east.nc, "$JS.API.STREAM.CREATE."+name, map[string]any{
		"name": name, "description": "audit and Kubernetes events", "subjects": []string{"audit.>"},
		"max_consumers": 50, "max_msgs": 1000000, "max_bytes": 1 << 30, "max_age": 72 * time.Hour,
		"max_msgs_per_subject": 1000, "max_msg_size": 1 << 20, "discard": "old", "duplicate_window": 5 * time.Minute,
		"compression": "s2", "allow_direct": true, "deny_delete": true, "deny_purge": true,
		"allow_msg_ttl": true, "subject_delete_marker_ttl": 10 * time.Minute,
		"consumer_limits": map[string]any{"inactive_threshold": time.Hour},
		"metadata":        map[string]string{"owner": "team-a", "managed-by": "gitops"},
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = east.js.DeleteStream(context.Background(), name) })
	before, err := testenv.JSRequest(ctx, east.nc, "$JS.API.STREAM.INFO."+name, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Both start at once: their subject additions race.
	re, rw := east.start(nil, false), west.start(nil, false)
	re.unreadyGone(east)
	rw.unreadyGone(west)
	east.relays("from-east")
	west.relays("from-west")
	checkSharedConfig(t, east, before, "audit.>", "k8s."+east.cluster+".>", "k8s."+west.cluster+".>")
}

func TestStreamThatBreaksGuaranteesKeepsRelaydUnready(t *testing.T) {
	ctx := t.Context()
	t.Run("duplicate window of 30s", func(t *testing.T) {
		f := newFixture(t, env, natsSrv, cmSource)
		if _, err := f.js.CreateStream(ctx, jetstream.StreamConfig{
			Name: f.stream, Subjects: []string{"k8s." + f.cluster + ".>"}, Duplicates: 30 * time.Second, MaxAge: time.Hour,
		}); err != nil {
			t.Fatal(err)
		}
		r := f.start(nil, false)
		t.Logf("/readyz: %s", r.unreadyBecause(f, "stream not usable", "duplicate window of 30s, under 1m"))
		if _, err := f.js.UpdateStream(ctx, jetstream.StreamConfig{
			Name: f.stream, Subjects: []string{"k8s." + f.cluster + ".>"}, Duplicates: 10 * time.Minute, MaxAge: time.Hour,
		}); err != nil {
			t.Fatal(err)
		}
		r.unreadyGone(f)
	})
	t.Run("create false subjects elsewhere", func(t *testing.T) {
		f := newFixture(t, env, natsSrv, cmSource)
		f.cfgYAML = strings.Replace(f.cfgYAML, "    create: true\n", "    create: false\n", 1)
		other := "audit-" + f.cluster + ".>"
		if _, err := f.js.CreateStream(ctx, jetstream.StreamConfig{Name: f.stream, Subjects: []string{other}}); err != nil {
			t.Fatal(err)
		}
		r := f.start(nil, false)
		t.Logf("/readyz: %s", r.unreadyBecause(f, "stream not usable",
			fmt.Sprintf(`stream %s has subjects [%q], none of which captures relayd's "k8s.%s.>"`, f.stream, other, f.cluster)))
		s, err := f.js.Stream(ctx, f.stream)
		if err != nil {
			t.Fatal(err)
		}
		if subj := s.CachedInfo().Config.Subjects; !slices.Equal(subj, []string{other}) {
			t.Errorf("relayd changed the subjects with create: false: %q", subj)
		}
	})
	t.Run("create false no stream", func(t *testing.T) {
		f := newFixture(t, env, natsSrv, cmSource)
		f.cfgYAML = strings.Replace(f.cfgYAML, "    create: true\n", "    create: false\n", 1)
		r := f.start(nil, false)
		t.Logf("/readyz: %s", r.unreadyBecause(f, "stream not usable", "stream not found: "+f.stream))
	})
}

// A stream relayd creates is bounded: a week unless configured.
func TestCreatedStreamIsBounded(t *testing.T) {
	f := newFixture(t, env, natsSrv, cmSource)
	f.start(nil, true)
	s, err := f.js.Stream(t.Context(), f.stream)
	if err != nil {
		t.Fatal(err)
	}
	if c := s.CachedInfo().Config; c.MaxAge != 168*time.Hour || c.Discard != jetstream.DiscardNew {
		t.Errorf("created stream: maxAge %s, discard %s; want 168h, new", c.MaxAge, c.Discard)
	}
}
