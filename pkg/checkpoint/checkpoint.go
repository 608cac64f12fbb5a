package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"maps"
	"slices"
	"sort"
	"sync"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/util/retry"

	"github.com/relayd/relayd/internal/failpoint"
	relaydretry "github.com/relayd/relayd/internal/retry"
	"github.com/relayd/relayd/pkg/index"
)

// Defaults for the zero values of [Options].
const (
	// DefaultFlushInterval is the default of Options.FlushInterval.
	DefaultFlushInterval = 5 * time.Second
	// DefaultBookmarkPersistInterval is the default of
	// Options.BookmarkPersistInterval.
	DefaultBookmarkPersistInterval = 2 * time.Minute
)

const (
	// fieldManager attributes relayd's writes in the ConfigMap's managedFields.
	fieldManager = "relayd"
	// managedByLabel is set on the ConfigMap only when relayd creates it.
	managedByLabel = "app.kubernetes.io/managed-by"
	managedByValue = "relayd"
	// tickTimeout bounds one periodic write, so a silent apiserver cannot
	// stall Run; the next tick retries.
	tickTimeout = 30 * time.Second
)

// FormatVersion is the version of the stored value's layout, written as its
// last member "v" (docs/DEPLOY.md, "Upgrade and rollback: formats"). Values
// without it were written before it existed, in the same layout: version 0
// reads as 1. A value with a higher version was written by a newer relayd;
// [Store.Load] refuses it, naming the key and the version, rather than
// misread it.
const FormatVersion = 1

// Position is what relayd stores per watch key: the resourceVersion to resume
// the watch from, the relist generation of the source it belongs to, and when
// relayd advanced to it. It is stored as compact JSON, followed by the
// format version ("v", see [FormatVersion]).
type Position struct {
	// ResourceVersion is opaque: it is compared for equality only.
	ResourceVersion string `json:"resourceVersion"`
	// Epoch is the source's relist generation (+1 on every relist).
	Epoch uint64 `json:"epoch"`
	// Updated is when relayd advanced to this position; set by [Store.Advance].
	Updated time.Time `json:"updated"`
	// Index is the object-index state this position matches: every index
	// write up to it was acked into that bucket generation. Absent in
	// checkpoints written before relayd kept an index.
	Index *index.Ref `json:"index,omitempty"`
	// StreamSeq is an event-stream sequence at or before every message
	// published after this position (0: unknown): at start relayd reads the
	// stream from there to bring its object index up to date.
	StreamSeq uint64 `json:"streamSeq,omitempty"`
	// FilterHash identifies the source's filter and filterOnError the
	// object index held the scope of at this position ("": no filter):
	// a start under another filter relists (reason config-changed).
	// Absent in checkpoints of unfiltered sources and of relayds from
	// before filters.
	FilterHash string `json:"filterHash,omitempty"`
}

// Options configures a [Store]. Client, Namespace, Name and Logger are
// required.
type Options struct {
	// Client reaches the ConfigMap; relayd needs "get" and "update" on it.
	Client corev1client.ConfigMapsGetter
	// Namespace and Name identify the checkpoint ConfigMap; with Shards > 1
	// Name is the first of them (see [ShardNames]).
	Namespace string
	Name      string
	// Shards is the number of checkpoint ConfigMaps the keys are spread over
	// by [ShardOf] (0 means 1): every replica must use the same count. See
	// [ShardCount].
	Shards int
	// FlushInterval is how often [Store.Run] writes changed keys
	// (coalescing); default 5s.
	FlushInterval time.Duration
	// BookmarkPersistInterval: progress that comes only from bookmarks is
	// persisted by [Store.Run] at most this often per key (default 2m), so an
	// idle cluster does not keep writing (our own write bumps the global
	// resourceVersion, which the next bookmark reports).
	BookmarkPersistInterval time.Duration
	// Logger is required; the store logs under the name "checkpoint".
	Logger *zap.Logger
	// Metrics counts the writes and holds the last write of each source
	// followed (Store.Follow); nil reports nothing.
	Metrics *Metrics
	// Now replaces time.Now (tests); nil means time.Now.
	Now func() time.Time
}

