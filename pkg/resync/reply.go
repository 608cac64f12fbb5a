package resync

import (
	"fmt"
	"strings"
)

// DefaultInboxPrefix is the inbox prefix of a NATS client that sets none.
const DefaultInboxPrefix = "_INBOX"

// ReplyPolicy decides the reply subjects relayd answers a request on: only
// a subject under one of Inboxes, and never one under Never or starting
// with "$" (the JetStream API, KV and object store subjects, the system
// account's). A request whose reply subject it refuses gets no answer and
// is not acted on: the requester chooses the reply subject, and relayd's
// answer must not become a message on any other subject (an event in a
// stream, a KV entry, a JetStream API request).
type ReplyPolicy struct {
	// Inboxes are the inbox prefixes of the clients that may ask (the
	// config's resync.requesterInboxPrefixes): a reply subject
	// "<prefix>.<one token or more>" is answered.
	Inboxes []string
	// Never are subject prefixes never answered on, even under an inbox
	// prefix: relayd's event prefix and its control prefix.
	Never []string
	// Captured, when set, returns the subjects (with wildcards) of the
	// streams relayd knows: its event stream's, as last found. A reply
	// subject one of them captures is never answered on.
	Captured func() []string
}

// Check returns why relayd does not answer on reply ("": it does).
func (p ReplyPolicy) Check(reply string) string {
	switch {
	case reply == "":
		return "the request has no reply subject"
	case strings.HasPrefix(reply, "$"):
		return fmt.Sprintf("reply subject %q is a system subject ($JS, $KV, $O, $SYS …)", reply)
	case !literal(reply):
		return fmt.Sprintf("reply subject %q is not a literal subject", reply)
	}
	for _, n := range p.Never {
		if under(reply, n) {
			return fmt.Sprintf("reply subject %q is under relayd's own %s", reply, n)
		}
	}
	if p.Captured != nil {
		for _, c := range p.Captured() {
			if matches(c, reply) {
				return fmt.Sprintf("reply subject %q is captured by a stream (its subject %q)", reply, c)
			}
		}
	}
	for _, in := range p.Inboxes {
		if under(reply, in) && len(reply) > len(in)+1 {
			return ""
		}
	}
	return fmt.Sprintf("reply subject %q is under none of the inbox prefixes relayd answers on (%s; resync.requesterInboxPrefixes)", reply, strings.Join(p.Inboxes, ", "))
}

// under reports whether subject is prefix or starts with prefix + ".".
func under(subject, prefix string) bool {
	return subject == prefix || strings.HasPrefix(subject, prefix+".")
}

// literal reports whether s is dot-separated non-empty tokens without
// wildcards or white space.
func literal(s string) bool {
	for t := range strings.SplitSeq(s, ".") {
		if t == "" || t == "*" || t == ">" || strings.ContainsFunc(t, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
			return false
		}
	}
	return true
}

// matches reports whether subject matches the NATS subject pattern (with
// "*" for one token and ">" for one or more at the end).
func matches(pattern, subject string) bool {
	p, s := strings.Split(pattern, "."), strings.Split(subject, ".")
	for i, t := range p {
		switch {
		case t == ">":
			return len(s) > i
		case i >= len(s):
			return false
		case t != "*" && t != s[i]:
			return false
		}
	}
	return len(p) == len(s)
}
