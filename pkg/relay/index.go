package relay

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/relayd/relayd/internal/retry"
	"github.com/relayd/relayd/pkg/checkpoint"
	"github.com/relayd/relayd/pkg/config"
	"github.com/relayd/relayd/pkg/event"
	"github.com/relayd/relayd/pkg/index"
	"github.com/relayd/relayd/pkg/sink"
	"github.com/relayd/relayd/pkg/source"
)

// IndexCheckEnv is the environment variable that turns on the index
// consistency check (for tests): after every relist relayd compares its
// object index with a consistent LIST at the relist's resourceVersion and
// stops with an error on any difference. cmd/relayd maps it to
// Options.IndexCheck.
const IndexCheckEnv = "RELAYD_INDEX_CHECK"

// openIndex opens (or creates) the index bucket, retrying until it
// succeeds: NATS may not be up yet, or the bucket may be missing.
func (r *relay) openIndex(ctx context.Context) {
	ix := r.cfg.NATS.Index
	o := index.BucketOptions{Name: ix.Bucket, Create: ix.CreateBucket(), Replicas: ix.Replicas, Storage: jetstream.FileStorage}
	if ix.Storage == config.StorageMemory {
		o.Storage = jetstream.MemoryStorage
	}
	backoff := wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 0.5, Steps: 1 << 30, Cap: 30 * time.Second}
	failures := retry.NewFailures(r.log, "cannot open the index bucket; sources wait")
	for {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		b, err := index.Open(cctx, r.js, o)
		cancel()
		if err == nil {
			failures.OK(zap.String("bucket", b.Name()))
			if !b.ExpiringMarkers() {
				r.log.Warn("the index bucket does not allow per-message TTLs: every deleted object leaves a small delete marker in it for good (create the bucket with a limit marker TTL, or let relayd create it)",
					zap.String("bucket", b.Name()))
			}
			for _, msg := range b.Warnings() {
				r.log.Warn("index bucket setting differs from the config", zap.String("bucket", b.Name()), zap.String("finding", msg))
			}
			r.log.Info("index bucket ready", zap.String("bucket", b.Name()))
			r.bucket.Store(b)
			return
		}
		r.indexErr.Store(err.Error())
		failures.Fail(err, zap.String("bucket", ix.Bucket))
		if !retry.Sleep(ctx, backoff.Step()) {
			return
		}
	}
}

// loadIndex fills w.idx from the bucket. On the first load it also decides
// whether the index can be trusted for the checkpoint, and returns the
// reason of the list the watch must start with ("" for none).
func (r *relay) loadIndex(ctx context.Context, w *watch) (relist string, err error) {
	b := r.bucket.Load()
	if w.idx != nil {
		// A reload after a recovered panic: the handler may have stopped
		// between indexing a change and submitting it. Wait until every
		// submitted write is acked; then the bucket is the truth.
		if err := w.pipe.Drain(ctx); err != nil {
			return "", err
		}
	}
	gen, err := b.Generation(ctx)
	if err != nil {
		return "", err
	}
	x := index.New()
	n, err := b.Load(ctx, w.ixPrefix, x)
	var corrupt *index.CorruptError
	if errors.As(err, &corrupt) {
		w.log.Error("the index has entries that cannot be read; they are removed and the source relists", zap.Strings("keys", corrupt.Keys), zap.Error(err))
		for _, k := range corrupt.Keys {
			if err := w.pipe.Submit(ctx, sink.Entry{Index: b.DeleteKeyMsg(k)}); err != nil {
				return "", err
			}
		}
	} else if err != nil {
		return "", err
	}
	first := w.idx == nil
	w.idx, w.ixGen = x, gen.ID
	w.setTracked(x.Len())
	if !first {
		// Resumes from the watermark; the bucket holds every acked write.
		w.log.Info("object index loaded", zap.Int("objects", n), zap.String("bucket", b.Name()))
		return "", nil
	}
	defer func() {
		if err != nil {
			// The first load decides the relist, the epoch floor and the
			// catch-up: a retry after a failure (a NATS timeout, a refused
			// request) must do all of it again, not take the reload path.
			w.idx, w.ixGen = nil, ""
		}
	}()
	pos, hasCP := r.store.Get(w.key)
	in := index.Recovery{Corrupt: corrupt != nil, Loaded: n, Bucket: gen, HasCheckpoint: hasCP, StreamSeq: pos.StreamSeq}
	if pos.Index != nil {
		in.CheckpointIndex = &index.Ref{Generation: pos.Index.Generation, Seq: pos.Index.Seq}
	}
	plan := index.PlanRecovery(in)
	if plan.Why != "" && corrupt == nil { // corrupt entries are logged above
		fields := []zap.Field{zap.String("bucketGeneration", gen.ID), zap.Uint64("bucketLastSeq", gen.LastSeq)}
		if pos.Index != nil {
			fields = append(fields, zap.String("checkpointGeneration", pos.Index.Generation), zap.Uint64("checkpointSeq", pos.Index.Seq))
		}
		w.log.Warn(plan.Why, fields...)
	}
	w.ixSeqFloor = plan.SeqFloor
	// Keep relaydepoch increasing when the checkpoint is gone, and when it
	// is behind: the bucket records the epoch with every sync.started, the
	// checkpoint only when the watermark moves, so after a crash during or
	// right after a relist the bucket is ahead. Reusing that epoch would
	// give the next relist's sync markers the crashed run's Nats-Msg-Ids,
	// and JetStream would drop them as duplicates: a gap without markers.
	if w.epochFloor, err = b.Epoch(ctx, w.ixPrefix); err != nil {
		return "", err
	}
	if plan.WholeStream {
		w.log.Info("no stream sequence to catch the object index up from; reading the whole event stream")
	}
	if err := r.catchUpIndex(ctx, w, plan.CatchUpFrom); err != nil {
		return "", fmt.Errorf("catching the index up with stream %q: %w", r.cfg.NATS.Stream.Name, err)
	}
	relist = plan.Relist
	w.log.Info("object index loaded", zap.Int("objects", n), zap.String("bucket", b.Name()), zap.String("relist", relist))
	return relist, nil
}

