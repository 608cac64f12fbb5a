package source

import (
	"context"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	"k8s.io/client-go/rest"
)

// TestLimitOpeningBoundsTheConnectionsDialled: 400 watches opened at once
// on the real kube-apiserver through one client, as a source listing 400
// namespaces does at a restart. Unbounded, every request that finds no
// HTTP/2 connection with a free stream dials its own TLS connection (at
// 10,000 watches relayd ran out of file descriptors); through
// LimitOpening, at most its bound are dialled at a time (25 here).
func TestLimitOpeningBoundsTheConnectionsDialled(t *testing.T) {
	const watches, bound = 400, 8
	e := apiserver(t)
	cfg := rest.CopyConfig(e.AdminConfig())
	var dials atomic.Int64
	var d net.Dialer
	cfg.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return d.DialContext(ctx, network, addr)
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hc.CloseIdleConnections)
	hc.Transport = LimitOpening(hc.Transport, bound)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var wg sync.WaitGroup
	bodies := make(chan *http.Response, watches)
	for range watches {
		wg.Go(func() {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, cfg.Host+"/api/v1/namespaces/default/configmaps?watch=true&timeoutSeconds=60", nil)
			if err != nil {
				t.Error(err)
				return
			}
			resp, err := hc.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			if resp.StatusCode != http.StatusOK {
				t.Errorf("watch: %s", resp.Status)
			}
			bodies <- resp
		})
	}
	wg.Wait()
	close(bodies)
	open := 0
	for resp := range bodies {
		open++
		t.Cleanup(func() { resp.Body.Close() })
	}
	if open != watches {
		t.Fatalf("%d of %d watches opened", open, watches)
	}
	// Each time the connections' streams are all taken, up to bound
	// requests dial; unbounded, it was nearly one connection per watch
	// (371 of 400).
	if n := dials.Load(); n > watches/10 {
		t.Errorf("%d watches opened at once dialled %d connections, want at most %d", watches, n, watches/10)
	} else {
		t.Logf("%d watches opened at once dialled %d connections", watches, n)
	}
}
