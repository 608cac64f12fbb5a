// Package natsconn connects relayd (and `relayd tail`) to NATS with the
// settings of the config's nats block: servers, TLS, authentication,
// JetStream domain and inbox prefix.
//
// Every secret is a file. The files are read when a connection is made and
// again at every reconnect (nats.go calls back for the TLS certificates and
// CAs, the token, the user and password, the JWT and the nonce signature),
// so a rotated Kubernetes Secret is picked up without a restart. An error
// reading or parsing a file names the config key and the path.
//
// New refuses a nats block that config.NATS.ValidateConnection refuses,
// so credentials never go to NATS over a connection that is not TLS unless
// nats.allowPlaintextCredentials says so. No message of a Conn (errors,
// Reason, the log) shows the credentials a URL may hold
// (config.RedactError).
//
// Dial keeps trying until the first connection succeeds, building the
// options anew at each attempt (so that a seed of another NKey user, or a
// file that appears late, is used); Reason says meanwhile why relayd is not
// connected, naming the setting and the server's answer.
package natsconn

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"go.uber.org/zap"

	"github.com/relayd/relayd/internal/retry"
	"github.com/relayd/relayd/pkg/config"
)

// Options configures a Conn.
type Options struct {
	// Config is the nats block (validated). Required.
	Config *config.NATS
	// Name is the client connection name; default Config.Name.
	Name string
	// Logger receives connection state changes; default: none.
	Logger *zap.Logger
	// OnReason, if set, is called with Reason whenever it may have changed
	// (every connection, disconnection and failed attempt), one call at a
	// time: "" means connected (readiness, relayd_nats_connected).
	OnReason func(reason string)
	// Extra options are applied after the config's (buffer sizes, timeouts).
	Extra []nats.Option
}

// Conn dials NATS and reports why it is not connected.
type Conn struct {
	o   Options
	log *zap.Logger

	nc     atomic.Pointer[nats.Conn]
	reason atomic.Value // string: why not connected; "" once connected
	// notifying orders the OnReason calls: each passes Reason as it is
	// when the call is made, so the last call has the current one.
	notifying sync.Mutex

	// dialFailures (Dial's attempts) and reconnectFailures (nats.go's, once
	// connected) log a failure that repeats at every attempt when it
	// starts, as a summary at most once a minute, and when it ends.
	dialFailures      *retry.Failures
	reconnectFailures *retry.Failures

	// up is closed while connected, and replaced by an open channel at a
	// disconnection (Up).
	upMu sync.Mutex
	up   chan struct{}
}

// New returns a Conn; it does no I/O. The connection keys of Config must
// pass config.NATS.ValidateConnection.
func New(o Options) (*Conn, error) {
	if o.Config == nil {
		return nil, errors.New("natsconn: Options.Config is required")
	}
	if err := o.Config.ValidateConnection(); err != nil {
		return nil, fmt.Errorf("natsconn: %w", err)
	}
	if o.Name == "" {
		o.Name = o.Config.Name
	}
	c := &Conn{o: o, log: o.Logger}
	if c.log == nil {
		c.log = zap.NewNop()
	}
	c.dialFailures = retry.NewFailures(c.log, "cannot connect to NATS")
	c.reconnectFailures = retry.NewFailures(c.log, "cannot reconnect to NATS")
	c.reason.Store("connecting")
	c.up = make(chan struct{})
	return c, nil
}

// Dial connects, retrying with backoff until it succeeds or ctx ends (then
// it returns ctx's error). Each attempt reads the files anew. Once
// connected, nats.go reconnects by itself, forever, calling back for the
// files at every reconnect.
func (c *Conn) Dial(ctx context.Context) (*nats.Conn, error) {
	var nc *nats.Conn
	if !retry.Until(ctx, retry.NATS(), c.dialFailures, func(context.Context) error {
		var err error
		if nc, err = c.dialOnce(); err != nil {
			return c.explain(err)
		}
		c.nc.Store(nc)
		c.setUp(nc.IsConnected()) // else a disconnection came first
		c.setReason("")
		c.succeeded(c.dialFailures, "connected to NATS", nc)
		return nil
	}) {
		return nil, ctx.Err()
	}
	return nc, nil
}

