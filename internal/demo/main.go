// Command demo is `make demo`: it starts etcd and kube-apiserver (child
// processes) and a NATS server with JetStream (embedded), runs relayd on a
// demo config, makes a scripted series of creates, updates and deletes, and
// shows the events arriving through `relayd tail`. It checks that exactly
// the expected events arrived, then stops relayd with SIGTERM and shows the
// checkpoint it wrote.
//
// Every process it starts is stopped at the end, on failure and on Ctrl-C;
// children also get SIGKILL should the demo itself die. Everything listens
// on 127.0.0.1 with random ports and lives in one temp dir, removed at the
// end (kept after a failure, for its logs). Exit status: 0 success, 1
// failure, 130 interrupted.
//
// It runs $RELAYD_BIN (bin/relayd) and the servers in $RELAYD_TESTENV_BIN;
// `make demo` builds both first.
package main

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"text/template"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/relayd/relayd/internal/testenv"
)

//go:embed relayd.yaml.tmpl
var configTemplate string

const (
	checkpointNS   = "relayd" // must match relayd.yaml.tmpl
	checkpointName = "relayd-checkpoint"
	subject        = "k8s.>"

	readyTimeout  = 90 * time.Second // relayd start until every watch listed
	eventsTimeout = 30 * time.Second // end of the script until every event arrived
	stepPause     = 500 * time.Millisecond
	relaydGrace   = 15 * time.Second // > shutdown.drainTimeout in the config
)

var (
	widgetGVR = testenv.WidgetGVR
)

// The watches in relayd.yaml.tmpl, as `relayd tail` prints their sync
// markers (source/namespace, "-" for all namespaces or cluster-scoped).
var watches = []string{"configmaps/demo", "widgets/-", "namespaces/-"}

func main() { os.Exit(run()) }

// checkpointKey is the checkpoint ConfigMap's key of a watch:
// "<source>.<namespace>", or "<source>" for all namespaces.
func checkpointKey(watch string) string {
	return strings.TrimSuffix(strings.Replace(watch, "/", ".", 1), ".-")
}

type demo struct {
	out  *printer
	t0   time.Time
	bin  string // relayd
	tmp  string
	env  *testenv.Env
	nats *testenv.NATS
	cs   kubernetes.Interface
	dyn  dynamic.Interface

	relayd *child
	tail   *child
	events *eventLog

	sandbox bool // make sandbox: no script, run until Ctrl-C

	want  []expectation
	never []forbidden
	cp    map[string]string // the checkpoint ConfigMap's data after shutdown
}

