package watch

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/relayd/relayd/internal/failpoint"
	"github.com/relayd/relayd/pkg/event"
	"github.com/relayd/relayd/pkg/index"
	"github.com/relayd/relayd/pkg/sink"
	"github.com/relayd/relayd/pkg/source"
)

// epochGate is the pipeline object key of a relist's epoch write and its
// sync.started: no uid (a NUL byte cannot be in one), so it only orders
// the two.
const epochGate = "\x00epoch"

// handle turns one source item into pipeline entries, keeping the object
// index.
func (w *Watch) handle(ctx context.Context, it *source.Item) error {
	failpoint.Inject(failpoint.RelayHandle)
	switch it.Kind {
	case source.ItemObject:
		w.lastRead.Store(it.ReadAt.UnixNano())
		w.beginHandling(it.ReadAt)
		if w.o.ObjectHook != nil {
			w.o.ObjectHook.HandlingObject(w, &it.Object.Meta)
		}
		e, submit, err := w.objectEntry(it)
		w.endHandling(&it.Object.Meta) // before the pipeline: a wait there is not the handling's (handling.go)
		if err != nil || !submit {
			return err
		}
		return w.submit(ctx, e)
	case source.ItemBookmark:
		return w.submit(ctx, sink.Entry{ResourceVersion: it.ResourceVersion, Epoch: it.Epoch, Bookmark: true})
	case source.ItemSyncStarted:
		return w.syncStarted(ctx, it)
	case source.ItemSyncCompleted:
		return w.syncCompleted(ctx, it)
	}
	return fmt.Errorf("unknown item kind %d", it.Kind)
}

// change is what the object index makes of an object item.
type change struct {
	typ      event.Type  // what is published (a list item's type comes from the index)
	scope    event.Scope // relaydscope: the object entered or left the source's filter
	publish  bool        // false: nothing is submitted (an unchanged list item)
	suppress bool        // only ignoreChanges fields changed: the position moves, nothing is published
	replay   bool        // a version older than the object's last on the stream: the position moves, nothing is published
	outside  bool        // out of the filter's scope, and was: the position moves, nothing is published
	indexed  bool        // the index changed: its bucket entry is written
}

// applyToIndex applies an object item to the index: live changes update it; a
// list item is compared with it (list frames are all ADDED; the index
// tells what they are). With a filter, the index holds the objects in
// its scope only (scope.go).
func (w *Watch) applyToIndex(it *source.Item, obj index.Object) change {
	x := w.ix.idx
	c := change{typ: it.Type, publish: true, indexed: true}
	if it.Origin == event.OriginWatch && w.replayed(obj) {
		return change{typ: it.Type, replay: true}
	}
	if w.scope.s != nil {
		var publish bool
		if c.typ, c.scope, publish = w.scoped(it, obj.UID); !publish {
			return w.outOfScope(it)
		}
	}
	if it.Origin == event.OriginWatch {
		switch {
		case c.typ == event.Deleted:
			c.indexed = x.Delete(obj.UID)
		case c.typ == event.Modified && x.Same(obj):
			// The index keeps the version that was.
			c.suppress, c.indexed = true, false
		default:
			c.indexed = x.Put(obj)
		}
		return c
	}
	w.counts.Total++
	if c.scope == event.ScopeLeft {
		w.counts.Deleted++
		c.indexed = x.Delete(obj.UID)
		return c
	}
	switch x.Observe(obj) {
	case index.Unchanged:
		w.counts.Unchanged++
		// Already published; list items do not move the position. A full
		// resync publishes it again, as modified (request.go).
		c.typ, c.publish, c.indexed = event.Modified, w.full, false
	case index.Added:
		c.typ = event.Added
		w.counts.Added++
	case index.Modified:
		c.typ = event.Modified
		w.counts.Modified++
	}
	return c
}

