package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"k8s.io/client-go/kubernetes"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/internal/testutil"
)

var (
	env     *testenv.Env
	natsSrv *testenv.NATS
	runs    atomic.Int64
)

// The watch cache is off so that a compaction gives relayd a 410 at once.
func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, testenv.Options{DisableWatchCache: true}, &env, &natsSrv))
}

// lane is one relayd (one CloudEvents mode, its own cluster name and
// stream) and one example consumer that keeps its view.
type lane struct {
	mode, cluster, stream string
	relayd                *testenv.Relayd
	view                  *View

	mu      sync.Mutex
	applied []Applied
	stop    context.CancelFunc
	done    chan error
}

func (l *lane) record(a Applied) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.applied = append(l.applied, a)
}

// gaps are the reasons of the sync.completed markers applied, in order.
func (l *lane) gaps() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, a := range l.applied {
		if a.Gap != "" {
			out = append(out, a.Gap)
		}
	}
	return out
}

func (l *lane) seen(pred func(Applied) bool) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, a := range l.applied {
		if pred(a) {
			n++
		}
	}
	return n
}

// The example consumer's view equals a LIST of the cluster after live
// changes, after relayd is killed with -9 (and the consumer restarted: its
// durable consumer and its view resume), and after a 410 gap during which
// objects were created, changed and deleted; in both CloudEvents modes.
// Every message on both streams is then checked against the JSON Schema and
// decoded by CloudEvents sdk-go (conformance_test.go).
func TestViewFollowsTheClusterThroughRestartsAndAGap(t *testing.T) {
	ctx := t.Context()
	ns, cpNS := env.Namespace(t), env.Namespace(t)
	cs := env.Clientset(t, false)
	nc, err := nats.Connect(natsSrv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	lister, err := NewLister(writeKubeconfig(t))
	if err != nil {
		t.Fatal(err)
	}
	c := &cms{t: t, cs: cs, ns: ns}
	c.create("pre") // exists before relayd starts: origin initial
	// Names of their own: a second run (-count) shares the NATS server.
	run := runs.Add(1)
	lanes := []*lane{
		{mode: "structured", cluster: fmt.Sprint("exs", run), stream: fmt.Sprint("EXS", run)},
		{mode: "binary", cluster: fmt.Sprint("exb", run), stream: fmt.Sprint("EXB", run)},
	}
	for _, l := range lanes {
		l.relayd = env.Relayd(t, relaydConfig(l, ns, cpNS))
		l.relayd.IndexCheck()
		l.relayd.Start()
		if l.view, err = OpenView(ctx, js, "view-"+l.cluster); err != nil {
			t.Fatal(err)
		}
		startConsumer(t, js, l, lister)
	}
	t.Cleanup(func() {
		for _, l := range lanes {
			stopConsumer(t, l)
		}
	})
	for _, l := range lanes {
		testutil.Eventually(t, 60*time.Second, l.mode+": the initial snapshot is consumed", func() error {
			if l.seen(func(a Applied) bool { return a.Gap == "initial" }) == 0 {
				return errors.New("no sync.completed of reason initial yet")
			}
			return nil
		})
	}

	// Live changes; the last one is an update, so that the checkpoint can
	// be waited for.
	for i := range 8 {
		c.create(fmt.Sprintf("live-%d", i))
	}
	c.delete("live-7")
	for i := range 4 {
		c.update(fmt.Sprintf("live-%d", i))
	}
	waitViews(t, cs, ns, lanes, "after live changes")

	// kill -9 of relayd with a current checkpoint, changes while it is down,
	// the consumer restarted: relayd resumes its watch (no relist) and the
	// consumer its durable consumer.
	waitCheckpoints(t, cs, cpNS, ns, lanes, c.lastRV)
	for _, l := range lanes {
		l.relayd.Kill()
		stopConsumer(t, l)
	}
	c.create("while-killed")
	c.delete("live-6")
	c.update("live-0")
	for _, l := range lanes {
		l.relayd.Start()
		startConsumer(t, js, l, lister)
	}
	waitViews(t, cs, ns, lanes, "after kill -9 of relayd and a consumer restart")
	c.update("live-1")
	waitViews(t, cs, ns, lanes, "after a change once relayd is back")

	// A 410 gap: relayd stopped, changes and deletes, history compacted.
	waitCheckpoints(t, cs, cpNS, ns, lanes, c.lastRV)
	for _, l := range lanes {
		l.relayd.Stop()
	}
	c.create("in-gap")
	c.update("live-2")
	c.update("while-killed")
	c.delete("live-3")
	c.delete("live-4")
	c.delete("while-killed")
	if _, err := env.CompactNow(ctx); err != nil {
		t.Fatal(err)
	}
	for _, l := range lanes {
		l.relayd.Start()
	}
	waitViews(t, cs, ns, lanes, "after a 410 gap")
	for _, l := range lanes {
		if gaps := l.gaps(); !slices.Equal(gaps, []string{"initial", "expired"}) {
			t.Errorf("%s: relists %v, want [initial expired] (a kill -9 with a current checkpoint resumes without one)", l.mode, gaps)
		}
		if n := l.seen(func(a Applied) bool { return a.Event.RelaydFinalUnknown && a.Action == Delete }); n != 3 {
			t.Errorf("%s: %d deletes with final state unknown applied, want 3 (live-3, live-4, while-killed)", l.mode, n)
		}
	}
	checkStreams(t, js, lanes)
}

func relaydConfig(l *lane, ns, cpNS string) string {
	return fmt.Sprintf(`cluster: %s
nats:
  url: %s
  stream:
    name: %s
    create: true
cloudevents:
  mode: %s
checkpoint:
  namespace: %s
  name: relayd-checkpoint-%s
  flushInterval: 1s
shutdown:
  drainTimeout: 5s
heartbeatInterval: 1s
sources:
  - name: cms
    apiVersion: v1
    kind: ConfigMap
    namespaces: [%s]
    drop: ['data["secret"]']
    changedPaths: [data, metadata.labels]
`, l.cluster, natsSrv.URL(), l.stream, l.mode, cpNS, l.cluster, ns)
}

func writeKubeconfig(t *testing.T) string {
	t.Helper()
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := env.WriteKubeconfig(kc, false); err != nil {
		t.Fatal(err)
	}
	return kc
}

func startConsumer(t *testing.T, js jetstream.JetStream, l *lane, lister Lister) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	l.stop, l.done = cancel, make(chan error, 1)
	o := Options{JS: js, Stream: l.stream, Durable: "example", Cluster: l.cluster, Subjects: []string{"k8s." + l.cluster + ".>"},
		View: l.view, Lister: lister, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Applied: l.record}
	// The stream is created by relayd: wait for it.
	testutil.Eventually(t, 60*time.Second, l.stream+" exists", func() error {
		_, err := js.Stream(ctx, l.stream)
		return err
	})
	go func() { l.done <- Run(ctx, o) }()
}