// keyState is the store's view of one key. A key is dirty while gen >
// persistedGen; it has non-bookmark progress pending while normalGen >
// persistedGen.
type keyState struct {
	pos          Position
	gen          uint64    // bumped by every Advance that moves the position
	normalGen    uint64    // gen of the newest non-bookmark Advance
	persistedGen uint64    // newest gen known to be stored
	storedAt     time.Time // when the stored value was written (loaded: its Updated)
	lastWrite    time.Time // last successful write by this store
	storedRaw    string    // value last read from or written to its ConfigMap
	discards     uint64    // bumped by Discard
	strays       []int     // other shards holding a copy (an older layout), removed after the next write
}

func (k *keyState) dirty() bool { return k.gen > k.persistedGen }

// Store keeps the positions of this relayd's watches in memory and writes the
// changed ones to the checkpoint ConfigMaps. Every method is safe for
// concurrent use; the writes of Flush and Run are serialised (relayd runs
// Run and calls Flush as each source stops).
type Store struct {
	client      corev1client.ConfigMapInterface
	namespace   string
	names       []string // the shards' ConfigMaps, see ShardNames
	flushInt    time.Duration
	bookmarkInt time.Duration
	log         *zap.Logger
	metrics     *Metrics
	now         func() time.Time

	flushMu sync.Mutex // serialises writes

	mu   sync.Mutex // guards keys, followed and sourceOf
	keys map[string]*keyState
	// followed is, per source given to Follow, its keys; sourceOf is the
	// source of each of those keys.
	followed map[string][]string
	sourceOf map[string]string
}

