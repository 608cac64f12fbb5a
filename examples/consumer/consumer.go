package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/pkg/event"
)

// Lister lists the uids of the objects of one resource in a namespace ("" for
// all namespaces or a cluster-scoped resource), at a resourceVersion at or
// after minRV: what the view is reconciled against after relayd lost its
// object index (docs/CONSUMING.md, "Keeping a view of the cluster", rule 5).
type Lister interface {
	ListUIDs(ctx context.Context, apiVersion, resource, namespace, minRV string) (map[string]bool, error)
}

// Options configures Run.
type Options struct {
	JS jetstream.JetStream
	// Stream is relayd's event stream; Durable the name of this consumer's
	// durable JetStream consumer (created if missing, updated to this
	// configuration; it resumes where its last acknowledged message left
	// off).
	Stream, Durable string
	// Cluster is the cluster this consumer follows: relayd's config key
	// cluster, its k8scluster extension. Required: a message of another
	// cluster is terminated (Check).
	Cluster string
	// Prefix is relayd's subject and type prefix (config key prefix);
	// default "k8s".
	Prefix string
	// Subjects are the filter subjects: the object subjects wanted and the
	// sync markers of the sources that publish them; default
	// "<prefix>.<cluster>.>".
	Subjects []string
	// View is where the objects are kept.
	View *View
	// Lister reconciles the view after a sync.completed of reason
	// index-lost (or initial, over objects the view already holds); nil
	// logs that a reconcile is needed instead.
	Lister Lister
	Log    *slog.Logger
	// BackOff is the redelivery schedule of a message that was not
	// applied: the n-th redelivery waits BackOff[n-1] (the last one
	// repeats), whether the consumer gave it back (Nak) or its
	// acknowledgement timed out (the durable consumer's BackOff, so its
	// first value is also the ack wait: keep it above the longest apply).
	// Default 30s, 1m, 2m, 5m, 10m.
	BackOff []time.Duration
	// MaxDeliver bounds the deliveries of one message (default 20, about
	// 2.5 hours with the default BackOff). At the last one a message that
	// still cannot be applied is terminated with an error log naming it:
	// the view may then miss that change until the next reconcile.
	MaxDeliver int
	// TombstoneTTL is how long the view keeps a deleted object's tombstone
	// (docs/CONSUMING.md, rule 3): an event of the object older than the
	// delete that arrives later is still skipped. Default 24h, well over
	// relayd's duplicate window (10m); PruneEvery (default TombstoneTTL/4)
	// is how often expired tombstones are removed.
	TombstoneTTL, PruneEvery time.Duration
	// Applied, when set, is called after each message was applied, before
	// it is acknowledged.
	Applied func(Applied)
}

// The defaults of Options.
var (
	DefaultBackOff      = []time.Duration{30 * time.Second, time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute}
	DefaultMaxDeliver   = 20
	DefaultTombstoneTTL = 24 * time.Hour
)

// withDefaults checks o and fills in the defaults.
func (o Options) withDefaults() (Options, error) {
	if o.Prefix == "" {
		o.Prefix = "k8s"
	}
	switch {
	case !validToken(o.Cluster):
		return o, fmt.Errorf("cluster %q: give the cluster relayd publishes (its config key cluster: letters, digits, '_' and '-')", o.Cluster)
	case !validPrefix(o.Prefix):
		return o, fmt.Errorf("prefix %q: relayd's prefix is tokens of letters, digits, '_' and '-' joined by dots", o.Prefix)
	case o.View == nil || o.JS == nil || o.Log == nil:
		return o, errors.New("JS, View and Log are required")
	}
	if len(o.Subjects) == 0 {
		o.Subjects = []string{o.Prefix + "." + o.Cluster + ".>"}
	}
	if len(o.BackOff) == 0 {
		o.BackOff = DefaultBackOff
	}
	if o.MaxDeliver == 0 {
		o.MaxDeliver = DefaultMaxDeliver
	}
	if o.MaxDeliver <= len(o.BackOff) {
		return o, fmt.Errorf("MaxDeliver %d: JetStream wants more deliveries than BackOff values (%d)", o.MaxDeliver, len(o.BackOff))
	}
	if o.TombstoneTTL <= 0 {
		o.TombstoneTTL = DefaultTombstoneTTL
	}
	if o.PruneEvery <= 0 {
		o.PruneEvery = o.TombstoneTTL / 4
	}
	return o, nil
}