// objectEntry handles an object change or a listed object: the entry to
// submit, if any (submit false: nothing, not even a position move).
func (w *Watch) objectEntry(it *source.Item) (e sink.Entry, submit bool, err error) {
	meta := &it.Object.Meta
	if w.o.Self.IsSelf(w.resource, meta) {
		// Not even a position move: see checkpoint's package doc.
		return e, false, nil
	}
	obj := index.Object{UID: meta.UID, Namespace: meta.Namespace, Name: meta.Name, ResourceVersion: meta.ResourceVersion}
	if w.fp != nil {
		obj.Fingerprint = w.fp.Fingerprint(&it.Object)
	}
	// Who made the change: the managedFields entries that differ from the
	// version the index holds (docs/CONSUMING.md, "Who changed it").
	// managedFields record writes, not deletes: a delete names nobody.
	var author event.Author
	if it.Type != event.Deleted {
		author, obj.Managers = it.Object.AuthorSince(w.ix.idx.Managers(meta.UID))
	}
	changed := w.pathChanges(it, &obj)
	c := w.applyToIndex(it, obj)
	switch {
	case c.suppress:
		w.suppressed.Inc()
		return sink.Entry{ObjectKey: meta.UID, ResourceVersion: it.ResourceVersion, Epoch: it.Epoch}, true, nil
	case c.replay, c.outside:
		return sink.Entry{ObjectKey: meta.UID, ResourceVersion: it.ResourceVersion, Epoch: it.Epoch}, true, nil
	case !c.publish:
		return e, false, nil
	}
	w.setTracked(w.ix.idx.Len())
	// The index write; none when the index already had this (a replay
	// after a restart, or a delete of an object it never knew).
	var ix *event.Message
	if c.indexed {
		if c.typ == event.Deleted {
			ix = w.o.Bucket.DeleteMsg(w.ix.prefix, meta.UID)
		} else {
			ix = w.o.Bucket.PutMsg(w.ix.prefix, obj)
		}
	}
	e = sink.Entry{FollowUp: ix, ObjectKey: meta.UID, ResourceVersion: it.ResourceVersion, Epoch: it.Epoch}
	if !w.filter[c.typ] {
		w.filtered.Inc()
		return e, true, nil
	}
	var buf *[]byte // binary mode: the payload is the event's body, not reusable
	if !w.enc.Options().Binary {
		buf = payloadBufs.Get().(*[]byte)
	}
	data, dropped := it.Object.AppendShaped(payloadBuf(buf), event.PayloadMode(w.o.Source.Payload), w.o.Shaping)
	ch := event.Change{
		Type: c.typ, Origin: it.Origin, Epoch: it.Epoch, Time: it.ReadAt.UTC(),
		Resource: w.resource, Meta: *meta, Payload: event.PayloadMode(w.o.Source.Payload), Data: data, Dropped: dropped,
	}
	ch.Author, ch.Scope = author, c.scope
	if c.typ == event.Modified {
		ch.Changed = changed
	}
	if w.full && it.Origin == event.OriginResync {
		ch.IDSuffix = fullID(it.Epoch)
	}
	msg, err := w.encode(&ch, len(it.Object.Raw))
	if buf != nil && cap(data) <= maxKeptPayload { // the encoder copied it
		*buf = data[:0]
		payloadBufs.Put(buf)
	}
	if err != nil {
		return e, false, err
	}
	w.replayID(&msg)
	e.Msg, e.ReadAt, e.Type, e.Origin = &msg, it.ReadAt, c.typ, it.Origin
	return e, true, nil
}

// payloadBufs are the buffers a structured event's payload is built in
// before the encoder copies it into the event: shared by every watch, so
// that building a payload allocates nothing and a quiet watch holds no
// buffer (docs/PERFORMANCE.md, "What bounds it" and "Memory per watch").
var payloadBufs = sync.Pool{New: func() any { return new([]byte) }}

// payloadBuf is the empty buffer of b (nil: none).
func payloadBuf(b *[]byte) []byte {
	if b == nil {
		return nil
	}
	return (*b)[:0]
}

// maxKeptPayload bounds the buffers kept in payloadBufs: a rare huge
// object's buffer is collected, not kept.
const maxKeptPayload = 256 << 10

// errUnencodable marks a change that cannot be published at all.
var errUnencodable = errors.New("change cannot be published")

