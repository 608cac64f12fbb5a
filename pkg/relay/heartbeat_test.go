package relay_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/relayd/relayd/pkg/checkpoint"
	"github.com/relayd/relayd/pkg/event"
)

// heartbeatData is a heartbeat's data (docs/CONSUMING.md, "Heartbeats").
type heartbeatData struct {
	Namespace       string  `json:"namespace"`
	Epoch           uint64  `json:"epoch"`
	ResourceVersion string  `json:"resourceVersion"`
	StreamSeq       uint64  `json:"streamSeq"`
	LastReadTime    string  `json:"lastReadTime"`
	IntervalSeconds float64 `json:"intervalSeconds"`
}

// beat is a stored heartbeat.
type beat struct {
	msg
	d    heartbeatData
	read time.Time // LastReadTime parsed (zero: none)
}

// heartbeats returns the heartbeats among ms, failing on a malformed one.
func heartbeats(t *testing.T, f *fixture, ms []msg) []beat {
	t.Helper()
	var out []beat
	for _, m := range ms {
		if !strings.HasSuffix(m.Env.Type, ".source.heartbeat") {
			continue
		}
		b := beat{msg: m}
		if err := json.Unmarshal(m.Env.Data, &b.d); err != nil {
			t.Fatalf("heartbeat %d data %s: %v", m.Seq, m.Env.Data, err)
		}
		if want := "k8s." + f.cluster + "._relayd." + m.Env.RelaydSource + ".heartbeat"; m.Subject != want {
			t.Errorf("heartbeat %d on %s, want %s", m.Seq, m.Subject, want)
		}
		if _, err := event.ParseSubject(m.Subject); !errors.Is(err, event.ErrControlSubject) {
			t.Errorf("ParseSubject(%s) = %v, want a control subject", m.Subject, err)
		}
		if b.d.Namespace != m.Env.K8sNamespace || b.d.Epoch != m.Env.RelaydEpoch {
			t.Errorf("heartbeat %d: data namespace %q epoch %d, extensions %q %d", m.Seq, b.d.Namespace, b.d.Epoch, m.Env.K8sNamespace, m.Env.RelaydEpoch)
		}
		if b.d.LastReadTime != "" {
			var err error
			if b.read, err = time.Parse(time.RFC3339Nano, b.d.LastReadTime); err != nil {
				t.Fatalf("heartbeat %d lastReadTime: %v", m.Seq, err)
			}
		}
		out = append(out, b)
	}
	return out
}

// lastEventSeq is the stream sequence of the last message of source's
// watch of namespace ns other than heartbeats (0: none).
func lastEventSeq(ms []msg, source, ns string) uint64 {
	var seq uint64
	for _, m := range ms {
		if m.Env.RelaydSource == source && m.Env.K8sNamespace == ns && !strings.HasSuffix(m.Env.Type, ".heartbeat") {
			seq = m.Seq
		}
	}
	return seq
}

// Every running watch publishes a heartbeat each heartbeatInterval, in both
// content modes: it carries the checkpointed position (equal to the
// checkpoint ConfigMap's), the stream sequence of the watch's last event
// (its last acknowledged) and the time of the last change read, which
// moves after a change. A source's own interval overrides the top-level
// one, and 0 turns them off. Heartbeats write no checkpoint, and stop with
// relayd.
func TestHeartbeats(t *testing.T) {
	for _, mode := range []string{"structured", "binary"} {
		t.Run(mode, func(t *testing.T) {
			alongside(t)
			testHeartbeats(t, mode)
		})
	}
}

