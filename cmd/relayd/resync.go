package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/relayd/relayd/pkg/config"
	"github.com/relayd/relayd/pkg/natsconn"
	"github.com/relayd/relayd/pkg/resync"
)

const resyncAbout = `
Ask the running relayd to relist a source (docs/OPERATIONS.md, "Resync on
request"): the replica that runs it (with sharding, the holder of the
source's Lease) relists its watches, or the one --namespace names, with
relist reason "requested", between sync markers that carry the request id.
By default only what differs from relayd's object index is published (as
after a 410); --full publishes every object again (origin resync), so that
a consumer without apiserver access can bootstrap from the stream.

The request goes over NATS, connected with the config's nats block, to
<prefix>-ctl.<cluster>.resync.<source>; the command waits for the
sync.completed marker of each watch relisted and prints the counts. The same
--id twice is one resync: retry with the id printed to wait for it again.

relayd answers only on an inbox under its resync.requesterInboxPrefixes:
this config's nats.inboxPrefix (default _INBOX) must be one of them, or the
command gets no answer. relayd runs one resync of a source at a time and
refuses a --full sooner than its resync.minFullInterval (default 5m) after
the last full one started or completed, saying when the next is allowed.

Exit codes: 0 the resync completed; 1 no relayd serves the source, no
answer within --timeout, a refusal (a NATS permissions violation, another
resync of the source running, a --full too soon after the last, a
namespace the source does not watch) or no completion within --wait; 2 a
usage error (a source not in the config).`

const resyncExamples = `
  relayd resync -c config.yaml --source pods
  relayd resync -c config.yaml --source pods --namespace shop
  relayd resync -c config.yaml --source pods --full --id bootstrap-42`

func cmdResync(args []string, stdout, stderr io.Writer) int {
	c := newCommand("resync", "relayd resync -c config.yaml --source NAME [flags]", resyncAbout, resyncExamples)
	fs := c.fs
	file := fs.StringP("config", "c", "", "relayd config file (required): its sources, prefix, cluster and nats block")
	source := fs.String("source", "", "the source to relist (required)")
	var req resync.Request
	fs.StringVar(&req.Namespace, "namespace", "", "relist only the watch of this namespace (a source with a namespaces list)")
	fs.BoolVar(&req.Full, "full", false, "publish every object again, unchanged ones too")
	fs.StringVar(&req.ID, "id", "", "request id (default: generated); the same id again is the same resync")
	timeout := fs.Duration("timeout", 10*time.Second, "how long to wait for relayd's answer")
	wait := fs.Duration("wait", 30*time.Minute, "how long to wait for the resync to complete once accepted")
	if done, code := c.parse(args, stdout, stderr); done {
		return code
	}
	switch {
	case fs.NArg() > 0:
		return c.usageError(stderr, "unexpected argument %q", fs.Arg(0))
	case *file == "":
		return c.usageError(stderr, "no config file given (-c FILE)")
	case *source == "":
		return c.usageError(stderr, "no source given (--source NAME)")
	case *timeout <= 0 || *wait <= 0:
		return c.usageError(stderr, "--timeout and --wait must be positive")
	}
	if req.ID == "" {
		req.ID = newRequestID()
	} else if err := resync.CheckID(req.ID); err != nil {
		return c.usageError(stderr, "--id: %s", err)
	}
	cfg, err := config.Load(*file)
	if err != nil {
		fmt.Fprintf(stderr, "relayd resync: %v\n", err)
		return exitFailure
	}
	var names []string
	for i := range cfg.Sources {
		names = append(names, cfg.Sources[i].Name)
	}
	if !slices.Contains(names, *source) {
		return c.usageError(stderr, "source %q is not in %s (its sources: %v)", *source, *file, names)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	res, err := resyncOver(ctx, cfg, resync.ClientOptions{Source: *source, Request: req, Timeout: *timeout, Wait: *wait})
	if err != nil {
		fmt.Fprintf(stderr, "relayd resync: %v\n", err)
		return exitFailure
	}
	printResync(stdout, res, req.Full)
	return exitOK
}

// resyncOver connects to NATS as the config says and runs the request.
func resyncOver(ctx context.Context, cfg *config.Config, o resync.ClientOptions) (*resync.Result, error) {
	opts, err := natsconn.ClientOptions(&cfg.NATS)
	if err != nil {
		return nil, err
	}
	errs := make(chan error, 4)
	opts = append(opts, nats.Name("relayd resync"), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case errs <- err:
		default:
		}
	}))
	nc, err := nats.Connect(cfg.NATS.URL, opts...)
	if err != nil {
		return nil, fmt.Errorf("connecting to NATS: %s", config.RedactError(err, cfg.NATS.URL))
	}
	defer nc.Close()
	o.Conn, o.Errors, o.Prefix, o.Cluster, o.Inbox = nc, errs, cfg.Prefix, cfg.Cluster, cfg.NATS.InboxPrefix
	return resync.Run(ctx, o)
}

func printResync(w io.Writer, r *resync.Result, full bool) {
	what := "resync"
	if full {
		what = "full resync"
	}
	if r.Duplicate {
		what += " (same request as before)"
	}
	fmt.Fprintf(w, "%s %s of source %s completed: %d watch(es)\n", what, r.ID, r.Source, len(r.Namespaces))
	for _, ns := range r.Namespaces {
		c, name := r.Counts[ns], ns
		if name == "" {
			name = "(all)"
		}
		fmt.Fprintf(w, "  namespace %s: total %d, added %d, modified %d, deleted %d, unchanged %d\n", name, c.Total, c.Added, c.Modified, c.Deleted, c.Unchanged)
	}
	t := r.Total()
	fmt.Fprintf(w, "total %d, added %d, modified %d, deleted %d, unchanged %d\n", t.Total, t.Added, t.Modified, t.Deleted, t.Unchanged)
}

// newRequestID is "r-" and 12 random hex digits.
func newRequestID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "r-" + hex.EncodeToString(b[:])
}