func run() int {
	sandbox := flag.Bool("sandbox", false, "start the servers and relayd on the demo config, print how to reach them, and keep them running until Ctrl-C (make sandbox)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	d := &demo{out: &printer{w: os.Stdout}, t0: time.Now(), events: newEventLog(), sandbox: *sandbox}
	err := d.run(ctx)
	interrupted := ctx.Err() != nil
	if d.sandbox && err == nil {
		// Ctrl-C is how a sandbox ends.
		d.cleanup(false)
		d.out.banner("sandbox stopped after %s; every process it started has stopped and its working dir is removed", d.since())
		return 0
	}
	switch {
	case interrupted:
		d.out.banner("interrupted: stopping everything the demo started (this takes a few seconds)")
	case err != nil:
		d.out.banner("FAILED")
		d.out.say("%v", err)
	}
	d.cleanup(err != nil && !interrupted)
	switch {
	case interrupted:
		d.out.banner("demo interrupted after %s; every process it started has stopped", d.since())
		return 130
	case err != nil:
		d.out.banner("demo FAILED after %s (see above)", d.since())
		return 1
	}
	d.summary()
	return 0
}

func (d *demo) since() time.Duration { return time.Since(d.t0).Round(100 * time.Millisecond) }

func (d *demo) run(ctx context.Context) error {
	d.bin = os.Getenv("RELAYD_BIN")
	if d.bin == "" {
		return errors.New("RELAYD_BIN is not set: run `make demo`, which builds bin/relayd first")
	}
	if _, err := os.Stat(d.bin); err != nil {
		return fmt.Errorf("relayd binary: %w (run `make build`)", err)
	}
	tmp, err := os.MkdirTemp("", "relayd-demo-")
	if err != nil {
		return err
	}
	d.tmp = tmp
	d.intro()
	if err := d.startServers(ctx); err != nil {
		return err
	}
	if err := d.prepareCluster(ctx); err != nil {
		return err
	}
	cfg, err := d.writeConfig()
	if err != nil {
		return err
	}
	if err := d.startTail(ctx); err != nil {
		return err
	}
	if err := d.startRelayd(ctx, cfg); err != nil {
		return err
	}
	if d.sandbox {
		return d.keepRunning(ctx, cfg)
	}
	if err := d.script(ctx); err != nil {
		return err
	}
	if err := d.waitLive(ctx); err != nil {
		return err
	}
	if err := d.stopRelayd(); err != nil {
		return err
	}
	return d.showCheckpoint(ctx)
}

func (d *demo) intro() {
	if d.sandbox {
		d.out.line("", `relayd sandbox

Starts, all on 127.0.0.1 with random ports: etcd + kube-apiserver (child
processes), NATS with JetStream (embedded), relayd on the demo config and
relayd tail (its lines start with [tail]), then keeps them running for you to
try things by hand. Working dir: `+d.tmp+` (removed at the end).
Ctrl-C stops everything.`)
		return
	}
	d.out.line("", `relayd demo

relayd watches Kubernetes resources and publishes every change to NATS
JetStream as a CloudEvent. This demo runs, all on 127.0.0.1 with random ports:

  etcd + kube-apiserver  real servers, as child processes (no kubelet, no controllers)
  NATS with JetStream    embedded in this demo process
  relayd run             bin/relayd on a demo config; its log lines start with [relayd]
  relayd tail            bin/relayd tail, subscribed to `+subject+`: every event relayd
                         publishes is printed on a line starting with [tail]

It then changes a few objects, checks that exactly the expected events arrive,
and stops relayd with SIGTERM. Working dir: `+d.tmp+` (removed at the end).
Ctrl-C stops everything at any time.`)
}

func (d *demo) startServers(ctx context.Context) error {
	kubeDir := filepath.Join(d.tmp, "kube")
	if err := os.MkdirAll(kubeDir, 0o755); err != nil {
		return err
	}
	d.out.banner("starting etcd and kube-apiserver (logs in %s)", kubeDir)
	env, err := testenv.Start(ctx, testenv.Options{Dir: kubeDir, Logf: func(f string, a ...any) { d.out.say(f, a...) }})
	if err != nil {
		return err
	}
	d.env = env
	d.out.banner("starting NATS with JetStream")
	n, err := testenv.StartNATS(testenv.NATSOptions{StoreDir: filepath.Join(d.tmp, "nats")})
	if err != nil {
		return err
	}
	d.nats = n
	d.out.say("NATS ready at %s", n.URL())
	if d.cs, err = kubernetes.NewForConfig(env.AdminConfig()); err != nil {
		return err
	}
	d.dyn, err = dynamic.NewForConfig(env.AdminConfig())
	return err
}

// prepareCluster creates what relayd and the script need before relayd
// starts: namespaces, the checkpoint ConfigMap and the Widget CRD.
func (d *demo) prepareCluster(ctx context.Context) error {
	d.out.banner("preparing the cluster")
	for _, ns := range []string{"demo", "other", checkpointNS} {
		if _, err := d.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create namespace %s: %w", ns, err)
		}
	}
	d.out.say("namespaces demo, other and %s created", checkpointNS)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: checkpointNS, Name: checkpointName}}
	if _, err := d.cs.CoreV1().ConfigMaps(checkpointNS).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create the checkpoint ConfigMap: %w", err)
	}
	d.out.say("ConfigMap %s/%s created empty: relayd keeps its position there (deploy/ ships it the same way)", checkpointNS, checkpointName)

	t0 := time.Now()
	if err := d.env.InstallWidgetCRD(ctx); err != nil {
		return err
	}
	d.out.say("CRD widgets.example.com (kind Widget, namespaced) installed and served in %s", time.Since(t0).Round(time.Millisecond))
	return nil
}

func (d *demo) writeConfig() (string, error) {
	tmpl, err := template.New("config").Option("missingkey=error").Parse(configTemplate)
	if err != nil {
		return "", err
	}
	var buf bytes.Buffer
	if err := tmpl.Execute(&buf, map[string]string{"NATSURL": d.nats.URL()}); err != nil {
		return "", err
	}
	path := filepath.Join(d.tmp, "relayd.yaml")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		return "", err
	}
	d.out.banner("relayd config (%s)", path)
	for _, l := range strings.Split(strings.TrimRight(buf.String(), "\n"), "\n") {
		d.out.line("    | ", l)
	}
	return path, nil
}

