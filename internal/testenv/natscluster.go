package testenv

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// NATSClusterOptions configures StartNATSCluster. The zero value is a
// cluster named "relayd-testenv" without authentication or TLS.
type NATSClusterOptions struct {
	// Name is the cluster name (server.ClusterOpts.Name); every server
	// has it.
	Name string
}

// NATSCluster is n embedded nats-servers with JetStream, clustered on
// 127.0.0.1 (explicit routes between every pair), each with its own
// client port, route port and store dir. Streams and buckets created with
// Replicas up to n are replicated with Raft across them; a stopped server
// takes its replicas with it, and a majority must be up for a replicated
// stream to accept writes.
//
// Servers are stopped with Shutdown (embedded servers cannot be
// SIGKILLed): the store is flushed, but Raft leadership is not handed over
// first, as after a crash (no lame duck mode).
type NATSCluster struct {
	name  string
	mu    sync.Mutex
	nodes []*clusterNode
}

type clusterNode struct {
	name        string
	port        int // client port, pinned
	clusterPort int // route port, pinned
	storeDir    string
	srv         *server.Server
}

// StartNATSCluster starts n (at least 1) clustered JetStream servers and
// waits until they are routed to each other and have a JetStream meta
// leader.
func StartNATSCluster(n int, o NATSClusterOptions) (*NATSCluster, error) {
	if n < 1 {
		return nil, fmt.Errorf("testenv: NATS cluster of %d servers", n)
	}
	c := &NATSCluster{name: o.Name}
	if c.name == "" {
		c.name = "relayd-testenv"
	}
	// Ports are picked first and then pinned: every route names every
	// other server's route port, and a restarted server must come back
	// where clients and routes reconnect.
	ports, err := freePorts(2 * n)
	if err != nil {
		return nil, err
	}
	for i := range n {
		d, err := os.MkdirTemp("", "relayd-nats-cluster-")
		if err != nil {
			c.Shutdown()
			return nil, err
		}
		c.nodes = append(c.nodes, &clusterNode{
			name: fmt.Sprintf("%s-%d", c.name, i), port: ports[2*i], clusterPort: ports[2*i+1], storeDir: d,
		})
	}
	// Servers start concurrently: a server's JetStream waits for its
	// peers, so one at a time would not be quicker.
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = c.Start(i) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		c.Shutdown()
		return nil, err
	}
	if err := c.WaitReady(60 * time.Second); err != nil {
		c.Shutdown()
		return nil, err
	}
	return c, nil
}

// freePorts returns k distinct free TCP ports on 127.0.0.1. They are
// released before returning; a port taken by someone else in between
// makes a start fail (and Start retries only for its own old listener).
func freePorts(k int) ([]int, error) {
	var out []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	for range k {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("testenv: a free port for the NATS cluster: %w", err)
		}
		ls = append(ls, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}

func (c *NATSCluster) options(i int) *server.Options {
	nd := c.nodes[i]
	var routes []string
	for j, other := range c.nodes {
		if j != i {
			routes = append(routes, "nats://"+net.JoinHostPort("127.0.0.1", strconv.Itoa(other.clusterPort)))
		}
	}
	opts := &server.Options{
		ServerName: nd.name,
		Host:       "127.0.0.1",
		Port:       nd.port,
		JetStream:  true,
		StoreDir:   nd.storeDir,
		NoLog:      true,
		NoSigs:     true,
		Routes:     server.RoutesFromStr(strings.Join(routes, ",")),
	}
	opts.Cluster.Name = c.name
	opts.Cluster.Host = "127.0.0.1"
	opts.Cluster.Port = nd.clusterPort
	// One route connection per pair, uncompressed: less work on a small
	// machine, same semantics.
	opts.Cluster.PoolSize = -1
	opts.Cluster.Compression.Mode = server.CompressionOff
	return opts
}

// Len is the number of servers.
func (c *NATSCluster) Len() int { return len(c.nodes) }

// URLs is the client URL of every server, comma-separated (the form of
// relayd's nats.url for several servers), e.g.
// nats://127.0.0.1:4222,nats://127.0.0.1:4223. It stays valid while
// servers are stopped.
func (c *NATSCluster) URLs() string {
	var us []string
	for i := range c.nodes {
		us = append(us, c.URL(i))
	}
	return strings.Join(us, ",")
}

// URL is server i's client URL.
func (c *NATSCluster) URL(i int) string {
	return "nats://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(c.nodes[i].port))
}

// Name is server i's server name (as in JetStream's cluster info).
func (c *NATSCluster) Name(i int) string { return c.nodes[i].name }

// Server is server i, nil while it is stopped.
func (c *NATSCluster) Server(i int) *server.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i].srv
}

// Running reports which servers are running.
func (c *NATSCluster) Running() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []int
	for i, nd := range c.nodes {
		if nd.srv != nil {
			out = append(out, i)
		}
	}
	return out
}

// Stop shuts server i down and keeps its store, for Start to reuse.
// Stopping a stopped server does nothing.
func (c *NATSCluster) Stop(i int) {
	c.mu.Lock()
	srv := c.nodes[i].srv
	c.nodes[i].srv = nil
	c.mu.Unlock()
	if srv != nil {
		srv.Shutdown()
		srv.WaitForShutdown()
	}
}

