package relay_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/relayd/relayd/internal/testenv"
)

// The tests of this file rotate relayd's NATS credentials while it is
// connected (docs/DEPLOY.md, "Rotating"): relayd connects with credential
// A; the files are renewed to B; the server then trusts only B and A's
// connection is closed. relayd must reconnect with B, in the same process
// (relay.Run never returned), and store a ConfigMap change made after the
// rotation. Files read once at start would reconnect with A, be refused and
// never store it.

// rotatedName is relayd's connection name (nats.name): the test finds
// relayd's connections in the server's connection list by it.
const rotatedName = "relayd-rotated"

// rotation is one kind of credential rotated while relayd is connected.
type rotation struct {
	server testenv.NATSOptions
	admin  []nats.Option // the test's own connection: not rotated
	nats   string        // relayd's nats block lines: the files, holding A
	renew  func(t *testing.T)
	dropA  func(t *testing.T, n *testenv.NATS) // the server then trusts only B
	// kick: nats-server keeps A's connection open after dropA (it does not
	// verify an established TLS connection's certificates again); the
	// test closes it (server.DisconnectClientByID), as an administrator
	// would (`$SYS.REQ.SERVER.<id>.KICK`).
	kick bool
	// kickFirst: the test closes A's connections before dropA, which
	// then finds none to drop. nats-server v2.15.2 races when a reload
	// disconnects a client itself while the client's read loop runs (the
	// auth-error event reads the client's counters unlocked; the race
	// detector fails the test), so the reload must find A's connections
	// gone. relayd reconnects with B, is refused until the reload, then
	// accepted: it reads the files at every handshake all the same.
	kickFirst bool
	// closedAs is the reason the server gives for closing A's connection
	// (its closed connections list): how nats-server drops it.
	closedAs string
	// restart, if set: relayd cannot use B on its connection (a seed of
	// another NKey user); /readyz must say all of these while it runs, and
	// a new relay.Run (a restart) must use B.
	restart []string
}

func TestCredentialRotationWhileConnected(t *testing.T) {
	pki, err := testenv.NewPKI(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		make func(t *testing.T) rotation
	}{
		{"TLS server CA", func(t *testing.T) rotation { return rotateServerCA(t, pki) }},
		{"mTLS client certificate", func(t *testing.T) rotation { return rotateClientCert(t, pki) }},
		{"NKey seed of another user", rotateNkeySeed},
		{"user and password", rotatePassword},
		{"creds JWT", rotateCreds},
	} {
		t.Run(tc.name, func(t *testing.T) { testRotation(t, tc.make(t)) })
	}
}

// rotateServerCA: the server's certificate moves to a new CA; relayd's CA
// file is replaced by the new CA's certificate first.
func rotateServerCA(t *testing.T, pki *testenv.PKI) rotation {
	ca := filepath.Join(t.TempDir(), "ca.crt")
	copyFile(t, pki.CAFile, ca)
	return rotation{
		server:   testenv.NATSOptions{TLS: &testenv.NATSTLS{CertFile: pki.ServerCertFile, KeyFile: pki.ServerKeyFile}},
		admin:    []nats.Option{nats.RootCAs(pki.CAFile, pki.OtherCAFile)},
		nats:     "  tls:\n    caFile: " + ca,
		renew:    func(t *testing.T) { copyFile(t, pki.OtherCAFile, ca) },
		dropA:    reloadTLS(&testenv.NATSTLS{CertFile: pki.OtherServerCertFile, KeyFile: pki.OtherServerKeyFile}),
		kick:     true,
		closedAs: "Kicked",
	}
}

// rotateClientCert: relayd's client certificate is renewed by a new client
// CA; the server, which trusted both, then trusts only the new one.
func rotateClientCert(t *testing.T, pki *testenv.PKI) rotation {
	dir := t.TempDir()
	bundle := filepath.Join(dir, "client-cas.crt")
	writeFile(t, bundle, readFile(t, pki.CAFile)+readFile(t, pki.OtherCAFile))
	crt, key := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	copyFile(t, pki.ClientCertFile, crt)
	copyFile(t, pki.ClientKeyFile, key)
	return rotation{
		server: testenv.NATSOptions{TLS: &testenv.NATSTLS{
			CertFile: pki.ServerCertFile, KeyFile: pki.ServerKeyFile, CAFile: bundle, Verify: true}},
		admin: []nats.Option{nats.RootCAs(pki.CAFile), nats.ClientCert(pki.OtherClientCertFile, pki.OtherClientKeyFile)},
		nats:  fmt.Sprintf("  tls:\n    caFile: %s\n    certFile: %s\n    keyFile: %s", pki.CAFile, crt, key),
		renew: func(t *testing.T) { // as cert-manager does: key, then certificate
			copyFile(t, pki.OtherClientKeyFile, key)
			copyFile(t, pki.OtherClientCertFile, crt)
		},
		dropA: reloadTLS(&testenv.NATSTLS{
			CertFile: pki.ServerCertFile, KeyFile: pki.ServerKeyFile, CAFile: pki.OtherCAFile, Verify: true}),
		kick:     true,
		closedAs: "Kicked",
	}
}

