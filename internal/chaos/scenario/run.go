// Package scenario runs relayd under injected faults against real servers
// (etcd + kube-apiserver child processes, embedded NATS JetStream, all on
// loopback) and checks the outcome with internal/chaos/history.
//
// A run: namespaces and a stream are created; a reference watch of etcd
// starts; relayd (built with -race and -tags failpoints,testbuild, run with
// RELAYD_INDEX_CHECK=1) starts under a keeper that restarts it whenever it
// dies, like a pod, and records every exit; a seeded writer creates,
// updates and deletes ConfigMaps and Widgets (a CRD) while the scenario's
// fault driver injects faults with quiet periods in between; then every
// fault is healed, relayd runs without failpoints until the stream is
// complete (or a drain timeout passes), is stopped with SIGTERM, and the
// history is checked. A failed run writes its history as JSON.
package scenario

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/template"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/relayd/relayd/internal/chaos/faultproxy"
	"github.com/relayd/relayd/internal/chaos/history"
	"github.com/relayd/relayd/internal/chaos/record"
	"github.com/relayd/relayd/internal/testenv"
)

// Env is what scenarios run against.
type Env struct {
	K8s       *testenv.Env // watch cache on (apiserver restart gives 410)
	K8sNoWC   *testenv.Env // watch cache off (compaction gives 410); may be nil
	NATS      *testenv.NATS
	RelaydBin string // built by BuildRelayd (-race, -tags failpoints,testbuild)
	// ArtifactDir receives the histories (JSON) and relayd logs of failed
	// runs.
	ArtifactDir string
	Logf        func(format string, args ...any)
}

// Scenario is one fault scenario.
type Scenario struct {
	Name string
	// NoWatchCache runs it against the apiserver with the watch cache off.
	NoWatchCache bool
	// ProxyAPI / ProxyNATS put a fault proxy between relayd and the server.
	ProxyAPI, ProxyNATS bool
	// StreamMaxMsgs > 0 pre-creates the stream with that limit and
	// discard-new (relayd does not create it).
	StreamMaxMsgs int64
	// Failpoints is RELAYD_FAILPOINTS while faults are injected; every
	// "{n}" becomes a random hit count in [5, 40) at each (re)start, so
	// relayd dies there again and again; "{n:LO-HI}" picks from [LO, HI).
	Failpoints string
	// Faults injects faults until ctx ends; it must mix them with quiet
	// periods and leave nothing broken that Heal does not repair.
	Faults func(ctx context.Context, r *Run)
	// MinFaults: the run fails if fewer faults were injected.
	MinFaults int
	// Tamper, if set, damages the stream after relayd stopped and before
	// the final check: a run of the checker against a known-bad stream.
	Tamper func(ctx context.Context, js jetstream.JetStream, stream string) error
	// RestartsServers: the scenario restarts the kube-apiserver, etcd or
	// NATS server it runs on, so no other scenario may use them meanwhile
	// (test/chaos runs it on a second set of servers, one at a time).
	RestartsServers bool
	// LongOnly keeps the scenario out of the short suite (`make test`);
	// the reason says why.
	LongOnly string
	// MinWriteFor stretches the writing phase (and so the fault phase) to
	// at least this long.
	MinWriteFor time.Duration
	// NATSCluster > 0 runs relayd against its own JetStream cluster of
	// that many servers (Run.Cluster) instead of Env.NATS, with the stream
	// and the index bucket replicated on all of them (cluster.go).
	NATSCluster int
	// UnencodableEvery > 0 gives every that many-th object a name so long
	// that its events fit the max payload of a NATS server of the run's
	// own only without data (unencodable.go).
	UnencodableEvery int
}

// Params bound a run.
type Params struct {
	Seed         uint64
	Writes       int
	WriteFor     time.Duration
	Pace         time.Duration
	Objects      int
	DrainTimeout time.Duration
	// Filter adds the filtered source (scoped, shaping.go) to the config.
	Filter bool
}

