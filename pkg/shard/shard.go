package shard

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"

	"github.com/relayd/relayd/internal/retry"
)

// Defaults for the zero values of [Options]; the timings are client-go's
// leader-election defaults.
const (
	// DefaultLeasePrefix is the default of Options.LeasePrefix.
	DefaultLeasePrefix = "relayd"
	// DefaultLeaseDuration is the default of Options.LeaseDuration.
	DefaultLeaseDuration = 15 * time.Second
	// DefaultRenewDeadline is the default of Options.RenewDeadline.
	DefaultRenewDeadline = 10 * time.Second
	// DefaultRetryPeriod is the default of Options.RetryPeriod.
	DefaultRetryPeriod = 2 * time.Second
)

// LeaseName is the name of the Lease that guards source: "<prefix>-<source>".
func LeaseName(prefix, source string) string { return prefix + "-" + source }

// Options configures a [Sharder]. Client, Namespace, Identity, Sources,
// Logger and Run are required.
type Options struct {
	// Client reaches the Leases; relayd needs "get" and "update" on each of
	// them, nothing else.
	Client coordinationv1client.LeasesGetter
	// Namespace holds the Leases.
	Namespace string
	// Identity names this replica in the Leases (holderIdentity and the
	// membership annotation); it must be unique among the replicas and
	// stable for the life of the process: the pod name.
	Identity string
	// Sources are the names of the sources to spread; each has the Lease
	// LeaseName(LeasePrefix, source), which must exist.
	Sources []string
	// LeasePrefix is the first part of the Lease names; default "relayd".
	LeasePrefix string
	// LeaseDuration is how long other replicas wait, after they last saw a
	// Lease renewed, before they take it over (default 15s). RenewDeadline
	// is how long the holder keeps a source running without a successful
	// renewal (default 10s); it must be less than LeaseDuration, and the
	// difference is the time a cancelled Run has to return. RetryPeriod is
	// how often every Lease is read, renewed or tried (default 2s); it must
	// be less than RenewDeadline.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// Logger is required; the sharder logs under the name "shard".
	Logger *zap.Logger
	// Run runs one source while this replica holds its Lease, in a goroutine
	// of its own. ctx is cancelled when the source is handed over to another
	// replica, when the Sharder stops, or when the Lease could not be
	// renewed within RenewDeadline (or was lost). Run must return only after
	// the source is fully stopped (publishes drained, final checkpoint
	// written); the Lease is renewed until then and released only after Run
	// returned. After a failed renewal another replica may start the source
	// LeaseDuration − RenewDeadline after ctx was cancelled, so Run must
	// honour ctx promptly. If Run returns while ctx is still live, the Lease
	// is released and the source is free again (this replica usually takes
	// it back a RetryPeriod later); Run should supervise its source itself
	// rather than return.
	Run func(ctx context.Context, source string)
	// OnLeading, if set, is called with true just before Run starts and with
	// false just after it returned (for relayd_source_leader{source}). It
	// is called from the source's goroutine and must be safe for concurrent
	// use.
	OnLeading func(source string, leading bool)
	// OnStarted, if set, is called once the Leases passed Run's start-up
	// check.
	OnStarted func()
}

// slotState is where one source stands on this replica.
type slotState int

const (
	idle      slotState = iota // no Run here
	acquiring                  // acquire write in flight
	running                    // Run active, Lease held
	stopping                   // Run cancelled, waiting for it to return
)

