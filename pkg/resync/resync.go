// Package resync is relayd's resync on request (docs/OPERATIONS.md,
// "Resync on request"): the server side, which a running relayd serves for
// each source it runs, and the client side of `relayd resync`.
//
// The request goes over core NATS to <prefix>-ctl.<cluster>.resync.<source>
// (Subject): outside <prefix>.<cluster>.>, so the event stream never
// captures it, and a subject of its own, so NATS permissions grant it to
// operators and not to consumers (docs/DEPLOY.md, "NATS permissions"). A
// replica subscribes to the subject of a source only while it runs the
// source: with sharding, the request reaches the holder of the source's
// Lease, and NATS answers "no responders" when no replica runs it. The
// owner relists the source's watches (pkg/watch, Watch.Resync); each
// brackets its list with sync markers carrying the request id, and the
// client waits for their sync.completed.
//
// The requester chooses the reply subject, so the server answers only on
// one under the requesters' inbox prefixes and never on relayd's own or a
// "$" subject (ReplyPolicy); it neither answers nor acts on another. It
// runs one resync of a source at a time and spaces full ones by
// ServerOptions.MinFullInterval; every request is counted by result
// (Metrics).
package resync

import (
	"fmt"
	"regexp"
	"time"

	"github.com/relayd/relayd/pkg/event"
)

// Subject is the request subject of source: <prefix>-ctl.<cluster>.resync.<source>.
func Subject(prefix, cluster, source string) string {
	return prefix + "-ctl." + cluster + ".resync." + source
}

// Request is the request's JSON body.
type Request struct {
	ID        string `json:"id"`
	Namespace string `json:"namespace,omitempty"` // "": every namespace of the source
	Full      bool   `json:"full,omitempty"`
}

// Reply is the reply's JSON body.
type Reply struct {
	ID     string `json:"id"`
	Source string `json:"source"`
	// Namespaces are the watches relisted ("" for an all-namespaces or
	// cluster-scoped watch): one sync.completed each.
	Namespaces []string `json:"namespaces"`
	// Duplicate: a request with this id was accepted before; this is the
	// same resync, not another one.
	Duplicate bool `json:"duplicate,omitempty"`
	// Completed are the counts of the watches whose sync.completed of
	// this request was already published, by namespace.
	Completed map[string]event.SyncCounts `json:"completed,omitempty"`
	// Error says why the request was refused ("": accepted).
	Error string `json:"error,omitempty"`
	// NextFull is, for a full resync refused as too soon after the last,
	// when the next is allowed (resync.minFullInterval).
	NextFull time.Time `json:"nextFull,omitzero"`
}

var validID = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// CheckID checks a request id: 1 to 64 of A-Z a-z 0-9 . _ -.
func CheckID(id string) error {
	if !validID.MatchString(id) {
		return fmt.Errorf("request id %q: want 1 to 64 characters of A-Z a-z 0-9 . _ -", id)
	}
	return nil
}