// New validates o and returns a Store. Call [Store.Load] before using it.
func New(o Options) (*Store, error) {
	var errs []error
	if o.Client == nil {
		errs = append(errs, errors.New("checkpoint: Options.Client is required"))
	}
	if o.Namespace == "" {
		errs = append(errs, errors.New("checkpoint: Options.Namespace is required"))
	}
	if o.Name == "" {
		errs = append(errs, errors.New("checkpoint: Options.Name is required"))
	}
	if o.Logger == nil {
		errs = append(errs, errors.New("checkpoint: Options.Logger is required"))
	}
	if o.FlushInterval < 0 {
		errs = append(errs, fmt.Errorf("checkpoint: Options.FlushInterval must not be negative, got %s", o.FlushInterval))
	}
	if o.Shards < 0 {
		errs = append(errs, fmt.Errorf("checkpoint: Options.Shards must not be negative, got %d", o.Shards))
	}
	if o.BookmarkPersistInterval < 0 {
		errs = append(errs, fmt.Errorf("checkpoint: Options.BookmarkPersistInterval must not be negative, got %s", o.BookmarkPersistInterval))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	s := &Store{
		client:      o.Client.ConfigMaps(o.Namespace),
		namespace:   o.Namespace,
		names:       ShardNames(o.Name, o.Shards),
		flushInt:    o.FlushInterval,
		bookmarkInt: o.BookmarkPersistInterval,
		metrics:     o.Metrics,
		now:         o.Now,
		keys:        map[string]*keyState{},
		followed:    map[string][]string{},
		sourceOf:    map[string]string{},
	}
	if s.flushInt == 0 {
		s.flushInt = DefaultFlushInterval
	}
	if s.bookmarkInt == 0 {
		s.bookmarkInt = DefaultBookmarkPersistInterval
	}
	if s.now == nil {
		s.now = time.Now
	}
	s.log = o.Logger.With(zap.String("configMap", s.object(o.Name)), zap.Int("configMaps", len(s.names))) // the caller names it
	return s, nil
}

// Key builds the ConfigMap data key for a watch: "<source>" for
// all-namespaces or cluster-scoped, "<source>.<namespace>" for a namespace
// (source names are DNS-1123 labels without dots, so this is unambiguous and
// a legal ConfigMap key).
func Key(source, namespace string) string {
	if namespace == "" {
		return source
	}
	return source + "." + namespace
}

func (s *Store) object(name string) string { return s.namespace + "/" + name }

// shardOf is the index in s.names of key's ConfigMap.
func (s *Store) shardOf(key string) int { return ShardOf(key, len(s.names)) }

// Load reads the checkpoint ConfigMaps (once at start, and again after this
// replica takes over a source). One that does not exist Load tries to
// create empty, labelled app.kubernetes.io/managed-by=relayd; if relayd may
// not, the error says to create it or grant "create". Load also checks, with
// a dry-run update, that relayd may update each, so missing RBAC shows at
// start rather than at the first write. A key whose value is not a valid
// Position is an error naming the key. A key found in a ConfigMap other than
// its own ([ShardOf]; an older layout, or another shard count) is read from
// there when its own ConfigMap lacks it, and removed from there after this
// store next writes it. Keys this store has advanced but not yet written
// keep their in-memory position.
func (s *Store) Load(ctx context.Context) error {
	type found struct {
		pos   Position
		raw   string
		shard int
	}
	var errs []error
	copies := map[string][]found{}
	rvs := make([]string, len(s.names))
	for i, name := range s.names {
		cm, err := s.loadShard(ctx, name)
		if err != nil {
			return err
		}
		rvs[i] = cm.ResourceVersion
		keys := make([]string, 0, len(cm.Data))
		for k := range cm.Data {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			p, err := decode(cm.Data[k])
			if err != nil {
				errs = append(errs, s.badValue(name, k, err))
				continue
			}
			copies[k] = append(copies[k], found{pos: p, raw: cm.Data[k], shard: i})
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}

	s.mu.Lock()
	for k, cs := range copies {
		st := s.state(k)
		home, use := s.shardOf(k), cs[0]
		st.strays, st.storedRaw = nil, ""
		for _, c := range cs {
			if c.shard == home {
				use, st.storedRaw = c, c.raw
			} else {
				st.strays = append(st.strays, c.shard)
			}
		}
		if !st.dirty() {
			st.pos = use.pos
			st.storedAt = use.pos.Updated
		}
	}
	s.mu.Unlock()
	s.log.Info("checkpoint loaded", zap.Int("keys", len(copies)), zap.Strings("resourceVersions", rvs))
	return nil
}

// badValue is Load's error for a key whose value it cannot use.
func (s *Store) badValue(name, k string, err error) error {
	if errors.Is(err, errNewerFormat) {
		return fmt.Errorf("checkpoint: ConfigMap %s key %q: %w: run that relayd version or a newer one (docs/DEPLOY.md, \"Upgrade and rollback: formats\"), or delete the key (relayd then starts that watch afresh, per the source's initial setting)", s.object(name), k, err)
	}
	return fmt.Errorf("checkpoint: ConfigMap %s key %q: %w: fix the value or delete the key (relayd then starts that watch afresh, per the source's initial setting)", s.object(name), k, err)
}

// loadShard reads (or creates) one checkpoint ConfigMap for Load and checks
// that relayd may update it.
func (s *Store) loadShard(ctx context.Context, name string) (*corev1.ConfigMap, error) {
	cm, err := s.client.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		cm, err = s.create(ctx, name, nil)
		if err != nil && !errors.Is(err, errAlreadyExisted) {
			return nil, err
		}
	case apierrors.IsForbidden(err):
		return nil, fmt.Errorf(`checkpoint: relayd may not "get" ConfigMap %s: grant "get" and "update" on it (deploy/ ships the Role): %w`, s.object(name), err)
	case err != nil:
		return nil, fmt.Errorf("checkpoint: get ConfigMap %s: %w", s.object(name), err)
	}
	if err := s.probeUpdate(ctx, cm); err != nil {
		return nil, err
	}
	return cm, nil
}

// create creates the ConfigMap name with data, or returns the existing one
// if another replica created it first.
func (s *Store) create(ctx context.Context, name string, data map[string]string) (*corev1.ConfigMap, error) {
	cm, err := s.client.Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Name:      name,
			Namespace: s.namespace,
			Labels:    map[string]string{managedByLabel: managedByValue},
		},
		Data: data,
	}, metav1.CreateOptions{FieldManager: fieldManager})
	switch {
	case err == nil:
		s.log.Info("created checkpoint ConfigMap", zap.String("name", name))
		return cm, nil
	case apierrors.IsAlreadyExists(err):
		cm, err = s.client.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("checkpoint: get ConfigMap %s: %w", s.object(name), err)
		}
		return cm, errAlreadyExisted
	case apierrors.IsForbidden(err):
		return nil, fmt.Errorf(`checkpoint ConfigMap %s does not exist and relayd may not create it: create it (deploy/ ships one) or grant "create" on configmaps`, s.object(name))
	default:
		return nil, fmt.Errorf("checkpoint: ConfigMap %s does not exist; creating it: %w", s.object(name), err)
	}
}

