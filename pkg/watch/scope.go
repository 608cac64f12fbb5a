package watch

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/relayd/relayd/internal/retry"
	"github.com/relayd/relayd/pkg/checkpoint"
	"github.com/relayd/relayd/pkg/config"
	"github.com/relayd/relayd/pkg/event"
	"github.com/relayd/relayd/pkg/filter"
	"github.com/relayd/relayd/pkg/source"
)

// Scope is a source's filter as the watch applies it (docs/CONSUMING.md,
// "Filters: entering and leaving scope"): the compiled expression, what
// an evaluation error means, and the hash of both that the checkpoint
// keeps. The nil Scope (no filter) has every object in scope and costs
// nothing per event.
type Scope struct {
	f       *filter.Filter
	exclude bool
	hash    string
	// failed are the object versions (uid/resourceVersion) whose
	// evaluation failed already, for all the source's watches: a relist
	// evaluates them again, and is neither counted nor logged again. One
	// set per source, at most maxFailedVersions (then it starts over): a
	// filter that fails on every object of a source of 10,000 namespace
	// watches holds ~100 KB, not a set per watch.
	mu     sync.Mutex
	failed map[string]struct{}
}

// maxFailedVersions bounds Scope.failed (~100 B an entry).
const maxFailedVersions = 1024

// firstFailure records a failed evaluation of the object version uid/rv
// and reports whether it is the first recorded.
func (s *Scope) firstFailure(uid, rv string) bool {
	version := uid + "/" + rv
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, seen := s.failed[version]; seen {
		return false
	}
	if s.failed == nil || len(s.failed) >= maxFailedVersions {
		s.failed = map[string]struct{}{}
	}
	s.failed[version] = struct{}{}
	return true
}

// NewScope compiles the filter of src (nil, nil without one).
func NewScope(src *config.Source) (*Scope, error) {
	if src.Filter == "" {
		return nil, nil
	}
	f, err := filter.Compile(src.Filter, filter.Options{})
	if err != nil {
		return nil, fmt.Errorf("source %q: filter: %w", src.Name, err)
	}
	exclude := src.FilterOnError == config.FilterOnErrorExclude
	return &Scope{f: f, exclude: exclude, hash: ScopeHash(src)}, nil
}

// ScopeHash is the hash of src's filter and filterOnError that the
// checkpoint keeps (checkpoint.Position.FilterHash): "" without a filter,
// else 16 hex digits of SHA-256. filterOnError's default and "include"
// hash alike.
func ScopeHash(src *config.Source) string {
	if src.Filter == "" {
		return ""
	}
	mode := config.FilterOnErrorInclude
	if src.FilterOnError == config.FilterOnErrorExclude {
		mode = config.FilterOnErrorExclude
	}
	sum := sha256.Sum256([]byte(string(mode) + "\x00" + src.Filter))
	return hex.EncodeToString(sum[:8])
}

// Hash is the scope's hash ("" for the nil Scope).
func (s *Scope) Hash() string {
	if s == nil {
		return ""
	}
	return s.hash
}

// In reports whether the object whose JSON is raw is in scope, applying
// filterOnError to an evaluation error, which it returns as well.
func (s *Scope) In(raw []byte) (bool, error) {
	if s == nil {
		return true, nil
	}
	ok, err := s.f.Match(raw)
	if err != nil {
		return !s.exclude, err
	}
	return ok, nil
}

// InObject is In on an object parsed by pkg/event (the watch's items):
// the filter evaluates on what the parse validated (filter.MatchParsed).
func (s *Scope) InObject(obj *event.Object) (bool, error) {
	if s == nil {
		return true, nil
	}
	ok, err := s.f.MatchParsed(obj)
	if err != nil {
		return !s.exclude, err
	}
	return ok, nil
}

// scopeState is a watch's filter: the Scope, its error counter and log,
// and the hash the checkpoint records (the filter's, except while a
// config-changed relist is due: the one the checkpoint was written under,
// so that a crash before the relist completes relists again).
type scopeState struct {
	s      *Scope
	err    error // the filter does not compile: every attempt fails with it
	errs   prometheus.Counter
	failed *retry.Failures
	acked  atomic.Pointer[string] // the hash Advance records
	reason event.RelistReason     // of the list being compared with the index ("" outside one)
}

