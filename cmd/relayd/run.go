package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/go-logr/zapr"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/relayd/relayd/internal/version"
	"github.com/relayd/relayd/pkg/config"
	"github.com/relayd/relayd/pkg/relay"
)

func cmdRun(args []string, stdout, stderr io.Writer) int {
	c := newCommand("run", "relayd run [-c config.yaml] [flags]", `
Run the relay: watch the config's sources on the Kubernetes apiserver and
publish their changes to NATS JetStream until SIGTERM or SIGINT, then drain
and exit 0.

Kubernetes credentials: --kubeconfig if given; otherwise the pod's service
account (in a cluster); otherwise $KUBECONFIG or ~/.kube/config. --context
picks a context of the kubeconfig (out-of-cluster use).

A config that does not load is printed one problem a line on stderr, as
plain text whatever --log-format says, and relayd exits 1.`, `
  relayd run -c /etc/relayd/config.yaml
  relayd run -c config.yaml --kubeconfig ~/.kube/config --context kind-dev --log-format console`)
	var (
		cfgPath     = c.fs.StringP("config", "c", "config.yaml", "config file")
		kubeconfig  = c.fs.String("kubeconfig", "", "kubeconfig file (default: in-cluster, then $KUBECONFIG or ~/.kube/config)")
		kubeContext = c.fs.String("context", "", "kubeconfig context to use (default: the kubeconfig's current context)")
		metricsAddr = c.fs.String("metrics-bind-address", ":8080", `address for /metrics ("" disables)`)
		healthAddr  = c.fs.String("health-probe-bind-address", ":8081", `address for /healthz and /readyz ("" disables)`)
		logLevel    = c.fs.String("log-level", "info", "debug, info, warn or error")
		logFormat   = c.fs.String("log-format", "json", "json or console")
	)
	if done, code := c.parse(args, stdout, stderr); done {
		return code
	}
	if c.fs.NArg() > 0 {
		return c.usageError(stderr, "unexpected argument %q (the config file is given with -c)", c.fs.Arg(0))
	}
	log, err := newLogger(*logLevel, *logFormat, stderr)
	if err != nil {
		return c.usageError(stderr, "%v", err)
	}
	defer func() { _ = log.Sync() }()
	klog.SetLogger(zapr.NewLogger(log.Named("client-go")))

	cfg, err := config.Load(*cfgPath)
	if err != nil {
		lines := config.ProblemLines(err)
		log.Error("invalid config", zap.String("file", *cfgPath), zap.Int("problems", len(lines)))
		// Plain lines, one a problem, for kubectl logs of a crash loop.
		fmt.Fprintf(stderr, "relayd: invalid config %s:\n", *cfgPath)
		for _, l := range lines {
			fmt.Fprintf(stderr, "  %s\n", l)
		}
		return exitFailure
	}
	for _, w := range cfg.Warnings() {
		log.Warn("config warning", zap.String("warning", w.Error()))
	}
	restCfg, err := kubeConfig(*kubeconfig, *kubeContext)
	if err != nil {
		log.Error("no Kubernetes credentials", zap.Error(err))
		return exitFailure
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	check := indexCheck(os.Getenv)
	log.Info("starting", zap.String("version", version.Version), zap.Bool("failpoints", version.Failpoints()), zap.String("config", *cfgPath),
		zap.String("cluster", cfg.Cluster), zap.Int("sources", len(cfg.Sources)))
	if check != nil {
		log.Info("index consistency check on (a test build, RELAYD_INDEX_CHECK=1): every relist is compared with a consistent LIST")
	}
	err = relay.Run(ctx, relay.Options{
		Config: cfg, RestConfig: restCfg, Logger: log, Registry: prometheus.NewRegistry(),
		MetricsAddr: *metricsAddr, HealthAddr: *healthAddr,
		IndexCheck: check,
		Identity:   os.Getenv("POD_NAME"), // the downward API; the host name otherwise
	})
	if err != nil {
		log.Error("relayd stopped", zap.Error(err))
		return exitFailure
	}
	return exitOK
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
// (or ~/.kube/config); with kubeContext, that context of the kubeconfig
// (never in-cluster).
func kubeConfig(path, kubeContext string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if path != "" {
		rules.ExplicitPath = path
	}
	if path == "" && kubeContext == "" {
		if cfg, err := rest.InClusterConfig(); err == nil {
			return cfg, nil
		} else if !errors.Is(err, rest.ErrNotInCluster) {
			return nil, err
		}
	}
	overrides := &clientcmd.ConfigOverrides{CurrentContext: kubeContext}
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides).ClientConfig()
}
