package shard

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"time"

	"go.uber.org/zap"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// writeKind is what a write does to the Lease spec; every write also
// records this replica's heartbeat in MembersAnnotation.
type writeKind int

const (
	writeHolder    writeKind = iota // acquire or renew: holder = this replica
	writeRelease                    // holder cleared, leaseDurationSeconds 1 (client-go's release)
	writeHeartbeat                  // spec unchanged
)

func (s *Sharder) get(ctx context.Context, name string) (*coordinationv1.Lease, error) {
	ctx, cancel := context.WithTimeout(ctx, s.reqTimeout)
	defer cancel()
	return s.leases.Get(ctx, name, metav1.GetOptions{})
}

func (s *Sharder) update(ctx context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	ctx, cancel := context.WithTimeout(ctx, s.reqTimeout)
	defer cancel()
	return s.leases.Update(ctx, l, metav1.UpdateOptions{})
}

// dryRunUpdate checks that relayd may update l; a conflict means it may.
func (s *Sharder) dryRunUpdate(ctx context.Context, l *coordinationv1.Lease) error {
	ctx, cancel := context.WithTimeout(ctx, s.reqTimeout)
	defer cancel()
	_, err := s.leases.Update(ctx, l, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
	if apierrors.IsConflict(err) {
		return nil
	}
	return err
}

// leaseError explains a failed request on Lease name.
func (s *Sharder) leaseError(verb, name string, err error) error {
	ref := s.ref(name)
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Errorf("shard: Lease %s not found: it must be pre-created (relayd may only get and update its Leases, not create them; deploy/ ships one per source): %w", ref, err)
	case apierrors.IsForbidden(err):
		return fmt.Errorf("shard: forbidden to %s Lease %s: relayd needs the verbs get and update on it (a Role rule for coordination.k8s.io leases with resourceNames): %w", verb, ref, err)
	default:
		return fmt.Errorf("shard: %s Lease %s: %w", verb, ref, err)
	}
}

// noteErrLocked records a failed request on sl's Lease. Failures that
// repeat at every period (the apiserver down, a Lease relayd may no longer
// update) are logged when they start, as a summary at most once a minute,
// and when they end (see succeededLocked). Conflicts are normal (another
// replica wrote first) and only logged at debug.
func (s *Sharder) noteErrLocked(sl *slot, verb string, err error) {
	sl.obsOK = false
	if apierrors.IsConflict(err) {
		s.log.Debug("conflict on Lease, retrying next period", zap.String("lease", s.ref(sl.name)), zap.String("verb", verb))
		s.succeededLocked(sl, verb) // the apiserver answered
		return
	}
	sl.failedVerb = verb
	sl.failures.Fail(s.leaseError(verb, sl.name, err), zap.String("verb", verb))
}

// succeededLocked ends sl's run of failed requests, logging that it
// recovered, after a request with verb got an answer: an update ends any
// run; a get only one whose last failure was a get, since reads that work
// say nothing of updates that fail (forbidden, refused by a webhook), which
// would otherwise be logged anew at every attempt.
func (s *Sharder) succeededLocked(sl *slot, verb string) {
	if sl.failedVerb == "" || (verb == "get" && sl.failedVerb != "get") {
		return
	}
	sl.failedVerb = ""
	sl.failures.OK()
}

// observeLocked records l, just read or written, as sl's newest Lease.
func (s *Sharder) observeLocked(sl *slot, l *coordinationv1.Lease, now time.Time) {
	rec := resourcelock.LeaseSpecToLeaderElectionRecord(&l.Spec)
	raw, _ := json.Marshal(rec)
	if !bytes.Equal(raw, sl.rawRec) {
		sl.rawRec = raw
		sl.recSeen = now
	}
	sl.lease = l
	sl.obsOK = true
	sl.holder = rec.HolderIdentity
	sl.durSec = rec.LeaseDurationSeconds

	heartbeats, err := decodeMembers(l)
	if err != nil && !sl.badAnnotation {
		s.log.Warn("ignoring malformed membership annotation; the next write replaces it",
			zap.String("lease", s.ref(sl.name)), zap.String("annotation", MembersAnnotation), zap.Error(err))
	}
	sl.badAnnotation = err != nil
	sl.heartbeats = heartbeats
	for id, hb := range heartbeats {
		if id != s.id {
			observeHeartbeat(s.members, id, hb, now)
		}
	}
	s.gcMembersLocked(now)

	if sl.held && rec.HolderIdentity != s.id {
		sl.held = false
		if sl.state == running || sl.state == stopping {
			s.log.Error("Lease taken over while this replica held it; stopping source",
				zap.String("source", sl.source), zap.String("lease", s.ref(sl.name)), zap.String("holder", rec.HolderIdentity))
			s.stopLocked(sl, reasonLost)
		} else {
			s.log.Info("Lease taken over", zap.String("lease", s.ref(sl.name)), zap.String("holder", rec.HolderIdentity))
		}
	}
}

// gcMembersLocked forgets members dead for two LeaseDurations that no Lease
// mentions any more (forgetting one that a Lease still mentions would make
// it look alive when seen again).
func (s *Sharder) gcMembersLocked(now time.Time) {
	for id, m := range s.members {
		if now.Sub(m.seenAt) < 2*s.leaseDuration {
			continue
		}
		mentioned := false
		for _, sl := range s.slots {
			if _, ok := sl.heartbeats[id]; ok {
				mentioned = true
				break
			}
		}
		if !mentioned {
			delete(s.members, id)
		}
	}
}

