package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/pkg/event"
)

// StepRate: the sustained rate (docs/PERFORMANCE.md, "Scale", step
// rate): the replay server paces recorded 9 KB pod events on one watch;
// a search with short probes finds the highest rate relayd relays with
// read → PubAck p99 ≤ 50 ms and no growing backlog, into an R1 stream and
// into an R3 stream on three servers, and that rate is then held.
const StepRate = "rate"

// RateOptions sizes the rate step.
type RateOptions struct {
	// Replicas are the streams measured: 1 is an R1 stream on the
	// harness's nats-server, n > 1 an Rn stream on a cluster of n
	// nats-servers (internal/testenv StartNATSCluster).
	Replicas []int
	// The search: probes of Probe each, starting at Start events/s,
	// doubling up to Max, halving down to Start/32 if Start does not hold,
	// then bisecting until the held and the failed rate are within
	// Precision (0.1: 10%) of each other.
	Start, Max, Precision float64
	Probe                 time.Duration
	// Hold is how long the found rate is then held (5 minutes in the
	// goal); if it breaks, a rate 10% lower is held once more.
	Hold time.Duration
	// StreamBytes caps each stream (discard old): minutes of 9 KB events
	// would otherwise fill the disk.
	StreamBytes int64
	// Verify reads the streams back at the end and checks that every
	// paced event is in them once (a small run: it reads every message).
	Verify bool
}

// The criteria of a rate that holds (docs/PERFORMANCE.md, "Sustained
// rate").
const (
	rateP99        = 0.050 // read → PubAck p99 (a bucket bound of relayd_publish_lag_seconds)
	rateMaxBehind  = 0.5   // seconds of events scheduled and not yet acknowledged (after rateWarmUp; twice that stops a probe at once)
	rateWarmUp     = time.Second
	rateMaxDrain   = 1.0 // seconds from the last scheduled event to the last PubAck
	rateGoalHold   = 5 * time.Minute
	rateStuck      = 2 * time.Minute // paced events not all acknowledged by then: an error, not a rate
	ratePodObjects = 1000            // distinct pods the events cycle over
	rateFirstRV    = 2_000_000
)

func (o RateOptions) withDefaults() RateOptions {
	if len(o.Replicas) == 0 {
		o.Replicas = []int{1, 3}
	}
	if o.Start <= 0 {
		o.Start = 1000
	}
	if o.Max < o.Start {
		o.Max = max(o.Start, 64000)
	}
	if o.Precision <= 0 {
		o.Precision = 0.1
	}
	if o.Probe <= 0 {
		o.Probe = 15 * time.Second
	}
	if o.Hold <= 0 {
		o.Hold = rateGoalHold
	}
	if o.StreamBytes <= 0 {
		o.StreamBytes = 1 << 30
	}
	return o
}

// RateProbe is relayd relaying paced events at one rate for a while.
type RateProbe struct {
	Rate    float64 // events/s asked
	Planned float64 // seconds asked
	Paced   float64 // seconds the pacer ran (less when stopped early)
	Window  float64 // seconds of the CPU figures: pacing start → last PubAck
	// Sent by the pacer, stored in the stream (last sequence delta), and
	// PubAcks seen.
	Sent, Stored, Acked int64
	// From relayd_publish_lag_seconds over the probe: bucket-interpolated
	// quantiles, and the share of events over 50 ms (exact: a bucket bound).
	P50, P99, Over50 float64
	// MaxBehind is the largest (scheduled − acknowledged) ÷ rate, sampled
	// every 100 ms: seconds of backlog; Drain is the last scheduled event →
	// the last PubAck.
	MaxBehind, Drain float64
	Held             bool
	Why              string `json:",omitempty"` // why it did not hold
	// CPU-seconds over Window: relayd, the nats-server(s) (each), the
	// harness (replay server, pacer, ack snoop), and the whole machine
	// (/proc/stat: every process, the other work on it included).
	RelaydCPU, HarnessCPU, MachineCPU float64
	NATSCPU                           []float64
	// RelaydWait is how long relayd's threads waited in the kernel's run
	// queue for a CPU over Window (/proc/<pid>/task/*/schedstat): of the
	// order of the latency tail, the tail is the machine's contention.
	RelaydWait float64
	RSS, HWM   int64 // relayd at the end (VmHWM: since the probe started, holds only)
}

