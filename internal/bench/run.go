package bench

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/internal/testenv"
)

// Scenario names.
const (
	ScenarioCapacity = "capacity"
	ScenarioLatency  = "latency" // includes checkpoint writes
	ScenarioMemory   = "memory"
	ScenarioRecovery = "recovery"
)

// Options configures Run.
type Options struct {
	// Self is the program that implements `consume` and `natsd` (os.Args[0]
	// for relayd-bench; the test binary in the smoke test), started with
	// SelfEnv added to its environment.
	Self    string
	SelfEnv []string
	// RelaydBin is the relayd binary measured (bin/relayd). Empty: relayd
	// runs in-process in `Self consume -mode relayd`.
	RelaydBin string
	// CacheDir keeps recordings between runs; WorkDir gets configs, logs,
	// the NATS store and profiles.
	CacheDir, WorkDir string
	Record            RecordOptions
	// Repeat is how often each capacity measurement is taken (interleaved).
	Repeat    int
	Scenarios []string
	// Consumers limits the capacity scenario to these consumers (relayd,
	// dynamic, typed, relayd-shaped, ...); empty: all. Goals whose other
	// side did not run are reported as not measured.
	Consumers []string
	// Latency: writes per second, for how long, then how long to watch an
	// idle relayd for checkpoint writes.
	LatencyRate              int
	LatencyDuration, IdleFor time.Duration
	// Memory: object counts, and MODIFIED events replayed after the list
	// (they make the runtime collect garbage before the heap is read).
	MemSizes []int
	MemChurn int
	// RecoveryObjects is the number of ConfigMaps relisted after the 410.
	RecoveryObjects int
	// Profile takes a CPU profile of each capacity consumer (relayd
	// in-process) after the measured runs, into WorkDir/profiles.
	Profile bool
	Logf    func(format string, a ...any) `json:"-"`
}

func (o *Options) has(s string) bool {
	for _, x := range o.Scenarios {
		if x == s {
			return true
		}
	}
	return false
}

// harness holds what the scenarios share.
type harness struct {
	o       Options
	logf    func(string, ...any)
	natsd   *Child
	natsURL string
	nc      *nats.Conn
	js      jetstream.JetStream
	snoop   *AckSnoop
	env     *testenv.Env
	seq     atomic.Int64
	// restartProfile, if set, is where the next restart (h.restart) writes
	// a CPU profile of relayd, from its start to its steady state.
	restartProfile string
}

