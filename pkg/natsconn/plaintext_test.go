package natsconn

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/pkg/config"
)

// A token goes to a real server only over TLS (tls://, or nats:// with a
// nats.tls key, which makes nats.go require TLS whatever the scheme), or
// over a plain connection that nats.allowPlaintextCredentials accepts; New
// refuses anything else, naming nats.url, the URL and the key.
func TestCredentialsGoOverTLSOnly(t *testing.T) {
	dir := t.TempDir()
	pki, err := testenv.NewPKI(dir)
	if err != nil {
		t.Fatal(err)
	}
	token := filepath.Join(dir, "token")
	if err := os.WriteFile(token, []byte("tok-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	plain := testenv.NATST(t, testenv.NATSOptions{Token: "tok-1"})
	secure := testenv.NATST(t, testenv.NATSOptions{Token: "tok-1", TLS: &testenv.NATSTLS{CertFile: pki.ServerCertFile, KeyFile: pki.ServerKeyFile}})
	if !strings.HasPrefix(plain.URL(), "nats://") || !strings.HasPrefix(secure.URL(), "tls://") {
		t.Fatalf("URLs %s, %s", plain.URL(), secure.URL())
	}
	asNATS := "nats://" + strings.TrimPrefix(secure.URL(), "tls://")

	_, err = New(Options{Config: &config.NATS{URL: plain.URL(), TokenFile: token}})
	for _, want := range []string{"nats.url", `"` + plain.URL() + `" is not TLS`, "nats.tokenFile", "nats.allowPlaintextCredentials"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("token over %s: New error %v, want it to name %s", plain.URL(), err, want)
		}
	}

	// With a nats.tls key, a server without TLS gets no connection (and so
	// no token): the client wants TLS before it sends anything.
	c, err := New(Options{Config: &config.NATS{URL: plain.URL(), TokenFile: token, TLS: config.TLS{CAFile: pki.CAFile}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	if nc, err := c.Dial(ctx); err == nil {
		nc.Close()
		t.Errorf("connected to %s without TLS although nats.tls is set", plain.URL())
	} else if r := c.Reason(); !strings.Contains(r, "secure connection not available") {
		t.Errorf("Reason %q, want the client's refusal to go on without TLS", r)
	}
	cancel()

	for _, tc := range []struct {
		name string
		n    config.NATS
		tls  bool
	}{
		{"tls://", config.NATS{URL: secure.URL(), TokenFile: token, TLS: config.TLS{CAFile: pki.CAFile}}, true},
		{"nats:// with a nats.tls key", config.NATS{URL: asNATS, TokenFile: token, TLS: config.TLS{CAFile: pki.CAFile}}, true},
		{"nats://, accepted in plain", config.NATS{URL: plain.URL(), TokenFile: token, AllowPlaintextCredentials: true}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := New(Options{Config: &tc.n})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			nc, err := c.Dial(ctx)
			if err != nil {
				t.Fatalf("Dial: %v (%s)", err, c.Reason())
			}
			defer nc.Close()
			_, tlsErr := nc.TLSConnectionState()
			if (tlsErr == nil) != tc.tls {
				t.Errorf("connected to %s, TLS: %v, want %v", nc.ConnectedUrlRedacted(), tlsErr == nil, tc.tls)
			}
		})
	}
}