// errAlreadyExisted tells create's callers that the ConfigMap they returned
// was read, not created.
var errAlreadyExisted = errors.New("already existed")

// probeUpdate checks with a dry-run update that relayd may update the
// ConfigMap. Only Forbidden is fatal; anything else (a conflict, an admission
// webhook that refuses dry runs) is left for the first real write to report.
func (s *Store) probeUpdate(ctx context.Context, cm *corev1.ConfigMap) error {
	_, err := s.client.Update(ctx, cm.DeepCopy(), metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}, FieldManager: fieldManager})
	switch {
	case err == nil:
		return nil
	case apierrors.IsForbidden(err):
		return fmt.Errorf(`checkpoint: relayd may not "update" ConfigMap %s: grant "get" and "update" on it (deploy/ ships the Role): %w`, s.object(cm.Name), err)
	default:
		s.log.Debug("dry-run update of the checkpoint ConfigMap failed; the first write will tell", zap.Error(err))
		return nil
	}
}

// stored is the JSON of a stored value: the Position's members, then "v".
// Older relayds decode it into a Position, ignoring "v" (encoding/json
// ignores unknown members), which is what makes a rollback safe.
type stored struct {
	Position
	V uint64 `json:"v"`
}

// encode is the stored value of p, in the current format.
func encode(p Position) (string, error) {
	b, err := json.Marshal(stored{Position: p, V: FormatVersion})
	return string(b), err
}

// errNewerFormat marks a value written in a format newer than FormatVersion.
var errNewerFormat = errors.New("it was written by a newer relayd")

// decode parses one stored value; a position without a resourceVersion is
// invalid (it would silently restart the watch from scratch), and one in a
// format newer than FormatVersion is refused.
func decode(raw string) (Position, error) {
	var v stored
	if err := json.Unmarshal([]byte(raw), &v); err != nil {
		return Position{}, fmt.Errorf("not a valid position (%v)", err)
	}
	if v.V > FormatVersion {
		return Position{}, fmt.Errorf("checkpoint format version %d (\"v\") is newer than this relayd reads (up to %d): %w", v.V, FormatVersion, errNewerFormat)
	}
	if v.ResourceVersion == "" {
		return Position{}, errors.New("not a valid position (no resourceVersion)")
	}
	return v.Position, nil
}

// state returns key's state, creating it; s.mu must be held.
func (s *Store) state(key string) *keyState {
	st, ok := s.keys[key]
	if !ok {
		st = &keyState{}
		s.keys[key] = st
	}
	return st
}

// Get returns key's position as loaded or as advanced since, and whether
// there is one.
func (s *Store) Get(key string) (Position, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.keys[key]
	if !ok || st.pos.ResourceVersion == "" {
		return Position{}, false
	}
	return st.pos, true
}

// Follow makes relayd_checkpoint_last_write_timestamp_seconds{source}
// follow this store's writes of keys (the positions of the source's
// watches, which run here from now on): the least recent last write among
// those of them written by this store so far (0 until one is), updated at
// each write. It replaces the keys of an earlier Follow of source.
func (s *Store) Follow(source string, keys []string) {
	if s.metrics == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.forget(source)
	s.followed[source] = slices.Clone(keys)
	for _, k := range keys {
		s.sourceOf[k] = source
	}
	s.setLastWrite(source)
}

// Unfollow deletes the source's series (it no longer runs here): a write
// that ends later does not bring it back.
func (s *Store) Unfollow(source string) {
	if s.metrics == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.forget(source)
	s.metrics.LastWrite.DeleteLabelValues(source)
}

