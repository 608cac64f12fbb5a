package index

import "github.com/relayd/relayd/pkg/event"

// Recovery is what a watch finds at start, the input of PlanRecovery: its
// checkpoint (if any) and the state of the index bucket.
type Recovery struct {
	// Corrupt: some of the watch's entries in the bucket could not be read
	// (they are removed).
	Corrupt bool
	// Loaded is the number of the watch's objects the bucket holds.
	Loaded int
	// Listed: the bucket records an epoch for the watch, so relayd listed
	// or watched it before (its index may be empty: nothing matched yet).
	Listed bool
	// Bucket is the bucket's generation and last sequence.
	Bucket Generation
	// HasCheckpoint: the watch has a checkpoint. CheckpointIndex is the
	// index state it was written with (nil: it predates the object index),
	// StreamSeq its event-stream sequence (0: it predates stream
	// sequences).
	HasCheckpoint   bool
	CheckpointIndex *Ref
	StreamSeq       uint64
}

// Ref is an index state recorded by a checkpoint (checkpoint.Position.Index,
// stored as JSON): the bucket generation (Generation.ID) and the last index
// write acked into it.
type Ref struct {
	Generation string `json:"generation"`
	Seq        uint64 `json:"seq"`
}

// Plan is how a watch starts (docs/GUARANTEES.md, "When the bucket is
// missing, recreated, behind or corrupt").
type Plan struct {
	// Relist is the reason of the list the watch must start with:
	// event.RelistIndexLost, event.RelistNoCheckpoint, or "" (resume
	// from the checkpoint, or, without one, start per the source's
	// initial setting).
	Relist event.RelistReason
	// Why says, for an index-lost relist, what was found; "" otherwise.
	Why string
	// CatchUpFrom is the event-stream sequence to read the stream from
	// into the index before anything else (0: no catch-up; 1: the whole
	// stream, when nothing bounds what the bucket may lack: WholeStream).
	CatchUpFrom uint64
	WholeStream bool
	// SeqFloor is the checkpoint's index sequence when the bucket is
	// trusted: later checkpoints never record less.
	SeqFloor uint64
}

// PlanRecovery decides, from what the watch found at start, whether its
// index can be trusted for its checkpoint, which list it starts with, and
// from where the index catches up with the event stream. It does no I/O.
func PlanRecovery(r Recovery) Plan {
	var p Plan
	cp := r.CheckpointIndex
	switch {
	case r.Corrupt:
		p.Relist, p.Why = event.RelistIndexLost, "the index has entries that cannot be read; they are removed and the source relists"
	case r.HasCheckpoint && cp == nil:
		p.Relist, p.Why = event.RelistIndexLost, "the checkpoint predates the object index; relisting once to build it (sync markers tell consumers)"
	case r.HasCheckpoint && cp.Generation != r.Bucket.ID:
		p.Relist, p.Why = event.RelistIndexLost, "the index bucket is not the one the checkpoint was written with (deleted or recreated); relisting: deletes during the downtime may be missing, which the sync markers' reason (index-lost) says"
	case r.HasCheckpoint && r.Bucket.LastSeq < cp.Seq:
		p.Relist, p.Why = event.RelistIndexLost, "the index bucket is behind the checkpoint (restored or lost writes); relisting: deletes during the downtime may be missing, which the sync markers' reason (index-lost) says"
	case r.HasCheckpoint:
		p.SeqFloor = cp.Seq
	case r.Loaded > 0 || r.Listed:
		// relayd knew the watch (objects, or an earlier list): its
		// checkpoint was removed, not never written.
		p.Relist = event.RelistNoCheckpoint
	}
	switch {
	case p.Relist == event.RelistIndexLost:
		// The bucket is rebuilt by a full, marked resync.
	case r.HasCheckpoint && r.StreamSeq > 0:
		p.CatchUpFrom = r.StreamSeq
	case r.HasCheckpoint || p.Relist == event.RelistNoCheckpoint:
		// The bucket is kept but nothing bounds the stream messages it
		// may lack (the checkpoint is gone, or predates stream
		// sequences): read the whole stream, once. The list that follows
		// compares with the index, so it must be complete.
		p.CatchUpFrom, p.WholeStream = 1, true
	}
	return p
}