// slot is one source and its Lease.
type slot struct {
	source string
	name   string        // Lease name
	wake   chan struct{} // cap 1: run the next step now
	pref   uint64        // preference(identity, source)

	// Guarded by Sharder.mu.
	lease         *coordinationv1.Lease // newest object read or written; nil before
	obsOK         bool                  // the last read or write succeeded
	holder        string                // holderIdentity of lease
	durSec        int                   // leaseDurationSeconds of lease
	heartbeats    map[string]heartbeat  // MembersAnnotation of lease
	rawRec        []byte                // the record, to tell when it changes
	recSeen       time.Time             // local time rawRec was first seen
	state         slotState
	held          bool      // this replica wrote the current holder record
	lastRenew     time.Time // when the last successful acquire/renew was sent
	run           *runState // while Run is active
	failedVerb    string    // verb of the last failed request of the current run of failures ("" if none)
	badAnnotation bool      // MembersAnnotation did not parse (logged once)

	// failures logs the failed requests on the Lease (other than
	// conflicts) when a run of them starts, as a summary while it lasts,
	// and when it ends; safe for concurrent use.
	failures *retry.Failures
}

// runState is one execution of Options.Run for a slot.
type runState struct {
	cancel   context.CancelCauseFunc
	watchdog *time.Timer // cancels at lastRenew + RenewDeadline
	overdue  *time.Timer // complains when Run outlives its margin
	expired  bool        // the watchdog fired
	reason   string      // why it was cancelled
}

// Sharder runs the sources whose Leases this replica holds, and keeps the
// replica's share of them fair. Build it with [New] and call [Sharder.Run]
// once; [Sharder.Leading] is safe for concurrent use.
type Sharder struct {
	leases        coordinationv1client.LeaseInterface
	namespace     string
	id            string
	leaseDuration time.Duration
	renewDeadline time.Duration
	retryPeriod   time.Duration
	leaseSeconds  int           // leaseDurationSeconds written
	reqTimeout    time.Duration // bounds one API request
	hbInterval    time.Duration // heartbeat period of a replica that holds nothing
	warmup        time.Duration // no acquiring this long after the first heartbeat
	runSource     func(context.Context, string)
	onLeading     func(string, bool)
	onStarted     func()
	log           *zap.Logger
	slots         []*slot // sorted by source
	hbSlot        *slot   // where a replica that holds nothing heartbeats

	started atomic.Bool
	runs    sync.WaitGroup // Run goroutines

	mu          sync.Mutex
	members     map[string]*member // other replicas
	leaving     bool               // Run's context ended
	warmFrom    time.Time          // first successful heartbeat (zero before)
	lastHB      time.Time          // last successful write carrying our heartbeat
	hbStamp     time.Time          // last heartbeat time written (strictly increasing)
	leftWritten bool               // a write carried our "left" mark
	leading     map[string]bool
	lastView    string // last logged membership view
}

// New validates o and returns a Sharder.
func New(o Options) (*Sharder, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	return newSharder(o), nil
}

// validate checks o and sets the defaults of its zero values; the error
// names every problem.
func (o *Options) validate() error {
	if o.LeasePrefix == "" {
		o.LeasePrefix = DefaultLeasePrefix
	}
	errs := o.requiredErrors()
	errs = append(errs, sourceErrors(o.LeasePrefix, o.Sources)...)
	errs = append(errs, o.timingErrors()...)
	return errors.Join(errs...)
}

// requiredErrors names the required options that are missing.
func (o *Options) requiredErrors() []error {
	var errs []error
	req := func(ok bool, field string) {
		if !ok {
			errs = append(errs, fmt.Errorf("shard: Options.%s is required", field))
		}
	}
	req(o.Client != nil, "Client")
	req(o.Namespace != "", "Namespace")
	req(o.Identity != "", "Identity")
	req(o.Logger != nil, "Logger")
	req(o.Run != nil, "Run")
	if len(o.Sources) == 0 {
		errs = append(errs, errors.New("shard: Options.Sources must name at least one source"))
	}
	return errs
}

