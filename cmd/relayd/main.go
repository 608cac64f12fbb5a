// Command relayd relays Kubernetes changes to NATS JetStream.
//
// main only parses the command line, builds the logger and the signal
// context, and hands over to the packages that do the work.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/go-logr/zapr"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/relayd/relayd/internal/version"
	"github.com/relayd/relayd/pkg/config"
	"github.com/relayd/relayd/pkg/natsconn"
	"github.com/relayd/relayd/pkg/relay"
	"github.com/relayd/relayd/pkg/tail"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `Usage: relayd <command> [flags]

Commands:
  run            run the relay (relayd run -c config.yaml)
  check-config   validate config files (relayd check-config -c FILE ...)
  tail           print events from NATS as they arrive (relayd tail -c config.yaml)
  version        print the version

Run "relayd <command> -h" for the flags of a command.
`

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "run":
		return cmdRun(args[1:], stderr)
	case "check-config":
		return cmdCheckConfig(args[1:], stdout, stderr)
	case "tail":
		return cmdTail(args[1:], stdout, stderr)
	case "version", "--version":
		fmt.Fprintln(stdout, version.String())
		return 0
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "relayd: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
}

// parseExit is the exit code of a command whose flags did not parse: 0
// for -h/--help (the flag package has printed the usage), 2 otherwise.
func parseExit(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	return 2
}

// stringsFlag collects a repeatable flag.
type stringsFlag []string

func (s *stringsFlag) String() string     { return fmt.Sprint(*s) }
func (s *stringsFlag) Set(v string) error { *s = append(*s, v); return nil }

func cmdCheckConfig(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("check-config", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var files stringsFlag
	fs.Var(&files, "config", "config file to check (repeatable)")
	fs.Var(&files, "c", "shorthand for --config")
	if err := fs.Parse(args); err != nil {
		return parseExit(err)
	}
	files = append(files, fs.Args()...)
	if len(files) == 0 {
		fmt.Fprintln(stderr, "relayd check-config: no file given (-c FILE)")
		return 2
	}
	if !config.CheckFiles(stdout, files...) {
		return 1
	}
	return 0
}

func cmdRun(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		cfgPath     = fs.String("config", "config.yaml", "config file")
		kubeconfig  = fs.String("kubeconfig", "", "kubeconfig file (default: in-cluster, then $KUBECONFIG)")
		metricsAddr = fs.String("metrics-bind-address", ":8080", "address for /metrics (\"\" disables)")
		healthAddr  = fs.String("health-probe-bind-address", ":8081", "address for /healthz and /readyz (\"\" disables)")
		logLevel    = fs.String("log-level", "info", "debug, info, warn or error")
		logFormat   = fs.String("log-format", "json", "json or console")
	)
	fs.StringVar(cfgPath, "c", "config.yaml", "shorthand for --config")
	if err := fs.Parse(args); err != nil {
		return parseExit(err)
	}
	log, err := newLogger(*logLevel, *logFormat, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "relayd:", err)
		return 2
	}
	defer func() { _ = log.Sync() }()
	klog.SetLogger(zapr.NewLogger(log.Named("client-go")))

	cfg, err := config.Load(*cfgPath)
	if err != nil {
		log.Error("invalid config", zap.String("file", *cfgPath), zap.Error(err))
		return 1
	}
	for _, w := range cfg.Warnings() {
		log.Warn("config warning", zap.String("warning", w.Error()))
	}
	restCfg, err := kubeConfig(*kubeconfig)
	if err != nil {
		log.Error("no Kubernetes credentials", zap.Error(err))
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	log.Info("starting", zap.String("version", version.Version), zap.Bool("failpoints", version.Failpoints()), zap.String("config", *cfgPath),
		zap.String("cluster", cfg.Cluster), zap.Int("sources", len(cfg.Sources)))
	err = relay.Run(ctx, relay.Options{
		Config: cfg, RestConfig: restCfg, Logger: log, Registry: prometheus.NewRegistry(),
		MetricsAddr: *metricsAddr, HealthAddr: *healthAddr,
		IndexCheck: os.Getenv(relay.IndexCheckEnv) == "1",
		Identity:   os.Getenv("POD_NAME"), // the downward API; the host name otherwise
	})
	if err != nil {
		log.Error("relayd stopped", zap.Error(err))
		return 1
	}
	return 0
}

