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
	"syscall"

	"github.com/go-logr/zapr"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/relayd/relayd/internal/version"
	"github.com/relayd/relayd/pkg/config"
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
  tail           print events from NATS as they arrive
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
		return 2
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
		return 2
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
	restCfg, err := kubeConfig(*kubeconfig)
	if err != nil {
		log.Error("no Kubernetes credentials", zap.Error(err))
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	log.Info("starting", zap.String("version", version.Version), zap.String("config", *cfgPath),
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

func cmdTail(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("tail", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		url     = fs.String("server", "nats://127.0.0.1:4222", "NATS server URL(s)")
		subject = fs.String("subject", "k8s.>", "subject filter")
		stream  = fs.String("stream", "", "replay this JetStream stream from its start, then follow (default: live only)")
		count   = fs.Int("count", 0, "exit after this many events (0: until interrupted)")
		creds   = fs.String("creds", "", "NATS credentials file")
	)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var opts []nats.Option
	if *creds != "" {
		opts = append(opts, nats.UserCredentials(*creds))
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	err := tail.Run(ctx, tail.Options{URL: *url, Subject: *subject, Stream: *stream, Count: *count, Out: stdout, NATSOptions: opts})
	if err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(stderr, "relayd tail:", err)
		return 1
	}
	return 0
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