// rotateNkeySeed: the seed file gets the seed of another NKey user, which
// the server then lists instead of the old one. The reload drops the old
// user's connection; relayd's connection was made with the old public key,
// so it cannot use the new seed until a restart (docs/DEPLOY.md).
func rotateNkeySeed(t *testing.T) rotation {
	dir := t.TempDir()
	seedA, pubA := newNkeyUser(t, dir, "relayd-a")
	seedB, pubB := newNkeyUser(t, dir, "relayd-b")
	adminSeed, adminPub := newNkeyUser(t, dir, "admin")
	admin, err := nats.NkeyOptionFromSeed(adminSeed)
	if err != nil {
		t.Fatal(err)
	}
	seed := filepath.Join(t.TempDir(), "nkey.seed")
	copyFile(t, seedA, seed)
	return rotation{
		server: testenv.NATSOptions{Nkeys: []*server.NkeyUser{{Nkey: pubA}, {Nkey: adminPub}}},
		admin:  []nats.Option{admin},
		nats:   "  nkeySeedFile: " + seed + plainOnLoopback,
		renew:  func(t *testing.T) { copyFile(t, seedB, seed) },
		dropA: reload(func(o *server.Options) {
			o.Nkeys = []*server.NkeyUser{{Nkey: pubB}, {Nkey: adminPub}}
		}),
		// A user the reload removed counts as one that "moved to another
		// account": closed as Client Closed, not as an auth failure.
		closedAs: "Client Closed",
		restart: []string{"NATS not connected", "nats.nkeySeedFile " + seed + ": now holds the seed of user " + pubB,
			"this connection was made as " + pubA, "restart relayd"},
	}
}

// rotatePassword: relayd's user gets a new password.
func rotatePassword(t *testing.T) rotation {
	dir := t.TempDir()
	user, pass := filepath.Join(dir, "user"), filepath.Join(dir, "password")
	writeFile(t, user, "relayd\n")
	writeFile(t, pass, "password-a\n")
	users := func(relaydPassword string) []*server.User {
		return []*server.User{{Username: "relayd", Password: relaydPassword}, {Username: "admin", Password: "admin"}}
	}
	return rotation{
		server:    testenv.NATSOptions{Users: users("password-a")},
		admin:     []nats.Option{nats.UserInfo("admin", "admin")},
		nats:      fmt.Sprintf("  userFile: %s\n  passwordFile: %s", user, pass) + plainOnLoopback,
		renew:     func(t *testing.T) { writeFile(t, pass, "password-b\n") },
		dropA:     reload(func(o *server.Options) { o.Users = users("password-b") }),
		kickFirst: true,
		closedAs:  "Kicked",
	}
}

