package scenario

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/relayd/relayd/internal/testenv"
)

// JetStream cluster scenarios: three clustered nats-servers, relayd's
// stream and index bucket with 3 replicas (nats.stream.replicas,
// nats.index.replicas). Registered with the catalog in init.
var clusterScenarios = []Scenario{
	{
		// The leader of the stream (now and then of the bucket) is
		// stopped while relayd publishes; a follower takes over (a Raft
		// election, a few seconds) and the old leader comes back and
		// catches up. Replays across the change must still be dropped by
		// the new leader's duplicate window.
		Name: "js-cluster-leader-kill", NATSCluster: 3, MinFaults: 3, MinWriteFor: 15 * time.Second,
		Faults: func(ctx context.Context, r *Run) {
			for n := 0; quiet(ctx, r); n++ {
				what, stream := "stream", r.stream
				if n%3 == 2 {
					what, stream = "bucket", r.bucketStream(ctx)
				}
				i := r.Cluster.StreamLeader(stream)
				if i < 0 {
					continue // an election is still going on
				}
				t0 := time.Now()
				r.Cluster.Stop(i)
				r.Fault("js-"+what+"-leader-stop", fmt.Sprintf("%s (leader of %s)", r.Cluster.Name(i), stream))
				if j, err := r.Cluster.WaitStreamLeader(stream, 30*time.Second); err == nil && r.Env.Logf != nil {
					r.Env.Logf("%s leads %s after %v", r.Cluster.Name(j), stream, time.Since(t0).Round(time.Millisecond))
				}
				Sleep(ctx, r.Between(500*time.Millisecond, 3*time.Second))
				if err := r.restartNATSServers(i); err != nil {
					r.Fault("error", err.Error())
					return
				}
			}
		},
	},
	{
		// Two of three servers stopped (the stream's leader and one
		// more): no quorum, nothing can be stored; relayd must stall (not
		// drop, not advance its checkpoint) until both are back.
		Name: "js-cluster-quorum-loss", NATSCluster: 3, MinFaults: 2, MinWriteFor: 15 * time.Second,
		Faults: func(ctx context.Context, r *Run) {
			for quiet(ctx, r) {
				i := max(r.Cluster.StreamLeader(r.stream), 0)
				down := []int{i, (i + 1) % r.Cluster.Len()}
				for _, d := range down {
					r.Cluster.Stop(d)
				}
				r.Fault("js-quorum-loss", fmt.Sprintf("%s (leader of %s) and %s stopped", r.Cluster.Name(down[0]), r.stream, r.Cluster.Name(down[1])))
				Sleep(ctx, r.Between(2*time.Second, 6*time.Second))
				if err := r.restartNATSServers(down...); err != nil {
					r.Fault("error", err.Error())
					return
				}
			}
		},
	},
}

// startNATSCluster starts the scenario's JetStream cluster (nil if it has
// none).
func startNATSCluster(s Scenario) (*testenv.NATSCluster, error) {
	if s.NATSCluster == 0 {
		return nil, nil
	}
	c, err := testenv.StartNATSCluster(s.NATSCluster, testenv.NATSClusterOptions{Name: "chaos"})
	if err != nil {
		return nil, fmt.Errorf("scenario %s: %w", s.Name, err)
	}
	return c, nil
}

// runNATSURL is what relayd and the run's own client connect to: every server
// of the cluster, or the single server.
func runNATSURL(e *Env, c *testenv.NATSCluster) string {
	if c != nil {
		return c.URLs()
	}
	return e.NATS.URL()
}

// restartNATSServers starts the cluster's stopped servers ids and waits
// until the cluster is whole again.
func (r *Run) restartNATSServers(ids ...int) error {
	for _, i := range ids {
		if err := r.Cluster.Start(i); err != nil {
			return err
		}
	}
	return r.Cluster.WaitReady(60 * time.Second)
}

// healCluster starts every stopped server of the cluster, if any.
func (r *Run) healCluster() error {
	if r.Cluster == nil {
		return nil
	}
	return r.Cluster.StartAll(60 * time.Second)
}

// bucketStream is the stream of relayd's index bucket (the only bucket of
// the run's own cluster), "" until relayd created it.
func (r *Run) bucketStream(ctx context.Context) string {
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	names := r.js.KeyValueStoreNames(lctx)
	out := ""
	for n := range names.Name() {
		if strings.HasPrefix(n, "relayd-index-") {
			out = "KV_" + n
		}
	}
	return out
}