func stopConsumer(t *testing.T, l *lane) {
	t.Helper()
	if l.stop == nil {
		return
	}
	l.stop()
	if err := <-l.done; err != nil {
		t.Errorf("%s consumer: %v", l.mode, err)
	}
	l.stop = nil
}

// waitViews waits until every lane's view holds exactly the namespace's
// ConfigMaps, each at its current resourceVersion.
func waitViews(t *testing.T, cs *kubernetes.Clientset, ns string, lanes []*lane, when string) {
	t.Helper()
	for _, l := range lanes {
		testutil.Eventually(t, 60*time.Second, l.mode+" view equals a LIST "+when, func() error {
			list, err := cs.CoreV1().ConfigMaps(ns).List(t.Context(), metav1.ListOptions{})
			if err != nil {
				return err
			}
			want := map[string]string{}
			for _, cm := range list.Items {
				want[string(cm.UID)] = cm.Name + "@" + cm.ResourceVersion
			}
			entries, err := l.view.Entries(t.Context(), "cms")
			if err != nil {
				return err
			}
			got := map[string]string{}
			for _, e := range entries {
				if !e.Deleted {
					got[e.UID] = e.Name + "@" + e.ResourceVersion
				}
			}
			if !maps.Equal(got, want) {
				return fmt.Errorf("view %v\nLIST %v", slices.Sorted(maps.Values(got)), slices.Sorted(maps.Values(want)))
			}
			return nil
		})
	}
}

// waitCheckpoints waits until every lane's relayd persisted a position at
// or after rv in its checkpoint ConfigMap (key "cms.<ns>").
func waitCheckpoints(t *testing.T, cs *kubernetes.Clientset, cpNS, ns string, lanes []*lane, rv string) {
	t.Helper()
	for _, l := range lanes {
		testutil.Eventually(t, 30*time.Second, l.mode+": checkpoint at "+rv, func() error {
			cm, err := cs.CoreV1().ConfigMaps(cpNS).Get(t.Context(), "relayd-checkpoint-"+l.cluster, metav1.GetOptions{})
			if err != nil {
				return err
			}
			var pos struct {
				ResourceVersion string `json:"resourceVersion"`
			}
			if err := json.Unmarshal([]byte(cm.Data["cms."+ns]), &pos); err != nil {
				return fmt.Errorf("checkpoint key cms.%s: %w", ns, err)
			}
			if c, err := resourceversion.CompareResourceVersion(pos.ResourceVersion, rv); err != nil || c < 0 {
				return fmt.Errorf("checkpoint at %q (%v)", pos.ResourceVersion, err)
			}
			return nil
		})
	}
}

// cms makes ConfigMap changes in one namespace.
type cms struct {
	t      *testing.T
	cs     *kubernetes.Clientset
	ns     string
	n      int
	lastRV string // of the last create or update
}

func (c *cms) create(name string) {
	c.t.Helper()
	cm, err := c.cs.CoreV1().ConfigMaps(c.ns).Create(c.t.Context(), &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Data:       map[string]string{"v": "0", "secret": "s3cr3t"},
	}, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	c.lastRV = cm.ResourceVersion
}

func (c *cms) update(name string) {
	c.t.Helper()
	cm, err := c.cs.CoreV1().ConfigMaps(c.ns).Get(c.t.Context(), name, metav1.GetOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	c.n++
	cm.Data["v"] = fmt.Sprint(c.n)
	cm, err = c.cs.CoreV1().ConfigMaps(c.ns).Update(c.t.Context(), cm, metav1.UpdateOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	c.lastRV = cm.ResourceVersion
}

func (c *cms) delete(name string) {
	c.t.Helper()
	if err := c.cs.CoreV1().ConfigMaps(c.ns).Delete(c.t.Context(), name, metav1.DeleteOptions{}); err != nil {
		c.t.Fatal(err)
	}
}
