package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
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
	// durable JetStream consumer (created if missing; it resumes where its
	// last acknowledged message left off).
	Stream, Durable string
	// Subjects are the filter subjects: the object subjects wanted and the
	// sync markers of the sources that publish them, e.g. "k8s.prod.>".
	Subjects []string
	// View is where the objects are kept.
	View *View
	// Lister reconciles the view after a sync.completed of reason
	// index-lost (or initial, over objects the view already holds); nil
	// logs that a reconcile is needed instead.
	Lister Lister
	Log    *slog.Logger
	// Applied, when set, is called after each message was applied, before
	// it is acknowledged.
	Applied func(Applied)
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
// is decoded (either CloudEvents mode), applied, and only then
// acknowledged. A message that cannot be applied (the view's bucket is
// unavailable) is not acknowledged and comes back after a delay; one that
// cannot be decoded is logged and terminated, never retried forever.
func Run(ctx context.Context, o Options) error {
	cons, err := o.JS.CreateOrUpdateConsumer(ctx, o.Stream, jetstream.ConsumerConfig{
		Durable:        o.Durable,
		FilterSubjects: o.Subjects,
		AckPolicy:      jetstream.AckExplicitPolicy,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		AckWait:        30 * time.Second,
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
	defer cancel() // ends the goroutine below when Run returns on an error
	go func() { <-ctx.Done(); it.Stop() }()
	for {
		m, err := it.Next()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			return err
		}
		if err := handle(ctx, o, m); err != nil {
			if errors.Is(err, errTerminated) {
				continue
			}
			if ctx.Err() != nil {
				return nil
			}
			o.Log.Warn("not applied; redelivered later", "subject", m.Subject(), "error", err)
			_ = m.NakWithDelay(time.Second)
			continue
		}
		if err := m.Ack(); err != nil {
			o.Log.Warn("ack failed; the message comes back and is skipped then", "subject", m.Subject(), "error", err)
		}
	}
}

// errTerminated is handle's error for a message it terminated (Term): it
// is neither acknowledged nor redelivered.
var errTerminated = errors.New("message terminated")

func terminate(m jetstream.Msg) error {
	if err := m.Term(); err != nil {
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
	env, err := event.DecodeMessage(m.Headers(), m.Data())
	if err != nil {
		o.Log.Error("undecodable message: terminated", "subject", m.Subject(), "seq", md.Sequence.Stream, "error", err)
		return terminate(m)
	}
	a := Applied{Seq: md.Sequence.Stream, Event: env}
	switch {
	case strings.HasSuffix(env.Type, ".source.sync.completed"):
		var d syncData
		if err := json.Unmarshal(env.Data, &d); err != nil {
			o.Log.Error("undecodable sync marker: terminated", "seq", md.Sequence.Stream, "error", err)
			return terminate(m)
		}
		a.Gap = d.Reason
		if a.Reconciled, err = reconcile(ctx, o, env.RelaydSource, d); err != nil {
			return err
		}
	case strings.HasSuffix(env.Type, ".source.sync.started"):
		// Nothing to do: the events up to sync.completed repair the view.
	default:
		a.Action, err = o.View.Apply(ctx, &env)
		if errors.Is(err, ErrIncomparable) {
			o.Log.Error("cannot order this event: terminated", "subject", m.Subject(), "seq", md.Sequence.Stream, "error", err)
			return terminate(m)
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
func reconcile(ctx context.Context, o Options, source string, d syncData) (int, error) {
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