func (d *demo) startTail(ctx context.Context) error {
	args := []string{"tail", "--server", d.nats.URL(), "--subject", subject}
	d.out.banner("starting relayd tail (live: it prints what is published from now on)")
	d.out.say("%s %s", d.bin, strings.Join(args, " "))
	c, err := startChild(d.out, "relayd tail", "[tail]   ", d.bin, args, d.events.add)
	if err != nil {
		return err
	}
	d.tail = c
	// Start relayd only once tail's subscription is in place, so that it
	// misses nothing.
	return poll(ctx, 15*time.Second, func() error {
		if c.exited() {
			return fmt.Errorf("relayd tail exited: %v", c.err)
		}
		cz, err := d.nats.Server().Connz(&server.ConnzOptions{})
		if err != nil {
			return err
		}
		for _, ci := range cz.Conns {
			if ci.Name == "relayd-tail" && ci.NumSubs > 0 {
				return nil
			}
		}
		return errors.New("relayd tail has not subscribed yet")
	})
}

func (d *demo) startRelayd(ctx context.Context, cfg string) error {
	kubeconfig := filepath.Join(d.tmp, "kubeconfig")
	if err := d.env.WriteKubeconfig(kubeconfig, false); err != nil {
		return err
	}
	args := []string{"run", "-c", cfg, "--kubeconfig", kubeconfig,
		"--metrics-bind-address", "127.0.0.1:0", "--health-probe-bind-address", "127.0.0.1:0",
		"--log-format", "console", "--log-level", "info"}
	d.out.banner("starting relayd")
	d.out.say("%s %s", d.bin, strings.Join(args, " "))
	d.out.say("It has no checkpoint yet, so each watch first lists what exists (origin=initial,\n" +
		"between sync.started and sync.completed markers), then follows changes live (origin=watch).")
	t0 := time.Now()
	c, err := startChild(d.out, "relayd", "[relayd] ", d.bin, args, nil)
	if err != nil {
		return err
	}
	d.relayd = c
	rctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	err = d.events.waitFor(rctx, d.childrenUp, func(evs []tailEvent) (bool, error) {
		var missing []string
		for _, w := range watches {
			if !slices.ContainsFunc(evs, func(e tailEvent) bool { return e.Type == "sync.completed" && e.Source+"/"+e.NS == w }) {
				missing = append(missing, w)
			}
		}
		if len(missing) > 0 {
			return false, fmt.Errorf("no sync.completed yet for %s", strings.Join(missing, ", "))
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("relayd did not finish its initial lists within %s: %w", readyTimeout, err)
	}
	evs, _, _ := d.events.snapshot()
	n := 0
	for _, e := range evs {
		if !e.isSync() && e.Origin == "initial" {
			n++
		}
	}
	d.out.say("relayd is following all %d watches after %s (snapshot: %d existing objects)", len(watches), time.Since(t0).Round(time.Millisecond), n)
	return nil
}

// childrenUp is the abort check while waiting for events.
func (d *demo) childrenUp() error {
	if d.relayd != nil && d.relayd.exited() {
		return fmt.Errorf("relayd exited unexpectedly (%v); see its [relayd] lines above", d.relayd.err)
	}
	if d.tail != nil && d.tail.exited() {
		return fmt.Errorf("relayd tail exited unexpectedly (%v)", d.tail.err)
	}
	return nil
}

// step is one scripted change and the events it should produce.
type step struct {
	title  string
	expect string
	do     func(ctx context.Context) error
}

func (d *demo) script(ctx context.Context) error {
	var cart *corev1.ConfigMap
	cmClient := d.cs.CoreV1().ConfigMaps
	setItems := func(ctx context.Context, n string) error {
		cart.Data["items"] = n
		var err error
		cart, err = cmClient("demo").Update(ctx, cart, metav1.UpdateOptions{})
		return err
	}
	newCM := func(ns, name string, labels map[string]string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels}, Data: map[string]string{"items": "1"}}
	}
	shop := map[string]string{"app": "shop"}
	widgets := d.dyn.Resource(widgetGVR).Namespace("demo")
	namespaces := d.cs.CoreV1().Namespaces()

	steps := []step{
		{"create ConfigMap demo/cart (label app=shop)", "added", func(ctx context.Context) (err error) {
			cart, err = cmClient("demo").Create(ctx, newCM("demo", "cart", shop), metav1.CreateOptions{})
			return err
		}},
		{"update ConfigMap demo/cart (items: 1 -> 2)", "modified", func(ctx context.Context) error { return setItems(ctx, "2") }},
		{"update ConfigMap demo/cart (items: 2 -> 3)", "modified", func(ctx context.Context) error { return setItems(ctx, "3") }},
		{"create ConfigMap demo/ignored (no label)", "nothing: the source's labelSelector is app=shop", func(ctx context.Context) error {
			_, err := cmClient("demo").Create(ctx, newCM("demo", "ignored", nil), metav1.CreateOptions{})
			return err
		}},
		{"create ConfigMap other/cart (label app=shop)", "nothing: the source watches namespace demo only", func(ctx context.Context) error {
			_, err := cmClient("other").Create(ctx, newCM("other", "cart", shop), metav1.CreateOptions{})
			return err
		}},
		{"create Widget demo/w1 (a custom resource)", "added", func(ctx context.Context) error {
			w := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "example.com/v1", "kind": "Widget",
				"metadata": map[string]any{"name": "w1", "namespace": "demo"},
				"spec":     map[string]any{"color": "blue", "size": int64(1)},
			}}
			_, err := widgets.Create(ctx, w, metav1.CreateOptions{})
			return err
		}},
		{"patch Widget demo/w1 (size: 1 -> 2)", "modified", func(ctx context.Context) error {
			_, err := widgets.Patch(ctx, "w1", types.MergePatchType, []byte(`{"spec":{"size":2}}`), metav1.PatchOptions{})
			return err
		}},
		{"delete Widget demo/w1", "deleted", func(ctx context.Context) error {
			return widgets.Delete(ctx, "w1", metav1.DeleteOptions{})
		}},
		{"create Namespace scratch (cluster-scoped; payload: reference)", "added", func(ctx context.Context) error {
			_, err := namespaces.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "scratch"}}, metav1.CreateOptions{})
			return err
		}},
		{"delete Namespace scratch", "modified: the namespace is now Terminating", func(ctx context.Context) error {
			return namespaces.Delete(ctx, "scratch", metav1.DeleteOptions{})
		}},
		{"finalize Namespace scratch (the namespace controller's job; no controllers run here)",
			"deleted: with its last finalizer gone, the apiserver removes it", func(ctx context.Context) error {
				ns, err := namespaces.Get(ctx, "scratch", metav1.GetOptions{})
				if err != nil {
					return err
				}
				ns.Spec.Finalizers = nil
				_, err = namespaces.Finalize(ctx, ns, metav1.UpdateOptions{})
				return err
			}},
		{"delete ConfigMap demo/cart", "deleted", func(ctx context.Context) error {
			return cmClient("demo").Delete(ctx, "cart", metav1.DeleteOptions{})
		}},
	}
	d.want = []expectation{
		{"ConfigMap demo/cart", []string{"added", "modified", "modified", "deleted"}},
		{"Widget demo/w1", []string{"added", "modified", "deleted"}},
		{"Namespace scratch", []string{"added", "modified", "deleted"}},
	}
	d.never = []forbidden{
		{"ConfigMap demo/ignored", "it lacks the label app=shop"},
		{"ConfigMap other/cart", "namespace other is not watched"},
	}
	for i, s := range steps {
		d.out.banner("step %d/%d: %s", i+1, len(steps), s.title)
		d.out.say("expect: %s", s.expect)
		if err := s.do(ctx); err != nil {
			return fmt.Errorf("step %d (%s): %w", i+1, s.title, err)
		}
		if err := pause(ctx, stepPause); err != nil {
			return err
		}
	}
	return nil
}