// Result is a run's outcome.
type Result struct {
	Scenario string
	Seed     uint64
	Report   history.Report
	Faults   []history.Fault
	Restarts int // relayd restarts by the keeper
	Crashes  int // of which relayd died at an armed failpoint's kill (an exit the run did not ask for is a failure, not a crash)
	Writes   int // acknowledged writes
	Duration time.Duration
	// Err is a failure outside the checker (setup, relayd exit code,
	// too few faults).
	Err          error
	HistoryFile  string
	RelaydLogDir string
}

// OK reports whether the run passed.
func (r Result) OK() bool { return r.Err == nil && r.Report.OK() }

// Run is one running scenario, handed to the fault driver.
type Run struct {
	Env  *Env
	K8s  *testenv.Env
	Rng  *rand.Rand
	proc *proc

	APIProxy, NATSProxy *faultproxy.Proxy
	Cluster             *testenv.NATSCluster // Scenario.NATSCluster's servers, else nil
	js                  jetstream.JetStream
	stream              string

	mu       sync.Mutex
	faults   []history.Fault
	natsDown bool

	rec recoveryState // recovery.go
	cfg configState   // relists.go
}

// Fault records an injected fault, now.
func (r *Run) Fault(kind, detail string) { r.FaultAt(time.Now(), kind, detail, 0) }

// FaultAt records a fault that took effect at at; rev is the etcd revision
// it ends history at (see history.Fault), 0 for none.
func (r *Run) FaultAt(at time.Time, kind, detail string, rev int64) {
	r.mu.Lock()
	r.faults = append(r.faults, history.Fault{At: at, Kind: kind, Detail: detail, Rev: rev})
	r.mu.Unlock()
	if r.Env.Logf != nil {
		r.Env.Logf("fault %s %s (rev %d)", kind, detail, rev)
	}
}

// RestartAPIServer restarts kube-apiserver: gracefully (SIGTERM, kind
// apiserver-restart) or with SIGKILL (kind apiserver-kill9), on the same
// port. The fault is recorded as of the stop, with the etcd revision once
// the apiserver is ready again: its new watch cache starts at or before it,
// so a watch from an older position may get 410.
func (r *Run) RestartAPIServer(ctx context.Context, kill bool) error {
	ctx = context.WithoutCancel(ctx)
	kind, t0 := history.FaultAPIServerRestart, time.Now()
	var err error
	if kill {
		kind = history.FaultAPIServerKill9
		err = r.K8s.KillRestartAPIServer(ctx)
	} else {
		err = r.K8s.RestartAPIServer(ctx)
	}
	if err != nil {
		r.Fault("error", fmt.Sprintf("%s: %v", kind, err))
		return err
	}
	rev, err := r.K8s.EtcdRevision(ctx)
	if err != nil {
		r.Fault("error", fmt.Sprintf("%s: etcd revision: %v", kind, err))
		return err
	}
	r.FaultAt(t0, kind, "back after "+time.Since(t0).Round(time.Millisecond).String(), rev)
	return nil
}

// RestartEtcd kills etcd (SIGKILL) while everything else runs, keeps it
// down for down, and starts it again on the same data directory and ports.
// Recorded like RestartAPIServer (kind etcd-restart): the apiserver's watch
// cache re-initialises once its etcd watch broke, with the same effect on
// old positions.
func (r *Run) RestartEtcd(ctx context.Context, down time.Duration) error {
	ctx = context.WithoutCancel(ctx)
	t0 := time.Now()
	r.K8s.KillEtcd()
	time.Sleep(down)
	if err := r.K8s.StartEtcdAgain(ctx); err != nil {
		r.Fault("error", fmt.Sprintf("%s: %v", history.FaultEtcdRestart, err))
		return err
	}
	if err := r.K8s.WaitAPIServerReady(ctx, 60*time.Second); err != nil {
		r.Fault("error", fmt.Sprintf("%s: %v", history.FaultEtcdRestart, err))
		return err
	}
	rev, err := r.K8s.EtcdRevision(ctx)
	if err != nil {
		r.Fault("error", fmt.Sprintf("%s: etcd revision: %v", history.FaultEtcdRestart, err))
		return err
	}
	r.FaultAt(t0, history.FaultEtcdRestart, fmt.Sprintf("down %v, apiserver ready after %v", down.Round(time.Millisecond), time.Since(t0).Round(time.Millisecond)), rev)
	return nil
}