// encode builds the message of c (an object of size bytes, 0 if unknown)
// and reports how far it had to shrink: to the reference (oversize), or to
// no data at all (unencodable: even the reference exceeds the NATS max
// payload; the event still names the change, docs/CONSUMING.md). A change
// that cannot be published even so (or an invalid one) is an error: it is
// neither published nor skipped, the watch restarts from its acknowledged
// position and stalls there until the NATS max payload is raised
// (docs/GUARANTEES.md, "Other decisions an operator should know").
func (w *Watch) encode(c *event.Change, size int) (event.Message, error) {
	msg, err := w.enc.Encode(c)
	obj := zap.String("object", c.Meta.Namespace+"/"+c.Meta.Name)
	if err == nil && msg.Truncated {
		w.log.Warn("the object's managedFields or changedPaths exceed the extensions' caps; sent with them truncated (relaydtruncated)", obj,
			zap.String("uid", c.Meta.UID), zap.String("resourceVersion", c.Meta.ResourceVersion))
	}
	switch {
	case err != nil:
		w.o.Metrics.Sink.PublishErrors.WithLabelValues(w.o.Source.Name, "unencodable").Inc()
		w.log.Error("change cannot be published, not even without its data; the source stalls here (raise the NATS max payload)", obj,
			zap.String("uid", c.Meta.UID), zap.String("resourceVersion", c.Meta.ResourceVersion), zap.Error(err))
		return msg, fmt.Errorf("%w: %w", errUnencodable, err)
	case msg.Unencodable:
		w.o.Metrics.Unencodable.WithLabelValues(w.o.Source.Name).Inc()
		w.log.Error("even the object's reference exceeds the NATS max payload; sent without data (relaydunencodable)", obj,
			zap.String("uid", c.Meta.UID), zap.String("resourceVersion", c.Meta.ResourceVersion), zap.Int("bytes", msg.Size()))
	case msg.Oversize:
		w.o.Metrics.Oversize.WithLabelValues(w.o.Source.Name).Inc()
		w.log.Warn("object exceeds the NATS max payload; sent as a reference", obj, zap.Int("bytes", size))
	}
	return msg, nil
}

// replayed reports whether a watch event of obj replays a version older
// than the last one of obj on the stream (indexState.fences). Each of those
// was published then, or suppressed by ignoreChanges: published again now,
// a suppressed one would get a Nats-Msg-Id JetStream never saw and be
// stored after the newer version, even after the object's delete. The
// fence falls at the first event at or past its resourceVersion; an
// unparsable resourceVersion lifts it (publishing again, as before,
// rather than guessing an order).
func (w *Watch) replayed(obj index.Object) bool {
	last, ok := w.ix.fences[obj.UID]
	if !ok {
		return false
	}
	a, aerr := strconv.ParseUint(obj.ResourceVersion, 10, 64)
	b, berr := strconv.ParseUint(last, 10, 64)
	if aerr == nil && berr == nil && a < b {
		return true
	}
	delete(w.ix.fences, obj.UID)
	return false
}

// replayID gives msg the Nats-Msg-Id an older relayd stored the same change
// with, if it did (indexState.legacy).
func (w *Watch) replayID(msg *event.Message) {
	if len(w.ix.legacy) == 0 {
		return
	}
	if _, ok := w.ix.legacy[w.enc.ID(msg)]; ok {
		w.enc.UseLegacyMsgID(msg)
	}
}

// control builds a sync marker. It names the watched resource and the
// source's selectors, which a consumer's reconcile LIST needs
// (docs/CONSUMING.md, "The sync markers").
func (w *Watch) control(s event.SyncEvent) event.Message {
	s.Resource = w.resource
	s.LabelSelector, s.FieldSelector = w.o.Source.LabelSelector, w.o.Source.FieldSelector
	msg := w.enc.Control(s)
	w.replayID(&msg)
	return msg
}

// submit hands e to the pipeline. While the watch replays what its
// previous run stored after the checkpoint (up to the highest
// resourceVersion among its fences), the positions it reaches keep that
// checkpoint's stream sequence: the replays are
// duplicates of messages stored before the ones this process acks, and a
// crash must catch up from where they are, or it would miss their fences
// (sink.Entry.StreamSeqCap).
func (w *Watch) submit(ctx context.Context, e sink.Entry) error {
	if w.ix.fenceUntil > 0 {
		if rv, err := strconv.ParseUint(e.ResourceVersion, 10, 64); err != nil || rv <= w.ix.fenceUntil {
			e.StreamSeqCap = w.ix.fenceFrom
		} else {
			w.ix.fenceUntil = 0 // past every message stored after the checkpoint
		}
	}
	return w.pipe.Submit(ctx, e)
}

// Replaying reports whether the watch has not yet passed every object's
// last message that an earlier run stored after the checkpoint. Call it
// from the watch's goroutine, or once Supervise returned.
func (w *Watch) Replaying() bool { return w.ix.fenceUntil > 0 }

