package config

import (
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"strings"
)

// The keys of the nats block that say how to connect, their checks, and
// the redaction of URLs in whatever relayd prints.

// natsConnection checks the keys that say how to connect: the URL, the
// credentials (and that they go over TLS), TLS, the JetStream domain and
// the inbox prefix.
func (v *validator) natsConnection(n *NATS) {
	v.natsURL(n)
	v.natsAuth(n)
	if s := n.PlaintextCredentials(); s != "" && !n.AllowPlaintextCredentials {
		v.add("nats.url", "%s (use tls:// or wss://, or a nats.tls key; or set %s to accept that)", s, n.Key("nats.allowPlaintextCredentials"))
	}
}

// natsURL checks each URL of the list. A URL with an '@' may hold
// credentials, and then the entries of the list cannot be told apart from
// the commas of a password: it is reported once, redacted as a whole.
func (v *validator) natsURL(n *NATS) {
	switch {
	case strings.TrimSpace(n.URL) == "":
		v.add("nats.url", "required")
		return
	case strings.Contains(n.URL, "@"):
		v.add("nats.url", "%q holds credentials, or an '@' (credentials go in a file: %s, %s, %s or %s)", RedactURL(n.URL),
			n.Key("nats.credentialsFile"), n.Key("nats.nkeySeedFile"), n.Key("nats.tokenFile"), n.Key("nats.userFile"))
		return
	}
	empty := false
	for u := range strings.SplitSeq(n.URL, ",") {
		if u = strings.TrimSpace(u); u == "" {
			empty = true
		} else if msg := checkNATSURL(u); msg != "" {
			v.add("nats.url", "%s", msg)
		}
	}
	if empty {
		v.add("nats.url", "empty entry in the comma-separated list %q", RedactURL(n.URL))
	}
}

// checkNATSURL returns what is wrong with one server URL (one without an
// '@'), or "".
func checkNATSURL(raw string) string {
	shown := RedactURL(raw)
	u, err := url.Parse(raw)
	if err != nil || u.Opaque != "" {
		return fmt.Sprintf("%q is not a valid server URL (must be nats://, tls://, ws:// or wss://host[:port])", shown)
	}
	switch strings.ToLower(u.Scheme) {
	case "nats", "tls", "ws", "wss":
	default:
		return fmt.Sprintf("%q is not a valid server URL (must be nats://, tls://, ws:// or wss://host[:port])", shown)
	}
	if u.Hostname() == "" {
		return fmt.Sprintf("%q has no host", shown)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Sprintf("%q has an invalid port", shown)
		}
	}
	return ""
}

// ValidateConnection checks the keys of n that say how to connect (url,
// the credentials, tls, jsDomain, inboxPrefix, allowPlaintextCredentials)
// as Validate does, for a nats block changed after Load (`relayd tail`'s
// flags) or built in Go. It returns nil or a *ValidationError.
func (n *NATS) ValidateConnection() error {
	v := &validator{names: n.Names}
	v.natsConnection(n)
	if len(v.problems) > 0 {
		return &ValidationError{Problems: v.problems}
	}
	return nil
}

// Warnings are what Validate accepts but relayd reports when it starts
// and check-config prints: credentials on a connection that is not TLS,
// accepted by nats.allowPlaintextCredentials; file settings given as
// relative paths. Each carries the file and line as a problem does.
func (c *Config) Warnings() []Problem {
	var ws []Problem
	if s := c.NATS.PlaintextCredentials(); s != "" && c.NATS.AllowPlaintextCredentials {
		ws = append(ws, Problem{Path: "nats.allowPlaintextCredentials", Message: s})
	}
	ws = append(ws, c.relativeFiles()...)
	for i := range ws {
		c.origin.annotate(&ws[i])
	}
	return ws
}

// CredentialsKey names the key(s) of the credentials n authenticates
// with, e.g. "nats.tokenFile" (by their names, NATS.Key), or returns ""
// when it sets none.
func (n *NATS) CredentialsKey() string {
	switch {
	case n.CredentialsFile != "":
		return n.Key("nats.credentialsFile")
	case n.NkeySeedFile != "":
		return n.Key("nats.nkeySeedFile")
	case n.TokenFile != "":
		return n.Key("nats.tokenFile")
	case n.UserFile != "" || n.PasswordFile != "":
		return n.Key("nats.userFile") + " and " + n.Key("nats.passwordFile")
	}
	return ""
}

// PlaintextURLs are the URLs of n that do not make the connection TLS:
// all but the tls:// and wss:// ones, and none when a nats.tls key is set
// (the client then requires TLS of every server, whatever the scheme, and
// sends nothing before the handshake).
func (n *NATS) PlaintextURLs() []string {
	if n.TLS.Enabled() {
		return nil
	}
	var out []string
	for _, u := range n.URLs() {
		scheme, _, _ := strings.Cut(u, "://")
		if s := strings.ToLower(scheme); s != "tls" && s != "wss" {
			out = append(out, u)
		}
	}
	return out
}

// PlaintextCredentials says which credentials would authenticate a
// connection that is not TLS, and over which URLs, e.g. `"nats://h:4222"
// is not TLS, so nats.tokenFile would authenticate an unencrypted
// connection`; "" when none would. Every kind counts: a token or password
// crosses the network as it is, and an NKey or JWT user's session, its
// JWT and everything it publishes and reads can be read and taken over.
func (n *NATS) PlaintextCredentials() string {
	key, plain := n.CredentialsKey(), n.PlaintextURLs()
	if key == "" || len(plain) == 0 {
		return ""
	}
	shown := make([]string, len(plain))
	for i, u := range plain {
		shown[i] = strconv.Quote(RedactURL(u))
	}
	if strings.Contains(n.URL, "@") {
		// The entries of a list cannot be told from the commas of a
		// password: the list is shown as one, redacted as a whole.
		shown = []string{strconv.Quote(RedactURL(n.URL))}
	}
	verb := "is"
	if len(shown) > 1 {
		verb = "are"
	}
	return fmt.Sprintf("%s %s not TLS, so %s would authenticate an unencrypted connection", strings.Join(shown, ", "), verb, key)
}

// urlScheme matches the scheme that starts a URL.
var urlScheme = regexp.MustCompile(`^[ \t]*[A-Za-z][A-Za-z0-9+.-]*://`)

// RedactURL returns raw, a server URL or a comma-separated list of them,
// with all that may be credentials replaced by "xxxxx": everything between
// the scheme that starts raw (if any) and the last '@'. That holds
// whatever the text's shape, URL or not: a password with a '/', '@', ':',
// ',' or "://" in it, a scheme without its colon, a bad escape. In a list
// the servers before the last '@' are hidden too (a password may hold a
// comma). Text without an '@' is returned as it is. Every URL relayd
// prints goes through RedactURL.
func RedactURL(raw string) string {
	at := strings.LastIndex(raw, "@")
	if at < 0 {
		return raw
	}
	return urlScheme.FindString(raw[:at]) + "xxxxx" + raw[at:]
}

// RedactError returns the message of err, an error about connecting to
// urls (a nats.url value), unless urls holds an '@': then the credentials
// that may be in it could be anywhere in the message, cut anywhere (the
// client splits the list at commas, and a *url.Error or a dial error
// echoes a part of a URL), so the message says only that, with urls
// redacted (RedactURL).
func RedactError(err error, urls string) string {
	if !strings.Contains(urls, "@") {
		return err.Error()
	}
	return fmt.Sprintf("%q holds credentials, or an '@': the connection error is not shown, as it may show them", RedactURL(urls))
}
