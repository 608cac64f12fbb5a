// Package history is relayd's reliability checker: it records what happened
// in a fault-injection run (the writes a writer made, the changes an
// independent reference watch saw, every message on the JetStream stream,
// a final consistent LIST, sampled checkpoints) and checks the stream
// against docs/GUARANTEES.md, "Delivery guarantees":
//
//   - every reference change (uid, resourceVersion) is on the stream at
//     least once, unless a valid, completed list (below) covers it
//     (fromResourceVersion < rv ≤ toResourceVersion); a covered change's
//     object must then have its state at the list's toResourceVersion on
//     the stream between that list's markers, or a delete if it was gone
//     by then (a delete during a gap is reported, never silent);
//   - gaps are bracketed (check "bracket"), per source and epoch, first
//     occurrences in stream order: sync.started < every list event (origin
//     resync or initial) of the epoch < sync.completed; both markers carry
//     the same fromResourceVersion and reason; that position is at or
//     after the last checkpoint of the source read (the read returned)
//     before sync.started was stored, and only initial and no-checkpoint
//     lists have none. relayd's epoch moves on with every list, also after
//     a crash (the bucket's _epoch key, docs/GUARANTEES.md), so a crash
//     or a failed list between the markers leaves a sync.started without
//     sync.completed, and the list is redone in a new epoch from the same
//     position: every sync.started must be completed, or followed by the
//     source's next list from the same position for the same reason (the
//     same relist redone; an event the aborted list published counts for
//     it). A list that breaks a rule covers nothing;
//   - per object, first occurrences on the stream are in resourceVersion
//     order;
//   - no message reports a change that never happened (phantom);
//   - the last message of every object equals a final consistent LIST;
//   - a sampled checkpoint is never ahead of what the stream held when it
//     was sampled, and that was checked (check "samples"): every source
//     has a sample, at most half the sampler's tries failed, and every
//     fault is followed by a sample;
//   - no message id is stored twice inside the stream's duplicate window
//     (JetStream must drop a replay; duplicates outside it are counted);
//   - every relist (sync.started) is explained by a fault injected before
//     it (see relistCauses), and a kill -9 with a current checkpoint and
//     index explains none; a fault explains at most one relist per source,
//     plus one per crash of relayd after the last relist it explained
//     (checkRelists): a relist loop fails;
//   - every exit of relayd is one the run asked for: a kill it sent, or a
//     failpoint kill armed by the scenario; any other exit (a panic, an
//     error exit such as a failed index consistency check) fails the run;
//   - every change of an object whose events fit the NATS max payload
//     only without data leaves its trace on the stream: its event
//     flagged relaydunencodable, never a silent skip (trace.go).
//   - for a source with a filter, the reference is first mapped through
//     it (scope.go): a change that makes an object leave scope expects a
//     delete (relaydscope left) and counts like a delete for every rule
//     above, one that makes it enter an added (relaydscope entered), a
//     change out of scope before and after nothing; no event names a
//     version out of scope or an object that was not in scope;
//   - the run has what it exists for (evidence.go): sources, changes,
//     messages and samples; each fault's relist (an etcd compaction's
//     expired, a deleted bucket's index-lost, a deleted checkpoint's
//     no-checkpoint); the filtered source's objects entering and leaving
//     scope; the shaped sources' messages probed. An empty history fails.
//
// resourceVersions are compared as numbers here: the checker knows the
// store is etcd (relayd itself treats them as opaque).
//
// A History is plain data and serialises to JSON, so a failed run can be
// re-checked with Load and Check.
package history

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"time"
)

// Change types as they appear in relayd's event types.
const (
	Added    = "added"
	Modified = "modified"
	Deleted  = "deleted"
)