// forget drops what Follow recorded of source; s.mu is held.
func (s *Store) forget(source string) {
	for _, k := range s.followed[source] {
		delete(s.sourceOf, k)
	}
	delete(s.followed, source)
}

// setLastWrite sets the followed source's series to the least recent last
// write of its keys; s.mu is held.
func (s *Store) setLastWrite(source string) {
	var oldest time.Time
	for _, k := range s.followed[source] {
		if st := s.keys[k]; st != nil && !st.lastWrite.IsZero() && (oldest.IsZero() || st.lastWrite.Before(oldest)) {
			oldest = st.lastWrite
		}
	}
	s.metrics.LastWrite.WithLabelValues(source).Set(unixSeconds(oldest))
}

// Advance records key's new position in memory; it never blocks on the API.
// The caller must only pass a position whose event and every earlier event of
// the watch are acked (see the package doc). bookmarkOnly=true marks progress
// that came only from a bookmark: [Store.Run] persists such progress at most
// once per BookmarkPersistInterval. Positions only move when the
// ResourceVersion string differs (opaque: compared for equality only, never
// ordered) or the index generation changes; advancing to the stored
// resourceVersion of the same generation is a no-op, even with a different
// Epoch. p.Updated is set to the current time. An empty
// ResourceVersion is ignored.
func (s *Store) Advance(key string, p Position, bookmarkOnly bool) {
	if p.ResourceVersion == "" {
		s.log.Warn("ignoring an advance to an empty resourceVersion", zap.String("key", key))
		return
	}
	now := s.now().UTC() // UTC also drops the monotonic reading
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.state(key)
	if st.pos.ResourceVersion == p.ResourceVersion && sameGeneration(st.pos.Index, p.Index) {
		return
	}
	p.Updated = now
	st.pos = p
	st.gen++
	if !bookmarkOnly {
		st.normalGen = st.gen
	}
}

// Settle raises the event-stream sequence of key's position to seq, for a
// watch that stopped cleanly: its pipeline drained (every event it
// published, and that event's index write, acknowledged) and it publishes
// nothing more, so none of its messages is stored at or after seq and a
// restart has nothing of it to catch up from the stream. Without it, a
// watch quiet since long ago would make the next start read every message
// stored since its last change (docs/ARCHITECTURE.md, "Start-up reads are
// shared"). Only a position this store advanced is raised: one loaded and
// never advanced may be of a watch stopped before its own catch-up ran. It
// is bookmark-like progress, written by the next Flush.
func (s *Store) Settle(key string, seq uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.keys[key]
	if !ok || st.gen == 0 || st.pos.ResourceVersion == "" || st.pos.StreamSeq >= seq {
		return
	}
	st.pos.StreamSeq = seq
	st.gen++
}

// sameGeneration reports whether a position with index b adds nothing to
// one with index a: same bucket generation (or no index given).
func sameGeneration(a, b *index.Ref) bool {
	return b == nil || (a != nil && a.Generation == b.Generation)
}

// Discard drops the progress of keys that was not written yet, for a replica
// that lost the ownership of their watches: another replica may already be
// advancing them, and a late write from here would move them back. Get then
// returns the position last read or written. Call it only after the watch's
// pipeline stopped calling Advance. A write already under way leaves the
// keys out from its next attempt on (e.g. the retry of a conflict once a
// partition heals); an update already sent cannot be recalled, but it
// conflicts with, and so cannot overwrite, any write the new owner made
// meanwhile.
func (s *Store) Discard(keys ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range keys {
		st, ok := s.keys[k]
		if ok {
			st.discards++ // a flush in progress must not write it
		}
		if !ok || !st.dirty() {
			continue
		}
		st.gen, st.normalGen = st.persistedGen, st.persistedGen
		st.pos = Position{}
		if st.storedRaw != "" {
			if p, err := decode(st.storedRaw); err == nil {
				st.pos = p
			}
		}
		s.log.Info("discarded unwritten progress of a watch this replica no longer owns", zap.String("key", k))
	}
}

