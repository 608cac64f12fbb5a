package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/pkg/event"
)

// Lister lists the objects of a scope (a resource in a namespace, "" for all
// namespaces or a cluster-scoped resource, with the source's selectors), at
// a resourceVersion at or after minRV ("": the current one): what the view
// is reconciled against after relayd lost its object index
// (docs/CONSUMING.md, "Keeping a view of the cluster", rule 5), and loaded
// from when the stream lost messages this consumer did not read
// ("Bootstrapping a new consumer").
type Lister interface {
	List(ctx context.Context, s Scope, minRV string) ([]Listed, error)
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
	// index-lost (or initial, over objects the view already holds), and
	// loads it when the stream lost messages this consumer did not read
	// (planStart); nil logs that a reconcile is needed instead.
	Lister Lister
	// Follow are scopes to LIST when the view must be loaded, besides the
	// ones the sync markers named (recorded in the view): what a new
	// consumer on a stream that lost its beginning needs.
	Follow []Scope
	// BootstrapResync are sources a new consumer loads its view from by a
	// full resync on request instead of a LIST, when the stream lost its
	// beginning (docs/CONSUMING.md, "Resync on request"): no apiserver
	// access needed, only NATS permission to send the request (pkg/resync).
	BootstrapResync []string
	Log             *slog.Logger
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
	// it is acknowledged, and after each scope a LIST loaded.
	Applied func(Applied)
	// PositionEvery is how often the last acknowledged stream sequence is
	// recorded in the view (default 1s; see planStart).
	PositionEvery time.Duration
	// HeartbeatCheckEvery is how often the Watchdog looks for heartbeats
	// 2 intervals overdue and logs them (docs/CONSUMING.md, "Heartbeats");
	// default 1s.
	HeartbeatCheckEvery time.Duration
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
	if o.PositionEvery <= 0 {
		o.PositionEvery = time.Second
	}
	if o.HeartbeatCheckEvery <= 0 {
		o.HeartbeatCheckEvery = time.Second
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
	// Relist is set when a LIST loaded the view at start (no message):
	// why ("bootstrap", "lost-messages"), the Scope listed, and how many
	// entries changed (Reconciled).
	Relist string
	Scope  Scope
}

// syncData is the data of a sync marker. The resource members are absent
// from the markers of relayd versions before they were added.
type syncData struct {
	Namespace     string `json:"namespace"`
	Epoch         uint64 `json:"epoch"`
	Reason        string `json:"reason"`
	From          string `json:"fromResourceVersion"`
	To            string `json:"toResourceVersion"`
	Group         string `json:"group"`
	Version       string `json:"version"`
	Resource      string `json:"resource"`
	Kind          string `json:"kind"`
	LabelSelector string `json:"labelSelector"`
	FieldSelector string `json:"fieldSelector"`
}

// scope is what the marker's watch covers; false for a marker that does
// not name its resource.
func (d syncData) scope(source string) (Scope, bool) {
	return Scope{Source: source, Group: d.Group, Version: d.Version, Resource: d.Resource, Kind: d.Kind, Namespace: d.Namespace,
		LabelSelector: d.LabelSelector, FieldSelector: d.FieldSelector}, d.Resource != "" && d.Version != ""
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
	plan, err := planStart(ctx, o)
	if err != nil {
		return err
	}
	cons, err := o.JS.CreateOrUpdateConsumer(ctx, o.Stream, jetstream.ConsumerConfig{
		Durable:        o.Durable,
		FilterSubjects: o.Subjects,
		AckPolicy:      jetstream.AckExplicitPolicy,
		DeliverPolicy:  plan.deliver,
		OptStartSeq:    plan.startSeq,
		MaxDeliver:     o.MaxDeliver,
		BackOff:        o.BackOff,
	})
	if err != nil {
		return fmt.Errorf("consumer %s on stream %s: %w", o.Durable, o.Stream, err)
	}
	pos := &position{o: o, seq: plan.pos}
	floor, err := load(ctx, o, plan)
	if err != nil {
		return err
	}
	if floor > pos.seq {
		// The view now holds what the stream no longer does: a later start
		// must not list again for it.
		pos.seq, pos.dirty = floor, true
		pos.write(ctx)
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
	dog := NewWatchdog(o.Log)
	wg.Add(3)
	go func() { defer wg.Done(); <-ctx.Done(); it.Stop() }()
	go func() { defer wg.Done(); prune(ctx, o) }()
	go func() { defer wg.Done(); watchHeartbeats(ctx, o, dog) }()
	defer pos.flush()
	for {
		m, err := it.Next()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			return err
		}
		if settle(ctx, o, m, handle(ctx, o, m, dog)) {
			pos.acked(ctx, m)
		}
	}
}

// load loads the view by a LIST when planStart says the stream does not
// hold every message this consumer has not read. It returns the stream
// sequence the view is then up to date with (0 when it did not LIST).
func load(ctx context.Context, o Options, p startPlan) (uint64, error) {
	if p.relist == "" {
		return 0, nil
	}
	if p.relist == "bootstrap" && len(o.BootstrapResync) > 0 {
		return bootstrapResync(ctx, o, p)
	}
	if o.Lister == nil {
		o.Log.Error("the stream no longer holds messages this consumer has not read, and there is no kubeconfig to LIST the cluster: the view misses their changes until a reconcile",
			"reason", p.relist, "streamFirstSeq", p.first, "lastAcked", p.pos)
		return 0, nil
	}
	o.Log.Warn("the stream no longer holds messages this consumer has not read: loading the view by a LIST",
		"reason", p.relist, "streamFirstSeq", p.first, "lastAcked", p.pos)
	n, err := relistAll(ctx, o, p.relist)
	if err != nil {
		return 0, err
	}
	o.Log.Info("view loaded by a LIST", "reason", p.relist, "changed", n)
	if p.relist == "bootstrap" && p.startSeq > 0 {
		return p.startSeq - 1, nil // a new consumer, starting after the stream's end
	}
	return p.first - 1, nil
}

// position records the last acknowledged stream sequence in the view, at
// most every PositionEvery and when Run returns.
type position struct {
	o       Options
	seq     uint64
	written time.Time
	dirty   bool
}

func (p *position) acked(ctx context.Context, m jetstream.Msg) {
	md, err := m.Metadata()
	if err != nil || md.Sequence.Stream <= p.seq {
		return
	}
	p.seq, p.dirty = md.Sequence.Stream, true
	if time.Since(p.written) >= p.o.PositionEvery {
		p.write(ctx)
	}
}

func (p *position) flush() {
	if p.dirty {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		p.write(ctx)
	}
}

func (p *position) write(ctx context.Context) {
	if err := p.o.View.SetPosition(ctx, p.o.Durable, p.seq); err != nil {
		p.o.Log.Warn("recording the stream position failed; tried again later", "error", err)
		return
	}
	p.written, p.dirty = time.Now(), false
}

// settle acknowledges, gives back or terminates a message after handle;
// true when it acknowledged it.
func settle(ctx context.Context, o Options, m jetstream.Msg, err error) bool {
	switch {
	case err == nil:
		if err := m.Ack(); err != nil {
			o.Log.Warn("ack failed; the message comes back and is skipped then", "subject", m.Subject(), "error", err)
			return false
		}
		return true
	case errors.Is(err, errTerminated):
	case ctx.Err() != nil:
		// Stopping: the message comes back after the ack wait.
	default:
		md, mdErr := m.Metadata()
		if mdErr != nil {
			o.Log.Warn("not applied; redelivered after the ack wait", "subject", m.Subject(), "error", err)
			return false
		}
		n := int(md.NumDelivered)
		if n >= o.MaxDeliver {
			o.Log.Error("not applied after the last delivery: terminated; the view misses this change until a reconcile",
				"subject", m.Subject(), "seq", md.Sequence.Stream, "deliveries", n, "error", err)
			_ = m.TermWithReason("not applied after MaxDeliver deliveries")
			return false
		}
		delay := o.BackOff[min(n, len(o.BackOff))-1]
		o.Log.Warn("not applied; redelivered later", "subject", m.Subject(), "seq", md.Sequence.Stream, "deliveries", n, "retryIn", delay, "error", err)
		_ = m.NakWithDelay(delay)
	}
	return false
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

// watchHeartbeats runs dog's Check every o.HeartbeatCheckEvery until ctx
// ends.
func watchHeartbeats(ctx context.Context, o Options, dog *Watchdog) {
	t := time.NewTicker(o.HeartbeatCheckEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			dog.Check(now)
		}
	}
}

// handle applies one message; a heartbeat goes to dog (a nil dog: ignored).
func handle(ctx context.Context, o Options, m jetstream.Msg, dog *Watchdog) error {
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
	if k == heartbeat {
		if dog == nil {
			return nil
		}
		if err := dog.Beat(&env, md.NumPending); err != nil {
			o.Log.Error("inconsistent heartbeat: terminated", "subject", m.Subject(), "seq", seq, "error", err)
			return terminate(m, err)
		}
		return nil // not part of the view
	}
	if dog != nil {
		dog.Seen(md.NumPending)
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
		if s, ok := d.scope(env.RelaydSource); ok {
			// What a LIST of the source asks for, should the stream lose
			// messages this consumer has not read (planStart).
			if err := o.View.PutScope(ctx, s); err != nil {
				return err
			}
		}
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
		if env.RelaydScope != "" {
			// A filtered source: a scope-left delete removes the object
			// from the view like a delete (the object still exists, out
			// of the filter); a scope-entered add adds it.
			o.Log.Debug("object "+env.RelaydScope+" the source's filter", "source", env.RelaydSource,
				"namespace", env.K8sNamespace, "name", env.K8sName, "type", env.Type, "seq", seq)
		}
	}
	if o.Applied != nil {
		o.Applied(a)
	}
	return nil
}

// reconcile handles a completed relist. After reason expired,
// no-checkpoint or requested the events between the markers brought the view up to date;
// after index-lost (or an initial snapshot over objects the view holds)
// relayd may not know objects the view holds, so their deletes cannot come:
// they are found by listing the cluster, with the resource and selectors
// the marker names (or, from a relayd whose markers do not name them, the
// resources of the entries held).
func reconcile(ctx context.Context, o Options, m jetstream.Msg, source string, d syncData) (int, error) {
	if d.Reason != "index-lost" && d.Reason != "initial" {
		return 0, nil
	}
	entries, err := o.View.Entries(ctx, source)
	if err != nil {
		return 0, err
	}
	var scopes []Scope
	if s, ok := d.scope(source); ok {
		scopes = append(scopes, s)
	}
	held := map[Scope][]*Entry{}
	for _, e := range entries {
		if e.Deleted || (d.Namespace != "" && e.Namespace != d.Namespace) {
			continue
		}
		if len(scopes) == 0 {
			group, version, ok := strings.Cut(e.APIVersion, "/")
			if !ok {
				group, version = "", e.APIVersion
			}
			scopes = append(scopes, Scope{Source: source, Group: group, Version: version, Resource: e.Resource, Namespace: d.Namespace})
		}
		for _, s := range scopes {
			if s.covers(e) {
				held[s] = append(held[s], e)
			}
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
	for s, es := range held {
		_ = m.InProgress() // a LIST may take a while: not redelivered meanwhile
		listed, err := o.Lister.List(ctx, s, d.To)
		if err != nil {
			return n, fmt.Errorf("reconcile %s %s: %w", source, s.Resource, err)
		}
		live := map[string]bool{}
		for _, l := range listed {
			live[l.UID] = true
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