// CPUPerEvent is relayd's CPU-seconds per stored event.
func (p *RateProbe) CPUPerEvent() float64 {
	if p.Stored == 0 {
		return 0
	}
	return p.RelaydCPU / float64(p.Stored)
}

func (p *RateProbe) natsCPU() float64 {
	var s float64
	for _, c := range p.NATSCPU {
		s += c
	}
	return s
}

// RateResult is the search and the hold into one stream.
type RateResult struct {
	Replicas int
	Probes   []RateProbe
	// Knee is the highest rate that held in the search (0: none down to
	// Start/32); AtMax says the search stopped at Max with every probe held.
	Knee  float64
	AtMax bool
	// Holds: the hold at Knee and, if it broke, the retry 10% lower.
	Holds []RateProbe
	// Paced is every event paced in the step; with Verify, Found is how
	// many of them the stream holds exactly once, Missing and Duplicated
	// the others, Foreign messages that are no paced event.
	Paced                               int64
	Verified                            bool
	Found, Missing, Duplicated, Foreign int64
}

// Hold is the last hold (nil: none).
func (r *RateResult) Hold() *RateProbe {
	if len(r.Holds) == 0 {
		return nil
	}
	return &r.Holds[len(r.Holds)-1]
}

func (h *harness) scaleRate(ctx context.Context, so ScaleOptions, rep *ScaleReport) error {
	ro := so.Rate.withDefaults()
	rec, err := h.scaleRecording(ctx)
	if err != nil {
		return err
	}
	podT, err := podTemplate(rec)
	if err != nil {
		return err
	}
	frames, err := newRateFrames(podT, ratePodObjects)
	if err != nil {
		return err
	}
	var errs []error
	for _, n := range ro.Replicas {
		res, err := h.rateTarget(ctx, ro, frames, n)
		if res != nil {
			rep.Rate = append(rep.Rate, *res)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("into R%d: %w", n, err))
		}
	}
	return errors.Join(errs...)
}

// rateEnv is one stream, its NATS server(s) and the relayd relaying into
// it.
type rateEnv struct {
	h        *harness
	r        *relayd
	p        *pacer
	js       jetstream.JetStream
	snoop    *AckSnoop
	stream   string
	natsPids func() []int
}

// rateNATS connects to the NATS of an Rn stream: the harness's server for
// R1, else a new cluster of n servers (stopped by the returned func).
func (h *harness) rateNATS(n int) (url string, js jetstream.JetStream, snoop *AckSnoop, pids func() []int, stop func(), err error) {
	if n == 1 {
		return h.natsURL, h.js, h.snoop, func() []int { return []int{h.natsd.Pid()} }, func() {}, nil
	}
	// Its ports are picked free, released and then bound by the servers:
	// on a busy machine another process can take one in between; a new
	// cluster gets new ports.
	var cl *testenv.NATSCluster
	for try := 0; try < 3; try++ {
		if cl, err = testenv.StartNATSCluster(n, testenv.NATSClusterOptions{Name: fmt.Sprintf("relayd-bench-r%d", n)}); err == nil {
			break
		}
		h.logf("bench: rate: a cluster of %d nats-servers: %v", n, err)
	}
	if err != nil {
		return "", nil, nil, nil, nil, err
	}
	nc, err := nats.Connect(cl.URLs(), nats.CustomInboxPrefix("_BENCH"), nats.Name("relayd-bench"))
	if err != nil {
		cl.Shutdown()
		return "", nil, nil, nil, nil, err
	}
	if js, err = jetstream.New(nc); err == nil {
		snoop, err = SnoopAcks(cl.URL(0))
	}
	if err != nil {
		nc.Close()
		cl.Shutdown()
		return "", nil, nil, nil, nil, err
	}
	pids = func() []int {
		var ps []int
		for i := range cl.Len() {
			ps = append(ps, cl.Pid(i))
		}
		return ps
	}
	return cl.URLs(), js, snoop, pids, func() { snoop.Close(); nc.Close(); cl.Shutdown() }, nil
}

