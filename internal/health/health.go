// Package health serves relayd's HTTP endpoints: /metrics (Prometheus),
// /healthz (alive as long as the process serves HTTP) and /readyz (ready, or
// 503 with the reason). The two may share an address.
package health

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
)

// Options configure Serve.
type Options struct {
	// MetricsAddr serves /metrics ("" = not served), HealthAddr serves
	// /healthz and /readyz ("" = not served). They may be equal.
	MetricsAddr, HealthAddr string
	Registry                *prometheus.Registry
	// NotReady says why the process is not ready ("" when it is); /readyz
	// asks it on every request.
	NotReady func() string
	Logger   *zap.Logger
	// Ready, if set, receives the listeners' addresses once serving (tests
	// use ":0").
	Ready func(metricsAddr, healthAddr string)
}

// Servers are the running HTTP servers.
type Servers struct {
	servers []*http.Server
	log     *zap.Logger
}

// Shutdown stops the servers, waiting up to 5 seconds for requests in
// progress.
func (h *Servers) Shutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, s := range h.servers {
		if err := s.Shutdown(ctx); err != nil {
			h.log.Warn("http shutdown", zap.Error(err))
		}
	}
}

// Serve binds the listeners of o and serves them until Shutdown. An
// address that cannot be bound is an error.
func Serve(o Options) (*Servers, error) {
	metricsMux, healthMux := http.NewServeMux(), http.NewServeMux()
	metricsMux.Handle("/metrics", promhttp.HandlerFor(o.Registry, promhttp.HandlerOpts{Registry: o.Registry}))
	healthMux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		// Alive as long as the process serves HTTP; never tied to NATS or the apiserver.
		_, _ = w.Write([]byte("ok\n"))
	})
	healthMux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if reason := o.NotReady(); reason != "" {
			http.Error(w, "not ready: "+reason, http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	type bind struct {
		addr string
		mux  *http.ServeMux
	}
	var binds []bind
	switch {
	case o.MetricsAddr != "" && o.MetricsAddr == o.HealthAddr:
		metricsMux.Handle("/", healthMux)
		binds = append(binds, bind{o.MetricsAddr, metricsMux})
	default:
		if o.MetricsAddr != "" {
			binds = append(binds, bind{o.MetricsAddr, metricsMux})
		}
		if o.HealthAddr != "" {
			binds = append(binds, bind{o.HealthAddr, healthMux})
		}
	}
	h := &Servers{log: o.Logger}
	addrs := map[*http.ServeMux]string{}
	for _, b := range binds {
		l, err := net.Listen("tcp", b.addr)
		if err != nil {
			h.Shutdown()
			return nil, fmt.Errorf("health: listen on %s: %w", b.addr, err)
		}
		s := &http.Server{Handler: b.mux, ReadHeaderTimeout: 10 * time.Second}
		h.servers = append(h.servers, s)
		addrs[b.mux] = l.Addr().String()
		go func() {
			if err := s.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				o.Logger.Error("http server stopped", zap.String("addr", b.addr), zap.Error(err))
			}
		}()
	}
	if o.Ready != nil {
		ma, ha := addrs[metricsMux], addrs[healthMux]
		if ha == "" {
			ha = ma
		}
		o.Ready(ma, ha)
	}
	return h, nil
}