// Compact compacts etcd at its current revision (kind etcd-compact, with
// the compaction revision).
func (r *Run) Compact(ctx context.Context) {
	t0 := time.Now()
	rev, err := r.K8s.CompactNow(context.WithoutCancel(ctx))
	if err != nil {
		r.Fault("error", fmt.Sprintf("%s: %v", history.FaultEtcdCompact, err))
		return
	}
	r.FaultAt(t0, history.FaultEtcdCompact, fmt.Sprintf("revision %d", rev), rev)
}

// Sleep waits d or until ctx ends; false if ctx ended.
func Sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// Between is a random duration in [lo, hi).
func (r *Run) Between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(r.Rng.Int64N(int64(hi-lo)))
}

// Kill9 kills relayd with SIGKILL (the keeper restarts it).
func (r *Run) Kill9() {
	if r.proc.signal(sigKill) {
		r.Fault("kill-9", "")
	}
}

// Down kills relayd with SIGKILL and keeps it down for d, then calls
// during (if not nil) before it is restarted: a long outage.
func (r *Run) Down(ctx context.Context, d time.Duration, during func()) {
	r.proc.setHold(true)
	r.proc.signal(sigKill)
	r.Fault("kill-9-down", d.Round(time.Millisecond).String())
	Sleep(ctx, d)
	if during != nil {
		during()
	}
	r.proc.setHold(false)
}

// Pause stops relayd with SIGSTOP for d, then SIGCONT.
func (r *Run) Pause(ctx context.Context, d time.Duration) {
	r.proc.signal(sigStop)
	r.Fault("sigstop", d.Round(time.Millisecond).String())
	Sleep(ctx, d)
	r.proc.signal(sigCont)
}

// StopNATS / StartNATS kill and restart nats-server (same port and store).
func (r *Run) StopNATS() {
	r.mu.Lock()
	r.natsDown = true
	r.mu.Unlock()
	r.Env.NATS.Stop()
	r.Fault("nats-stop", "")
}

// StartNATS restarts nats-server.
func (r *Run) StartNATS() error {
	err := r.Env.NATS.Start()
	if err == nil {
		r.mu.Lock()
		r.natsDown = false
		r.mu.Unlock()
	}
	return err
}

// SetStreamMaxMsgs changes the stream's message limit.
func (r *Run) SetStreamMaxMsgs(ctx context.Context, n int64) error {
	s, err := r.js.Stream(ctx, r.stream)
	if err != nil {
		return err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return err
	}
	cfg := info.Config
	cfg.MaxMsgs = n
	_, err = r.js.UpdateStream(ctx, cfg)
	return err
}

// StreamMsgs is the stream's message count and limit.
func (r *Run) StreamMsgs(ctx context.Context) (msgs uint64, limit int64, err error) {
	s, err := r.js.Stream(ctx, r.stream)
	if err != nil {
		return 0, 0, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, 0, err
	}
	return info.State.Msgs, info.Config.MaxMsgs, nil
}

const cfgTemplate = `
cluster: {{.Cluster}}
nats:
  url: {{.URL}}
  publishTimeout: 2s
  maxInFlight: 32
  stream:
    name: {{.Stream}}
    create: {{.Create}}
    duplicateWindow: 10m
{{- if .Replicas}}
    replicas: {{.Replicas}}
  index:
    replicas: {{.Replicas}}
{{- end}}
checkpoint:
  namespace: {{.CPNS}}
  name: cp
  flushInterval: 200ms
watch:
  timeout: 30s
  idleTimeout: 35s
  relistBackoff: {initial: 200ms, max: 2s}
shutdown:
  drainTimeout: 15s
sources:
  - name: cms
    apiVersion: v1
    kind: ConfigMap
    namespaces: [{{.NS}}]
  - name: widgets
    apiVersion: example.com/v1
    kind: Widget
    namespaces: [{{.NS}}]
{{.Shaped}}`