// advance is the pipeline's watermark callback: the checkpoint records the
// position with the index generation it matches.
func (r *relay) advance(w *watch, a sink.Advance) {
	ref := &checkpoint.IndexRef{Generation: w.ixGen, Seq: max(a.IndexSeq, w.ixSeqFloor)}
	r.store.Advance(w.key, checkpoint.Position{ResourceVersion: a.ResourceVersion, Epoch: a.Epoch, Index: ref, StreamSeq: a.StreamSeq}, a.BookmarkOnly)
}

// CatchUpConsumerInactive is how long the NATS server keeps the index
// catch-up's consumer after its last pull. nats.go's ordered consumer
// replaces its server-side consumer on every Fetch (deleting the one it
// replaces) but never deletes the last one; without a threshold of our own
// the server would keep it for nats.go's default of 5 minutes. Every Fetch
// creates a fresh consumer, so a slow catch-up cannot outlive it.
const CatchUpConsumerInactive = 30 * time.Second

// catchUpIndex brings w's index up to what the event stream holds. An
// index entry is written after its event's PubAck, so a crash between the
// two leaves the bucket behind the stream. A watch that resumes from its
// checkpoint replays those changes and rewrites their entries, but one whose
// position has expired (410) relists instead and would compare the list
// with the stale entries: a delete of an object whose last version never
// reached the bucket would go unreported, or be reported with an older
// resourceVersion than one already published. So, before anything else,
// every message of this watch on the stream from the checkpoint's stream
// sequence on (from the start of the stream when the checkpoint is gone but
// the bucket is kept: a relist compared with the index follows) is applied
// to the index, in stream order (per object that is publish order), and
// each correction is written to the bucket. from 0 means no catch-up.
//
// It also seeds the sink with the stream's last sequence, so that the
// positions it reports carry a tight stream sequence from the start.
func (r *relay) catchUpIndex(ctx context.Context, w *watch, from uint64) error {
	stream, err := r.js.Stream(ctx, r.cfg.NATS.Stream.Name)
	if err != nil {
		return err
	}
	last := stream.CachedInfo().State.LastSeq
	r.sink.SeedStreamSeq(last)
	if from == 0 || from > last {
		return nil
	}
	if first := stream.CachedInfo().State.FirstSeq; from < first {
		w.log.Warn("stream messages were removed (stream limits) before the index caught up with them; if the index lacked any of their changes, it still does",
			zap.Uint64("fromStreamSeq", from), zap.Uint64("streamFirstSeq", first))
	}
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: from,
		InactiveThreshold: CatchUpConsumerInactive,
	})
	if err != nil {
		return err
	}
	b := r.bucket.Load()
	// The messages are applied to the in-memory index first; only objects
	// whose final entry differs from the bucket's are written, once each.
	// Written message by message, an object seen several times in the
	// range would be written back through its older versions (a whole-
	// stream read: once per version ever published).
	type entry struct {
		o     index.Object
		known bool
	}
	// uid -> its entry before the catch-up, for each object of this watch
	// in the range: a few for a checkpoint's range, up to every object of
	// the watch for a whole-stream read (for as long as the catch-up runs).
	inBucket := map[string]entry{}
	read := 0
	for next := from; next <= last; {
		// Ask for no more than the range holds: a pull waits until its
		// batch is full or it expires.
		batch, err := cons.Fetch(int(min(500, last-next+1)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return err
		}
		n := 0
		for m := range batch.Messages() {
			n++
			md, err := m.Metadata()
			if err != nil {
				return err
			}
			next = md.Sequence.Stream + 1
			if md.Sequence.Stream > last {
				break
			}
			read++
			env, err := event.DecodeMessage(m.Headers(), m.Data())
			if err != nil || env.RelaydSource != w.src.Name || env.K8sUID == "" ||
				(w.namespace != "" && env.K8sNamespace != w.namespace) {
				continue // not an object event of this watch
			}
			o := index.Object{UID: env.K8sUID, Namespace: env.K8sNamespace, Name: env.K8sName, ResourceVersion: env.K8sResourceVersion}
			cur, known := w.idx.Get(o.UID)
			if _, seen := inBucket[o.UID]; !seen {
				inBucket[o.UID] = entry{cur, known}
			}
			switch {
			case strings.HasSuffix(env.Type, ".object."+string(event.Deleted)):
				w.idx.Delete(o.UID)
			case !known || cur != o:
				w.idx.Put(o)
			}
		}
		berr := batch.Error()
		if berr != nil && !errors.Is(berr, nats.ErrTimeout) {
			return berr
		}
		if n == 0 {
			// Nothing came: either the rest of the range is gone (stream
			// limits), or the read failed (a refused or lost consumer
			// request looks the same from here). Only the first is
			// the end of the catch-up.
			info, err := stream.Info(ctx, jetstream.WithDeletedDetails(true))
			if err != nil {
				return err
			}
			if held := heldIn(info.State, next, last); held > 0 {
				return fmt.Errorf("could not read the stream from sequence %d to %d (%d messages there): %w",
					next, last, held, cmp.Or(berr, nats.ErrTimeout))
			}
			w.log.Warn("stream messages were removed (stream limits) before the index caught up with them; their changes are missing from the index",
				zap.Uint64("fromStreamSeq", next), zap.Uint64("toStreamSeq", last), zap.Uint64("streamFirstSeq", info.State.FirstSeq))
			break
		}
	}
	fixed := 0
	for uid, was := range inBucket {
		cur, known := w.idx.Get(uid)
		var msg *event.Message
		switch {
		case known && (!was.known || was.o != cur):
			msg = b.PutMsg(w.ixPrefix, cur)
		case !known && was.known:
			msg = b.DeleteMsg(w.ixPrefix, uid)
		default:
			continue // the bucket had it right
		}
		fixed++
		if err := w.pipe.Submit(ctx, sink.Entry{Index: msg, ObjectKey: uid}); err != nil {
			return err
		}
	}
	w.setTracked(w.idx.Len())
	if fixed > 0 {
		w.log.Warn("the object index was behind the stream (relayd stopped between a PubAck and its index write); caught up from the stream",
			zap.Uint64("fromStreamSeq", from), zap.Uint64("toStreamSeq", last), zap.Int("messagesRead", read), zap.Int("entriesFixed", fixed))
	} else {
		w.log.Debug("object index matches the stream", zap.Uint64("fromStreamSeq", from), zap.Uint64("toStreamSeq", last), zap.Int("messagesRead", read))
	}
	return nil
}