// undiscarded is todo without the keys Discard was called for since
// collect.
func (s *Store) undiscarded(todo []pending) []pending {
	s.mu.Lock()
	defer s.mu.Unlock()
	kept := todo[:0:0]
	for _, p := range todo {
		if s.keys[p.key].discards == p.discards {
			kept = append(kept, p)
		}
	}
	return kept
}

// pending is one key to write in a flush: set to raw in its own
// ConfigMap, or (remove) deleted from another shard that holds a stray copy.
type pending struct {
	key      string
	gen      uint64
	raw      string
	discards uint64
	shard    int
	remove   bool
}

// collect snapshots the keys to write. force includes bookmark-only progress
// whose BookmarkPersistInterval has not yet passed.
func (s *Store) collect(force bool) ([]pending, error) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []pending
	for k, st := range s.keys {
		if !st.due(force, now, s.bookmarkInt) {
			continue
		}
		raw, err := encode(st.pos)
		if err != nil { // cannot happen for Position
			return nil, fmt.Errorf("checkpoint: encode key %q: %w", k, err)
		}
		out = append(out, pending{key: k, gen: st.gen, raw: raw, discards: st.discards, shard: s.shardOf(k)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].key < out[j].key })
	return out, nil
}

// due reports whether a flush at now writes the key: it must be dirty, and
// progress that came only from bookmarks waits until the stored position is
// bookmarkInterval old, unless force (an idle cluster would otherwise be
// written to at every tick, see the package doc).
func (k *keyState) due(force bool, now time.Time, bookmarkInterval time.Duration) bool {
	if !k.dirty() {
		return false
	}
	bookmarkOnly := k.normalGen <= k.persistedGen
	return force || !bookmarkOnly || now.Sub(k.storedAt) >= bookmarkInterval
}

// Flush writes every dirty key now, bookmark-only progress included: for
// each checkpoint ConfigMap that holds one of them, and only for those, it
// gets the ConfigMap, sets only this store's dirty keys (other replicas own
// other keys of the same ConfigMap) and updates it, retrying on a conflict
// with a fresh get (retry.RetryOnConflict). It makes at most one successful
// write per ConfigMap, however many keys are dirty, and none when nothing is
// dirty; then it removes the written keys' stray copies from other shards
// (see [Store.Load]). A key advanced while a flush is in progress stays dirty
// for the next one. If a ConfigMap was deleted, Flush recreates it where
// relayd may. A ConfigMap that fails does not stop the others: the error
// joins every failure.
func (s *Store) Flush(ctx context.Context) error {
	return s.flush(ctx, true)
}