// minWritesPerSource and minScopedWrites: the writing phase goes on
// (within its stretch) until every source, and the filtered one, has that
// many acknowledged writes.
const (
	minWritesPerSource = 10
	minScopedWrites    = 20
)

var runSeq atomic.Int64 // scenarios run concurrently (test/chaos lanes)

// Execute runs scenario s with params p.
func Execute(ctx context.Context, e *Env, s Scenario, p Params) (res Result) {
	t0 := time.Now()
	res = Result{Scenario: s.Name, Seed: p.Seed}
	defer func() { res.Duration = time.Since(t0) }()
	k8s := e.K8s
	if s.NoWatchCache {
		k8s = e.K8sNoWC
	}
	if k8s == nil {
		res.Err = errors.New("scenario needs the apiserver without watch cache; none given")
		return res
	}
	tag := fmt.Sprintf("%s-%d-%d", strings.ToLower(s.Name), runSeq.Add(1), time.Now().UnixNano()%1e6)
	ns, cpNS, cluster, stream := "chaos-"+tag, "chaos-cp-"+tag, "c"+strings.ReplaceAll(tag, "-", ""), "CHAOS"+strings.ReplaceAll(strings.ToUpper(tag), "-", "")
	if len(ns) > 60 {
		ns, cpNS = ns[:60], cpNS[:60]
	}
	dir, err := os.MkdirTemp("", "relayd-chaos-"+tag+"-")
	if err != nil {
		res.Err = err
		return res
	}
	keepDir := false
	defer func() {
		if !keepDir {
			_ = os.RemoveAll(dir)
		}
	}()
	rc := k8s.AdminConfig()
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		res.Err = err
		return res
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		res.Err = err
		return res
	}
	if err := k8s.InstallWidgetCRD(ctx); err != nil {
		res.Err = err
		return res
	}
	sh := shapedSources(ns, p.Filter, p.Objects)
	if err := record.InstallGadgetCRD(ctx, rc); err != nil {
		res.Err = err
		return res
	}
	for _, n := range append([]string{ns, cpNS}, sh.namespaces...) {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			res.Err = err
			return res
		}
	}
	if _, err := cs.CoreV1().ConfigMaps(cpNS).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cp"}}, metav1.CreateOptions{}); err != nil {
		res.Err = err
		return res
	}
	e, stopOwn, err := ownNATS(e, s, cluster, ns, stream)
	if err != nil {
		res.Err = err
		return res
	}
	defer stopOwn()
	jsc, err := startNATSCluster(s)
	if err != nil {
		res.Err = err
		return res
	}
	if jsc != nil {
		defer jsc.Shutdown()
	}
	nc, err := nats.Connect(runNATSURL(e, jsc), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		res.Err = err
		return res
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		res.Err = err
		return res
	}
	if s.StreamMaxMsgs > 0 {
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{
			Name: stream, Subjects: []string{"k8s." + cluster + ".>"}, Discard: jetstream.DiscardNew,
			MaxMsgs: s.StreamMaxMsgs, Duplicates: 10 * time.Minute, Storage: jetstream.FileStorage,
		})
		if err != nil {
			res.Err = err
			return res
		}
	}

	kinds := append(writerKinds(s), sh.kinds...)
	rev, err := k8s.EtcdRevision(ctx)
	if err != nil {
		res.Err = err
		return res
	}
	ref, err := record.StartReference(ctx, k8s.EtcdEndpoint(), rev, append([]record.Prefix{
		{Key: "/registry/configmaps/" + ns + "/", Source: "cms"},
		{Key: "/registry/example.com/widgets/" + ns + "/", Source: "widgets"},
	}, append(sh.prefixes,
		// Every write of the checkpoint (history.CheckpointWrite).
		record.Prefix{Key: "/registry/configmaps/" + cpNS + "/cp", Checkpoint: sh.cpKeysWith(map[string]string{"cms." + ns: "cms", "widgets." + ns: "widgets"})})...))
	if err != nil {
		res.Err = err
		return res
	}
	defer ref.Close()

	r := &Run{Env: e, K8s: k8s, Rng: rand.New(rand.NewPCG(p.Seed, 7)), js: js, stream: stream, Cluster: jsc}
	r.rec = newRecoveryState(cs, cpNS, sh.cpKeysWith(map[string]string{"cms." + ns: "cms", "widgets." + ns: "widgets"}), "relayd-index-"+cluster)
	apiHost, natsURL := k8s.Host(), runNATSURL(e, jsc)
	if s.ProxyAPI {
		if r.APIProxy, err = faultproxy.New(strings.TrimPrefix(apiHost, "https://")); err != nil {
			res.Err = err
			return res
		}
		defer r.APIProxy.Close()
		apiHost = "https://" + r.APIProxy.Addr()
	}
	if s.ProxyNATS {
		if r.NATSProxy, err = faultproxy.New(strings.TrimPrefix(natsURL, "nats://")); err != nil {
			res.Err = err
			return res
		}
		defer r.NATSProxy.Close()
		natsURL = "nats://" + r.NATSProxy.Addr()
	}
	kc, conf := filepath.Join(dir, "kubeconfig"), filepath.Join(dir, "config.yaml")
	if err := k8s.WriteKubeconfig(kc, false); err != nil {
		res.Err = err
		return res
	}
	if err := rewriteServer(kc, apiHost); err != nil {
		res.Err = err
		return res
	}
	var b bytes.Buffer
	_ = template.Must(template.New("cfg").Parse(cfgTemplate)).Execute(&b, map[string]any{
		"Cluster": cluster, "URL": natsURL, "Stream": stream, "Create": s.StreamMaxMsgs == 0, "CPNS": cpNS, "NS": ns,
		"Replicas": s.NATSCluster, "Shaped": sh.yaml,
	})
	if err := os.WriteFile(conf, b.Bytes(), 0o600); err != nil {
		res.Err = err
		return res
	}
	r.cfg = configState{path: conf, text: b.String()}
	if p.Filter {
		r.cfg.filter = scopeFilter
	}
	r.proc = &proc{bin: e.RelaydBin, conf: conf, kc: kc, log: filepath.Join(dir, "relayd.log"), rng: rand.New(rand.NewPCG(p.Seed, 11))}
	if err := r.proc.start(); err != nil {
		res.Err = err
		return res
	}
	defer r.proc.kill()

	// The guarantee covers changes after a checkpoint: writes start once
	// relayd has written one for both watches (its initial snapshot is
	// state, not history).
	if err := waitCheckpoint(ctx, cs, cpNS, slices.Collect(maps.Keys(sh.cpKeysWith(map[string]string{"cms." + ns: "", "widgets." + ns: ""})))...); err != nil {
		res.Err = err
		return res
	}

	if s.Failpoints != "" {
		// Armed from here on: restart relayd with them (not a fault).
		r.proc.setFailpoints(s.Failpoints)
		r.proc.signal(sigKill)
	}

	sampler := record.NewSampler(cs, js, stream, cpNS, "cp", sh.cpKeysWith(map[string]string{"cms." + ns: "cms", "widgets." + ns: "widgets"}))
	sctx, scancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); sampler.Run(sctx, 300*time.Millisecond) }()
	defer func() { scancel(); wg.Wait() }()

	writeFor, maxWrites := p.WriteFor, p.Writes
	if s.MinWriteFor > writeFor {
		// Stretched: the same write rate for longer.
		maxWrites = int(float64(maxWrites) * float64(s.MinWriteFor) / float64(writeFor))
		writeFor = s.MinWriteFor
	}
	// A slow fault (an apiserver restart on a busy machine takes seconds)
	// can use up the whole writing phase. The phase then goes on, at the
	// same write rate, until MinFaults faults were injected, up to
	// maxStretch times its length; a run that still has too few fails
	// below.
	const maxStretch = 4
	phaseStart := time.Now()
	// So does it until every source has minWritesPerSource acknowledged
	// writes (the filtered one minScopedWrites) and objects entered and
	// left the filtered source's scope (in the reference): a run whose faults kept the apiserver down most of
	// the time would otherwise check next to nothing (check evidence).
	var writer *record.Writer
	done := func(acked int) bool {
		if acked < maxWrites && time.Since(phaseStart) < writeFor {
			return false
		}
		by := writer.AckedBy()
		for _, k := range kinds {
			want := minWritesPerSource
			if _, ok := sh.filters[k.Source]; ok {
				want = minScopedWrites
			}
			if by[k.Source] < want {
				return false
			}
		}
		if len(sh.filters) > 0 {
			changes, _ := ref.Changes()
			for src, f := range sh.filters {
				if entered, left := scopeMoves(changes, src, f); entered == 0 || left == 0 {
					return false
				}
			}
		}
		_, crashes := r.proc.counts()
		return r.injected()+crashes >= s.MinFaults
	}
	writer = record.NewWriter(dyn, record.WriterOptions{Seed: p.Seed, Namespace: ns, Kinds: kinds, Objects: p.Objects,
		MaxWrites: maxWrites * maxStretch, Duration: writeFor * maxStretch, Pace: p.Pace, Done: done})
	wctx, wcancel := context.WithCancel(ctx)
	fdone := make(chan struct{})
	go func() {
		defer close(fdone)
		if s.Faults != nil {
			s.Faults(wctx, r)
		}
	}()
	writer.Run(ctx)
	wcancel()
	<-fdone

	// Heal everything, then let relayd (without failpoints) drain.
	if r.APIProxy != nil {
		r.APIProxy.Heal()
	}
	if r.NATSProxy != nil {
		r.NATSProxy.Heal()
	}
	r.mu.Lock()
	down := r.natsDown
	r.mu.Unlock()
	if down {
		if err := r.StartNATS(); err != nil {
			res.Err = err
			return res
		}
	}
	if err := r.healCluster(); err != nil {
		res.Err = err
		return res
	}
	if s.StreamMaxMsgs > 0 {
		if err := r.SetStreamMaxMsgs(ctx, -1); err != nil {
			res.Err = fmt.Errorf("lift the stream limit: %w", err)
			return res
		}
	}
	r.proc.setHold(false)
	r.proc.signal(sigCont)
	if s.Failpoints != "" {
		r.proc.setFailpoints("")
		r.proc.signal(sigKill) // restart without failpoints (not counted as a fault)
	}

	h := &history.History{Scenario: s.Name, Seed: p.Seed, Sources: append([]string{"cms", "widgets"}, sh.sources()...), Started: t0,
		Unencodable: unencodableNames(s, kinds, p.Objects), Shaping: sh.shaping, Filters: sh.filters}
	collect := func() error {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		changes, rerr := ref.Changes()
		if rerr != nil {
			return rerr
		}
		h.Reference = changes
		h.Checkpoints = ref.Checkpoints()
		h.Writes = writer.Writes()
		if h.Stream, h.DuplicateWindow, err = record.ReadStreamShaped(cctx, js, stream, sh.shaping); err != nil {
			return err
		}
		h.Exits = r.proc.exitLog()
		if h.Final, h.FinalRV, err = record.FinalList(cctx, dyn, ns, kinds); err != nil {
			return err
		}
		sampler.Record(h)
		r.mu.Lock()
		h.Faults = append([]history.Fault(nil), r.faults...)
		r.mu.Unlock()
		return nil
	}
	deadline := time.Now().Add(p.DrainTimeout)
	var rep history.Report
	for {
		Sleep(ctx, time.Second)
		if err := collect(); err != nil {
			if time.Now().After(deadline) {
				res.Err = fmt.Errorf("collect the history: %w", err)
				break
			}
			continue
		}
		rep = history.Check(h)
		if (settled(rep) && r.proc.alive()) || time.Now().After(deadline) {
			break
		}
	}
	scancel()
	wg.Wait()
	if res.Err == nil {
		if err := r.proc.term(30 * time.Second); err != nil {
			res.Err = err
		}
		if s.Tamper != nil {
			if err := s.Tamper(ctx, js, stream); err != nil {
				res.Err = fmt.Errorf("tamper: %w", err)
			}
		}
		// The last checkpoint samples and anything published at shutdown.
		if err := collect(); err != nil && res.Err == nil {
			res.Err = err
		}
		rep = history.Check(h)
	}
	h.Ended = time.Now()
	res.Report = rep
	res.Faults = h.Faults
	res.Restarts, res.Crashes = r.proc.counts()
	for _, w := range h.Writes {
		if w.Acked() {
			res.Writes++
		}
	}
	if n := r.injected(); n+res.Crashes < s.MinFaults && res.Err == nil {
		res.Err = fmt.Errorf("only %d faults injected (%d failpoint crashes), want at least %d", n, res.Crashes, s.MinFaults)
	}
	for _, f := range res.Faults {
		if f.Kind == "error" && res.Err == nil {
			res.Err = fmt.Errorf("a fault could not be injected (or healed) at %s: %s", f.At.Format("15:04:05.000"), f.Detail)
		}
	}
	if !res.OK() && e.ArtifactDir != "" {
		keepDir = true
		_ = os.MkdirAll(e.ArtifactDir, 0o755)
		res.HistoryFile = filepath.Join(e.ArtifactDir, fmt.Sprintf("history-%s.json", tag))
		if err := h.Save(res.HistoryFile); err != nil {
			res.HistoryFile = "(not saved: " + err.Error() + ")"
		}
		res.RelaydLogDir = dir
	}
	return res
}