// syncStarted begins comparing a list with the index and publishes
// sync.started, after recording its epoch in the bucket.
func (w *Watch) syncStarted(ctx context.Context, it *source.Item) error {
	w.ix.fences = nil // a list compares with the index instead
	w.ix.idx.BeginSync()
	w.counts, w.full = event.SyncCounts{}, it.Sync.Full
	w.scope.reason = it.Sync.Reason
	w.o.Metrics.ResyncMarkers.WithLabelValues(w.o.Source.Name, "started").Inc()
	msg := w.control(it.Sync)
	// The epoch goes into the bucket before sync.started is published (the
	// shared key makes Submit wait for the write's ack): were relayd to die
	// between the two the other way round, the next relist would reuse this
	// epoch, and JetStream would drop its markers as duplicates of this
	// one's. A skipped epoch is harmless.
	if err := w.submit(ctx, sink.Entry{FollowUp: w.o.Bucket.EpochMsg(w.ix.prefix, it.Epoch), ObjectKey: epochGate, Epoch: it.Epoch}); err != nil {
		return err
	}
	if err := w.submit(ctx, sink.Entry{Msg: &msg, ObjectKey: epochGate, Epoch: it.Epoch, ReadAt: it.ReadAt}); err != nil {
		return err
	}
	// The list's events are bracketed on the stream, not only in the order
	// they are published: a publish that failed is retried after the ones
	// behind it, so sync.started is acknowledged before the first listed
	// object goes out (docs/CONSUMING.md, "No silent gap").
	return w.pipe.Drain(ctx)
}

// syncCompleted ends a list: the indexed objects it did not contain are
// published as deleted, then sync.completed with the counts.
func (w *Watch) syncCompleted(ctx context.Context, it *source.Item) error {
	if err := w.syncDeleted(ctx, it.Epoch, it.ReadAt); err != nil {
		return err
	}
	// Every event of the list is stored before sync.completed is published
	// (see syncStarted).
	if err := w.pipe.Drain(ctx); err != nil {
		return err
	}
	it.Sync.Counts = w.counts
	// The index holds the current filter's scope now: the checkpoint this
	// sync.completed advances says so (scope.go).
	w.scope.reason = ""
	w.scope.setAcked(w.scope.s.Hash())
	w.o.Metrics.ResyncMarkers.WithLabelValues(w.o.Source.Name, "completed").Inc()
	msg := w.control(it.Sync)
	if err := w.submit(ctx, sink.Entry{Msg: &msg, ResourceVersion: it.ResourceVersion, Epoch: it.Epoch, ReadAt: it.ReadAt}); err != nil {
		return err
	}
	w.ix.relist, w.full = "", false
	w.requestCompleted(&it.Sync)
	w.log.Info("relist compared with the object index", zap.String("reason", string(it.Sync.Reason)), zap.Uint64("epoch", it.Epoch),
		zap.Int64("added", w.counts.Added), zap.Int64("modified", w.counts.Modified), zap.Int64("deleted", w.counts.Deleted),
		zap.Int64("unchanged", w.counts.Unchanged), zap.Int("indexed", w.ix.idx.Len()))
	if w.o.AfterRelist == nil {
		return nil
	}
	return w.o.AfterRelist.AfterRelist(ctx, Relisted{
		Watch: w.String(), Source: w.o.Source, Namespace: w.o.Namespace, Resource: w.resource, Shaping: w.o.Shaping,
		ResourceVersion: it.ResourceVersion, Index: w.ix.idx, IndexPrefix: w.ix.prefix, Fingerprinter: w.fp, Scope: w.scope.s,
		Pipe: w.pipe, Log: w.log,
	})
}

// syncDeleted publishes a delete (origin resync, final state unknown) for
// every indexed object the relist did not contain.
func (w *Watch) syncDeleted(ctx context.Context, epoch uint64, readAt time.Time) error {
	b := w.o.Bucket
	_, err := w.ix.idx.EndSync(func(o index.Object) error {
		w.counts.Deleted++
		e := sink.Entry{FollowUp: b.DeleteMsg(w.ix.prefix, o.UID), ObjectKey: o.UID, Epoch: epoch}
		if !w.filter[event.Deleted] {
			w.filtered.Inc()
			return w.submit(ctx, e)
		}
		msg, err := w.encode(&event.Change{
			Type: event.Deleted, Origin: event.OriginResync, Epoch: epoch, Time: readAt.UTC(),
			Resource: w.resource, FinalStateUnknown: true,
			Meta: event.Meta{UID: o.UID, Namespace: o.Namespace, Name: o.Name, ResourceVersion: o.ResourceVersion},
		}, 0)
		if err != nil {
			return err
		}
		w.replayID(&msg)
		e.Msg, e.ReadAt, e.Type, e.Origin = &msg, readAt, event.Deleted, event.OriginResync
		return w.submit(ctx, e)
	})
	w.setTracked(w.ix.idx.Len())
	return err
}
