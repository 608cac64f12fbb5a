package testenv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/relayd/relayd/internal/testutil"
)

// NATSClusterOptions configures StartNATSCluster. The zero value is a
// cluster named "relayd-testenv" of NATSServerBin's binary.
type NATSClusterOptions struct {
	// Name is the cluster name (cluster.name); every server has it.
	Name string
	// Bin is the nats-server binary; NATSServerBin when empty.
	Bin string
}

// NATSServerBin is the nats-server binary the cluster runs:
// $RELAYD_NATS_SERVER, else <repo>/.cache/nats-server/v<version>/nats-server,
// where `make nats-server-bin` (hack/nats-server-bin.sh) builds the version
// go.mod requires, the one linked into this binary (server.VERSION). A
// missing binary or one of another version is an error naming the target.
func NATSServerBin() (string, error) {
	want := "v" + server.VERSION
	bin := os.Getenv("RELAYD_NATS_SERVER")
	if bin == "" {
		root, err := testutil.RepoRoot()
		if err != nil {
			return "", fmt.Errorf("%w (or set RELAYD_NATS_SERVER)", err)
		}
		bin = filepath.Join(root, ".cache", "nats-server", want, "nats-server")
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("testenv: nats-server %s not runnable at %s (%v): run `make nats-server-bin`", want, bin, err)
	}
	if got := strings.TrimSpace(string(out)); got != "nats-server: "+want {
		return "", fmt.Errorf("testenv: %s reports %q, go.mod requires nats-server %s: run `make nats-server-bin`", bin, got, want)
	}
	return bin, nil
}

// NATSCluster is n nats-servers with JetStream, each a child process of
// its own, clustered on 127.0.0.1 (explicit routes between every pair),
// each with its own client, route and monitoring port and store dir.
// Streams and buckets created with Replicas up to n are replicated with
// Raft across them; a stopped server takes its replicas with it, and a
// majority must be up for a replicated stream to accept writes.
//
// Stop is a clean shutdown (SIGTERM: the server's Raft leaders step down
// and its store is flushed); Kill is a crash (SIGKILL: no step-down, writes
// still buffered in the process are lost, the others elect a leader after
// their election timeout). Start brings a server back on the same ports
// and store. The cluster's state is read from each server's monitoring
// port (/varz, /healthz, /jsz).
type NATSCluster struct {
	name, bin, dir string
	hc             *http.Client
	mu             sync.Mutex
	nodes          []*clusterNode
}

type clusterNode struct {
	name                           string
	port, clusterPort, monitorPort int // pinned
	storeDir, confFile, logFile    string
	p                              *proc // nil while down
	exit                           *os.ProcessState
}