func testHeartbeats(t *testing.T, mode string) {
	f := newFixture(t, env, natsSrv, `
  - name: cms
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]
  - name: nss
    apiVersion: v1
    kind: Namespace
    fieldSelector: metadata.name=$NS
    heartbeatInterval: 2s
  - name: svcs
    apiVersion: v1
    kind: Service
    namespaces: [$NS]
    heartbeatInterval: 0`+"\ncloudevents:\n  mode: "+mode)
	f.cfgYAML = strings.Replace(f.cfgYAML, "heartbeatInterval: 0\nsources:", "heartbeatInterval: 1s\nsources:", 1)
	r := f.start(nil, true)
	key := checkpoint.Key("cms", f.ns)

	// A change, then a heartbeat that carries it: the checkpoint's position
	// and the sequence of the change's event.
	cm := f.createCM("a", nil, map[string]string{"k": "1"})
	f.checkpointWithin(key, cm.ResourceVersion, "")
	first := f.waitBeat("cms", f.ns, cm.ResourceVersion)
	if first.read.IsZero() {
		t.Fatalf("heartbeat %d after a change has no lastReadTime: %s", first.Seq, first.Env.Data)
	}
	if first.d.IntervalSeconds != 1 {
		t.Errorf("cms heartbeat intervalSeconds %v, want 1 (heartbeatInterval)", first.d.IntervalSeconds)
	}
	f.waitBeatOf("nss", "", func(b beat) error {
		if b.d.IntervalSeconds != 2 {
			return fmt.Errorf("nss heartbeat intervalSeconds %v, want 2 (the source's heartbeatInterval)", b.d.IntervalSeconds)
		}
		return nil
	})

	// Idle: heartbeats continue, the checkpoint is not written.
	writes := metricValue(t, r.reg, "relayd_checkpoint_writes_total", nil)
	cmBefore := f.checkpointRV()
	idleFrom := f.stored()
	n0 := len(heartbeats(t, f, idleFrom))
	f.eventually(30*time.Second, "4 more heartbeats while idle", func() error {
		if n := len(heartbeats(t, f, f.stored())); n < n0+4 {
			return fmt.Errorf("%d heartbeats, want %d", n, n0+4)
		}
		return nil
	})
	if w := metricValue(t, r.reg, "relayd_checkpoint_writes_total", nil); w != writes {
		t.Errorf("relayd_checkpoint_writes_total went from %v to %v while only heartbeats were published", writes, w)
	}
	if rv := f.checkpointRV(); rv != cmBefore {
		t.Errorf("the checkpoint ConfigMap was written while idle (resourceVersion %s -> %s)", cmBefore, rv)
	}
	// Every heartbeat carried a position the checkpoint held: none is
	// ahead of what it holds now (progress not written, such as the
	// bookmark-like progress past relayd's own checkpoint writes, which is
	// persisted only every 2 minutes, is not the checkpoint's).
	held := f.checkpoints()[key].ResourceVersion
	for _, b := range heartbeats(t, f, f.stored()) {
		if b.Env.RelaydSource == "cms" && b.d.ResourceVersion != "" && rvNum(t, b.d.ResourceVersion) > rvNum(t, held) {
			t.Errorf("heartbeat %d carries resourceVersion %s; the checkpoint holds %s", b.Seq, b.d.ResourceVersion, held)
		}
	}

	// A second change: lastReadTime moves.
	cm = f.updateCM(cm, "k", "2")
	f.checkpointWithin(key, cm.ResourceVersion, "")
	second := f.waitBeat("cms", f.ns, cm.ResourceVersion)
	if !second.read.After(first.read) {
		t.Errorf("lastReadTime %v after a second change, was %v", second.read, first.read)
	}

	all := f.stored()
	ids := map[string]uint64{}
	for _, b := range heartbeats(t, f, all) {
		if b.Env.RelaydSource == "svcs" {
			t.Errorf("heartbeat %d of source svcs, whose heartbeatInterval is 0", b.Seq)
		}
		if prev, dup := ids[b.MsgID]; dup {
			t.Errorf("heartbeats %d and %d share the Nats-Msg-Id %s", prev, b.Seq, b.MsgID)
		}
		ids[b.MsgID] = b.Seq
	}
	if v := metricValue(t, r.reg, "relayd_heartbeats_total", map[string]string{"source": "cms", "result": "published"}); v < 2 {
		t.Errorf("relayd_heartbeats_total{cms,published} = %v", v)
	}

	// Stopped: no heartbeat after the stop, over more than two intervals.
	r.stop(t)
	last := f.stored()
	time.Sleep(5 * time.Second)
	if after := f.stored(); len(after) != len(last) {
		t.Errorf("%d messages stored after relayd stopped:\n%s", len(after)-len(last), dump(after[len(last):]))
	}
}

