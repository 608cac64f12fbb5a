package scenario

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/relayd/relayd/internal/testenv"
)

// JetStream cluster scenarios: three clustered nats-servers, relayd's
// stream and index bucket with 3 replicas (nats.stream.replicas,
// nats.index.replicas). Registered with the catalog in init.
var clusterScenarios = []Scenario{
	{
		// The leader of the stream (every third fault the bucket's) is
		// killed with SIGKILL while relayd publishes: a crash, not a
		// shutdown. It does not step down, so the two followers notice
		// only when its heartbeats stop and elect one of themselves after
		// their Raft election timeout (4–9 s in nats-server); publishes
		// meanwhile time out and relayd retries them. The killed process
		// loses what it still buffered (nats-server coalesces store writes
		// for up to 8 ms before write(2)); what it had written is in the
		// page cache and survives a process kill (fsync every 2 min, the
		// default sync_interval, matters only if the machine crashes,
		// which is not simulated). Nothing acknowledged is lost: an ack
		// needs a quorum, so every acked message is also on a follower,
		// and Raft elects only a follower whose log has it. The killed
		// server stays down 1–4 s more, restarts on its store and ports
		// and catches up from the new leader. Replays across the change
		// (a publish that timed out may have been stored) must be dropped
		// by the new leader's duplicate window, rebuilt from the stored
		// Nats-Msg-Ids: the checker's "duplicates on stream" stays 0.
		// Besides relayd's own retries, whose timing decides whether
		// any replay crosses the change, each stream leader kill is
		// followed by one certain replay (replayLast).
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
				pid, t0 := r.Cluster.Pid(i), time.Now()
				st, err := r.Cluster.Kill(i)
				if err != nil {
					r.Fault("error", err.Error())
					return
				}
				// The detail carries the exit status: "signal: killed".
				r.Fault("js-"+what+"-leader-kill9", fmt.Sprintf("%s (leader of %s, pid %d): %v", r.Cluster.Name(i), stream, pid, st))
				if j, err := r.Cluster.WaitStreamLeader(stream, 30*time.Second); err == nil && r.Env.Logf != nil {
					r.Env.Logf("%s killed (%v); %s leads %s after %v", r.Cluster.Name(i), st, r.Cluster.Name(j), stream, time.Since(t0).Round(time.Millisecond))
				}
				if what == "stream" {
					r.replayLast(ctx)
				}
				Sleep(ctx, r.Between(time.Second, 4*time.Second))
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
		// drop, not advance its checkpoint) until both are back. Clean
		// stops (SIGTERM: leaders step down, stores flushed), not SIGKILL:
		// killing two of three at once could kill both servers holding a
		// message acknowledged in the last milliseconds only in their
		// write buffers, and the survivor, never having had it, would
		// lead without it. That is nats-server's durability limit
		// (buffered writes, sync_interval), which the checker would
		// report as a message relayd lost; the crash of one server is
		// js-cluster-leader-kill.
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

// replayLast publishes the stream's last message again, headers and all
// (its Nats-Msg-Id), as relayd retries a publish whose ack was lost: the
// new leader must drop it as a duplicate. It is only logged here; if it
// was stored, the checker's duplicate check fails the run (the same
// Nats-Msg-Id twice inside the window).
func (r *Run) replayLast(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	logf := func(f string, a ...any) {
		if r.Env.Logf != nil {
			r.Env.Logf(f, a...)
		}
	}
	s, err := r.js.Stream(ctx, r.stream)
	if err != nil {
		logf("replay: %v", err)
		return
	}
	info, err := s.Info(ctx)
	if err != nil || info.State.LastSeq == 0 {
		logf("replay: stream info: %v", err)
		return
	}
	m, err := s.GetMsg(ctx, info.State.LastSeq)
	if err != nil {
		logf("replay: seq %d: %v", info.State.LastSeq, err)
		return
	}
	// The new leader may still be settling: retry until it answers.
	for {
		pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
		ack, err := r.js.PublishMsg(pctx, &nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data})
		pcancel()
		if err == nil {
			logf("replayed seq %d (%s) across the leader change: duplicate=%v (seq %d)", m.Sequence, m.Header.Get(nats.MsgIdHdr), ack.Duplicate, ack.Sequence)
			return
		}
		if !Sleep(ctx, 200*time.Millisecond) {
			logf("replay of seq %d: %v", m.Sequence, err)
			return
		}
	}
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
