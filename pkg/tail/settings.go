package tail

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/pkg/config"
	"github.com/relayd/relayd/pkg/natsconn"
)

// DefaultServer is the NATS URL `relayd tail` connects to when neither a
// flag, the environment, a NATS context nor a config file names one.
const DefaultServer = "nats://127.0.0.1:4222"

// The environment variables `relayd tail` reads, as the nats CLI does.
const (
	EnvURL     = "NATS_URL"     // server URL(s), as --server
	EnvCreds   = "NATS_CREDS"   // a .creds file, as --creds
	EnvContext = "NATS_CONTEXT" // a nats CLI context name (ContextFile)
)

// Flags are the command-line settings of `relayd tail` that Resolve
// combines with the environment and the config file.
type Flags struct {
	Config, Server, Subject, Stream, Creds string
	Replay, AllowPlaintext                 bool
	// Since and Until bound the replay by the time JetStream stored the
	// messages: a duration before Now ("10m") or an RFC 3339 time; "" for
	// none.
	Since, Until string
	// Now is what Since and Until count back from; time.Now() if zero.
	Now time.Time
	// Set holds the names of the flags given on the command line
	// ("server", "creds", "subject", "stream", "allow-plaintext-credentials").
	Set map[string]bool
}

// Settings are what `relayd tail` connects with and reads.
type Settings struct {
	NATS    *config.NATS // URL, TLS, authentication, JetStream domain, inbox prefix
	Subject string
	Stream  string
	// Since and Until bound the replay of Stream (zero: unbounded).
	Since, Until time.Time
	// Notes are warnings about the settings, e.g. a NATS context's fields
	// that tail does not read.
	Notes []string
}

// UsageError is an error of Resolve that a user's flags or environment
// caused (the command exits 2); other errors are the config file's (exit 1).
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// Resolve applies the settings in this order of precedence, each replacing
// the ones after it: the flags given explicitly, the environment (NATS_URL,
// NATS_CREDS), the NATS context named by NATS_CONTEXT, the config file's
// nats block (Flags.Config), tail's defaults. The result is checked as
// check-config checks a nats block (the URL, the credentials and that they
// go over TLS). getenv is os.Getenv in production. See
// docs/CONFIGURATION.md, "relayd tail".
func Resolve(f *Flags, getenv func(string) string) (*Settings, error) {
	set := func(name string) bool { return f.Set[name] }
	if f.Replay && set("stream") {
		return nil, &UsageError{errors.New("--replay replays the config's stream; give it or --stream, not both")}
	}
	if f.Replay && f.Config == "" {
		return nil, &UsageError{errors.New("--replay needs -c config.yaml (the stream is the config's nats.stream.name); or use --stream NAME")}
	}
	s := &Settings{NATS: &config.NATS{URL: DefaultServer}, Subject: f.Subject, Stream: f.Stream}
	// What messages call each key that a flag, an environment variable or
	// a NATS context set: the name of what set it last (nats.credentialsFile
	// is --creds when --creds was given).
	names := config.KeyNames{}
	if f.Config == "" {
		names["nats.url"], names["nats.allowPlaintextCredentials"] = "--server", "--allow-plaintext-credentials"
	} else {
		cfg, err := config.Load(f.Config)
		if err != nil {
			return nil, err
		}
		n := cfg.NATS // a copy: what follows changes it
		s.NATS = &n
		if !set("subject") {
			s.Subject = cfg.StreamSubject()
		}
		if f.Replay {
			s.Stream = n.Stream.Name
		}
	}
	if name := getenv(EnvContext); name != "" {
		notes, err := applyContext(s.NATS, names, name, getenv)
		if err != nil {
			return nil, &UsageError{err}
		}
		s.Notes = notes
	}
	if v := getenv(EnvURL); v != "" && !set("server") {
		s.NATS.URL = v
		names["nats.url"] = "$" + EnvURL
	}
	if v := getenv(EnvCreds); v != "" && !set("creds") {
		setCreds(s.NATS, v)
		names["nats.credentialsFile"] = "$" + EnvCreds
	}
	if set("server") {
		s.NATS.URL = f.Server
		names["nats.url"] = "--server"
	}
	if set("creds") {
		setCreds(s.NATS, f.Creds)
		names["nats.credentialsFile"] = "--creds"
	}
	if f.AllowPlaintext {
		s.NATS.AllowPlaintextCredentials = true
		names["nats.allowPlaintextCredentials"] = "--allow-plaintext-credentials"
	}
	s.NATS.Names = names
	if err := s.NATS.ValidateConnection(); err != nil {
		return nil, &UsageError{err}
	}
	if err := s.window(f); err != nil {
		return nil, &UsageError{err}
	}
	return s, nil
}