// Change is one object change seen by the reference watch.
type Change struct {
	Source    string `json:"source"` // the relayd source the object belongs to
	UID       string `json:"uid"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	RV        int64  `json:"rv"`
	Type      string `json:"type"` // added, modified, deleted
	// Digest identifies the version without its source's ignoreChanges
	// paths (set for such sources only; see Shaping).
	Digest string `json:"digest,omitempty"`
	// Labels are the version's labels (sources with a filter only, not
	// deletes): the checker evaluates the filter on them (scope.go).
	Labels map[string]string `json:"labels,omitempty"`
}

// Write is one write the writer attempted.
type Write struct {
	Source    string    `json:"source"`
	Op        string    `json:"op"` // create, update, delete
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	UID       string    `json:"uid,omitempty"`
	RV        int64     `json:"rv,omitempty"`  // the acknowledged resourceVersion (create, update)
	Err       string    `json:"err,omitempty"` // the write failed or its outcome is unknown
	At        time.Time `json:"at"`
}

// Acked reports whether the apiserver acknowledged the write.
func (w Write) Acked() bool { return w.Err == "" }

// Event is one message on the stream: an object event or a sync marker.
type Event struct {
	Seq    uint64 `json:"seq"`
	Source string `json:"source"`
	ID     string `json:"id"`
	// MsgID is the message's Nats-Msg-Id header as stored (relayd sets it
	// to "<source>/<id>"); empty in histories recorded before it was kept.
	MsgID string `json:"msgID,omitempty"`
	// Stored is when JetStream stored the message (zero: not recorded).
	Stored time.Time `json:"stored,omitzero"`
	// Kind is "object", "sync.started" or "sync.completed".
	Kind      string `json:"kind"`
	Type      string `json:"type,omitempty"` // object events: added, modified, deleted
	UID       string `json:"uid,omitempty"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name,omitempty"`
	RV        int64  `json:"rv,omitempty"`
	Origin    string `json:"origin,omitempty"`
	Epoch     uint64 `json:"epoch"`
	Unknown   bool   `json:"finalStateUnknown,omitempty"`
	// Unencodable: sent without data, flagged relaydunencodable (even
	// the reference exceeded the NATS max payload).
	Unencodable bool `json:"unencodable,omitempty"`
	// Scope is the relaydscope extension: entered, left or "" (scope.go).
	Scope string `json:"scope,omitempty"`
	// Sync markers.
	Reason string `json:"reason,omitempty"`
	From   int64  `json:"from,omitempty"` // 0: no position (initial, no-checkpoint)
	To     int64  `json:"to,omitempty"`
	// Full: a requested list that publishes every object (relayd resync
	// --full).
	Full bool `json:"full,omitempty"`
	// Content is what the reader found in the data (shaped sources only).
	Content *Content `json:"content,omitempty"`
}

