package scenario

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/relayd/relayd/internal/chaos/history"
)

// recoveryState is what the faults that delete relayd's recovery state
// need: the checkpoint ConfigMap (namespace, name "cp") and its keys, and
// the index bucket (config default: relayd-index-<cluster>, see
// docs/GUARANTEES.md, "Persistence").
type recoveryState struct {
	cs     kubernetes.Interface
	ns     string
	keys   []string // sorted
	bucket string
}

func newRecoveryState(cs kubernetes.Interface, ns string, keys map[string]string, bucket string) recoveryState {
	k := make([]string, 0, len(keys))
	for key := range keys {
		k = append(k, key)
	}
	slices.Sort(k)
	return recoveryState{cs: cs, ns: ns, keys: k, bucket: bucket}
}

// DeleteCheckpointKeys deletes some of the checkpoint ConfigMap's keys
// (each with probability 1/2, at least one; a JSON merge patch, so a
// concurrent checkpoint write of relayd conflicts and is retried rather
// than lost). The fault (checkpoint-deleted) is recorded before the
// delete. relayd, if running, writes a key again at its next flush; a
// relayd (re)started without it relists (no-checkpoint).
func (r *Run) DeleteCheckpointKeys(ctx context.Context) {
	var keys []string
	for _, k := range r.rec.keys {
		if r.Rng.IntN(2) == 0 {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		keys = []string{r.rec.keys[r.Rng.IntN(len(r.rec.keys))]}
	}
	patch := map[string]any{}
	for _, k := range keys {
		patch[k] = nil
	}
	r.Fault(history.FaultCheckpointDeleted, strings.Join(keys, ","))
	b, err := json.Marshal(map[string]any{"data": patch})
	if err != nil {
		r.Fault("error", fmt.Sprintf("%s: %v", history.FaultCheckpointDeleted, err))
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if _, err := r.rec.cs.CoreV1().ConfigMaps(r.rec.ns).Patch(ctx, "cp", types.MergePatchType, b, metav1.PatchOptions{}); err != nil {
		r.Fault("error", fmt.Sprintf("%s: %v", history.FaultCheckpointDeleted, err))
	}
}

// DeleteBucket deletes the index bucket, if it exists (relayd killed
// right after a restart may not have created it again yet: then nothing
// is injected, and it reports false). The fault (bucket-deleted) is
// recorded before the delete. relayd creates the bucket again when it
// (re)starts and relists every source (index-lost).
func (r *Run) DeleteBucket(ctx context.Context, detail string) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	ok, err := r.BucketExists(ctx)
	if err != nil || !ok {
		if r.Env.Logf != nil {
			r.Env.Logf("index bucket %s not deleted (%s): exists %v (%v)", r.rec.bucket, detail, ok, err)
		}
		return false
	}
	r.Fault(history.FaultBucketDeleted, detail)
	if err := r.js.DeleteKeyValue(ctx, r.rec.bucket); err != nil {
		r.Fault("error", fmt.Sprintf("%s %s: %v", history.FaultBucketDeleted, r.rec.bucket, err))
		return false
	}
	return true
}

// BucketExists reports whether the index bucket exists.
func (r *Run) BucketExists(ctx context.Context) (bool, error) {
	_, err := r.js.KeyValue(ctx, r.rec.bucket)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, jetstream.ErrBucketNotFound):
		return false, nil
	}
	return false, err
}

// recoveryScenarios delete relayd's recovery state — the checkpoint
// (relist no-checkpoint) or the index bucket (relist index-lost) — and
// the checker verifies those relists like a 410's: the gap covered, the
// state published, deletes reported (an index-lost relist may miss
// deletes: docs/GUARANTEES.md, "When the bucket is missing, recreated,
// behind or corrupt").
var recoveryScenarios = []Scenario{
	{
		// Deleted while relayd is down (it starts without the keys), or
		// while it runs and killed 0–0.4 s later (it may have written a
		// key again by then: no relist for that source).
		Name: "checkpoint-deleted", MinFaults: 4,
		Faults: func(ctx context.Context, r *Run) {
			for i := 0; quiet(ctx, r); i++ {
				if i%2 == 0 {
					r.Down(ctx, r.Between(500*time.Millisecond, 1500*time.Millisecond), func() { r.DeleteCheckpointKeys(ctx) })
					continue
				}
				r.DeleteCheckpointKeys(ctx)
				Sleep(ctx, r.Between(time.Millisecond, 400*time.Millisecond))
				r.Kill9()
			}
		},
	},
	{
		// Deleted while relayd is down (the documented case: it finds a
		// new bucket at start), or while it runs: relayd does not notice
		// until a restart (its index writes find no stream and are
		// retried; it stops moving on, unready), so it is killed 1–2 s
		// later.
		Name: "bucket-deleted", MinFaults: 4,
		Faults: func(ctx context.Context, r *Run) {
			for i := 0; quiet(ctx, r); i++ {
				if i%2 == 0 {
					r.Down(ctx, r.Between(500*time.Millisecond, 1500*time.Millisecond), func() { r.DeleteBucket(ctx, "relayd down") })
					continue
				}
				off := logSize(r.proc.log)
				n0, _, _ := r.StreamMsgs(ctx)
				if !r.DeleteBucket(ctx, "relayd running") {
					continue
				}
				Sleep(ctx, r.Between(time.Second, 2*time.Second))
				ok, err := r.BucketExists(ctx)
				n1, _, _ := r.StreamMsgs(ctx)
				if r.Env.Logf != nil {
					r.Env.Logf("index bucket deleted under a running relayd: before the kill it exists again: %v (%v); stream %d -> %d messages; relayd's log since: %d lines name KV_%s",
						ok, err, n0, n1, linesNaming(r.proc.log, off, "KV_"+r.rec.bucket), r.rec.bucket)
				}
				r.Kill9()
			}
		},
	},
}

// logSize is the size of the log file at path (0 if unreadable).
func logSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// linesNaming counts the lines of the file at path from offset off on that
// contain s.
func linesNaming(path string, off int64, s string) int {
	b, err := os.ReadFile(path)
	if err != nil || off > int64(len(b)) {
		return 0
	}
	return strings.Count(string(b[off:]), s) // at most once per line in practice
}
