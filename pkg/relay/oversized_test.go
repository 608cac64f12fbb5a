package relay_test

// Input over watch.maxObjectBytes, through relayd against the real servers:
// an HTTPS proxy in front of the real kube-apiserver answers the watches of
// one source with a frame that never ends (no apiserver sends one; a
// broken proxy or aggregated API might) and passes everything else on.
// That source's watch must fail at the bound, say so naming the source,
// the resource and the bytes read, be counted and restarted with backoff;
// the other source must go on relaying.

import (
	"context"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// The bound in this test, and how much more the proxy may have sent than
// relayd read: both sides' socket buffers (socketBuf each, which Linux
// doubles) and the HTTP buffers.
const (
	oversizeBound = 1 << 20
	socketBuf     = 128 << 10
	socketSlack   = 1 << 20
	endlessStop   = 64 << 20 // where the proxy gives up on a reader that does not stop
)

// endlessWatches is an HTTPS proxy to the apiserver that answers the
// watches of path with one good frame and then a frame that never ends,
// and counts what it sent for each.
type endlessWatches struct {
	path  string
	proxy *httputil.ReverseProxy
	mu    sync.Mutex
	sent  []int64 // per watch; -1 while it is being sent
}

func (e *endlessWatches) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != e.path || r.URL.Query().Get("watch") != "true" {
		e.proxy.ServeHTTP(w, r)
		return
	}
	e.mu.Lock()
	i := len(e.sent)
	e.sent = append(e.sent, -1)
	e.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	n, err := fmt.Fprint(w, `{"type":"MODIFIED","object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"endless","annotations":{"a":"`)
	total := int64(n)
	chunk := []byte(strings.Repeat("x", 32<<10))
	for err == nil && total < endlessStop {
		n, err = w.Write(chunk)
		total += int64(n)
		w.(http.Flusher).Flush()
	}
	e.mu.Lock()
	e.sent[i] = total
	e.mu.Unlock()
}

func (e *endlessWatches) watches() []int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]int64(nil), e.sent...)
}

// smallBuffers gives the connections it accepts a send buffer of socketBuf.
type smallBuffers struct{ net.Listener }

func (l smallBuffers) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return c, c.(*net.TCPConn).SetWriteBuffer(socketBuf)
}

// startEndlessProxy starts the proxy and returns it with relayd's
// *rest.Config for it (admin rights: the proxy's own client has them).
func startEndlessProxy(t *testing.T, path string) (*endlessWatches, *rest.Config) {
	t.Helper()
	admin := env.AdminConfig()
	tr, err := rest.TransportFor(admin)
	if err != nil {
		t.Fatal(err)
	}
	target, err := url.Parse(env.Host())
	if err != nil {
		t.Fatal(err)
	}
	e := &endlessWatches{path: path, proxy: httputil.NewSingleHostReverseProxy(target)}
	e.proxy.Transport, e.proxy.FlushInterval = tr, -1
	srv := httptest.NewUnstartedServer(e)
	srv.Listener = smallBuffers{srv.Listener}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return c, c.(*net.TCPConn).SetReadBuffer(socketBuf)
	}
	rc := &rest.Config{Host: srv.URL, Dial: dial, QPS: admin.QPS, Burst: admin.Burst,
		TLSClientConfig: rest.TLSClientConfig{CAData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})}}
	return e, rc
}

func TestEndlessWatchFrameFailsOnlyItsSource(t *testing.T) {
	alongside(t)
	f := newFixture(t, env, natsSrv, `
  - name: cms
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]
  - name: big
    apiVersion: v1
    kind: Service
    namespaces: [$NS]
    initial: none`)
	f.cfgYAML = strings.Replace(f.cfgYAML, "  relistBackoff: {initial: 100ms, max: 2s}\n",
		fmt.Sprintf("  relistBackoff: {initial: 100ms, max: 2s}\n  maxObjectBytes: %d\n", oversizeBound), 1)
	proxy, rc := startEndlessProxy(t, "/api/v1/namespaces/"+f.ns+"/services")
	r, logs := f.startLogged(rc, true)
	ctx := t.Context()

	// The other source relays, before and after big's restarts.
	create := func(name string) string {
		cm, err := f.cs.CoreV1().ConfigMaps(f.ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return cm.ResourceVersion
	}
	rv1 := create("before")
	f.waitStored(30*time.Second, isEvent("added", "before", rv1))

	f.eventually(30*time.Second, "big's watch failed and restarted twice", func() error {
		if n := restarts(t, r.reg, "big", "oversized"); n < 2 {
			return fmt.Errorf("relayd_watch_restarts_total{source=big,reason=oversized} = %v", n)
		}
		if w := proxy.watches(); len(w) < 3 {
			return fmt.Errorf("%d watches of services", len(w))
		}
		return nil
	})
	rv2 := create("after")
	ms := f.waitStored(30*time.Second, isEvent("added", "after", rv2))

	// Each watch was cut at the bound: what the proxy sent is the bound
	// plus what the sockets hold, not the endlessStop bytes it would send
	// to a reader that does not stop.
	sent := proxy.watches()
	t.Logf("bytes sent per watch: %v", sent)
	for i, n := range sent {
		if n > oversizeBound+socketSlack {
			t.Errorf("watch %d: the proxy sent %d bytes, want at most the bound %d plus the socket buffers %d", i, n, oversizeBound, socketSlack)
		}
	}
	want := fmt.Sprintf(`source "big": list/watch services (v1) in namespace %s: watch frame larger than watch.maxObjectBytes allows (%d bytes): stopped reading it after %d bytes`,
		f.ns, oversizeBound, oversizeBound+1)
	if got := logged(logs, "watch failed; retrying", want); len(got) == 0 {
		var all []string
		for _, e := range logs.All() {
			all = append(all, fmt.Sprintf("%s %v", e.Message, e.ContextMap()))
		}
		t.Errorf("no \"watch failed; retrying\" with error %q; logged:\n%s", want, strings.Join(all, "\n"))
	}
	if n := restarts(t, r.reg, "cms", "oversized", "error", "closed", "idle"); n != 0 {
		t.Errorf("source cms restarted %v times: the other source's failure reached it", n)
	}
	for _, m := range ms {
		if m.Env.RelaydSource == "big" {
			t.Errorf("source big published %s %s: nothing of the endless frame may be published", m.Env.Type, m.Env.K8sName)
		}
	}
}