// syncDeleted publishes a delete (origin resync, final state unknown) for
// every indexed object the relist did not contain.
func (r *relay) syncDeleted(ctx context.Context, w *watch, it *sourceSync) error {
	b := r.bucket.Load()
	_, err := w.idx.EndSync(func(o index.Object) error {
		w.counts.Deleted++
		ix := b.DeleteMsg(w.ixPrefix, o.UID)
		if !w.filter[event.Deleted] {
			w.filtered.Inc()
			return w.pipe.Submit(ctx, sink.Entry{Index: ix, ObjectKey: o.UID, Epoch: it.epoch})
		}
		msg, err := w.enc.Encode(&event.Change{
			Type: event.Deleted, Origin: event.OriginResync, Epoch: it.epoch, Time: it.readAt.UTC(),
			Resource: w.resource, FinalStateUnknown: true,
			Meta: event.Meta{UID: o.UID, Namespace: o.Namespace, Name: o.Name, ResourceVersion: o.ResourceVersion},
		})
		if err != nil {
			r.m.PublishErrors.WithLabelValues(w.src.Name, "unencodable").Inc()
			w.log.Error("delete cannot be encoded; NOT published", zap.String("object", o.Namespace+"/"+o.Name), zap.Error(err))
			return w.pipe.Submit(ctx, sink.Entry{Index: ix, ObjectKey: o.UID, Epoch: it.epoch})
		}
		return w.pipe.Submit(ctx, sink.Entry{Msg: &msg, Index: ix, ObjectKey: o.UID, Epoch: it.epoch,
			ReadAt: it.readAt, Type: event.Deleted, Origin: event.OriginResync})
	})
	w.setTracked(w.idx.Len())
	return err
}

