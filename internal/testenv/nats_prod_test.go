package testenv_test

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/internal/testenv"
)

// connect connects to url and closes the connection in t.Cleanup.
func connect(t *testing.T, url string, opts ...nats.Option) (*nats.Conn, error) {
	t.Helper()
	nc, err := nats.Connect(url, append([]nats.Option{nats.Timeout(5 * time.Second)}, opts...)...)
	if err == nil {
		t.Cleanup(nc.Close)
	}
	return nc, err
}

// mustConnect is connect that fails the test on an error.
func mustConnect(t *testing.T, url string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := connect(t, url, opts...)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	return nc
}

// createStream creates a stream in js, failing the test on an error.
func createStream(t *testing.T, js jetstream.JetStream, name string) {
	t.Helper()
	if _, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: name, Subjects: []string{strings.ToLower(name) + ".>"}}); err != nil {
		t.Fatalf("create stream %s: %v", name, err)
	}
}

func newPKI(t *testing.T) *testenv.PKI {
	t.Helper()
	p, err := testenv.NewPKI(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Errorf("%s has mode %v, want 0600", path, fi.Mode().Perm())
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: no PEM", path)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestPKI(t *testing.T) {
	p := newPKI(t)
	roots, others := x509.NewCertPool(), x509.NewCertPool()
	roots.AddCert(readCert(t, p.CAFile))
	others.AddCert(readCert(t, p.OtherCAFile))

	srv := readCert(t, p.ServerCertFile)
	for _, name := range []string{"127.0.0.1", "localhost", "nats.test"} {
		if _, err := srv.Verify(x509.VerifyOptions{Roots: roots, DNSName: name}); err != nil {
			t.Errorf("server certificate for %s: %v", name, err)
		}
	}
	client := x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if c := readCert(t, p.ClientCertFile); c.Subject.CommonName != "relayd" {
		t.Errorf("client CN %q, want relayd", c.Subject.CommonName)
	} else if _, err := c.Verify(client); err != nil {
		t.Errorf("client certificate: %v", err)
	}
	var invalid x509.CertificateInvalidError
	if _, err := readCert(t, p.ExpiredClientCertFile).Verify(client); !errors.As(err, &invalid) || invalid.Reason != x509.Expired {
		t.Errorf("expired client certificate: got %v, want expired", err)
	}
	other := readCert(t, p.OtherClientCertFile)
	if _, err := other.Verify(client); err == nil {
		t.Error("the other CA's client certificate verifies against the CA")
	}
	client.Roots = others
	if _, err := other.Verify(client); err != nil {
		t.Errorf("other client certificate against the other CA: %v", err)
	}
	for _, f := range []string{p.ClientKeyFile, p.ServerKeyFile, p.ExpiredClientKeyFile, p.OtherClientKeyFile} {
		if _, err := tls.LoadX509KeyPair(strings.TrimSuffix(f, ".key")+".crt", f); err != nil {
			t.Errorf("key pair %s: %v", f, err)
		}
	}
}

func TestNATSTLS(t *testing.T) {
	p := newPKI(t)
	n := testenv.NATST(t, testenv.NATSOptions{TLS: &testenv.NATSTLS{CertFile: p.ServerCertFile, KeyFile: p.ServerKeyFile}})
	if !strings.HasPrefix(n.URL(), "tls://127.0.0.1:") {
		t.Fatalf("URL %s, want tls://127.0.0.1:…", n.URL())
	}
	nc := mustConnect(t, n.URL(), nats.RootCAs(p.CAFile))
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	_, err := connect(t, n.URL(), nats.RootCAs(p.OtherCAFile))
	var verr *tls.CertificateVerificationError
	if !errors.Is(err, nats.ErrTLS) || !errors.As(err, &verr) {
		t.Fatalf("with the wrong CA: got %v, want a certificate verification error", err)
	}

	// A restart keeps TLS.
	n.Stop()
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	mustConnect(t, n.URL(), nats.RootCAs(p.CAFile))
}

func TestNATSMutualTLS(t *testing.T) {
	p := newPKI(t)
	n := testenv.NATST(t, testenv.NATSOptions{TLS: &testenv.NATSTLS{
		CertFile: p.ServerCertFile, KeyFile: p.ServerKeyFile, CAFile: p.CAFile, Verify: true}})
	nc := mustConnect(t, n.URL(), nats.RootCAs(p.CAFile), nats.ClientCert(p.ClientCertFile, p.ClientKeyFile))
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// The server refuses after the handshake: depending on timing the client
	// sees the TLS alert or the closed connection.
	for name, opts := range map[string][]nats.Option{
		"no client certificate":      {nats.RootCAs(p.CAFile)},
		"expired client certificate": {nats.RootCAs(p.CAFile), nats.ClientCert(p.ExpiredClientCertFile, p.ExpiredClientKeyFile)},
		"other CA's certificate":     {nats.RootCAs(p.CAFile), nats.ClientCert(p.OtherClientCertFile, p.OtherClientKeyFile)},
	} {
		if _, err := connect(t, n.URL(), opts...); err == nil {
			t.Errorf("%s: connected", name)
		}
	}
}

func TestNATSNkeyUser(t *testing.T) {
	dir := t.TempDir()
	seed, pub, err := testenv.NewNkeyUser(dir, "relayd")
	if err != nil {
		t.Fatal(err)
	}
	otherSeed, _, err := testenv.NewNkeyUser(dir, "other")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(pub, "U") {
		t.Fatalf("public key %q, want a user key", pub)
	}
	n := testenv.NATST(t, testenv.NATSOptions{Nkeys: []*server.NkeyUser{{Nkey: pub}}})
	opt, err := nats.NkeyOptionFromSeed(seed)
	if err != nil {
		t.Fatal(err)
	}
	mustConnect(t, n.URL(), opt)
	if opt, err = nats.NkeyOptionFromSeed(otherSeed); err != nil {
		t.Fatal(err)
	}
	if _, err := connect(t, n.URL(), opt); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("with another NKey: got %v, want %v", err, nats.ErrAuthorization)
	}
}

