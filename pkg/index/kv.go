package index

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/pkg/event"
)

// DefaultMarkerTTL is how long a bucket relayd creates keeps the marker of
// a deleted key before it expires.
const DefaultMarkerTTL = time.Hour

// BucketOptions configures a [Bucket].
type BucketOptions struct {
	// Name of the key-value bucket. Required.
	Name string
	// Create the bucket when it does not exist (history 1, per-message TTL
	// enabled so delete markers expire). Otherwise a missing bucket is an
	// error.
	Create   bool
	Replicas int                   // of a created bucket; default 1
	Storage  jetstream.StorageType // of a created bucket; default file
	// MarkerTTL is how long delete markers live in a created bucket; default
	// DefaultMarkerTTL.
	MarkerTTL time.Duration
	// FingerprintKeyID identifies the key of the fingerprints this relayd
	// computes (event.FingerprintKey.ID); "" when they are unkeyed. PutMsg
	// stores it with every fingerprint, and Load reads a fingerprint stored
	// under another ID (or none) as unknown (see Loaded.OtherKey).
	FingerprintKeyID string
}

// Bucket is the durable copy of every watch's index: one key per object,
// "<source>.<namespace|_>.<uid>", whose value is the object's
// resourceVersion, namespace and name (and fingerprint, with the ID of its
// key when keyed) as JSON, with the format version "v" ([FormatVersion]).
//
// Writes are not made here: PutMsg and DeleteMsg build the messages that
// the sink publishes after the event's PubAck (same retries, same watermark),
// so that the bucket is never ahead of what was published. In a JetStream
// domain (nats.jsDomain, e.g. a hub reached through a leaf node) they are
// published through the domain's API prefix, as nats.go's KeyValue.Put
// does: "$JS.<domain>.API.$KV.<bucket>.<key>", which the domain's servers
// map to the key's subject "$KV.<bucket>.<key>" (a leaf node with a
// JetStream of its own does not pass "$KV.>" to its hub).
type Bucket struct {
	kv      jetstream.KeyValue
	name    string
	subjPre string // where writes are published: WriteSubjectPrefix
	ttl     string // Nats-TTL of delete markers; "" when the bucket has no per-message TTL
	keyID   string // BucketOptions.FingerprintKeyID

	// Every watch reads the bucket's generation, its entries and its epoch
	// at start: these reads are shared by the watches that start together
	// (see coalescer), one status request and one consumer per read, not
	// per watch.
	gens  coalescer[struct{}, Generation]
	loads coalescer[loadOf, loaded]
	// epochs holds the epochs the last shared Load read, by prefix, until
	// Epoch takes them.
	epochMu sync.Mutex
	epochs  map[string]epochRead
	// warnings about settings that differ from a bucket relayd creates
	warnings []string
}

// ErrBucketNotFound is returned by Open when the bucket does not exist and
// BucketOptions.Create is false.
var ErrBucketNotFound = errors.New("index bucket not found")

// Open returns the bucket named in o, creating it if allowed.
func Open(ctx context.Context, js jetstream.JetStream, o BucketOptions) (*Bucket, error) {
	if o.Name == "" {
		return nil, errors.New("index: BucketOptions.Name is required")
	}
	kv, err := js.KeyValue(ctx, o.Name)
	if errors.Is(err, jetstream.ErrBucketNotFound) && o.Create {
		ttl := o.MarkerTTL
		if ttl <= 0 {
			ttl = DefaultMarkerTTL
		}
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket:         o.Name,
			Description:    "relayd object index: what each watch has published (uid -> resourceVersion, namespace/name)",
			History:        1,
			Replicas:       max(o.Replicas, 1),
			Storage:        o.Storage,
			LimitMarkerTTL: ttl,
		})
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = js.KeyValue(ctx, o.Name)
		}
	}
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("%w: %q (create it with history 1, or set nats.index.create: true)", ErrBucketNotFound, o.Name)
	}
	if err != nil {
		return nil, fmt.Errorf("index bucket %q: %w", o.Name, err)
	}
	b := &Bucket{kv: kv, name: o.Name, subjPre: WriteSubjectPrefix(js.Options().Domain, o.Name), keyID: o.FingerprintKeyID}
	b.gens.read, b.loads.read = b.readGenerations, b.readEntries
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("index bucket %q: status: %w", o.Name, err)
	}
	if s, ok := st.(*jetstream.KeyValueBucketStatus); ok {
		cfg := s.StreamInfo().Config
		if cfg.AllowMsgTTL {
			ttl := cfg.SubjectDeleteMarkerTTL
			if ttl <= 0 {
				ttl = DefaultMarkerTTL
			}
			b.ttl = ttl.String()
		}
		b.warnings = checkBucket(cfg, o)
	}
	return b, nil
}

// StreamName is the name of the stream that holds bucket: "KV_<bucket>".
// Every write says it must be stored there (the sink's expected stream).
func StreamName(bucket string) string { return "KV_" + bucket }

