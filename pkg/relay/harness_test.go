package relay_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"text/template"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/relayd/relayd/internal/indexcheck"
	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/internal/testutil"
	"github.com/relayd/relayd/pkg/checkpoint"
	"github.com/relayd/relayd/pkg/config"
	"github.com/relayd/relayd/pkg/event"
	"github.com/relayd/relayd/pkg/relay"
	"github.com/relayd/relayd/pkg/watch"
)

var (
	env     *testenv.Env
	natsSrv *testenv.NATS
)

func TestMain(m *testing.M) {
	// The audit log shows which list path relayd took (versions_test.go).
	os.Exit(testenv.Main(m, testenv.Options{AuditLog: true}, &env, &natsSrv))
}

// alongside marks a long test that starts its own servers or keeps to its
// own namespace, stream and RBAC, and stops nothing another test uses: such
// tests run together, after the others (t.Parallel), which keeps the
// package's wall time down on 2 cores. Tests that assert an upper bound on
// a delay (sharding's Lease timing) stay out.
func alongside(t *testing.T) {
	t.Helper()
	t.Parallel()
}

// cfgTemplate is a config with test-specific names filled in; sources are
// appended as YAML by each test.
const cfgTemplate = `
cluster: {{.Cluster}}
nats:
  url: {{.URL}}
  publishTimeout: 2s
  maxInFlight: 64
  stream:
    name: {{.Stream}}
    create: true
    duplicateWindow: 10m
checkpoint:
  namespace: {{.NS}}
  name: cp
  flushInterval: 200ms
watch:
  timeout: 60s
  relistBackoff: {initial: 100ms, max: 2s}
shutdown:
  drainTimeout: 10s
# Off: the tests read whole streams; heartbeat_test.go turns them on.
heartbeatInterval: 0
sources:
{{.Sources}}
`

// fixtureSeq numbers fixtures; tests marked parallel (parallel_test.go)
// make them concurrently.
var fixtureSeq atomic.Int64

// rvNum parses a resourceVersion as a number. Only tests may do this: they
// know the store is etcd. relayd itself treats resourceVersions as opaque.
func rvNum(t *testing.T, rv string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(rv, 10, 64)
	if err != nil {
		t.Fatalf("resourceVersion %q: %v", rv, err)
	}
	return n
}

// checkpointWithin waits until the checkpoint of key is in [lo, hi) (hi 0 =
// no upper bound): at or past the last acked event, and never at or past
// the first event not yet stored. Bookmarks may move it anywhere in between.
func (f *fixture) checkpointWithin(key, lo, hi string) {
	f.t.Helper()
	f.eventually(20*time.Second, "checkpoint of "+key, func() error {
		got := f.checkpoints()[key].ResourceVersion
		if got == "" {
			return fmt.Errorf("no checkpoint")
		}
		n := rvNum(f.t, got)
		if n < rvNum(f.t, lo) || (hi != "" && n >= rvNum(f.t, hi)) {
			return fmt.Errorf("checkpoint %s, want in [%s, %s)", got, lo, hi)
		}
		return nil
	})
}