// Applied describes one applied message.
type Applied struct {
	Seq    uint64 // stream sequence
	Event  event.Envelope
	Action Action // object events
	// Gap is set on a sync.completed: the reason of the relist, and how
	// many entries a reconcile removed.
	Gap        string
	Reconciled int
}

// syncData is the data of a sync marker.
type syncData struct {
	Namespace string `json:"namespace"`
	Epoch     uint64 `json:"epoch"`
	Reason    string `json:"reason"`
	From      string `json:"fromResourceVersion"`
	To        string `json:"toResourceVersion"`
}

// Run consumes relayd's stream into the view until ctx ends: each message
// is decoded (either CloudEvents mode), checked (Check), applied, and only
// then acknowledged. A message that cannot be applied (the view's bucket is
// unavailable) is not acknowledged and comes back after the BackOff delay,
// at most MaxDeliver times; one that cannot be decoded, is not relayd's for
// this cluster, or cannot be ordered is logged and terminated, never
// retried. Tombstones older than TombstoneTTL are pruned meanwhile.
func Run(ctx context.Context, o Options) error {
	o, err := o.withDefaults()
	if err != nil {
		return fmt.Errorf("consumer %s: %w", o.Durable, err)
	}
	cons, err := o.JS.CreateOrUpdateConsumer(ctx, o.Stream, jetstream.ConsumerConfig{
		Durable:        o.Durable,
		FilterSubjects: o.Subjects,
		AckPolicy:      jetstream.AckExplicitPolicy,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		MaxDeliver:     o.MaxDeliver,
		BackOff:        o.BackOff,
	})
	if err != nil {
		return fmt.Errorf("consumer %s on stream %s: %w", o.Durable, o.Stream, err)
	}
	it, err := cons.Messages()
	if err != nil {
		return err
	}
	defer it.Stop()
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel() // ends the goroutines below when Run returns on an error
	wg.Add(2)
	go func() { defer wg.Done(); <-ctx.Done(); it.Stop() }()
	go func() { defer wg.Done(); prune(ctx, o) }()
	for {
		m, err := it.Next()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			return err
		}
		settle(ctx, o, m, handle(ctx, o, m))
	}
}

// settle acknowledges, gives back or terminates a message after handle.
func settle(ctx context.Context, o Options, m jetstream.Msg, err error) {
	switch {
	case err == nil:
		if err := m.Ack(); err != nil {
			o.Log.Warn("ack failed; the message comes back and is skipped then", "subject", m.Subject(), "error", err)
		}
	case errors.Is(err, errTerminated):
	case ctx.Err() != nil:
		// Stopping: the message comes back after the ack wait.
	default:
		md, mdErr := m.Metadata()
		if mdErr != nil {
			o.Log.Warn("not applied; redelivered after the ack wait", "subject", m.Subject(), "error", err)
			return
		}
		n := int(md.NumDelivered)
		if n >= o.MaxDeliver {
			o.Log.Error("not applied after the last delivery: terminated; the view misses this change until a reconcile",
				"subject", m.Subject(), "seq", md.Sequence.Stream, "deliveries", n, "error", err)
			_ = m.TermWithReason("not applied after MaxDeliver deliveries")
			return
		}
		delay := o.BackOff[min(n, len(o.BackOff))-1]
		o.Log.Warn("not applied; redelivered later", "subject", m.Subject(), "seq", md.Sequence.Stream, "deliveries", n, "retryIn", delay, "error", err)
		_ = m.NakWithDelay(delay)
	}
}

// prune removes expired tombstones every PruneEvery until ctx ends.
func prune(ctx context.Context, o Options) {
	t := time.NewTicker(o.PruneEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := o.View.PruneTombstones(ctx, time.Now().Add(-o.TombstoneTTL))
		switch {
		case err != nil && ctx.Err() == nil:
			o.Log.Warn("pruning tombstones failed; tried again later", "error", err)
		case n > 0:
			o.Log.Info("pruned expired tombstones", "removed", n, "ttl", o.TombstoneTTL)
		}
	}
}

// errTerminated is handle's error for a message it terminated (Term): it
// is neither acknowledged nor redelivered.
var errTerminated = errors.New("message terminated")