// flush writes the keys collect picks (see Flush), one ConfigMap at a time.
func (s *Store) flush(ctx context.Context, force bool) error {
	s.flushMu.Lock()
	defer s.flushMu.Unlock()

	todo, err := s.collect(force)
	if err != nil || len(todo) == 0 {
		return err
	}
	var errs []error
	var written []pending
	for shard, keys := range byShard(todo) {
		if w, err := s.flushShard(ctx, shard, keys); err != nil {
			errs = append(errs, err)
		} else {
			written = append(written, w...)
		}
	}
	for shard, keys := range byShard(s.strayRemovals(written)) {
		if err := s.removeStrays(ctx, shard, keys); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// byShard groups todo by ConfigMap, in shard order.
func byShard(todo []pending) iter.Seq2[int, []pending] {
	groups := map[int][]pending{}
	for _, p := range todo {
		groups[p.shard] = append(groups[p.shard], p)
	}
	return func(yield func(int, []pending) bool) {
		for _, shard := range slices.Sorted(maps.Keys(groups)) {
			if !yield(shard, groups[shard]) {
				return
			}
		}
	}
}

// flushShard writes todo, keys of one ConfigMap, retrying conflicts, then
// reports the write to Metrics and records the keys as persisted. It
// returns the keys written.
func (s *Store) flushShard(ctx context.Context, shard int, todo []pending) ([]pending, error) {
	name := s.names[shard]
	prev := s.storedValues(todo)
	err := retry.RetryOnConflict(relaydretry.Conflict(), func() error {
		var err error
		todo, err = s.writeOnce(ctx, name, todo, prev)
		return err
	})
	if err != nil && apierrors.IsConflict(err) {
		err = fmt.Errorf("checkpoint: update ConfigMap %s: still conflicting after retries: %w", s.object(name), err)
	}
	if len(todo) == 0 {
		return nil, err // every key was discarded: nothing written
	}
	// A write cut short by shutdown (cancellation) is not a failure worth
	// counting; a timeout is.
	if err == nil || !errors.Is(ctx.Err(), context.Canceled) {
		s.metrics.write(err)
	}
	if err != nil {
		return nil, err
	}
	s.markPersisted(todo)
	return todo, nil
}

// strayRemovals lists, for the keys just written, the removal of each stray
// copy in another shard.
func (s *Store) strayRemovals(written []pending) []pending {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []pending
	for _, p := range written {
		for _, shard := range s.keys[p.key].strays {
			out = append(out, pending{key: p.key, discards: p.discards, shard: shard, remove: true})
		}
	}
	return out
}

// removeStrays deletes todo's keys from one shard's ConfigMap (see
// strayRemovals) and forgets them as strays once done.
func (s *Store) removeStrays(ctx context.Context, shard int, todo []pending) error {
	name := s.names[shard]
	err := retry.RetryOnConflict(relaydretry.Conflict(), func() error {
		var err error
		todo, err = s.writeOnce(ctx, name, todo, nil)
		return err
	})
	if len(todo) == 0 {
		return err
	}
	if err == nil || !errors.Is(ctx.Err(), context.Canceled) {
		s.metrics.write(err)
	}
	if err != nil {
		return err
	}
	s.mu.Lock()
	for _, p := range todo {
		st := s.keys[p.key]
		st.strays = slices.DeleteFunc(st.strays, func(i int) bool { return i == shard })
	}
	s.mu.Unlock()
	s.log.Info("removed keys of an older checkpoint layout from another ConfigMap", zap.String("name", name), zap.Int("keys", len(todo)))
	return nil
}

// storedValues returns, per key of todo, the value this store last read from
// or wrote to the ConfigMap ("" if none), to tell when another writer
// changed it since.
func (s *Store) storedValues(todo []pending) map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	prev := make(map[string]string, len(todo))
	for _, p := range todo {
		prev[p.key] = s.keys[p.key].storedRaw
	}
	return prev
}

// writeOnce is one attempt of a flush of ConfigMap name: it reads it
// (recreating it with todo's keys if it was deleted), sets todo's keys and
// updates it. It returns todo without the keys discarded meanwhile, and nil,
// a conflict for RetryOnConflict to retry, or the error that ends the flush.
func (s *Store) writeOnce(ctx context.Context, name string, todo []pending, prev map[string]string) ([]pending, error) {
	if todo = s.undiscarded(todo); len(todo) == 0 {
		return todo, nil
	}
	cm, created, err := s.getOrRecreate(ctx, name, todo)
	if created || err != nil {
		return todo, err
	}
	// Discarded while this write was under way (a conflict retry can come
	// after the partition that lost the Lease healed): leave those keys to
	// their new owner.
	if todo = s.undiscarded(todo); len(todo) == 0 {
		return todo, nil
	}
	data, overwritten := merge(cm.Data, todo, prev)
	for _, o := range overwritten {
		s.log.Warn("checkpoint key changed by another writer; overwriting it",
			zap.String("key", o.key), zap.String("found", o.found), zap.String("writing", o.writing),
			zap.String("remedy", "only one replica should own a source"))
	}
	cm.Data = data
	return todo, s.update(ctx, cm)
}

// getOrRecreate reads the ConfigMap name to write into. If it was deleted,
// it creates it with todo's keys and reports created (the write is done); if
// another replica recreated it first, it returns that one to write into.
func (s *Store) getOrRecreate(ctx context.Context, name string, todo []pending) (cm *corev1.ConfigMap, created bool, err error) {
	cm, err = s.client.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		data, _ := merge(nil, todo, nil)
		s.log.Warn("checkpoint ConfigMap disappeared; recreating it with this replica's keys", zap.String("name", name))
		cm, err = s.create(ctx, name, data)
		switch {
		case err == nil:
			return cm, true, nil
		case errors.Is(err, errAlreadyExisted):
			return cm, false, nil
		default:
			return nil, false, err
		}
	case apierrors.IsForbidden(err):
		return nil, false, fmt.Errorf(`checkpoint: relayd may not "get" ConfigMap %s: %w`, s.object(name), err)
	case err != nil:
		return nil, false, fmt.Errorf("checkpoint: get ConfigMap %s: %w", s.object(name), err)
	}
	return cm, false, nil
}

