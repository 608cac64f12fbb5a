package consumernode

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
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
	"github.com/relayd/relayd/pkg/stream"
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
// stream) and one Node.js consumer that keeps its view in a state file.
type lane struct {
	mode, cluster, stream string
	relayd                *testenv.Relayd
	state                 string // the consumer's --state file

	proc   *exec.Cmd
	exited chan error
	stdout *lines
	stderr *lines
}

// The Node.js example consumer's view (its state file) equals a LIST of the
// cluster, names, uids and resourceVersions, after live changes; after
// relayd and the consumer are both killed with -9 and changes are made
// while they are down; after a 410 gap (relayd stopped, changes, etcd
// compacted: reason expired, deletes with final state unknown); and after
// relayd lost its object index while objects were deleted (reason
// index-lost: relayd cannot publish those deletes, the consumer's
// reconcile by a LIST must remove them). In both CloudEvents modes. The
// consumer also reports relayd's heartbeats missing while relayd is down
// and resumed once it is back.
func TestNodeConsumerFollowsTheCluster(t *testing.T) {
	script := buildConsumer(t)
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
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig, false); err != nil {
		t.Fatal(err)
	}
	c := &cms{t: t, cs: cs, ns: ns}
	c.create("pre") // exists before relayd starts: origin initial
	run := runs.Add(1)
	lanes := []*lane{
		{mode: "structured", cluster: fmt.Sprint("nds", run), stream: fmt.Sprint("NDS", run)},
		{mode: "binary", cluster: fmt.Sprint("ndb", run), stream: fmt.Sprint("NDB", run)},
	}
	stateDir := t.TempDir()
	for _, l := range lanes {
		l.state = filepath.Join(stateDir, l.cluster+".json")
		l.relayd = env.Relayd(t, relaydConfig(l, ns, cpNS))
		l.relayd.IndexCheck()
		l.relayd.Start()
		l.start(t, js, script, kubeconfig)
	}
	t.Cleanup(func() {
		for _, l := range lanes {
			l.kill()
			if t.Failed() {
				t.Logf("%s consumer stdout:\n%s\nstderr:\n%s", l.mode, l.stdout.text(), l.stderr.String())
			}
		}
	})
	for _, l := range lanes {
		l.waitFor(t, "the initial snapshot is consumed", func(o output) bool { return o.Event == "sync.completed" && o.Reason == "initial" })
	}

	for i := range 8 {
		c.create(fmt.Sprintf("live-%d", i))
	}
	c.delete("live-7")
	for i := range 4 {
		c.update(fmt.Sprintf("live-%d", i))
	}
	waitViews(t, cs, ns, lanes, "after live changes")

	// kill -9 of relayd and of the consumer, changes while both are down:
	// relayd resumes its watch from its checkpoint (no relist), the
	// consumer its durable consumer and its view.
	waitCheckpoints(t, cs, cpNS, ns, lanes, c.lastRV)
	for _, l := range lanes {
		l.relayd.Kill()
		l.kill()
	}
	c.create("while-killed")
	c.delete("live-6")
	c.update("live-0")
	for _, l := range lanes {
		l.relayd.Start()
		l.start(t, js, script, kubeconfig)
	}
	waitViews(t, cs, ns, lanes, "after kill -9 of relayd and of the consumer")
	c.update("live-1")
	waitViews(t, cs, ns, lanes, "after a change once relayd is back")

	// A 410 gap: relayd stopped, changes and deletes, history compacted.
	// Meanwhile the consumer, caught up, misses relayd's heartbeats.
	waitCheckpoints(t, cs, cpNS, ns, lanes, c.lastRV)
	var missing, resumed []int
	for _, l := range lanes {
		missing = append(missing, strings.Count(l.stderr.String(), "heartbeat missing"))
		resumed = append(resumed, strings.Count(l.stderr.String(), "heartbeat resumed"))
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
	for i, l := range lanes {
		l.waitLog(t, "heartbeat missing", missing[i])
		l.relayd.Start()
	}
	waitViews(t, cs, ns, lanes, "after a 410 gap")
	for i, l := range lanes {
		l.waitLog(t, "heartbeat resumed", resumed[i])
	}

	// relayd's object index lost while it is down, objects deleted
	// meanwhile: its relist (index-lost) cannot publish their deletes.
	for _, l := range lanes {
		l.relayd.Stop()
		if err := js.DeleteKeyValue(ctx, "relayd-index-"+l.cluster); err != nil {
			t.Fatal(err)
		}
	}
	c.delete("live-0")
	c.delete("live-1")
	c.update("live-2")
	c.create("index-lost")
	for _, l := range lanes {
		l.relayd.Start()
	}
	waitViews(t, cs, ns, lanes, "after relayd lost its index")

	for _, l := range lanes {
		var reasons []string
		reconciled, finalUnknown := 0, 0
		for _, o := range l.stdout.parsed(t) {
			if o.Event == "sync.completed" {
				reasons = append(reasons, o.Reason)
				reconciled += o.Reconciled
			}
			if o.FinalUnknown && o.Action == "delete" {
				finalUnknown++
			}
		}
		if !slices.Equal(reasons, []string{"initial", "expired", "index-lost"}) {
			t.Errorf("%s: relists %v, want [initial expired index-lost] (a kill -9 with a current checkpoint resumes without one)", l.mode, reasons)
		}
		if finalUnknown != 3 {
			t.Errorf("%s: %d deletes with final state unknown applied, want 3 (live-3, live-4, while-killed)", l.mode, finalUnknown)
		}
		if reconciled != 2 {
			t.Errorf("%s: the reconcile after index-lost removed %d entries, want 2 (live-0, live-1)", l.mode, reconciled)
		}
		if s := l.stderr.String(); strings.Contains(s, "terminated") || strings.Contains(s, `"level":"error"`) {
			t.Errorf("%s: the consumer terminated messages or logged errors:\n%s", l.mode, s)
		}
	}
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
`, l.cluster, natsSrv.URL(), l.stream, l.mode, cpNS, l.cluster, ns)
}

// start starts the Node.js consumer of the lane (once relayd created its
// stream), keeping what it prints.
func (l *lane) start(t *testing.T, js jetstream.JetStream, script, kubeconfig string, extra ...string) {
	t.Helper()
	testutil.Eventually(t, 60*time.Second, l.stream+" exists", func() error {
		_, err := js.Stream(t.Context(), l.stream)
		return err
	})
	if l.stdout == nil {
		l.stdout, l.stderr = &lines{}, &lines{}
	}
	args := []string{script, "--server", natsSrv.URL(), "--stream", l.stream, "--cluster", l.cluster, "--durable", "node", "--state", l.state}
	if kubeconfig != "" {
		args = append(args, "--kubeconfig", kubeconfig)
	}
	args = append(args, extra...)
	cmd := exec.Command("node", args...)
	cmd.Stdout, cmd.Stderr = l.stdout, l.stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("node %s: %v", script, err)
	}
	l.proc, l.exited = cmd, make(chan error, 1)
	go func() { l.exited <- cmd.Wait() }()
}

// kill is kill -9 of the consumer.
func (l *lane) kill() {
	if l.proc == nil {
		return
	}
	_ = l.proc.Process.Kill()
	<-l.exited
	l.proc = nil
}

// alive fails when the consumer exited: waiting for it cannot help then.
func (l *lane) alive() error {
	select {
	case err := <-l.exited:
		l.exited <- err
		return fmt.Errorf("the %s consumer exited (%v):\n%s", l.mode, err, l.stderr.String())
	default:
		return nil
	}
}

// waitLog waits until the consumer logged msg more than before times.
func (l *lane) waitLog(t *testing.T, msg string, before int) {
	t.Helper()
	testutil.EventuallyUnless(t, 30*time.Second, l.mode+": the consumer logs "+msg, l.alive, func() error {
		if n := strings.Count(l.stderr.String(), msg); n <= before {
			return fmt.Errorf("logged %d times, %d before", n, before)
		}
		return nil
	})
}

func (l *lane) waitFor(t *testing.T, what string, pred func(output) bool) {
	t.Helper()
	testutil.EventuallyUnless(t, 60*time.Second, l.mode+": "+what, l.alive, func() error {
		if slices.ContainsFunc(l.stdout.parsed(t), pred) {
			return nil
		}
		return errors.New("not printed yet")
	})
}

// output is one line the consumer prints.
type output struct {
	Seq          uint64 `json:"seq"`
	Event        string `json:"event"`
	Source       string `json:"source"`
	Reason       string `json:"reason"`
	Reconciled   int    `json:"reconciled"`
	Action       string `json:"action"`
	Name         string `json:"name"`
	FinalUnknown bool   `json:"finalUnknown"`
	Scope        string `json:"scope"`
	Relist       string `json:"relist"`
	Changed      int    `json:"changed"`
}

// viewFile is the consumer's state file (src/view.ts).
type viewFile struct {
	StreamSeq uint64 `json:"streamSeq"`
	Objects   map[string]struct {
		Source          string `json:"source"`
		Name            string `json:"name"`
		UID             string `json:"uid"`
		ResourceVersion string `json:"resourceVersion"`
		Deleted         bool   `json:"deleted"`
	} `json:"objects"`
}

// view reads the lane's state file: uid → name@resourceVersion of the
// live objects of source cms.
func (l *lane) view() (map[string]string, error) {
	all, err := l.viewAll()
	if err != nil {
		return nil, err
	}
	got := map[string]string{}
	for k, v := range all {
		if uid, ok := strings.CutPrefix(k, "cms/"); ok {
			got[uid] = v
		}
	}
	return got, nil
}

// viewAll reads the lane's state file: source/uid → name@resourceVersion
// of the live objects.
func (l *lane) viewAll() (map[string]string, error) {
	b, err := os.ReadFile(l.state)
	if err != nil {
		return nil, err
	}
	var v viewFile
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, fmt.Errorf("%s: %w", l.state, err)
	}
	got := map[string]string{}
	for k, e := range v.Objects {
		if k != e.Source+"/"+e.UID {
			return nil, fmt.Errorf("%s: entry %q holds source %q uid %q", l.state, k, e.Source, e.UID)
		}
		if !e.Deleted {
			got[k] = e.Name + "@" + e.ResourceVersion
		}
	}
	return got, nil
}

// waitViews waits until every lane's view holds exactly the namespace's
// ConfigMaps, each with its uid at its current resourceVersion.
func waitViews(t *testing.T, cs *kubernetes.Clientset, ns string, lanes []*lane, when string) {
	t.Helper()
	waitViewsSelected(t, cs, ns, "", lanes, when)
}

// waitViewsSelected is waitViews for the ConfigMaps a label selector
// selects.
func waitViewsSelected(t *testing.T, cs *kubernetes.Clientset, ns, selector string, lanes []*lane, when string) {
	t.Helper()
	for _, l := range lanes {
		testutil.EventuallyUnless(t, 60*time.Second, l.mode+" view equals a LIST "+when, l.alive, func() error {
			list, err := cs.CoreV1().ConfigMaps(ns).List(t.Context(), metav1.ListOptions{LabelSelector: selector})
			if err != nil {
				return err
			}
			want := map[string]string{}
			for _, cm := range list.Items {
				want[string(cm.UID)] = cm.Name + "@" + cm.ResourceVersion
			}
			got, err := l.view()
			if err != nil {
				return err
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

// lines keeps what a process prints on stdout, safe for the writer and a
// reader at once.
type lines struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lines) text() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// parsed returns the complete lines printed so far, decoded; a line that
// is not the consumer's JSON fails the test.
func (l *lines) parsed(t *testing.T) []output {
	t.Helper()
	var out []output
	text := l.text()
	text = text[:strings.LastIndexByte(text, '\n')+1] // a line still being written is left for later
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var o output
		if err := json.Unmarshal(sc.Bytes(), &o); err != nil {
			t.Fatalf("the consumer printed %q: %v", sc.Text(), err)
		}
		out = append(out, o)
	}
	return out
}

func (l *lines) String() string { return l.text() }

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

// docs/CONSUMING.md, "Bootstrapping a new consumer": a new consumer on a
// stream that lost its beginning (30 messages, discard old) starts after
// the stream's last message and loads its view by a LIST of its --follow
// scope; its view then equals a LIST, it applies no message stored before
// it started, and it follows the changes after. Killed, and restarted once
// messages it did not read (a delete among them) left the stream, it
// LISTs again before it resumes, and its view equals a LIST.
func TestNodeConsumerBootstrapsByAList(t *testing.T) {
	script := buildConsumer(t)
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
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig, false); err != nil {
		t.Fatal(err)
	}
	c := &cms{t: t, cs: cs, ns: ns}
	for i := range 4 {
		c.create(fmt.Sprintf("cm-%d", i))
	}
	n := runs.Add(1)
	l := &lane{mode: "structured", cluster: fmt.Sprint("ndboot", n), stream: fmt.Sprint("NDBOOT", n), state: filepath.Join(t.TempDir(), "view.json")}
	cfg := stream.Want{Name: l.stream, Subject: "k8s." + l.cluster + ".>", DuplicateWindow: 2 * time.Minute, MaxAge: time.Hour, MaxBytes: -1,
		Storage: jetstream.FileStorage}.Config()
	cfg.MaxMsgs, cfg.Discard = 30, jetstream.DiscardOld
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	l.relayd = env.Relayd(t, relaydConfig(l, ns, cpNS))
	l.relayd.Start()
	s, err := js.Stream(ctx, l.stream)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 60*time.Second, "relayd's initial list", func() error {
		_, err := s.GetLastMsgForSubject(ctx, "k8s."+l.cluster+"._relayd.cms.sync.completed")
		return err
	})
	for range 40 {
		c.update("cm-3")
	}
	testutil.Eventually(t, 60*time.Second, "relayd published the last change", func() error {
		m, err := s.GetLastMsgForSubject(ctx, "k8s."+l.cluster+".core.v1.configmaps."+ns+".cm-3.modified")
		if err != nil {
			return err
		}
		if id := m.Header.Get("Nats-Msg-Id"); !strings.HasSuffix(id, "/"+c.lastRV) {
			return fmt.Errorf("last cm-3 message %s, want resourceVersion %s", id, c.lastRV)
		}
		return nil
	})
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.FirstSeq <= 1 {
		t.Fatalf("the stream starts at %d: it lost nothing", info.State.FirstSeq)
	}
	l.start(t, js, script, kubeconfig, "--follow", "cms=v1/configmaps@"+ns)
	t.Cleanup(func() {
		l.kill()
		if t.Failed() {
			t.Logf("consumer stdout:\n%s\nstderr:\n%s", l.stdout.text(), l.stderr.String())
		}
	})
	waitViews(t, cs, ns, []*lane{l}, "a new consumer bootstrapped by a LIST")
	c.update("cm-0")
	c.delete("cm-1")
	waitViews(t, cs, ns, []*lane{l}, "after changes once bootstrapped")

	// The consumer down while messages it did not read leave the stream,
	// a delete among them: restarted, it LISTs before it resumes.
	l.kill()
	b, err := os.ReadFile(l.state)
	if err != nil {
		t.Fatal(err)
	}
	var v viewFile
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	c.delete("cm-2")
	for range 40 {
		c.update("cm-3")
	}
	testutil.Eventually(t, 60*time.Second, "the stream lost cm-2's delete, which the consumer did not read", func() error {
		// relayd published the last change, so cm-2's delete before it.
		m, err := s.GetLastMsgForSubject(ctx, "k8s."+l.cluster+".core.v1.configmaps."+ns+".cm-3.modified")
		if err != nil {
			return err
		}
		if id := m.Header.Get("Nats-Msg-Id"); !strings.HasSuffix(id, "/"+c.lastRV) {
			return fmt.Errorf("last cm-3 message %s, want resourceVersion %s", id, c.lastRV)
		}
		info, err := s.Info(ctx)
		if err != nil {
			return err
		}
		if info.State.FirstSeq <= v.StreamSeq+1 {
			return fmt.Errorf("the stream starts at %d, the consumer read up to %d", info.State.FirstSeq, v.StreamSeq)
		}
		if _, err := s.GetLastMsgForSubject(ctx, "k8s."+l.cluster+".core.v1.configmaps."+ns+".cm-2.deleted"); !errors.Is(err, jetstream.ErrMsgNotFound) {
			return fmt.Errorf("cm-2's delete: %v", err)
		}
		return nil
	})
	l.start(t, js, script, kubeconfig, "--follow", "cms=v1/configmaps@"+ns)
	waitViews(t, cs, ns, []*lane{l}, "a consumer restarted after the stream lost messages it did not read")

	var relists []string
	for _, o := range l.stdout.parsed(t) {
		if o.Relist != "" {
			relists = append(relists, fmt.Sprintf("%s %s %d", o.Relist, o.Source, o.Changed))
		}
		if o.Seq != 0 && o.Seq <= info.State.LastSeq {
			t.Errorf("applied message %d, stored before the consumer started (the stream ended at %d)", o.Seq, info.State.LastSeq)
		}
	}
	// bootstrap: the 4 ConfigMaps; lost-messages: cm-2's tombstone and at
	// least cm-3's newer version.
	if len(relists) != 2 || relists[0] != "bootstrap cms 4" || !strings.HasPrefix(relists[1], "lost-messages cms ") || relists[1] == "lost-messages cms 0" ||
		relists[1] == "lost-messages cms 1" {
		t.Errorf("LISTs %q, want [bootstrap cms 4] then lost-messages of cms changing at least 2 entries", relists)
	}
}

// With a filtered source, the Node.js consumer's view holds exactly the
// objects in the filter's scope: a scope-left delete (relaydscope left)
// removes an object that still exists, a scope-entered add (relaydscope
// entered) adds one that existed; in both CloudEvents modes.
func TestNodeConsumerFollowsAFilter(t *testing.T) {
	script := buildConsumer(t)
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
	run := runs.Add(1)
	lanes := []*lane{
		{mode: "structured", cluster: fmt.Sprint("ndfs", run), stream: fmt.Sprint("NDFS", run)},
		{mode: "binary", cluster: fmt.Sprint("ndfb", run), stream: fmt.Sprint("NDFB", run)},
	}
	stateDir := t.TempDir()
	for _, l := range lanes {
		l.state = filepath.Join(stateDir, l.cluster+".json")
		l.relayd = env.Relayd(t, relaydConfig(l, ns, cpNS)+
			"    filter: \"has(object.metadata.labels) && 'in' in object.metadata.labels\"\n")
		l.relayd.IndexCheck()
		l.relayd.Start()
		l.start(t, js, script, "")
	}
	t.Cleanup(func() {
		for _, l := range lanes {
			l.kill()
			if t.Failed() {
				t.Logf("%s consumer stdout:\n%s\nstderr:\n%s", l.mode, l.stdout.text(), l.stderr.String())
			}
		}
	})
	for _, l := range lanes {
		l.waitFor(t, "the initial snapshot is consumed", func(o output) bool { return o.Event == "sync.completed" && o.Reason == "initial" })
	}
	cms := cs.CoreV1().ConfigMaps(ns)
	for _, name := range []string{"a", "b", "c"} {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"v": "0"}}
		if name != "c" {
			cm.Labels = map[string]string{"in": "1"}
		}
		if _, err := cms.Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitViewsSelected(t, cs, ns, "in", lanes, "of the filter's scope after creates")
	set := func(name string, in bool) {
		t.Helper()
		cm, err := cms.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cm.Labels = nil
		if in {
			cm.Labels = map[string]string{"in": "1"}
		}
		if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	set("a", false) // leaves
	set("c", true)  // enters
	waitViewsSelected(t, cs, ns, "in", lanes, "of the filter's scope after a left and c entered")
	for _, l := range lanes {
		// The view file is saved before the message's line is printed:
		// wait for the line of the last scope event before comparing.
		l.waitFor(t, "c's scope-entered add is printed", func(o output) bool { return o.Name == "c" && o.Scope == "entered" })
		var scoped []string
		for _, o := range l.stdout.parsed(t) {
			if o.Scope != "" {
				scoped = append(scoped, o.Name+":"+o.Event+":"+o.Scope+":"+o.Action)
			}
		}
		if want := []string{"a:deleted:left:delete", "c:added:entered:store"}; !slices.Equal(scoped, want) {
			t.Errorf("%s: scope events applied %v, want %v", l.mode, scoped, want)
		}
	}
}
