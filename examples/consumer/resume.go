package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/pkg/resync"
)

// Scope is what one watch of a relayd source covers, as its sync markers
// name it (docs/CONSUMING.md, "The sync markers"): what a LIST of the
// source asks for.
type Scope struct {
	Source   string `json:"source"`
	Group    string `json:"group"`
	Version  string `json:"version"`
	Resource string `json:"resource"`
	Kind     string `json:"kind,omitempty"`
	// Namespace is the watch's namespace; "" for all namespaces or a
	// cluster-scoped resource.
	Namespace     string `json:"namespace,omitempty"`
	LabelSelector string `json:"labelSelector,omitempty"`
	FieldSelector string `json:"fieldSelector,omitempty"`
}

// APIVersion is the scope's apiVersion: "v1", "apps/v1".
func (s Scope) APIVersion() string {
	if s.Group == "" {
		return s.Version
	}
	return s.Group + "/" + s.Version
}

// covers reports whether the view entry e belongs to the scope.
func (s Scope) covers(e *Entry) bool {
	return e.Source == s.Source && e.APIVersion == s.APIVersion() && e.Resource == s.Resource &&
		(s.Namespace == "" || e.Namespace == s.Namespace)
}

// ParseScope reads the --follow flag's form,
// SOURCE=[GROUP/]VERSION/RESOURCE[@NAMESPACE], e.g. "cms=v1/configmaps@shop"
// or "deploys=apps/v1/deployments".
func ParseScope(v string) (Scope, error) {
	src, rest, ok := strings.Cut(v, "=")
	var s Scope
	if rest, s.Namespace, _ = strings.Cut(rest, "@"); ok && validToken(src) {
		s.Source = src
		parts := strings.Split(rest, "/")
		switch len(parts) {
		case 2:
			s.Version, s.Resource = parts[0], parts[1]
		case 3:
			s.Group, s.Version, s.Resource = parts[0], parts[1], parts[2]
		}
	}
	if s.Version == "" || s.Resource == "" {
		return s, fmt.Errorf("%q: want SOURCE=[GROUP/]VERSION/RESOURCE[@NAMESPACE], e.g. cms=v1/configmaps@shop", v)
	}
	return s, nil
}

// Listed is one object of a LIST.
type Listed struct {
	UID, Namespace, Name, Kind, ResourceVersion string
}

// The view's own keys start with "_", which no relayd source name (a
// DNS-1123 label) does: they never mix with the entries' <source>.<uid>.
const (
	positionKey = "_position."
	scopeKey    = "_scope."
)

// SetPosition records the last stream sequence the durable consumer
// acknowledged.
func (v *View) SetPosition(ctx context.Context, durable string, seq uint64) error {
	_, err := v.kv.Put(ctx, positionKey+durable, fmt.Appendf(nil, `{"streamSeq":%d}`, seq))
	return err
}

// Position returns what SetPosition recorded; false when nothing was.
func (v *View) Position(ctx context.Context, durable string) (uint64, bool, error) {
	kve, err := v.kv.Get(ctx, positionKey+durable)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	var p struct {
		StreamSeq uint64 `json:"streamSeq"`
	}
	if err := json.Unmarshal(kve.Value(), &p); err != nil {
		return 0, false, fmt.Errorf("view key %s: %w", kve.Key(), err)
	}
	return p.StreamSeq, true, nil
}

// PutScope records a scope a sync marker named.
func (v *View) PutScope(ctx context.Context, s Scope) error {
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	ns := s.Namespace
	if ns == "" {
		ns = "_"
	}
	_, err = v.kv.Put(ctx, scopeKey+s.Source+"."+ns, b)
	return err
}

// Scopes returns the scopes PutScope recorded.
func (v *View) Scopes(ctx context.Context) ([]Scope, error) {
	lister, err := v.kv.ListKeysFiltered(ctx, scopeKey+">")
	if err != nil {
		return nil, err
	}
	var out []Scope
	for k := range lister.Keys() {
		kve, err := v.kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		var s Scope
		if err := json.Unmarshal(kve.Value(), &s); err != nil {
			return nil, fmt.Errorf("view key %s: %w", k, err)
		}
		out = append(out, s)
	}
	return out, nil
}

// startPlan is how Run starts: where a new durable consumer begins, and
// whether the view must be brought up to date by a LIST first.
type startPlan struct {
	deliver  jetstream.DeliverPolicy
	startSeq uint64
	// relist is why the view is listed ("bootstrap", "lost-messages"), ""
	// when the stream holds every message the consumer has not read.
	relist string
	first  uint64 // the stream's first sequence
	pos    uint64 // the last sequence this consumer acknowledged
}

