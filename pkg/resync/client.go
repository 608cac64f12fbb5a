package resync

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/relayd/relayd/pkg/event"
)

// ClientOptions are a resync request's.
type ClientOptions struct {
	// Conn is connected with an ErrorHandler that sends its errors to
	// Errors, so that a permissions violation ends the request at once.
	Conn   *nats.Conn
	Errors <-chan error
	// Prefix, Cluster: the config's; Source: the source to resync.
	Prefix, Cluster, Source string
	Request                 Request
	// Timeout bounds the wait for the answer, Wait the wait for the
	// sync.completed markers after it.
	Timeout, Wait time.Duration
	// Inbox is the connection's inbox prefix (nats.inboxPrefix), named
	// when no answer comes: relayd answers only on the inbox prefixes of
	// its resync.requesterInboxPrefixes.
	Inbox string
}

// Result is a completed resync.
type Result struct {
	Reply
	// Counts are the sync.completed counts by namespace.
	Counts map[string]event.SyncCounts
}

// Total is the sum of the counts.
func (r *Result) Total() event.SyncCounts {
	var t event.SyncCounts
	for _, c := range r.Counts {
		t.Added += c.Added
		t.Modified += c.Modified
		t.Deleted += c.Deleted
		t.Unchanged += c.Unchanged
		t.Total += c.Total
	}
	return t
}

// Errors of Run, for errors.Is.
var (
	ErrNoResponders = errors.New("no relayd serves the source")
	ErrNoAnswer     = errors.New("relayd did not answer")
	ErrRefused      = errors.New("resync refused")
	ErrPermission   = errors.New("NATS refused a permission")
	ErrNotCompleted = errors.New("resync not completed in time")
)

// Run subscribes to the source's sync.completed markers, sends the
// request, and waits for the sync.completed of each watch it relists.
func Run(ctx context.Context, o ClientOptions) (*Result, error) {
	enc, err := event.NewEncoder(event.EncoderOptions{Prefix: o.Prefix, Cluster: o.Cluster, Source: o.Source})
	if err != nil {
		return nil, err
	}
	done := enc.ControlSubject(true)
	markers := make(chan *nats.Msg, 64)
	sub, err := o.Conn.ChanSubscribe(done, markers)
	if err != nil {
		return nil, fmt.Errorf("subscribing to %s: %w", done, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	subj := Subject(o.Prefix, o.Cluster, o.Source)
	hint := fmt.Sprintf("the NATS user needs publish on %s, and subscribe on %s and on its inbox prefix: docs/DEPLOY.md, \"Resync on request (operators)\"", subj, done)
	rep, err := request(ctx, o, subj, hint)
	if err != nil {
		return nil, err
	}
	res := &Result{Reply: *rep, Counts: map[string]event.SyncCounts{}}
	for ns, c := range rep.Completed {
		res.Counts[ns] = c
	}
	wait := time.NewTimer(o.Wait)
	defer wait.Stop()
	for len(res.Counts) < len(rep.Namespaces) {
		select {
		case m := <-markers:
			if ns, c, ok := completedOf(m, rep.ID); ok {
				res.Counts[ns] = c
			}
		case err := <-o.Errors:
			return nil, permission(err, hint)
		case <-wait.C:
			return nil, fmt.Errorf("%w: resync %q of source %q was accepted, but %d of its %d sync.completed markers did not arrive on %s within %s (see relayd's log; retry with --id %s to wait for the same resync)",
				ErrNotCompleted, rep.ID, o.Source, len(rep.Namespaces)-len(res.Counts), len(rep.Namespaces), done, o.Wait, rep.ID)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return res, nil
}

// request sends the request and reads the reply.
func request(ctx context.Context, o ClientOptions, subj, hint string) (*Reply, error) {
	body, _ := json.Marshal(o.Request)
	rctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	type answer struct {
		m   *nats.Msg
		err error
	}
	ch := make(chan answer, 1)
	go func() {
		m, err := o.Conn.RequestWithContext(rctx, subj, body)
		ch <- answer{m, err}
	}()
	var a answer
	select {
	case a = <-ch:
	case err := <-o.Errors:
		return nil, permission(err, hint)
	}
	switch {
	case errors.Is(a.err, nats.ErrNoResponders):
		return nil, fmt.Errorf("%w %q: nothing subscribes to %s (relayd is not running or not connected to this NATS, or, with sharding, no replica holds the source's Lease)", ErrNoResponders, o.Source, subj)
	case errors.Is(a.err, context.DeadlineExceeded) || errors.Is(a.err, nats.ErrTimeout):
		select { // a permissions violation may be what made it time out
		case err := <-o.Errors:
			return nil, permission(err, hint)
		default:
		}
		inbox := o.Inbox
		if inbox == "" {
			inbox = DefaultInboxPrefix
		}
		return nil, fmt.Errorf("%w within %s on %s (raise --timeout, or see relayd's log; relayd answers only on the inbox prefixes of its resync.requesterInboxPrefixes, which must list this client's %s)", ErrNoAnswer, o.Timeout, subj, inbox)
	case a.err != nil:
		return nil, fmt.Errorf("resync request on %s: %w", subj, a.err)
	}
	var rep Reply
	if err := json.Unmarshal(a.m.Data, &rep); err != nil {
		return nil, fmt.Errorf("resync reply on %s is not valid: %w", subj, err)
	}
	if rep.Error != "" {
		return nil, fmt.Errorf("%w: %s", ErrRefused, rep.Error)
	}
	return &rep, nil
}

// permission is the error of a NATS permissions violation, with a hint
// of what the user needs.
func permission(err error, hint string) error {
	if errors.Is(err, nats.ErrPermissionViolation) || strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
		return fmt.Errorf("%w: %v (%s)", ErrPermission, err, hint)
	}
	return fmt.Errorf("NATS: %w", err)
}

// completedOf reads a sync.completed marker: its namespace and counts
// when it is of request id.
func completedOf(m *nats.Msg, id string) (string, event.SyncCounts, bool) {
	env, err := event.DecodeMessage(m.Header, m.Data)
	if err != nil {
		return "", event.SyncCounts{}, false
	}
	var d struct {
		Namespace string           `json:"namespace"`
		RequestID string           `json:"requestId"`
		Counts    event.SyncCounts `json:"counts"`
	}
	if json.Unmarshal(env.Data, &d) != nil || d.RequestID != id {
		return "", event.SyncCounts{}, false
	}
	return d.Namespace, d.Counts, true
}
