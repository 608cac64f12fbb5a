package testenv

import (
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// NATSOptions configures an embedded nats-server.
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
}

// NATS is an embedded nats-server with JetStream on 127.0.0.1.
type NATS struct {
	opts     server.Options
	srv      *server.Server
	ownsDir  bool
	storeDir string
}

// StartNATS starts a nats-server with JetStream.
func StartNATS(o NATSOptions) (*NATS, error) {
	n := &NATS{storeDir: o.StoreDir}
	if n.storeDir == "" {
		d, err := os.MkdirTemp("", "relayd-nats-")
		if err != nil {
			return nil, err
		}
		n.storeDir, n.ownsDir = d, true
	}
	port := o.Port
	if port == 0 {
		port = -1 // random
	}
	n.opts = server.Options{
		ServerName: "relayd-testenv",
		Host:       "127.0.0.1",
		Port:       port,
		JetStream:  true,
		StoreDir:   n.storeDir,
		MaxPayload: o.MaxPayload,
		NoLog:      true,
		NoSigs:     true,

		CustomClientAuthentication: o.Auth,
	}
	if err := n.start(); err != nil {
		n.Shutdown()
		return nil, err
	}
	// Pin the port so that Restart comes back where clients reconnect.
	n.opts.Port = n.srv.Addr().(*net.TCPAddr).Port
	return n, nil
}

func (n *NATS) start() error {
	opts := n.opts // the server keeps a pointer; never share one between runs
	srv, err := server.NewServer(&opts)
	if err != nil {
		return fmt.Errorf("testenv: nats-server: %w", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return errors.New("testenv: nats-server not ready after 10s")
	}
	n.srv = srv
	return nil
}

// URL is the client URL, e.g. nats://127.0.0.1:4222.
func (n *NATS) URL() string { return n.srv.ClientURL() }

// Server is the embedded server (for inspection in tests).
func (n *NATS) Server() *server.Server { return n.srv }

// StoreDir is the JetStream store directory.
func (n *NATS) StoreDir() string { return n.storeDir }

// Stop shuts the server down but keeps its store, for Start to reuse.
func (n *NATS) Stop() {
	if n.srv != nil {
		n.srv.Shutdown()
		n.srv.WaitForShutdown()
		n.srv = nil
	}
}

// Start starts a stopped server again on the same port and store.
func (n *NATS) Start() error {
	if n.srv != nil {
		return errors.New("testenv: nats-server is already running")
	}
	var err error
	// The old listener may take a moment to release the port.
	for i := 0; i < 50; i++ {
		if err = n.start(); err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}

// Shutdown stops the server and removes the store if testenv created it.
func (n *NATS) Shutdown() {
	n.Stop()
	if n.ownsDir {
		_ = os.RemoveAll(n.storeDir)
	}
}
