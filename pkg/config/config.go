package config

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"slices"
	"strings"
	"time"

	yaml "go.yaml.in/yaml/v3"

	"github.com/relayd/relayd/pkg/event"
)

// Config is the whole relayd configuration file.
//
// Load and Parse return a Config whose fields already hold their effective
// values (defaults applied), so callers read fields directly and never
// re-apply defaults. A Config built in Go should be passed through
// ApplyDefaults before use.
type Config struct {
	// Cluster names the Kubernetes cluster in subjects and in the
	// CloudEvents source. Required.
	Cluster string `yaml:"cluster" schema:"required,token"`
	// Prefix is the first subject token(s) and the CloudEvents type prefix.
	Prefix string `yaml:"prefix" schema:"subjectPrefix"`
	// NATS configures the connection and the JetStream stream.
	NATS NATS `yaml:"nats" schema:"required"`
	// CloudEvents configures the wire format of events.
	CloudEvents CloudEvents `yaml:"cloudevents"`
	// Checkpoint configures where resourceVersions are stored.
	Checkpoint Checkpoint `yaml:"checkpoint"`
	// Watch configures LIST/WATCH requests shared by every source.
	Watch Watch `yaml:"watch"`
	// Shutdown configures the SIGTERM sequence.
	Shutdown Shutdown `yaml:"shutdown"`
	// Sharding spreads the sources over several replicas (one Lease each).
	Sharding Sharding `yaml:"sharding"`
	// HeartbeatInterval is how often each running watch publishes a
	// heartbeat control event (docs/CONSUMING.md, "Heartbeats"); 0 turns
	// them off. A source may override it.
	HeartbeatInterval *Duration `yaml:"heartbeatInterval"`
	// Resync configures resync on request (`relayd resync`).
	Resync Resync `yaml:"resync"`
	// Sources lists the resources to watch. At least one is required.
	Sources []Source `yaml:"sources" schema:"required"`

	// origin remembers where the Config was parsed from, so that Validate
	// can name file lines. Nil for a Config built in Go.
	origin *origin
}

// origin is the file name and the path->line map recorded while decoding.
type origin struct {
	source  string
	lines   map[string]int
	scalars map[string]*yaml.Node
	text    []byte
}

// NATS configures the NATS connection and the JetStream stream.
//
// Every secret is a file path, never a value: relayd reads the files when it
// connects and again at every reconnect, so a rotated Kubernetes Secret is
// picked up without a restart. At most one way of authenticating may be set:
// CredentialsFile, NkeySeedFile, TokenFile, or UserFile with PasswordFile.
type NATS struct {
	// URL is one server URL or a comma-separated list of them
	// (nats://, tls://, ws:// or wss://). Required.
	URL string `yaml:"url" schema:"required"`
	// CredentialsFile is the path of a NATS .creds file (JWT + nkey seed),
	// for servers in operator (JWT) mode.
	CredentialsFile string `yaml:"credentialsFile"`
	// NkeySeedFile is the path of a file holding a user NKey seed ("SU…").
	NkeySeedFile string `yaml:"nkeySeedFile"`
	// TokenFile is the path of a file holding an auth token.
	TokenFile string `yaml:"tokenFile"`
	// UserFile and PasswordFile are the paths of files holding a user name
	// and its password. Both or neither.
	UserFile     string `yaml:"userFile"`
	PasswordFile string `yaml:"passwordFile"`
	// AllowPlaintextCredentials accepts credentials (any of the files
	// above) on a connection that is not TLS. Without it Validate refuses
	// them unless every URL is tls:// or wss:// or a TLS key is set; with
	// it, Warnings reports them.
	AllowPlaintextCredentials bool `yaml:"allowPlaintextCredentials"`
	// TLS configures the TLS connection (server CA, client certificate).
	TLS TLS `yaml:"tls"`
	// JSDomain is the JetStream domain of the stream and bucket (for a
	// leaf node that reaches its hub's JetStream); "" is the local one.
	JSDomain string `yaml:"jsDomain" schema:"token"`
	// InboxPrefix replaces "_INBOX" as the prefix of the reply subjects
	// relayd subscribes to, so that NATS permissions can grant
	// "<inboxPrefix>.>" instead of every inbox.
	InboxPrefix string `yaml:"inboxPrefix" schema:"subjectPrefix"`
	// Name is the client connection name shown by the server.
	Name string `yaml:"name"`
	// PublishTimeout bounds the wait for one PubAck.
	PublishTimeout Duration `yaml:"publishTimeout"`
	// MaxInFlight bounds unacknowledged publishes per watch.
	MaxInFlight int `yaml:"maxInFlight"`
	// MaxInFlightBytes bounds the bytes of unacknowledged publishes of the
	// whole process; MaxInFlightBytesPerWatch those of one watch.
	MaxInFlightBytes         Size `yaml:"maxInFlightBytes"`
	MaxInFlightBytesPerWatch Size `yaml:"maxInFlightBytesPerWatch"`
	// Stream describes the JetStream stream events are published to.
	Stream Stream `yaml:"stream" schema:"required"`
	// Index configures the key-value bucket that persists the object index
	// (what each watch has published), used for exact recovery after a 410.
	Index Index `yaml:"index"`
	// Names are what the keys above are called in messages when something
	// other than a config file set them (`relayd tail`'s flags, environment
	// and NATS context: nats.url is "--server" when --server gave it); not
	// a key of the file. See KeyNames.
	Names KeyNames `yaml:"-" json:"-"`
}