// planStart compares the stream's first sequence with the last one this
// consumer acknowledged (docs/CONSUMING.md, "Bootstrapping a new
// consumer"). A new consumer reads the stream from its start if nothing
// was ever removed from it (first sequence 0 or 1); otherwise it starts
// after the stream's last message and the view is loaded by a LIST first.
// A consumer that was down while messages it had not read left the stream
// (maxAge, maxBytes, maxMsgs) resumes, and the view is listed first. The
// last acknowledged sequence is the one the view recorded (SetPosition):
// the server's ack floor is not, as it moves past messages that left the
// stream.
func planStart(ctx context.Context, o Options) (startPlan, error) {
	s, err := o.JS.Stream(ctx, o.Stream)
	if err != nil {
		return startPlan{}, fmt.Errorf("stream %s: %w", o.Stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return startPlan{}, fmt.Errorf("stream %s: %w", o.Stream, err)
	}
	p := startPlan{deliver: jetstream.DeliverAllPolicy, first: info.State.FirstSeq}
	c, err := s.Consumer(ctx, o.Durable)
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		if p.first > 1 && (o.Lister != nil || len(o.BootstrapResync) > 0) {
			p.deliver, p.startSeq, p.relist = jetstream.DeliverByStartSequencePolicy, info.State.LastSeq+1, "bootstrap"
		} else if p.first > 1 {
			p.relist = "bootstrap"
		}
		return p, nil
	case err != nil:
		return p, fmt.Errorf("consumer %s on stream %s: %w", o.Durable, o.Stream, err)
	}
	// An existing consumer keeps where it began (JetStream refuses to
	// change it).
	ci := c.CachedInfo()
	p.deliver, p.startSeq = ci.Config.DeliverPolicy, ci.Config.OptStartSeq
	pos, ok, err := o.View.Position(ctx, o.Durable)
	if err != nil {
		return p, err
	}
	if !ok {
		pos = ci.AckFloor.Stream
	}
	p.pos = pos
	if p.first > pos+1 {
		p.relist = "lost-messages"
	}
	return p, nil
}

// relistAll loads the view from a LIST of every scope it knows (the ones
// the sync markers named, and Options.Follow): a listed object newer than
// the view's entry is stored (as a reference: a LIST object is not shaped
// by the source's payload mode and drop paths), and an entry of the scope
// the LIST lacks becomes a tombstone. It returns how many entries it
// changed.
func relistAll(ctx context.Context, o Options, why string) (int, error) {
	scopes, err := o.View.Scopes(ctx)
	if err != nil {
		return 0, err
	}
	seen := map[string]bool{}
	n := 0
	for _, s := range append(scopes, o.Follow...) {
		if k := s.Source + "/" + s.Namespace; !seen[k] {
			seen[k] = true
			c, err := relistScope(ctx, o, s)
			n += c
			if err != nil {
				return n, fmt.Errorf("list %s %s %q: %w", s.Source, s.Resource, s.Namespace, err)
			}
			if o.Applied != nil {
				o.Applied(Applied{Relist: why, Scope: s, Reconciled: c})
			}
		}
	}
	if len(seen) == 0 {
		o.Log.Error("the view must be loaded by a LIST but no source's scope is known: give --follow", "reason", why)
	}
	return n, nil
}

func relistScope(ctx context.Context, o Options, s Scope) (int, error) {
	listed, err := o.Lister.List(ctx, s, "")
	if err != nil {
		return 0, err
	}
	live := map[string]bool{}
	n := 0
	for _, l := range listed {
		live[l.UID] = true
		held, err := o.View.Get(ctx, s.Source, l.UID)
		if err != nil {
			return n, err
		}
		if act, err := Decide(held, "modified", l.ResourceVersion); err != nil || act != Store {
			if err != nil {
				return n, err
			}
			continue
		}
		kind := l.Kind
		if kind == "" {
			kind = s.Kind
		}
		ref, _ := json.Marshal(map[string]string{"apiVersion": s.APIVersion(), "kind": kind, "namespace": l.Namespace,
			"name": l.Name, "uid": l.UID, "resourceVersion": l.ResourceVersion})
		e := &Entry{Source: s.Source, APIVersion: s.APIVersion(), Kind: kind, Resource: s.Resource, Namespace: l.Namespace,
			Name: l.Name, UID: l.UID, ResourceVersion: l.ResourceVersion, Payload: "reference", Object: ref}
		if err := o.View.Put(ctx, e); err != nil {
			return n, err
		}
		n++
	}
	entries, err := o.View.Entries(ctx, s.Source)
	if err != nil {
		return n, err
	}
	for _, e := range entries {
		if e.Deleted || live[e.UID] || !s.covers(e) {
			continue
		}
		e.Deleted, e.DeletedAt, e.Object = true, time.Now().UTC(), nil
		if err := o.View.Put(ctx, e); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// bootstrapResync asks relayd for a full resync of each source of
// Options.BootstrapResync (pkg/resync, as `relayd resync --full` does) and
// waits for it to complete: every object of the source is then on the
// stream after the new consumer's start, between the markers of the
// request, and the consumer applies them as it reads. It returns the
// sequence before the consumer's start, as a LIST would.
func bootstrapResync(ctx context.Context, o Options, p startPlan) (uint64, error) {
	o.Log.Warn("the stream lost its beginning: loading the view by a full resync of its sources", "sources", o.BootstrapResync, "streamFirstSeq", p.first)
	for _, src := range o.BootstrapResync {
		var b [6]byte
		_, _ = rand.Read(b[:])
		res, err := resync.Run(ctx, resync.ClientOptions{
			Conn: o.JS.Conn(), Prefix: o.Prefix, Cluster: o.Cluster, Source: src,
			Request: resync.Request{ID: "bootstrap-" + hex.EncodeToString(b[:]), Full: true},
			Timeout: 10 * time.Second, Wait: 30 * time.Minute,
		})
		if err != nil {
			return 0, fmt.Errorf("full resync of source %s: %w", src, err)
		}
		t := res.Total()
		o.Log.Info("full resync requested", "source", src, "requestId", res.ID, "objects", t.Total)
		if o.Applied != nil {
			o.Applied(Applied{Relist: "bootstrap-resync", Scope: Scope{Source: src}, Reconciled: int(t.Total)})
		}
	}
	return p.startSeq - 1, nil
}
