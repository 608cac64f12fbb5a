package tail

import (
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// writeConfig writes a minimal valid relayd config (cluster dev, stream
// K8S) with the given lines under nats:, and returns its path.
func writeConfig(t *testing.T, natsLines ...string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.yaml")
	doc := "cluster: dev\nsources: [{name: cms, apiVersion: v1, kind: ConfigMap}]\nnats:\n  stream: {name: K8S}\n"
	for _, l := range natsLines {
		doc += "  " + l + "\n"
	}
	if err := os.WriteFile(p, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func flags(f Flags, set ...string) *Flags {
	if f.Server == "" {
		f.Server = DefaultServer
	}
	if f.Subject == "" {
		f.Subject = "k8s.>"
	}
	f.Set = map[string]bool{}
	for _, s := range set {
		f.Set[s] = true
	}
	return &f
}

func env(kv ...string) func(string) string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) string { return m[k] }
}

// The settings `relayd tail` resolves: the config's nats block, with the
// flags given explicitly on top.
func TestResolveFlagsOverConfig(t *testing.T) {
	cfg := writeConfig(t, `url: "tls://nats.example:4222"`, `nkeySeedFile: /s/seed.nk`, `tls: {caFile: /s/ca.crt}`,
		`jsDomain: hub`, `inboxPrefix: _INBOX_x`)
	s, err := Resolve(flags(Flags{Config: cfg}, "config"), env())
	if err != nil {
		t.Fatal(err)
	}
	if s.NATS.URL != "tls://nats.example:4222" || s.NATS.NkeySeedFile != "/s/seed.nk" || s.NATS.TLS.CAFile != "/s/ca.crt" ||
		s.NATS.JSDomain != "hub" || s.NATS.InboxPrefix != "_INBOX_x" || s.Subject != "k8s.dev.>" || s.Stream != "" {
		t.Errorf("config only: %+v, subject %q, stream %q", *s.NATS, s.Subject, s.Stream)
	}

	f := Flags{Config: cfg, Server: "nats://other:4222", Subject: "k8s.dev.cms.>", Creds: "/s/user.creds", Replay: true}
	s, err = Resolve(flags(f, "config", "server", "subject", "creds", "replay"), env())
	if err != nil {
		t.Fatal(err)
	}
	if s.NATS.URL != "nats://other:4222" || s.NATS.CredentialsFile != "/s/user.creds" || s.NATS.NkeySeedFile != "" ||
		s.NATS.TLS.CAFile != "/s/ca.crt" || s.NATS.JSDomain != "hub" || s.Subject != "k8s.dev.cms.>" || s.Stream != "K8S" {
		t.Errorf("overridden: %+v, subject %q, stream %q", *s.NATS, s.Subject, s.Stream)
	}
	if got := s.NATS.Key("nats.credentialsFile") + "; " + s.NATS.Key("nats.url") + "; " + s.NATS.Key("nats.tls.caFile"); got != "--creds; --server; nats.tls.caFile" {
		t.Errorf("key names: %q", got)
	}

	// Credentials over the default nats:// URL: refused, unless
	// --allow-plaintext-credentials accepts them.
	_, err = Resolve(flags(Flags{Creds: "/c"}, "creds"), env())
	var ue *UsageError
	if want := `--server: "nats://127.0.0.1:4222" is not TLS, so --creds would authenticate an unencrypted connection (use tls:// or wss://, or a nats.tls key; or set --allow-plaintext-credentials to accept that)`; !errors.As(err, &ue) || err.Error() != want {
		t.Errorf("no config, --creds over nats://: %v\nwant a usage error %s", err, want)
	}
	s, err = Resolve(flags(Flags{Creds: "/c", AllowPlaintext: true}, "creds", "allow-plaintext-credentials"), env())
	if err != nil {
		t.Fatal(err)
	}
	if s.NATS.URL != DefaultServer || s.NATS.CredentialsFile != "/c" || !s.NATS.AllowPlaintextCredentials || s.NATS.TLS.Enabled() || s.Subject != "k8s.>" {
		t.Errorf("no config: %+v, subject %q", *s.NATS, s.Subject)
	}

	// The config's credentials (over tls:// there, without a nats.tls key)
	// and a --server without TLS: refused, naming the flag and the
	// config's key.
	tlsURLOnly := writeConfig(t, `url: "tls://nats.example:4222"`, `nkeySeedFile: /s/seed.nk`)
	_, err = Resolve(flags(Flags{Config: tlsURLOnly, Server: "nats://other:4222"}, "config", "server"), env())
	if want := `--server: "nats://other:4222" is not TLS, so nats.nkeySeedFile would authenticate`; !errors.As(err, &ue) || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("config, --server nats://: %v\nwant a usage error %s…", err, want)
	}
	// A URL with credentials in --server: refused, redacted.
	_, err = Resolve(flags(Flags{Server: "nats://u:s3cret@h:4222"}, "server"), env())
	if want := `--server: "nats://xxxxx@h:4222" holds credentials`; !errors.As(err, &ue) || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("--server with credentials: %v\nwant a usage error %s…", err, want)
	}
	// A config that does not load: not a usage error (exit 1).
	if _, err = Resolve(flags(Flags{Config: filepath.Join(t.TempDir(), "none.yaml")}, "config"), env()); err == nil || errors.As(err, &ue) {
		t.Errorf("missing config: %v, want a non-usage error", err)
	}
}

