package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/relayd/relayd/pkg/tail"
)

const tailAbout = `
Print relayd's events from NATS as they arrive, one line each.

With -c (--config), tail connects the way relayd does, with the whole nats
block of the config: url, credentialsFile/nkeySeedFile/tokenFile/userFile,
tls, jsDomain and inboxPrefix. The subject then defaults to the config's
"<prefix>.<cluster>.>", and --replay replays the config's stream. Without
-c the defaults below apply.

Like the nats CLI, tail reads NATS_URL (as --server), NATS_CREDS (as
--creds) and NATS_CONTEXT, the name of a nats CLI context
($XDG_CONFIG_HOME/nats/context/NAME.json, ~/.config by default: its url,
creds, nkey, cert, key, ca, jetstream_domain and inbox_prefix; user,
password and token are not read). Precedence, highest first: flags given,
NATS_URL/NATS_CREDS, NATS_CONTEXT, the config file (-c), the defaults.
Credentials (--creds, NATS_CREDS, a context's creds or nkey) replace the
config's authentication, whichever it is.

The settings are checked as check-config checks nats.url: no credentials
in a URL, and credentials only over TLS (tls://, or a TLS setting), unless
the config's nats.allowPlaintextCredentials or --allow-plaintext-credentials
accepts them in plain.

Values that hold control characters or invalid UTF-8 are printed quoted
and escaped, never raw.`

const tailExamples = `
  relayd tail -c config.yaml                        # live events of the cluster
  relayd tail -c config.yaml --replay --count 20    # the stream from its start
  relayd tail --server nats://127.0.0.1:4222 --subject 'k8s.>'
  relayd tail --server nats://127.0.0.1:4222 --stream K8S --count 20
  NATS_CONTEXT=prod relayd tail --subject 'k8s.prod.>'
  relayd tail -c config.yaml --since 10m                # the last 10 minutes, then follow
  relayd tail -c config.yaml --since 2026-11-26T10:00:00Z --until 2026-11-26T10:05:00Z
  relayd tail -c config.yaml --kind ConfigMap --namespace shop
  relayd tail -c config.yaml --replay -o json | jq -c 'select(.relaydorigin == "resync")'`

func cmdTail(args []string, stdout, stderr io.Writer) int {
	return tailCommand(args, stdout, stderr, os.Getenv)
}

func tailCommand(args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	c := newCommand("tail", "relayd tail [-c config.yaml] [flags]", tailAbout, tailExamples)
	f := tail.Flags{}
	fs := c.fs
	fs.StringVarP(&f.Config, "config", "c", "", "relayd config file: connect with its nats block")
	fs.StringVarP(&f.Server, "server", "s", tail.DefaultServer, "NATS server URL(s), comma-separated; overrides $NATS_URL and nats.url")
	fs.StringVar(&f.Subject, "subject", "k8s.>", "subject filter; with -c the default is the config's <prefix>.<cluster>.>")
	fs.StringVar(&f.Stream, "stream", "", "replay this JetStream stream from its start, then follow (default: live only)")
	fs.BoolVar(&f.Replay, "replay", false, "with -c: replay the config's stream (nats.stream.name) from its start, then follow")
	fs.StringVar(&f.Since, "since", "", "replay from this time: a duration before now (10m) or an RFC 3339 time; the --stream, or the config's stream")
	fs.StringVar(&f.Until, "until", "", "end the replay at this time (same forms as --since) instead of following new events")
	count := fs.Int("count", 0, "exit after this many events (0: until interrupted)")
	fs.StringVar(&f.Creds, "creds", "", "NATS .creds file; overrides $NATS_CREDS and the config's authentication")
	fs.BoolVar(&f.AllowPlaintext, "allow-plaintext-credentials", false, "accept credentials on a connection that is not TLS (as nats.allowPlaintextCredentials)")
	output := fs.StringP("output", "o", "text", "text: one readable line per event; json: one CloudEvent per line (structured mode), for jq")
	var filter tail.Filter
	fs.StringVar(&filter.Source, "source", "", "only events of this source (relaydsource)")
	fs.StringVar(&filter.Namespace, "namespace", "", "only events of this namespace (sync markers of all-namespaces watches too)")
	fs.StringVar(&filter.Kind, "kind", "", "only events of this kind, e.g. ConfigMap (case-insensitive; sync markers too)")
	if done, code := c.parse(args, stdout, stderr); done {
		return code
	}
	if c.fs.NArg() > 0 {
		return c.usageError(stderr, "unexpected argument %q", c.fs.Arg(0))
	}
	if *output != "text" && *output != "json" {
		return c.usageError(stderr, "--output %q: want text or json", *output)
	}
	f.Set = map[string]bool{}
	fs.Visit(func(fl *pflag.Flag) { f.Set[fl.Name] = true })
	s, err := tail.Resolve(&f, getenv)
	if err != nil {
		var ue *tail.UsageError
		for line := range strings.SplitSeq(err.Error(), "\n") {
			fmt.Fprintln(stderr, "relayd tail:", line)
		}
		if errors.As(err, &ue) {
			return exitUsage
		}
		return exitFailure
	}
	for _, w := range s.Warnings() {
		fmt.Fprintln(stderr, "relayd tail: warning:", w)
	}
	o, err := s.Options(tail.Options{Count: *count, Out: stdout, JSON: *output == "json", Filter: filter})
	if err != nil {
		fmt.Fprintln(stderr, "relayd tail:", err)
		return exitFailure
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := tail.Run(ctx, o); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(stderr, "relayd tail:", s.Explain(err))
		return exitFailure
	}
	return exitOK
}