// KeyNames maps a key path of the nats block ("nats.url") to the name it
// goes by in messages ("--server"). Every message about a nats setting is
// built with the setting's name (NATS.Key), so no text is rewritten after.
type KeyNames map[string]string

// Of returns the name of the key path, the path itself when it has none.
func (k KeyNames) Of(path string) string {
	if name, ok := k[path]; ok {
		return name
	}
	return path
}

// Key returns the name of a key path of the nats block in messages
// (Names.Of).
func (n *NATS) Key(path string) string { return n.Names.Of(path) }

// TLS configures the client side of a TLS connection to NATS. Setting any
// field makes TLS required, whatever the URL scheme.
type TLS struct {
	// CAFile is the path of the PEM bundle of CAs that signed the server
	// certificate; default: the system roots.
	CAFile string `yaml:"caFile"`
	// CertFile and KeyFile are the paths of the PEM client certificate and
	// its key, for servers that verify clients (mTLS). Both or neither.
	CertFile string `yaml:"certFile"`
	KeyFile  string `yaml:"keyFile"`
	// ServerName is the name the server certificate is checked against;
	// default: the host of the URL.
	ServerName string `yaml:"serverName"`
}

// Enabled reports whether any TLS setting is given.
func (t *TLS) Enabled() bool {
	return t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" || t.ServerName != ""
}

// Index configures the JetStream key-value bucket of the object index.
type Index struct {
	// Bucket is the bucket name; default "relayd-index-<cluster>".
	Bucket string `yaml:"bucket" schema:"token"`
	// Create makes relayd create the bucket when it is missing. A pointer
	// because the default is true; use CreateBucket to read it.
	Create *bool `yaml:"create"`
	// Replicas of a bucket relayd creates.
	Replicas int `yaml:"replicas"`
	// Storage of a bucket relayd creates.
	Storage Storage `yaml:"storage"`
	// FingerprintKeyFile is the path of a file (a mounted Secret) holding
	// the key of the fingerprints of ignoreChanges: set, every fingerprint
	// is an HMAC-SHA256 under that key (event.FingerprintKey), so that
	// whoever reads the bucket cannot test guesses of the fields the
	// payload leaves out. Required when a source of Secrets has
	// ignoreChanges. Read once, at start.
	FingerprintKeyFile string `yaml:"fingerprintKeyFile"`
}

// CreateBucket returns Create, or true when it is unset.
func (i *Index) CreateBucket() bool { return i.Create == nil || *i.Create }

// Stream describes the JetStream stream. The settings below Create are those
// of a stream relayd creates; relayd never changes them on a stream that
// exists (it warns where they differ). They are validated either way.
type Stream struct {
	// Name is the stream name. Required.
	Name string `yaml:"name" schema:"required,token"`
	// Create makes relayd create the stream when it is missing (subjects
	// Config.StreamSubject(), discard policy "new"), and add
	// Config.StreamSubject() to the subjects of an existing stream that
	// does not capture it. Nothing else of an existing stream is changed.
	Create bool `yaml:"create"`
	// DuplicateWindow is the JetStream duplicate-detection window.
	DuplicateWindow Duration `yaml:"duplicateWindow"`
	// Replicas is the stream replica count.
	Replicas int `yaml:"replicas"`
	// Storage is the stream storage backend.
	Storage Storage `yaml:"storage"`
	// MaxAge is the maximum message age of a stream relayd creates. A
	// consumer that is down for longer misses the messages that expired
	// meanwhile (the stream's first sequence moves past its position).
	MaxAge Duration `yaml:"maxAge"`
	// MaxBytes is the maximum stream size in bytes; -1 means unlimited.
	MaxBytes Size `yaml:"maxBytes"`
}