// StartNATSCluster starts n (at least 1) clustered JetStream servers and
// waits until they are routed to each other and have a JetStream meta
// leader.
func StartNATSCluster(n int, o NATSClusterOptions) (*NATSCluster, error) {
	if n < 1 {
		return nil, fmt.Errorf("testenv: NATS cluster of %d servers", n)
	}
	c := &NATSCluster{name: o.Name, bin: o.Bin, hc: &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}}
	if c.name == "" {
		c.name = "relayd-testenv"
	}
	if c.bin == "" {
		var err error
		if c.bin, err = NATSServerBin(); err != nil {
			return nil, err
		}
	}
	// Ports are picked first and then pinned: every route names every
	// other server's route port, and a restarted server must come back
	// where clients and routes reconnect.
	ports, err := freePorts(3 * n)
	if err != nil {
		return nil, err
	}
	if c.dir, err = os.MkdirTemp("", "relayd-nats-cluster-"); err != nil {
		return nil, err
	}
	for i := range n {
		d := filepath.Join(c.dir, strconv.Itoa(i))
		c.nodes = append(c.nodes, &clusterNode{
			name: fmt.Sprintf("%s-%d", c.name, i), port: ports[3*i], clusterPort: ports[3*i+1], monitorPort: ports[3*i+2],
			storeDir: filepath.Join(d, "store"), confFile: filepath.Join(d, "nats.conf"), logFile: filepath.Join(d, "nats.log"),
		})
	}
	for i := range n {
		if err := c.writeConfig(i); err != nil {
			c.Shutdown()
			return nil, err
		}
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
// makes a start fail.
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

// writeConfig writes server i's configuration file. sync_interval is left
// at nats-server's default (fsync every 2 minutes, not per write): a
// killed process loses only what it had not yet written, a machine crash
// is not simulated.
func (c *NATSCluster) writeConfig(i int) error {
	nd := c.nodes[i]
	var routes []string
	for j, other := range c.nodes {
		if j != i {
			routes = append(routes, strconv.Quote("nats://"+net.JoinHostPort("127.0.0.1", strconv.Itoa(other.clusterPort))))
		}
	}
	// One route connection per pair, uncompressed: less work on a small
	// machine, same semantics.
	conf := fmt.Sprintf(`server_name: %q
listen: "127.0.0.1:%d"
http: "127.0.0.1:%d"
jetstream { store_dir: %q }
cluster {
  name: %q
  listen: "127.0.0.1:%d"
  routes: [%s]
  pool_size: -1
  compression: off
}
`, nd.name, nd.port, nd.monitorPort, nd.storeDir, c.name, nd.clusterPort, strings.Join(routes, ", "))
	if err := os.MkdirAll(nd.storeDir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(nd.confFile, []byte(conf), 0o600)
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

// Pid is server i's process id, 0 while it is down.
func (c *NATSCluster) Pid(i int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p := c.nodes[i].p; p != nil {
		return p.Pid()
	}
	return 0
}

// Log is server i's log (every start's, appended).
func (c *NATSCluster) Log(i int) string {
	b, _ := os.ReadFile(c.nodes[i].logFile)
	return string(b)
}

// Running reports which servers are running.
func (c *NATSCluster) Running() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []int
	for i, nd := range c.nodes {
		if nd.p != nil {
			out = append(out, i)
		}
	}
	return out
}

// take marks server i down and returns its process (nil if it was down).
func (c *NATSCluster) take(i int) *proc {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.nodes[i].p
	c.nodes[i].p = nil
	return p
}

func (c *NATSCluster) exited(i int, p *proc) *os.ProcessState {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nodes[i].exit = p.cmd.ProcessState
	return p.cmd.ProcessState
}

// Stop shuts server i down cleanly (SIGTERM; SIGKILL after 30 s) and
// keeps its store, for Start to reuse. It returns how the process ended
// (nil if it was not running).
func (c *NATSCluster) Stop(i int) *os.ProcessState {
	p := c.take(i)
	if p == nil {
		return nil
	}
	p.stop(30 * time.Second)
	return c.exited(i, p)
}

// Kill kills server i with SIGKILL, as a crash would: no Raft step-down,
// no flush of what the process still buffered. It waits until the process
// is gone and returns how it ended (a SIGKILL, "signal: killed"), or an
// error if it was not running. The store stays for Start.
func (c *NATSCluster) Kill(i int) (*os.ProcessState, error) {
	p := c.take(i)
	if p == nil {
		return nil, fmt.Errorf("testenv: NATS cluster server %s is not running", c.nodes[i].name)
	}
	p.kill()
	return c.exited(i, p), nil
}

// Exit is how server i's last process ended, nil if none has.
func (c *NATSCluster) Exit(i int) *os.ProcessState {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i].exit
}

// Start starts server i (again) on its ports and store. It returns once
// the server accepts clients with JetStream enabled; use WaitReady to
// wait for the cluster.
func (c *NATSCluster) Start(i int) error {
	nd := c.nodes[i]
	c.mu.Lock()
	running := nd.p != nil
	c.mu.Unlock()
	if running {
		return fmt.Errorf("testenv: NATS cluster server %s is already running", nd.name)
	}
	var err error
	// A port can still be held for a moment by the process just gone.
	for try := 0; try < 5; try++ {
		var p *proc
		if p, err = startProc(c.bin, []string{"-c", nd.confFile}, nd.logFile); err != nil {
			return err
		}
		url := fmt.Sprintf("http://127.0.0.1:%d/healthz?js-enabled-only=true", nd.monitorPort)
		if err = waitHTTP(context.Background(), p, url, c.hc, 30*time.Second); err == nil {
			c.mu.Lock()
			nd.p = p
			c.mu.Unlock()
			return nil
		}
		p.kill()
		err = fmt.Errorf("testenv: NATS cluster server %s (client port %d, route port %d, log %s): %w",
			nd.name, nd.port, nd.clusterPort, nd.logFile, err)
		time.Sleep(200 * time.Millisecond)
	}
	return err
}

// StartAll starts every stopped server and waits until the cluster is
// ready (WaitReady).
func (c *NATSCluster) StartAll(timeout time.Duration) error {
	for i := range c.nodes {
		if c.Pid(i) == 0 {
			if err := c.Start(i); err != nil {
				return err
			}
		}
	}
	return c.WaitReady(timeout)
}

// Shutdown stops every server and removes their stores.
func (c *NATSCluster) Shutdown() {
	var wg sync.WaitGroup
	for i := range c.nodes {
		wg.Go(func() { c.Stop(i) })
	}
	wg.Wait()
	if c.dir != "" && os.Getenv("RELAYD_TESTENV_KEEP") == "" {
		_ = os.RemoveAll(c.dir)
	}
}

// monitor GETs path from server i's monitoring port into v.
func (c *NATSCluster) monitor(i int, path string, v any) error {
	resp, err := c.hc.Get(fmt.Sprintf("http://127.0.0.1:%d%s", c.nodes[i].monitorPort, path))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}

// poll calls f every 50 ms until it returns "" or timeout; the error says
// what f said last.
func poll(timeout time.Duration, f func() string) error {
	deadline := time.Now().Add(timeout)
	for {
		why := f()
		if why == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New(why)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