// window sets Since and Until from the flags. Either replays a stream: the
// one --stream names, else the config's (-c), as --replay would.
func (s *Settings) window(f *Flags) error {
	if f.Since == "" && f.Until == "" {
		return nil
	}
	now := f.Now
	if now.IsZero() {
		now = time.Now()
	}
	var err error
	if s.Since, err = parseWhen("--since", f.Since, now); err != nil {
		return err
	}
	if s.Until, err = parseWhen("--until", f.Until, now); err != nil {
		return err
	}
	if !s.Since.IsZero() && !s.Until.IsZero() && !s.Until.After(s.Since) {
		return fmt.Errorf("--until %s is not after --since %s", s.Until.UTC().Format(time.RFC3339), s.Since.UTC().Format(time.RFC3339))
	}
	if s.Stream == "" {
		if f.Config == "" {
			return errors.New("--since and --until replay a stream: give --stream NAME, or -c config.yaml for the config's")
		}
		s.Stream = s.NATS.Stream.Name
	}
	return nil
}

// parseWhen reads the value v of flag: a positive duration before now, or
// an RFC 3339 time; zero for "".
func parseWhen(flag, v string, now time.Time) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(v); err == nil {
		if d <= 0 {
			return time.Time{}, fmt.Errorf("%s %q: a duration counts back from now and must be positive", flag, v)
		}
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, fmt.Errorf("%s %q: want a duration before now (10m, 1h30m) or an RFC 3339 time (2026-11-26T10:00:00Z)", flag, v)
	}
	return t, nil
}

// Warnings are what tail reports before it connects: the Notes, and
// credentials that go over a connection that is not TLS when
// --allow-plaintext-credentials or the config accepts that.
func (s *Settings) Warnings() []string {
	ws := s.Notes
	if w := s.NATS.PlaintextCredentials(); w != "" {
		ws = append(ws[:len(ws):len(ws)], w)
	}
	return ws
}

// Options are Run's options for these settings: the connection's URL,
// TLS, authentication and JetStream domain, with o's other fields. An error
// is about a file the settings name (natsconn.ClientOptions), named as
// the settings call it.
func (s *Settings) Options(o Options) (Options, error) {
	opts, err := natsconn.ClientOptions(s.NATS)
	if err != nil {
		return Options{}, err
	}
	o.URL, o.Subject, o.Stream, o.NATSOptions = strings.Join(s.NATS.URLs(), ","), s.Subject, s.Stream, opts
	o.Since, o.Until = s.Since, s.Until
	o.JetStream = func(nc *nats.Conn) (jetstream.JetStream, error) { return natsconn.JetStream(nc, s.NATS) }
	return o, nil
}

// Explain is the one-line message of an error of Run with these settings:
// a failed connection names the setting it most likely concerns
// (natsconn.Explain), a JetStream error the settings behind it (Hint);
// neither shows credentials a URL may hold.
func (s *Settings) Explain(err error) string {
	var ce *ConnectError
	if !errors.As(err, &ce) {
		return config.RedactError(err, s.NATS.URL) + Hint(s.NATS, err)
	}
	msg := natsconn.Explain(s.NATS, ce.Err)
	if errors.Is(ce.Err, nats.ErrNoServers) {
		msg += fmt.Sprintf(" (is %s right and the server up?)", s.NATS.Key("nats.url"))
	}
	// One line: a multi-line client error is printed with spaces.
	return fmt.Sprintf("cannot connect to NATS at %s: %s", ce.RedactedURL(), strings.ReplaceAll(msg, "\n", " "))
}

// setCreds makes a .creds file the only authentication of n.
func setCreds(n *config.NATS, path string) {
	n.CredentialsFile, n.NkeySeedFile, n.TokenFile, n.UserFile, n.PasswordFile = path, "", "", "", ""
}

// natsContext holds the fields of a nats CLI context file that tail reads
// or reports (the file's other fields are ignored).
type natsContext struct {
	URL         string `json:"url"`
	Creds       string `json:"creds"`
	Nkey        string `json:"nkey"`
	Cert        string `json:"cert"`
	Key         string `json:"key"`
	CA          string `json:"ca"`
	JSDomain    string `json:"jetstream_domain"`
	InboxPrefix string `json:"inbox_prefix"`
	User        string `json:"user"`
	Password    string `json:"password"`
	Token       string `json:"token"`
}

