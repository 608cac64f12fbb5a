package scenario

import (
	"context"
	"fmt"
	"time"
)

// quiet is the pause between faults.
func quiet(ctx context.Context, r *Run) bool {
	return Sleep(ctx, r.Between(500*time.Millisecond, 2*time.Second))
}

// Catalog is every scenario: the ones below, then the JetStream cluster
// ones (cluster.go), then those deleting relayd's recovery state
// (recovery.go), then those changing the config and requesting resyncs
// (relists.go).
var Catalog = append(append(append([]Scenario{
	{
		Name: "kill9-random", MinFaults: 3,
		Faults: func(ctx context.Context, r *Run) {
			for Sleep(ctx, r.Between(300*time.Millisecond, 1500*time.Millisecond)) {
				r.Kill9()
			}
		},
	},
	// The dangerous points, each armed at a random hit after every
	// (re)start, so that relayd dies there again and again (the keeper
	// restarts it, as Kubernetes would).
	{Name: "fp-after-publish", Failpoints: "sink-after-publish=kill,n={n}", MinFaults: 3},
	{Name: "fp-after-ack", Failpoints: "sink-after-ack=kill,n={n}", MinFaults: 3},
	// Checkpoint writes are coalesced (flushInterval 200ms): fewer hits.
	{Name: "fp-checkpoint-before-write", Failpoints: "checkpoint-before-write=kill,n={n:1-8}", MinFaults: 3},
	{Name: "fp-checkpoint-after-write", Failpoints: "checkpoint-after-write=kill,n={n:1-8}", MinFaults: 3},
	{
		Name: "sigstop-beyond-watch-timeout", MinFaults: 1, MinWriteFor: 45 * time.Second,
		Faults: func(ctx context.Context, r *Run) {
			if quiet(ctx, r) {
				r.Pause(ctx, r.Between(36*time.Second, 40*time.Second)) // watch.timeout 30s, idleTimeout 35s
			}
		},
	},
	{
		// A restart takes ~17s here (graceful stop of kube-apiserver, then
		// start); with the watch cache on, relayd's resume gets 410.
		// After each restart the apiserver serves for 2–5 s more than the
		// usual quiet period, so that writes get through between restarts.
		Name: "apiserver-restart", RestartsServers: true, MinFaults: 2, MinWriteFor: 25 * time.Second,
		Faults: func(ctx context.Context, r *Run) {
			for quiet(ctx, r) {
				if r.RestartAPIServer(ctx, false) != nil || !Sleep(ctx, r.Between(2*time.Second, 5*time.Second)) {
					return
				}
			}
		},
	},
	{
		// Kill, don't stop: kube-apiserver dies with SIGKILL (no graceful
		// close of watches, requests cut mid-flight) and is started again
		// on the same port. Its new watch cache starts at the current
		// revision, so relayd's resume may get 410 (expired) and relist —
		// legitimately, which the checker's relist rule allows.
		Name: "apiserver-kill9", RestartsServers: true, MinFaults: 2, MinWriteFor: 25 * time.Second,
		Faults: func(ctx context.Context, r *Run) {
			for quiet(ctx, r) {
				if r.RestartAPIServer(ctx, true) != nil || !Sleep(ctx, r.Between(2*time.Second, 5*time.Second)) {
					return
				}
			}
		},
	},
	{
		// etcd dies with SIGKILL while relayd and kube-apiserver run, and
		// is started again on the same data directory and ports after
		// 0.5–2 s. The apiserver's etcd watches break and its watch cache
		// re-initialises; a relist relayd makes then is expired (410).
		// The reference watch of etcd is made again from the revision
		// after its last event.
		Name: "etcd-restart", RestartsServers: true, MinFaults: 2, MinWriteFor: 15 * time.Second,
		Faults: func(ctx context.Context, r *Run) {
			for quiet(ctx, r) {
				if r.RestartEtcd(ctx, r.Between(500*time.Millisecond, 2*time.Second)) != nil {
					return
				}
			}
		},
	},
	{
		Name: "compaction-410", NoWatchCache: true, MinFaults: 2,
		Faults: func(ctx context.Context, r *Run) {
			for quiet(ctx, r) {
				r.Down(ctx, r.Between(time.Second, 2*time.Second), func() { r.Compact(ctx) })
			}
		},
	},
	// A 410 relist, then a crash before the checkpoint records it (the
	// first checkpoint write of every run kills relayd): the next run
	// relists again, from the same position.
	{
		Name: "fp-crash-after-resync", NoWatchCache: true, Failpoints: "checkpoint-before-write=kill,n=1", MinFaults: 3,
		Faults: func(ctx context.Context, r *Run) {
			for quiet(ctx, r) {
				r.Down(ctx, r.Between(time.Second, 2*time.Second), func() { r.Compact(ctx) })
			}
		},
	},
	{
		Name: "nats-restart", RestartsServers: true, MinFaults: 2,
		Faults: func(ctx context.Context, r *Run) {
			for quiet(ctx, r) {
				r.StopNATS()
				Sleep(ctx, r.Between(500*time.Millisecond, 3*time.Second))
				if err := r.StartNATS(); err != nil {
					r.Fault("error", err.Error())
					return
				}
			}
		},
	},
	{
		Name: "stream-full", StreamMaxMsgs: 40, MinFaults: 2,
		Faults: func(ctx context.Context, r *Run) {
			// The stream fills up (discard new: publishes fail); now and
			// then some room is made, which fills up again.
			for Sleep(ctx, r.Between(time.Second, 3*time.Second)) {
				n, limit, err := r.StreamMsgs(ctx)
				if err != nil || int64(n) < limit {
					continue
				}
				r.Fault("stream-full", fmt.Sprintf("%d of %d messages; limit raised by 30", n, limit))
				if err := r.SetStreamMaxMsgs(ctx, int64(n)+30); err != nil {
					r.Fault("error", err.Error())
				}
			}
		},
	},
	{Name: "proxy-apiserver", ProxyAPI: true, MinFaults: 3, MinWriteFor: 12 * time.Second, Faults: proxyFaults(func(r *Run) proxyTarget { return r.APIProxy })},
	{Name: "proxy-nats", ProxyNATS: true, MinFaults: 3, MinWriteFor: 12 * time.Second, Faults: proxyFaults(func(r *Run) proxyTarget { return r.NATSProxy })},
	{
		Name: "mixed", RestartsServers: true, ProxyAPI: true, ProxyNATS: true, MinFaults: 3, MinWriteFor: 12 * time.Second,
		Failpoints: "sink-after-ack=kill,p=0.005;checkpoint-after-write=kill,p=0.01",
		Faults: func(ctx context.Context, r *Run) {
			api, nt := proxyFaults(func(r *Run) proxyTarget { return r.APIProxy }), proxyFaults(func(r *Run) proxyTarget { return r.NATSProxy })
			for quiet(ctx, r) {
				fctx, cancel := context.WithTimeout(ctx, r.Between(2*time.Second, 5*time.Second))
				switch r.Rng.IntN(5) {
				case 0:
					r.Kill9()
				case 1:
					_ = r.RestartAPIServer(ctx, false)
				case 2:
					r.StopNATS()
					Sleep(fctx, time.Second)
					if err := r.StartNATS(); err != nil {
						r.Fault("error", err.Error())
					}
				case 3:
					api(fctx, r)
				case 4:
					nt(fctx, r)
				}
				cancel()
			}
		},
	},
	{
		// Every third object's name is 253 characters long, and relayd
		// runs against a NATS server of the run's own whose max_payload
		// fits those objects' events only without data: each of their
		// changes must reach the stream flagged relaydunencodable (never
		// skipped), across kill -9 and NATS restarts (unencodable.go).
		Name: "unencodable", UnencodableEvery: 3, MinFaults: 2,
		Faults: func(ctx context.Context, r *Run) {
			for i := 0; quiet(ctx, r); i++ {
				if i%2 == 0 {
					r.Kill9()
					continue
				}
				r.StopNATS()
				Sleep(ctx, r.Between(500*time.Millisecond, 2*time.Second))
				if err := r.StartNATS(); err != nil {
					r.Fault("error", err.Error())
					return
				}
			}
		},
	},
}, clusterScenarios...), recoveryScenarios...), relistScenarios...)