// rateTarget runs the search and the hold into an R`replicas` stream.
func (h *harness) rateTarget(ctx context.Context, ro RateOptions, frames *rateFrames, replicas int) (*RateResult, error) {
	url, js, snoop, pids, stopNATS, err := h.rateNATS(replicas)
	if err != nil {
		return nil, fmt.Errorf("nats: %w", err)
	}
	defer stopNATS()
	id := h.next()
	stream, cluster := "RATE"+id, "rate"+id
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: stream, Subjects: []string{"k8s." + cluster + ".>"}, Storage: jetstream.FileStorage, Replicas: replicas,
		Duplicates: 10 * time.Minute, Discard: jetstream.DiscardOld, MaxBytes: ro.StreamBytes,
	}); err != nil {
		return nil, err
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = js.DeleteStream(dctx, stream)
		_ = js.DeleteStream(dctx, "KV_relayd-index-"+cluster)
	}()
	p := newPacer(frames)
	srv := NewServer(&Replay{Version: "v1", Resource: "pods", Kind: "Pod", Namespaced: true, ListRV: strconv.Itoa(rateFirstRV - 1), Paced: p.serve})
	defer srv.Close()
	kc := filepath.Join(h.o.WorkDir, "replay-"+id+".kubeconfig")
	if err := srv.WriteKubeconfig(kc); err != nil {
		return nil, err
	}
	r, err := h.startRelayd(ctx, fmt.Sprintf("rate-r%d-%s", replicas, id), rateConfig(url, cluster, stream, replicas), kc, "")
	if err != nil {
		return nil, err
	}
	defer func() { _ = r.Stop(time.Minute) }()
	if err := r.waitReady(ctx, 2*time.Minute); err != nil {
		return nil, err
	}
	select {
	case <-p.open:
	case <-time.After(time.Minute):
		return nil, errors.New("relayd opened no watch within a minute")
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	e := &rateEnv{h: h, r: r, p: p, js: js, snoop: snoop, stream: stream, natsPids: pids}
	res := &RateResult{Replicas: replicas}
	defer func() { res.Paced = p.sent.Load() }()
	if err := e.search(ctx, ro, res); err != nil {
		return res, err
	}
	if res.Knee > 0 {
		for i, rate := range []float64{res.Knee, roundRate(res.Knee * 0.9)} {
			pr, err := e.probe(ctx, rate, ro.Hold, true)
			res.Holds = append(res.Holds, pr)
			h.logf("bench: rate R%d: hold %s", replicas, pr.line())
			if err != nil {
				return res, err
			}
			if pr.Held || i == 1 {
				break
			}
		}
	}
	if ro.Verify {
		res.Paced = p.sent.Load()
		if err := e.verify(ctx, res); err != nil {
			return res, err
		}
	}
	return res, nil
}

// rateConfig is relayd's config for the rate step: one pod source from
// now on (no snapshot), its index bucket with the stream's replicas.
func rateConfig(url, cluster, stream string, replicas int) string {
	return fmt.Sprintf(`cluster: %s
nats:
  url: %s
  index:
    replicas: %d
  stream:
    name: %s
    create: false
checkpoint:
  namespace: relayd
  name: relayd-checkpoint
%s
sources:
  - {name: pods, apiVersion: v1, kind: Pod, initial: none}
`, cluster, url, replicas, stream, scaleWatchConfig)
}

// roundRate rounds a rate to 10 events/s (1 below 100).
func roundRate(r float64) float64 {
	if r < 100 {
		return math.Max(1, math.Round(r))
	}
	return math.Round(r/10) * 10
}

// search finds the knee: doubling from Start while probes hold (up to
// Max), halving while they fail (down to Start/32), then bisecting.
func (e *rateEnv) search(ctx context.Context, ro RateOptions, res *RateResult) error {
	var lo, hi float64 // highest held, lowest failed
	for r := ro.Start; ; {
		pr, err := e.probe(ctx, r, ro.Probe, false)
		res.Probes = append(res.Probes, pr)
		e.h.logf("bench: rate R%d: probe %s", res.Replicas, pr.line())
		if err != nil {
			return err
		}
		if pr.Held {
			lo = r
		} else {
			hi = r
		}
		switch {
		case hi == 0 && r >= ro.Max:
			res.Knee, res.AtMax = lo, true
			return nil
		case hi == 0:
			r = math.Min(2*r, ro.Max)
		case lo == 0 && r/2 < ro.Start/32:
			return nil // none held
		case lo == 0:
			r = roundRate(r / 2)
		case hi <= lo*(1+ro.Precision) || roundRate((lo+hi)/2) <= lo || roundRate((lo+hi)/2) >= hi:
			res.Knee = lo
			return nil
		default:
			r = roundRate((lo + hi) / 2)
		}
	}
}