// CloudEvents configures the CloudEvents encoding.
type CloudEvents struct {
	// Mode is the CloudEvents content mode.
	Mode Mode `yaml:"mode"`
}

// Checkpoint configures the ConfigMap that stores resourceVersions.
type Checkpoint struct {
	// Namespace of the checkpoint ConfigMap. Empty until ResolveDefaults
	// (called by Load) fills it from the environment.
	Namespace string `yaml:"namespace" schema:"dns1123Label"`
	// Name of the checkpoint ConfigMap.
	Name string `yaml:"name" schema:"dns1123Subdomain"`
	// FlushInterval is how often pending checkpoints are written.
	FlushInterval Duration `yaml:"flushInterval"`
	// WatchesPerConfigMap is how many watches (checkpoint keys) relayd
	// plans per checkpoint ConfigMap: the configuration's watches need
	// [Config.CheckpointShards] ConfigMaps, Name, Name-1, … (see
	// pkg/checkpoint.ShardNames), which RBAC and deploy/ must name.
	WatchesPerConfigMap int `yaml:"watchesPerConfigMap"`
}

// Watches is the number of watches (and checkpoint keys) of the
// configuration: one per namespace of a source, one for a source of all
// namespaces or of a cluster-scoped kind.
func (c *Config) Watches() int {
	n := 0
	for i := range c.Sources {
		n += max(1, len(c.Sources[i].Namespaces))
	}
	return n
}

// CheckpointShards is the number of checkpoint ConfigMaps:
// ceil(Watches / checkpoint.watchesPerConfigMap), at least 1.
func (c *Config) CheckpointShards() int {
	per := c.Checkpoint.WatchesPerConfigMap
	if per <= 0 {
		per = DefaultWatchesPerConfigMap
	}
	return max(1, (c.Watches()+per-1)/per)
}

// Watch configures the LIST/WATCH requests of every source.
type Watch struct {
	// Timeout is the server-side timeoutSeconds of each watch request.
	Timeout Duration `yaml:"timeout"`
	// IdleTimeout aborts a watch that delivered no frame (event or
	// bookmark) for this long.
	IdleTimeout Duration `yaml:"idleTimeout"`
	// RelistBackoff paces retries after a failed watch or a 410 Gone.
	RelistBackoff Backoff `yaml:"relistBackoff"`
	// PageSize is the limit of each page of the paginated LIST fallback.
	PageSize int `yaml:"pageSize"`
	// MaxObjectBytes bounds what relayd reads from the apiserver: a watch
	// frame or LIST item over it fails the watch (restarted with backoff),
	// and a LIST page is read up to it (plus 64 KiB) and asked for again
	// with fewer items when it is larger.
	MaxObjectBytes Size `yaml:"maxObjectBytes"`
}

// Backoff is an exponential backoff with jitter.
type Backoff struct {
	// Initial is the first delay.
	Initial Duration `yaml:"initial"`
	// Max caps the delay.
	Max Duration `yaml:"max"`
	// Factor multiplies the delay after each failure.
	Factor float64 `yaml:"factor"`
	// Jitter is the random fraction (0..1) added to each delay. A pointer
	// because 0 (no jitter) is a valid setting that differs from the
	// default; use JitterFraction to read it.
	Jitter *float64 `yaml:"jitter"`
}

// Sharding configures running several replicas: every source has a
// coordination.k8s.io Lease "<leasePrefix>-<source>" in checkpoint.namespace,
// pre-created, and runs on the replica that holds it (see pkg/shard).
type Sharding struct {
	// Enabled turns sharding on. Off (the default), this replica runs every
	// source and uses no Lease: run one replica.
	Enabled bool `yaml:"enabled"`
	// LeasePrefix names the Leases.
	LeasePrefix string `yaml:"leasePrefix" schema:"dns1123Label"`
	// LeaseDuration is how long other replicas wait after the last renewal
	// they saw before taking a source over (the fail-over time).
	LeaseDuration Duration `yaml:"leaseDuration"`
	// RenewDeadline is how long a replica keeps running a source without a
	// successful renewal.
	RenewDeadline Duration `yaml:"renewDeadline"`
	// RetryPeriod is how often each Lease is renewed or tried.
	RetryPeriod Duration `yaml:"retryPeriod"`
}