// overwrite is a key that a flush overwrites although another writer
// changed it since this store last read or wrote it.
type overwrite struct {
	key, found, writing string
}

// merge returns data with the keys of todo set to their new values (or
// deleted, for a removal), every other key (the sources of other replicas)
// kept as it is; data itself is left unchanged. It also returns, in todo's
// order, the keys whose value in data differs from prev, the value this
// store last read or wrote: another writer changed them since. They are
// overwritten all the same (only one replica should own a source, and this
// one still does), but are worth a warning. A key missing from data is not
// one of them.
func merge(data map[string]string, todo []pending, prev map[string]string) (map[string]string, []overwrite) {
	out := make(map[string]string, len(data)+len(todo))
	for k, v := range data {
		out[k] = v
	}
	var overwritten []overwrite
	for _, p := range todo {
		if p.remove {
			delete(out, p.key)
			continue
		}
		if cur, ok := data[p.key]; ok && cur != prev[p.key] {
			overwritten = append(overwritten, overwrite{key: p.key, found: cur, writing: p.raw})
		}
		out[p.key] = p.raw
	}
	return out, overwritten
}

// update writes cm. It returns nil, a conflict (for RetryOnConflict to
// retry), or an error naming the ConfigMap.
func (s *Store) update(ctx context.Context, cm *corev1.ConfigMap) error {
	failpoint.Inject(failpoint.CheckpointBeforeWrite)
	_, err := s.client.Update(ctx, cm, metav1.UpdateOptions{FieldManager: fieldManager})
	switch {
	case err == nil:
		failpoint.Inject(failpoint.CheckpointAfterWrite)
		return nil
	case apierrors.IsForbidden(err):
		return fmt.Errorf(`checkpoint: relayd may not "update" ConfigMap %s: %w`, s.object(cm.Name), err)
	case apierrors.IsConflict(err):
		return err
	default:
		return fmt.Errorf("checkpoint: update ConfigMap %s: %w", s.object(cm.Name), err)
	}
}

// markPersisted records that todo was written now, and updates the last
// write of the followed sources among todo's keys.
func (s *Store) markPersisted(todo []pending) {
	at := s.now()
	s.mu.Lock()
	touched := map[string]bool{}
	for _, p := range todo {
		st := s.keys[p.key]
		if p.gen > st.persistedGen {
			st.persistedGen = p.gen
		}
		st.storedRaw = p.raw
		st.storedAt = at
		st.lastWrite = at
		if src, ok := s.sourceOf[p.key]; ok {
			touched[src] = true
		}
	}
	for src := range touched {
		s.setLastWrite(src)
	}
	s.mu.Unlock()
	s.log.Debug("checkpoint written", zap.Int("keys", len(todo)))
}

// Run writes dirty keys every FlushInterval until ctx ends. Bookmark-only
// progress of a key is written only once its stored position is
// BookmarkPersistInterval old. Run does not write on exit: the owner calls
// [Store.Flush] once more during shutdown, after draining publishes. Errors
// are logged and reported to Metrics, and the same dirty keys (plus any
// advanced since) are retried on the next tick; Run never returns early.
func (s *Store) Run(ctx context.Context) {
	t := time.NewTicker(s.flushInt)
	defer t.Stop()
	failures := relaydretry.NewFailures(s.log, "checkpoint write failed; retrying on the next tick")
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		tctx, cancel := context.WithTimeout(ctx, tickTimeout)
		err := s.flush(tctx, false)
		cancel()
		switch {
		case err == nil:
			failures.OK()
		case ctx.Err() != nil:
			return
		default:
			failures.Fail(err, zap.Duration("flushInterval", s.flushInt))
		}
	}
}
