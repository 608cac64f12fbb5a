package event

import (
	"errors"
	"strconv"
	"strings"
	"time"
)

// HeartbeatToken is the last token of a heartbeat's subject.
const HeartbeatToken = "heartbeat"

// HeartbeatEvent describes a heartbeat control event: a running watch's
// position, published every heartbeatInterval (docs/CONSUMING.md,
// "Heartbeats").
type HeartbeatEvent struct {
	// Namespace is the watch scope; "" for all namespaces or a
	// cluster-scoped kind.
	Namespace string
	// ResourceVersion and Epoch are the watch's checkpointed position, as
	// written in the checkpoint ("" before the first write): everything up
	// to it is acknowledged by JetStream, and a restart resumes from it.
	ResourceVersion string
	Epoch           uint64
	// StreamSeq is the event-stream sequence of the watch's last event
	// acknowledged since it started on this replica (0: none yet).
	StreamSeq uint64
	// LastRead is when the watch last read a change from the apiserver
	// (zero: none since it started on this replica).
	LastRead time.Time
	// Interval is the watch's heartbeat interval: a consumer alerts after
	// two without a heartbeat.
	Interval time.Duration
	// Time of the event; time.Now() if zero. Its nanoseconds make the id
	// (and the Nats-Msg-Id) unique.
	Time time.Time
}

// heartbeatDataJSON is the data of a heartbeat (see Heartbeat).
type heartbeatDataJSON struct {
	Namespace       string  `json:"namespace"`
	Epoch           uint64  `json:"epoch"`
	ResourceVersion string  `json:"resourceVersion"`
	StreamSeq       uint64  `json:"streamSeq"`
	LastReadTime    string  `json:"lastReadTime,omitempty"`
	IntervalSeconds float64 `json:"intervalSeconds"`
}

// HeartbeatSubject returns the subject of this source's heartbeats:
// <prefix>.<cluster>._relayd.<source>.heartbeat.
func (e *Encoder) HeartbeatSubject() string {
	return e.subjPrefix + ControlToken + "." + e.opts.Source + "." + HeartbeatToken
}

// Heartbeat builds a heartbeat control event: subject HeartbeatSubject,
// type <prefix>.source.heartbeat, id heartbeat/<namespace|_>/<unix
// nanoseconds of Time> (Nats-Msg-Id <prefix>.<cluster>/<source>/<id>, as
// for every event: unique, so JetStream never drops one as a duplicate),
// CloudEvents subject /relayd/<source>, the extensions of a sync marker
// (relaydsource, relaydepoch, k8scluster, k8snamespace omitted when
// empty) and data {"namespace","epoch","resourceVersion","streamSeq",
// "lastReadTime" (omitted when nothing was read),"intervalSeconds"}.
// Structured or binary content mode as the Encoder's.
func (e *Encoder) Heartbeat(h HeartbeatEvent) Message {
	ts := h.Time
	if ts.IsZero() {
		ts = time.Now()
	}
	ns := h.Namespace
	if ns == "" {
		ns = EmptyToken
	}
	id := "heartbeat/" + ns + "/" + strconv.FormatInt(ts.UnixNano(), 10)
	d := heartbeatDataJSON{Namespace: h.Namespace, Epoch: h.Epoch, ResourceVersion: h.ResourceVersion,
		StreamSeq: h.StreamSeq, IntervalSeconds: h.Interval.Seconds()}
	if !h.LastRead.IsZero() {
		d.LastReadTime = h.LastRead.UTC().Format(TimeLayout)
	}
	return e.controlMessage(e.HeartbeatSubject(), e.opts.Prefix+".source."+HeartbeatToken, id, ts, h.Namespace, h.Epoch, marshalJSON(d))
}

// ControlParts is a control subject taken apart by ParseControlSubject.
type ControlParts struct {
	Prefix  string
	Cluster string
	Source  string
	// Event is what follows the source: "sync.started", "sync.completed"
	// or "heartbeat".
	Event string
}

// ErrControlSubject is the error ParseSubject's error wraps for a
// control subject (a sync marker's or a heartbeat's): take those apart
// with ParseControlSubject.
var ErrControlSubject = errors.New("a control subject, not an object subject")

// ParseControlSubject takes apart a control subject:
// <prefix>.<cluster>._relayd.<source>.sync.started|sync.completed|heartbeat
// (the prefix may span several tokens).
func ParseControlSubject(subject string) (ControlParts, error) {
	for _, ev := range [...]string{"sync.started", "sync.completed", HeartbeatToken} {
		rest, ok := strings.CutSuffix(subject, "."+ev)
		if !ok {
			continue
		}
		toks := strings.Split(rest, ".")
		n := len(toks)
		if n < 4 || toks[n-2] != ControlToken || !validToken(toks[n-1]) || !validToken(toks[n-3]) {
			break
		}
		for _, tok := range toks[:n-3] {
			if !validToken(tok) {
				return ControlParts{}, errors.New("subject " + strconv.Quote(subject) + ": invalid prefix token " + strconv.Quote(tok))
			}
		}
		return ControlParts{Prefix: strings.Join(toks[:n-3], "."), Cluster: toks[n-3], Source: toks[n-1], Event: ev}, nil
	}
	return ControlParts{}, errors.New("subject " + strconv.Quote(subject) + ": not a control subject")
}