// Reason is "" while connected, else why not: the last connection error,
// naming the setting involved.
func (c *Conn) Reason() string {
	if nc := c.nc.Load(); nc != nil && nc.IsConnected() {
		return ""
	}
	s, _ := c.reason.Load().(string)
	if s == "" {
		return "reconnecting"
	}
	return s
}

// Up returns a channel that is closed once the connection is up: at once
// while it is, else when it (re)connects. Whoever must wait for NATS (the
// sink's publish retries) waits on it instead of polling. A disconnection
// seen later gives a new channel: ask again after each wait.
func (c *Conn) Up() <-chan struct{} {
	c.upMu.Lock()
	defer c.upMu.Unlock()
	return c.up
}

// setUp records that the connection went up or down (nats.go's handlers,
// called in order).
func (c *Conn) setUp(up bool) {
	c.upMu.Lock()
	defer c.upMu.Unlock()
	select {
	case <-c.up: // up
		if !up {
			c.up = make(chan struct{})
		}
	default:
		if up {
			close(c.up)
		}
	}
}

func (c *Conn) setReason(s string) {
	c.reason.Store(s)
	c.notify()
}

// notify passes the current Reason to OnReason.
func (c *Conn) notify() {
	if c.o.OnReason == nil {
		return
	}
	c.notifying.Lock()
	defer c.notifying.Unlock()
	c.o.OnReason(c.Reason())
}

// fail records err, explained (see Explain), as the reason not connected,
// and reports it to f, which logs it if it starts a run of failures or a
// summary is due.
func (c *Conn) fail(f *retry.Failures, err error) {
	f.Fail(c.explain(err))
}

// explain records err, explained (see Explain), as the reason not
// connected, and returns it so.
func (c *Conn) explain(err error) error {
	s := Explain(c.o.Config, err)
	c.setReason(s)
	return errors.New(s)
}

// succeeded logs a connection made by nc: as the end of f's run of
// failures ("<f's message>: recovered", with their count) if the attempts
// before it failed, else as msg.
func (c *Conn) succeeded(f *retry.Failures, msg string, nc *nats.Conn) {
	url := zap.String("url", nc.ConnectedUrlRedacted())
	if f.Failing() > 0 {
		f.OK(url)
		return
	}
	c.log.Info(msg, url)
}

// dialOnce makes one connection attempt over every server of the list.
func (c *Conn) dialOnce() (*nats.Conn, error) {
	opts, err := ClientOptions(c.o.Config)
	if err != nil {
		return nil, err
	}
	opts = append(opts,
		nats.Name(c.o.Name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(time.Second),
		// A refused credential is retried like any other failure: the Secret
		// may be fixed meanwhile (nats.go gives up after two by default).
		nats.IgnoreAuthErrorAbort(),
		// Every handler tells OnReason (notify, or setReason) that Reason
		// may have changed.
		nats.ConnectHandler(func(*nats.Conn) { c.notify() }),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			c.setUp(true)
			c.setReason("")
			c.succeeded(c.reconnectFailures, "reconnected to NATS", nc)
		}),
		nats.ReconnectErrHandler(func(_ *nats.Conn, err error) {
			c.fail(c.reconnectFailures, err)
		}),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if nc.IsClosed() {
				c.notify()
				return // our own Close at shutdown, not an outage
			}
			c.setUp(false)
			if err == nil {
				err = errors.New("disconnected")
			}
			c.setReason(Explain(c.o.Config, err))
			c.log.Warn("disconnected from NATS; publishes are held back until it returns", zap.String("error", config.RedactError(err, c.o.Config.URL)))
		}),
		nats.ClosedHandler(func(*nats.Conn) { c.notify() }),
		nats.ErrorHandler(func(nc *nats.Conn, sub *nats.Subscription, err error) {
			if sub == nil && nc.IsReconnecting() {
				// A reconnect's CONNECT failed: the server refused the
				// credentials, or a callback could not make them (e.g.
				// nkeySigner's seed of another user). nats.go tells
				// this handler, not ReconnectErrHandler.
				c.fail(c.reconnectFailures, err)
				return
			}
			c.log.Warn("NATS async error", zap.String("error", config.RedactError(err, c.o.Config.URL)))
		}),
	)
	opts = append(opts, c.o.Extra...)
	nc, err := nats.Connect(strings.Join(c.o.Config.URLs(), ","), opts...)
	if err != nil {
		return nil, err
	}
	return nc, nil
}