// Resync configures resync on request (`relayd resync`, pkg/resync).
type Resync struct {
	// RequesterInboxPrefixes are the inbox prefixes of the clients that send
	// resync requests (their nats.inboxPrefix, nats.go's
	// CustomInboxPrefix): relayd answers a request only on a reply subject
	// under one of them, never on another subject (a stream's, a KV
	// bucket's, the JetStream API's), and does not act on the request
	// otherwise. Default ["_INBOX"], the prefix of a client that sets none.
	RequesterInboxPrefixes []string `yaml:"requesterInboxPrefixes" schema:"unique,subjectPrefix"`
	// MinFullInterval is the least time between two full resyncs of a
	// source (from the start and from the completion of the last one);
	// a --full request sooner is refused, saying when the next is
	// allowed.
	MinFullInterval Duration `yaml:"minFullInterval"`
}

// Shutdown configures the graceful shutdown sequence.
type Shutdown struct {
	// DrainTimeout bounds the wait for in-flight publishes and the final
	// checkpoint write.
	DrainTimeout Duration `yaml:"drainTimeout"`
}

// Source is one watched resource type. It names the resource either by
// APIVersion and Kind (resolved through discovery) or by Resource.
type Source struct {
	// Name identifies the source in subjects, CloudEvents, metrics and
	// checkpoints. Required, unique, a DNS-1123 label.
	Name string `yaml:"name" schema:"required,dns1123Label"`
	// APIVersion is "v1" (core) or "group/version"; set with Kind.
	APIVersion string `yaml:"apiVersion" schema:"apiVersion"`
	// Kind is the CamelCase kind, e.g. "Pod"; set with APIVersion.
	Kind string `yaml:"kind" schema:"kind"`
	// Resource names the resource directly instead of APIVersion+Kind.
	Resource *Resource `yaml:"resource"`
	// Namespaces to watch, one watch each. Empty means all namespaces
	// (or a cluster-scoped kind).
	Namespaces []string `yaml:"namespaces" schema:"unique,dns1123Label"`
	// LabelSelector is the server-side label selector.
	LabelSelector string `yaml:"labelSelector"`
	// FieldSelector is the server-side field selector.
	FieldSelector string `yaml:"fieldSelector"`
	// EventTypes are the event types published; others are dropped
	// client-side (and still advance the checkpoint).
	EventTypes []EventType `yaml:"eventTypes" schema:"unique"`
	// Payload selects what the event data carries.
	Payload Payload `yaml:"payload"`
	// KeepManagedFields keeps metadata.managedFields in full payloads.
	KeepManagedFields bool `yaml:"keepManagedFields"`
	// KeepLastAppliedConfiguration keeps the annotation
	// kubectl.kubernetes.io/last-applied-configuration (which holds the
	// whole object as last applied, a Secret's data included) in full and
	// metadata payloads; it is removed by default.
	KeepLastAppliedConfiguration bool `yaml:"keepLastAppliedConfiguration"`
	// AllowSecretData allows, for a source of Secrets, what would publish,
	// fingerprint or evaluate the Secret's data: payload full,
	// KeepLastAppliedConfiguration, KeepManagedFields, IgnoreChanges,
	// ChangedPaths and Filter.
	AllowSecretData bool `yaml:"allowSecretData"`
	// Drop lists field paths (pkg/event path syntax, e.g.
	// "spec.template.spec.containers[*].env") removed from every payload.
	// They stay in the fingerprint (a change in them is a change).
	Drop []string `yaml:"drop" schema:"unique"`
	// IgnoreChanges lists field paths whose changes do not count as a
	// change of the object (left out of event.Object.Fingerprint). The
	// fingerprint covers everything else, including what the payload
	// leaves out, and is stored in the index bucket (see
	// Index.FingerprintKeyFile).
	IgnoreChanges []string `yaml:"ignoreChanges" schema:"unique"`
	// ChangedPaths lists field paths (same syntax, no [*], at most 64)
	// fingerprinted one by one: a modified event carries the
	// relaydchanged extension, the paths whose content differs from the
	// version published before (docs/CONSUMING.md, "What changed").
	ChangedPaths []string `yaml:"changedPaths" schema:"unique"`
	// Initial selects what happens when there is no checkpoint.
	Initial Initial `yaml:"initial"`
	// Filter is a CEL expression over the variable object that the
	// object must satisfy to be published; objects that start or stop
	// satisfying it are published as entering or leaving scope
	// (docs/CONFIGURATION.md, "filter"; docs/CONSUMING.md, "Filters:
	// entering and leaving scope").
	Filter string `yaml:"filter"`
	// FilterOnError says what an evaluation error of Filter means: the
	// object is in scope (include, the default) or not (exclude).
	FilterOnError FilterOnError `yaml:"filterOnError"`
	// HeartbeatInterval overrides the top-level heartbeatInterval for
	// this source's watches (0: none); unset, the top-level one applies.
	HeartbeatInterval *Duration `yaml:"heartbeatInterval"`
}