// Run records (or loads) the watch streams and runs the scenarios.
func Run(ctx context.Context, o Options) (*Report, error) {
	if o.Repeat <= 0 {
		o.Repeat = 1
	}
	logf := o.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	for _, d := range []string{o.CacheDir, o.WorkDir, filepath.Join(o.WorkDir, "logs"), filepath.Join(o.WorkDir, "profiles")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	h := &harness{o: o, logf: logf}
	defer h.close()
	rep := &Report{Machine: machineInfo(), Started: time.Now().UTC(), Options: o}
	defer func() { rep.Finished = time.Now().UTC() }()
	if o.RelaydBin != "" {
		rep.Relayd = o.RelaydBin
	} else {
		rep.Relayd = "relay.Run in-process (" + filepath.Base(o.Self) + " consume -mode relayd)"
	}

	var rec *Recording
	if o.has(ScenarioCapacity) || o.has(ScenarioMemory) {
		t0 := time.Now()
		var err error
		dir := RecordingDir(o.CacheDir, o.Record)
		rec, err = LoadOrRecord(ctx, dir, o.Record, func() (*testenv.Env, error) {
			logf("bench: recording %d pod and %d widget events from kube-apiserver %s into %s", o.Record.PodEvents, o.Record.WidgetEvents, testenv.K8sVersion, dir)
			return h.apiserver(ctx)
		})
		if err != nil {
			return nil, fmt.Errorf("bench: recording: %w", err)
		}
		rep.Recording = rec
		logf("bench: recording ready (%v)", time.Since(t0).Round(time.Millisecond))
		// The capacity runs must not share the CPUs with the recording's
		// kube-apiserver (still busy, and large, after recording): stop
		// it; the latency scenario starts its own.
		if h.env != nil {
			h.env.Stop()
			h.env = nil
		}
	}
	if err := h.startNATS(ctx); err != nil {
		return nil, err
	}
	if o.has(ScenarioCapacity) {
		r, err := h.capacity(ctx, rec)
		if err != nil {
			return rep, rep.fail(ScenarioCapacity, fmt.Errorf("bench: capacity: %w", err))
		}
		rep.Capacity = r
	}
	if o.has(ScenarioLatency) {
		r, err := h.latency(ctx)
		if err != nil {
			return rep, rep.fail(ScenarioLatency, fmt.Errorf("bench: latency: %w", err))
		}
		rep.Latency = r
	}
	if h.env != nil {
		h.env.Stop()
		h.env = nil
	}
	if o.has(ScenarioMemory) {
		r, err := h.memory(ctx, rec)
		if err != nil {
			return rep, rep.fail(ScenarioMemory, fmt.Errorf("bench: memory: %w", err))
		}
		rep.Memory = r
	}
	if o.has(ScenarioRecovery) {
		r, err := h.recovery(ctx)
		if err != nil {
			return rep, rep.fail(ScenarioRecovery, fmt.Errorf("bench: recovery: %w", err))
		}
		rep.Recovery = r
	}
	return rep, nil
}

func (h *harness) close() {
	if h.snoop != nil {
		h.snoop.Close()
	}
	if h.nc != nil {
		h.nc.Close()
	}
	if h.natsd != nil {
		_ = h.natsd.Stop(10 * time.Second)
	}
	if h.env != nil {
		h.env.Stop()
	}
}

// apiserver starts (once) etcd + kube-apiserver with the watch cache on.
func (h *harness) apiserver(ctx context.Context) (*testenv.Env, error) {
	if h.env != nil {
		return h.env, nil
	}
	env, err := testenv.Start(ctx, testenv.Options{Logf: h.logf})
	if err != nil {
		return nil, err
	}
	h.env = env
	return env, nil
}

func (h *harness) logPath(name string) string {
	return filepath.Join(h.o.WorkDir, "logs", name+".log")
}

// self starts `Self <sub> args...`.
func (h *harness) self(name, sub string, args ...string) (*Child, error) {
	return StartChild(name, h.o.Self, append([]string{sub}, args...), h.o.SelfEnv, h.logPath(name))
}

func (h *harness) startNATS(ctx context.Context) error {
	store := filepath.Join(h.o.WorkDir, "nats")
	_ = os.RemoveAll(store)
	c, err := h.self("nats-server", "natsd", "-store", store)
	if err != nil {
		return err
	}
	h.natsd = c
	line, err := c.WaitLine(ctx, "ready ", 30*time.Second)
	if err != nil {
		return err
	}
	h.natsURL = strings.TrimPrefix(line, "ready ")
	if h.nc, err = nats.Connect(h.natsURL, nats.CustomInboxPrefix("_BENCH"), nats.Name("relayd-bench")); err != nil {
		return err
	}
	if h.js, err = jetstream.New(h.nc); err != nil {
		return err
	}
	h.snoop, err = SnoopAcks(h.natsURL)
	return err
}

// createStream creates the stream relayd publishes to with the settings
// relayd's `nats.stream.create` uses by default: file storage, R1, a 10m
// duplicate window (Nats-Msg-Id deduplication), discard new.
func (h *harness) createStream(ctx context.Context, name, cluster string) error {
	_, err := h.js.CreateStream(ctx, jetstream.StreamConfig{
		Name: name, Subjects: []string{"k8s." + cluster + ".>"}, Storage: jetstream.FileStorage, Replicas: 1,
		Duplicates: 10 * time.Minute, Discard: jetstream.DiscardNew, MaxBytes: -1,
	})
	return err
}

func (h *harness) deleteStream(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = h.js.DeleteStream(ctx, name)
}

// relaydConfig is a relayd config for cluster/stream with the given
// sources (YAML list items) and extra top-level YAML.
func (h *harness) relaydConfig(cluster, stream, extra, sources string) string {
	return fmt.Sprintf(`cluster: %s
nats:
  url: %s
  stream:
    name: %s
    create: false
checkpoint:
  namespace: relayd
  name: relayd-checkpoint
# Off: the runs count the stream's messages and measure the event path;
# the heartbeats' cost is measured apart (docs/PERFORMANCE.md, "Heartbeats").
heartbeatInterval: 0
%s
sources:
%s`, cluster, h.natsURL, stream, extra, sources)
}

// relayd is a running relayd process.
type relayd struct {
	*Child
	metrics, health string
}

// startRelayd writes cfg and starts relayd against kubeconfig, from
// RelaydBin, or in-process in Self (always when profiling). A non-empty
// profile is a CPU profile of the whole run, or, when it ends in
// ".heap.pprof", a heap profile written on SIGUSR1 (see relayd.heapProfile).
func (h *harness) startRelayd(ctx context.Context, name, cfg, kubeconfig, profile string) (*relayd, error) {
	path := filepath.Join(h.o.WorkDir, name+".yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	m, err := freeAddr()
	if err != nil {
		return nil, err
	}
	hl, err := freeAddr()
	if err != nil {
		return nil, err
	}
	var c *Child
	if h.o.RelaydBin != "" && profile == "" {
		c, err = StartChild(name, h.o.RelaydBin, []string{"run", "-c", path, "--kubeconfig", kubeconfig,
			"--metrics-bind-address", m, "--health-probe-bind-address", hl, "--log-level", "warn"}, nil, h.logPath(name))
	} else {
		args := []string{"-mode", ModeRelayd, "-config", path, "-kubeconfig", kubeconfig,
			"-metrics-bind-address", m, "-health-probe-bind-address", hl}
		switch {
		case strings.HasSuffix(profile, ".heap.pprof"):
			args = append(args, "-memprofile", profile)
		case profile != "":
			args = append(args, "-cpuprofile", profile)
		}
		c, err = h.self(name, "consume", args...)
	}
	if err != nil {
		return nil, err
	}
	return &relayd{Child: c, metrics: m, health: hl}, nil
}

// heapProfile makes an in-process relayd started with a heap profile
// collect garbage and write the profile, and waits until it has.
func (r *relayd) heapProfile(ctx context.Context) error {
	if err := r.cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		return err
	}
	_, err := r.WaitLine(ctx, "heapprofile", time.Minute)
	return err
}

// alive is an AckSnoop.WaitCount check that fails once the process exited.
func (r *relayd) alive() error {
	if r.Exited() {
		return fmt.Errorf("bench: %s exited early (log: %s)", r.Name, r.log.Name())
	}
	return nil
}

// waitReady polls /readyz.
func (r *relayd) waitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if err := r.alive(); err != nil {
			return err
		}
		resp, err := http.Get("http://" + r.health + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("bench: %s not ready within %v", r.Name, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (h *harness) next() string { return strconv.FormatInt(h.seq.Add(1), 10) }