// WriteSubjectPrefix is the subject prefix that writes to bucket are
// published on: "$KV.<bucket>." in the JetStream relayd is connected to,
// "$JS.<domain>.API.$KV.<bucket>." in another domain (nats.go's KeyValue
// does the same). The keys' subjects stored in the bucket's stream are
// "$KV.<bucket>.<key>" either way.
func WriteSubjectPrefix(domain, bucket string) string {
	if domain == "" {
		return "$KV." + bucket + "."
	}
	return "$JS." + domain + ".API.$KV." + bucket + "."
}

// checkBucket names each setting of an existing bucket that differs from
// what relayd would create. relayd never changes a bucket it finds.
func checkBucket(cfg jetstream.StreamConfig, o BucketOptions) []string {
	var out []string
	differs := func(field, found, configured, why string) {
		s := fmt.Sprintf("index bucket %s: %s is %s, relayd creates it with %s (left as found)", o.Name, field, found, configured)
		if why != "" {
			s += ": " + why
		}
		out = append(out, s)
	}
	if cfg.MaxMsgsPerSubject != 1 {
		differs("history", strconv.FormatInt(cfg.MaxMsgsPerSubject, 10), "1", "every older value of every key is kept, for nothing")
	}
	if r := max(o.Replicas, 1); cfg.Replicas != r {
		differs("replicas", strconv.Itoa(cfg.Replicas), strconv.Itoa(r)+" (nats.index.replicas)", "")
	}
	if cfg.Storage != o.Storage {
		differs("storage", cfg.Storage.String(), o.Storage.String()+" (nats.index.storage)", "")
	}
	return out
}

// Warnings name the settings of the bucket that differ from those relayd
// creates it with.
func (b *Bucket) Warnings() []string { return b.warnings }

// Name is the bucket name.
func (b *Bucket) Name() string { return b.name }

// ExpiringMarkers reports whether delete markers expire (the bucket allows
// per-message TTLs). Without it every deleted object leaves a small marker
// in the bucket for good.
func (b *Bucket) ExpiringMarkers() bool { return b.ttl != "" }

// Generation identifies one incarnation of the bucket and how far it got.
// A checkpoint records the Generation its index matched; a bucket with
// another ID (deleted and recreated) or a LastSeq below the recorded one
// (restored, or lost writes) cannot be trusted for that checkpoint.
type Generation struct {
	ID      string // the backing stream's creation time
	LastSeq uint64 // the backing stream's last sequence
}

// Generation reads the bucket's current generation: one status request
// serves the calls made together (see coalescer), each by a request made
// after the call.
func (b *Bucket) Generation(ctx context.Context) (Generation, error) {
	return b.gens.do(ctx, struct{}{})
}

// readGenerations is the shared read of Generation.
func (b *Bucket) readGenerations(ctx context.Context, qs []struct{}) ([]Generation, error) {
	st, err := b.kv.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("index bucket %q: status: %w", b.name, err)
	}
	s, ok := st.(*jetstream.KeyValueBucketStatus)
	if !ok {
		return nil, fmt.Errorf("index bucket %q: unexpected status type %T", b.name, st)
	}
	info := s.StreamInfo()
	g := Generation{ID: info.Created.UTC().Format(time.RFC3339Nano), LastSeq: info.State.LastSeq}
	out := make([]Generation, len(qs))
	for i := range out {
		out[i] = g
	}
	return out, nil
}

// Prefix is the key prefix of one watch: "<source>.<namespace|_>". Source
// names and namespaces are DNS labels, valid key tokens as they are.
func Prefix(source, namespace string) string {
	if namespace == "" {
		namespace = "_"
	}
	return source + "." + namespace
}

// Key is the bucket key of uid under prefix. A uid that is not a valid key
// token (never the case for apiserver-made uids) is replaced by a hash.
func Key(prefix, uid string) string {
	if validToken(uid) {
		return prefix + "." + uid
	}
	sum := sha256.Sum256([]byte(uid))
	return prefix + ".h-" + hex.EncodeToString(sum[:16])
}

func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '=') {
			return false
		}
	}
	return true
}

// FormatVersion is the version of a bucket entry's layout, written as its
// last member "v" (docs/DEPLOY.md, "Upgrade and rollback: formats").
// Entries without it were written before it existed, in the same layout
// (with or without a fingerprint): version 0 reads as 1. An entry with a
// higher version was written by a newer relayd: Load reports it in a
// *CorruptError naming the key and the version (relayd then removes it and
// relists, index-lost), never misreads it. Older relayds ignore "v"
// (encoding/json ignores unknown members).
const FormatVersion = 1