const tailUsage = `Usage: relayd tail [-c config.yaml] [flags]

Print relayd's events from NATS as they arrive, one line each.

With -c (--config), tail connects the way relayd does, with the whole nats
block of the config: url, credentialsFile/nkeySeedFile/tokenFile/userFile,
tls, jsDomain and inboxPrefix. The subject then defaults to the config's
"<prefix>.<cluster>.>", and --replay replays the config's stream. Flags
given explicitly override the config: --server replaces nats.url, --creds
replaces the config's authentication, whichever it is. Without -c the
defaults below apply and --creds is the only authentication.

The settings are checked as check-config checks nats.url: no credentials
in a URL, and credentials (--creds, or the config's) only over TLS
(tls://, or the config's nats.tls), unless the config's
nats.allowPlaintextCredentials or --allow-plaintext-credentials accepts
them in plain.

Examples:
  relayd tail -c config.yaml                        # live events of the cluster
  relayd tail -c config.yaml --replay --count 20    # the stream from its start
  relayd tail --server nats://127.0.0.1:4222 --subject 'k8s.>'
  relayd tail --server nats://127.0.0.1:4222 --stream K8S --count 20
  relayd tail -c config.yaml --kind ConfigMap --namespace shop
  relayd tail -c config.yaml --replay -o json | jq -c 'select(.relaydorigin == "resync")'

Values that hold control characters or invalid UTF-8 are printed quoted
and escaped, never raw.

Flags:
`

func cmdTail(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("tail", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), tailUsage)
		fs.PrintDefaults()
	}
	var f tailFlags
	fs.StringVar(&f.config, "config", "", "relayd config file: connect with its nats block")
	fs.StringVar(&f.config, "c", "", "shorthand for --config")
	fs.StringVar(&f.server, "server", "nats://127.0.0.1:4222", "NATS server URL(s), comma-separated; overrides nats.url")
	fs.StringVar(&f.subject, "subject", "k8s.>", "subject filter; with -c the default is the config's <prefix>.<cluster>.>")
	fs.StringVar(&f.stream, "stream", "", "replay this JetStream stream from its start, then follow (default: live only)")
	fs.BoolVar(&f.replay, "replay", false, "with -c: replay the config's stream (nats.stream.name) from its start, then follow")
	count := fs.Int("count", 0, "exit after this many events (0: until interrupted)")
	fs.StringVar(&f.creds, "creds", "", "NATS .creds file; overrides the config's authentication")
	fs.BoolVar(&f.allowPlaintext, "allow-plaintext-credentials", false, "accept credentials on a connection that is not TLS (as nats.allowPlaintextCredentials)")
	output := fs.String("output", "text", "text: one readable line per event; json: one CloudEvent per line (structured mode), for jq")
	fs.StringVar(output, "o", "text", "shorthand for --output")
	var filter tail.Filter
	fs.StringVar(&filter.Source, "source", "", "only events of this source (relaydsource)")
	fs.StringVar(&filter.Namespace, "namespace", "", "only events of this namespace (sync markers of all-namespaces watches too)")
	fs.StringVar(&filter.Kind, "kind", "", "only events of this kind, e.g. ConfigMap (case-insensitive; sync markers too)")
	if err := fs.Parse(args); err != nil {
		return parseExit(err)
	}
	if *output != "text" && *output != "json" {
		fmt.Fprintf(stderr, "relayd tail: --output %q: want text or json\n", *output)
		return 2
	}
	f.set = map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { f.set[fl.Name] = true })
	s, code, err := tailSettingsOf(&f)
	if err != nil {
		for line := range strings.SplitSeq(err.Error(), "\n") {
			fmt.Fprintln(stderr, "relayd tail:", line)
		}
		return code
	}
	if w := s.nats.PlaintextCredentials(); w != "" {
		fmt.Fprintln(stderr, "relayd tail: warning:", s.rename(w))
	}
	opts, err := natsconn.ClientOptions(s.nats)
	if err != nil {
		fmt.Fprintln(stderr, "relayd tail:", s.rename(err.Error()))
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	err = tail.Run(ctx, tail.Options{
		URL: strings.Join(s.nats.URLs(), ","), Subject: s.subject, Stream: s.stream, Count: *count, Out: stdout,
		JSON: *output == "json", Filter: filter, NATSOptions: opts,
		JetStream: func(nc *nats.Conn) (jetstream.JetStream, error) { return natsconn.JetStream(nc, s.nats) },
	})
	var ce *tail.ConnectError
	switch {
	case err == nil, errors.Is(err, context.Canceled):
		return 0
	case errors.As(err, &ce):
		msg := natsconn.Explain(s.nats, ce.Err)
		if errors.Is(ce.Err, nats.ErrNoServers) {
			msg += " (is nats.url right and the server up?)"
		}
		msg = s.rename(msg)
		fmt.Fprintf(stderr, "relayd tail: cannot connect to NATS at %s: %s\n", ce.RedactedURL(), strings.ReplaceAll(msg, "\n", " "))
	default:
		fmt.Fprintln(stderr, "relayd tail:", s.rename(strings.TrimPrefix(config.RedactError(err, s.nats.URL), "tail: ")+tailHint(s, err)))
	}
	return 1
}