// rotateCreds: operator mode; relayd's .creds file is re-issued for a new
// user of the same account, and the old user is revoked in the account JWT.
func rotateCreds(t *testing.T) rotation {
	op, err := testenv.NewOperator()
	if err != nil {
		t.Fatal(err)
	}
	userCreds := func(name string) string {
		p, err := op.UserCreds(t.TempDir(), name, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	adminCreds, credsA, credsB := userCreds("admin"), userCreds("relayd"), userCreds("relayd")
	creds := filepath.Join(t.TempDir(), "relayd.creds")
	copyFile(t, credsA, creds)
	return rotation{
		server: testenv.NATSOptions{Operator: op},
		admin:  []nats.Option{nats.UserCredentials(adminCreds)},
		nats:   "  credentialsFile: " + creds + plainOnLoopback,
		renew:  func(t *testing.T) { copyFile(t, credsB, creds) },
		dropA: func(t *testing.T, n *testenv.NATS) {
			if err := op.RevokeUser(n.Server(), credsA); err != nil {
				t.Fatal(err)
			}
		},
		closedAs: "Credentials Revoked",
	}
}

// testRotation connects relayd with A, renews the files to B, makes the
// server trust only B, closes A's connection if the server keeps it, and
// checks that relayd reconnects with B and relays a change made after.
func testRotation(t *testing.T, c rotation) {
	n := testenv.NATST(t, c.server)
	f := newFixture(t, env, n, cmSource, c.admin...)
	f.setNATS(c.nats + "\n  name: " + rotatedName)
	r := f.start(nil, true)
	before := f.createCM("before", nil, nil)
	f.waitStored(30*time.Second, isEvent("added", before.Name, before.ResourceVersion))
	f.waitIndexed(before) // relayd is idle when its connection is dropped
	withA := relaydConns(t, n)
	if len(withA) == 0 {
		t.Fatalf("no open connection named %s on the server", rotatedName)
	}

	c.renew(t)
	if c.kickFirst {
		for _, cid := range withA {
			if err := n.Server().DisconnectClientByID(cid); err != nil {
				t.Fatal(err)
			}
		}
	}
	c.dropA(t, n)
	if c.kick {
		if open := relaydConns(t, n); !containsAll(open, withA) {
			t.Fatalf("the server closed relayd's connections %v itself (open: %v): this case needs no kick", withA, open)
		}
		t.Logf("nats-server keeps relayd's connections %v open after the reload; closing them (kick)", withA)
		for _, cid := range withA {
			if err := n.Server().DisconnectClientByID(cid); err != nil {
				t.Fatal(err)
			}
		}
	}
	f.eventually(30*time.Second, "the server closes relayd's connections made with A as "+c.closedAs, func() error {
		for _, cid := range withA {
			if got := closedReason(t, n, cid); got != c.closedAs {
				return fmt.Errorf("connection %d: closed as %q (open: %v)", cid, got, relaydConns(t, n))
			}
		}
		return nil
	})

	after := f.createCM("after", nil, nil)
	if c.restart != nil {
		t.Logf("/readyz: %s", r.unreadyBecause(f, c.restart...))
		r.stop(t)
		r = f.start(nil, false)
	}
	r.unreadyGone(f)
	f.waitStored(60*time.Second, isEvent("added", after.Name, after.ResourceVersion))
	select {
	case err := <-r.done:
		t.Fatalf("relay.Run returned: %v", err)
	default:
	}
	if v := metricValue(t, r.reg, "relayd_nats_connected", nil); v != 1 {
		t.Errorf("relayd_nats_connected %v, want 1", v)
	}
	if withB := relaydConns(t, n); len(withB) == 0 || slices.ContainsFunc(withB, func(cid uint64) bool { return slices.Contains(withA, cid) }) {
		t.Errorf("relayd's open connections %v, want new ones (A's were %v)", withB, withA)
	}
}

// relaydConns returns the ids of relayd's open connections to n.
func relaydConns(t *testing.T, n *testenv.NATS) []uint64 {
	t.Helper()
	cz, err := n.Server().Connz(&server.ConnzOptions{Limit: 1 << 16})
	if err != nil {
		t.Fatal(err)
	}
	var cids []uint64
	for _, ci := range cz.Conns {
		if ci.Name == rotatedName {
			cids = append(cids, ci.Cid)
		}
	}
	return cids
}

// closedReason is why the server closed connection cid, "" if it has no
// record of it closed (yet).
func closedReason(t *testing.T, n *testenv.NATS, cid uint64) string {
	t.Helper()
	cz, err := n.Server().Connz(&server.ConnzOptions{CID: cid, State: server.ConnClosed})
	if err != nil {
		t.Fatal(err)
	}
	for _, ci := range cz.Conns {
		if ci.Cid == cid {
			return ci.Reason
		}
	}
	return ""
}

func containsAll(s, sub []uint64) bool {
	return !slices.ContainsFunc(sub, func(v uint64) bool { return !slices.Contains(s, v) })
}

// reload makes dropA from a change of the server's options.
func reload(mut func(*server.Options)) func(*testing.T, *testenv.NATS) {
	return func(t *testing.T, n *testenv.NATS) {
		t.Helper()
		if err := n.Reload(mut); err != nil {
			t.Fatal(err)
		}
	}
}

// reloadTLS makes dropA from the server's new TLS settings.
func reloadTLS(s *testenv.NATSTLS) func(*testing.T, *testenv.NATS) {
	return func(t *testing.T, n *testenv.NATS) {
		t.Helper()
		tc, err := server.GenTLSConfig(&server.TLSConfigOpts{
			CertFile: s.CertFile, KeyFile: s.KeyFile, CaFile: s.CAFile, Verify: s.Verify, Timeout: 2})
		if err != nil {
			t.Fatal(err)
		}
		reload(func(o *server.Options) { o.TLSConfig, o.TLSVerify = tc, s.Verify })(t, n)
	}
}

func newNkeyUser(t *testing.T, dir, name string) (seedFile, pub string) {
	t.Helper()
	seedFile, pub, err := testenv.NewNkeyUser(dir, name)
	if err != nil {
		t.Fatal(err)
	}
	return seedFile, pub
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