// JetStream returns the JetStream API of nc in the configured domain.
func JetStream(nc *nats.Conn, n *config.NATS, opts ...jetstream.JetStreamOpt) (jetstream.JetStream, error) {
	if n.JSDomain != "" {
		return jetstream.NewWithDomain(nc, n.JSDomain, opts...)
	}
	return jetstream.New(nc, opts...)
}

// ClientOptions are the nats.go options of the nats block: TLS,
// authentication and inbox prefix. Each file is read when nats.go connects
// or reconnects; ClientOptions itself reads them once, so that a missing or
// unparsable file is an error here, naming the key and the path.
func ClientOptions(n *config.NATS) ([]nats.Option, error) {
	var opts []nats.Option
	if n.InboxPrefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(n.InboxPrefix))
	}
	if n.TLS.Enabled() {
		o, err := tlsOption(n)
		if err != nil {
			return nil, err
		}
		opts = append(opts, o)
	}
	switch {
	case n.CredentialsFile != "":
		user, sign := credsHandlers(n.Key("nats.credentialsFile"), n.CredentialsFile)
		if _, err := user(); err != nil {
			return nil, err
		}
		opts = append(opts, nats.UserJWT(user, sign))
	case n.NkeySeedFile != "":
		key := n.Key("nats.nkeySeedFile")
		kp, err := readSeed(key, n.NkeySeedFile)
		if err != nil {
			return nil, err
		}
		pub, err := kp.PublicKey()
		kp.Wipe()
		if err != nil {
			return nil, settingErrorf("%s %s: %w", key, n.NkeySeedFile, err)
		}
		opts = append(opts, nats.Nkey(pub, nkeySigner(key, n.NkeySeedFile, pub)))
	case n.TokenFile != "":
		if _, err := readSecret(n.Key("nats.tokenFile"), n.TokenFile); err != nil {
			return nil, err
		}
		// nats.go's callback cannot return an error: an unreadable file
		// sends no token, and the server's refusal is what is reported.
		opts = append(opts, nats.TokenHandler(func() string {
			tok, _ := readSecret(n.Key("nats.tokenFile"), n.TokenFile)
			return tok
		}))
	case n.UserFile != "":
		if _, err := readSecret(n.Key("nats.userFile"), n.UserFile); err != nil {
			return nil, err
		}
		if _, err := readSecret(n.Key("nats.passwordFile"), n.PasswordFile); err != nil {
			return nil, err
		}
		opts = append(opts, nats.UserInfoHandler(func() (string, string) {
			user, _ := readSecret(n.Key("nats.userFile"), n.UserFile)
			pass, _ := readSecret(n.Key("nats.passwordFile"), n.PasswordFile)
			return user, pass
		}))
	}
	return opts, nil
}

// readSecret reads a one-line secret file, trimmed of surrounding space;
// errors name the file by key.
func readSecret(key, path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", settingErrorf("%s: %w", key, err)
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "", settingErrorf("%s %s: the file is empty", key, path)
	}
	return s, nil
}

// readSeed reads an NKey seed file; errors name it by key.
func readSeed(key, path string) (nkeys.KeyPair, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, settingErrorf("%s: %w", key, err)
	}
	kp, err := nkeys.ParseDecoratedNKey(b)
	if err != nil {
		return nil, settingErrorf("%s %s: not an NKey seed: %w", key, path, err)
	}
	return kp, nil
}