// HeartbeatOf is the heartbeat interval of src's watches: its own, else
// the top-level one (0: no heartbeats).
func (c *Config) HeartbeatOf(src *Source) time.Duration {
	switch {
	case src.HeartbeatInterval != nil:
		return src.HeartbeatInterval.Duration()
	case c.HeartbeatInterval != nil:
		return c.HeartbeatInterval.Duration()
	}
	return DefaultHeartbeatInterval
}

// Resource names a resource by group, version and plural resource name.
type Resource struct {
	// Group is the API group; "" is the core group.
	Group string `yaml:"group" schema:"apiGroup"`
	// Version is the API version, e.g. "v1".
	Version string `yaml:"version" schema:"required,dns1035Label"`
	// Resource is the plural lowercase resource name, e.g. "deployments".
	Resource string `yaml:"resource" schema:"required,dns1123Label"`
}

// EventType is a watch event type a source can publish.
type EventType string

// The event types of Source.EventTypes.
const (
	EventAdded    EventType = "added"
	EventModified EventType = "modified"
	EventDeleted  EventType = "deleted"
)

// Payload selects the event data of a source.
type Payload string

// The payload modes of Source.Payload.
const (
	// PayloadFull is the object JSON (managedFields removed unless
	// KeepManagedFields).
	PayloadFull Payload = "full"
	// PayloadMetadata is the object's metadata only.
	PayloadMetadata Payload = "metadata"
	// PayloadReference is apiVersion, kind, namespace, name, uid and
	// resourceVersion.
	PayloadReference Payload = "reference"
)

// payloads are the valid values of Source.Payload.
var payloads = []Payload{PayloadFull, PayloadMetadata, PayloadReference}

// Initial selects how a source starts without a checkpoint.
type Initial string

// The start modes of Source.Initial.
const (
	// InitialSnapshot publishes every existing object (origin "initial")
	// before live changes.
	InitialSnapshot Initial = "snapshot"
	// InitialNone starts from the current state without publishing it.
	InitialNone Initial = "none"
)

// initials are the valid values of Source.Initial.
var initials = []Initial{InitialSnapshot, InitialNone}

// Mode is the CloudEvents content mode.
type Mode string

// The content modes of CloudEvents.Mode.
const (
	// ModeStructured sends one application/cloudevents+json document.
	ModeStructured Mode = "structured"
	// ModeBinary sends ce-* headers and the data as the body.
	ModeBinary Mode = "binary"
)

// modes are the valid values of CloudEvents.Mode.
var modes = []Mode{ModeStructured, ModeBinary}

// Storage is the JetStream storage backend.
type Storage string

// The storage backends of Stream.Storage.
const (
	StorageFile   Storage = "file"
	StorageMemory Storage = "memory"
)

// storages are the valid values of Stream.Storage and Index.Storage.
var storages = []Storage{StorageFile, StorageMemory}