// checkpointHolds checks several times that the checkpoint never reaches hi.
func (f *fixture) checkpointHolds(key, hi string) {
	f.t.Helper()
	for range 10 {
		if got := f.checkpoints()[key].ResourceVersion; got == "" || rvNum(f.t, got) >= rvNum(f.t, hi) {
			f.t.Fatalf("checkpoint %q reached %s, an event that is not acknowledged", got, hi)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// fixture is one test's namespace, stream and relay config.
type fixture struct {
	t       *testing.T
	env     *testenv.Env
	nats    *testenv.NATS
	ns      string
	cluster string
	stream  string
	cs      *kubernetes.Clientset
	nc      *nats.Conn
	js      jetstream.JetStream
	cfgYAML string
	// objectHook, if set, is relay.Options.ObjectHook of the relayds the
	// fixture starts.
	objectHook watch.ObjectHook
}

// newFixture makes a namespace, a stream name and a config for one test;
// adminOpts are how the test itself connects to n (credentials, TLS).
func newFixture(t *testing.T, e *testenv.Env, n *testenv.NATS, sources string, adminOpts ...nats.Option) *fixture {
	t.Helper()
	name := strings.ToLower(strings.NewReplacer("/", "-", "_", "-", ".", "-").Replace(t.Name())) // a DNS label: subtests are named after Kubernetes versions
	if len(name) > 40 {
		name = name[:40]
	}
	name = fmt.Sprintf("%s-%d", strings.Trim(name, "-"), fixtureSeq.Add(1)) // unique under -count=N
	f := &fixture{t: t, env: e, nats: n, ns: name, cluster: "c" + fmt.Sprint(time.Now().UnixNano()%1e6), stream: "S" + fmt.Sprint(time.Now().UnixNano()%1e9)}
	cs, err := kubernetes.NewForConfig(e.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	f.cs = cs
	if _, err := cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: f.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(n.URL(), append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(100 * time.Millisecond)}, adminOpts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	f.nc = nc
	if f.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	err = template.Must(template.New("cfg").Parse(cfgTemplate)).Execute(&b, map[string]string{
		"Cluster": f.cluster, "URL": n.URL(), "Stream": f.stream, "NS": f.ns,
		"Sources": strings.ReplaceAll(sources, "$NS", f.ns),
	})
	if err != nil {
		t.Fatal(err)
	}
	f.cfgYAML = b.String()
	return f
}

// setNATS adds YAML lines (indented by two, under nats:) to the config.
func (f *fixture) setNATS(lines string) {
	f.t.Helper()
	i := strings.Index(f.cfgYAML, "\n  publishTimeout:")
	if i < 0 {
		f.t.Fatalf("no nats block in\n%s", f.cfgYAML)
	}
	f.cfgYAML = f.cfgYAML[:i+1] + strings.TrimRight(lines, "\n") + f.cfgYAML[i:]
}

// useStream makes the fixture publish to (and read) stream name.
func (f *fixture) useStream(name string) {
	f.cfgYAML = strings.Replace(f.cfgYAML, "    name: "+f.stream+"\n", "    name: "+name+"\n", 1)
	f.stream = name
}

func (f *fixture) config() *config.Config {
	f.t.Helper()
	cfg, err := config.Parse([]byte(f.cfgYAML), "test.yaml")
	if err != nil {
		f.t.Fatalf("config: %v\n%s", err, f.cfgYAML)
	}
	return cfg
}

// running is an in-process relay.
type running struct {
	cancel     context.CancelFunc
	done       chan error
	reg        *prometheus.Registry
	healthAddr string
}

// start runs relay.Run in-process with rc (admin if nil) and waits for /readyz
// unless wantReady is false.
func (f *fixture) start(rc *rest.Config, wantReady bool) *running {
	f.t.Helper()
	return f.startAs("", rc, wantReady)
}

// startAs is start as the replica named id in the sharding Leases ("": the
// host name).
func (f *fixture) startAs(id string, rc *rest.Config, wantReady bool) *running {
	f.t.Helper()
	if rc == nil {
		rc = f.env.AdminConfig()
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan error, 1), reg: prometheus.NewRegistry()}
	addrs := make(chan string, 1)
	log := zaptest.NewLogger(f.t, zaptest.Level(zap.WarnLevel))
	cfg := f.config() // here: its Fatalf must not run in the goroutine below
	go func() {
		r.done <- relay.Run(ctx, relay.Options{
			Config: cfg, RestConfig: rc, Logger: log, Registry: r.reg, Identity: id,
			MetricsAddr: "127.0.0.1:0", HealthAddr: "127.0.0.1:0",
			Ready:      func(_, h string) { addrs <- h },
			IndexCheck: indexcheck.NewHook, // every relist in every test is checked against a consistent LIST
			ObjectHook: f.objectHook,
		})
	}()
	select {
	case r.healthAddr = <-addrs:
	case err := <-r.done:
		f.t.Fatalf("relay.Run returned at start: %v", err)
	}
	f.t.Cleanup(func() { r.stop(f.t) })
	if wantReady {
		f.eventually(30*time.Second, "relayd ready", func() error { return r.readyErr() })
	}
	return r
}

func (r *running) readyErr() error {
	resp, err := http.Get("http://" + r.healthAddr + "/readyz")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("readyz %d: %s", resp.StatusCode, body)
	}
	return nil
}

func (r *running) healthErr() error {
	resp, err := http.Get("http://" + r.healthAddr + "/healthz")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("healthz %d", resp.StatusCode)
	}
	return nil
}

func (r *running) stop(t *testing.T) {
	if r.cancel == nil {
		return
	}
	r.cancel()
	r.cancel = nil
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("relay.Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Error("relay.Run did not return within 30s of cancel")
	}
}

func (f *fixture) eventually(timeout time.Duration, what string, fn func() error) {
	f.t.Helper()
	testutil.Eventually(f.t, timeout, what, fn)
}

// msg is one stored message, decoded.
type msg struct {
	Seq     uint64
	Subject string
	MsgID   string
	Env     event.Envelope
}

// stored returns every message in the fixture's stream, in order.
func (f *fixture) stored() []msg {
	f.t.Helper()
	out, err := f.readStored(20 * time.Second)
	if err != nil {
		f.t.Fatal(err)
	}
	return out
}

// readStored reads every message in the fixture's stream, in order. Its
// errors are those of reading (a request lost to a reconnect times out);
// a message that does not decode is fatal.
func (f *fixture) readStored(timeout time.Duration) ([]msg, error) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(f.t.Context(), timeout)
	defer cancel()
	s, err := f.js.Stream(ctx, f.stream)
	if err != nil {
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, nil
		}
		return nil, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, err
	}
	var out []msg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		rm, err := s.GetMsg(ctx, seq)
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				continue
			}
			return nil, err
		}
		e, err := event.DecodeMessage(rm.Header, rm.Data)
		if err != nil {
			f.t.Fatalf("message %d on %s does not decode: %v", seq, rm.Subject, err)
		}
		out = append(out, msg{Seq: seq, Subject: rm.Subject, MsgID: rm.Header.Get(jetstream.MsgIDHeader), Env: e})
	}
	return out, nil
}

