package bench

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// The per-namespace and sources steps run on the real kube-apiserver
// (watch cache on): its handling of many watches is the point.

func scaleNS(i int) string { return fmt.Sprintf("pn-%05d", i) }

// scaleAPIServer starts the apiserver (once) with n namespaces, each with
// the ConfigMap "probe", and the checkpoint namespace.
func (h *harness) scaleAPIServer(ctx context.Context, n int) (kubernetes.Interface, string, error) {
	env, err := h.apiserver(ctx)
	if err != nil {
		return nil, "", err
	}
	cs, err := kubernetes.NewForConfig(env.AdminConfig())
	if err != nil {
		return nil, "", err
	}
	if err := ensureNamespace(ctx, cs, "relayd"); err != nil {
		return nil, "", err
	}
	t0 := time.Now()
	err = parallel(ctx, n, 16, func(ctx context.Context, i int) error {
		ns := scaleNS(i)
		_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
		cm := benchConfigMap(ns)
		cm.Name = "probe"
		_, err = cs.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{FieldManager: "kubectl-client-side-apply"})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
		return nil
	})
	if err != nil {
		return nil, "", err
	}
	h.logf("bench: %d namespaces with a ConfigMap each (%v)", n, time.Since(t0).Round(time.Millisecond))
	kc := filepath.Join(h.o.WorkDir, "apiserver.kubeconfig")
	if err := env.WriteKubeconfig(kc, false); err != nil {
		return nil, "", err
	}
	return cs, kc, nil
}

// changer writes a change to the ConfigMap probe of ns every 250 ms until
// stopped.
func changer(ctx context.Context, cs kubernetes.Interface, ns string) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			patch := fmt.Appendf(nil, `{"data":{"LOG_LEVEL":"change-%d-%d"}}`, time.Now().UnixNano(), i)
			_, _ = cs.CoreV1().ConfigMaps(ns).Patch(ctx, "probe", types.MergePatchType, patch, metav1.PatchOptions{})
			select {
			case <-ctx.Done():
				return
			case <-time.After(250 * time.Millisecond):
			}
		}
	}()
	return func() { cancel(); <-done }
}

func (h *harness) scaleNamespaces(ctx context.Context, so ScaleOptions, rep *ScaleReport) error {
	most := 0
	for _, n := range so.WatchNamespaces {
		most = max(most, n)
	}
	cs, kc, err := h.scaleAPIServer(ctx, max(most, so.Sources))
	if err != nil {
		return err
	}
	// The slope of the sizes measured, also when a larger one fails.
	defer func() {
		var xs, ys []float64
		for _, p := range rep.Namespaces {
			xs, ys = append(xs, float64(p.Namespaces)), append(ys, float64(p.RSS))
		}
		rep.MemoryPerWatch = slope(xs, ys)
	}()
	for _, n := range so.WatchNamespaces {
		p, err := h.namespacePoint(ctx, so, cs, kc, n)
		if p != nil && p.Ready > 0 {
			rep.Namespaces = append(rep.Namespaces, *p) // the first start's figures
		}
		if err != nil {
			return fmt.Errorf("%d namespaces: %w", n, err)
		}
		h.logf("bench: %d namespaces: restart: first change %.2fs, %.0f relists, %d consumers created, %.0f checkpoint errors",
			n, p.Restart.FirstChange, p.Restart.Relists, p.Restart.ConsumersCreated, p.RestartCheckpointErrors)
	}
	return nil
}

// checkpointFlushes is how long the harness lets relayd write checkpoints
// (two flush intervals and a second) before it counts their errors.
func checkpointFlushes(so ScaleOptions) time.Duration { return 2*so.flush() + time.Second }