func (d *demo) waitLive(ctx context.Context) error {
	n := 0
	for _, w := range d.want {
		n += len(w.Types)
	}
	d.out.banner("checking that tail printed the %d expected live events, and nothing else", n)
	t0 := time.Now()
	wctx, cancel := context.WithTimeout(ctx, eventsTimeout)
	defer cancel()
	err := d.events.waitFor(wctx, d.childrenUp, func(evs []tailEvent) (bool, error) {
		return checkLive(evs, d.want, d.never)
	})
	if err != nil {
		if ctx.Err() == nil && wctx.Err() != nil {
			return fmt.Errorf("not every expected event arrived within %s:\n%w", eventsTimeout, err)
		}
		return fmt.Errorf("wrong events:\n%w", err)
	}
	if _, bad, _ := d.events.snapshot(); len(bad) > 0 {
		return fmt.Errorf("relayd tail printed lines the demo cannot read:\n  %s", strings.Join(bad, "\n  "))
	}
	waited := ""
	if w := time.Since(t0); w >= 10*time.Millisecond {
		waited = fmt.Sprintf(" (waited %s)", w.Round(time.Millisecond))
	}
	d.out.say("all %d arrived%s, in order per object; demo/ignored and other/cart were not published", n, waited)
	return nil
}

func (d *demo) stopRelayd() error {
	d.out.banner("stopping relayd with SIGTERM (graceful: stop watches, drain publishes, write the final checkpoint)")
	t0 := time.Now()
	err := d.relayd.stop(relaydGrace)
	if err != nil {
		return fmt.Errorf("relayd did not shut down cleanly: %w", err)
	}
	d.out.say("relayd exited with status 0 after %s", time.Since(t0).Round(time.Millisecond))
	return nil
}