// Defaults. They are constants (not variables) so that nothing can change
// them at run time; the package doc lists them for users.
const (
	DefaultPrefix         = "k8s"
	DefaultNATSName       = "relayd"
	DefaultPublishTimeout = 10 * time.Second
	DefaultMaxInFlight    = 256
	// The byte bounds fit the deployment's 256 MiB memory limit: while NATS
	// is unreachable an unacknowledged message is held twice (relayd's copy
	// and the client's reconnect buffer).
	DefaultMaxInFlightBytes         = 48 << 20
	DefaultMaxInFlightBytesPerWatch = 16 << 20
	DefaultDuplicateWindow          = 10 * time.Minute
	DefaultReplicas                 = 1
	DefaultStorage                  = StorageFile
	DefaultMaxBytes                 = -1
	// DefaultMaxAge bounds a stream relayd creates: a week of events.
	DefaultMaxAge = 7 * 24 * time.Hour
	// DefaultIndexBucketPrefix + cluster is the default nats.index.bucket.
	DefaultIndexBucketPrefix   = "relayd-index-"
	DefaultMode                = ModeStructured
	DefaultCheckpointNamespace = "default"
	DefaultCheckpointName      = "relayd-checkpoint"
	// DefaultWatchesPerConfigMap is pkg/checkpoint.DefaultWatchesPerConfigMap.
	DefaultWatchesPerConfigMap = 500
	// MaxWatchesPerConfigMap keeps one checkpoint ConfigMap under the
	// apiserver's 1 MiB even with the longest keys (docs/OPERATIONS.md,
	// "Checkpoint ConfigMap").
	MaxWatchesPerConfigMap = 3000
	DefaultFlushInterval   = 5 * time.Second
	DefaultWatchTimeout    = 5 * time.Minute
	// DefaultIdleTimeoutMargin is added to watch.timeout when
	// watch.idleTimeout is not set.
	DefaultIdleTimeoutMargin    = 30 * time.Second
	DefaultRelistBackoffInitial = time.Second
	DefaultRelistBackoffMax     = 5 * time.Minute
	DefaultRelistBackoffFactor  = 2.0
	DefaultRelistBackoffJitter  = 0.5
	DefaultPageSize             = 500
	DefaultDrainTimeout         = 20 * time.Second
	DefaultLeasePrefix          = "relayd"
	DefaultLeaseDuration        = 15 * time.Second
	DefaultRenewDeadline        = 10 * time.Second
	DefaultRetryPeriod          = 2 * time.Second
	DefaultPayload              = PayloadFull
	// DefaultRequesterInboxPrefix is resync.requesterInboxPrefixes'
	// default (nats.go's default inbox prefix).
	DefaultRequesterInboxPrefix = "_INBOX"
	// DefaultMinFullInterval is resync.minFullInterval's default: a full
	// resync republishes every object of the source under a new
	// Nats-Msg-Id, so back-to-back ones are refused; a few minutes leave
	// room for a consumer's bootstrap that failed to retry soon.
	DefaultMinFullInterval = 5 * time.Minute
	// MinMinFullInterval is the shortest resync.minFullInterval.
	MinMinFullInterval = time.Second
	// DefaultHeartbeatInterval is heartbeatInterval's default.
	DefaultHeartbeatInterval = time.Minute
	// MinHeartbeatInterval is the shortest heartbeatInterval but 0 (off).
	MinHeartbeatInterval = time.Second
	DefaultInitial       = InitialSnapshot

	// DefaultMaxObjectBytes is far above any object an apiserver stores
	// (etcd refuses requests over 1.5 MiB by default).
	DefaultMaxObjectBytes = 64 << 20
)

// PodNamespaceEnv is the environment variable (set through the downward
// API) that ResolveDefaults reads for checkpoint.namespace.
const PodNamespaceEnv = "POD_NAMESPACE"

// ServiceAccountNamespaceFile is the in-cluster file that ResolveDefaults
// reads for checkpoint.namespace when PodNamespaceEnv is unset.
const ServiceAccountNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// AllEventTypes returns the event types in their canonical order; it is the
// default of Source.EventTypes.
func AllEventTypes() []EventType {
	return []EventType{EventAdded, EventModified, EventDeleted}
}