func (h *harness) namespacePoint(ctx context.Context, so ScaleOptions, cs kubernetes.Interface, kc string, n int) (*NamespacePoint, error) {
	names := make([]string, n)
	for i := range names {
		names[i] = scaleNS(i)
	}
	last := names[n-1]
	id := h.next()
	stream, cluster := "NS"+id, "ns"+id
	if err := h.createStream(ctx, stream, cluster); err != nil {
		return nil, err
	}
	defer h.dropIndex(stream, cluster)
	src := fmt.Sprintf("  - name: cms\n    apiVersion: v1\n    kind: ConfigMap\n    initial: snapshot\n    namespaces: [%s]\n", strings.Join(names, ", "))
	cfg := h.scaleConfig(so, cluster, stream, "", src)
	subject := fmt.Sprintf("k8s.%s.core.v1.configmaps.%s.probe.modified", cluster, last)

	change, err := h.firstMessage(subject)
	if err != nil {
		return nil, err
	}
	defer change.close()
	stop := changer(ctx, cs, last)
	prof := ""
	if so.ProfileWatches {
		if err := os.MkdirAll(filepath.Join(h.o.WorkDir, "profiles"), 0o755); err != nil {
			stop()
			return nil, err
		}
		prof = filepath.Join(h.o.WorkDir, "profiles", fmt.Sprintf("namespaces-%d.heap.pprof", n))
	}
	t0 := time.Now()
	r, err := h.startRelayd(ctx, fmt.Sprintf("namespaces-%d-%s", n, id), cfg, kc, prof)
	if err != nil {
		stop()
		return nil, err
	}
	defer func() { _ = r.Stop(2 * time.Minute) }()
	p := &NamespacePoint{Namespaces: n}
	p.FirstChange, err = change.wait(ctx, t0, 10*time.Minute, r.alive)
	stop()
	if err != nil {
		return nil, err
	}
	if err := r.waitReady(ctx, 10*time.Minute); err != nil {
		return nil, err
	}
	p.Ready = time.Since(t0).Seconds()
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(checkpointFlushes(so)):
	}
	st, err := r.steady(ctx)
	if err != nil {
		return nil, err
	}
	p.RSS, p.Goroutines, p.HeapInuse = st.RSS, st.Goroutines, st.HeapInuse
	p.StackInuse = int64(st.m.Sum("go_memstats_stack_inuse_bytes", nil))
	if prof != "" {
		if err := r.heapProfile(ctx); err != nil {
			return nil, err
		}
	}
	p.CheckpointErrors = st.m.Sum("relayd_checkpoint_errors_total", nil)
	p.CheckpointWrites = st.m.Sum("relayd_checkpoint_writes_total", nil)
	h.logf("bench: %d namespaces: change in the last one relayed %.2fs after start (ready %.2fs), %.0f checkpoint writes and %.0f errors, RSS %.1f MiB (heap in use %.1f MiB, stacks %.1f MiB), %.0f goroutines",
		n, p.FirstChange, p.Ready, p.CheckpointWrites, p.CheckpointErrors, mib(p.RSS), mib(p.HeapInuse), mib(p.StackInuse), p.Goroutines)
	if err := r.Stop(2 * time.Minute); err != nil {
		return p, fmt.Errorf("relayd stop: %w", err)
	}

	// From here on, an error returns the first start's figures with it.
	again, err := h.firstMessage(subject)
	if err != nil {
		return p, err
	}
	defer again.close()
	r2, res, err := h.restart(ctx, fmt.Sprintf("namespaces-%d-%s-restart", n, id), cfg, kc, again, changer(ctx, cs, last),
		checkpointFlushes(so), 5*time.Minute)
	if err != nil {
		return p, err
	}
	defer func() { _ = r2.Stop(2 * time.Minute) }()
	p.Restart = *res
	m, err := Scrape(ctx, r2.metrics)
	if err != nil {
		return p, err
	}
	p.RestartCheckpointErrors = m.Sum("relayd_checkpoint_errors_total", nil)
	return p, nil
}