type sourceSync struct {
	epoch  uint64
	readAt time.Time
}

// checkIndex compares the object index with a consistent LIST at exactly
// rv (the relist's resourceVersion): same uids, names and resourceVersions.
// Two indexes are compared: the bucket as read back from NATS, once every
// index write this watch submitted is acknowledged (what a restart would
// load: the one that matters), and the in-memory index. Each difference
// names the object, what the index has and what the list has, and is the
// only error returned (relayd stops on it). A check that cannot be made
// for now (the apiserver or NATS unreachable: the fault-injection suite
// kills them) is retried with backoff; one that can never be made (the
// list's resourceVersion compacted meanwhile, or relayd stopping) is
// logged as not made.
func (r *relay) checkIndex(ctx context.Context, w *watch, rv string) error {
	backoff := wait.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: 1 << 30, Cap: 5 * time.Second}
	for attempt := 1; ; attempt++ {
		err := r.checkIndexOnce(ctx, w, rv)
		var bad *indexMismatchError
		switch {
		case err == nil:
			return nil
		case errors.As(err, &bad):
			return err
		case ctx.Err() != nil:
			w.log.Warn("index consistency check not made: the watch is stopping", zap.String("resourceVersion", rv), zap.Error(err))
			return nil
		case apierrors.IsResourceExpired(err) || apierrors.IsGone(err):
			w.log.Warn("index consistency check not made: the list's resourceVersion was compacted", zap.String("resourceVersion", rv), zap.Error(err))
			return nil
		}
		d := backoff.Step()
		w.log.Warn("index consistency check could not read the list or the bucket; retrying", zap.String("resourceVersion", rv),
			zap.Int("attempt", attempt), zap.Duration("in", d), zap.Error(err))
		select {
		case <-ctx.Done():
			w.log.Warn("index consistency check not made: the watch is stopping", zap.String("resourceVersion", rv))
			return nil
		case <-time.After(d):
		}
	}
}

// indexMismatchError is a difference found by checkIndex (or a list it
// cannot read at all): retrying cannot help.
type indexMismatchError struct{ msg string }

func (e *indexMismatchError) Error() string { return e.msg }

func mismatch(format string, args ...any) error {
	return &indexMismatchError{msg: fmt.Sprintf(format, args...)}
}

func (r *relay) checkIndexOnce(ctx context.Context, w *watch, rv string) error {
	// The watch goroutine is the only submitter of w.pipe: Drain is safe
	// here, and afterwards the bucket holds every index write made so far.
	if err := w.pipe.Drain(ctx); err != nil {
		return fmt.Errorf("waiting for the index writes to be acknowledged: %w", err)
	}
	b := r.bucket.Load()
	stored := index.New()
	if _, err := b.Load(ctx, w.ixPrefix, stored); err != nil {
		return fmt.Errorf("reading the index bucket %q back (keys %s.*): %w", b.Name(), w.ixPrefix, err)
	}
	listed, err := r.listAt(ctx, w, rv)
	if err != nil {
		return err
	}
	for _, ix := range []struct {
		name string
		x    *index.Index
	}{{fmt.Sprintf("the index bucket %q", b.Name()), stored}, {"the in-memory index", w.idx}} {
		if err := compareIndex(ix.name, ix.x, listed, rv, w.fingerprint); err != nil {
			return err
		}
	}
	w.log.Info("index consistency check passed (bucket and memory)", zap.String("resourceVersion", rv), zap.String("objects", strconv.Itoa(len(listed))))
	return nil
}