func terminate(m jetstream.Msg, why error) error {
	if err := m.TermWithReason(why.Error()); err != nil {
		return err
	}
	return errTerminated
}

// handle applies one message.
func handle(ctx context.Context, o Options, m jetstream.Msg) error {
	md, err := m.Metadata()
	if err != nil {
		return err
	}
	seq := md.Sequence.Stream
	env, err := event.DecodeMessage(m.Headers(), m.Data())
	if err != nil {
		o.Log.Error("undecodable message: terminated", "subject", m.Subject(), "seq", seq, "error", err)
		return terminate(m, err)
	}
	k, err := Check(o.Prefix, o.Cluster, m.Subject(), m.Headers().Get(event.HeaderMsgID), &env)
	if err != nil {
		o.Log.Error("not a message of relayd for this cluster: terminated", "subject", m.Subject(), "seq", seq, "error", err)
		return terminate(m, err)
	}
	a := Applied{Seq: seq, Event: env}
	switch k {
	case syncCompleted:
		var d syncData
		if err := json.Unmarshal(env.Data, &d); err != nil {
			o.Log.Error("undecodable sync marker: terminated", "subject", m.Subject(), "seq", seq, "error", err)
			return terminate(m, err)
		}
		if d.Namespace != env.K8sNamespace {
			err := unusable("sync marker of namespace %q, k8snamespace %q", d.Namespace, env.K8sNamespace)
			o.Log.Error("inconsistent sync marker: terminated", "subject", m.Subject(), "seq", seq, "error", err)
			return terminate(m, err)
		}
		a.Gap = d.Reason
		if a.Reconciled, err = reconcile(ctx, o, m, env.RelaydSource, d); err != nil {
			return err
		}
	case syncStarted:
		// Nothing to do: the events up to sync.completed repair the view.
	default:
		a.Action, err = o.View.Apply(ctx, &env)
		if errors.Is(err, ErrIncomparable) {
			o.Log.Error("cannot order this event: terminated", "subject", m.Subject(), "seq", seq, "error", err)
			return terminate(m, err)
		}
		if err != nil {
			return err
		}
	}
	if o.Applied != nil {
		o.Applied(a)
	}
	return nil
}

// reconcile handles a completed relist. After reason expired or
// no-checkpoint the events between the markers brought the view up to date;
// after index-lost (or an initial snapshot over objects the view holds)
// relayd may not know objects the view holds, so their deletes cannot come:
// they are found by listing the cluster.
func reconcile(ctx context.Context, o Options, m jetstream.Msg, source string, d syncData) (int, error) {
	if d.Reason != "index-lost" && d.Reason != "initial" {
		return 0, nil
	}
	entries, err := o.View.Entries(ctx, source)
	if err != nil {
		return 0, err
	}
	type res struct{ apiVersion, resource string }
	held := map[res][]*Entry{}
	for _, e := range entries {
		if !e.Deleted && (d.Namespace == "" || e.Namespace == d.Namespace) {
			r := res{e.APIVersion, e.Resource}
			held[r] = append(held[r], e)
		}
	}
	if len(held) == 0 {
		return 0, nil
	}
	if o.Lister == nil {
		o.Log.Warn("relayd relisted without its object index: objects deleted meanwhile may remain in the view; reconcile against a LIST",
			"source", source, "namespace", d.Namespace, "reason", d.Reason, "toResourceVersion", d.To)
		return 0, nil
	}
	n := 0
	for r, es := range held {
		_ = m.InProgress() // a LIST may take a while: not redelivered meanwhile
		live, err := o.Lister.ListUIDs(ctx, r.apiVersion, r.resource, d.Namespace, d.To)
		if err != nil {
			return n, fmt.Errorf("reconcile %s %s: %w", source, r.resource, err)
		}
		for _, e := range es {
			if live[e.UID] {
				continue
			}
			e.Deleted, e.DeletedAt, e.Object = true, time.Now().UTC(), nil
			if err := o.View.Put(ctx, e); err != nil {
				return n, err
			}
			n++
		}
	}
	if n > 0 {
		o.Log.Info("reconciled after a relist", "source", source, "namespace", d.Namespace, "reason", d.Reason, "removed", n)
	}
	return n, nil
}