// ApplyDefaults sets every unset (zero) field to its default. It is
// idempotent and is called by Parse and Load. It does not touch
// checkpoint.namespace, which depends on the environment: see
// ResolveDefaults.
func (c *Config) ApplyDefaults() {
	setString(&c.Prefix, DefaultPrefix)

	c.NATS.applyDefaults(c.Cluster)

	if c.CloudEvents.Mode == "" {
		c.CloudEvents.Mode = DefaultMode
	}

	if len(c.Resync.RequesterInboxPrefixes) == 0 {
		c.Resync.RequesterInboxPrefixes = []string{DefaultRequesterInboxPrefix}
	}
	setDuration(&c.Resync.MinFullInterval, DefaultMinFullInterval)

	setString(&c.Checkpoint.Name, DefaultCheckpointName)
	setDuration(&c.Checkpoint.FlushInterval, DefaultFlushInterval)
	setInt(&c.Checkpoint.WatchesPerConfigMap, DefaultWatchesPerConfigMap)

	w := &c.Watch
	setDuration(&w.Timeout, DefaultWatchTimeout)
	setDuration(&w.IdleTimeout, time.Duration(w.Timeout)+DefaultIdleTimeoutMargin)
	b := &w.RelistBackoff
	setDuration(&b.Initial, DefaultRelistBackoffInitial)
	setDuration(&b.Max, DefaultRelistBackoffMax)
	if b.Factor == 0 {
		b.Factor = DefaultRelistBackoffFactor
	}
	if b.Jitter == nil {
		j := DefaultRelistBackoffJitter
		b.Jitter = &j
	}
	setInt(&w.PageSize, DefaultPageSize)
	setInt(&w.MaxObjectBytes, DefaultMaxObjectBytes)

	setDuration(&c.Shutdown.DrainTimeout, DefaultDrainTimeout)
	if c.HeartbeatInterval == nil { // explicit 0 is off
		c.HeartbeatInterval = new(Duration(DefaultHeartbeatInterval))
	}

	sh := &c.Sharding
	setString(&sh.LeasePrefix, DefaultLeasePrefix)
	setDuration(&sh.LeaseDuration, DefaultLeaseDuration)
	setDuration(&sh.RenewDeadline, DefaultRenewDeadline)
	setDuration(&sh.RetryPeriod, DefaultRetryPeriod)

	for i := range c.Sources {
		src := &c.Sources[i]
		if len(src.EventTypes) == 0 {
			src.EventTypes = AllEventTypes()
		}
		if src.Payload == "" {
			src.Payload = DefaultPayload
		}
		if src.Initial == "" {
			src.Initial = DefaultInitial
		}
	}
}

// applyDefaults sets the unset fields of the nats block; cluster names
// the default index bucket.
func (n *NATS) applyDefaults(cluster string) {
	setString(&n.Name, DefaultNATSName)
	setDuration(&n.PublishTimeout, DefaultPublishTimeout)
	setInt(&n.MaxInFlight, DefaultMaxInFlight)
	setInt(&n.MaxInFlightBytes, DefaultMaxInFlightBytes)
	setInt(&n.MaxInFlightBytesPerWatch, DefaultMaxInFlightBytesPerWatch)
	s := &n.Stream
	setDuration(&s.DuplicateWindow, DefaultDuplicateWindow)
	setInt(&s.Replicas, DefaultReplicas)
	if s.Storage == "" {
		s.Storage = DefaultStorage
	}
	setDuration(&s.MaxAge, DefaultMaxAge)
	if s.MaxBytes == 0 {
		s.MaxBytes = DefaultMaxBytes
	}
	ix := &n.Index
	if ix.Bucket == "" && isToken(cluster) { // an invalid cluster is reported once, as cluster
		ix.Bucket = DefaultIndexBucketPrefix + cluster
	}
	if ix.Create == nil {
		t := true
		ix.Create = &t
	}
	setInt(&ix.Replicas, DefaultReplicas)
	if ix.Storage == "" {
		ix.Storage = DefaultStorage
	}
}

func setString(p *string, def string) {
	if *p == "" {
		*p = def
	}
}

func setInt[T int | Size](p *T, def T) {
	if *p == 0 {
		*p = def
	}
}

func setDuration(p *Duration, def time.Duration) {
	if *p == 0 {
		*p = Duration(def)
	}
}