// listedObject is one object of checkIndex's LIST.
type listedObject struct {
	meta        event.Meta
	fingerprint uint64 // with ignoreChanges
}

// listAt lists w's objects at exactly rv (relayd's own objects left out).
func (r *relay) listAt(ctx context.Context, w *watch, rv string) ([]listedObject, error) {
	client, err := r.restClient(w.resource)
	if err != nil {
		return nil, err
	}
	var out []listedObject
	cont := ""
	for {
		req := client.Get().Resource(w.resource.Resource).
			Param("resourceVersion", rv).Param("resourceVersionMatch", string(metav1.ResourceVersionMatchExact)).
			Param("limit", "500")
		if w.namespace != "" {
			req = req.Namespace(w.namespace)
		}
		if w.src.LabelSelector != "" {
			req = req.Param("labelSelector", w.src.LabelSelector)
		}
		if w.src.FieldSelector != "" {
			req = req.Param("fieldSelector", w.src.FieldSelector)
		}
		if cont != "" {
			req = req.Param("continue", cont)
		}
		body, err := source.RawResult(req.Do(ctx))
		if err != nil {
			return nil, fmt.Errorf("list at resourceVersion %s: %w", rv, err)
		}
		var page struct {
			Metadata metav1.ListMeta   `json:"metadata"`
			Items    []json.RawMessage `json:"items"`
		}
		if err := json.Unmarshal(body, &page); err != nil {
			return nil, mismatch("list at resourceVersion %s: cannot decode it: %v", rv, err)
		}
		for _, raw := range page.Items {
			o, err := event.ParseObjectShaped(raw, w.shaping)
			if err != nil {
				return nil, mismatch("list at resourceVersion %s: cannot parse an object: %v", rv, err)
			}
			if r.isSelf(w, &o.Meta) {
				continue
			}
			l := listedObject{meta: o.Meta}
			if w.fingerprint {
				l.fingerprint = o.Fingerprint(w.shaping)
			}
			out = append(out, l)
		}
		if cont = page.Metadata.Continue; cont == "" {
			return out, nil
		}
	}
}

// compareIndex checks index x (called name in errors) against listed.
func compareIndex(name string, x *index.Index, listed []listedObject, rv string, fingerprint bool) error {
	for _, l := range listed {
		m := &l.meta
		got, ok := x.Get(m.UID)
		if !ok {
			return mismatch("%s/%s (uid %s): %s does not have it; the list at %s has it at resourceVersion %s",
				m.Namespace, m.Name, m.UID, name, rv, m.ResourceVersion)
		}
		// With ignoreChanges the index keeps the published version of
		// an object that since changed only in ignored fields.
		sameContent := fingerprint && got.Fingerprint != 0 && got.Fingerprint == l.fingerprint
		if (got.ResourceVersion != m.ResourceVersion && !sameContent) || got.Name != m.Name || got.Namespace != m.Namespace {
			return mismatch("%s/%s (uid %s): %s has %s/%s at resourceVersion %s; the list at %s has %s/%s at resourceVersion %s",
				m.Namespace, m.Name, m.UID, name, got.Namespace, got.Name, got.ResourceVersion, rv, m.Namespace, m.Name, m.ResourceVersion)
		}
	}
	if n := x.Len(); n != len(listed) {
		in := make(map[string]bool, len(listed))
		for _, l := range listed {
			in[l.meta.UID] = true
		}
		var extra []string
		x.Range(func(o index.Object) bool {
			if !in[o.UID] {
				extra = append(extra, fmt.Sprintf("%s/%s (uid %s) at resourceVersion %s", o.Namespace, o.Name, o.UID, o.ResourceVersion))
			}
			return len(extra) < 10
		})
		return mismatch("%s has %d objects, the list at %s has %d: not in the list: %s", name, n, rv, len(listed), strings.Join(extra, ", "))
	}
	return nil
}

// heldIn is how many messages st holds with sequences in [lo, hi].
func heldIn(st jetstream.StreamState, lo, hi uint64) uint64 {
	if st.Msgs == 0 {
		return 0
	}
	lo, hi = max(lo, st.FirstSeq), min(hi, st.LastSeq)
	if lo > hi {
		return 0
	}
	n := hi - lo + 1
	for _, d := range st.Deleted {
		if d >= lo && d <= hi {
			n--
		}
	}
	return n
}