// Start starts server i (again) on its ports and store. It returns once
// the server accepts clients; use WaitReady to wait for the cluster.
func (c *NATSCluster) Start(i int) error {
	c.mu.Lock()
	running := c.nodes[i].srv != nil
	c.mu.Unlock()
	if running {
		return fmt.Errorf("testenv: NATS cluster server %s is already running", c.nodes[i].name)
	}
	var err error
	// The old listener may take a moment to release the port.
	for try := 0; try < 50; try++ {
		var srv *server.Server
		if srv, err = server.NewServer(c.options(i)); err != nil {
			return fmt.Errorf("testenv: NATS cluster server %s: %w", c.nodes[i].name, err)
		}
		go srv.Start()
		if srv.ReadyForConnections(10 * time.Second) {
			c.mu.Lock()
			c.nodes[i].srv = srv
			c.mu.Unlock()
			return nil
		}
		srv.Shutdown()
		srv.WaitForShutdown()
		err = fmt.Errorf("testenv: NATS cluster server %s (client port %d, route port %d) not ready after 10s",
			c.nodes[i].name, c.nodes[i].port, c.nodes[i].clusterPort)
		time.Sleep(100 * time.Millisecond)
	}
	return err
}

// StartAll starts every stopped server and waits until the cluster is
// ready (WaitReady).
func (c *NATSCluster) StartAll(timeout time.Duration) error {
	for i := range c.nodes {
		if c.Server(i) == nil {
			if err := c.Start(i); err != nil {
				return err
			}
		}
	}
	return c.WaitReady(timeout)
}

// WaitReady waits until every running server is routed to every other
// running one, one of them is the JetStream meta leader, and every
// running server's view of the meta group is current.
func (c *NATSCluster) WaitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		why := c.notReady()
		if why == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("testenv: NATS cluster not ready within %v: %s", timeout, why)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *NATSCluster) notReady() string {
	up := c.Running()
	if len(up) == 0 {
		return "no server running"
	}
	leader := false
	for _, i := range up {
		srv := c.Server(i)
		if srv == nil {
			return c.nodes[i].name + " stopped meanwhile"
		}
		if got := srv.NumRoutes(); got < len(up)-1 {
			return fmt.Sprintf("%s has %d routes, want %d", c.nodes[i].name, got, len(up)-1)
		}
		if !srv.JetStreamIsCurrent() {
			return c.nodes[i].name + ": JetStream meta group not current"
		}
		leader = leader || srv.JetStreamIsLeader()
	}
	if !leader {
		return "no JetStream meta leader"
	}
	return ""
}

// MetaLeader is the index of the JetStream meta leader, -1 if no running
// server is.
func (c *NATSCluster) MetaLeader() int {
	for _, i := range c.Running() {
		if srv := c.Server(i); srv != nil && srv.JetStreamIsLeader() {
			return i
		}
	}
	return -1
}

// WaitMetaLeader waits for a JetStream meta leader and returns its index.
func (c *NATSCluster) WaitMetaLeader(timeout time.Duration) (int, error) {
	deadline := time.Now().Add(timeout)
	for {
		if i := c.MetaLeader(); i >= 0 {
			return i, nil
		}
		if time.Now().After(deadline) {
			return -1, fmt.Errorf("testenv: no JetStream meta leader among running servers %v within %v", c.Running(), timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// StreamLeader is the index of the server leading stream (of the global
// account; a KV bucket B is stream KV_B), -1 if no running server does.
func (c *NATSCluster) StreamLeader(stream string) int {
	for _, i := range c.Running() {
		srv := c.Server(i)
		if srv != nil && srv.JetStreamIsStreamLeader(srv.GlobalAccount().Name, stream) {
			return i
		}
	}
	return -1
}

// WaitStreamLeader waits until a running server leads stream and returns
// its index.
func (c *NATSCluster) WaitStreamLeader(stream string, timeout time.Duration) (int, error) {
	deadline := time.Now().Add(timeout)
	for {
		if i := c.StreamLeader(stream); i >= 0 {
			return i, nil
		}
		if time.Now().After(deadline) {
			return -1, fmt.Errorf("testenv: no leader of stream %s among running servers %v within %v", stream, c.Running(), timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// WaitStreamCurrent waits until every running server that holds a replica
// of stream has caught up with its leader.
func (c *NATSCluster) WaitStreamCurrent(stream string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		var behind []string
		for _, i := range c.Running() {
			srv := c.Server(i)
			if srv == nil {
				continue
			}
			acc := srv.GlobalAccount().Name
			if srv.JetStreamIsStreamAssigned(acc, stream) && !srv.JetStreamIsStreamCurrent(acc, stream) {
				behind = append(behind, c.nodes[i].name)
			}
		}
		if len(behind) == 0 && c.StreamLeader(stream) >= 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("testenv: stream %s: replicas not current within %v: %v (leader %d)", stream, timeout, behind, c.StreamLeader(stream))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Shutdown stops every server and removes their stores.
func (c *NATSCluster) Shutdown() {
	var wg sync.WaitGroup
	for i := range c.nodes {
		wg.Go(func() { c.Stop(i) })
	}
	wg.Wait()
	for _, nd := range c.nodes {
		_ = os.RemoveAll(nd.storeDir)
	}
}