// proxyTarget is the part of faultproxy.Proxy the drivers use.
type proxyTarget interface {
	SetLatency(time.Duration)
	SetDropProbability(float64)
	Blackhole(bool)
	Refuse(bool)
	Reset() int
	HalfClose() int
	Heal()
}

// proxyFaults cycles through the network faults, with quiet periods.
func proxyFaults(get func(*Run) proxyTarget) func(context.Context, *Run) {
	return func(ctx context.Context, r *Run) {
		p := get(r)
		// Every kind in turn, from a random one.
		for next := r.Rng.IntN(6); quiet(ctx, r); next++ {
			d := r.Between(time.Second, 3*time.Second)
			switch next % 6 {
			case 0:
				lat := r.Between(50*time.Millisecond, 300*time.Millisecond)
				p.SetLatency(lat)
				r.Fault("proxy-latency", lat.Round(time.Millisecond).String()+" for "+d.Round(time.Millisecond).String())
				Sleep(ctx, d)
			case 1:
				p.SetDropProbability(0.02)
				r.Fault("proxy-drop", "p=0.02 for "+d.Round(time.Millisecond).String())
				Sleep(ctx, d)
			case 2:
				r.Fault("proxy-reset", fmt.Sprintf("%d connections", p.Reset()))
			case 3:
				r.Fault("proxy-half-open", fmt.Sprintf("%d connections", p.HalfClose()))
			case 4:
				p.Blackhole(true)
				r.Fault("proxy-blackhole", d.Round(time.Millisecond).String())
				Sleep(ctx, d)
			case 5:
				// The server "refuses": every connection reset, new ones
				// refused for a while.
				p.Refuse(true)
				r.Fault("proxy-refuse", fmt.Sprintf("%d connections reset, new ones refused for %s", p.Reset(), d.Round(time.Millisecond)))
				Sleep(ctx, d)
			}
			p.Heal()
		}
	}
}

// ByName returns the catalog's scenario name.
func ByName(name string) (Scenario, bool) {
	for _, s := range Catalog {
		if s.Name == name {
			return s, true
		}
	}
	return Scenario{}, false
}