// tailHint names the settings behind a JetStream error of tail.Run.
func tailHint(s *tailSettings, err error) string {
	switch {
	case errors.Is(err, nats.ErrNoResponders), errors.Is(err, jetstream.ErrJetStreamNotEnabled),
		errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
		if s.nats.JSDomain != "" {
			return fmt.Sprintf(" (no JetStream answers in nats.jsDomain %q)", s.nats.JSDomain)
		}
		return " (no JetStream answers; does the stream live in another domain? set nats.jsDomain)"
	case errors.Is(err, jetstream.ErrStreamNotFound):
		if s.nats.JSDomain != "" {
			return fmt.Sprintf(" (check the stream name and nats.jsDomain %q)", s.nats.JSDomain)
		}
		return " (check the stream name)"
	}
	return ""
}

// tailFlags are the flags of `relayd tail` that tailSettingsOf resolves;
// set holds the names of those given on the command line.
type tailFlags struct {
	config, server, subject, stream, creds string
	replay, allowPlaintext                 bool
	set                                    map[string]bool
}

// tailSettings are what `relayd tail` connects with and reads.
type tailSettings struct {
	nats    *config.NATS // URL, TLS, authentication, JetStream domain, inbox prefix
	subject string
	stream  string
	// rename turns the config keys that a flag replaced into the flag's
	// name in messages (nats.credentialsFile is --creds when given).
	rename func(string) string
}

// tailSettingsOf applies f to the config file's nats block (when -c is
// given) or to the defaults, and checks the result as check-config checks
// a nats block (the URL, the credentials and that they go over TLS). On
// error it also returns the exit code: 2 for a misuse of the flags
// (settings that do not pass the check: the config's did), 1 for a config
// that cannot be loaded.
func tailSettingsOf(f *tailFlags) (*tailSettings, int, error) {
	s := &tailSettings{nats: &config.NATS{URL: f.server}, subject: f.subject, stream: f.stream}
	if f.replay && f.set["stream"] {
		return nil, 2, errors.New("--replay replays the config's stream; give it or --stream, not both")
	}
	if f.config == "" {
		if f.replay {
			return nil, 2, errors.New("--replay needs -c config.yaml (the stream is the config's nats.stream.name); or use --stream NAME")
		}
		s.nats.CredentialsFile = f.creds
	} else {
		cfg, err := config.Load(f.config)
		if err != nil {
			return nil, 1, err
		}
		n := cfg.NATS // a copy: the flags change it
		s.nats = &n
		if f.set["server"] {
			n.URL = f.server
		}
		if f.set["creds"] {
			n.CredentialsFile, n.NkeySeedFile, n.TokenFile, n.UserFile, n.PasswordFile = f.creds, "", "", "", ""
		}
		if !f.set["subject"] {
			s.subject = cfg.StreamSubject()
		}
		if f.replay {
			s.stream = n.Stream.Name
		}
	}
	if f.allowPlaintext {
		s.nats.AllowPlaintextCredentials = true
	}
	var pairs []string
	if f.set["creds"] {
		pairs = append(pairs, "nats.credentialsFile", "--creds")
	}
	if f.set["server"] || f.config == "" {
		pairs = append(pairs, "nats.url", "--server")
	}
	if f.set["allow-plaintext-credentials"] || f.config == "" {
		pairs = append(pairs, "nats.allowPlaintextCredentials", "--allow-plaintext-credentials")
	}
	s.rename = strings.NewReplacer(pairs...).Replace
	if err := s.nats.ValidateConnection(); err != nil {
		return nil, 2, errors.New(s.rename(err.Error()))
	}
	return s, 0, nil
}

func newLogger(level, format string, out io.Writer) (*zap.Logger, error) {
	var lvl zapcore.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	encCfg := zap.NewProductionEncoderConfig()
	encCfg.TimeKey = "ts"
	encCfg.EncodeTime = zapcore.ISO8601TimeEncoder
	encCfg.EncodeDuration = zapcore.StringDurationEncoder
	var enc zapcore.Encoder
	switch format {
	case "json":
		enc = zapcore.NewJSONEncoder(encCfg)
	case "console":
		enc = zapcore.NewConsoleEncoder(encCfg)
	default:
		return nil, fmt.Errorf("--log-format: %q is not json or console", format)
	}
	return zap.New(zapcore.NewCore(enc, zapcore.AddSync(out), lvl), zap.ErrorOutput(zapcore.AddSync(out))), nil
}

// kubeConfig: --kubeconfig if given, else in-cluster, else $KUBECONFIG
// (or ~/.kube/config).
func kubeConfig(path string) (*rest.Config, error) {
	if path != "" {
		return clientcmd.BuildConfigFromFlags("", path)
	}
	if cfg, err := rest.InClusterConfig(); err == nil {
		return cfg, nil
	} else if !errors.Is(err, rest.ErrNotInCluster) {
		return nil, err
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
}