// value is the JSON of a bucket entry. Fingerprint (16 lower-case hex
// digits) is left out when 0; entries written before it existed decode
// with fingerprint 0 (unknown). FingerprintKeyID (16 lower-case hex digits,
// event.FingerprintKey.ID) is the key the fingerprint was made with, left
// out for an unkeyed fingerprint; older relayds ignore it, which costs them
// at most one extra event per object (a fingerprint they cannot match). V
// is the FormatVersion.
type value struct {
	UID              string `json:"uid"`
	Namespace        string `json:"namespace,omitempty"`
	Name             string `json:"name"`
	ResourceVersion  string `json:"resourceVersion"`
	Fingerprint      string `json:"fingerprint,omitempty"`
	FingerprintKeyID string `json:"fingerprintKeyID,omitempty"`
	Managers         string `json:"managers,omitempty"`
	Paths            string `json:"paths,omitempty"`
	V                uint64 `json:"v"`
}

func valueOf(o Object, keyID string) value {
	v := value{UID: o.UID, Namespace: o.Namespace, Name: o.Name, ResourceVersion: o.ResourceVersion, V: FormatVersion}
	if o.Fingerprint != 0 {
		v.Fingerprint = fmt.Sprintf("%016x", o.Fingerprint)
		v.FingerprintKeyID = keyID
	}
	if o.Managers != 0 {
		v.Managers = fmt.Sprintf("%016x", o.Managers)
	}
	v.Paths = pathsHex(o)
	return v
}

func (v value) object() (Object, error) {
	o := Object{UID: v.UID, Namespace: v.Namespace, Name: v.Name, ResourceVersion: v.ResourceVersion}
	if v.V > FormatVersion {
		return o, fmt.Errorf("index entry format version %d (\"v\") is newer than this relayd reads (up to %d): it was written by a newer relayd", v.V, FormatVersion)
	}
	if v.Fingerprint != "" {
		fp, err := strconv.ParseUint(v.Fingerprint, 16, 64)
		if err != nil || len(v.Fingerprint) != 16 {
			return o, fmt.Errorf("fingerprint %q is not 16 hex digits", v.Fingerprint)
		}
		o.Fingerprint = fp
	}
	if v.Managers != "" {
		mf, err := strconv.ParseUint(v.Managers, 16, 64)
		if err != nil || len(v.Managers) != 16 {
			return o, fmt.Errorf("managers %q is not 16 hex digits", v.Managers)
		}
		o.Managers = mf
	}
	if v.Paths != "" {
		set, paths, ok := parsePathsHex([]byte(v.Paths), nil)
		if !ok {
			return o, fmt.Errorf("paths %q is not a multiple of 16 hex digits, at least 32", v.Paths)
		}
		o.PathSet, o.Paths = set, string(paths)
	}
	return o, nil
}

// PutMsg is the message that records o under prefix (its fingerprint with
// the bucket's FingerprintKeyID).
func (b *Bucket) PutMsg(prefix string, o Object) *event.Message {
	data, _ := json.Marshal(valueOf(o, b.keyID)) // strings only: cannot fail
	return &event.Message{Subject: b.subjPre + Key(prefix, o.UID), Data: data}
}

// DeleteMsg is the message that forgets uid under prefix: a purge of the key
// whose marker expires when the bucket allows it, else a delete marker.
func (b *Bucket) DeleteMsg(prefix, uid string) *event.Message {
	return b.DeleteKeyMsg(Key(prefix, uid))
}

// DeleteKeyMsg is DeleteMsg for a key as read from the bucket.
func (b *Bucket) DeleteKeyMsg(key string) *event.Message {
	h := map[string][]string{"KV-Operation": {"DEL"}}
	if b.ttl != "" {
		h = map[string][]string{"KV-Operation": {"PURGE"}, "Nats-Rollup": {"sub"}, "Nats-TTL": {b.ttl}}
	}
	return &event.Message{Subject: b.subjPre + key, Header: h}
}

// EpochKey is where EpochMsg keeps the relist epoch of the watch under
// prefix: outside the watch's object keys, so Load never sees it.
func EpochKey(prefix string) string { return "_epoch." + prefix }

// EpochMsg is the message that records the relist epoch of the watch under
// prefix. relayd writes it before each sync.started, so that the epoch keeps
// increasing even when the checkpoint is lost, and (with epoch 0) before a
// watch first starts from now without a list, so that relayd knows it
// watched (Recovery.Listed).
func (b *Bucket) EpochMsg(prefix string, epoch uint64) *event.Message {
	return &event.Message{Subject: b.subjPre + EpochKey(prefix), Data: strconv.AppendUint(nil, epoch, 10)}
}

// CorruptError is returned by Load when values could not be decoded; every
// other value was loaded.
type CorruptError struct {
	Keys []string // the corrupt keys
	Err  error    // the first decoding error
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("%d corrupt index entries (first %q: %v)", len(e.Keys), e.Keys[0], e.Err)
}

func (e *CorruptError) Unwrap() error { return e.Err }

// Loaded is what Load read.
type Loaded struct {
	// Objects is the number of objects loaded.
	Objects int
	// OtherKey are the uids of the loaded objects whose stored fingerprint
	// was made under another key than the bucket's FingerprintKeyID
	// (another key, no key while the bucket has one, or a key while it has
	// none). Their fingerprint is loaded as 0 (unknown): it cannot match
	// one made now. relayd rewrites their entries without it.
	OtherKey []string
}
