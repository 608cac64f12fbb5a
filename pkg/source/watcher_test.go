package source

// Narrow unit tests against a fake apiserver for what a real one does not
// produce on demand: a 410 on every watch (a storm) and a silent connection.
// Every normal path is tested against the real apiserver in pkg/relay; the
// metadata-only fetch is also tested against it here (partialmeta_test.go),
// where the bytes read from the apiserver can be inspected.

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/pkg/event"
)

// The package's etcd + kube-apiserver, started by the first test that
// needs it (the micro-benchmarks of `make bench` do not), stopped by
// TestMain.
var (
	envOnce   sync.Once
	sharedEnv *testenv.Env
	envErr    error
)

func apiserver(t *testing.T) *testenv.Env {
	t.Helper()
	envOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		sharedEnv, envErr = testenv.Start(ctx, testenv.Options{})
	})
	if envErr != nil {
		t.Fatal(envErr)
	}
	return sharedEnv
}

func TestMain(m *testing.M) {
	code := m.Run()
	if sharedEnv != nil {
		sharedEnv.Stop()
	}
	if code == 0 {
		if err := goleak.Find(testenv.LeakOptions()...); err != nil {
			fmt.Fprintln(os.Stderr, "FAIL: goroutine leak after all tests:", err)
			code = 1
		}
	}
	os.Exit(code)
}

const cmJSON = `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","namespace":"ns","uid":"u1","resourceVersion":"5"}}`

func newWatcher(t *testing.T, h http.Handler, o Options) (*Watcher, *Metrics) {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return watcherFor(t, &rest.Config{Host: srv.URL}, o)
}

// watcherFor returns a watcher of the ConfigMaps of source "s" on the
// server of rc (its Host and Dial).
func watcherFor(t *testing.T, rc *rest.Config, o Options) (*Watcher, *Metrics) {
	t.Helper()
	rc.APIPath = "/api"
	rc.ContentConfig = rest.ContentConfig{GroupVersion: &schema.GroupVersion{Version: "v1"},
		NegotiatedSerializer: scheme.Codecs.WithoutConversion(), ContentType: "application/json"}
	client, err := rest.RESTClientFor(rc)
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	o.Client, o.Logger, o.Metrics, o.Source = client, zap.NewNop(), m, "s"
	o.Resource = event.Resource{Version: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespaced: true}
	w, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return w, m
}

// A server whose every list completes and whose every watch then expires:
// relayd must back off between relists, not loop.
func TestRepeated410BacksOffInsteadOfHotLooping(t *testing.T) {
	var lists atomic.Int32
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("sendInitialEvents") != "true" {
			http.Error(w, "unexpected request", http.StatusBadRequest)
			return
		}
		lists.Add(1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"type":"ADDED","object":%s}`+"\n", cmJSON)
		fmt.Fprint(w, `{"type":"BOOKMARK","object":{"apiVersion":"v1","kind":"ConfigMap","metadata":{"resourceVersion":"6","annotations":{"k8s.io/initial-events-end":"true"}}}}`+"\n")
		fmt.Fprint(w, `{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old","reason":"Expired","code":410}}`+"\n")
	})
	wt, m := newWatcher(t, h, Options{Backoff: wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Steps: 1 << 30, Cap: time.Minute}})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	var items atomic.Int32
	_ = wt.Run(ctx, Start{Snapshot: true}, func(context.Context, *Item) error { items.Add(1); return nil })

	// Delays 100+200+400+800 ms fit in 2 s: about 5 lists. A hot loop would
	// make thousands.
	n := lists.Load()
	if n < 2 || n > 8 {
		t.Fatalf("%d lists in 2s with 100ms doubling backoff, want 2..8", n)
	}
	if v := testutil.ToFloat64(m.Relists.WithLabelValues("s", string(event.RelistExpired))); int32(v) != n-1 {
		t.Errorf("relists{expired} = %v, want %d", v, n-1)
	}
	if _, ep := wt.Position(); ep != uint64(n) {
		t.Errorf("epoch %d after %d lists, want one per list", ep, n)
	}
	if items.Load() != 3*n { // sync.started, the object, sync.completed per list
		t.Errorf("%d items for %d lists, want 3 per list", items.Load(), n)
	}
}

// A watch that stays open but silent (a partition the TCP stack does not
// notice) is aborted by the idle timer and restarted from its position.
func TestSilentWatchIsAbortedByTheIdleTimer(t *testing.T) {
	var watches atomic.Int32
	var lastRV atomic.Value
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		watches.Add(1)
		lastRV.Store(r.URL.Query().Get("resourceVersion"))
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-r.Context().Done() // say nothing until the client gives up
	})
	wt, m := newWatcher(t, h, Options{Timeout: time.Second, IdleTimeout: 1500 * time.Millisecond,
		Backoff: wait.Backoff{Duration: 10 * time.Millisecond, Factor: 1, Steps: 1 << 30}})
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Second)
	defer cancel()
	_ = wt.Run(ctx, Start{ResourceVersion: "42"}, func(context.Context, *Item) error { return nil })

	if v := testutil.ToFloat64(m.WatchRestarts.WithLabelValues("s", ReasonIdle)); v < 1 {
		t.Fatalf("watch_restarts{idle} = %v, want >= 1", v)
	}
	if watches.Load() < 2 {
		t.Fatalf("%d watch requests, want a restart after the idle timeout", watches.Load())
	}
	if rv := lastRV.Load(); rv != "42" {
		t.Errorf("restarted from resourceVersion %v, want 42", rv)
	}
}