// sourceErrors names the duplicate sources and those whose Lease name
// (with prefix) is not a valid object name.
func sourceErrors(prefix string, sources []string) []error {
	var errs []error
	seen := map[string]int{}
	for i, src := range sources {
		if j, dup := seen[src]; dup {
			errs = append(errs, fmt.Errorf("shard: Options.Sources[%d]: duplicate source %q (first at [%d])", i, src, j))
			continue
		}
		seen[src] = i
		if p := validation.IsDNS1123Subdomain(LeaseName(prefix, src)); len(p) > 0 {
			errs = append(errs, fmt.Errorf("shard: Options.Sources[%d]: Lease name %q is not valid: %s", i, LeaseName(prefix, src), strings.Join(p, "; ")))
		}
	}
	return errs
}

// timingErrors sets the default of each zero timing and names the negative
// ones, and those out of order: RetryPeriod < RenewDeadline < LeaseDuration.
func (o *Options) timingErrors() []error {
	var errs []error
	for _, d := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"LeaseDuration", &o.LeaseDuration, DefaultLeaseDuration},
		{"RenewDeadline", &o.RenewDeadline, DefaultRenewDeadline},
		{"RetryPeriod", &o.RetryPeriod, DefaultRetryPeriod},
	} {
		switch {
		case *d.v < 0:
			errs = append(errs, fmt.Errorf("shard: Options.%s must not be negative, got %s", d.name, *d.v))
		case *d.v == 0:
			*d.v = d.def
		}
	}
	if o.LeaseDuration > 0 && o.RenewDeadline > 0 && o.RenewDeadline >= o.LeaseDuration {
		errs = append(errs, fmt.Errorf("shard: Options.RenewDeadline (%s) must be less than Options.LeaseDuration (%s)", o.RenewDeadline, o.LeaseDuration))
	}
	if o.RenewDeadline > 0 && o.RetryPeriod > 0 && o.RetryPeriod >= o.RenewDeadline {
		errs = append(errs, fmt.Errorf("shard: Options.RetryPeriod (%s) must be less than Options.RenewDeadline (%s)", o.RetryPeriod, o.RenewDeadline))
	}
	return errs
}

// newSharder builds the Sharder of o, validated: the timings derived from
// o's, and one slot per source, sorted by source.
func newSharder(o Options) *Sharder {
	s := &Sharder{
		leases:        o.Client.Leases(o.Namespace),
		namespace:     o.Namespace,
		id:            o.Identity,
		leaseDuration: o.LeaseDuration,
		renewDeadline: o.RenewDeadline,
		retryPeriod:   o.RetryPeriod,
		leaseSeconds:  int(math.Ceil(o.LeaseDuration.Seconds())),
		reqTimeout:    o.RenewDeadline / 2,
		hbInterval:    max(o.RetryPeriod, o.LeaseDuration/3),
		warmup:        2 * o.RetryPeriod,
		runSource:     o.Run,
		onLeading:     o.OnLeading,
		onStarted:     o.OnStarted,
		log:           o.Logger.With(zap.String("identity", o.Identity)), // the caller names it
		members:       map[string]*member{},
		leading:       map[string]bool{},
	}
	for _, src := range o.Sources {
		s.slots = append(s.slots, s.newSlot(src, LeaseName(o.LeasePrefix, src)))
	}
	sort.Slice(s.slots, func(i, j int) bool { return s.slots[i].source < s.slots[j].source })
	s.hbSlot = s.slots[hashIndex(o.Identity, len(s.slots))]
	return s
}

// newSlot is the slot of source, guarded by the Lease name.
func (s *Sharder) newSlot(source, name string) *slot {
	return &slot{
		source: source,
		name:   name,
		wake:   make(chan struct{}, 1),
		pref:   preference(s.id, source),
		failures: retry.NewFailures(s.log.With(zap.String("source", source), zap.String("lease", s.ref(name))),
			"Lease request failed"),
	}
}

// Leading returns the sources whose Run is active on this replica, sorted.
func (s *Sharder) Leading() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.leading))
	for src := range s.leading {
		out = append(out, src)
	}
	sort.Strings(out)
	return out
}

