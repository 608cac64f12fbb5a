package testenv

import (
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// The cluster's state as its servers' monitoring ports report it: each
// server is asked about itself (is it routed, current with the meta group,
// leader of a stream), so a server that is down is simply not asked.

// WaitReady waits until every running server is routed to every other
// running one, is current with the JetStream meta group, and one of them
// is the meta leader.
func (c *NATSCluster) WaitReady(timeout time.Duration) error {
	if err := poll(timeout, c.notReady); err != nil {
		return fmt.Errorf("testenv: NATS cluster not ready within %v: %w", timeout, err)
	}
	return nil
}

func (c *NATSCluster) notReady() string {
	up := c.Running()
	if len(up) == 0 {
		return "no server running"
	}
	for _, i := range up {
		var v server.Varz
		if err := c.monitor(i, "/varz", &v); err != nil {
			return fmt.Sprintf("%s: /varz: %v", c.nodes[i].name, err)
		}
		if v.Routes < len(up)-1 {
			return fmt.Sprintf("%s has %d routes, want %d", c.nodes[i].name, v.Routes, len(up)-1)
		}
		var h server.HealthStatus
		if err := c.monitor(i, "/healthz?js-meta-only=true", &h); err != nil {
			return fmt.Sprintf("%s: /healthz: %v", c.nodes[i].name, err)
		}
		if h.Status != "ok" {
			return fmt.Sprintf("%s: %s %s", c.nodes[i].name, h.Status, h.Error)
		}
	}
	if c.MetaLeader() < 0 {
		return "no JetStream meta leader among the running servers"
	}
	return ""
}

// MetaLeader is the index of the JetStream meta leader, -1 if no running
// server is.
func (c *NATSCluster) MetaLeader() int {
	for _, i := range c.Running() {
		var jsz server.JSInfo
		if c.monitor(i, "/jsz", &jsz) == nil && jsz.Meta != nil && jsz.Meta.Leader == c.nodes[i].name {
			return i
		}
	}
	return -1
}

// WaitMetaLeader waits for a JetStream meta leader and returns its index.
func (c *NATSCluster) WaitMetaLeader(timeout time.Duration) (int, error) {
	i := -1
	err := poll(timeout, func() string {
		if i = c.MetaLeader(); i < 0 {
			return fmt.Sprintf("testenv: no JetStream meta leader among running servers %v within %v", c.Running(), timeout)
		}
		return ""
	})
	return i, err
}

// streamInfo is server i's view of stream (of any account; a KV bucket B
// is stream KV_B): its cluster info (with the replicas' state when i
// leads it), nil if i does not hold it or does not answer.
func (c *NATSCluster) streamInfo(i int, stream string) *server.ClusterInfo {
	var jsz server.JSInfo
	if c.monitor(i, "/jsz?accounts=true&streams=true", &jsz) != nil {
		return nil
	}
	for _, a := range jsz.AccountDetails {
		for _, s := range a.Streams {
			if s.Name == stream {
				return s.Cluster
			}
		}
	}
	return nil
}

// StreamLeader is the index of the server leading stream (a KV bucket B is
// stream KV_B), -1 if no running server says it does.
func (c *NATSCluster) StreamLeader(stream string) int {
	// A server just restarted can report itself as the leader from its
	// stored state until it hears from the others: the leader is the one
	// a majority of the running servers name, and it must be running.
	running := c.Running()
	votes := map[string]int{}
	for _, i := range running {
		if ci := c.streamInfo(i, stream); ci != nil && ci.Leader != "" {
			votes[ci.Leader]++
		}
	}
	for _, i := range running {
		if n := votes[c.nodes[i].name]; 2*n > len(running) {
			if ci := c.streamInfo(i, stream); ci != nil && ci.Leader == c.nodes[i].name {
				return i
			}
		}
	}
	return -1
}

// WaitStreamLeader waits until a running server leads stream and returns
// its index.
func (c *NATSCluster) WaitStreamLeader(stream string, timeout time.Duration) (int, error) {
	i := -1
	err := poll(timeout, func() string {
		if i = c.StreamLeader(stream); i < 0 {
			return fmt.Sprintf("testenv: no leader of stream %s among running servers %v within %v", stream, c.Running(), timeout)
		}
		return ""
	})
	return i, err
}

// WaitStreamCurrent waits until stream has a leader and every other
// running server is, by the leader's account, a current replica of it.
func (c *NATSCluster) WaitStreamCurrent(stream string, timeout time.Duration) error {
	err := poll(timeout, func() string {
		l := c.StreamLeader(stream)
		if l < 0 {
			return "no leader"
		}
		ci := c.streamInfo(l, stream)
		if ci == nil {
			return c.nodes[l].name + " lost the stream"
		}
		var behind []string
		for _, i := range c.Running() {
			if i == l {
				continue
			}
			k := slices.IndexFunc(ci.Replicas, func(p *server.PeerInfo) bool { return p.Name == c.nodes[i].name })
			if k < 0 || !ci.Replicas[k].Current || ci.Replicas[k].Offline {
				behind = append(behind, c.nodes[i].name)
			}
		}
		if len(behind) > 0 {
			return fmt.Sprintf("not current by %s's account: %v", c.nodes[l].name, behind)
		}
		return ""
	})
	if err != nil {
		return fmt.Errorf("testenv: stream %s: replicas not current within %v: %w", stream, timeout, err)
	}
	return nil
}