// waitStored waits until the stream holds a message matching each want.
func (f *fixture) waitStored(timeout time.Duration, want ...func(msg) bool) []msg {
	f.t.Helper()
	var got []msg
	f.eventually(timeout, "expected events on the stream", func() error {
		var err error
		if got, err = f.readStored(5 * time.Second); err != nil {
			return fmt.Errorf("reading the stream: %w", err)
		}
		for i, w := range want {
			found := false
			for _, m := range got {
				if w(m) {
					found = true
					break
				}
			}
			if !found {
				return fmt.Errorf("want[%d] not among %d messages:\n%s", i, len(got), dump(got))
			}
		}
		return nil
	})
	return got
}

func dump(ms []msg) string {
	var b strings.Builder
	for _, m := range ms {
		fmt.Fprintf(&b, "  %d %s %s %s/%s rv=%s origin=%s\n", m.Seq, m.Env.Type, m.Env.K8sKind, m.Env.K8sNamespace, m.Env.K8sName, m.Env.K8sResourceVersion, m.Env.RelaydOrigin)
	}
	return b.String()
}

func isEvent(typ, name, rv string) func(msg) bool {
	return func(m msg) bool {
		return strings.HasSuffix(m.Env.Type, ".object."+typ) && m.Env.K8sName == name && (rv == "" || m.Env.K8sResourceVersion == rv)
	}
}

func isSync(marker string) func(msg) bool {
	return func(m msg) bool { return strings.HasSuffix(m.Env.Type, ".source.sync."+marker) }
}