// Run checks the Leases (each must exist, and relayd must be allowed to get
// and update it: the error names every problem), then acquires, renews,
// rebalances and runs sources until ctx ends. It then cancels every running
// source, keeps renewing their Leases until each Run has returned, releases
// them, marks this replica as gone, and returns nil. Run may be called once.
func (s *Sharder) Run(ctx context.Context) error {
	if !s.started.CompareAndSwap(false, true) {
		return errors.New("shard: Sharder.Run may only be called once")
	}
	if err := s.preflight(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	if s.onStarted != nil {
		s.onStarted()
	}
	s.log.Info("sharding sources",
		zap.String("namespace", s.namespace), zap.Int("sources", len(s.slots)),
		zap.Duration("leaseDuration", s.leaseDuration), zap.Duration("renewDeadline", s.renewDeadline),
		zap.Duration("retryPeriod", s.retryPeriod))

	// The loops outlive ctx: they keep renewing while sources drain.
	base := context.WithoutCancel(ctx)
	var loops sync.WaitGroup
	for _, sl := range s.slots {
		loops.Add(1)
		go func() {
			defer loops.Done()
			s.loop(base, sl)
		}()
	}
	<-ctx.Done()
	s.beginLeaving()
	loops.Wait()
	s.runs.Wait()
	s.sayGoodbye(base)
	s.log.Info("stopped sharding")
	return nil
}

// preflight reads every Lease and checks with a dry-run update that relayd
// may update it.
func (s *Sharder) preflight(ctx context.Context) error {
	var errs []error
	for _, sl := range s.slots {
		l, err := s.get(ctx, sl.name)
		if err != nil {
			errs = append(errs, s.leaseError("get", sl.name, err))
			continue
		}
		if err := s.dryRunUpdate(ctx, l); err != nil {
			errs = append(errs, s.leaseError("update", sl.name, err))
			continue
		}
		s.mu.Lock()
		s.observeLocked(sl, l, time.Now())
		s.mu.Unlock()
	}
	return errors.Join(errs...)
}

// loop drives one slot: a step every RetryPeriod, or at once when woken.
func (s *Sharder) loop(ctx context.Context, sl *slot) {
	t := time.NewTimer(s.retryPeriod)
	defer t.Stop()
	for {
		s.step(ctx, sl)
		if s.finished(sl) {
			return
		}
		t.Reset(s.retryPeriod)
		select {
		case <-t.C:
		case <-sl.wake:
		}
	}
}

func (s *Sharder) finished(sl *slot) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.leaving && sl.state == idle && !sl.held
}

func wake(sl *slot) {
	select {
	case sl.wake <- struct{}{}:
	default:
	}
}

type action int

const (
	none action = iota
	acquire
	sendHeartbeat
)

// step reads (or renews) the slot's Lease, then acts on what it saw.
func (s *Sharder) step(ctx context.Context, sl *slot) {
	s.mu.Lock()
	held, state := sl.held, sl.state
	s.mu.Unlock()

	var fresh bool
	switch {
	case held && state == idle:
		// Run has returned: hand the Lease back.
		s.release(ctx, sl)
		return
	case held:
		fresh = s.renew(ctx, sl)
	default:
		fresh = s.read(ctx, sl)
	}

	s.mu.Lock()
	act := s.decideLocked(sl, fresh, time.Now())
	s.mu.Unlock()
	switch act {
	case acquire:
		s.acquire(ctx, sl)
	case sendHeartbeat:
		s.heartbeat(ctx, sl)
	}
}

// decideLocked chooses what to do with sl after it was read at now.
func (s *Sharder) decideLocked(sl *slot, fresh bool, now time.Time) action {
	if s.leaving {
		return none // beginLeaving cancelled every Run
	}
	q := s.quotaLocked(now)
	switch sl.state {
	case running:
		if slices.Contains(s.excessLocked(q), sl) {
			s.stopLocked(sl, "rebalance")
		}
		return none
	case idle:
		if fresh && !sl.held && s.warmLocked(now) && slices.Contains(s.wantedLocked(q, now), sl) {
			sl.state = acquiring
			return acquire
		}
	}
	if fresh && sl == s.hbSlot && !s.holdsAnyLocked() && (s.lastHB.IsZero() || now.Sub(s.lastHB) >= s.hbInterval) {
		return sendHeartbeat
	}
	return none
}

