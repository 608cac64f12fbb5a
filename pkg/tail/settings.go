package tail

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/pkg/config"
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
	// Set holds the names of the flags given on the command line
	// ("server", "creds", "subject", "stream", "allow-plaintext-credentials").
	Set map[string]bool
}

// Settings are what `relayd tail` connects with and reads.
type Settings struct {
	NATS    *config.NATS // URL, TLS, authentication, JetStream domain, inbox prefix
	Subject string
	Stream  string
	// Rename turns the config keys that a flag, an environment variable or
	// a NATS context replaced into the name of what replaced them, in
	// messages (nats.credentialsFile is --creds when --creds was given).
	Rename func(string) string
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
	var pairs []string // config key, what replaced it
	if f.Config == "" {
		pairs = append(pairs, "nats.url", "--server", "nats.allowPlaintextCredentials", "--allow-plaintext-credentials")
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
		ctxPairs, notes, err := applyContext(s.NATS, name, getenv)
		if err != nil {
			return nil, &UsageError{err}
		}
		pairs, s.Notes = append(pairs, ctxPairs...), notes
	}
	if v := getenv(EnvURL); v != "" && !set("server") {
		s.NATS.URL = v
		pairs = append(pairs, "nats.url", "$"+EnvURL)
	}
	if v := getenv(EnvCreds); v != "" && !set("creds") {
		setCreds(s.NATS, v)
		pairs = append(pairs, "nats.credentialsFile", "$"+EnvCreds)
	}
	if set("server") {
		s.NATS.URL = f.Server
		pairs = append(pairs, "nats.url", "--server")
	}
	if set("creds") {
		setCreds(s.NATS, f.Creds)
		pairs = append(pairs, "nats.credentialsFile", "--creds")
	}
	if f.AllowPlaintext {
		s.NATS.AllowPlaintextCredentials = true
		pairs = append(pairs, "nats.allowPlaintextCredentials", "--allow-plaintext-credentials")
	}
	s.Rename = renamer(pairs)
	if err := s.NATS.ValidateConnection(); err != nil {
		return nil, &UsageError{errors.New(s.Rename(err.Error()))}
	}
	return s, nil
}

// setCreds makes a .creds file the only authentication of n.
func setCreds(n *config.NATS, path string) {
	n.CredentialsFile, n.NkeySeedFile, n.TokenFile, n.UserFile, n.PasswordFile = path, "", "", "", ""
}

// renamer replaces each config key of pairs (key, name, key, name, ...) by
// the name given last for it; longer keys first, so that nats.tls.caFile
// is not read as nats.tls.
func renamer(pairs []string) func(string) string {
	last := map[string]string{}
	var keys []string
	for i := 0; i+1 < len(pairs); i += 2 {
		if _, ok := last[pairs[i]]; !ok {
			keys = append(keys, pairs[i])
		}
		last[pairs[i]] = pairs[i+1]
	}
	var args []string
	for len(keys) > 0 {
		longest := 0
		for i, k := range keys {
			if len(k) > len(keys[longest]) {
				longest = i
			}
		}
		k := keys[longest]
		args = append(args, k, last[k])
		keys = append(keys[:longest], keys[longest+1:]...)
	}
	return strings.NewReplacer(args...).Replace
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
// jetstream_domain and inbox_prefix to n, and returns the rename pairs and
// notes. A context's user, password and token are values, not files:
// relayd reads secrets only from files, so they are reported, not used.
func applyContext(n *config.NATS, name string, getenv func(string) string) (pairs, notes []string, err error) {
	path, err := ContextFile(name, getenv)
	if err != nil {
		return nil, nil, err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("$%s=%s: %w", EnvContext, name, err)
	}
	var c natsContext
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, nil, fmt.Errorf("$%s=%s: %s: %w", EnvContext, name, path, err)
	}
	from := func(field string) string { return fmt.Sprintf("context %s %s", name, field) }
	if c.Creds != "" && c.Nkey != "" {
		return nil, nil, fmt.Errorf("$%s=%s: %s sets both creds and nkey; tail uses one", EnvContext, name, path)
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
			pairs = append(pairs, f.key, from(jsonName(f.key)))
		}
	}
	switch {
	case c.Creds != "":
		setCreds(n, c.Creds)
		pairs = append(pairs, "nats.credentialsFile", from("creds"))
	case c.Nkey != "":
		setCreds(n, "")
		n.NkeySeedFile = c.Nkey
		pairs = append(pairs, "nats.nkeySeedFile", from("nkey"))
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
	return pairs, notes, nil
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
			return fmt.Sprintf(" (no JetStream answers in nats.jsDomain %q)", n.JSDomain)
		}
		return " (no JetStream answers; does the stream live in another domain? set nats.jsDomain)"
	case errors.Is(err, jetstream.ErrStreamNotFound):
		if n.JSDomain != "" {
			return fmt.Sprintf(" (check the stream name and nats.jsDomain %q)", n.JSDomain)
		}
		return " (check the stream name)"
	}
	return ""
}