// rateCPU is a sample of the CPU time of the processes of the step.
type rateCPU struct {
	relayd, harness, machine time.Duration
	wait                     time.Duration // relayd's run-queue wait
	nats                     []time.Duration
}

func (e *rateEnv) cpu() (rateCPU, error) {
	var c rateCPU
	var err, err2, err3 error
	c.relayd, err = e.r.CPU()
	c.harness, err2 = procCPU(os.Getpid())
	c.machine, err3 = machineCPU()
	sched, err4 := e.r.Sched()
	c.wait = sched.Wait
	if err := errors.Join(err, err2, err3, err4); err != nil {
		return c, err
	}
	for _, pid := range e.natsPids() {
		n, err := procCPU(pid)
		if err != nil {
			return c, err
		}
		c.nats = append(c.nats, n)
	}
	return c, nil
}

// machineCPU is the busy time of every CPU of the machine (/proc/stat:
// user, nice, system, irq, softirq, steal).
func machineCPU() (time.Duration, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, fmt.Errorf("bench: unexpected /proc/stat: %q", line)
	}
	var busy int64
	for _, i := range []int{1, 2, 3, 6, 7, 8} {
		n, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return 0, err
		}
		busy += n
	}
	return time.Duration(busy) * clockTick, nil
}

func (e *rateEnv) lastSeq(ctx context.Context) (uint64, error) {
	s, err := e.js.Stream(ctx, e.stream)
	if err != nil {
		return 0, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, err
	}
	return info.State.LastSeq, nil
}

// position is the stream's last sequence and how many of its messages are
// relayd's control messages (heartbeats, sync markers: subjects
// <prefix>.<cluster>._relayd.>), from one stream info, so both are of the
// same moment.
func (e *rateEnv) position(ctx context.Context) (seq uint64, control int64, err error) {
	s, err := e.js.Stream(ctx, e.stream)
	if err != nil {
		return 0, 0, err
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter("*.*._relayd.>"))
	if err != nil {
		return 0, 0, err
	}
	for _, n := range info.State.Subjects {
		control += int64(n)
	}
	return info.State.LastSeq, control, nil
}