// quotaLocked is this replica's share at now.
func (s *Sharder) quotaLocked(now time.Time) int {
	if s.leaving {
		return 0
	}
	ids := []string{s.id}
	for id, m := range s.members {
		if id != s.id && m.alive(now, s.leaseDuration) {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	q := quota(ids, s.id, len(s.slots))
	if view := fmt.Sprint(ids, q); view != s.lastView {
		s.lastView = view
		s.log.Info("members changed", zap.Strings("members", ids), zap.Int("share", q))
	}
	return q
}

// ownedLocked counts the sources this replica runs or is acquiring (not
// those it is handing over).
func (s *Sharder) ownedLocked() int {
	n := 0
	for _, sl := range s.slots {
		if sl.state == running || sl.state == acquiring {
			n++
		}
	}
	return n
}

func (s *Sharder) holdsAnyLocked() bool {
	for _, sl := range s.slots {
		if sl.held || sl.state != idle {
			return true
		}
	}
	return false
}

// excessLocked are the running sources to hand over with share q: the ones
// this replica prefers least.
func (s *Sharder) excessLocked(q int) []*slot {
	var run []*slot
	for _, sl := range s.slots {
		if sl.state == running {
			run = append(run, sl)
		}
	}
	n := s.ownedLocked() - q
	if n <= 0 {
		return nil
	}
	sort.Slice(run, func(i, j int) bool { return run[i].pref < run[j].pref })
	return run[:min(n, len(run))]
}

// wantedLocked are the Leases to acquire now with share q: the free ones
// this replica prefers most.
func (s *Sharder) wantedLocked(q int, now time.Time) []*slot {
	n := q - s.ownedLocked()
	if n <= 0 {
		return nil
	}
	var free []*slot
	for _, sl := range s.slots {
		if sl.state == idle && !sl.held && s.acquirableLocked(sl, now) {
			free = append(free, sl)
		}
	}
	sort.Slice(free, func(i, j int) bool { return free[i].pref > free[j].pref })
	return free[:min(n, len(free))]
}

// acquirableLocked: sl's Lease was read successfully and is free, ours (a
// record this replica wrote earlier), or expired by this replica's clock.
func (s *Sharder) acquirableLocked(sl *slot, now time.Time) bool {
	if sl.lease == nil || !sl.obsOK {
		return false
	}
	if sl.holder == "" || sl.holder == s.id {
		return true
	}
	ttl := max(time.Duration(sl.durSec)*time.Second, s.leaseDuration)
	return now.Sub(sl.recSeen) >= ttl
}

func (s *Sharder) warmLocked(now time.Time) bool {
	return !s.warmFrom.IsZero() && now.Sub(s.warmFrom) >= s.warmup
}

// startLocked starts Run for sl, whose Lease was acquired by a request sent
// at sent.
func (s *Sharder) startLocked(ctx context.Context, sl *slot, sent time.Time) {
	ctx, cancel := context.WithCancelCause(ctx)
	r := &runState{cancel: cancel}
	r.watchdog = time.AfterFunc(time.Until(sent.Add(s.renewDeadline)), func() { s.expire(sl, r) })
	sl.run = r
	sl.state = running
	s.leading[sl.source] = true
	s.log.Info("acquired Lease, starting source", zap.String("source", sl.source), zap.String("lease", s.ref(sl.name)))
	s.runs.Add(1)
	go s.runOne(ctx, sl, r)
}

func (s *Sharder) runOne(ctx context.Context, sl *slot, r *runState) {
	defer s.runs.Done()
	if s.onLeading != nil {
		s.onLeading(sl.source, true)
	}
	s.runSource(ctx, sl.source)
	if s.onLeading != nil {
		s.onLeading(sl.source, false)
	}
	s.mu.Lock()
	r.cancel(nil)
	r.watchdog.Stop()
	if r.overdue != nil {
		r.overdue.Stop()
	}
	reason := r.reason
	if sl.run == r {
		sl.run = nil
		sl.state = idle
	}
	delete(s.leading, sl.source)
	s.mu.Unlock()
	if reason == "" {
		s.log.Warn("source returned on its own; releasing its Lease", zap.String("source", sl.source))
	} else {
		s.log.Info("source stopped", zap.String("source", sl.source), zap.String("reason", reason))
	}
	wake(sl)
}

// ErrLeaseLost is the cause (context.Cause) of a Run context cancelled
// because the Lease was lost (not renewed within RenewDeadline, or taken by
// another holder) rather than handed over: another replica may already run
// the source, so Run should not write anything that could overwrite its
// progress (such as a final checkpoint).
var ErrLeaseLost = errors.New("shard: Lease lost")

const reasonLost = "Lease lost"

// stopLocked cancels sl's Run; the Lease is kept (and renewed) until Run
// returns.
func (s *Sharder) stopLocked(sl *slot, reason string) {
	r := sl.run
	if sl.state != running || r == nil {
		return
	}
	sl.state = stopping
	r.reason = reason
	if reason == reasonLost {
		r.cancel(ErrLeaseLost)
	} else {
		r.cancel(nil)
	}
	s.log.Info("stopping source", zap.String("source", sl.source), zap.String("reason", reason))
}

// expire is the watchdog: no renewal of sl's Lease succeeded for
// RenewDeadline, so another replica may take it over once LeaseDuration has
// passed; stop the source now.
func (s *Sharder) expire(sl *slot, r *runState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sl.run != r || r.expired {
		return
	}
	if left := s.renewDeadline - time.Since(sl.lastRenew); left > 0 {
		r.watchdog.Reset(left) // a renewal raced with the timer
		return
	}
	r.expired = true
	if sl.state == running {
		sl.state = stopping
		r.reason = "renew deadline exceeded"
	}
	r.cancel(ErrLeaseLost)
	s.log.Error("could not renew Lease within RenewDeadline; source cancelled",
		zap.String("source", sl.source), zap.String("lease", s.ref(sl.name)),
		zap.Duration("renewDeadline", s.renewDeadline), zap.Time("lastRenewal", sl.lastRenew))
	r.overdue = time.AfterFunc(s.leaseDuration-s.renewDeadline, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if sl.run == r {
			s.log.Error("source still running LeaseDuration after its last renewal",
				zap.String("source", sl.source), zap.String("lease", s.ref(sl.name)), zap.String("effect", "another replica may already run it"))
		}
	})
}

// beginLeaving stops every source for shutdown.
func (s *Sharder) beginLeaving() {
	s.mu.Lock()
	s.leaving = true
	for _, sl := range s.slots {
		s.stopLocked(sl, "shutdown")
	}
	s.mu.Unlock()
	for _, sl := range s.slots {
		wake(sl)
	}
}

// sayGoodbye marks this replica as gone when no release carried the mark
// (it held nothing when it stopped), so the others recount at once.
func (s *Sharder) sayGoodbye(ctx context.Context) {
	s.mu.Lock()
	done := s.leftWritten
	s.mu.Unlock()
	if done {
		return
	}
	for attempt := 0; attempt < 3; attempt++ {
		l, err := s.get(ctx, s.hbSlot.name)
		if err == nil {
			s.mu.Lock()
			s.observeLocked(s.hbSlot, l, time.Now())
			s.mu.Unlock()
			if s.heartbeat(ctx, s.hbSlot) {
				return
			}
			continue
		}
		s.log.Debug("could not mark this replica as gone", zap.Error(err))
		return
	}
}

func (s *Sharder) ref(name string) string { return s.namespace + "/" + name }
