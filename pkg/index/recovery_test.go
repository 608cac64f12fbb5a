package index

import (
	"strings"
	"testing"

	"github.com/relayd/relayd/pkg/event"
)

// Every row of docs/GUARANTEES.md, "When the bucket is missing, recreated,
// behind or corrupt", and the plain cases around them; no servers.
func TestPlanRecovery(t *testing.T) {
	bucket := Generation{ID: "gen-2", LastSeq: 500}
	cp := func(gen string, seq uint64) *Ref { return &Ref{Generation: gen, Seq: seq} }
	for _, tc := range []struct {
		name string
		in   Recovery
		want Plan
		why  string // a word the reason must hold
	}{
		{"first start: no checkpoint, empty bucket (initial per the source)",
			Recovery{Bucket: bucket}, Plan{}, ""},
		{"bucket missing (created empty now), no checkpoint: same as a first start",
			Recovery{Bucket: Generation{ID: "new"}}, Plan{}, ""},
		{"restart: checkpoint and bucket agree, stream sequence known",
			Recovery{Loaded: 10, Bucket: bucket, HasCheckpoint: true, CheckpointIndex: cp("gen-2", 480), StreamSeq: 9000},
			Plan{CatchUpFrom: 9000, SeqFloor: 480}, ""},
		{"restart: bucket exactly at the checkpoint",
			Recovery{Loaded: 10, Bucket: bucket, HasCheckpoint: true, CheckpointIndex: cp("gen-2", 500), StreamSeq: 1},
			Plan{CatchUpFrom: 1, SeqFloor: 500}, ""},
		{"checkpoint predates stream sequences: catch up from the whole stream",
			Recovery{Loaded: 10, Bucket: bucket, HasCheckpoint: true, CheckpointIndex: cp("gen-2", 480)},
			Plan{CatchUpFrom: 1, WholeStream: true, SeqFloor: 480}, ""},
		{"checkpoint lost, bucket kept: no-checkpoint list compared with the index, after reading the whole stream",
			Recovery{Loaded: 10, Bucket: bucket}, Plan{Relist: event.RelistNoCheckpoint, CatchUpFrom: 1, WholeStream: true}, ""},
		{"checkpoint lost, bucket kept with no objects but an earlier list's epoch: no-checkpoint, not initial",
			Recovery{Listed: true, Bucket: bucket}, Plan{Relist: event.RelistNoCheckpoint, CatchUpFrom: 1, WholeStream: true}, ""},
		{"bucket deleted and recreated (another generation)",
			Recovery{Bucket: Generation{ID: "gen-3", LastSeq: 0}, HasCheckpoint: true, CheckpointIndex: cp("gen-2", 480), StreamSeq: 9000},
			Plan{Relist: event.RelistIndexLost}, "recreated"},
		{"bucket behind the checkpoint (restored from a backup, lost writes)",
			Recovery{Loaded: 8, Bucket: Generation{ID: "gen-2", LastSeq: 470}, HasCheckpoint: true, CheckpointIndex: cp("gen-2", 480), StreamSeq: 9000},
			Plan{Relist: event.RelistIndexLost}, "behind"},
		{"unreadable entries, whatever the checkpoint says",
			Recovery{Corrupt: true, Loaded: 9, Bucket: bucket, HasCheckpoint: true, CheckpointIndex: cp("gen-2", 480), StreamSeq: 9000},
			Plan{Relist: event.RelistIndexLost}, "cannot be read"},
		{"unreadable entries without a checkpoint",
			Recovery{Corrupt: true, Loaded: 9, Bucket: bucket}, Plan{Relist: event.RelistIndexLost}, "cannot be read"},
		{"checkpoint written before relayd kept an index",
			Recovery{Bucket: bucket, HasCheckpoint: true, StreamSeq: 0}, Plan{Relist: event.RelistIndexLost}, "predates"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := PlanRecovery(tc.in)
			why := got.Why
			got.Why = ""
			if got != tc.want {
				t.Errorf("PlanRecovery(%+v) = %+v, want %+v", tc.in, got, tc.want)
			}
			if (tc.why == "") != (why == "") || !strings.Contains(why, tc.why) {
				t.Errorf("Why = %q, want one with %q", why, tc.why)
			}
		})
	}
}