func TestNATSTokenReload(t *testing.T) {
	n := testenv.NATST(t, testenv.NATSOptions{Token: "old"})
	closed := make(chan error, 1)
	old := mustConnect(t, n.URL(), nats.Token("old"), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond),
		nats.ClosedHandler(func(nc *nats.Conn) { closed <- nc.LastError() }),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})) // expected violations, not logged

	if err := n.Reload(func(o *server.Options) { o.Authorization = "new" }); err != nil {
		t.Fatal(err)
	}
	// The existing connection is dropped, its reconnects with the old token
	// fail, and nats.go gives up on a repeated authorization error.
	select {
	case err := <-closed:
		if !errors.Is(err, nats.ErrAuthorization) {
			t.Fatalf("old connection closed with %v, want %v", err, nats.ErrAuthorization)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("old connection still %v 10s after the reload", old.Status())
	}
	if _, err := connect(t, n.URL(), nats.Token("old")); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("old token after reload: got %v, want %v", err, nats.ErrAuthorization)
	}
	mustConnect(t, n.URL(), nats.Token("new"))

	// A restart keeps the reloaded token; SetToken changes it for the next.
	n.Stop()
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	mustConnect(t, n.URL(), nats.Token("new"))
	n.SetToken("third")
	n.Stop()
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	if _, err := connect(t, n.URL(), nats.Token("new")); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("token before SetToken: got %v, want %v", err, nats.ErrAuthorization)
	}
	mustConnect(t, n.URL(), nats.Token("third"))
}

func TestNATSOperatorMode(t *testing.T) {
	dir := t.TempDir()
	op, err := testenv.NewOperator()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(op.AccountPublicKey(), "A") {
		t.Fatalf("account public key %q", op.AccountPublicKey())
	}
	n := testenv.NATST(t, testenv.NATSOptions{Operator: op})
	creds, err := op.UserCreds(dir, "relayd", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	nc := mustConnect(t, n.URL(), nats.UserCredentials(creds))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	createStream(t, js, "OP")
	if _, err := connect(t, n.URL()); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("without credentials: got %v, want %v", err, nats.ErrAuthorization)
	}

	// The allow lists hold.
	violations := make(chan error, 1)
	limited, err := op.UserCreds(dir, "limited", []string{"ok.>"}, []string{"_INBOX.>"})
	if err != nil {
		t.Fatal(err)
	}
	lc := mustConnect(t, n.URL(), nats.UserCredentials(limited),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case violations <- err:
			default:
			}
		}))
	if err := lc.Publish("other", nil); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-violations:
		if !errors.Is(err, nats.ErrPermissionViolation) {
			t.Fatalf("got %v, want a permissions violation", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no permissions violation for a subject outside the allow list")
	}

	// The account and its stream survive a restart.
	nc.Close()
	lc.Close()
	n.Stop()
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	if js, err = jetstream.New(mustConnect(t, n.URL(), nats.UserCredentials(creds))); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Stream(t.Context(), "OP"); err != nil {
		t.Fatalf("stream after restart: %v", err)
	}
}

func TestNATSJetStreamDomain(t *testing.T) {
	n := testenv.NATST(t, testenv.NATSOptions{JetStreamDomain: "hub"})
	js, err := jetstream.NewWithDomain(mustConnect(t, n.URL()), "hub")
	if err != nil {
		t.Fatal(err)
	}
	createStream(t, js, "DOM")
}

func TestNATSConfigText(t *testing.T) {
	t.Setenv("TESTENV_NATS_PASSWORD", "b")
	n := testenv.NATST(t, testenv.NATSOptions{ConfigText: `
authorization {
  users = [
    {user: a, password: $TESTENV_NATS_PASSWORD}
  ]
}
`})
	if _, err := connect(t, n.URL(), nats.UserInfo("a", "wrong")); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("wrong password: got %v, want %v", err, nats.ErrAuthorization)
	}
	js, err := jetstream.New(mustConnect(t, n.URL(), nats.UserInfo("a", "b")))
	if err != nil {
		t.Fatal(err)
	}
	createStream(t, js, "CONF")

	// A restart reads the config again.
	n.Stop()
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	mustConnect(t, n.URL(), nats.UserInfo("a", "b"))
}