// writeContext writes a nats CLI context file under dir/nats/context.
func writeContext(t *testing.T, dir, name, json string) {
	t.Helper()
	p := filepath.Join(dir, "nats", "context", name+".json")
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(json), 0o600); err != nil {
		t.Fatal(err)
	}
}

// NATS_URL, NATS_CREDS and NATS_CONTEXT, as the nats CLI reads them, with
// the precedence flag > environment > context > config file.
func TestResolveEnvironmentAndContext(t *testing.T) {
	xdg := t.TempDir()
	writeContext(t, xdg, "prod", `{"description": "prod", "url": "tls://ctx.example:4222", "creds": "/ctx/user.creds",
		"ca": "/ctx/ca.pem", "cert": "/ctx/cert.pem", "key": "/ctx/key.pem", "jetstream_domain": "hub",
		"inbox_prefix": "_INBOX_ctx", "token": "t0ken", "color_scheme": "dark"}`)
	writeContext(t, xdg, "nkey", `{"url": "tls://nk.example:4222", "nkey": "/ctx/user.nk"}`)
	cfg := writeConfig(t, `url: "tls://cfg.example:4222"`, `tokenFile: /cfg/token`, `tls: {caFile: /cfg/ca.pem, serverName: nats.cfg}`, `jsDomain: cfgdomain`)

	// The context over the config: its url, creds (replacing the config's
	// tokenFile), TLS files, domain and inbox prefix; the config's other
	// settings stay. Its token is reported, not used.
	s, err := Resolve(flags(Flags{Config: cfg}, "config"), env("XDG_CONFIG_HOME", xdg, EnvContext, "prod"))
	if err != nil {
		t.Fatal(err)
	}
	n := s.NATS
	if got, want := fmt.Sprintf("%s %s %q %s %s %s %s %s %s", n.URL, n.CredentialsFile, n.TokenFile, n.TLS.CAFile, n.TLS.CertFile, n.TLS.KeyFile, n.TLS.ServerName, n.JSDomain, n.InboxPrefix),
		`tls://ctx.example:4222 /ctx/user.creds "" /ctx/ca.pem /ctx/cert.pem /ctx/key.pem nats.cfg hub _INBOX_ctx`; got != want {
		t.Errorf("context over config:\n got %s\nwant %s", got, want)
	}
	if len(s.Notes) != 1 || !strings.Contains(s.Notes[0], "context prod: token ignored") {
		t.Errorf("notes %q, want one saying the token is ignored", s.Notes)
	}
	if got := s.NATS.Key("nats.url") + "; " + s.NATS.Key("nats.credentialsFile") + "; " + s.NATS.Key("nats.tls.caFile"); got != "context prod url; context prod creds; context prod ca" {
		t.Errorf("key names: %q", got)
	}

	// NATS_URL and NATS_CREDS over the context.
	e := env("XDG_CONFIG_HOME", xdg, EnvContext, "prod", EnvURL, "tls://env.example:4222", EnvCreds, "/env/user.creds")
	s, err = Resolve(flags(Flags{Config: cfg}, "config"), e)
	if err != nil {
		t.Fatal(err)
	}
	if s.NATS.URL != "tls://env.example:4222" || s.NATS.CredentialsFile != "/env/user.creds" || s.NATS.TLS.CAFile != "/ctx/ca.pem" {
		t.Errorf("env over context: %+v", *s.NATS)
	}
	if got := s.NATS.Key("nats.url") + ", " + s.NATS.Key("nats.credentialsFile"); got != "$NATS_URL, $NATS_CREDS" {
		t.Errorf("key names: %q", got)
	}

	// Flags over the environment.
	s, err = Resolve(flags(Flags{Config: cfg, Server: "tls://flag.example:4222", Creds: "/flag/user.creds"}, "config", "server", "creds"), e)
	if err != nil {
		t.Fatal(err)
	}
	if s.NATS.URL != "tls://flag.example:4222" || s.NATS.CredentialsFile != "/flag/user.creds" {
		t.Errorf("flags over env: %+v", *s.NATS)
	}

	// Without -c: the environment alone, and a context's nkey.
	s, err = Resolve(flags(Flags{}), env("XDG_CONFIG_HOME", xdg, EnvContext, "nkey"))
	if err != nil {
		t.Fatal(err)
	}
	if s.NATS.URL != "tls://nk.example:4222" || s.NATS.NkeySeedFile != "/ctx/user.nk" || s.NATS.CredentialsFile != "" {
		t.Errorf("nkey context: %+v", *s.NATS)
	}
	// ~/.config when XDG_CONFIG_HOME is unset.
	_, err = Resolve(flags(Flags{}), env("HOME", filepath.Dir(xdg), EnvContext, "nkey"))
	if err == nil || !strings.Contains(err.Error(), filepath.Join(filepath.Dir(xdg), ".config", "nats", "context", "nkey.json")) {
		t.Errorf("HOME without the context: %v, want an error naming ~/.config/nats/context/nkey.json", err)
	}

	// A missing context, or a bad name: usage errors.
	var ue *UsageError
	for _, name := range []string{"missing", "../prod"} {
		if _, err := Resolve(flags(Flags{}), env("XDG_CONFIG_HOME", xdg, EnvContext, name)); !errors.As(err, &ue) || !strings.Contains(err.Error(), "NATS_CONTEXT") {
			t.Errorf("context %q: %v, want a usage error naming NATS_CONTEXT", name, err)
		}
	}
	// NATS_CREDS over the default nats:// URL: refused, naming both.
	_, err = Resolve(flags(Flags{}), env(EnvCreds, "/env/user.creds"))
	if want := `--server: "nats://127.0.0.1:4222" is not TLS, so $NATS_CREDS would authenticate an unencrypted connection`; !errors.As(err, &ue) || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("NATS_CREDS over nats://: %v\nwant %s…", err, want)
	}
}