func (h *harness) scaleSources(ctx context.Context, so ScaleOptions, rep *ScaleReport) error {
	_, kc, err := h.scaleAPIServer(ctx, so.Sources)
	if err != nil {
		return err
	}
	id := h.next()
	stream, cluster := "SRC"+id, "src"+id
	if err := h.createStream(ctx, stream, cluster); err != nil {
		return err
	}
	defer h.dropIndex(stream, cluster)
	var src strings.Builder
	for i := range so.Sources {
		fmt.Fprintf(&src, "  - {name: s-%04d, apiVersion: v1, kind: ConfigMap, initial: snapshot, namespaces: [%s]}\n", i, scaleNS(i))
	}
	t0 := time.Now()
	r, err := h.startRelayd(ctx, fmt.Sprintf("sources-%d-%s", so.Sources, id), h.scaleConfig(so, cluster, stream, "", src.String()), kc, "")
	if err != nil {
		return err
	}
	defer func() { _ = r.Stop(2 * time.Minute) }()
	if err := r.waitReady(ctx, 20*time.Minute); err != nil {
		return err
	}
	res := &SourcesResult{Sources: so.Sources, Ready: time.Since(t0).Seconds()}
	h.snoop.Quiet(ctx, 2*time.Second)
	st, err := r.steady(ctx)
	if err != nil {
		return err
	}
	res.RSS, res.Goroutines = st.RSS, st.Goroutines
	u, err := url.Parse(h.env.Host())
	if err != nil {
		return err
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil {
		return err
	}
	if res.Connections, err = tcpConnections(r.Pid(), port); err != nil {
		return err
	}
	h.logf("bench: %d sources: ready %.2fs, RSS %.1f MiB, %.0f goroutines, %d apiserver connections",
		res.Sources, res.Ready, mib(res.RSS), res.Goroutines, res.Connections)
	rep.Sources = res
	return nil
}

// tcpConnections counts the established TCP connections of pid to a
// remote port: its socket inodes (/proc/<pid>/fd) matched against
// /proc/<pid>/net/tcp and tcp6.
func tcpConnections(pid, port int) (int, error) {
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return 0, err
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err == nil && strings.HasPrefix(l, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	want := fmt.Sprintf(":%04X", port)
	n := 0
	for _, f := range []string{"tcp", "tcp6"} {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, f))
		if err != nil {
			return 0, err
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			x := strings.Fields(line)
			if len(x) >= 10 && strings.HasSuffix(x[2], want) && x[3] == "01" && inodes[x[9]] {
				n++
			}
		}
	}
	return n, nil
}

// The per-namespace goals stated at the size of the largest clusters: a
// source listing goalWatches namespaces (docs/PERFORMANCE.md, "Scale
// goals"); a smaller run shows their figures, not judged.
const (
	goalWatches         = 10_000
	goalWatchFirst      = 60.0     // s: start → a change in the last namespace relayed
	goalWatchRestart    = 15.0     // s: graceful restart → the first change relayed
	goalBytesPerWatch   = 64 << 10 // RSS per watch, the slope over the sizes
	goalBytesPerWatchKB = goalBytesPerWatch >> 10
)

// watchGoals are the per-namespace goals of time and memory, judged at the
// largest size measured (the memory per watch by the slope over them all).
func (r *ScaleReport) watchGoals() []Goal {
	const (
		first   = "per-namespace watches: start → a change in the last namespace relayed"
		restart = "per-namespace watches: graceful restart → the first change relayed"
		mem     = "per-namespace watches: memory per watch (RSS slope over the sizes)"
	)
	at := func(s float64) string { return fmt.Sprintf("≤ %.0f s at %d", s, goalWatches) }
	memGoal := fmt.Sprintf("≤ %d KB", goalBytesPerWatchKB)
	if len(r.Namespaces) == 0 {
		w := r.why(StepNamespaces)
		return []Goal{notMeasured(first, at(goalWatchFirst), "", w), notMeasured(restart, at(goalWatchRestart), "", w), notMeasured(mem, memGoal, "", w)}
	}
	p := r.Namespaces[len(r.Namespaces)-1]
	g := []Goal{
		atScale(atMost(first, at(goalWatchFirst), fmt.Sprintf("%.2f s at %d namespaces (ready %.2f s)", p.FirstChange, p.Namespaces, p.Ready),
			p.FirstChange, goalWatchFirst), p.Namespaces, goalWatches, "namespaces"),
		atScale(atMost(restart, at(goalWatchRestart), fmt.Sprintf("%.2f s at %d namespaces (ready %.2f s)", p.Restart.FirstChange, p.Namespaces, p.Restart.Ready),
			p.Restart.FirstChange, goalWatchRestart), p.Namespaces, goalWatches, "namespaces"),
	}
	if len(r.Namespaces) < 2 {
		return append(g, notMeasured(mem, memGoal, "", fmt.Sprintf("a slope needs two sizes or more, %d measured", len(r.Namespaces))))
	}
	return append(g, atScale(atMost(mem, memGoal, fmt.Sprintf("%.1f KB over %d sizes up to %d (%.0f goroutines per watch)",
		r.MemoryPerWatch/1024, len(r.Namespaces), p.Namespaces, p.Goroutines/float64(p.Namespaces)),
		r.MemoryPerWatch, goalBytesPerWatch), p.Namespaces, goalWatches, "namespaces"))
}
