package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/relayd/relayd/internal/testenv"
)

// RecoveryRun is one forced 410 and the resync that follows.
type RecoveryRun struct {
	// From410 is from the 410 (relayd's log line) to sync.completed
	// received from JetStream; Backoff is the part before sync.started
	// (relayd's relist backoff); FromStart is from relayd's process start.
	From410, Backoff, Relist, FromStart float64
	Listed                              int64 // sync.completed total
	CPU                                 float64
}

// InformerRun is a client-go informer listing the same objects.
type InformerRun struct {
	Synced  float64 // seconds from informer start to HasSynced
	Objects int
	CPU     float64
}

// RecoveryResult is the recovery scenario.
type RecoveryResult struct {
	Objects  int
	Runs     []RecoveryRun
	Informer []InformerRun
	// Medians.
	From410, InformerSynced float64
}

func (h *harness) recovery(ctx context.Context) (*RecoveryResult, error) {
	env, err := testenv.Start(ctx, testenv.Options{DisableWatchCache: true, Logf: h.logf})
	if err != nil {
		return nil, err
	}
	defer env.Stop()
	cs, err := kubernetes.NewForConfig(env.AdminConfig())
	if err != nil {
		return nil, err
	}
	const ns = "rec"
	for _, n := range []string{ns, "relayd"} {
		if err := ensureNamespace(ctx, cs, n); err != nil {
			return nil, err
		}
	}
	n := h.o.RecoveryObjects
	t0 := time.Now()
	err = parallel(ctx, n, 16, func(ctx context.Context, i int) error {
		cm := benchConfigMap(ns)
		cm.Name = fmt.Sprintf("cm-%06d", i)
		_, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{FieldManager: "kubectl-client-side-apply"})
		return err
	})
	if err != nil {
		return nil, err
	}
	h.logf("bench: recovery: %d ConfigMaps created in %v", n, time.Since(t0).Round(time.Millisecond))
	kc := filepath.Join(h.o.WorkDir, "apiserver-nocache.kubeconfig")
	if err := env.WriteKubeconfig(kc, false); err != nil {
		return nil, err
	}
	id := h.next()
	stream, cluster := "REC"+id, "rec"+id
	if err := h.createStream(ctx, stream, cluster); err != nil {
		return nil, err
	}
	defer h.deleteStream(stream)
	mk, err := h.watchMarkers(cluster)
	if err != nil {
		return nil, err
	}
	defer mk.close()
	src := fmt.Sprintf(`  - name: cms
    apiVersion: v1
    kind: ConfigMap
    namespaces: [%s]
    initial: snapshot
`, ns)
	cfg := h.relaydConfig(cluster, stream, "", src)
	res := &RecoveryResult{Objects: n}

	// The initial snapshot, then a clean stop (final checkpoint).
	r, err := h.startRelayd(ctx, "recovery-initial-"+id, cfg, kc, "")
	if err != nil {
		return nil, err
	}
	if _, err := mk.wait(ctx, true, 1, 5*time.Minute, r.alive); err != nil {
		_ = r.Stop(30 * time.Second)
		return nil, err
	}
	h.snoop.Quiet(ctx, time.Second)
	if err := r.Stop(30 * time.Second); err != nil {
		return nil, fmt.Errorf("relayd stop: %w", err)
	}
	epoch := uint64(1)
	for rep := 1; rep <= h.o.Repeat; rep++ {
		// While relayd is down: two changes, then history is compacted.
		for i := range 2 {
			cm, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, fmt.Sprintf("cm-%06d", i), metav1.GetOptions{})
			if err != nil {
				return nil, err
			}
			cm.Data["LOG_LEVEL"] = fmt.Sprintf("debug-%d", rep)
			if _, err := cs.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
				return nil, err
			}
		}
		if _, err := env.CompactNow(ctx); err != nil {
			return nil, err
		}
		name := fmt.Sprintf("recovery-%s-%d", id, rep)
		start := time.Now()
		r, err := h.startRelayd(ctx, name, cfg, kc, "")
		if err != nil {
			return nil, err
		}
		epoch++
		started, err := mk.wait(ctx, false, epoch, 5*time.Minute, r.alive)
		var done marker
		if err == nil {
			done, err = mk.wait(ctx, true, epoch, 5*time.Minute, r.alive)
		}
		cpu, _ := r.CPU()
		stopErr := r.Stop(30 * time.Second)
		if err != nil {
			return nil, err
		}
		if stopErr != nil {
			return nil, fmt.Errorf("relayd stop: %w", stopErr)
		}
		run := RecoveryRun{Relist: done.Recv.Sub(started.Time).Seconds(), FromStart: done.Recv.Sub(start).Seconds(),
			Listed: done.Total, CPU: cpu.Seconds()}
		if t410, ok := logTime(h.logPath(name), "410"); ok {
			run.From410 = done.Recv.Sub(t410).Seconds()
			run.Backoff = started.Time.Sub(t410).Seconds()
		} else {
			run.From410 = -1
		}
		h.logf("bench: recovery rep %d: 410 → sync.completed %.2fs (backoff %.2fs, relist %.2fs; %d listed), from process start %.2fs",
			rep, run.From410, run.Backoff, run.Relist, run.Listed, run.FromStart)
		res.Runs = append(res.Runs, run)
	}
	for rep := 1; rep <= h.o.Repeat; rep++ {
		c, err := h.self(fmt.Sprintf("informer-%s-%d", id, rep), "consume", "-mode", ModeInformer, "-kubeconfig", kc, "-namespace", ns)
		if err != nil {
			return nil, err
		}
		if _, err := c.WaitLine(ctx, "start", time.Minute); err != nil {
			_ = c.Stop(10 * time.Second)
			return nil, err
		}
		cpu0, _ := c.CPU()
		line, err := c.WaitLine(ctx, "synced", 5*time.Minute)
		cpu1, _ := c.CPU()
		_ = c.Stop(10 * time.Second)
		if err != nil {
			return nil, err
		}
		f := strings.Fields(line)
		objs, _ := strconv.Atoi(f[1])
		nanos, _ := strconv.ParseInt(f[2], 10, 64)
		ir := InformerRun{Synced: time.Duration(nanos).Seconds(), Objects: objs, CPU: (cpu1 - cpu0).Seconds()}
		h.logf("bench: informer rep %d: %d objects synced in %.2fs", rep, ir.Objects, ir.Synced)
		res.Informer = append(res.Informer, ir)
	}
	var a, b []float64
	for _, r := range res.Runs {
		a = append(a, r.From410)
	}
	missing410 := false
	for _, x := range a {
		missing410 = missing410 || x < 0
	}
	for _, r := range res.Informer {
		b = append(b, r.Synced)
	}
	res.From410, res.InformerSynced = median(a), median(b)
	if missing410 {
		res.From410 = -1
	}
	return res, nil
}

// logTime finds relayd's JSON log line about the 410 and returns its time.
func logTime(path, needle string) (time.Time, bool) {
	f, err := os.Open(path)
	if err != nil {
		return time.Time{}, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if !strings.Contains(string(line), needle) {
			continue
		}
		var l struct {
			TS  any    `json:"ts"`
			Msg string `json:"msg"`
		}
		if json.Unmarshal(line, &l) != nil || !strings.Contains(l.Msg, needle) {
			continue
		}
		switch ts := l.TS.(type) {
		case float64:
			sec, frac := math.Modf(ts)
			return time.Unix(int64(sec), int64(frac*1e9)), true
		case string:
			if t, err := time.Parse(time.RFC3339Nano, ts); err == nil {
				return t, true
			}
		}
	}
	return time.Time{}, false
}
