package testenv

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// NATSOptions configures an embedded nats-server. The zero value is an open
// server without TLS or authentication.
type NATSOptions struct {
	// StoreDir holds JetStream data; a new temp dir when empty (removed by
	// Shutdown only if testenv created it).
	StoreDir string
	// MaxPayload overrides the server's max message size (default 1 MiB).
	MaxPayload int32
	// Port to listen on; a random free port when 0.
	Port int
	// Auth, if set, authenticates every client (and gives it its
	// permissions, with ClientAuthentication.RegisterUser).
	Auth server.Authentication

	// TLS, if set, makes clients connect with TLS (URL is then tls://).
	TLS *NATSTLS
	// Users are user/password users (server.Options.Users).
	Users []*server.User
	// Nkeys are NKey users (server.Options.Nkeys); see NewNkeyUser.
	Nkeys []*server.NkeyUser
	// Token is the one token every client must present
	// (server.Options.Authorization); see SetToken and Reload to change it.
	Token string
	// JetStreamDomain is the server's JetStream domain.
	JetStreamDomain string
	// ServerName names the server; default "relayd-testenv". Servers
	// connected to each other (a hub and its leaf node) need different
	// names.
	ServerName string
	// LeafNodes makes the server accept leaf node connections on a port of
	// 127.0.0.1 of its own, pinned like the client port (see LeafURL).
	LeafNodes bool
	// LeafRemote, if set, connects the server as a leaf node to the hub
	// listening there (the hub's LeafURL); see StartNATSLeaf.
	LeafRemote string
	// Operator, if set, runs the server in operator (JWT) mode trusting
	// it, with a memory resolver preloaded with its accounts.
	Operator *Operator
	// ConfigText, if set, is nats-server configuration (e.g. an
	// authorization block; $VARIABLES resolve from the environment) that
	// the server options are read from. testenv still sets the listen
	// address, JetStream and its store, the server name and logging; the
	// fields above, when set, apply on top. Every Start reads it again, so
	// its variables must still be set then.
	ConfigText string
}

// NATSTLS is the server side of TLS for NATSOptions, e.g. from a PKI.
type NATSTLS struct {
	// CertFile and KeyFile are the server certificate and key (PEM).
	CertFile, KeyFile string
	// CAFile verifies client certificates (PEM).
	CAFile string
	// Verify requires every client to present a certificate signed by
	// CAFile (mutual TLS).
	Verify bool
}

// NATS is an embedded nats-server with JetStream on 127.0.0.1.
type NATS struct {
	o        NATSOptions // Port is pinned after the first start
	confFile string      // ConfigText written out, in tmpDir
	tmpDir   string
	muts     []func(*server.Options) // SetToken and Reload changes, in order
	cur      *server.Options         // the running (or last) server's options
	srv      *server.Server
	ownsDir  bool
	storeDir string
	leafPort int // with LeafNodes, pinned at the first start
}

// StartNATS starts a nats-server with JetStream.
func StartNATS(o NATSOptions) (*NATS, error) {
	n := &NATS{o: o, storeDir: o.StoreDir}
	if o.LeafNodes {
		ports, err := freePorts(1)
		if err != nil {
			return nil, err
		}
		n.leafPort = ports[0]
	}
	if n.storeDir == "" {
		d, err := os.MkdirTemp("", "relayd-nats-")
		if err != nil {
			return nil, err
		}
		n.storeDir, n.ownsDir = d, true
	}
	if o.ConfigText != "" {
		d, err := os.MkdirTemp("", "relayd-nats-conf-")
		if err != nil {
			n.Shutdown()
			return nil, err
		}
		n.tmpDir, n.confFile = d, filepath.Join(d, "nats-server.conf")
		if err := os.WriteFile(n.confFile, []byte(o.ConfigText), 0o600); err != nil {
			n.Shutdown()
			return nil, err
		}
	}
	if err := n.start(); err != nil {
		n.Shutdown()
		return nil, err
	}
	// Pin the port so that Restart comes back where clients reconnect.
	n.o.Port = n.srv.Addr().(*net.TCPAddr).Port
	return n, nil
}

