// Command consumer is an example of a consumer that follows relayd's
// consumer contract (docs/CONSUMING.md): a durable JetStream consumer that
// keeps a materialized view of the cluster's objects (uid → object) in a
// JetStream key-value bucket.
//
//   - Messages are decoded in either CloudEvents mode (pkg/event).
//   - The view is keyed by (source, uid); an event is applied only if its
//     resourceVersion is newer than the held one (a delete: newer or
//     equal), and deletes leave tombstones, so duplicates, replays and
//     redeliveries are harmless ([Decide]).
//   - A sync.completed of reason index-lost (or initial, over objects the
//     view holds) is reconciled against a LIST of the cluster, when a
//     kubeconfig is given.
//   - At start, a stream that no longer holds messages this consumer has
//     not read (they left by the stream's limits while it was down, or a
//     new consumer on a stream that lost its beginning) makes it load the
//     view by a LIST of every source it knows (from the sync markers, or
//     --follow), when a kubeconfig is given.
//   - With --bootstrap-resync SOURCE, a new consumer on a stream that lost
//     its beginning loads the view by a full resync of the source on
//     request (relayd resync --full) instead of a LIST: no kubeconfig.
//   - A message is acknowledged only after the view stored its effect; one
//     that could not be stored comes back with a back-off, at most
//     --max-deliver times.
//   - A message that is not relayd's for --cluster (its type, k8scluster,
//     source and subject disagree: [Check]) or cannot be decoded or ordered
//     is terminated, never retried; tombstones expire after
//     --tombstone-ttl.
//
// Usage:
//
//	consumer --server nats://127.0.0.1:4222 --stream K8S --cluster demo [--subject 'k8s.demo.>'] [--kubeconfig FILE] [--follow cms=v1/configmaps@shop]
//
// It prints one line per applied message, names and values from the
// message escaped (quoted with Go escapes when they hold anything but
// printable characters). README.md says how to run it against `make
// sandbox`.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

type subjects []string

func (s *subjects) String() string     { return strings.Join(*s, ",") }
func (s *subjects) Set(v string) error { *s = append(*s, v); return nil }

type scopes []Scope

