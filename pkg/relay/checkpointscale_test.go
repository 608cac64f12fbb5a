package relay_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/relayd/relayd/pkg/checkpoint"
)

// manyNamespaces is a source of ConfigMaps in the fixture's namespace and
// n-1 others (which need not exist: a watch of an absent namespace is
// empty): n watches, n checkpoint keys.
func manyNamespaces(n int) string {
	ns := []string{"$NS"}
	for i := 1; i < n; i++ {
		ns = append(ns, fmt.Sprintf("ghost-%03d", i))
	}
	return fmt.Sprintf(`
  - name: cms
    apiVersion: v1
    kind: ConfigMap
    payload: reference
    namespaces: [%s]`, strings.Join(ns, ", "))
}

// setCheckpoint adds YAML lines (indented by two, under checkpoint:).
func (f *fixture) setCheckpoint(lines string) {
	f.t.Helper()
	i := strings.Index(f.cfgYAML, "\n  flushInterval:")
	if i < 0 {
		f.t.Fatalf("no checkpoint block in\n%s", f.cfgYAML)
	}
	f.cfgYAML = f.cfgYAML[:i+1] + strings.TrimRight(lines, "\n") + f.cfgYAML[i:]
}

// shardedCheckpoints reads every checkpoint ConfigMap ("cp", "cp-1", …),
// failing on a key that is not in the ConfigMap checkpoint.ShardOf names.
func (f *fixture) shardedCheckpoints(shards int) (map[string]string, error) {
	out := map[string]string{}
	for i, name := range checkpoint.ShardNames("cp", shards) {
		cm, err := f.cs.CoreV1().ConfigMaps(f.ns).Get(f.t.Context(), name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		for k, v := range cm.Data {
			if checkpoint.ShardOf(k, shards) != i {
				f.t.Errorf("key %q is in ConfigMap %s, ShardOf says %s", k, name, checkpoint.ShardName("cp", checkpoint.ShardOf(k, shards)))
			}
			out[k] = v
		}
	}
	return out, nil
}

// metricSum is the sum of a counter over all its label values (0 if none).
func metricSum(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// A source with more watches than one checkpoint ConfigMap is planned to
// hold (checkpoint.watchesPerConfigMap, lowered here so that 200 watches
// need 4 ConfigMaps) stores every position, each in its own ConfigMap, and a
// restart resumes every watch from there: no relist at all. relayd's own
// writes to the extra ConfigMaps are not published (they are in a watched
// namespace).
func TestCheckpointOverSeveralConfigMapsResumesWithoutRelist(t *testing.T) {
	alongside(t)
	const watches, per = 200, 50
	f := newFixture(t, env, natsSrv, manyNamespaces(watches))
	f.setCheckpoint(fmt.Sprintf("  watchesPerConfigMap: %d", per))
	shards := f.config().CheckpointShards()
	if shards != 4 {
		t.Fatalf("CheckpointShards = %d, want 4", shards)
	}
	r := f.start(nil, true)
	f.eventually(60*time.Second, "a checkpoint of every watch", func() error {
		got, err := f.shardedCheckpoints(shards)
		if err != nil {
			return err
		}
		if len(got) != watches {
			return fmt.Errorf("%d of %d keys", len(got), watches)
		}
		return nil
	})
	if v := metricSum(t, r.reg, "relayd_relists_total"); v != watches {
		t.Errorf("first start: relayd_relists_total = %v, want %d (one initial list per watch)", v, watches)
	}
	r.stop(t)

	r = f.start(nil, true)
	f.createCM("after-restart", nil, map[string]string{"a": "1"})
	f.waitStored(20*time.Second, isEvent("added", "after-restart", ""))
	if v := metricSum(t, r.reg, "relayd_relists_total"); v != 0 {
		t.Errorf("after the restart: relayd_relists_total = %v, want 0 (every watch resumes from its checkpoint)", v)
	}
	for _, m := range f.stored() {
		if strings.HasPrefix(m.Env.K8sName, "cp") {
			t.Errorf("relayd published its own checkpoint ConfigMap:\n%s", dump([]msg{m}))
		}
	}
}

// At the start of many watches, their discovery requests queue in the
// shared client-side rate limiter (made small here: 4 requests/s for 140
// watches, a backlog longer than a checkpoint write's 30s timeout, as
// 10,000 watches make of the default 50/s). The checkpoint has a client
// and limiter of its own, so its writes succeed from the first flush.
func TestCheckpointWritesDoNotQueueBehindWatchStarts(t *testing.T) {
	alongside(t)
	const watches = 140
	f := newFixture(t, env, natsSrv, manyNamespaces(watches))
	rc := f.env.AdminConfig()
	rc.QPS, rc.Burst = 4, 1
	r := f.start(rc, false)
	f.eventually(60*time.Second, "a checkpoint written", func() error {
		got, err := f.shardedCheckpoints(1)
		if err != nil {
			return err
		}
		if len(got) == 0 {
			return fmt.Errorf("no key yet")
		}
		return nil
	})
	if v := metricSum(t, r.reg, "relayd_checkpoint_errors_total"); v != 0 {
		t.Errorf("relayd_checkpoint_errors_total = %v before the first checkpoint was stored, want 0: checkpoint writes queued behind the watches' requests", v)
	}
	f.eventually(90*time.Second, "relayd ready", r.readyErr)
	if v := metricSum(t, r.reg, "relayd_checkpoint_errors_total"); v != 0 {
		t.Errorf("relayd_checkpoint_errors_total = %v once every watch ran, want 0", v)
	}
}