// nkeySigner signs the server's nonce with the seed read anew from path.
// The public key was sent with the connection's options: a seed of another
// user cannot be used by this connection, only by a new one (Dial, or a
// restart once connected), and says so.
func nkeySigner(key, path, pub string) nats.SignatureHandler {
	return func(nonce []byte) ([]byte, error) {
		kp, err := readSeed(key, path)
		if err != nil {
			return nil, err
		}
		defer kp.Wipe()
		if p, err := kp.PublicKey(); err != nil || p != pub {
			return nil, settingErrorf("%s %s: now holds the seed of user %s, but this connection was made as %s; restart relayd to use it", key, path, p, pub)
		}
		return kp.Sign(nonce)
	}
}

// credsHandlers return the JWT and the nonce signer of a .creds file, each
// reading the file anew; errors name it by key.
func credsHandlers(key, path string) (nats.UserJWTHandler, nats.SignatureHandler) {
	read := func() ([]byte, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, settingErrorf("%s: %w", key, err)
		}
		return b, nil
	}
	user := func() (string, error) {
		b, err := read()
		if err != nil {
			return "", err
		}
		jwt, err := nkeys.ParseDecoratedJWT(b)
		if err != nil || !strings.HasPrefix(jwt, "eyJ") {
			return "", settingErrorf("%s %s: no user JWT in it (want a .creds file: user JWT and NKey seed)", key, path)
		}
		if _, err := nkeys.ParseDecoratedNKey(b); err != nil {
			return "", settingErrorf("%s %s: no NKey seed in it: %w", key, path, err)
		}
		return jwt, nil
	}
	sign := func(nonce []byte) ([]byte, error) {
		b, err := read()
		if err != nil {
			return nil, err
		}
		kp, err := nkeys.ParseDecoratedNKey(b)
		if err != nil {
			return nil, settingErrorf("%s %s: no NKey seed in it: %w", key, path, err)
		}
		defer kp.Wipe()
		return kp.Sign(nonce)
	}
	return user, sign
}

