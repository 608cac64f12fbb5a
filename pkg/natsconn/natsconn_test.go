package natsconn

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/relayd/relayd/pkg/config"
)

// A missing or unparsable file is an error naming the key and the path,
// before any connection is tried.
func TestClientOptionsNameTheKeyAndPath(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing")
	junk := filepath.Join(dir, "junk")
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(junk, []byte("not pem, not a seed\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(empty, []byte(" \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		n    config.NATS
		want []string
	}{
		{"token file missing", config.NATS{TokenFile: missing}, []string{"nats.tokenFile", missing, "no such file"}},
		{"token file empty", config.NATS{TokenFile: empty}, []string{"nats.tokenFile " + empty + ": the file is empty"}},
		{"password file missing", config.NATS{UserFile: junk, PasswordFile: missing}, []string{"nats.passwordFile", missing}},
		{"seed not a seed", config.NATS{NkeySeedFile: junk}, []string{"nats.nkeySeedFile " + junk + ": not an NKey seed"}},
		{"creds missing", config.NATS{CredentialsFile: missing}, []string{"nats.credentialsFile", missing}},
		{"creds junk", config.NATS{CredentialsFile: junk}, []string{"nats.credentialsFile " + junk + ": no user JWT in it"}},
		{"CA not PEM", config.NATS{TLS: config.TLS{CAFile: junk}}, []string{"nats.tls.caFile " + junk + ": no PEM certificate in it"}},
		{"CA missing", config.NATS{TLS: config.TLS{CAFile: missing}}, []string{"nats.tls.caFile", missing}},
		{"cert not PEM", config.NATS{TLS: config.TLS{CertFile: junk, KeyFile: junk}}, []string{"nats.tls.certFile " + junk + ", nats.tls.keyFile " + junk}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ClientOptions(&tt.n)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

// TestExplain builds each error the way nats.go and crypto/tls return it
// (the real servers of pkg/relay's TestTLS and TestMutualTLS produce them
// end to end); Explain tells them apart by type, so a plain error with
// the same text is not explained.
func TestExplain(t *testing.T) {
	n := &config.NATS{NkeySeedFile: "/s/seed", TLS: config.TLS{CAFile: "/s/ca.crt", CertFile: "/s/tls.crt", KeyFile: "/s/tls.key"}}
	tlsErr := func(err error) error { return fmt.Errorf("%w: %w", nats.ErrTLS, err) }
	for _, tt := range []struct {
		err  error
		want string
	}{
		{nats.ErrAuthorization, "NATS refused the credentials (nats.nkeySeedFile /s/seed): nats: authorization violation"},
		{nats.ErrAuthExpired, "NATS refused the credentials (nats.nkeySeedFile /s/seed): nats: authentication expired"},
		{tlsErr(&tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}),
			"TLS: the server certificate is not trusted (check nats.tls.caFile /s/ca.crt)"},
		{tlsErr(&tls.CertificateVerificationError{Err: x509.HostnameError{Certificate: &x509.Certificate{DNSNames: []string{"localhost"}}, Host: "nats.example"}}),
			"check nats.url or nats.tls.serverName"},
		{tlsErr(&net.OpError{Op: "remote error", Err: errors.New("tls: expired certificate")}),
			"TLS: the server refused the client certificate (check nats.tls.certFile /s/tls.crt)"},
		{fmt.Errorf("%w: connection closed by remote after TLS handshake: %w", nats.ErrTLS,
			&net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", syscall.EPIPE)}),
			"TLS: the server closed the connection after the TLS handshake, most likely refusing the client certificate (check nats.tls.certFile /s/tls.crt)"},
		{tlsErr(tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}), "TLS: nats: tls error: "},
		{nats.ErrSecureConnRequired, "TLS: nats: secure connection required (check nats.url and nats.tls)"},
		{&url.Error{Op: "parse", URL: "nats://[x", Err: errors.New("missing ']' in host")}, "(check nats.url)"},
		{settingErrorf("nats.tokenFile: %w", os.ErrNotExist), "nats.tokenFile: file does not exist"},
		{errors.New("dial tcp 127.0.0.1:4222: connect: connection refused"), "dial tcp 127.0.0.1:4222: connect: connection refused"},
	} {
		if got := Explain(n, tt.err); !strings.Contains(got, tt.want) {
			t.Errorf("Explain(%q) = %q, want it to contain %q", tt.err, got, tt.want)
		}
	}
	if got := Explain(&config.NATS{}, nats.ErrAuthorization); !strings.Contains(got, "no credentials configured") {
		t.Errorf("Explain without credentials: %q", got)
	}
	// The text alone explains nothing: a plain error that reads like a
	// TLS or authorization failure is passed through as it is.
	for _, text := range []string{"nats: authorization violation", "x509: certificate signed by unknown authority", "remote error: tls: expired certificate"} {
		if got := Explain(n, errors.New(text)); got != text {
			t.Errorf("Explain(errors.New(%q)) = %q, want it unchanged", text, got)
		}
	}
}