// scopeMoves counts src's changes in changes (the reference, in order)
// that made an object enter and leave filter f's scope.
func scopeMoves(changes []history.Change, src string, f history.Filter) (entered, left int) {
	in := map[string]bool{}
	for _, ch := range changes {
		if ch.Source != src {
			continue
		}
		now := ch.Type != history.Deleted && f.Matches(ch.Labels)
		switch {
		case ch.Type == history.Modified && !in[ch.UID] && now:
			entered++
		case ch.Type == history.Modified && in[ch.UID] && !now:
			left++
		}
		in[ch.UID] = now
	}
	return entered, left
}

// injected counts the faults injected so far (not the errors injecting
// them).
func (r *Run) injected() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, f := range r.faults {
		if f.Kind != "error" {
			n++
		}
	}
	return n
}

// settled reports whether waiting cannot change rep's outcome: it passes,
// or its only failures are of what already happened (an exit the run did
// not ask for, an unexplained relist, a duplicate stored).
func settled(rep history.Report) bool {
	for _, f := range rep.Failures {
		switch f.Check {
		case "exit", "relist", "duplicate":
		default:
			return false
		}
	}
	return true
}

// rewriteServer points the kubeconfig's cluster at host (a proxy).
func rewriteServer(path, host string) error {
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		return err
	}
	for _, c := range cfg.Clusters {
		c.Server = host
	}
	return clientcmd.WriteToFile(*cfg, path)
}

// waitCheckpoint waits until the checkpoint ConfigMap has every key.
func waitCheckpoint(ctx context.Context, cs kubernetes.Interface, ns string, keys ...string) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for {
		cm, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, "cp", metav1.GetOptions{})
		missing := ""
		for _, k := range keys {
			if err != nil || cm.Data[k] == "" {
				missing = k
			}
		}
		if missing == "" {
			return nil
		}
		if !Sleep(ctx, 100*time.Millisecond) {
			return fmt.Errorf("relayd wrote no checkpoint for %s within 60s (last error: %v)", missing, err)
		}
	}
}