// prepareLocked builds the object to write from cur, sent at now.
func (s *Sharder) prepareLocked(cur *coordinationv1.Lease, kind writeKind, now time.Time) *coordinationv1.Lease {
	l := cur.DeepCopy()
	rec := resourcelock.LeaseSpecToLeaderElectionRecord(&l.Spec)
	t := metav1.NewTime(now)
	switch kind {
	case writeHolder:
		if rec.HolderIdentity != s.id {
			rec.HolderIdentity = s.id
			rec.AcquireTime = t
			rec.LeaderTransitions++
		}
		rec.LeaseDurationSeconds = s.leaseSeconds
		rec.RenewTime = t
	case writeRelease:
		rec.HolderIdentity = ""
		rec.LeaseDurationSeconds = 1
		rec.AcquireTime = t
		rec.RenewTime = t
	}
	if kind != writeHeartbeat {
		l.Spec = resourcelock.LeaderElectionRecordToLeaseSpec(rec)
	}

	heartbeats, _ := decodeMembers(l) // malformed: replaced
	for id := range heartbeats {
		if m := s.members[id]; id != s.id && m != nil && now.Sub(m.seenAt) >= s.leaseDuration {
			delete(heartbeats, id) // dead (or gone) for a LeaseDuration
		}
	}
	stamp := time.Now().UTC().Round(0)
	if !stamp.After(s.hbStamp) {
		stamp = s.hbStamp.Add(time.Microsecond)
	}
	s.hbStamp = stamp
	heartbeats[s.id] = heartbeat{Time: stamp, Left: s.leaving}
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[MembersAnnotation] = encodeMembers(heartbeats)
	return l
}

// wroteLocked notes a successful write carrying our heartbeat.
func (s *Sharder) wroteLocked(now time.Time, leaving bool) {
	if s.warmFrom.IsZero() {
		s.warmFrom = now
	}
	s.lastHB = now
	if leaving {
		s.leftWritten = true
	}
}

// read refreshes sl's Lease with a GET; it reports success.
func (s *Sharder) read(ctx context.Context, sl *slot) bool {
	l, err := s.get(ctx, sl.name)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.noteErrLocked(sl, "get", err)
		return false
	}
	s.succeededLocked(sl, "get")
	s.observeLocked(sl, l, time.Now())
	return true
}

// write sends prepareLocked(sl.lease, kind) and records the outcome; on
// success it returns the time the request was sent.
func (s *Sharder) write(ctx context.Context, sl *slot, kind writeKind) (sent time.Time, err error) {
	s.mu.Lock()
	if sl.lease == nil { // not read yet
		s.mu.Unlock()
		return time.Time{}, fmt.Errorf("shard: Lease %s not read yet", s.ref(sl.name))
	}
	sent = time.Now()
	l := s.prepareLocked(sl.lease, kind, sent)
	leaving := s.leaving
	s.mu.Unlock()
	out, err := s.update(ctx, l)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.noteErrLocked(sl, "update", err)
		return sent, err
	}
	s.succeededLocked(sl, "update")
	if kind == writeRelease {
		sl.held = false // before observeLocked, which would call it a loss
	}
	now := time.Now()
	s.observeLocked(sl, out, now)
	s.wroteLocked(now, leaving)
	return sent, nil
}

// renew renews sl's Lease (held by this replica). On a conflict it reads the
// Lease again and, if it is still ours, renews once more. It reports whether
// sl's Lease was read or written.
func (s *Sharder) renew(ctx context.Context, sl *slot) bool {
	sent, err := s.write(ctx, sl, writeHolder)
	if apierrors.IsConflict(err) {
		if !s.read(ctx, sl) {
			return false
		}
		s.mu.Lock()
		held := sl.held
		s.mu.Unlock()
		if !held {
			return true // lost; observeLocked stopped the source
		}
		sent, err = s.write(ctx, sl, writeHolder)
	}
	if err != nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sl.lastRenew = sent
	if r := sl.run; r != nil && !r.expired {
		r.watchdog.Reset(time.Until(sent.Add(s.renewDeadline)))
	}
	return true
}

// acquire takes sl's Lease (decideLocked set sl.state to acquiring) and
// starts the source.
func (s *Sharder) acquire(ctx context.Context, sl *slot) {
	sent, err := s.write(ctx, sl, writeHolder)
	s.mu.Lock()
	defer s.mu.Unlock()
	sl.state = idle
	if err != nil {
		return
	}
	sl.held = true
	sl.lastRenew = sent
	if s.leaving {
		wake(sl) // stopping meanwhile: the next step releases it
		return
	}
	s.startLocked(ctx, sl, sent)
}

// release gives sl's Lease back after its Run returned. A conflict is
// retried with a fresh read; if the Lease cannot be released it simply
// expires after LeaseDuration.
func (s *Sharder) release(ctx context.Context, sl *slot) {
	for attempt := 0; attempt < 3; attempt++ {
		_, err := s.write(ctx, sl, writeRelease)
		if err == nil {
			s.log.Info("released Lease", zap.String("source", sl.source), zap.String("lease", s.ref(sl.name)))
			return
		}
		if !apierrors.IsConflict(err) || !s.read(ctx, sl) {
			break
		}
		s.mu.Lock()
		held := sl.held
		s.mu.Unlock()
		if !held {
			return // someone else holds it now
		}
	}
	s.mu.Lock()
	sl.held = false
	s.mu.Unlock()
	s.log.Warn("could not release Lease; it expires after LeaseDuration",
		zap.String("source", sl.source), zap.String("lease", s.ref(sl.name)), zap.Duration("leaseDuration", s.leaseDuration))
}

// heartbeat records this replica in sl's Lease without touching the spec;
// it reports success.
func (s *Sharder) heartbeat(ctx context.Context, sl *slot) bool {
	s.mu.Lock()
	ok := sl.lease != nil
	s.mu.Unlock()
	if !ok {
		return false
	}
	_, err := s.write(ctx, sl, writeHeartbeat)
	return err == nil
}