// Object is one object of the final consistent LIST.
type Object struct {
	Source    string `json:"source"`
	UID       string `json:"uid"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	RV        int64  `json:"rv"`
}

// Sample is one checkpoint read: the stored resourceVersion of a source's
// watch and the stream's last sequence read right after it.
type Sample struct {
	At time.Time `json:"at"` // when the ConfigMap read was sent
	// Read is when the ConfigMap read returned: the checkpoint was read at
	// or before it (zero in histories recorded before it was kept).
	Read          time.Time `json:"read,omitzero"`
	Source        string    `json:"source"`
	CheckpointRV  int64     `json:"checkpointRV"`
	StreamLastSeq uint64    `json:"streamLastSeq"`
}

// CheckpointWrite is one write of relayd's checkpoint ConfigMap, as the
// reference watch of etcd saw it (every write, in revision order): the
// resourceVersion a source's key held after it.
type CheckpointWrite struct {
	Rev  int64     `json:"rev"`  // the write's etcd revision
	Seen time.Time `json:"seen"` // when the reference saw it: written at or before
	// Source's key held CheckpointRV (0: missing, or no resourceVersion).
	Source       string `json:"source"`
	CheckpointRV int64  `json:"checkpointRV"`
}

// Fault is one injected fault. At is when it took effect (for a server
// kill: the kill, not the end of the restart).
type Fault struct {
	At     time.Time `json:"at"`
	Kind   string    `json:"kind"`
	Detail string    `json:"detail,omitempty"`
	// Rev is an etcd revision the fault makes history end at: for
	// etcd-compact the compaction revision, for apiserver-restart,
	// apiserver-kill9 and etcd-restart the revision once the apiserver
	// served again (its new watch cache starts at or before it). 0: none.
	Rev int64 `json:"rev,omitempty"`
	// Source is the source a config-changed or resync-requested fault is
	// about.
	Source string `json:"source,omitempty"`
}

// Fault kinds that explain relists (see relistCauses).
const (
	FaultEtcdCompact       = "etcd-compact"
	FaultAPIServerRestart  = "apiserver-restart"
	FaultAPIServerKill9    = "apiserver-kill9"
	FaultEtcdRestart       = "etcd-restart"
	FaultBucketDeleted     = "bucket-deleted"
	FaultCheckpointDeleted = "checkpoint-deleted"
	// FaultConfigChanged: relayd restarted with another spelling of
	// Source's filter (its hash changed).
	FaultConfigChanged = "config-changed"
	// FaultResyncRequested: `relayd resync` of Source was run (Detail says
	// whether with --full).
	FaultResyncRequested = "resync-requested"
)

// Exit is one exit of a relayd process during the run (the final SIGTERM
// stop is checked by the run itself, not recorded here).
type Exit struct {
	At time.Time `json:"at"`
	// Status is how the process ended: "signal: killed", "exit status 2".
	Status string `json:"status"`
	// Killed: the process ended by SIGKILL.
	Killed bool `json:"killed"`
	// Planned: the run sent that SIGKILL (a kill -9 fault, a restart with
	// other failpoints).
	Planned bool `json:"planned"`
	// Failpoints is RELAYD_FAILPOINTS of that process ("" none armed).
	Failpoints string `json:"failpoints,omitempty"`
	// FailpointKill is the "failpoint <name>: kill (hit n)" line the
	// process printed, if it did.
	FailpointKill string `json:"failpointKill,omitempty"`
	// LogTail is the end of the process's log.
	LogTail string `json:"logTail,omitempty"`
}

// Explained reports whether the run asked for this exit: a SIGKILL it
// sent, or a SIGKILL by an armed failpoint that said so.
func (x Exit) Explained() bool {
	return x.Killed && (x.Planned || (x.Failpoints != "" && x.FailpointKill != ""))
}

// History is everything one run recorded.
type History struct {
	Scenario  string   `json:"scenario"`
	Seed      uint64   `json:"seed"`
	Sources   []string `json:"sources"`
	Faults    []Fault  `json:"faults,omitempty"`
	Writes    []Write  `json:"writes"`
	Reference []Change `json:"reference"`
	Stream    []Event  `json:"stream"`
	Final     []Object `json:"final"`
	FinalRV   int64    `json:"finalRV"` // resourceVersion of the final LIST
	// DuplicateWindow is the stream's duplicate window (0: not recorded;
	// then every repeated message id counts as inside it).
	DuplicateWindow time.Duration `json:"duplicateWindow,omitempty"`
	// Exits are relayd's exits during the run (nil in histories recorded
	// before they were kept).
	Exits   []Exit   `json:"exits,omitempty"`
	Samples []Sample `json:"samples,omitempty"`
	// Checkpoints are the checkpoint ConfigMap's writes (nil in histories
	// recorded before they were kept).
	Checkpoints []CheckpointWrite `json:"checkpoints,omitempty"`
	// SampleAttempts counts the sampler's tries, SampleErrors those that
	// yielded no sample of some source (a server unavailable, the key
	// missing, unparsable or at resourceVersion 0), SampleUnavailable
	// those of them whose reads failed (the apiserver or NATS down or
	// unreachable). SampleAttempts 0 with samples: recorded before they
	// were kept (the failure rate is then not checked).
	SampleAttempts    int       `json:"sampleAttempts,omitempty"`
	SampleErrors      int       `json:"sampleErrors,omitempty"`
	SampleUnavailable int       `json:"sampleUnavailable,omitempty"`
	Started           time.Time `json:"started"`
	Ended             time.Time `json:"ended"`

	// Unencodable names ("<source>/<name>") the objects whose events the
	// run's NATS max payload fits only without data: every change of
	// them must be on the stream flagged relaydunencodable (trace.go).
	Unencodable []string `json:"unencodable,omitempty"`

	// Shaping is the payload, drop and ignoreChanges config of the sources
	// that have any (see shaping.go).
	Shaping map[string]Shaping `json:"shaping,omitempty"`

	// Filters are the filters of the sources that have one (scope.go).
	Filters map[string]Filter `json:"filters,omitempty"`
}

// Save writes h as indented JSON.
func (h *History) Save(path string) error {
	b, err := json.MarshalIndent(h, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// Load reads a History written by Save.
func Load(path string) (*History, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var h History
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, fmt.Errorf("history %s: %w", path, err)
	}
	return &h, nil
}

// ParseRV parses a resourceVersion; "" is 0.
func ParseRV(s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("resourceVersion %q is not an etcd revision: %w", s, err)
	}
	return n, nil
}