// ContextFile is the path of the nats CLI's context file of that name:
// $XDG_CONFIG_HOME/nats/context/<name>.json, with XDG_CONFIG_HOME
// defaulting to ~/.config.
func ContextFile(name string, getenv func(string) string) (string, error) {
	if name == "" || strings.ContainsAny(name, `/\`) || name == "." || name == ".." {
		return "", fmt.Errorf("$%s: %q is not a context name", EnvContext, name)
	}
	dir := getenv("XDG_CONFIG_HOME")
	if dir == "" {
		home := getenv("HOME")
		if home == "" {
			var err error
			if home, err = os.UserHomeDir(); err != nil {
				return "", fmt.Errorf("$%s: %w", EnvContext, err)
			}
		}
		dir = filepath.Join(home, ".config")
	}
	return filepath.Join(dir, "nats", "context", name+".json"), nil
}

// applyContext applies the context's url, creds or nkey, cert, key, ca,
// jetstream_domain and inbox_prefix to n, names the keys it set after the
// context's fields in names, and returns notes. A context's user, password
// and token are values, not files: relayd reads secrets only from files,
// so they are reported, not used.
func applyContext(n *config.NATS, names config.KeyNames, name string, getenv func(string) string) (notes []string, err error) {
	path, err := ContextFile(name, getenv)
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("$%s=%s: %w", EnvContext, name, err)
	}
	var c natsContext
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, fmt.Errorf("$%s=%s: %s: %w", EnvContext, name, path, err)
	}
	from := func(field string) string { return fmt.Sprintf("context %s %s", name, field) }
	if c.Creds != "" && c.Nkey != "" {
		return nil, fmt.Errorf("$%s=%s: %s sets both creds and nkey; tail uses one", EnvContext, name, path)
	}
	for _, f := range []struct {
		val, key string
		dst      *string
	}{
		{c.URL, "nats.url", &n.URL}, {c.Cert, "nats.tls.certFile", &n.TLS.CertFile}, {c.Key, "nats.tls.keyFile", &n.TLS.KeyFile},
		{c.CA, "nats.tls.caFile", &n.TLS.CAFile}, {c.JSDomain, "nats.jsDomain", &n.JSDomain}, {c.InboxPrefix, "nats.inboxPrefix", &n.InboxPrefix},
	} {
		if f.val != "" {
			*f.dst = f.val
			names[f.key] = from(jsonName(f.key))
		}
	}
	switch {
	case c.Creds != "":
		setCreds(n, c.Creds)
		names["nats.credentialsFile"] = from("creds")
	case c.Nkey != "":
		setCreds(n, "")
		n.NkeySeedFile = c.Nkey
		names["nats.nkeySeedFile"] = from("nkey")
	}
	var ignored []string
	for _, f := range []struct{ name, val string }{{"user", c.User}, {"password", c.Password}, {"token", c.Token}} {
		if f.val != "" {
			ignored = append(ignored, f.name)
		}
	}
	if len(ignored) > 0 {
		notes = append(notes, fmt.Sprintf("context %s: %s ignored (relayd reads credentials from files only: use creds or nkey in the context, or --creds)",
			name, strings.Join(ignored, ", ")))
	}
	return notes, nil
}

// jsonName is the context file's field for a nats key.
func jsonName(key string) string {
	return map[string]string{
		"nats.url": "url", "nats.tls.certFile": "cert", "nats.tls.keyFile": "key", "nats.tls.caFile": "ca",
		"nats.jsDomain": "jetstream_domain", "nats.inboxPrefix": "inbox_prefix",
	}[key]
}

// Hint names the settings behind a JetStream error of Run, e.g. " (check
// the stream name)", or returns "".
func Hint(n *config.NATS, err error) string {
	switch {
	case errors.Is(err, nats.ErrNoResponders), errors.Is(err, jetstream.ErrJetStreamNotEnabled),
		errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
		if n.JSDomain != "" {
			return fmt.Sprintf(" (no JetStream answers in %s %q)", n.Key("nats.jsDomain"), n.JSDomain)
		}
		return fmt.Sprintf(" (no JetStream answers; does the stream live in another domain? set %s)", n.Key("nats.jsDomain"))
	case errors.Is(err, jetstream.ErrStreamNotFound):
		if n.JSDomain != "" {
			return fmt.Sprintf(" (check the stream name and %s %q)", n.Key("nats.jsDomain"), n.JSDomain)
		}
		return " (check the stream name)"
	}
	return ""
}
