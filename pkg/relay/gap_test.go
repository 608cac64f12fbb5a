package relay_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/pkg/event"
)

// relaydProc runs the relayd binary for a fixture, as a pod would.
type relaydProc struct {
	t                  *testing.T
	bin, dir, kc, conf string
	env                []string // extra environment
	cmd                *exec.Cmd
}

func (f *fixture) binary() *relaydProc {
	f.t.Helper()
	p := &relaydProc{t: f.t, bin: relaydBinary(f.t), dir: f.t.TempDir()}
	p.kc, p.conf = filepath.Join(p.dir, "kubeconfig"), filepath.Join(p.dir, "config.yaml")
	if err := f.env.WriteKubeconfig(p.kc, false); err != nil {
		f.t.Fatal(err)
	}
	if err := os.WriteFile(p.conf, []byte(f.cfgYAML), 0o600); err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() {
		if p.cmd != nil {
			p.kill()
		}
		if f.t.Failed() {
			f.t.Logf("relayd log:\n%s", p.log())
		}
	})
	return p
}

func (p *relaydProc) start() {
	p.t.Helper()
	cmd := exec.Command(p.bin, "run", "-c", p.conf, "--kubeconfig", p.kc,
		"--metrics-bind-address", "127.0.0.1:0", "--health-probe-bind-address", "127.0.0.1:0", "--log-level", "info")
	cmd.Env = append(append(os.Environ(), testenv.IndexCheckEnv+"=1"), p.env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	logf, err := os.OpenFile(filepath.Join(p.dir, "relayd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		p.t.Fatal(err)
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	p.cmd = cmd
}

// kill is kill -9.
func (p *relaydProc) kill() {
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
	p.cmd = nil
}

// stop is SIGTERM; relayd must exit 0 (with RELAYD_INDEX_CHECK=1 a failed
// index check makes it exit 1).
func (p *relaydProc) stop() {
	p.t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	if err := p.cmd.Wait(); err != nil {
		p.t.Errorf("relayd did not exit cleanly: %v", err)
	}
	p.cmd = nil
}

func (p *relaydProc) log() string {
	b, _ := os.ReadFile(filepath.Join(p.dir, "relayd.log"))
	return string(b)
}

// runner starts and stops relayd in one of the ways the gap tests use.
type runner struct {
	f    *fixture
	proc *relaydProc // binary modes
	r    *running    // in-process
}

func (u *runner) start() {
	if u.proc != nil {
		u.proc.start()
		return
	}
	u.r = u.f.start(nil, false)
}

func (u *runner) stop() {
	if u.proc != nil {
		u.proc.stop()
		return
	}
	u.r.stop(u.f.t)
}

func (u *runner) kill() { u.proc.kill() }

type syncData struct {
	Reason string           `json:"reason"`
	From   string           `json:"fromResourceVersion"`
	To     string           `json:"toResourceVersion"`
	Counts event.SyncCounts `json:"counts"`
}

func syncOf(t *testing.T, m msg) syncData {
	t.Helper()
	var d syncData
	if err := json.Unmarshal(m.Env.Data, &d); err != nil {
		t.Fatalf("sync marker data: %v", err)
	}
	return d
}

// markers returns source's sync markers after seq, in stream order.
func markers(ms []msg, source, marker string, after uint64) []msg {
	var out []msg
	for _, m := range ms {
		if m.Seq > after && m.Env.RelaydSource == source && isSync(marker)(m) {
			out = append(out, m)
		}
	}
	return out
}

// objectEvents lists source's object events after seq as
// "type name@rv origin[ unknown]" strings, sorted.
func objectEvents(ms []msg, source string, after uint64) []string {
	var out []string
	for _, m := range ms {
		if m.Seq <= after || m.Env.RelaydSource != source || !strings.Contains(m.Env.Type, ".object.") {
			continue
		}
		s := fmt.Sprintf("%s %s@%s %s", m.Env.Type[strings.LastIndex(m.Env.Type, ".")+1:], m.Env.K8sName, m.Env.K8sResourceVersion, m.Env.RelaydOrigin)
		if m.Env.RelaydFinalUnknown {
			s += " unknown"
		}
		out = append(out, s)
	}
	sort.Strings(out)
	return out
}

const gapSources = `
  - name: cms
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]
  - name: sel
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]
    labelSelector: app=x`

// TestGapRecovery forces a 410 Gone (etcd compacted past relayd's position
// while it is down, watch cache off) and checks docs/GUARANTEES.md, "Delivery guarantees", "Across a 410 Gone":
// objects created, modified and deleted during the gap surface exactly (the
// deletes with final state unknown, also for an object that only stopped
// matching a label selector), unchanged objects are not republished, an
// object created and deleted inside the gap leaves no trace, all between
// sync markers carrying from/to and the counts; live changes flow after.
// Every relist is also checked against a consistent LIST (IndexCheck).
// It runs with relayd stopped gracefully (in-process), killed with -9
// (binary: the index comes back from the KV bucket), and killed with -9
// again in the middle of the resync.
func TestGapRecovery(t *testing.T) {
	alongside(t)
	forEachVersionStarted(t, testenv.Options{DisableWatchCache: true, AuditLog: true}, func(t *testing.T, noCache *testenv.Env) {
		for _, mode := range []string{"graceful", "kill-9", "kill-9-during-resync"} {
			t.Run(mode, func(t *testing.T) { gapScenario(t, noCache, mode) })
		}
	})
}

func gapScenario(t *testing.T, e *testenv.Env, mode string) {
	f := newFixture(t, e, natsSrv, gapSources)
	u := &runner{f: f}
	if mode != "graceful" {
		u.proc = f.binary()
	}
	x := map[string]string{"app": "x"}
	a := f.createCM("a", nil, map[string]string{"v": "1"})
	f.createCM("b", nil, nil)
	d := f.createCM("d", nil, nil)
	fo := f.createCM("f", nil, map[string]string{"v": "1"})
	s1 := f.createCM("s1", x, nil)
	f.createCM("s2", x, nil)
	bulk := 0
	if mode == "kill-9-during-resync" {
		bulk = 150 // enough resync work that the kill lands inside it
	}
	var bulkCMs = make([]string, bulk)
	for i := range bulk {
		bulkCMs[i] = fmt.Sprintf("bulk-%03d", i)
		f.createCM(bulkCMs[i], nil, nil)
	}

	u.start()
	ms := f.waitStored(60*time.Second, func(m msg) bool { return isSync("completed")(m) && m.Env.RelaydSource == "cms" },
		func(m msg) bool { return isSync("completed")(m) && m.Env.RelaydSource == "sel" })
	if c := markers(ms, "cms", "completed", 0); syncOf(t, c[0]).Counts != (event.SyncCounts{Added: int64(6 + bulk), Total: int64(6 + bulk)}) {
		t.Errorf("initial cms counts %+v", syncOf(t, c[0]).Counts)
	}
	f.eventually(20*time.Second, "checkpoints with the index generation", func() error {
		cps := f.checkpoints()
		for _, k := range []string{"cms." + f.ns, "sel." + f.ns} {
			if cps[k].ResourceVersion == "" || cps[k].Index == nil || cps[k].Index.Generation == "" {
				return fmt.Errorf("%s: %+v", k, cps[k])
			}
		}
		return nil
	})
	if mode == "graceful" {
		u.stop()
	} else {
		u.kill()
	}
	all := f.stored()
	before := all[len(all)-1].Seq

	// The gap.
	a2 := f.updateCM(a, "v", "2")
	c := f.createCM("c", nil, nil)
	f.deleteCM("d")
	f.createCM("e", nil, nil)
	f.deleteCM("e")
	f2 := f.updateCM(fo, "v", "2")
	f3 := f.updateCM(f2, "v", "3")
	s1.Labels = nil
	s1b, err := f.cs.CoreV1().ConfigMaps(f.ns).Update(t.Context(), s1, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s3 := f.createCM("s3", x, nil)
	bulkRV := map[string]string{}
	for _, name := range bulkCMs {
		cm, err := f.cs.CoreV1().ConfigMaps(f.ns).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		bulkRV[name] = f.updateCM(cm, "v", "2").ResourceVersion
	}
	if _, err := e.CompactNow(t.Context()); err != nil {
		t.Fatal(err)
	}

	killedMidResync := false
	if mode == "kill-9-during-resync" {
		// A core subscription sees each event as it is stored: kill -9 at
		// the tenth resync event.
		seen := make(chan struct{})
		n := 0
		sub, err := f.nc.Subscribe("k8s."+f.cluster+".>", func(m *nats.Msg) {
			if e, err := event.DecodeMessage(m.Header, m.Data); err == nil && e.RelaydOrigin == "resync" {
				if n++; n == 10 {
					close(seen)
				}
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		u.start()
		select {
		case <-seen:
		case <-time.After(60 * time.Second):
			t.Fatal("no resync events within 60s")
		}
		u.kill()
		_ = sub.Unsubscribe()
		killedMidResync = len(markers(f.stored(), "cms", "completed", before)) == 0
		if !killedMidResync {
			t.Error("the kill did not land inside the resync")
		}
	}
	u.start()
	f.waitStored(60*time.Second, func(m msg) bool { return m.Seq > before && isSync("completed")(m) && m.Env.RelaydSource == "cms" },
		func(m msg) bool { return m.Seq > before && isSync("completed")(m) && m.Env.RelaydSource == "sel" })
	g := f.createCM("g", nil, nil)
	ms = f.waitStored(30*time.Second, func(m msg) bool { return isEvent("added", "g", g.ResourceVersion)(m) && m.Env.RelaydOrigin == "watch" })
	if u.r != nil {
		if v := metricValue(t, u.r.reg, "relayd_tracked_objects", map[string]string{"source": "cms"}); v != float64(8+bulk) {
			t.Errorf("relayd_tracked_objects{cms} = %v, want %d", v, 8+bulk)
		}
		if v := metricValue(t, u.r.reg, "relayd_relists_total", map[string]string{"source": "cms", "reason": "expired"}); v != 1 {
			t.Errorf("relayd_relists_total{cms,expired} = %v, want 1", v)
		}
	}
	u.stop()

	want := map[string][]string{
		"cms": {
			"added c@" + c.ResourceVersion + " resync",
			"added g@" + g.ResourceVersion + " watch",
			"added s3@" + s3.ResourceVersion + " resync",
			"deleted d@" + d.ResourceVersion + " resync unknown",
			"modified a@" + a2.ResourceVersion + " resync",
			"modified f@" + f3.ResourceVersion + " resync",
			"modified s1@" + s1b.ResourceVersion + " resync",
		},
		"sel": {
			"added s3@" + s3.ResourceVersion + " resync",
			"deleted s1@" + s1.ResourceVersion + " resync unknown",
		},
	}
	for _, name := range bulkCMs {
		want["cms"] = append(want["cms"], "modified "+name+"@"+bulkRV[name]+" resync")
	}
	sort.Strings(want["cms"])
	wantCounts := map[string]event.SyncCounts{
		"cms": {Added: 2, Modified: int64(3 + bulk), Deleted: 1, Unchanged: 2, Total: int64(7 + bulk)},
		"sel": {Added: 1, Deleted: 1, Unchanged: 1, Total: 2},
	}
	for _, src := range []string{"cms", "sel"} {
		if got := objectEvents(ms, src, before); strings.Join(got, "\n") != strings.Join(want[src], "\n") {
			t.Errorf("%s: events after the gap:\n%s\nwant:\n%s", src, strings.Join(got, "\n"), strings.Join(want[src], "\n"))
		}
		started, completed := markers(ms, src, "started", before), markers(ms, src, "completed", before)
		if len(started) == 0 || len(completed) == 0 {
			t.Fatalf("%s: no sync markers after the gap:\n%s", src, dump(ms))
		}
		sd, cd := syncOf(t, started[0]), syncOf(t, completed[len(completed)-1])
		// A kill can fall between a relist's epoch write to the bucket and
		// its sync.started (the epoch is recorded first: see
		// TestEpochIsRecordedBeforeSyncStarted). That relist announced
		// nothing, and the next one has the epoch after it: a source's
		// first marker after such a kill may be epoch 3.
		firstEpochOK := started[0].Env.RelaydEpoch == 2 || (killedMidResync && started[0].Env.RelaydEpoch > 2)
		if sd.Reason != "expired" || sd.From == "" || cd.To == "" || !firstEpochOK {
			t.Errorf("%s: sync.started %+v epoch %d, sync.completed %+v", src, sd, started[0].Env.RelaydEpoch, cd)
		}
		// The relist after a kill in the middle of a resync compares with
		// what the killed run had already published: its counts differ.
		if !killedMidResync && cd.Counts != wantCounts[src] {
			t.Errorf("%s: counts %+v, want %+v", src, cd.Counts, wantCounts[src])
		}
		// Every relist has an epoch of its own: after a kill in the middle
		// of a resync the next one is epoch 3 with its own markers (reusing
		// 2 would give them the killed run's Nats-Msg-Ids, which JetStream
		// drops as duplicates: a gap without markers).
		startedAt := map[uint64]uint64{} // epoch -> seq of its sync.started
		for i, m := range started {
			want := started[0].Env.RelaydEpoch + uint64(i)
			if !killedMidResync && m.Env.RelaydEpoch != want {
				t.Errorf("%s: sync.started #%d has epoch %d, want %d", src, i, m.Env.RelaydEpoch, want)
			}
			if killedMidResync && i > 0 && m.Env.RelaydEpoch <= started[i-1].Env.RelaydEpoch {
				t.Errorf("%s: sync.started #%d has epoch %d, not above #%d's %d", src, i, m.Env.RelaydEpoch, i-1, started[i-1].Env.RelaydEpoch)
			}
			startedAt[m.Env.RelaydEpoch] = m.Seq
		}
		if src == "cms" && killedMidResync && len(started) < 2 {
			t.Errorf("%s: the relist after the kill in the middle of the resync has no sync.started of its own", src)
		}
		if last := completed[len(completed)-1]; last.Env.RelaydEpoch != started[len(started)-1].Env.RelaydEpoch {
			t.Errorf("%s: the last sync.completed has epoch %d, the last sync.started %d", src, last.Env.RelaydEpoch, started[len(started)-1].Env.RelaydEpoch)
		}
		for _, m := range ms {
			if m.Seq > before && m.Env.RelaydSource == src && m.Env.RelaydOrigin == "resync" &&
				(startedAt[m.Env.RelaydEpoch] == 0 || m.Seq < startedAt[m.Env.RelaydEpoch] || m.Seq > completed[len(completed)-1].Seq) {
				t.Errorf("%s: resync event outside its markers or with the wrong epoch: %d %s epoch %d", src, m.Seq, m.Env.K8sName, m.Env.RelaydEpoch)
			}
		}
	}
	if u.proc != nil && !strings.Contains(u.proc.log(), "index consistency check passed") {
		t.Errorf("the binary never ran the index consistency check")
	}
	// The relists after the 410 were streaming lists too, also with the
	// watch cache off: at least 4 in all (cms and sel, at start and after
	// the gap), none refused, no LIST pages.
	requireStreamingLists(t, e, "configmaps", f.ns, 4)
	t.Logf("mode %s: %d events after the gap, killed in the middle of the resync: %v", mode, len(objectEvents(ms, "cms", before))+len(objectEvents(ms, "sel", before)), killedMidResync)
}

// TestIndexLossFallsBackToMarkedResync: without its checkpoint, relayd lists
// and compares with the index (nothing is republished); without its index
// bucket, it republishes every object between sync markers whose reason
// (index-lost) tells consumers deletes may be missing — never a silent gap.
func TestIndexLossFallsBackToMarkedResync(t *testing.T) {
	f := newFixture(t, env, natsSrv, `
  - name: cms
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]`)
	a := f.createCM("a", nil, nil)
	b := f.createCM("b", nil, nil)
	r := f.start(nil, true)
	f.waitStored(20*time.Second, isSync("completed"))
	key := "cms." + f.ns
	f.eventually(10*time.Second, "checkpoint", func() error {
		if f.checkpoints()[key].Index == nil {
			return fmt.Errorf("no checkpoint with an index reference yet")
		}
		return nil
	})
	r.stop(t)

	// 1. The checkpoint key is removed: a list compared with the index.
	f.editCheckpoint(func(data map[string]string) { delete(data, key) })
	all := f.stored()
	before := all[len(all)-1].Seq
	r = f.start(nil, true)
	ms := f.waitStored(20*time.Second, func(m msg) bool { return m.Seq > before && isSync("completed")(m) })
	if sd := syncOf(t, markers(ms, "cms", "started", before)[0]); sd.Reason != "no-checkpoint" {
		t.Errorf("sync.started reason %q, want no-checkpoint", sd.Reason)
	}
	if cd := syncOf(t, markers(ms, "cms", "completed", before)[0]); cd.Counts != (event.SyncCounts{Unchanged: 2, Total: 2}) {
		t.Errorf("counts %+v, want 2 unchanged", cd.Counts)
	}
	if ev := objectEvents(ms, "cms", before); len(ev) != 0 {
		t.Errorf("objects republished without their checkpoint: %v", ev)
	}
	r.stop(t)

	// 2. The bucket is deleted (and b changes meanwhile): a marked full
	// resync. a's version was published before: inside the duplicate window
	// JetStream drops the copy, so only b's new version reaches the stream.
	if err := f.js.DeleteKeyValue(t.Context(), "relayd-index-"+f.cluster); err != nil {
		t.Fatal(err)
	}
	b = f.updateCM(b, "v", "2")
	all = f.stored()
	before = all[len(all)-1].Seq
	r = f.start(nil, true)
	c := f.createCM("c", nil, nil)
	ms = f.waitStored(20*time.Second, func(m msg) bool { return m.Seq > before && isSync("completed")(m) },
		func(m msg) bool { return isEvent("added", "c", c.ResourceVersion)(m) && m.Env.RelaydOrigin == "watch" })
	started := markers(ms, "cms", "started", before)
	if sd := syncOf(t, started[0]); sd.Reason != "index-lost" || started[0].Env.RelaydEpoch != 3 {
		t.Errorf("sync.started %+v epoch %d, want reason index-lost, epoch 3", sd, started[0].Env.RelaydEpoch)
	}
	if cd := syncOf(t, markers(ms, "cms", "completed", before)[0]); cd.Counts != (event.SyncCounts{Added: 2, Total: 2}) {
		t.Errorf("counts %+v, want 2 added", cd.Counts)
	}
	want := []string{
		"added b@" + b.ResourceVersion + " resync",
		"added c@" + c.ResourceVersion + " watch",
	}
	if got := objectEvents(ms, "cms", before); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("after the bucket was lost:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if v := metricValue(t, r.reg, "relayd_relists_total", map[string]string{"source": "cms", "reason": "index-lost"}); v != 1 {
		t.Errorf("relayd_relists_total{index-lost} = %v, want 1", v)
	}
	if v := metricValue(t, r.reg, "relayd_publish_duplicates_total", map[string]string{"source": "cms"}); v != 1 {
		t.Errorf("relayd_publish_duplicates_total = %v, want 1 (a, republished inside the duplicate window)", v)
	}
	_ = a
}

// TestCheckpointLostBeforeTheFirstObject: a watch that listed an empty
// namespace, then lost its checkpoint, relists as no-checkpoint (the
// bucket's epoch says it listed before), never as a second initial list,
// and publishes what was created meanwhile between the markers.
func TestCheckpointLostBeforeTheFirstObject(t *testing.T) {
	f := newFixture(t, env, natsSrv, `
  - name: cms
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]`)
	r := f.start(nil, true)
	f.waitStored(20*time.Second, isSync("completed"))
	key := "cms." + f.ns
	f.eventually(10*time.Second, "checkpoint", func() error {
		if f.checkpoints()[key].Index == nil {
			return fmt.Errorf("no checkpoint with an index reference yet")
		}
		return nil
	})
	r.stop(t)

	f.editCheckpoint(func(data map[string]string) { delete(data, key) })
	a := f.createCM("a", nil, nil)
	all := f.stored()
	before := all[len(all)-1].Seq
	r = f.start(nil, true)
	ms := f.waitStored(20*time.Second, func(m msg) bool { return m.Seq > before && isSync("completed")(m) })
	started := markers(ms, "cms", "started", before)
	if sd := syncOf(t, started[0]); sd.Reason != "no-checkpoint" || started[0].Env.RelaydEpoch != 2 {
		t.Errorf("sync.started %+v epoch %d, want reason no-checkpoint, epoch 2", sd, started[0].Env.RelaydEpoch)
	}
	if cd := syncOf(t, markers(ms, "cms", "completed", before)[0]); cd.Counts != (event.SyncCounts{Added: 1, Total: 1}) {
		t.Errorf("counts %+v, want 1 added", cd.Counts)
	}
	want := "added a@" + a.ResourceVersion + " resync"
	if got := objectEvents(ms, "cms", before); strings.Join(got, "\n") != want {
		t.Errorf("after the checkpoint was lost:\n%s\nwant:\n%s", strings.Join(got, "\n"), want)
	}
	if v := metricValue(t, r.reg, "relayd_relists_total", map[string]string{"source": "cms", "reason": "no-checkpoint"}); v != 1 {
		t.Errorf("relayd_relists_total{no-checkpoint} = %v, want 1", v)
	}
}

// startedFromNow runs relayd once with a source of initial: none (after
// before, if any), until the watch's checkpoint exists, and stops it. It
// returns the fixture and the watch's checkpoint key.
func startedFromNow(t *testing.T, before func(*fixture)) (*fixture, string) {
	f := newFixture(t, env, natsSrv, `
  - name: cms
    apiVersion: v1
    kind: ConfigMap
    initial: none
    namespaces: [$NS]`)
	if before != nil {
		before(f)
	}
	r := f.start(nil, true)
	key := "cms." + f.ns
	f.eventually(10*time.Second, "checkpoint", func() error {
		if _, ok := f.checkpoints()[key]; !ok {
			return fmt.Errorf("no checkpoint yet")
		}
		return nil
	})
	r.stop(t)
	return f, key
}

// A source with initial: none checkpoints the resourceVersion it starts
// from before any change comes, so a restart resumes from it: a change made
// while relayd was down is relayed as a watch event, without a relist.
func TestStartFromNowResumesAfterARestart(t *testing.T) {
	f, _ := startedFromNow(t, func(f *fixture) { f.createCM("before", nil, nil) })
	a := f.createCM("a", nil, nil)
	r := f.start(nil, true)
	ms := f.waitStored(20*time.Second, isEvent("added", "a", a.ResourceVersion))
	want := "added a@" + a.ResourceVersion + " watch"
	if got := objectEvents(ms, "cms", 0); strings.Join(got, "\n") != want {
		t.Errorf("after a restart:\n%s\nwant:\n%s", strings.Join(got, "\n"), want)
	}
	if m := markers(ms, "cms", "started", 0); len(m) != 0 {
		t.Errorf("%d sync.started after a restart, want none", len(m))
	}
	if v := metricValue(t, r.reg, "relayd_relists_total", map[string]string{"source": "cms", "reason": "no-checkpoint"}); v != 0 {
		t.Errorf("relayd_relists_total{no-checkpoint} = %v, want 0", v)
	}
}

// A source with initial: none starts from now and has published nothing when
// its checkpoint is deleted (or relayd dies before its first checkpoint); a
// change made while relayd is down then comes as a marked relist
// (no-checkpoint): relayd recorded in the bucket that it watched. (It used
// to start from now again: the change was lost without a marker.)
func TestCheckpointLostAfterAStartFromNow(t *testing.T) {
	f, key := startedFromNow(t, nil)
	if n := len(f.stored()); n != 0 {
		t.Fatalf("%d messages stored by a start from now with nothing to relay", n)
	}

	f.editCheckpoint(func(data map[string]string) { delete(data, key) })
	a := f.createCM("a", nil, nil)
	r := f.start(nil, true)
	ms := f.waitStored(20*time.Second, isSync("completed"))
	started := markers(ms, "cms", "started", 0)
	if len(started) != 1 {
		t.Fatalf("%d sync.started, want 1", len(started))
	}
	if sd := syncOf(t, started[0]); sd.Reason != "no-checkpoint" || started[0].Env.RelaydEpoch != 1 {
		t.Errorf("sync.started %+v epoch %d, want reason no-checkpoint, epoch 1", sd, started[0].Env.RelaydEpoch)
	}
	want := "added a@" + a.ResourceVersion + " resync"
	if got := objectEvents(ms, "cms", 0); strings.Join(got, "\n") != want {
		t.Errorf("after the checkpoint was lost:\n%s\nwant:\n%s", strings.Join(got, "\n"), want)
	}
	if v := metricValue(t, r.reg, "relayd_relists_total", map[string]string{"source": "cms", "reason": "no-checkpoint"}); v != 1 {
		t.Errorf("relayd_relists_total{no-checkpoint} = %v, want 1", v)
	}
}

// A run that crashed during a relist left its epoch on the stream only (the
// checkpoint had not moved yet); its bucket, with the epoch floor, is then
// deleted. The next relist (index-lost) takes a higher epoch than the one on
// the stream, read from the checkpoint's stream sequence on: reused, its
// sync markers would repeat the crashed run's Nats-Msg-Ids and JetStream
// would drop them as duplicates (a resync without markers).
func TestIndexLostRelistNeverReusesAnEpochOnTheStream(t *testing.T) {
	f := newFixture(t, env, natsSrv, `
  - name: cms
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]`)
	f.createCM("a", nil, nil)
	r := f.start(nil, true)
	f.waitStored(20*time.Second, isSync("completed"))
	key := "cms." + f.ns
	f.eventually(10*time.Second, "checkpoint", func() error {
		if cp := f.checkpoints()[key]; cp.Index == nil || cp.Epoch != 1 {
			return fmt.Errorf("checkpoint %+v, want epoch 1 with an index reference", cp)
		}
		return nil
	})
	r.stop(t)

	// The crashed run's relist: epoch 2, stored, never checkpointed.
	enc, err := event.NewEncoder(event.EncoderOptions{Cluster: f.cluster, Source: "cms"})
	if err != nil {
		t.Fatal(err)
	}
	m := enc.Control(event.SyncEvent{Namespace: f.ns, Epoch: 2, Reason: event.RelistIndexLost, Time: time.Now()})
	if _, err := f.js.PublishMsg(t.Context(), &nats.Msg{Subject: m.Subject, Header: nats.Header(m.Header), Data: m.Data}); err != nil {
		t.Fatal(err)
	}
	if err := f.js.DeleteKeyValue(t.Context(), "relayd-index-"+f.cluster); err != nil {
		t.Fatal(err)
	}
	all := f.stored()
	before := all[len(all)-1].Seq
	f.start(nil, true)
	ms := f.waitStored(20*time.Second, func(m msg) bool { return m.Seq > before && isSync("completed")(m) })
	started := markers(ms, "cms", "started", before)
	if len(started) == 0 || started[0].Env.RelaydEpoch != 3 || syncOf(t, started[0]).Reason != string(event.RelistIndexLost) {
		t.Fatalf("sync.started after the bucket was lost: %v, want one of epoch 3, reason index-lost", started)
	}
	if c := markers(ms, "cms", "completed", before); len(c) == 0 || c[0].Env.RelaydEpoch != 3 {
		t.Errorf("sync.completed after the bucket was lost: %v, want epoch 3", c)
	}
}
