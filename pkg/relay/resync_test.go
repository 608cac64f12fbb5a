package relay_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/relayd/relayd/pkg/resync"
)

// runResync runs `relayd resync -c conf args...` (the binary) and returns
// its exit code, stdout and stderr.
func runResync(t *testing.T, conf string, args ...string) (int, string, string) {
	t.Helper()
	// --wait bounds a resync whose completion never comes (a broken build).
	cmd := exec.Command(relaydBinary(t), append([]string{"resync", "-c", conf, "--wait", "60s"}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, out.String(), errb.String()
	case errors.As(err, &exit):
		return exit.ExitCode(), out.String(), errb.String()
	}
	t.Fatal(err)
	return 0, "", ""
}

// resyncMarker is what the tests read of a sync marker's data.
type resyncMarker struct {
	Namespace string `json:"namespace"`
	Reason    string `json:"reason"`
	RequestID string `json:"requestId"`
	Full      bool   `json:"full"`
	Epoch     uint64 `json:"epoch"`
}

func (m msg) sync(t *testing.T) resyncMarker {
	t.Helper()
	var d resyncMarker
	if err := json.Unmarshal(m.Env.Data, &d); err != nil {
		t.Fatalf("sync marker %d: %v", m.Seq, err)
	}
	return d
}

// ofRequest splits the messages into the sync markers of request id and
// the object events of origin resync.
func ofRequest(t *testing.T, ms []msg, id string) (markers, objects []msg) {
	t.Helper()
	for _, m := range ms {
		switch {
		case isSync("started")(m) || isSync("completed")(m):
			if m.sync(t).RequestID == id {
				markers = append(markers, m)
			}
		case m.Env.RelaydOrigin == "resync":
			objects = append(objects, m)
		}
	}
	return markers, objects
}

func (f *fixture) writeConfig(yaml string) string {
	f.t.Helper()
	p := filepath.Join(f.t.TempDir(), "config.yaml")
	if err := os.WriteFile(p, []byte(yaml), 0o600); err != nil {
		f.t.Fatal(err)
	}
	return p
}

// `relayd resync` asks the running relayd to relist a source, in both
// content modes: by default only differences are published (none here),
// with --full every object in scope again, with Nats-Msg-Ids JetStream
// stores; --namespace narrows it; the sync markers carry the request id
// and reason requested; the same id twice is one resync.
func TestResyncOnRequest(t *testing.T) {
	for _, mode := range []string{"structured", "binary"} {
		t.Run(mode, func(t *testing.T) {
			f := newFixture(t, env, natsSrv, `
  - name: cms
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS, $NS-b]`+"\ncloudevents:\n  mode: "+mode)
			nsB := f.ns + "-b"
			if _, err := f.cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nsB}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			r := f.start(nil, true)
			// What the source sent JetStream: events of origin resync
			// stored, and publishes JetStream dropped as duplicates.
			sent := func() (resync, dups float64) {
				return metricSumOf(t, r.reg, "relayd_events_total", map[string]string{"source": "cms", "origin": "resync"}),
					metricSumOf(t, r.reg, "relayd_publish_duplicates_total", map[string]string{"source": "cms"})
			}
			for _, n := range []string{"a1", "a2", "a3"} {
				f.createCM(n, nil, map[string]string{"k": n})
			}
			for _, n := range []string{"b1", "b2"} {
				if _, err := f.cs.CoreV1().ConfigMaps(nsB).Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			f.waitStored(30*time.Second, isEvent("added", "a1", ""), isEvent("added", "a2", ""), isEvent("added", "a3", ""), isEvent("added", "b1", ""), isEvent("added", "b2", ""))
			conf := f.writeConfig(f.cfgYAML)
			f.eventually(20*time.Second, "both watches checkpointed", func() error {
				if n := len(f.checkpoints()); n != 2 {
					return fmt.Errorf("%d checkpoints", n)
				}
				return nil
			})
			cps := f.checkpoints()

			// Default: compared with the index, nothing differs.
			before := len(f.stored())
			resync0, dups0 := sent()
			code, out, stderr := runResync(t, conf, "--source", "cms", "--id", "d1")
			if code != 0 {
				t.Fatalf("resync d1: exit %d\n%s%s", code, out, stderr)
			}
			t.Logf("resync d1:\n%s", out)
			for _, want := range []string{"resync d1 of source cms completed: 2 watch(es)\n", "\ntotal 5, added 0, modified 0, deleted 0, unchanged 5\n"} {
				if !strings.Contains(out, want) {
					t.Errorf("resync d1 printed\n%s\nwant %q", out, want)
				}
			}
			markers, objects := ofRequest(t, f.stored()[before:], "d1")
			if len(objects) != 0 {
				t.Errorf("a default resync of an unchanged source published %d object events:\n%s", len(objects), dump(objects))
			}
			checkMarkers(t, markers, "d1", false, f.ns, nsB)
			if resync1, dups1 := sent(); resync1 != resync0 || dups1 != dups0 {
				t.Errorf("a default resync of an unchanged source sent %v events of origin resync and %v duplicates, want none", resync1-resync0, dups1-dups0)
			}

			// --full --namespace: every object of that namespace again, stored.
			before = len(f.stored())
			resync0, dups0 = sent()
			code, out, stderr = runResync(t, conf, "--source", "cms", "--namespace", f.ns, "--full", "--id", "f1")
			if code != 0 {
				t.Fatalf("resync f1: exit %d\n%s%s", code, out, stderr)
			}
			t.Logf("resync f1:\n%s", out)
			if want := fmt.Sprintf("  namespace %s: total 3, added 0, modified 0, deleted 0, unchanged 3\n", f.ns); !strings.Contains(out, want) {
				t.Errorf("resync f1 printed\n%s\nwant %q", out, want)
			}
			after := f.stored()
			markers, objects = ofRequest(t, after[before:], "f1")
			checkMarkers(t, markers, "f1", true, f.ns)
			if len(objects) != 3 {
				t.Fatalf("a full resync of namespace %s stored %d object events, want its 3:\n%s", f.ns, len(objects), dump(after[before:]))
			}
			if resync1, dups1 := sent(); resync1-resync0 != 3 || dups1 != dups0 {
				t.Errorf("a full resync of 3 objects sent %v events of origin resync and %v duplicates, want 3 and none", resync1-resync0, dups1-dups0)
			}
			suffix := fmt.Sprintf("/full/%d", markers[0].sync(t).Epoch)
			for _, m := range objects {
				if m.Env.K8sNamespace != f.ns || !strings.HasSuffix(m.Env.Type, ".object.modified") || !strings.HasSuffix(m.Env.ID, suffix) || !strings.HasSuffix(m.MsgID, "/"+m.Env.ID) {
					t.Errorf("full resync event %d: namespace %s, type %s, id %s, Nats-Msg-Id %s; want namespace %s, modified, id ending in %s", m.Seq, m.Env.K8sNamespace, m.Env.Type, m.Env.ID, m.MsgID, f.ns, suffix)
				}
				if m.Seq < markers[0].Seq || m.Seq > markers[1].Seq {
					t.Errorf("full resync event %d is outside its markers (%d..%d)", m.Seq, markers[0].Seq, markers[1].Seq)
				}
			}

			// Another full resync right after: refused, naming the source
			// and when the next is allowed (resync.minFullInterval, 5m by
			// default), nothing relisted (the check below), counted.
			code, out, stderr = runResync(t, conf, "--source", "cms", "--full", "--id", "f2")
			if want := `relayd resync: resync refused: source "cms": the last full resync started or completed at `; code != 1 || !strings.HasPrefix(stderr, want) ||
				!strings.Contains(stderr, "; the next is allowed from ") || !strings.Contains(stderr, "(resync.minFullInterval 5m0s); a resync without --full is allowed now\n") {
				t.Fatalf("full resync f2 right after f1: exit %d, stdout %q, stderr %q; want exit 1, %s…", code, out, stderr, want)
			}
			t.Logf("full resync f2 right after f1: %s", strings.TrimSpace(stderr))
			if got := metricSumOf(t, r.reg, "relayd_resync_requests_total", map[string]string{"source": "cms", "result": "too_soon"}); got != 1 {
				t.Errorf("relayd_resync_requests_total{result=too_soon} = %v, want 1", got)
			}

			// The same id again: the same resync, nothing relisted.
			code, out, stderr = runResync(t, conf, "--source", "cms", "--namespace", f.ns, "--full", "--id", "f1")
			if code != 0 || !strings.Contains(out, "full resync (same request as before) f1 of source cms completed: 1 watch(es)\n") ||
				!strings.Contains(out, "unchanged 3\n") {
				t.Fatalf("resync f1 again: exit %d\n%s%s", code, out, stderr)
			}
			if again := f.stored(); len(again) != len(after) {
				t.Errorf("the same request id again stored %d more messages:\n%s", len(again)-len(after), dump(again[len(after):]))
			}
			// No checkpoint went back (the lists do not move it; their
			// sync.completed moves it to the list's resourceVersion).
			time.Sleep(time.Second) // a few checkpoint flushes
			for k, after := range f.checkpoints() {
				if before, ok := cps[k]; !ok || rvNum(t, after.ResourceVersion) < rvNum(t, before.ResourceVersion) {
					t.Errorf("checkpoint %s went from %q to %q across the resyncs", k, before.ResourceVersion, after.ResourceVersion)
				}
			}
			if mode == "binary" {
				return // the errors do not depend on the content mode
			}
			resyncErrors(t, f)
		})
	}
}

// checkMarkers checks that markers are one sync.started and one
// sync.completed of request id (reason requested, full) for each of
// namespaces, in that order per namespace.
func checkMarkers(t *testing.T, markers []msg, id string, full bool, namespaces ...string) {
	t.Helper()
	if len(markers) != 2*len(namespaces) {
		t.Fatalf("request %s: %d sync markers, want 2 for each of %v:\n%s", id, len(markers), namespaces, dump(markers))
	}
	for _, ns := range namespaces {
		var phases []string
		for _, m := range markers {
			d := m.sync(t)
			if d.Namespace != ns {
				continue
			}
			if d.Reason != "requested" || d.Full != full {
				t.Errorf("request %s: marker %d has reason %q, full %v; want requested, %v", id, m.Seq, d.Reason, d.Full, full)
			}
			phases = append(phases, m.Env.Type[strings.LastIndex(m.Env.Type, ".")+1:])
		}
		if strings.Join(phases, ",") != "started,completed" {
			t.Errorf("request %s, namespace %s: markers %v, want started,completed", id, ns, phases)
		}
	}
}

// resyncErrors: a source not in the config, a namespace the source does
// not watch, a source no relayd serves, and a responder that never answers
// each end the command with its error and a non-zero exit code.
func resyncErrors(t *testing.T, f *fixture) {
	conf := f.writeConfig(strings.Replace(f.cfgYAML, "\nsources:\n", "\nsources:\n  - {name: ghost, apiVersion: v1, kind: Service}\n", 1))
	ghost := resync.Subject("k8s", f.cluster, "ghost")
	cases := []struct {
		name   string
		args   []string
		code   int
		stderr string
	}{
		{"unknown source", []string{"--source", "nope"}, 2,
			fmt.Sprintf("relayd resync: source \"nope\" is not in %s (its sources: [ghost cms])\nRun 'relayd resync --help' for usage.\n", conf)},
		{"namespace not watched", []string{"--source", "cms", "--namespace", "zzz", "--id", "e1"}, 1,
			fmt.Sprintf("relayd resync: resync refused: source \"cms\" does not watch namespace \"zzz\" (it watches %s, %s-b)\n", f.ns, f.ns)},
		{"no relayd serves it", []string{"--source", "ghost"}, 1,
			"relayd resync: no relayd serves the source \"ghost\": nothing subscribes to " + ghost + " (relayd is not running or not connected to this NATS, or, with sharding, no replica holds the source's Lease)\n"},
	}
	for _, c := range cases {
		code, out, stderr := runResync(t, conf, c.args...)
		if code != c.code || stderr != c.stderr || out != "" {
			t.Errorf("%s: exit %d, stdout %q, stderr\n%q\nwant exit %d, stderr\n%q", c.name, code, out, stderr, c.code, c.stderr)
		}
	}
	// A responder that does not answer.
	sub, err := f.nc.SubscribeSync(ghost)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := f.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	code, out, stderr := runResync(t, conf, "--source", "ghost", "--timeout", "300ms")
	want := "relayd resync: relayd did not answer within 300ms on " + ghost + " (raise --timeout, or see relayd's log; relayd answers only on the inbox prefixes of its resync.requesterInboxPrefixes, which must list this client's _INBOX)\n"
	if code != 1 || stderr != want || out != "" {
		t.Errorf("no answer: exit %d, stdout %q, stderr\n%q\nwant exit 1, stderr\n%q", code, out, stderr, want)
	}
}

// With sharding the request reaches the replica that holds the source's
// Lease, and only it relists; after a hand-over, the new holder does.
func TestResyncReachesTheSourcesOwner(t *testing.T) {
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
	f.cfgYAML += `
sharding:
  enabled: true
  leaseDuration: 3s
  renewDeadline: 2s
  retryPeriod: 200ms
`
	for _, name := range []string{"relayd-s0", "relayd-s1"} {
		if _, err := f.cs.CoordinationV1().Leases(f.ns).Create(t.Context(), &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	rs := map[string]*running{"r0": f.startAs("r0", nil, false), "r1": f.startAs("r1", nil, false)}
	var h map[string]string
	f.eventually(60*time.Second, "one source per replica, both ready", func() error {
		h = holders(t, f, "relayd-s0", "relayd-s1")
		if len(h) != 2 || h["relayd-s0"] == h["relayd-s1"] {
			return fmt.Errorf("holders %v", h)
		}
		for _, r := range rs {
			if err := r.readyErr(); err != nil {
				return err
			}
		}
		return nil
	})
	conf := f.writeConfig(f.cfgYAML)
	requested := func(id, src string) float64 {
		return metricValue(t, rs[id].reg, "relayd_relists_total", map[string]string{"source": src, "reason": "requested"})
	}
	resyncOwnedBy := func(src, owner, reqID string, want float64) {
		t.Helper()
		code, out, stderr := runResync(t, conf, "--source", src, "--id", reqID)
		if code != 0 || !strings.Contains(out, "resync "+reqID+" of source "+src+" completed: 1 watch(es)\n") {
			t.Fatalf("resync %s: exit %d\n%s%s", src, code, out, stderr)
		}
		for id := range rs {
			got, w := requested(id, src), 0.0
			if id == owner {
				w = want
			}
			if got != w {
				t.Errorf("resync %s (%s), owner %s: relayd_relists_total{source=%s,reason=requested} on %s = %v, want %v", src, reqID, owner, src, id, got, w)
			}
		}
	}
	for _, src := range []string{"s0", "s1"} {
		resyncOwnedBy(src, h["relayd-"+src], "q-"+src, 1)
	}
	// The owner of s0 stops: the other replica takes s0 over, and answers.
	old := h["relayd-s0"]
	other := map[string]string{"r0": "r1", "r1": "r0"}[old]
	rs[old].stop(t)
	f.eventually(30*time.Second, "s0 handed over", func() error {
		if got := holders(t, f, "relayd-s0")["relayd-s0"]; got != other {
			return fmt.Errorf("s0 held by %q", got)
		}
		return rs[other].readyErr()
	})
	delete(rs, old)
	resyncOwnedBy("s0", other, "q-s0-after", 1)
}

// metricSumOf is the sum of the samples of name whose labels include labels
// (0 when none).
func metricSumOf(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue next
				}
			}
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}
