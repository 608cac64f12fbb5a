package event

// Type is the kind of change an event reports. Its values are the last token
// of an object subject and the suffix of the CloudEvents type.
type Type string

// The change types.
const (
	Added    Type = "added"
	Modified Type = "modified"
	Deleted  Type = "deleted"
)

// Valid reports whether t is one of [Added], [Modified] or [Deleted].
func (t Type) Valid() bool { return t == Added || t == Modified || t == Deleted }

// TypeFromWatch maps a watch frame type ("ADDED", "MODIFIED", "DELETED") to a
// [Type]. It reports false for every other value, including "BOOKMARK" and
// "ERROR", which are not object changes.
func TypeFromWatch(watchType string) (Type, bool) {
	switch watchType {
	case "ADDED":
		return Added, true
	case "MODIFIED":
		return Modified, true
	case "DELETED":
		return Deleted, true
	}
	return "", false
}

// Origin says why relayd published an event (the relaydorigin extension).
type Origin string

// The origins.
const (
	// OriginWatch is a change delivered by a running watch.
	OriginWatch Origin = "watch"
	// OriginInitial is an object published by the initial snapshot of a
	// source that had no checkpoint.
	OriginInitial Origin = "initial"
	// OriginResync is an object published by the relist after a 410 Gone.
	OriginResync Origin = "resync"
)

// Valid reports whether o is one of the defined origins.
func (o Origin) Valid() bool { return o == OriginWatch || o == OriginInitial || o == OriginResync }

// RelistReason is why relayd listed a watch's objects: the reason of its
// sync markers (docs/CONSUMING.md, "The sync markers") and the reason label
// of relayd_relists_total.
type RelistReason string

// The relist reasons.
const (
	// RelistInitial: the first list of a watch relayd knows nothing of
	// (no checkpoint, nothing in the index bucket).
	RelistInitial RelistReason = "initial"
	// RelistExpired: the watch position expired (410 Gone: history
	// compacted).
	RelistExpired RelistReason = "expired"
	// RelistNoCheckpoint: a list at start without a checkpoint while the
	// object index knows the watch (objects, or an earlier list's epoch):
	// the checkpoint was removed; published as a resync against the index.
	RelistNoCheckpoint RelistReason = "no-checkpoint"
	// RelistIndexLost: a list at start because the object index cannot be
	// trusted for the checkpoint (bucket recreated, behind, corrupt, or a
	// checkpoint from before the index): deletes during the downtime may
	// be missing, which the sync markers' reason tells consumers.
	RelistIndexLost RelistReason = "index-lost"
	// RelistRequested: an operator asked for it (relayd resync); the sync
	// markers carry the request's id (docs/CONSUMING.md, "Resync on
	// request").
	RelistRequested RelistReason = "requested"
	// RelistConfigChanged: a list at start because the source's filter
	// (or filterOnError) is not the one its checkpoint was written under:
	// the list publishes the objects that entered the filter (added,
	// relaydscope entered) and left it (deleted, relaydscope left).
	RelistConfigChanged RelistReason = "config-changed"
)

// RelistReasons are all the relist reasons.
var RelistReasons = []RelistReason{RelistInitial, RelistExpired, RelistNoCheckpoint, RelistIndexLost, RelistRequested, RelistConfigChanged}

// Scope is the relaydscope extension of an event (Change.Scope).
type Scope string

// The scope changes.
const (
	// ScopeEntered: an existing object started to match the source's
	// filter (an added event).
	ScopeEntered Scope = "entered"
	// ScopeLeft: an object stopped matching the source's filter (a
	// deleted event); it still exists.
	ScopeLeft Scope = "left"
)

// PayloadMode selects what the data of an event carries.
type PayloadMode string

// The payload modes.
const (
	// PayloadFull is the object JSON, metadata.managedFields removed unless
	// configured otherwise.
	PayloadFull PayloadMode = "full"
	// PayloadMetadata is {"apiVersion","kind","metadata"}.
	PayloadMetadata PayloadMode = "metadata"
	// PayloadReference is {"apiVersion","kind","namespace","name","uid","resourceVersion"}.
	PayloadReference PayloadMode = "reference"
	// PayloadNone is the relaydpayload of an event sent without data
	// because even its reference exceeded the NATS max payload
	// (Message.Unencodable). A source cannot choose it and Change.Data
	// never has it: Valid reports false.
	PayloadNone PayloadMode = "none"
)

// Valid reports whether m is one of the defined payload modes.
func (m PayloadMode) Valid() bool {
	return m == PayloadFull || m == PayloadMetadata || m == PayloadReference
}

// Resource is a resolved Kubernetes resource type (a GVR plus its kind).
type Resource struct {
	Group      string // "" for the core group
	Version    string // e.g. "v1"
	Resource   string // plural resource name, e.g. "pods"
	Kind       string // e.g. "Pod"
	Namespaced bool
}

// APIVersion returns the apiVersion of the resource: "v1" for the core group,
// "<group>/<version>" otherwise (e.g. "apps/v1").
func (r Resource) APIVersion() string {
	if r.Group == "" {
		return r.Version
	}
	return r.Group + "/" + r.Version
}

// Meta is what relayd reads from an object without decoding it. Fields absent
// from the object (or JSON null) are empty.
type Meta struct {
	APIVersion      string
	Kind            string
	Namespace       string
	Name            string
	UID             string
	ResourceVersion string
}

// appendJSON appends the relaydscope member of a structured event (none
// for "").
func (s Scope) appendJSON(b []byte) []byte {
	if s == "" {
		return b
	}
	return append(append(append(b, `,"relaydscope":"`...), s...), '"')
}

// header adds the relaydscope header of a binary event (none for "").
func (s Scope) header(hb *headerBuilder) {
	if s != "" {
		hb.ce(HeaderPrefix+"relaydscope", string(s))
	}
}