// options builds a fresh server.Options for one start: the server keeps
// and changes the pointer it gets, so no two runs share one.
func (n *NATS) options() (*server.Options, error) {
	opts := &server.Options{}
	if n.confFile != "" {
		var err error
		if opts, err = server.ProcessConfigFile(n.confFile); err != nil {
			return nil, fmt.Errorf("testenv: nats-server config: %w", err)
		}
	}
	o := n.o
	opts.ServerName = "relayd-testenv"
	if o.ServerName != "" {
		opts.ServerName = o.ServerName
	}
	opts.Host = "127.0.0.1"
	opts.Port = o.Port
	if opts.Port == 0 {
		opts.Port = -1 // random
	}
	opts.JetStream = true
	opts.StoreDir = n.storeDir
	opts.NoLog, opts.NoSigs = true, true
	// No configured system account (an operator brings its own, below).
	// This does not avoid nats-server v2.15.2's race when a Reload
	// disconnects a client whose read loop is busy (the auth-error event
	// reads the client's counters unlocked): JetStream creates a system
	// account anyway. Tests that reload credentials close the affected
	// connections first (pkg/relay TestTokenRotation).
	opts.NoSystemAccount = o.Operator == nil && opts.SystemAccount == ""
	if o.MaxPayload != 0 {
		opts.MaxPayload = o.MaxPayload
	}
	if o.Auth != nil {
		opts.CustomClientAuthentication = o.Auth
	}
	if o.TLS != nil {
		tc, err := server.GenTLSConfig(&server.TLSConfigOpts{
			CertFile: o.TLS.CertFile, KeyFile: o.TLS.KeyFile, CaFile: o.TLS.CAFile,
			Verify: o.TLS.Verify, Timeout: 2,
		})
		if err != nil {
			return nil, fmt.Errorf("testenv: nats-server TLS: %w", err)
		}
		opts.TLS, opts.TLSConfig, opts.TLSVerify, opts.TLSTimeout = true, tc, o.TLS.Verify, 2
	}
	if o.Users != nil || o.Nkeys != nil {
		// Copies: the caller may reuse its users for another server.
		c := (&server.Options{Users: o.Users, Nkeys: o.Nkeys}).Clone()
		opts.Users, opts.Nkeys = c.Users, c.Nkeys
	}
	if o.Token != "" {
		opts.Authorization = o.Token
	}
	if o.JetStreamDomain != "" {
		opts.JetStreamDomain = o.JetStreamDomain
	}
	if err := n.leafOptions(opts); err != nil {
		return nil, err
	}
	if o.Operator != nil {
		if err := o.Operator.apply(opts); err != nil {
			return nil, fmt.Errorf("testenv: nats-server operator: %w", err)
		}
	}
	for _, mut := range n.muts {
		mut(opts)
	}
	return opts, nil
}

func (n *NATS) start() error {
	opts, err := n.options()
	if err != nil {
		return err
	}
	return n.run(opts)
}

func (n *NATS) run(opts *server.Options) error {
	srv, err := server.NewServer(opts)
	if err != nil {
		return fmt.Errorf("testenv: nats-server: %w", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		srv.WaitForShutdown()
		return errors.New("testenv: nats-server not ready after 10s")
	}
	n.srv, n.cur = srv, opts
	return nil
}

// URL is the client URL, e.g. nats://127.0.0.1:4222, or tls://… when the
// server has TLS (nats.go then insists on TLS). It stays valid while the
// server is stopped.
func (n *NATS) URL() string {
	scheme := "nats"
	if n.cur != nil && n.cur.TLSConfig != nil {
		scheme = "tls"
	}
	return scheme + "://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(n.o.Port))
}

// Server is the embedded server (for inspection in tests).
func (n *NATS) Server() *server.Server { return n.srv }

// StoreDir is the JetStream store directory.
func (n *NATS) StoreDir() string { return n.storeDir }

// SetToken changes the token clients must present
// (server.Options.Authorization) from the next Start; the running server
// keeps the old one (use Reload to change it now).
func (n *NATS) SetToken(tok string) {
	n.muts = append(n.muts, func(o *server.Options) { o.Authorization = tok })
}

// Reload applies mut to a copy of the running server's options and hot
// reloads the server with them (srv.ReloadOptions; nats-server refuses
// changes it cannot reload, e.g. the JetStream store). The change also
// holds for later Starts.
//
// Authorization changes take effect at once, for existing connections
// too: after e.g. Reload(func(o *server.Options) { o.Authorization = "new" })
// the server disconnects every client connected with the old token (its
// async error handler sees nats.ErrAuthorization), new connections need
// the new token, and nats.go's reconnects with the old one fail the same
// way; after that repeated authorization error nats.go closes the
// connection for good (unless nats.IgnoreAuthErrorAbort).
func (n *NATS) Reload(mut func(*server.Options)) error {
	if n.srv == nil {
		return errors.New("testenv: nats-server is not running")
	}
	opts := n.cur.Clone()
	mut(opts)
	if err := n.srv.ReloadOptions(opts); err != nil {
		return fmt.Errorf("testenv: nats-server reload: %w", err)
	}
	n.cur = opts
	n.muts = append(n.muts, mut)
	return nil
}

// Stop shuts the server down but keeps its store, for Start to reuse.
func (n *NATS) Stop() {
	if n.srv != nil {
		n.srv.Shutdown()
		n.srv.WaitForShutdown()
		n.srv = nil
	}
}

// Start starts a stopped server again on the same port and store, with the
// options of StartNATS changed by any SetToken and Reload since.
func (n *NATS) Start() error {
	if n.srv != nil {
		return errors.New("testenv: nats-server is already running")
	}
	// The old listener may take a moment to release the port.
	for i := 0; ; i++ {
		opts, err := n.options()
		if err != nil {
			return err
		}
		if err = n.run(opts); err == nil || i == 49 {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Shutdown stops the server and removes the store if testenv created it.
func (n *NATS) Shutdown() {
	n.Stop()
	if n.ownsDir {
		_ = os.RemoveAll(n.storeDir)
	}
	if n.tmpDir != "" {
		_ = os.RemoveAll(n.tmpDir)
	}
}
