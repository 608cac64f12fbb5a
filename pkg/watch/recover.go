package watch

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"

	"go.uber.org/zap"

	"github.com/relayd/relayd/pkg/checkpoint"
	"github.com/relayd/relayd/pkg/event"
	"github.com/relayd/relayd/pkg/index"
	"github.com/relayd/relayd/pkg/sink"
)

// loadIndex fills the watch's index from the bucket. The first load also
// decides whether the index can be trusted for the checkpoint (see
// recoverIndex), and returns the reason of the list the watch must start
// with ("" for none).
func (w *Watch) loadIndex(ctx context.Context) (relist event.RelistReason, err error) {
	b := w.o.Bucket
	if w.ix.idx != nil {
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
	x := index.New().WithPaths(w.o.Shaping.NumChangedPaths(), w.paths.set)
	l, err := b.Load(ctx, w.ix.prefix, x)
	n := l.Objects
	var corrupt *index.CorruptError
	if errors.As(err, &corrupt) {
		w.log.Error("the index has entries that cannot be read; they are removed and the source relists", zap.Strings("keys", corrupt.Keys), zap.Error(err))
		for _, k := range corrupt.Keys {
			if err := w.pipe.Submit(ctx, sink.Entry{FollowUp: b.DeleteKeyMsg(k)}); err != nil {
				return "", err
			}
		}
	} else if err != nil {
		return "", err
	}
	if err := w.dropOtherKeyFingerprints(ctx, x, l.OtherKey); err != nil {
		return "", err
	}
	first := w.ix.idx == nil
	w.ix.idx, w.ix.gen = x, gen.ID
	w.setTracked(x.Len())
	if !first {
		// Resumes from the watermark; the bucket holds every acked write.
		w.log.Info("object index loaded", zap.Int("objects", n), zap.String("bucket", b.Name()))
		return "", nil
	}
	in := index.Recovery{Corrupt: corrupt != nil, Loaded: n, Bucket: gen}
	if relist, err = w.recoverIndex(ctx, in); err != nil {
		// The first load decides the relist, the epoch floor and the
		// catch-up: a retry after a failure (a NATS timeout, a refused
		// request) must do all of it again, not take the reload path.
		w.ix.idx, w.ix.gen = nil, ""
		return "", err
	}
	w.log.Info("object index loaded", zap.Int("objects", n), zap.String("bucket", b.Name()), zap.String("relist", string(relist)))
	return relist, nil
}

// dropOtherKeyFingerprints rewrites, without their fingerprint, the bucket
// entries of the uids Load found fingerprinted under another key than this
// relayd's (nats.index.fingerprintKeyFile set, changed or removed): x has
// them with fingerprint 0 already, and the bucket no longer keeps a hash
// made without the current key (docs/GUARANTEES.md, "Fingerprints").
func (w *Watch) dropOtherKeyFingerprints(ctx context.Context, x *index.Index, uids []string) error {
	if len(uids) == 0 {
		return nil
	}
	b := w.o.Bucket
	for _, uid := range uids {
		o, ok := x.Get(uid)
		if !ok {
			continue
		}
		if err := w.pipe.Submit(ctx, sink.Entry{FollowUp: b.PutMsg(w.ix.prefix, o), ObjectKey: uid}); err != nil {
			return err
		}
	}
	w.log.Warn("the object index has fingerprints made under another fingerprint key (or none); they are removed, and each of these objects is published at its next change, even one confined to ignoreChanges",
		zap.Int("entries", len(uids)), zap.String("bucket", b.Name()))
	return nil
}

// recoverIndex is the first load's recovery: it plans it from the
// checkpoint and what the bucket held (index.PlanRecovery), reads the epoch
// floor, and catches the index up with the event stream. It returns the
// reason of the list the watch must start with.
func (w *Watch) recoverIndex(ctx context.Context, in index.Recovery) (event.RelistReason, error) {
	pos, hasCP := w.o.Positions.Get(w.key)
	in.HasCheckpoint, in.StreamSeq = hasCP, pos.StreamSeq
	if pos.Index != nil {
		in.CheckpointIndex = pos.Index
	}
	// Keep relaydepoch increasing when the checkpoint is gone, and when it
	// is behind: the bucket records the epoch with every sync.started, the
	// checkpoint only when the watermark moves, so after a crash during or
	// right after a relist the bucket is ahead. Reusing that epoch would
	// give the next relist's sync markers the crashed run's Nats-Msg-Ids,
	// and JetStream would drop them as duplicates: a gap without markers.
	var err error
	if w.ix.epochFloor, w.ix.epochRecorded, err = w.o.Bucket.Epoch(ctx, w.ix.prefix); err != nil {
		return "", err
	}
	in.Listed = w.ix.epochRecorded
	plan := index.PlanRecovery(in)
	if plan.Why != "" && !in.Corrupt { // corrupt entries are logged by loadIndex
		w.log.Warn(plan.Why, planFields(in.Bucket, pos)...)
	}
	plan.Relist = w.scopeChanged(hasCP, pos, plan.Relist)
	w.ix.seqFloor = plan.SeqFloor
	if plan.WholeStream {
		w.log.Info("no stream sequence to catch the object index up from; reading the whole event stream")
	}
	if err := w.catchUp(ctx, plan.CatchUpFrom, !plan.WholeStream); err != nil {
		return "", fmt.Errorf("catching the index up with stream %q: %w", w.o.Config.NATS.Stream.Name, err)
	}
	if plan.Relist == event.RelistIndexLost && pos.StreamSeq > 0 {
		// A lost bucket took its epoch floor with it, and a run that
		// crashed during a relist left a higher epoch than the checkpoint's
		// on the stream only: read it there, from the checkpoint on.
		res, err := w.o.Events.CatchUp(ctx, w.log, w.ix.idx, index.CatchUpOf{Source: w.o.Source.Name, Namespace: w.o.Namespace, From: pos.StreamSeq, EpochOnly: true})
		if err != nil {
			return "", fmt.Errorf("reading the last epoch from stream %q: %w", w.o.Config.NATS.Stream.Name, err)
		}
		w.ix.epochFloor = max(w.ix.epochFloor, res.Epoch)
	}
	return plan.Relist, nil
}

// planFields are the log fields of a recovery plan's finding.
func planFields(gen index.Generation, pos checkpoint.Position) []zap.Field {
	fields := []zap.Field{zap.String("bucketGeneration", gen.ID), zap.Uint64("bucketLastSeq", gen.LastSeq)}
	if pos.Index != nil {
		fields = append(fields, zap.String("checkpointGeneration", pos.Index.Generation), zap.Uint64("checkpointSeq", pos.Index.Seq))
	}
	return fields
}

// catchUp applies the event stream from sequence from on to the index
// (index.CatchUpReader.CatchUp; 0: nothing to read) and submits the bucket
// entries it corrected. With legacy (a resume from the checkpoint), it
// keeps the ids the replay must publish with an older relayd's Nats-Msg-Id.
func (w *Watch) catchUp(ctx context.Context, from uint64, legacy bool) error {
	w.ix.fences = nil
	res, err := w.o.Events.CatchUp(ctx, w.log, w.ix.idx, index.CatchUpOf{Source: w.o.Source.Name, Namespace: w.o.Namespace, From: from, Legacy: legacy})
	if err != nil || from == 0 || from > res.To {
		return err
	}
	w.ix.epochFloor = max(w.ix.epochFloor, res.Epoch)
	w.ix.fences, w.ix.fenceFrom, w.ix.fenceUntil = res.Last, from, 0
	for _, rv := range res.Last {
		n, err := strconv.ParseUint(rv, 10, 64)
		if err != nil {
			n = math.MaxUint64 // not comparable: keep the checkpoint's sequence
		}
		w.ix.fenceUntil = max(w.ix.fenceUntil, n)
	}
	if w.ix.legacy = res.Legacy; len(res.Legacy) > 0 {
		w.log.Info("changes after the checkpoint were stored by an older relayd; their replays keep its Nats-Msg-Ids",
			zap.Int("changes", len(res.Legacy)))
	}
	b := w.o.Bucket
	for _, f := range res.Fixes {
		var msg *event.Message
		if f.Deleted {
			msg = b.DeleteMsg(w.ix.prefix, f.UID)
		} else {
			msg = b.PutMsg(w.ix.prefix, f.Object)
		}
		if err := w.pipe.Submit(ctx, sink.Entry{FollowUp: msg, ObjectKey: f.UID}); err != nil {
			return err
		}
	}
	w.setTracked(w.ix.idx.Len())
	fields := []zap.Field{zap.Uint64("fromStreamSeq", from), zap.Uint64("toStreamSeq", res.To), zap.Int("messagesRead", res.Read)}
	if len(res.Fixes) > 0 {
		w.log.Warn("object index was behind the stream; caught up",
			append(fields, zap.Int("entriesFixed", len(res.Fixes)), zap.String("cause", "relayd stopped between a PubAck and its index write"))...)
	} else {
		w.log.Debug("object index matches the stream", fields...)
	}
	return nil
}