func (w *Watch) initScope() {
	sc := &w.scope
	if sc.s = w.o.Scope; sc.s == nil {
		sc.s, sc.err = NewScope(w.o.Source)
	}
	sc.errs = w.o.Metrics.FilterErrors.WithLabelValues(w.o.Source.Name)
	sc.failed = retry.NewFailures(w.log, "filter evaluation failed; the object is "+map[bool]string{true: "out of scope (filterOnError: exclude)", false: "in scope (fail open)"}[sc.s != nil && sc.s.exclude],
		retry.AtLevel(zapcore.WarnLevel))
	sc.setAcked(sc.s.Hash())
}

func (sc *scopeState) setAcked(h string) { sc.acked.Store(&h) }

func (sc *scopeState) ackedHash() string {
	if h := sc.acked.Load(); h != nil {
		return *h
	}
	return ""
}

// inScope evaluates the watch's filter on the item's object: errors are
// counted and logged once per object version (summarised while they
// repeat), and filterOnError decides.
func (w *Watch) inScope(it *source.Item) bool {
	in, err := w.scope.s.InObject(&it.Object)
	if err != nil {
		m := &it.Object.Meta
		if !w.scope.s.firstFailure(m.UID, m.ResourceVersion) {
			return in
		}
		w.scope.errs.Inc()
		w.scope.failed.Fail(err, zap.String("object", m.Namespace+"/"+m.Name), zap.String("uid", m.UID))
	}
	return in
}

// scopeChange is what the filter makes of an object item against the
// index (indexed: the index holds the object), before applyToIndex:
// publish false means nothing is published (the object is and stays out
// of scope, or a delete of one the index does not hold), typ and scope
// are the event to publish.
func scopeChange(typ event.Type, origin event.Origin, indexed, in bool, reason event.RelistReason) (t event.Type, scope event.Scope, publish bool) {
	switch {
	case typ == event.Deleted:
		return typ, "", indexed
	case in && !indexed:
		if origin == event.OriginWatch && typ == event.Modified || reason == event.RelistConfigChanged {
			return event.Added, event.ScopeEntered, true
		}
		return event.Added, "", true
	case in:
		return typ, "", true
	case indexed:
		return event.Deleted, event.ScopeLeft, true
	}
	return typ, "", false
}

// scoped applies the filter to an object item: the event it makes and its
// relaydscope, or publish false when it makes none. A delete is not
// evaluated.
func (w *Watch) scoped(it *source.Item, uid string) (event.Type, event.Scope, bool) {
	in := it.Type == event.Deleted || w.inScope(it)
	return scopeChange(it.Type, it.Origin, w.ix.idx.Has(uid), in, w.scope.reason)
}

// outOfScope is the change of an item whose object is out of the filter's
// scope and not indexed: a live change moves the position (as an event
// the eventTypes filter drops), a list item is counted and nothing more.
func (w *Watch) outOfScope(it *source.Item) change {
	if it.Origin == event.OriginWatch {
		return change{typ: it.Type, outside: true}
	}
	w.counts.Total++
	return change{typ: it.Type}
}

// scopeChanged decides, at the first load, whether the filter is not the
// one the checkpoint was written under (adding or removing one counts): the
// watch then relists with reason config-changed, unless the recovery plan
// relists already (relist), and the checkpoint keeps the old hash until a
// relist completes. Without a checkpoint there is nothing to compare.
func (w *Watch) scopeChanged(hasCP bool, pos checkpoint.Position, relist event.RelistReason) event.RelistReason {
	now := w.scope.s.Hash()
	if !hasCP || pos.FilterHash == now {
		return relist
	}
	w.scope.setAcked(pos.FilterHash)
	w.log.Info("the source's filter is not the one its checkpoint was written under; relisting to publish the objects that entered or left its scope",
		zap.String("checkpointFilterHash", pos.FilterHash), zap.String("filterHash", now))
	if relist == "" {
		relist = event.RelistConfigChanged
	}
	return relist
}