func (s *scopes) String() string { return fmt.Sprint(len(*s), " scopes") }
func (s *scopes) Set(v string) error {
	sc, err := ParseScope(v)
	*s = append(*s, sc)
	return err
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("consumer", flag.ContinueOnError)
	fs.SetOutput(stderr)
	server := fs.String("server", nats.DefaultURL, "NATS server URL")
	creds := fs.String("creds", "", "NATS credentials file (.creds)")
	stream := fs.String("stream", "K8S", "relayd's event stream")
	durable := fs.String("durable", "example-consumer", "name of the durable JetStream consumer")
	bucket := fs.String("bucket", "example-view", "key-value bucket holding the view")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig for reconciling after relayd lost its index (optional)")
	cluster := fs.String("cluster", "", "the cluster relayd publishes (its config key cluster); required")
	prefix := fs.String("prefix", "k8s", "relayd's subject and type prefix (its config key prefix)")
	maxDeliver := fs.Int("max-deliver", DefaultMaxDeliver, "deliveries of a message that cannot be applied before it is terminated")
	ttl := fs.Duration("tombstone-ttl", DefaultTombstoneTTL, "how long a deleted object's tombstone is kept")
	var subs subjects
	fs.Var(&subs, "subject", "filter subject, repeatable (default: <prefix>.<cluster>.>)")
	var bootstrap subjects
	fs.Var(&bootstrap, "bootstrap-resync", "SOURCE to load a new consumer's view from by a full resync on request (relayd resync --full) instead of a LIST when the stream lost its beginning, repeatable; needs NATS permission to send it")
	var follow scopes
	fs.Var(&follow, "follow", "SOURCE=[GROUP/]VERSION/RESOURCE[@NAMESPACE] to LIST when the stream lost messages this consumer did not read, repeatable (the sources whose sync markers it read are listed anyway)")
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	if *cluster == "" {
		fmt.Fprintln(stderr, "consumer: --cluster is required: the cluster relayd publishes (its config key cluster)")
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	opts := []nats.Option{nats.Name("relayd-example-consumer"), nats.MaxReconnects(-1)}
	if *creds != "" {
		opts = append(opts, nats.UserCredentials(*creds))
	}
	nc, err := nats.Connect(*server, opts...)
	if err != nil {
		fmt.Fprintln(stderr, "consumer: connect:", err)
		return 1
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		fmt.Fprintln(stderr, "consumer:", err)
		return 1
	}
	view, err := OpenView(ctx, js, *bucket)
	if err != nil {
		fmt.Fprintln(stderr, "consumer:", err)
		return 1
	}
	o := Options{JS: js, Stream: *stream, Durable: *durable, Cluster: *cluster, Prefix: *prefix, Subjects: subs, View: view, Log: log,
		MaxDeliver: *maxDeliver, TombstoneTTL: *ttl, Follow: follow, BootstrapResync: bootstrap, Applied: func(a Applied) { fmt.Fprintln(stdout, describe(a)) }}
	if *kubeconfig != "" {
		if o.Lister, err = NewLister(*kubeconfig); err != nil {
			fmt.Fprintln(stderr, "consumer:", err)
			return 1
		}
	}
	if err := Run(ctx, o); err != nil {
		fmt.Fprintln(stderr, "consumer:", err)
		return 1
	}
	return 0
}

// describe renders an applied message as one line. Every string from the
// message goes through printable: an object's name cannot move the cursor,
// change colours or reorder the line.
func describe(a Applied) string {
	e := a.Event
	if a.Relist != "" {
		s := a.Scope
		return fmt.Sprintf("list source=%s %s/%s namespace=%s reason=%s changed=%d", printable(s.Source), printable(s.APIVersion()),
			printable(s.Resource), printable(s.Namespace), a.Relist, a.Reconciled)
	}
	if a.Gap != "" {
		return fmt.Sprintf("%d sync.completed source=%s epoch=%d reason=%s reconciled=%d", a.Seq, printable(e.RelaydSource), e.RelaydEpoch, printable(a.Gap), a.Reconciled)
	}
	if e.K8sUID == "" {
		return fmt.Sprintf("%d %s source=%s epoch=%d", a.Seq, printable(e.Type), printable(e.RelaydSource), e.RelaydEpoch)
	}
	name := e.K8sName
	if e.K8sNamespace != "" {
		name = e.K8sNamespace + "/" + name
	}
	return fmt.Sprintf("%d %-6s %s %s %s rv=%s origin=%s", a.Seq, a.Action, printable(e.Type[strings.LastIndexByte(e.Type, '.')+1:]),
		printable(e.K8sKind), printable(name), printable(e.K8sResourceVersion), printable(e.RelaydOrigin))
}

// dynLister is a Lister over client-go's dynamic client.
type dynLister struct{ dyn dynamic.Interface }

// NewLister returns a Lister that lists with the kubeconfig's credentials.
func NewLister(kubeconfig string) (Lister, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return dynLister{dyn}, nil
}

func (l dynLister) List(ctx context.Context, s Scope, minRV string) ([]Listed, error) {
	gvr := schema.GroupVersionResource{Group: s.Group, Version: s.Version, Resource: s.Resource}
	opts := metav1.ListOptions{Limit: 500, LabelSelector: s.LabelSelector, FieldSelector: s.FieldSelector}
	if minRV != "" {
		opts.ResourceVersion, opts.ResourceVersionMatch = minRV, metav1.ResourceVersionMatchNotOlderThan
	}
	var out []Listed
	for {
		list, err := l.dyn.Resource(gvr).Namespace(s.Namespace).List(ctx, opts)
		if err != nil {
			return nil, err
		}
		for _, it := range list.Items {
			out = append(out, Listed{UID: string(it.GetUID()), Namespace: it.GetNamespace(), Name: it.GetName(), Kind: it.GetKind(),
				ResourceVersion: it.GetResourceVersion()})
		}
		if list.GetContinue() == "" {
			return out, nil
		}
		opts.Continue, opts.ResourceVersion, opts.ResourceVersionMatch = list.GetContinue(), "", ""
	}
}
