package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/relayd/relayd/pkg/event"
)

// kind is what a message is, as Check found it.
type kind int

const (
	objectEvent kind = iota
	syncStarted
	syncCompleted
	heartbeat
)

// errUnusable wraps every reason Check gives: such a message is terminated,
// since no redelivery can make it usable.
var errUnusable = errors.New("unusable message")

func unusable(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errUnusable}, args...)...)
}

// Check tells whether a decoded message is one relayd published for this
// consumer's cluster (docs/CONSUMING.md, "Subjects" and "The event on the
// wire"), and what it is: the type is one of the six relayd publishes
// under prefix; k8scluster is cluster; source is
// /relayd/<cluster>/<relaydsource>; the NATS subject, taken apart, names
// exactly the envelope's cluster, group, version, resource, namespace,
// name (or its hash token) and change type, or for a sync marker or a
// heartbeat is that source's control subject; an object event carries a uid and a
// resourceVersion, and its id is <uid>/<resourceVersion>[/deleted]; a
// Nats-Msg-Id header, when present, is <prefix>.<cluster>/<relaydsource>/<id>
// (or the older <relaydsource>/<id>). Anything else
// would put an object under the wrong key or source in the view.
func Check(prefix, cluster, subject, msgID string, env *event.Envelope) (kind, error) {
	if env.K8sCluster != cluster {
		return 0, unusable("k8scluster %q, want %q (the cluster this consumer follows)", env.K8sCluster, cluster)
	}
	if !validToken(env.RelaydSource) {
		return 0, unusable("relaydsource %q is not a source name", env.RelaydSource)
	}
	if want := "/relayd/" + cluster + "/" + env.RelaydSource; env.Source != want {
		return 0, unusable("source %q, want %q (k8scluster and relaydsource)", env.Source, want)
	}
	// relayd's Nats-Msg-Id is <prefix>.<cluster>/<source>/<id>; relayd
	// versions before it named the cluster wrote <source>/<id>, and a
	// replay after an upgrade still may (docs/CONSUMING.md).
	if own := prefix + "." + cluster + "/" + env.RelaydSource + "/" + env.ID; msgID != "" && msgID != own && msgID != env.RelaydSource+"/"+env.ID {
		return 0, unusable("Nats-Msg-Id %q is not %q", msgID, own)
	}
	rest, ok := strings.CutPrefix(env.Type, prefix+".")
	if !ok {
		return 0, unusable("type %q does not start with %q", env.Type, prefix+".")
	}
	switch rest {
	case "source.sync.started", "source.sync.completed":
		phase := rest[len("source.sync."):]
		if want := prefix + "." + cluster + "." + event.ControlToken + "." + env.RelaydSource + ".sync." + phase; subject != want {
			return 0, unusable("subject %q, want %q for a %s marker of source %q", subject, want, phase, env.RelaydSource)
		}
		if phase == "started" {
			return syncStarted, nil
		}
		return syncCompleted, nil
	case "source.heartbeat":
		if want := prefix + "." + cluster + "." + event.ControlToken + "." + env.RelaydSource + "." + event.HeartbeatToken; subject != want {
			return 0, unusable("subject %q, want %q for a heartbeat of source %q", subject, want, env.RelaydSource)
		}
		return heartbeat, nil
	case "object.added", "object.modified", "object.deleted":
		return objectEvent, checkObject(prefix, subject, event.Type(rest[len("object."):]), env)
	}
	return 0, unusable("type %q is none of %s.object.added|modified|deleted, %s.source.sync.started|completed, %s.source.heartbeat", env.Type, prefix, prefix, prefix)
}

// checkObject checks an object event's subject and identity against its
// envelope.
func checkObject(prefix, subject string, typ event.Type, env *event.Envelope) error {
	if env.K8sUID == "" || env.K8sResourceVersion == "" {
		return unusable("object event without k8suid (%q) or k8sresourceversion (%q)", env.K8sUID, env.K8sResourceVersion)
	}
	wantID := env.K8sUID + "/" + env.K8sResourceVersion
	if typ == event.Deleted {
		wantID += "/deleted"
	}
	if env.ID != wantID && !fullResyncID(env, wantID) {
		return unusable("id %q, want %q (k8suid/k8sresourceversion)", env.ID, wantID)
	}
	p, err := event.ParseSubject(subject)
	if err != nil {
		return unusable("%v", err)
	}
	group, version := "", env.K8sAPIVersion
	if g, v, ok := strings.Cut(env.K8sAPIVersion, "/"); ok {
		group, version = g, v
	}
	name := p.Name
	if p.NameHash != "" && p.NameHash == event.HashToken(env.K8sName) {
		name = env.K8sName
	}
	for _, c := range [...]struct{ what, subj, env string }{
		{"prefix", p.Prefix, prefix},
		{"cluster", p.Cluster, env.K8sCluster},
		{"group", p.Group, group},
		{"version", p.Version, version},
		{"resource", p.Resource, env.K8sResource},
		{"namespace", p.Namespace, env.K8sNamespace},
		{"name", name, env.K8sName},
		{"change type", string(p.Type), string(typ)},
	} {
		if c.subj != c.env {
			return unusable("subject %q: %s %q, the event says %q", subject, c.what, c.subj, c.env)
		}
	}
	return nil
}

// validToken: a non-empty run of A-Z a-z 0-9 _ - (relayd's source and
// cluster names).
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// validPrefix: tokens of validToken joined by dots (relayd's prefix).
func validPrefix(s string) bool {
	for _, tok := range strings.Split(s, ".") {
		if !validToken(tok) {
			return false
		}
	}
	return true
}

// printable returns s as is when it is safe to print to a terminal and to
// split on spaces (printable runes, no space, quote or backslash), else
// quoted with Go escapes: names and values from a message never reach the
// terminal as control characters, escape sequences or bidi overrides.
func printable(s string) string {
	for _, r := range s {
		if r == utf8.RuneError || r == ' ' || r == '"' || r == '\\' || !unicode.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	if s == "" {
		return `""`
	}
	return s
}

// fullResyncID reports whether env's id is that of an object published
// again by a full resync on request: <uid>/<resourceVersion>/full/<epoch>,
// origin resync, the epoch its relaydepoch (docs/CONSUMING.md, "Resync on
// request").
func fullResyncID(env *event.Envelope, base string) bool {
	return env.RelaydOrigin == string(event.OriginResync) && env.ID == base+"/full/"+strconv.FormatUint(env.RelaydEpoch, 10)
}