// probe paces rate events/s for d and measures it until every paced event
// is acknowledged. A probe stops early once it cannot hold: a backlog over
// rateMaxBehind, or (holds: read → PubAck scraped every 5 s) more than 1%
// of its events over 50 ms. An error is a failure of the run (relayd gone,
// an event lost or stored twice), not a rate that does not hold.
func (e *rateEnv) probe(ctx context.Context, rate float64, d time.Duration, hold bool) (RateProbe, error) {
	n := int64(rate * d.Seconds())
	pr := RateProbe{Rate: rate, Planned: d.Seconds()}
	seq0, ctl0, err := e.position(ctx)
	if err != nil {
		return pr, err
	}
	acked0 := e.snoop.Count(e.stream)
	m0, err := Scrape(ctx, e.r.metrics)
	if err != nil {
		return pr, err
	}
	if hold {
		_, _ = e.r.ResetPeakRSS() // VmHWM read at the end covers the hold (if the kernel allows the reset)
	}
	c0, err := e.cpu()
	if err != nil {
		return pr, err
	}
	stop := make(chan struct{})
	stopOnce := sync.OnceFunc(func() { close(stop) })
	defer stopOnce()
	start, done, err := e.p.pace(ctx, rate, n, stop)
	if err != nil {
		return pr, err
	}
	lag := map[string]string{"source": "pods"}
	behind := func(now time.Time) float64 {
		sched := min(n, int64(rate*now.Sub(start).Seconds()))
		return float64(sched-(e.snoop.Count(e.stream)-acked0)) / rate
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	lastScrape := time.Now()
	var pd paceDone
pacing:
	for {
		select {
		case pd = <-done:
			break pacing
		case <-ctx.Done():
			stopOnce()
			<-done
			return pr, ctx.Err()
		case now := <-tick.C:
			if err := e.r.alive(); err != nil {
				stopOnce()
				<-done
				return pr, err
			}
			b := behind(now)
			if now.Sub(start) >= rateWarmUp {
				pr.MaxBehind = math.Max(pr.MaxBehind, b)
			}
			if b > 2*rateMaxBehind && pr.Why == "" {
				pr.Why = fmt.Sprintf("backlog over %.1f s of events: stopped after %.1f s", 2*rateMaxBehind, now.Sub(start).Seconds())
				stopOnce()
			}
			if hold && now.Sub(lastScrape) >= 5*time.Second && pr.Why == "" {
				lastScrape = now
				if m, err := Scrape(ctx, e.r.metrics); err == nil {
					if over := histOver(m0, m, lag, rateP99); over > 0.01*float64(n) {
						pr.Why = fmt.Sprintf("%.0f events over 50 ms, more than 1%% of the %d planned: stopped after %.1f s", over, n, now.Sub(start).Seconds())
						stopOnce()
					}
				}
			}
		}
	}
	pacedEnd := time.Now()
	pr.Paced, pr.Sent = pacedEnd.Sub(start).Seconds(), pd.sent
	if pd.err != nil {
		return pr, fmt.Errorf("pacer: %w", pd.err)
	}
	// Until every paced event is acknowledged, still sampling the backlog.
	schedEnd := start.Add(time.Duration(float64(pd.sent) / rate * float64(time.Second)))
	for e.snoop.Count(e.stream)-acked0 < pd.sent {
		if time.Since(pacedEnd) > rateStuck {
			return pr, fmt.Errorf("%d of %d paced events acknowledged %v after the last", e.snoop.Count(e.stream)-acked0, pd.sent, rateStuck)
		}
		if err := e.r.alive(); err != nil {
			return pr, err
		}
		pr.MaxBehind = math.Max(pr.MaxBehind, float64(pd.sent-(e.snoop.Count(e.stream)-acked0))/rate)
		select {
		case <-ctx.Done():
			return pr, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	last := e.snoop.LastAck()
	pr.Drain = math.Max(0, last.Sub(schedEnd).Seconds())
	pr.Window = last.Sub(start).Seconds()
	c1, err := e.cpu()
	if err != nil {
		return pr, err
	}
	m1, err := Scrape(ctx, e.r.metrics)
	if err != nil {
		return pr, err
	}
	seq1, ctl1, err := e.position(ctx)
	if err != nil {
		return pr, err
	}
	// relayd's heartbeats and sync markers stored meanwhile are not paced
	// events (a heartbeat of the 1m default lands in a few-second probe now
	// and then).
	pr.Stored, pr.Acked = int64(seq1-seq0)-(ctl1-ctl0), e.snoop.Count(e.stream)-acked0
	if pr.RSS, pr.HWM, err = e.r.Mem(); err != nil {
		return pr, err
	}
	pr.RelaydCPU, pr.HarnessCPU, pr.MachineCPU = (c1.relayd - c0.relayd).Seconds(), (c1.harness - c0.harness).Seconds(), (c1.machine - c0.machine).Seconds()
	pr.RelaydWait = (c1.wait - c0.wait).Seconds()
	for i := range min(len(c0.nats), len(c1.nats)) {
		pr.NATSCPU = append(pr.NATSCPU, (c1.nats[i] - c0.nats[i]).Seconds())
	}
	pr.P50 = HistogramQuantile(.5, "relayd_publish_lag_seconds", lag, m0, m1)
	pr.P99 = HistogramQuantile(.99, "relayd_publish_lag_seconds", lag, m0, m1)
	if total := m1.Sum("relayd_publish_lag_seconds_count", lag) - m0.Sum("relayd_publish_lag_seconds_count", lag); total > 0 {
		pr.Over50 = histOver(m0, m1, lag, rateP99) / total
	}
	if pr.Stored != pr.Sent {
		return pr, fmt.Errorf("%d events paced at %.0f/s, %d stored in the stream (sequence %d → %d)", pr.Sent, rate, pr.Stored, seq0, seq1)
	}
	switch {
	case pr.Why != "":
	case pr.Over50 > 0.01:
		pr.Why = fmt.Sprintf("read → PubAck p99 over 50 ms (%.2f%% of the events)", pr.Over50*100)
	case pr.MaxBehind > rateMaxBehind:
		pr.Why = fmt.Sprintf("backlog up to %.2f s of events", pr.MaxBehind)
	case pr.Drain > rateMaxDrain:
		pr.Why = fmt.Sprintf("last PubAck %.2f s after the last event was due", pr.Drain)
	}
	pr.Held = pr.Why == ""
	time.Sleep(500 * time.Millisecond) // a breath between probes
	return pr, nil
}

// histOver is the number of observations of relayd_publish_lag_seconds
// above the bucket bound le between two scrapes.
func histOver(before, after Samples, match map[string]string, le float64) float64 {
	bound := map[string]string{"le": strconv.FormatFloat(le, 'g', -1, 64)}
	for k, v := range match {
		bound[k] = v
	}
	total := after.Sum("relayd_publish_lag_seconds_count", match) - before.Sum("relayd_publish_lag_seconds_count", match)
	return total - (after.Sum("relayd_publish_lag_seconds_bucket", bound) - before.Sum("relayd_publish_lag_seconds_bucket", bound))
}

func (p *RateProbe) line() string {
	held := "held"
	if !p.Held {
		held = "did not hold: " + p.Why
	}
	return fmt.Sprintf("%.0f events/s for %.1f s: %d sent, %d stored; read→PubAck p50 %s p99 %s (%.2f%% over 50 ms); backlog ≤ %.2f s; CPU/event relayd %.0f µs (waited %.0f µs for a CPU), nats %.0f µs, harness %.0f µs; machine %.2f cores; %s",
		p.Rate, p.Paced, p.Sent, p.Stored, msHist(p.P50), msHist(p.P99), p.Over50*100, p.MaxBehind,
		p.CPUPerEvent()*1e6, perEvent(p.RelaydWait, p.Stored), perEvent(p.natsCPU(), p.Stored), perEvent(p.HarnessCPU, p.Stored), p.MachineCPU/math.Max(p.Window, 1e-9), held)
}

func perEvent(cpu float64, n int64) float64 {
	if n == 0 {
		return 0
	}
	return cpu / float64(n) * 1e6
}

// verify reads the stream and counts the paced events in it (each
// resourceVersion from rateFirstRV on is one paced event).
func (e *rateEnv) verify(ctx context.Context, res *RateResult) error {
	seq, err := e.lastSeq(ctx)
	if err != nil {
		return err
	}
	seen := map[int64]int{}
	var foreign int64
	if seq > 0 {
		cons, err := e.js.OrderedConsumer(ctx, e.stream, jetstream.OrderedConsumerConfig{})
		if err != nil {
			return err
		}
		for read := uint64(0); read < seq; {
			batch, err := cons.Fetch(500, jetstream.FetchMaxWait(10*time.Second))
			if err != nil {
				return err
			}
			got := 0
			for m := range batch.Messages() {
				got++
				md, err := m.Metadata()
				if err != nil {
					return err
				}
				read = md.Sequence.Stream
				if _, err := event.ParseControlSubject(m.Subject()); err == nil {
					continue // relayd's heartbeats (and markers): not paced events
				}
				ev, err := event.DecodeMessage(m.Headers(), m.Data())
				rv, perr := strconv.ParseInt(ev.K8sResourceVersion, 10, 64)
				if err != nil || perr != nil || rv < rateFirstRV || rv >= rateFirstRV+res.Paced {
					foreign++
					continue
				}
				seen[rv]++
			}
			if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
				return err
			}
			if got == 0 {
				return fmt.Errorf("verify: read up to sequence %d of %d", read, seq)
			}
		}
	}
	res.Verified, res.Foreign = true, foreign
	for rv := int64(rateFirstRV); rv < rateFirstRV+res.Paced; rv++ {
		switch seen[rv] {
		case 0:
			res.Missing++
		case 1:
			res.Found++
		default:
			res.Duplicated++
		}
	}
	return nil
}

// rateFrames are MODIFIED frames of n distinct pods made from the pod
// template, each cut around its resourceVersion: a frame is the two halves
// with a new resourceVersion between them.
type rateFrames struct {
	pre, post [][]byte
}

func newRateFrames(t *objTemplate, n int) (*rateFrames, error) {
	f := &rateFrames{}
	const mark = "999999999999999"
	for i := range n {
		b := t.frame("MODIFIED", i, 0, fmt.Sprintf("rate-%02d", i%10))
		b = bytes.Replace(b, []byte(`"resourceVersion":"0"`), []byte(`"resourceVersion":"`+mark+`"`), 1)
		pre, post, ok := bytes.Cut(b, []byte(mark))
		if !ok {
			return nil, errors.New("bench: no resourceVersion in the pod template")
		}
		f.pre, f.post = append(f.pre, pre), append(f.post, post)
	}
	return f, nil
}

// pacer writes paced frames to the watch the replay server hands it
// (Replay.Paced): one job (rate, count) at a time, asked for by pace.
type pacer struct {
	frames *rateFrames
	jobs   chan paceJob
	open   chan struct{} // closed when the watch is open
	gone   chan struct{} // closed when it ended
	once   sync.Once
	sent   atomic.Int64 // every frame written; the next resourceVersion is rateFirstRV+sent
}

type paceJob struct {
	rate  float64
	n     int64
	stop  <-chan struct{}
	start chan time.Time
	done  chan paceDone
}

type paceDone struct {
	sent int64
	err  error
}

func newPacer(f *rateFrames) *pacer {
	return &pacer{frames: f, jobs: make(chan paceJob), open: make(chan struct{}), gone: make(chan struct{})}
}

// pace starts a job: n frames at rate per second (fewer if stop closes).
func (p *pacer) pace(ctx context.Context, rate float64, n int64, stop <-chan struct{}) (time.Time, <-chan paceDone, error) {
	j := paceJob{rate: rate, n: n, stop: stop, start: make(chan time.Time, 1), done: make(chan paceDone, 1)}
	select {
	case p.jobs <- j:
		return <-j.start, j.done, nil
	case <-p.gone:
		return time.Time{}, nil, errors.New("relayd's watch ended")
	case <-ctx.Done():
		return time.Time{}, nil, ctx.Err()
	}
}

func (p *pacer) serve(ctx context.Context, send func([][]byte) error) {
	p.once.Do(func() { close(p.open) })
	defer close(p.gone)
	for {
		select {
		case <-ctx.Done():
			return
		case j := <-p.jobs:
			sent, err := p.run(ctx, send, j)
			j.done <- paceDone{sent, err}
			if err != nil {
				return
			}
		}
	}
}

// run writes j's frames on schedule: every frame due is sent at once (in
// batches of up to 256), then it sleeps until the next is due (at least
// 2 ms). A connection that blocks (relayd not reading) makes it fall
// behind its schedule; the backlog is then sent as fast as it drains.
func (p *pacer) run(ctx context.Context, send func([][]byte) error, j paceJob) (int64, error) {
	start := time.Now()
	j.start <- start
	var sent int64
	batch := make([][]byte, 0, 256)
	for sent < j.n {
		due := min(j.n, int64(j.rate*time.Since(start).Seconds())+1)
		if due > sent {
			batch = batch[:0]
			for sent+int64(len(batch)) < due && len(batch) < cap(batch) {
				i := p.sent.Load() + int64(len(batch))
				k := int(i % int64(len(p.frames.pre)))
				f := append(append(append(make([]byte, 0, len(p.frames.pre[k])+len(p.frames.post[k])+12), p.frames.pre[k]...),
					strconv.FormatInt(rateFirstRV+i, 10)...), p.frames.post[k]...)
				batch = append(batch, f)
			}
			if err := send(batch); err != nil {
				return sent, err
			}
			sent += int64(len(batch))
			p.sent.Add(int64(len(batch)))
			select {
			case <-j.stop:
				return sent, nil
			default:
			}
			continue
		}
		next := start.Add(time.Duration(float64(sent) / j.rate * float64(time.Second)))
		select {
		case <-ctx.Done():
			return sent, ctx.Err()
		case <-j.stop:
			return sent, nil
		case <-time.After(max(time.Until(next), 2*time.Millisecond)):
		}
	}
	return sent, nil
}
