package relay_test

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/relayd/relayd/pkg/checkpoint"
	"github.com/relayd/relayd/pkg/event"
)

// restartNamespaces is how many namespaces (watches) the restart test's
// source lists: enough that one JetStream consumer per watch would stand
// out far above the bound, small enough for make test. The sizes of the
// scale trial are in BenchmarkStartReads (pkg/index).
const restartNamespaces = 200

// restartConsumers bounds the JetStream consumers a graceful restart
// creates on relayd's event stream and index bucket, whatever the number of
// watches: the start-up reads are shared (docs/ARCHITECTURE.md, "Start-up
// reads are shared"), one bucket read and one catch-up read for the
// watches that reach their first load together. How many rounds of reads a
// start takes depends on how far apart the watches get there (each first
// resolves its resource with a discovery request of its own): 1 on an idle
// machine, 2 seen under a load average of 12 on 2 cores; the bound allows 5.
const restartConsumers = 10

// restartRequests bounds the JetStream API requests naming the stream or
// the bucket during the restart (stream and bucket info, consumer creates,
// the catch-up's pulls, the bucket reads): a few per round.
const restartRequests = 60

// TestGracefulRestartSharesTheStartupReads: a source listing a few hundred
// namespaces is stopped gracefully and started again. The restart creates
// a bounded number of JetStream consumers (counted from the
// $JS.API.CONSUMER.CREATE requests the server receives for relayd's stream
// and bucket), makes no relist, and relays a change made while relayd was
// down.
func TestGracefulRestartSharesTheStartupReads(t *testing.T) {
	alongside(t)
	names := make([]string, restartNamespaces)
	names[0] = "$NS"
	for i := 1; i < len(names); i++ {
		names[i] = fmt.Sprintf("$NS-%d", i)
	}
	f := newFixture(t, env, natsSrv, `
  - name: cms
    apiVersion: v1
    kind: ConfigMap
    namespaces: [`+strings.Join(names, ", ")+`]`)
	createNamespaces(t, f, restartNamespaces-1)
	f.createCM("a", nil, nil)
	r := f.start(nil, true)
	f.eventually(60*time.Second, "every watch checkpointed with a stream sequence", func() error {
		cps := f.checkpoints()
		for i := range names {
			key := checkpoint.Key("cms", strings.ReplaceAll(names[i], "$NS", f.ns))
			if p := cps[key]; p.Index == nil || p.StreamSeq == 0 {
				return fmt.Errorf("%s: checkpoint %+v", key, p)
			}
		}
		return nil
	})
	r.stop(t)

	// While relayd is down, a ConfigMap is created in one of the namespaces.
	lateNS := fmt.Sprintf("%s-%d", f.ns, restartNamespaces/2)
	late, err := f.cs.CoreV1().ConfigMaps(lateNS).Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "late"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	api := watchAPI(t, f)
	relayed := make(chan struct{})
	var once sync.Once
	sub, err := f.nc.Subscribe("*."+f.cluster+".>", func(m *nats.Msg) {
		if e, err := event.DecodeMessage(m.Header, m.Data); err == nil && e.K8sName == "late" &&
			e.K8sNamespace == lateNS && e.K8sResourceVersion == late.ResourceVersion {
			once.Do(func() { close(relayed) })
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	r = f.start(nil, true)
	select {
	case <-relayed:
	case <-time.After(60 * time.Second):
		t.Fatal("the ConfigMap created while relayd was down was not relayed")
	}
	f.eventually(60*time.Second, "every watch up", func() error {
		if v := metricValue(t, r.reg, "relayd_source_up", map[string]string{"source": "cms"}); v != 1 {
			return fmt.Errorf("relayd_source_up %v", v)
		}
		return nil
	})
	created, requests := api.stop()
	r.stop(t)

	t.Logf("restart with %d watches: %d consumers created, %d JetStream API requests on the stream and bucket:\n%s",
		restartNamespaces, len(created), len(requests), strings.Join(created, "\n"))
	if len(created) == 0 || len(created) > restartConsumers {
		t.Errorf("the restart created %d JetStream consumers on the event stream and index bucket, want 1 to %d (shared start-up reads):\n%s",
			len(created), restartConsumers, strings.Join(created, "\n"))
	}
	if len(requests) > restartRequests {
		t.Errorf("the restart made %d JetStream API requests naming the event stream or index bucket, want at most %d (shared start-up reads)",
			len(requests), restartRequests)
	}
	for _, reason := range event.RelistReasons {
		if n := metricValue(t, r.reg, "relayd_relists_total", map[string]string{"source": "cms", "reason": string(reason)}); n != 0 {
			t.Errorf("relayd_relists_total{source=cms,reason=%s} = %v after a graceful restart, want 0", reason, n)
		}
	}
}

// createNamespaces creates f.ns-1 .. f.ns-n.
func createNamespaces(t *testing.T, f *fixture, n int) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	next := make(chan int)
	for range 8 {
		wg.Go(func() {
			for i := range next {
				ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", f.ns, i)}}
				if _, err := f.cs.CoreV1().Namespaces().Create(t.Context(), ns, metav1.CreateOptions{}); err != nil {
					errs <- err
				}
			}
		})
	}
	for i := 1; i <= n; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// apiWatch records the JetStream API requests that name the fixture's
// event stream or index bucket.
type apiWatch struct {
	nc       *nats.Conn
	sub      *nats.Subscription
	mu       sync.Mutex
	created  []string // the consumer create requests' subjects
	requests []string // every request's subject
}

// watchAPI starts recording; stop ends it and returns what it saw.
func watchAPI(t *testing.T, f *fixture) *apiWatch {
	t.Helper()
	a := &apiWatch{nc: f.nc}
	ours := []string{"." + f.stream + ".", "." + f.stream + "\x00", ".KV_relayd-index-" + f.cluster + ".", ".KV_relayd-index-" + f.cluster + "\x00"}
	var err error
	a.sub, err = f.nc.Subscribe("$JS.API.>", func(m *nats.Msg) {
		s := m.Subject + "\x00"
		if !strings.Contains(s, ours[0]) && !strings.Contains(s, ours[1]) && !strings.Contains(s, ours[2]) && !strings.Contains(s, ours[3]) {
			return
		}
		a.mu.Lock()
		defer a.mu.Unlock()
		a.requests = append(a.requests, m.Subject)
		if strings.HasPrefix(m.Subject, "$JS.API.CONSUMER.CREATE.") || strings.HasPrefix(m.Subject, "$JS.API.CONSUMER.DURABLE.CREATE.") {
			a.created = append(a.created, m.Subject)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return a
}

func (a *apiWatch) stop() (created, requests []string) {
	_ = a.nc.Flush()
	_ = a.sub.Unsubscribe()
	a.mu.Lock()
	defer a.mu.Unlock()
	sort.Strings(a.created)
	return a.created, a.requests
}