// checkpointRV is the checkpoint ConfigMap's resourceVersion.
func (f *fixture) checkpointRV() string {
	f.t.Helper()
	cm, err := f.cs.CoreV1().ConfigMaps(f.ns).Get(f.t.Context(), "cp", metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	return cm.ResourceVersion
}

// waitBeat waits for a heartbeat of the watch of source in ns, published
// once the checkpoint reached rv or beyond, whose position is the
// checkpoint ConfigMap's and whose streamSeq is the sequence of the
// watch's last event (its last acknowledged), and returns it.
func (f *fixture) waitBeat(source, ns, rv string) beat {
	f.t.Helper()
	key := checkpoint.Key(source, ns)
	return f.waitBeatOf(source, ns, func(b beat) error {
		cp := f.checkpoints()[key]
		if b.d.ResourceVersion == "" || rvNum(f.t, b.d.ResourceVersion) < rvNum(f.t, rv) {
			return fmt.Errorf("heartbeat %d at resourceVersion %s, before %s", b.Seq, b.d.ResourceVersion, rv)
		}
		if b.d.ResourceVersion != cp.ResourceVersion || b.d.Epoch != cp.Epoch {
			return fmt.Errorf("heartbeat %d position %s/%d, checkpoint %s/%d", b.Seq, b.d.ResourceVersion, b.d.Epoch, cp.ResourceVersion, cp.Epoch)
		}
		if want := lastEventSeq(f.stored(), source, ns); b.d.StreamSeq != want {
			return fmt.Errorf("heartbeat %d streamSeq %d, the watch's last event is at %d", b.Seq, b.d.StreamSeq, want)
		}
		return nil
	})
}

// waitBeatOf waits for the newest heartbeat of the watch of source in ns
// to pass check, and returns it.
func (f *fixture) waitBeatOf(source, ns string, check func(beat) error) beat {
	f.t.Helper()
	var got beat
	f.eventually(30*time.Second, "a heartbeat of "+source, func() error {
		var newest *beat
		for _, b := range heartbeats(f.t, f, f.stored()) {
			if b.Env.RelaydSource == source && b.d.Namespace == ns {
				newest = &b
			}
		}
		if newest == nil {
			return errors.New("none yet")
		}
		got = *newest
		return check(got)
	})
	return got
}

// With sharding, only the replica that runs a source publishes its
// heartbeats: two replicas, one source each; while they keep their
// sources, each one's relayd_heartbeats_total grows for its own source
// only.
func TestHeartbeatsComeFromTheSourcesReplica(t *testing.T) {
	alongside(t)
	f := newFixture(t, env, natsSrv, `
  - name: s0
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]
    labelSelector: shard=s0
  - name: s1
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]
    labelSelector: shard=s1`)
	f.cfgYAML = strings.Replace(f.cfgYAML, "heartbeatInterval: 0\nsources:", "heartbeatInterval: 1s\nsources:", 1) + `
sharding:
  enabled: true
  leaseDuration: 4s
  renewDeadline: 3s
  retryPeriod: 300ms
`
	leases := f.cs.CoordinationV1().Leases(f.ns)
	for _, name := range []string{"relayd-s0", "relayd-s1"} {
		if _, err := leases.Create(t.Context(), &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	rs := []*running{f.startAs("r0", nil, false), f.startAs("r1", nil, false)}
	leader := map[string]int{} // source -> index in rs
	published := func(r *running, src string) float64 {
		return metricValue(t, r.reg, "relayd_heartbeats_total", map[string]string{"source": src, "result": "published"})
	}
	f.eventually(60*time.Second, "one source per replica", func() error {
		clear(leader)
		for i, r := range rs {
			for _, src := range []string{"s0", "s1"} {
				if metricValue(t, r.reg, "relayd_source_leader", map[string]string{"source": src}) == 1 {
					leader[src] = i
				}
			}
		}
		if len(leader) != 2 || leader["s0"] == leader["s1"] {
			return fmt.Errorf("leaders %v", leader)
		}
		return nil
	})
	before := map[string][2]float64{}
	for _, src := range []string{"s0", "s1"} {
		before[src] = [2]float64{published(rs[0], src), published(rs[1], src)}
	}
	f.eventually(30*time.Second, "3 heartbeats of each source", func() error {
		for src, i := range leader {
			if d := published(rs[i], src) - before[src][i]; d < 3 {
				return fmt.Errorf("%s: %v heartbeats from its replica", src, d)
			}
		}
		return nil
	})
	for src, i := range leader {
		if metricValue(t, rs[i].reg, "relayd_source_leader", map[string]string{"source": src}) != 1 {
			t.Fatalf("%s changed replica during the test", src)
		}
		other := 1 - i
		if d := published(rs[other], src) - before[src][other]; d != 0 {
			t.Errorf("replica r%d, which does not run %s, published %v heartbeats of it", other, src, d)
		}
	}
}