func (d *demo) showCheckpoint(ctx context.Context) error {
	d.out.banner("checkpoint ConfigMap %s/%s (where a restarted relayd resumes)", checkpointNS, checkpointName)
	cm, err := d.cs.CoreV1().ConfigMaps(checkpointNS).Get(ctx, checkpointName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("read the checkpoint: %w", err)
	}
	d.cp = cm.Data
	keys := make([]string, 0, len(cm.Data))
	for k := range cm.Data {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		d.out.say("%-16s %s", k+":", cm.Data[k])
	}
	var missing []string
	for _, w := range watches {
		k := checkpointKey(w)
		if _, ok := cm.Data[k]; !ok {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("the checkpoint has no position for %s", strings.Join(missing, ", "))
	}
	return nil
}

// cleanup stops everything in reverse order of dependency: relayd (it
// still needs NATS and the apiserver to shut down gracefully), tail, NATS,
// kube-apiserver and etcd; then removes the temp dir unless keep.
func (d *demo) cleanup(keep bool) {
	var running []string
	if d.relayd != nil && !d.relayd.exited() {
		running = append(running, "relayd")
	}
	if d.tail != nil {
		running = append(running, "relayd tail")
	}
	if d.nats != nil {
		running = append(running, "NATS")
	}
	if d.env != nil {
		running = append(running, "kube-apiserver", "etcd")
	}
	if len(running) > 0 {
		d.out.banner("stopping %s", strings.Join(running, ", "))
	} else {
		d.out.banner("cleaning up")
	}
	t0 := time.Now()
	if d.relayd != nil && !d.relayd.exited() {
		err := d.relayd.stop(relaydGrace)
		d.out.say("relayd stopped (%s)", exitText(err))
	}
	if d.tail != nil {
		err := d.tail.stop(5 * time.Second)
		d.out.say("relayd tail stopped (%s)", exitText(err))
	}
	if d.nats != nil {
		d.nats.Shutdown()
		d.out.say("NATS stopped")
	}
	if d.env != nil {
		d.env.Stop()
		d.out.say("kube-apiserver and etcd stopped")
	}
	if d.tmp != "" {
		if keep {
			d.out.say("kept %s for inspection (kube/*.log: server logs; relayd.yaml); remove it when done", d.tmp)
		} else if err := os.RemoveAll(d.tmp); err != nil {
			d.out.say("cannot remove %s: %v", d.tmp, err)
		} else {
			d.out.say("removed %s", d.tmp)
		}
	}
	d.out.say("done in %s", time.Since(t0).Round(time.Millisecond))
}

func exitText(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

func (d *demo) summary() {
	evs, _, _ := d.events.snapshot()
	var initial, live, markers int
	for _, e := range evs {
		switch {
		case e.isSync():
			markers++
		case e.Origin == "initial":
			initial++
		default:
			live++
		}
	}
	var cp []string
	for _, w := range watches {
		k := checkpointKey(w)
		var pos struct {
			ResourceVersion string `json:"resourceVersion"`
			Epoch           uint64 `json:"epoch"`
		}
		if err := json.Unmarshal([]byte(d.cp[k]), &pos); err != nil {
			cp = append(cp, k+"="+d.cp[k])
			continue
		}
		cp = append(cp, fmt.Sprintf("%s at resourceVersion %s (epoch %d)", k, pos.ResourceVersion, pos.Epoch))
	}
	d.out.banner("SUCCESS in %s", d.since())
	d.out.say("%d events relayed: %d existing objects (origin=initial), %d live changes (origin=watch),\n"+
		"%d sync markers; 2 changes filtered out as configured (label, namespace).\ncheckpoint: %s",
		len(evs), initial, live, markers, strings.Join(cp, ", "))
}

// poll calls fn every 100ms until it returns nil, ctx ends or timeout.
func poll(ctx context.Context, timeout time.Duration, fn func() error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		err := fn()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func pause(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