// editCheckpoint changes the checkpoint ConfigMap's keys (relayd stopped):
// how a test builds the state a crash or an operator leaves.
func (f *fixture) editCheckpoint(edit func(data map[string]string)) {
	f.t.Helper()
	ctx := f.t.Context()
	cm, err := f.cs.CoreV1().ConfigMaps(f.ns).Get(ctx, "cp", metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	edit(cm.Data)
	if _, err := f.cs.CoreV1().ConfigMaps(f.ns).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

// indexBucket opens the fixture's object index bucket.
func (f *fixture) indexBucket() jetstream.KeyValue {
	f.t.Helper()
	kv, err := f.js.KeyValue(f.t.Context(), "relayd-index-"+f.cluster)
	if err != nil {
		f.t.Fatal(err)
	}
	return kv
}

// checkpoints reads the checkpoint ConfigMap.
func (f *fixture) checkpoints() map[string]checkpoint.Position {
	f.t.Helper()
	cm, err := f.cs.CoreV1().ConfigMaps(f.ns).Get(f.t.Context(), "cp", metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	out := map[string]checkpoint.Position{}
	for k, v := range cm.Data {
		var p checkpoint.Position
		if err := json.Unmarshal([]byte(v), &p); err != nil {
			f.t.Fatalf("checkpoint key %s: %v", k, err)
		}
		out[k] = p
	}
	return out
}

func (f *fixture) createCM(name string, labels map[string]string, data map[string]string) *corev1.ConfigMap {
	f.t.Helper()
	cm, err := f.cs.CoreV1().ConfigMaps(f.ns).Create(f.t.Context(), &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Data: data}, metav1.CreateOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	return cm
}

func (f *fixture) updateCM(cm *corev1.ConfigMap, k, v string) *corev1.ConfigMap {
	f.t.Helper()
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	cm.Data[k] = v
	out, err := f.cs.CoreV1().ConfigMaps(cm.Namespace).Update(f.t.Context(), cm, metav1.UpdateOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	return out
}

func (f *fixture) deleteCM(name string) {
	f.t.Helper()
	if err := f.cs.CoreV1().ConfigMaps(f.ns).Delete(f.t.Context(), name, metav1.DeleteOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
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
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			case m.Histogram != nil:
				return float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return -1
}

// churn makes random ConfigMap writes in ns, as a writer in the kill -9
// and failover tests: a name from cm-0..cm-<names-1>, created when absent,
// else deleted one time in deleteOneIn, else updated (data.i = the write's
// number). labels, if set, gives a created object's labels.
type churn struct {
	cs          kubernetes.Interface
	ns          string
	rng         *rand.Rand
	names       int
	deleteOneIn int
	labels      func(*rand.Rand) map[string]string
	live        map[string]*corev1.ConfigMap
}

func (c *churn) write(ctx context.Context, i int) error {
	if c.live == nil {
		c.live = map[string]*corev1.ConfigMap{}
	}
	name := fmt.Sprintf("cm-%d", c.rng.IntN(c.names))
	cm, exists := c.live[name]
	var err error
	switch {
	case !exists:
		obj := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"i": fmt.Sprint(i)}}
		if c.labels != nil {
			obj.Labels = c.labels(c.rng)
		}
		cm, err = c.cs.CoreV1().ConfigMaps(c.ns).Create(ctx, obj, metav1.CreateOptions{})
		c.live[name] = cm
	case c.rng.IntN(c.deleteOneIn) == 0:
		err = c.cs.CoreV1().ConfigMaps(c.ns).Delete(ctx, name, metav1.DeleteOptions{})
		delete(c.live, name)
	default:
		cm.Data = map[string]string{"i": fmt.Sprint(i)}
		cm, err = c.cs.CoreV1().ConfigMaps(c.ns).Update(ctx, cm, metav1.UpdateOptions{})
		c.live[name] = cm
	}
	if err != nil {
		return fmt.Errorf("write %d (%s): %w", i, name, err)
	}
	return nil
}