// tlsOption requires TLS, with the CA bundle and the client certificate
// read at every TLS handshake.
func tlsOption(n *config.NATS) (nats.Option, error) {
	t := &n.TLS
	var certCB nats.TLSCertHandler
	var rootCB nats.RootCAsHandler
	if t.CertFile != "" {
		certCB = func() (tls.Certificate, error) {
			cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
			if err != nil {
				return tls.Certificate{}, settingErrorf("%s %s, %s %s: %w", n.Key("nats.tls.certFile"), t.CertFile, n.Key("nats.tls.keyFile"), t.KeyFile, err)
			}
			return cert, nil
		}
		if _, err := certCB(); err != nil {
			return nil, err
		}
	}
	if t.CAFile != "" {
		rootCB = func() (*x509.CertPool, error) {
			pem, err := os.ReadFile(t.CAFile)
			if err != nil {
				return nil, settingErrorf("%s: %w", n.Key("nats.tls.caFile"), err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, settingErrorf("%s %s: no PEM certificate in it", n.Key("nats.tls.caFile"), t.CAFile)
			}
			return pool, nil
		}
		if _, err := rootCB(); err != nil {
			return nil, err
		}
	}
	return func(o *nats.Options) error {
		o.Secure = true
		o.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
		o.TLSCertCB = certCB
		o.RootCAsCB = rootCB
		return nil
	}, nil
}

// Explain returns err as a message that names the setting it most likely
// concerns: the server's refusal of the credentials names the key that
// holds them, a certificate the client does not trust names
// nats.tls.caFile (or serverName), one the server refused names the client
// certificate, a URL nats.go cannot parse names nats.url. Errors of
// relayd's own file handling already name their key. The message never
// shows the credentials a URL may hold (config.RedactError).
//
// The cases are told apart by type (nats.go's errors, crypto/tls and
// crypto/x509's), never by the text of the error.
func Explain(n *config.NATS, err error) string {
	msg := config.RedactError(err, n.URL)
	var (
		setting   *settingError
		urlErr    *url.Error
		hostErr   x509.HostnameError
		unknownCA x509.UnknownAuthorityError
		invalid   x509.CertificateInvalidError
		verify    *tls.CertificateVerificationError
		record    tls.RecordHeaderError
	)
	switch {
	case errors.As(err, &setting):
		return msg
	case errors.As(err, &urlErr):
		return fmt.Sprintf("%s (check %s)", msg, n.Key("nats.url"))
	case errors.As(err, &hostErr):
		return fmt.Sprintf("TLS: the server certificate is not valid for this name (check %s or %s): %s", n.Key("nats.url"), n.Key("nats.tls.serverName"), msg)
	case errors.As(err, &unknownCA), errors.As(err, &invalid), errors.As(err, &verify):
		return fmt.Sprintf("TLS: the server certificate is not trusted (check %s): %s", caKey(n), msg)
	case isRemoteTLSAlert(err):
		// "remote error: tls: …": the server's TLS stack sent an alert,
		// which after relayd trusted its certificate is about relayd's.
		return fmt.Sprintf("TLS: the server refused the client certificate (check %s): %s", certKey(n), msg)
	case errors.Is(err, nats.ErrTLS) && closedByPeer(err):
		// With TLS 1.3 a server that refuses the client certificate may
		// just close the connection; the raw error names ephemeral ports,
		// so it is left out to keep the message the same at every attempt.
		return fmt.Sprintf("TLS: the server closed the connection after the TLS handshake, most likely refusing the client certificate (check %s)", certKey(n))
	case errors.Is(err, nats.ErrTLS), errors.As(err, &record),
		errors.Is(err, nats.ErrSecureConnRequired), errors.Is(err, nats.ErrSecureConnWanted):
		return fmt.Sprintf("TLS: %s (check %s and nats.tls)", msg, n.Key("nats.url"))
	case errors.Is(err, nats.ErrAuthorization), errors.Is(err, nats.ErrAuthExpired),
		errors.Is(err, nats.ErrAuthRevoked), errors.Is(err, nats.ErrAccountAuthExpired):
		return fmt.Sprintf("NATS refused the credentials (%s): %s", authKey(n), msg)
	}
	return msg
}

// settingError is an error of relayd's own handling of a file a nats
// setting names; its text starts with the key (and the path).
type settingError struct{ err error }

func (e *settingError) Error() string { return e.err.Error() }
func (e *settingError) Unwrap() error { return e.err }

func settingErrorf(format string, args ...any) error {
	return &settingError{fmt.Errorf(format, args...)}
}

// isRemoteTLSAlert reports a TLS alert sent by the server: crypto/tls
// returns it as a net.OpError whose Op is "remote error".
func isRemoteTLSAlert(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "remote error"
}

// closedByPeer reports a connection the server closed: end of stream, or
// a write to a socket it reset.
func closedByPeer(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET)
}

func caKey(n *config.NATS) string {
	if n.TLS.CAFile == "" {
		return n.Key("nats.tls.caFile") + ": not set, the system roots are used"
	}
	return n.Key("nats.tls.caFile") + " " + n.TLS.CAFile
}

func certKey(n *config.NATS) string {
	if n.TLS.CertFile == "" {
		return n.Key("nats.tls.certFile") + " and keyFile: not set"
	}
	return n.Key("nats.tls.certFile") + " " + n.TLS.CertFile
}

// authKey names the setting that holds relayd's credentials.
func authKey(n *config.NATS) string {
	switch {
	case n.CredentialsFile != "":
		return n.Key("nats.credentialsFile") + " " + n.CredentialsFile
	case n.NkeySeedFile != "":
		return n.Key("nats.nkeySeedFile") + " " + n.NkeySeedFile
	case n.TokenFile != "":
		return n.Key("nats.tokenFile") + " " + n.TokenFile
	case n.UserFile != "":
		return n.Key("nats.userFile") + " " + n.UserFile + ", " + n.Key("nats.passwordFile") + " " + n.PasswordFile
	}
	return "no credentials configured: set one of " + n.Key("nats.credentialsFile") + ", nkeySeedFile, tokenFile, userFile"
}
