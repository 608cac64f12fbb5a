package testenv

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// leafOptions sets the leaf node listener (NATSOptions.LeafNodes) and the
// remote (NATSOptions.LeafRemote) of one start.
func (n *NATS) leafOptions(opts *server.Options) error {
	if n.o.LeafNodes {
		opts.LeafNode.Host = "127.0.0.1"
		opts.LeafNode.Port = n.leafPort
	}
	if n.o.LeafRemote != "" {
		u, err := url.Parse(n.o.LeafRemote)
		if err != nil {
			return fmt.Errorf("testenv: leaf remote %q: %w", n.o.LeafRemote, err)
		}
		// Reconnect quickly after the hub restarts (the default waits 1s).
		opts.LeafNode.ReconnectInterval = 100 * time.Millisecond
		opts.LeafNode.Remotes = []*server.RemoteLeafOpts{{URLs: []*url.URL{u}}}
	}
	return nil
}

// LeafURL is where leaf nodes connect to this server (NATSOptions.LeafNodes),
// e.g. nats-leaf://127.0.0.1:7422; "" without LeafNodes.
func (n *NATS) LeafURL() string {
	if n.leafPort == 0 {
		return ""
	}
	return "nats-leaf://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(n.leafPort))
}

// WaitLeafConnected waits until the server has a leaf node connection (on
// a hub: a leaf connected to it; on a leaf: its connection to the hub).
func (n *NATS) WaitLeafConnected(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if n.srv != nil && n.srv.NumLeafNodes() > 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("testenv: nats-server %s: no leaf node connection after %s", n.cur.ServerName, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// StartNATSLeaf starts a nats-server (options o) as a leaf node of hub,
// which must have been started with LeafNodes, and waits until both see
// the connection. Give the two different ServerNames. With JetStream
// domains on both (each has JetStream: the leaf's is its own), nats-server
// denies the JetStream API ($JS.API.>) and the key-value and object
// subjects ($KV.>, $OBJ.>) across the connection: a client of the leaf
// reaches the hub's JetStream only through the hub's domain,
// $JS.<domain>.API.> (the domain's API prefix, which the hub maps to
// $JS.API.>, $KV.> and $OBJ.>).
func StartNATSLeaf(hub *NATS, o NATSOptions) (*NATS, error) {
	if hub.LeafURL() == "" {
		return nil, errors.New("testenv: the hub does not accept leaf nodes (NATSOptions.LeafNodes)")
	}
	o.LeafRemote = hub.LeafURL()
	leaf, err := StartNATS(o)
	if err != nil {
		return nil, err
	}
	for _, s := range []*NATS{leaf, hub} {
		if err := s.WaitLeafConnected(10 * time.Second); err != nil {
			leaf.Shutdown()
			return nil, err
		}
	}
	return leaf, nil
}

// NATSHubLeafT starts a hub (JetStream domain hubDomain) and a leaf node
// of it with a JetStream of its own (domain leafDomain) for one test, and
// shuts both down in t.Cleanup.
func NATSHubLeafT(tb testing.TB, hubDomain, leafDomain string) (hub, leaf *NATS) {
	tb.Helper()
	hub = NATST(tb, NATSOptions{ServerName: "hub", JetStreamDomain: hubDomain, LeafNodes: true})
	leaf, err := StartNATSLeaf(hub, NATSOptions{ServerName: "leaf", JetStreamDomain: leafDomain})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(leaf.Shutdown)
	return hub, leaf
}