// ResolveDefaults fills checkpoint.namespace when it is empty: from the
// environment variable POD_NAMESPACE, else from the service account
// namespace file (ServiceAccountNamespaceFile), else "default". env and
// readFile are os.Getenv and os.ReadFile in production and fakes in tests.
//
// A value found in the environment or the file must be a valid namespace
// name, otherwise ResolveDefaults returns a *ValidationError for
// checkpoint.namespace and leaves the field empty. A missing file is not an
// error; any other read error is.
func (c *Config) ResolveDefaults(env func(string) string, readFile func(string) ([]byte, error)) error {
	if c.Checkpoint.Namespace != "" {
		return nil
	}
	fail := func(msg string) error {
		return &ValidationError{Problems: []Problem{{Path: "checkpoint.namespace", Message: msg}}}
	}
	if env != nil {
		if ns := strings.TrimSpace(env(PodNamespaceEnv)); ns != "" {
			if !isDNS1123Label(ns) {
				return fail(fmt.Sprintf("$%s %q is not a valid namespace name (must be a DNS-1123 label)", PodNamespaceEnv, ns))
			}
			c.Checkpoint.Namespace = ns
			return nil
		}
	}
	if readFile != nil {
		data, err := readFile(ServiceAccountNamespaceFile)
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			return fail(fmt.Sprintf("not set and reading %s failed: %v", ServiceAccountNamespaceFile, err))
		default:
			if ns := strings.TrimSpace(string(data)); ns != "" {
				if !isDNS1123Label(ns) {
					return fail(fmt.Sprintf("%s holds %q, which is not a valid namespace name (must be a DNS-1123 label)", ServiceAccountNamespaceFile, ns))
				}
				c.Checkpoint.Namespace = ns
				return nil
			}
		}
	}
	c.Checkpoint.Namespace = DefaultCheckpointNamespace
	return nil
}

// StreamSubject is the subject filter of the JetStream stream relayd
// creates: "<prefix>.<cluster>.>".
func (c *Config) StreamSubject() string {
	return c.prefix() + "." + c.Cluster + ".>"
}

func (c *Config) prefix() string {
	if c.Prefix == "" {
		return DefaultPrefix
	}
	return c.Prefix
}

// URLs returns the server URLs of the comma-separated URL field, trimmed,
// with empty entries dropped.
func (n *NATS) URLs() []string {
	var out []string
	for u := range strings.SplitSeq(n.URL, ",") {
		if u = strings.TrimSpace(u); u != "" {
			out = append(out, u)
		}
	}
	return out
}

// JitterFraction returns Jitter, or DefaultRelistBackoffJitter when it is
// unset.
func (b *Backoff) JitterFraction() float64 {
	if b.Jitter == nil {
		return DefaultRelistBackoffJitter
	}
	return *b.Jitter
}

// Publishes reports whether events of type t are published for s. An empty
// EventTypes list publishes every type.
func (s *Source) Publishes(t EventType) bool {
	if len(s.EventTypes) == 0 {
		return t == EventAdded || t == EventModified || t == EventDeleted
	}
	for _, e := range s.EventTypes {
		if e == t {
			return true
		}
	}
	return false
}

// Shaping returns the options of the event.Shaping of s (compile them with
// event.NewShaping; Validate has checked that they compile).
func (s *Source) Shaping() event.ShapingOptions {
	return event.ShapingOptions{
		Drop:              slices.Clone(s.Drop),
		IgnoreChanges:     slices.Clone(s.IgnoreChanges),
		KeepManagedFields: s.KeepManagedFields,
		KeepLastApplied:   s.KeepLastAppliedConfiguration,
		ChangedPaths:      slices.Clone(s.ChangedPaths),
	}
}

// IsSecret reports whether s watches core v1 Secrets (by apiVersion v1 and
// kind Secret, or by resource {group: "", resource: secrets}).
func (s *Source) IsSecret() bool {
	if s.Resource != nil {
		return s.Resource.Group == "" && s.Resource.Resource == "secrets"
	}
	return s.APIVersion == "v1" && s.Kind == "Secret"
}

// AllNamespaces reports whether s watches all namespaces (or a
// cluster-scoped kind) with one watch, i.e. Namespaces is empty.
func (s *Source) AllNamespaces() bool {
	return len(s.Namespaces) == 0
}

// GroupVersion returns the API group ("" for core) and version of s, from
// Resource or from APIVersion.
func (s *Source) GroupVersion() (group, version string) {
	if s.Resource != nil {
		return s.Resource.Group, s.Resource.Version
	}
	if g, v, ok := strings.Cut(s.APIVersion, "/"); ok {
		return g, v
	}
	return "", s.APIVersion
}

// finite reports whether f is neither NaN nor infinite.
func finite(f float64) bool {
	return !math.IsNaN(f) && !math.IsInf(f, 0)
}
