package watch

import (
	"time"

	"github.com/relayd/relayd/pkg/sink"
)

// Beat is what a running watch's heartbeat carries (pkg/heartbeat,
// docs/CONSUMING.md "Heartbeats").
type Beat struct {
	// ResourceVersion and Epoch are the watch's checkpointed position, as
	// written in the checkpoint ConfigMap (where a restart resumes; "" before
	// the first write).
	ResourceVersion string
	Epoch           uint64
	// LastRead is when the watch last read a change (zero: none since it
	// started on this replica).
	LastRead time.Time
	// Progress is its pipeline's (StreamSeq: the last event acknowledged).
	Progress sink.Progress
}

// Beat returns the watch's heartbeat, and false while it is not running:
// its watch request is not established (starting, relisting with a paged
// LIST, retrying, stopped). Safe from any goroutine; it writes nothing.
func (w *Watch) Beat() (Beat, bool) {
	if !w.up.Load() {
		return Beat{}, false
	}
	b := Beat{Progress: w.pipe.Progress()}
	if pos, ok := w.o.Positions.Stored(w.key); ok {
		b.ResourceVersion, b.Epoch = pos.ResourceVersion, pos.Epoch
	}
	if ns := w.lastRead.Load(); ns != 0 {
		b.LastRead = time.Unix(0, ns)
	}
	return b, true
}