// Every message about a setting that a NATS context (or a flag) gave names
// it as such, whichever part of relayd built the message: the checks
// (config.ValidateConnection), the files read to connect
// (natsconn.ClientOptions), a failed connection (natsconn.Explain) and a
// JetStream error (Hint).
func TestMessagesNameWhatSetTheKey(t *testing.T) {
	xdg := t.TempDir()
	missing := filepath.Join(xdg, "missing")
	writeContext(t, xdg, "bad", `{"url": "tls://ctx.example:4222", "inbox_prefix": "bad prefix"}`)
	writeContext(t, xdg, "ca", `{"url": "tls://ctx.example:4222", "ca": "`+missing+`.pem", "jetstream_domain": "hub"}`)
	writeContext(t, xdg, "cert", `{"url": "tls://ctx.example:4222", "cert": "`+missing+`.crt", "key": "`+missing+`.key"}`)
	writeContext(t, xdg, "creds", `{"url": "tls://ctx.example:4222", "creds": "`+missing+`.creds"}`)
	ctx := func(name string) func(string) string { return env("XDG_CONFIG_HOME", xdg, EnvContext, name) }

	_, err := Resolve(flags(Flags{}), ctx("bad"))
	if want := `context bad inbox_prefix: "bad prefix" is not a valid inbox prefix`; err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("invalid inbox prefix: %v\nwant %s…", err, want)
	}
	for name, want := range map[string]string{
		"ca":    "context ca ca: open " + missing + ".pem",
		"cert":  "context cert cert " + missing + ".crt, context cert key " + missing + ".key: open ",
		"creds": "context creds creds: open " + missing + ".creds",
	} {
		s, err := Resolve(flags(Flags{}), ctx(name))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Options(Options{}); err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("context %s: %v\nwant %s…", name, err, want)
		}
	}

	s, err := Resolve(flags(Flags{}), ctx("ca"))
	if err != nil {
		t.Fatal(err)
	}
	untrusted := &ConnectError{URL: s.NATS.URL, Err: x509.UnknownAuthorityError{}}
	if got, want := s.Explain(untrusted), "TLS: the server certificate is not trusted (check context ca ca "+missing+".pem)"; !strings.Contains(got, want) {
		t.Errorf("untrusted certificate: %s\nwant %s", got, want)
	}
	if got, want := s.Explain(fmt.Errorf("stream K8S: %w", jetstream.ErrStreamNotFound)), `(check the stream name and context ca jetstream_domain "hub")`; !strings.HasSuffix(got, want) {
		t.Errorf("stream not found: %s\nwant …%s", got, want)
	}
	s, err = Resolve(flags(Flags{Server: "tls://127.0.0.1:1"}, "server"), ctx("ca"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := s.Explain(&ConnectError{URL: s.NATS.URL, Err: nats.ErrNoServers}), "(is --server right and the server up?)"; !strings.HasSuffix(got, want) {
		t.Errorf("no servers: %s\nwant …%s", got, want)
	}
}

// --since and --until: a duration before now or an RFC 3339 time, Until
// after Since, and a stream to replay (--stream, or the config's).
func TestResolveTimeWindow(t *testing.T) {
	cfg := writeConfig(t, `url: "nats://nats.example:4222"`)
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	s, err := Resolve(flags(Flags{Config: cfg, Since: "10m", Until: "2026-11-26T11:55:00Z", Now: now}, "config", "since", "until"), env())
	if err != nil {
		t.Fatal(err)
	}
	if !s.Since.Equal(now.Add(-10*time.Minute)) || !s.Until.Equal(now.Add(-5*time.Minute)) || s.Stream != "K8S" {
		t.Errorf("since %v, until %v, stream %q; want 11:50, 11:55 and the config's stream K8S", s.Since, s.Until, s.Stream)
	}
	s, err = Resolve(flags(Flags{Stream: "OTHER", Since: "1h", Now: now}, "stream", "since"), env())
	if err != nil {
		t.Fatal(err)
	}
	if !s.Since.Equal(now.Add(-time.Hour)) || !s.Until.IsZero() || s.Stream != "OTHER" {
		t.Errorf("since %v, until %v, stream %q", s.Since, s.Until, s.Stream)
	}
	var ue *UsageError
	for _, c := range []struct {
		f    Flags
		want string
	}{
		{Flags{Since: "10m", Now: now}, "--since and --until replay a stream: give --stream NAME, or -c config.yaml for the config's"},
		{Flags{Stream: "S", Since: "yesterday", Now: now}, `--since "yesterday": want a duration before now (10m, 1h30m) or an RFC 3339 time (2026-11-26T10:00:00Z)`},
		{Flags{Stream: "S", Until: "-5m", Now: now}, `--until "-5m": a duration counts back from now and must be positive`},
		{Flags{Stream: "S", Since: "5m", Until: "10m", Now: now}, "--until 2026-11-26T11:50:00Z is not after --since 2026-11-26T11:55:00Z"},
	} {
		if _, err := Resolve(flags(c.f, "stream"), env()); !errors.As(err, &ue) || err.Error() != c.want {
			t.Errorf("%+v: %v\nwant the usage error %s", c.f, err, c.want)
		}
	}
}
