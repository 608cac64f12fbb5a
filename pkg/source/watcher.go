// Package source reads one Kubernetes collection (a resource in one
// namespace, or in all namespaces, or cluster-scoped) as an ordered stream of
// items: object changes, bookmarks and sync markers around lists.
//
// It speaks the list/watch protocol directly through client-go's REST client
// (so auth, TLS and the rest of *rest.Config apply) and keeps every object as
// the raw JSON bytes of its watch frame: nothing is decoded into maps or
// typed structs. It does not use informers or workqueues, which coalesce
// changes.
//
// Protocol decisions (compare client-go's reflector):
//   - Watches set allowWatchBookmarks=true and timeoutSeconds; a client-side
//     idle timer aborts a watch that delivers no frame for IdleTimeout, so a
//     silent network partition cannot hang it.
//   - A list (first start without a checkpoint, or recovery from 410) uses
//     the streaming list (sendInitialEvents=true,
//     resourceVersionMatch=NotOlderThan, resourceVersion="") which is a
//     consistent snapshot followed by the watch on the same connection;
//     servers that refuse it get a paginated LIST at a consistent
//     resourceVersion followed by a watch from there.
//   - A watch that ends (server timeout, apiserver restart) resumes from the
//     last resourceVersion read. 410 Expired triggers a relist; repeated
//     failures back off exponentially with jitter.
//   - resourceVersions are opaque strings: only compared for equality.
//   - Input is bounded (Options.MaxObjectBytes): a watch frame or LIST item
//     over it fails the attempt after no more than that is read (restart
//     reason "oversized", retried with backoff); a LIST page is read up to
//     it plus 64 KiB, and a larger one is asked for again with half as many
//     items.
//   - With Options.MetadataOnly, every request asks for PartialObjectMetadata
//     (Accept: application/json;as=PartialObjectMetadata[List];g=meta.k8s.io;v=v1),
//     so the rest of each object is neither sent nor read, and the items
//     get the resource's apiVersion and kind instead of meta.k8s.io/v1
//     PartialObjectMetadata. A server that answers 406 Not Acceptable gets
//     requests for whole objects from then on.
package source

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"

	"github.com/relayd/relayd/internal/retry"
	"github.com/relayd/relayd/pkg/config"
	"github.com/relayd/relayd/pkg/event"
)

// ItemKind says what an Item carries.
type ItemKind int

// Item kinds.
const (
	ItemObject        ItemKind = iota // an object change (watch) or a listed object
	ItemBookmark                      // progress without a change
	ItemSyncStarted                   // a list begins
	ItemSyncCompleted                 // a list ended; the watch continues from Sync.ToResourceVersion
)

// Item is one step of the stream, delivered to the Handler in order.
type Item struct {
	Kind   ItemKind
	Type   event.Type   // ItemObject
	Origin event.Origin // ItemObject
	// Object aliases the read buffer: it is valid only during the Handler call.
	Object event.Object
	// ResourceVersion is the position reached after this item; "" for items
	// inside a list (list order is not resourceVersion order, so they must
	// not move a checkpoint).
	ResourceVersion string
	Epoch           uint64
	Sync            event.SyncEvent // ItemSyncStarted / ItemSyncCompleted
	ReadAt          time.Time
}

// Handler consumes items. It may block (backpressure); the watcher stops
// reading meanwhile. An error stops Run and is returned by it. The Item is
// valid only during the call (the watcher reuses it).
type Handler func(ctx context.Context, it *Item) error

// Start is where a watcher begins.
type Start struct {
	// ResourceVersion from the checkpoint; "" if there is none.
	ResourceVersion string
	Epoch           uint64
	// Snapshot: without a checkpoint, list every existing object first
	// (origin initial). Otherwise start from the current state.
	Snapshot bool
	// Relist, when set, is the reason of a list (origin resync) made before
	// anything else, whether or not there is a ResourceVersion.
	Relist event.RelistReason
}

// Options configures a Watcher.
type Options struct {
	Client        rest.Interface // REST client for the resource's group/version, JSON
	Resource      event.Resource
	Source        string // source name, for logs and metrics
	Namespace     string // "" = all namespaces or cluster-scoped
	LabelSelector string
	FieldSelector string
	Timeout       time.Duration // server-side timeoutSeconds per watch; default 5m
	IdleTimeout   time.Duration // client-side; default Timeout+30s
	PageSize      int64         // paginated list fallback; default 500
	Backoff       wait.Backoff  // between failed attempts; default 1s..5m, x2, jitter 0.5
	Logger        *zap.Logger
	Metrics       *Metrics
	// OnEstablished is told when the watch is established (true) or lost
	// (false).
	OnEstablished func(up bool)
	// MetadataOnly lists and watches PartialObjectMetadata instead of whole
	// objects, for sources that publish nothing but metadata (payload
	// metadata or reference): the rest of each object (a Pod's spec and
	// status, a ConfigMap's or Secret's data) then never leaves the
	// apiserver, and relayd neither reads, parses nor holds it. Items carry
	// Resource's apiVersion and kind (event.Object.OverrideTypeMeta), not
	// the apiserver's meta.k8s.io/v1 PartialObjectMetadata. Their Objects
	// hold only metadata: do not publish them with payload full.
	MetadataOnly bool
	// Shaping is the source's event.Shaping: every object is parsed with
	// it, so that the payload cuts and the fingerprint come from the one
	// scanning pass. nil: no drop or ignoreChanges paths.
	Shaping *event.Shaping

	// MaxObjectBytes bounds what is read from the apiserver
	// (watch.maxObjectBytes; default DefaultMaxObjectBytes): a watch
	// frame or LIST item over it fails the attempt (restart reason
	// "oversized") after no more than that was read, and a LIST page over
	// it plus 64 KiB is asked for again with half as many items.
	MaxObjectBytes int64
}

// The Accept headers of a MetadataOnly watcher: the object form for
// watches (and the streaming list, which is one), the List form for LIST
// requests (on a collection, the apiserver refuses the object form with 406
// Not Acceptable).
const (
	AcceptPartialObjectMetadata     = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
	AcceptPartialObjectMetadataList = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
)

// Watcher reads one collection. Run may be called again after it returned
// an error; it resumes from where it stopped.
type Watcher struct {
	o          Options
	log        *zap.Logger
	apiVersion string // o.Resource.APIVersion()
	// failures logs "watch failed; retrying" when a run of failures starts,
	// summarised while it lasts; a watch that is established ends it. Set
	// by Run.
	failures *retry.Failures

	// Per-frame metric children, resolved once.
	lastEvent, lastBookmark prometheus.Gauge
	bookmarks               prometheus.Counter

	mu      sync.Mutex
	rv      string // last resourceVersion read ("" before the first list/watch)
	epoch   uint64
	listing *listPlan // a list is due before watching
	// requested is a relist asked for (Request) and not yet begun; stop
	// ends the current watch request (nil: none runs).
	requested *listPlan
	stop      context.CancelCauseFunc
	noStream  bool // the server refused the streaming list; use LIST pages
	started   bool
	// wholeObjects: the server refused PartialObjectMetadata (406), so
	// fetch whole objects. Used by Run's goroutine only, like noStream.
	wholeObjects bool
}

type listPlan struct {
	origin    event.Origin
	reason    event.RelistReason
	requestID string // reason requested: the request's id
	full      bool   // reason requested: publish every object again
}

// Permanent errors are returned by Run for the supervisor to handle.
var (
	errIdle = errors.New("no watch frame within the idle timeout")
)

// New returns a Watcher.
func New(o Options) (*Watcher, error) {
	switch {
	case o.Client == nil:
		return nil, errors.New("source: Options.Client is required")
	case o.Logger == nil:
		return nil, errors.New("source: Options.Logger is required")
	case o.Metrics == nil:
		return nil, errors.New("source: Options.Metrics is required")
	case o.Resource.Resource == "" || o.Resource.Version == "":
		return nil, errors.New("source: Options.Resource is required")
	}
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Minute
	}
	if o.IdleTimeout <= o.Timeout {
		o.IdleTimeout = o.Timeout + 30*time.Second
	}
	if o.PageSize <= 0 {
		o.PageSize = 500
	}
	if o.MaxObjectBytes <= 0 {
		o.MaxObjectBytes = DefaultMaxObjectBytes
	}
	if o.Backoff.Duration == 0 {
		o.Backoff = retry.Watch(config.DefaultRelistBackoffInitial, config.DefaultRelistBackoffMax, config.DefaultRelistBackoffFactor, config.DefaultRelistBackoffJitter)
	}
	if o.OnEstablished == nil {
		o.OnEstablished = func(bool) {}
	}
	w := &Watcher{
		o: o, log: o.Logger.WithLazy(zap.String("source", o.Source), zap.String("namespace", o.Namespace)),
		apiVersion:   o.Resource.APIVersion(),
		lastEvent:    o.Metrics.LastEvent.WithLabelValues(o.Source),
		lastBookmark: o.Metrics.LastBookmark.WithLabelValues(o.Source),
		bookmarks:    o.Metrics.Bookmarks.WithLabelValues(o.Source),
	}
	return w, nil
}

// Position is the last resourceVersion read and the current epoch.
func (w *Watcher) Position() (string, uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.rv, w.epoch
}

// Run reads the collection until ctx ends or a permanent error (forbidden,
// not found) occurs, delivering items to h. Transient errors are retried
// inside with backoff. The first call uses st; later calls resume.
func (w *Watcher) Run(ctx context.Context, st Start, h Handler) error {
	w.begin(st)
	defer w.o.OnEstablished(false)
	w.failures = retry.NewFailures(w.log, "watch failed; retrying", retry.AtLevel(zapcore.WarnLevel))

	backoff := retry.NewDelays(w.o.Backoff, nil)
	for {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		w.takeRequest()
		if w.next() == nextCurrentRV {
			// initial: none — start from the current state without listing.
			if ok, err := w.fromCurrentRV(ctx, backoff); !ok {
				if err != nil {
					return err
				}
				continue
			}
			// That resourceVersion is the watch's first position, handed
			// on as progress so that it is checkpointed before any change
			// comes: a restart resumes from it instead of from a new now.
			w.mu.Lock()
			first := Item{Kind: ItemBookmark, ResourceVersion: w.rv, Epoch: w.epoch, ReadAt: time.Now()}
			w.mu.Unlock()
			if err := h(ctx, &first); err != nil {
				return err
			}
		}
		err := w.listAndWatch(ctx, h)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		out, reason := outcomeOf(err, w.metadataOnly())
		switch out {
		case outcomeHandler:
			return err
		case outcomeRequested:
			continue // takeRequest makes it the list due
		case outcomePermanent:
			w.o.Metrics.WatchRestarts.WithLabelValues(w.o.Source, reason).Inc()
			return w.describe(err)
		case outcomeNoStream:
			w.log.Warn("the apiserver refused the streaming list; using paginated LIST from now on", zap.Error(err))
			w.noStream = true
			continue
		case outcomeWholeObjects:
			w.useWholeObjects(err)
			continue
		case outcomeRelist:
			w.mu.Lock()
			if w.listing == nil || w.listing.reason != event.RelistRequested {
				// A requested list the 410 cut short is listed again, under
				// its request (it compares with the index all the same).
				w.listing = &listPlan{origin: event.OriginResync, reason: event.RelistExpired}
			}
			w.mu.Unlock()
			w.log.Warn("watch position expired (410); relisting", zap.String("resourceVersion", w.rv), zap.Error(err))
		case outcomeRetry:
			if reason == ReasonOversized {
				err = w.describe(err) // the log says which source and resource
			}
			w.failures.Fail(err, zap.String("reason", reason))
		}
		w.o.Metrics.WatchRestarts.WithLabelValues(w.o.Source, reason).Inc()
		w.o.OnEstablished(false)
		if !retry.Sleep(ctx, pause(backoff, reason)) {
			return ctx.Err()
		}
	}
}

// begin takes the start position on the first call of Run.
func (w *Watcher) begin(st Start) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.started {
		return
	}
	w.started = true
	w.rv, w.epoch = st.ResourceVersion, st.Epoch
	if st.Relist != "" {
		w.listing = &listPlan{origin: event.OriginResync, reason: st.Relist}
	} else if w.rv == "" && st.Snapshot {
		w.listing = &listPlan{origin: event.OriginInitial, reason: event.RelistInitial}
	}
}

// nextRequest is what Run asks the apiserver for next.
type nextRequest int

const (
	nextWatch      nextRequest = iota // a watch from the position
	nextCurrentRV                     // no position and no list due: the current resourceVersion, then a watch from it
	nextStreamList                    // a list is due: the streaming list (a watch)
	nextListPages                     // a list is due and the server refused the streaming list: LIST pages, then a watch
)

// decideNext picks the next request from the position rv, whether a list
// is due, and whether the server refused the streaming list.
func decideNext(rv string, listing, noStream bool) nextRequest {
	switch {
	case listing && noStream:
		return nextListPages
	case listing:
		return nextStreamList
	case rv == "":
		return nextCurrentRV
	}
	return nextWatch
}

func (w *Watcher) next() nextRequest { return decideNext(w.rv, w.listing != nil, w.noStream) }

// fromCurrentRV moves the position to the collection's current
// resourceVersion. When it did not (ok false), Run tries again, after a
// backoff for a transient error, unless err is non-nil: a permanent error
// or ctx's.
func (w *Watcher) fromCurrentRV(ctx context.Context, backoff *retry.Delays) (ok bool, err error) {
	rv, err := w.currentRV(ctx)
	switch {
	case err == nil:
		w.setRV(rv)
		return true, nil
	case w.refusedMetadata(err):
		return false, nil
	}
	if perm := permanent(err); perm != "" {
		w.o.Metrics.WatchRestarts.WithLabelValues(w.o.Source, perm).Inc()
		return false, w.describe(err)
	}
	if tooLarge := (*tooLargeError)(nil); errors.As(err, &tooLarge) {
		w.o.Metrics.WatchRestarts.WithLabelValues(w.o.Source, ReasonOversized).Inc()
		err = w.describe(err)
	}
	w.log.Warn("cannot read the current resourceVersion; retrying", zap.Error(err))
	if !retry.Sleep(ctx, backoff.Step()) {
		return false, ctx.Err()
	}
	return false, nil
}

// listAndWatch makes one list (if due) and watch: one attempt of Run's
// request loop.
func (w *Watcher) listAndWatch(ctx context.Context, h Handler) error {
	switch w.next() {
	case nextListPages:
		if err := w.listPages(ctx, h); err != nil {
			return err
		}
		return w.watch(ctx, h, false)
	case nextStreamList:
		return w.watch(ctx, h, true)
	}
	return w.watch(ctx, h, false)
}

// outcome is what Run does after a listAndWatch.
type outcome int

const (
	outcomeResume       outcome = iota // the server ended the watch (timeoutSeconds): watch again at once
	outcomeRetry                       // a transient failure: retry after a backoff
	outcomeRelist                      // the position expired (410): relist
	outcomeNoStream                    // the server refused the streaming list: LIST pages from now on, at once
	outcomeWholeObjects                // the server refused PartialObjectMetadata: whole objects from now on, at once
	outcomeHandler                     // the handler failed: Run returns its error
	outcomeRequested                   // a relist was requested (Request): list at once
	outcomePermanent                   // retrying cannot help (forbidden, not found): Run returns the error
)

// outcomeOf decides what follows a listAndWatch that ended with err (nil: the
// server ended the watch), with reason, the watch restart reason counted
// for it (none for outcomeNoStream, outcomeWholeObjects and
// outcomeHandler). metadataOnly: requests asked for PartialObjectMetadata.
func outcomeOf(err error, metadataOnly bool) (outcome, string) {
	switch {
	case err == nil:
		return outcomeResume, ReasonTimeout
	case errors.Is(err, errStreamingUnsupported):
		return outcomeNoStream, ""
	case errors.Is(err, errRelistRequested):
		return outcomeRequested, ""
	case apierrors.IsResourceExpired(err) || apierrors.IsGone(err):
		return outcomeRelist, ReasonExpired
	case errors.Is(err, handlerError{}):
		return outcomeHandler, ""
	case refusesMetadata(err, metadataOnly):
		return outcomeWholeObjects, ""
	}
	if perm := permanent(err); perm != "" {
		return outcomePermanent, perm
	}
	var tooLarge *tooLargeError
	switch {
	case errors.Is(err, errIdle):
		return outcomeRetry, ReasonIdle
	case errors.As(err, &tooLarge):
		return outcomeRetry, ReasonOversized
	case isConnErr(err):
		return outcomeRetry, ReasonClosed
	}
	return outcomeRetry, ReasonError
}

// pause is how long Run waits after an attempt that ended with the
// restart reason; it steps backoff. A watch the server ended is resumed at
// once (not a failure). After a healthy minute (retry.ResetAfter without a
// failure) backoff starts over; repeated failures (including a 410 storm)
// grow it, so the apiserver never sees a hot loop. The first 410 after a
// healthy minute relists at once.
func pause(backoff *retry.Delays, reason string) time.Duration {
	if reason == ReasonTimeout {
		return 0
	}
	healthy := backoff.Fresh()
	d := backoff.Step()
	if reason == ReasonExpired && healthy {
		d = 0
	}
	return d
}

// metadataOnly reports whether requests ask for PartialObjectMetadata.
func (w *Watcher) metadataOnly() bool { return w.o.MetadataOnly && !w.wholeObjects }

// refusesMetadata reports whether err is the server refusing a
// PartialObjectMetadata request (406 Not Acceptable: an aggregated
// apiserver not built on k8s.io/apiserver may not convert) made because
// metadataOnly.
func refusesMetadata(err error, metadataOnly bool) bool {
	return metadataOnly && apierrors.IsNotAcceptable(err)
}

// refusedMetadata reports whether err is the server refusing a
// PartialObjectMetadata request, and if so switches to whole objects.
func (w *Watcher) refusedMetadata(err error) bool {
	if !refusesMetadata(err, w.metadataOnly()) {
		return false
	}
	w.useWholeObjects(err)
	return true
}

// useWholeObjects switches to whole objects after the server refused
// PartialObjectMetadata (err); only their metadata is published: the
// source keeps working, at the cost the option would have saved.
func (w *Watcher) useWholeObjects(err error) {
	w.log.Warn("PartialObjectMetadata not served; fetching whole objects from now on", zap.Error(err),
		zap.String("effect", "still publishing only their metadata"))
	w.wholeObjects = true
}

// setTypeMeta gives obj the resource's apiVersion and kind: a
// PartialObjectMetadata says meta.k8s.io/v1 PartialObjectMetadata; a list
// item of a built-in kind says nothing.
func (w *Watcher) setTypeMeta(obj *event.Object) {
	if w.o.MetadataOnly {
		obj.OverrideTypeMeta(w.apiVersion, w.o.Resource.Kind)
	} else {
		obj.DefaultTypeMeta(w.apiVersion, w.o.Resource.Kind)
	}
}

func (w *Watcher) setRV(rv string) {
	w.mu.Lock()
	w.rv = rv
	w.mu.Unlock()
}

// describe wraps a permanent error with the source and resource.
func (w *Watcher) describe(err error) error {
	scope := "all namespaces"
	if w.o.Namespace != "" {
		scope = "namespace " + w.o.Namespace
	}
	return fmt.Errorf("source %q: list/watch %s (%s) in %s: %w",
		w.o.Source, w.o.Resource.Resource, w.o.Resource.APIVersion(), scope, err)
}

// permanent classifies errors that retrying the same request cannot fix.
func permanent(err error) string {
	switch {
	case apierrors.IsForbidden(err), apierrors.IsUnauthorized(err):
		return ReasonForbidden
	case apierrors.IsNotFound(err):
		return ReasonNotFound
	}
	return ""
}

// isConnErr reports whether err is the connection to the apiserver
// breaking (restart reason "closed"), classified as client-go classifies it.
func isConnErr(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.EPIPE) ||
		utilnet.IsProbableEOF(err) || utilnet.IsConnectionReset(err) || utilnet.IsConnectionRefused(err) ||
		utilnet.IsHTTP2ConnectionLost(err)
}

type handlerError struct{ err error }

func (e handlerError) Error() string        { return e.err.Error() }
func (e handlerError) Unwrap() error        { return e.err }
func (e handlerError) Is(target error) bool { _, ok := target.(handlerError); return ok }

var errStreamingUnsupported = errors.New("streaming list not supported")

// request starts a LIST (list) or WATCH request of the collection.
func (w *Watcher) request(list bool) *rest.Request {
	r := w.o.Client.Get().Resource(w.o.Resource.Resource)
	if w.metadataOnly() {
		if list {
			r = r.SetHeader("Accept", AcceptPartialObjectMetadataList)
		} else {
			r = r.SetHeader("Accept", AcceptPartialObjectMetadata)
		}
	}
	if w.o.Namespace != "" {
		r = r.Namespace(w.o.Namespace)
	}
	if w.o.LabelSelector != "" {
		r = r.Param("labelSelector", w.o.LabelSelector)
	}
	if w.o.FieldSelector != "" {
		r = r.Param("fieldSelector", w.o.FieldSelector)
	}
	return r
}

// RawResult returns the body of a request's result, or its error with the
// apiserver's Status decoded: Result.Raw (like DoRaw) returns an error
// without it, so a 403 would say "unknown (get configmaps)" instead of
// "configmaps is forbidden: User ... cannot list resource ...".
func RawResult(res rest.Result) ([]byte, error) {
	body, err := res.Raw()
	if err != nil {
		return nil, res.Error()
	}
	return body, nil
}

// readList runs a LIST request of at most limit items and returns its
// body, read up to MaxObjectBytes plus listPageSlack (the rest of a page
// of one item), whatever limit is: more is a *tooLargeError, about an
// item when limit is 1, else about the page (smallerPage then asks for
// fewer items), and nothing past the bound is read.
func (w *Watcher) readList(ctx context.Context, r *rest.Request, limit int64) ([]byte, error) {
	body, err := r.Stream(ctx)
	if err != nil {
		return nil, err
	}
	defer body.Close()
	b, err := readAtMost(body, w.o.MaxObjectBytes+listPageSlack, tooLargePage)
	var tooLarge *tooLargeError
	if errors.As(err, &tooLarge) && limit <= 1 {
		tooLarge.what, tooLarge.max = tooLargeItem, w.o.MaxObjectBytes
	}
	return b, err
}

// currentRV reads the collection's current resourceVersion with a
// one-item consistent LIST.
func (w *Watcher) currentRV(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, w.o.IdleTimeout)
	defer cancel()
	body, err := w.readList(ctx, w.request(true).Param("limit", "1"), 1)
	if err != nil {
		return "", err
	}
	var l struct {
		Metadata metav1.ListMeta `json:"metadata"`
	}
	if err := json.Unmarshal(body, &l); err != nil {
		return "", fmt.Errorf("decode list: %w", err)
	}
	if l.Metadata.ResourceVersion == "" {
		return "", errors.New("list response has no resourceVersion")
	}
	return l.Metadata.ResourceVersion, nil
}

// beginList emits sync.started for a new relist epoch.
func (w *Watcher) beginList(ctx context.Context, h Handler) (event.SyncEvent, error) {
	w.mu.Lock()
	w.epoch++
	plan := *w.listing
	from := w.rv
	ep := w.epoch
	w.mu.Unlock()
	w.o.Metrics.Relists.WithLabelValues(w.o.Source, string(plan.reason)).Inc()
	w.o.Metrics.Epoch.WithLabelValues(w.o.Source).Set(float64(ep))
	s := event.SyncEvent{Namespace: w.o.Namespace, Epoch: ep, Reason: plan.reason, RequestID: plan.requestID, Full: plan.full,
		FromResourceVersion: from, Time: time.Now()}
	it := &Item{Kind: ItemSyncStarted, Epoch: ep, Sync: s, ReadAt: s.Time}
	if err := h(ctx, it); err != nil {
		return s, handlerError{err}
	}
	return s, nil
}

// endList emits sync.completed and switches to watching from rv.
func (w *Watcher) endList(ctx context.Context, h Handler, s event.SyncEvent, rv string, n int64) error {
	s.Completed = true
	s.ToResourceVersion = rv
	// The handler compares the list with its object index and fills in the
	// other counts.
	s.Counts = event.SyncCounts{Total: n}
	s.Time = time.Now()
	w.mu.Lock()
	w.rv = rv
	w.listing = nil
	requested := w.requested != nil
	w.mu.Unlock()
	it := &Item{Kind: ItemSyncCompleted, Epoch: s.Epoch, Sync: s, ResourceVersion: rv, ReadAt: s.Time}
	if err := h(ctx, it); err != nil {
		return handlerError{err}
	}
	w.log.Info("list completed", zap.String("reason", string(s.Reason)), zap.Int64("objects", n),
		zap.String("from", s.FromResourceVersion), zap.String("to", rv), zap.Uint64("epoch", s.Epoch), zap.String("requestId", s.RequestID))
	if requested { // asked for during this list: list again now
		return errRelistRequested
	}
	return nil
}

// listPages lists with a paginated LIST at a consistent resourceVersion.
func (w *Watcher) listPages(ctx context.Context, h Handler) error {
	s, err := w.beginList(ctx, h)
	if err != nil {
		return err
	}
	origin := w.listing.origin
	var (
		cont string
		rv   string
		n    int64
	)
	limit := w.o.PageSize
	for {
		r := w.request(true).Param("limit", strconv.FormatInt(limit, 10))
		if cont != "" {
			r = r.Param("continue", cont)
		}
		meta, err := w.listPage(ctx, r, limit, func(raw []byte) error {
			obj, err := event.ParseObjectShaped(raw, w.o.Shaping)
			if err != nil {
				w.log.Error("skipping unparsable list item (reported, not published)", zap.Error(err))
				return nil
			}
			// LIST items of built-in kinds carry no apiVersion/kind, those
			// of a PartialObjectMetadataList meta.k8s.io/v1's.
			w.setTypeMeta(&obj)
			n++
			it := &Item{Kind: ItemObject, Type: event.Added, Origin: origin, Object: obj, Epoch: s.Epoch, ReadAt: time.Now()}
			if err := h(ctx, it); err != nil {
				return handlerError{err}
			}
			return nil
		})
		if smaller, ok := w.smallerPage(err, limit); ok {
			limit = smaller // nothing of the page was handled: ask again
			continue
		}
		if err != nil {
			return err // a 410 on a continue token restarts the whole list
		}
		if rv == "" {
			rv = meta.ResourceVersion
		}
		cont = meta.Continue
		if cont == "" {
			break
		}
	}
	if rv == "" {
		return errors.New("list response has no resourceVersion")
	}
	return w.endList(ctx, h, s, rv, n)
}

// smallerPage is the page size to ask for again after a page of limit
// items failed with err, when it failed for being over its bound
// (readList): half as many items, for the rest of this list.
func (w *Watcher) smallerPage(err error, limit int64) (int64, bool) {
	var tooLarge *tooLargeError
	if !errors.As(err, &tooLarge) || tooLarge.what != tooLargePage || limit <= 1 {
		return 0, false
	}
	w.log.Info("LIST page larger than watch.maxObjectBytes allows; asking for fewer items per page",
		zap.Int64("limit", limit), zap.Int64("bytesRead", tooLarge.read), zap.Int64("newLimit", limit/2))
	return limit / 2, true
}

// listPage runs one LIST request of at most limit items and calls item
// with each item's JSON, a sub-slice of the page: the page is held once,
// not also as a copy of every item. It is read whole within IdleTimeout
// before any item is handled, so a handler blocked by backpressure never
// stalls the response (the apiserver would cut a LIST that takes over its
// request timeout). An item over MaxObjectBytes is a *tooLargeError.
func (w *Watcher) listPage(ctx context.Context, r *rest.Request, limit int64, item func([]byte) error) (metav1.ListMeta, error) {
	var meta metav1.ListMeta
	pctx, cancel := context.WithTimeout(ctx, w.o.IdleTimeout)
	body, err := w.readList(pctx, r, limit)
	cancel()
	if err != nil {
		return meta, err
	}
	var itemErr error
	raw, err := event.ScanList(body, func(b []byte) error {
		if n := int64(len(b)); n > w.o.MaxObjectBytes {
			itemErr = &tooLargeError{what: tooLargeItem, read: n, max: w.o.MaxObjectBytes}
		} else {
			itemErr = item(b)
		}
		return itemErr
	})
	switch {
	case itemErr != nil:
		return meta, itemErr
	case err != nil:
		return meta, fmt.Errorf("decode list page: %w", err)
	}
	if raw != nil {
		if err := json.Unmarshal(raw, &meta); err != nil {
			return meta, fmt.Errorf("decode list page metadata: %w", err)
		}
	}
	return meta, nil
}

var initialEventsEnd = []byte(`"` + metav1.InitialEventsAnnotationKey + `":"true"`)

// watch runs one watch request. With streamList it is a streaming list:
// initial events, the initial-events-end bookmark, then the watch.
func (w *Watcher) watch(ctx context.Context, h Handler, streamList bool) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// A requested relist (Request) ends the request, not ctx: between
	// frames, never inside the handler.
	rctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	w.setStop(stop)
	defer w.setStop(nil)

	s := watchStream{h: h, streamList: streamList, origin: event.OriginWatch}
	if streamList {
		var err error
		if s.sync, err = w.beginList(ctx, h); err != nil {
			return err
		}
	}
	req := w.watchRequest(streamList)
	s.idle = time.AfterFunc(w.o.IdleTimeout, func() { cancel(errIdle) })
	defer s.idle.Stop()
	body, err := req.Stream(rctx)
	if err != nil {
		return watchStartErr(context.Cause(rctx), err, streamList)
	}
	defer body.Close()
	w.o.OnEstablished(true)
	w.failures.OK()

	frames := newFrameReader(body, int(w.o.MaxObjectBytes))
	defer frames.Close()
	if streamList {
		s.origin = w.listing.origin
	}
	var p parsedFrame
	valid := func(line []byte) bool { return p.parse(line, w.o.Shaping) }
	for {
		frame, parsed, err := frames.NextLine(valid)
		if err != nil {
			return watchEndErr(context.Cause(rctx), err, s.streamList)
		}
		if !parsed {
			p.parse(frame, w.o.Shaping)
		}
		if err := w.frame(ctx, &s, frame, &p); err != nil {
			return err
		}
	}
}

// parsedFrame is a watch frame parsed by event.ParseWatchEventShaped, and
// when it was read.
type parsedFrame struct {
	readAt time.Time
	typ    string
	o      event.Object
	err    error
}

// parse parses frame into p and reports whether it is a valid watch event.
func (p *parsedFrame) parse(frame []byte, s *event.Shaping) bool {
	p.readAt = time.Now()
	p.typ, p.o, p.err = event.ParseWatchEventShaped(frame, s)
	return p.err == nil
}

// watchStream is the state of one watch request, for its frames.
type watchStream struct {
	h          Handler
	idle       *time.Timer // cancels the watch after IdleTimeout without a frame
	streamList bool        // in the initial events of a streaming list
	sync       event.SyncEvent
	origin     event.Origin
	n          int64 // objects of the streaming list
	// item is the Item of every object frame, reused: like its Object,
	// it is valid only during the Handler call.
	item Item
}

// watchRequest is the request of a watch, or of a streaming list. It
// asks for the stream uncompressed (Accept-Encoding: identity; LIST pages
// keep the transport's gzip): a gzipped response holds a decompressor
// (~50 KB: its 32 KiB window, state and buffers) for as long as the watch
// is open, a quarter of what a quiet watch held before
// (docs/PERFORMANCE.md, "Memory per watch").
func (w *Watcher) watchRequest(streamList bool) *rest.Request {
	req := w.request(false).
		SetHeader("Accept-Encoding", "identity").
		Param("watch", "true").
		Param("allowWatchBookmarks", "true").
		Param("timeoutSeconds", strconv.Itoa(int(w.o.Timeout/time.Second)))
	if streamList {
		return req.Param("sendInitialEvents", "true").
			Param("resourceVersionMatch", string(metav1.ResourceVersionMatchNotOlderThan)).
			Param("resourceVersion", "")
	}
	return req.Param("resourceVersion", w.rv)
}

// watchStartErr is what watch returns when its request failed with err;
// cause is the watch context's.
func watchStartErr(cause, err error, streamList bool) error {
	if errors.Is(cause, errIdle) || errors.Is(cause, errRelistRequested) {
		return cause
	}
	if streamList && (apierrors.IsBadRequest(err) || apierrors.IsInvalid(err)) {
		return fmt.Errorf("%w: %v", errStreamingUnsupported, err)
	}
	return err
}

// watchEndErr is what watch returns when reading the next frame failed
// with err (io.EOF: the server ended the stream between frames); cause is
// the watch context's.
func watchEndErr(cause, err error, streamList bool) error {
	if errors.Is(cause, errIdle) || errors.Is(cause, errRelistRequested) {
		return cause
	}
	if errors.Is(err, io.EOF) {
		if streamList {
			return io.ErrUnexpectedEOF // the list did not finish
		}
		return nil
	}
	return err
}

// frame handles one watch frame.
// p is the frame parsed (one pass over the frame for type, object and its
// metadata). Only an ERROR frame may carry an object without metadata (a
// Status).
func (w *Watcher) frame(ctx context.Context, s *watchStream, frame []byte, p *parsedFrame) error {
	typ, o, err, readAt := p.typ, &p.o, p.err, p.readAt
	obj := o.Raw
	if err != nil {
		var ferr error
		if typ, obj, ferr = event.ParseWatchFrame(frame); ferr != nil {
			return fmt.Errorf("bad watch frame: %w", ferr)
		}
		if typ != "ERROR" {
			return fmt.Errorf("bad object in %s watch frame: %w", typ, err)
		}
	}
	switch typ {
	case "ADDED", "MODIFIED", "DELETED":
		return w.objectFrame(ctx, s, typ, o, readAt)
	case "BOOKMARK":
		return w.bookmarkFrame(ctx, s, o.Meta.ResourceVersion, obj, readAt)
	case "ERROR":
		return errorFrameErr(obj, s.streamList)
	default:
		return fmt.Errorf("unknown watch event type %q", typ)
	}
}

// objectFrame delivers the object change of an ADDED, MODIFIED or DELETED
// frame.
func (w *Watcher) objectFrame(ctx context.Context, s *watchStream, typ string, o *event.Object, readAt time.Time) error {
	t, _ := event.TypeFromWatch(typ)
	if w.o.MetadataOnly {
		o.OverrideTypeMeta(w.apiVersion, w.o.Resource.Kind)
	}
	it := &s.item
	*it = Item{Kind: ItemObject, Type: t, Origin: s.origin, Object: *o, Epoch: w.epoch, ReadAt: readAt}
	if s.streamList {
		s.n++
	} else {
		it.ResourceVersion = o.Meta.ResourceVersion
		w.lastEvent.Set(float64(readAt.UnixNano()) / 1e9)
	}
	s.idle.Stop()
	if err := s.h(ctx, it); err != nil {
		return handlerError{err}
	}
	// The position moves only once the handler took the item: if it
	// failed (e.g. its context ended while submitting), the resumed
	// watch must read this change again, not start after it. An
	// object without a resourceVersion (no conforming apiserver sends
	// one) must not move it to "": the next watch would start from
	// now and skip changes.
	if it.ResourceVersion != "" {
		w.setRV(it.ResourceVersion)
	}
	s.idle.Reset(w.o.IdleTimeout)
	return nil
}

// bookmarkKind is what a BOOKMARK frame means.
type bookmarkKind int

const (
	bookmarkIgnored  bookmarkKind = iota // inside a streaming list, or without a resourceVersion
	bookmarkListEnd                      // the end of a streaming list's initial events
	bookmarkProgress                     // progress of the watch to its resourceVersion
)

// classifyBookmark says what a BOOKMARK frame with object obj and
// resourceVersion rv means, in a streaming list's initial events
// (streamList) or after them.
func classifyBookmark(streamList bool, obj []byte, rv string) bookmarkKind {
	switch {
	case streamList && bytes.Contains(obj, initialEventsEnd):
		return bookmarkListEnd
	case !streamList && rv != "":
		return bookmarkProgress
	}
	return bookmarkIgnored
}

// bookmarkFrame handles a BOOKMARK frame with object obj and
// resourceVersion rv.
func (w *Watcher) bookmarkFrame(ctx context.Context, s *watchStream, rv string, obj []byte, readAt time.Time) error {
	s.idle.Stop()
	switch classifyBookmark(s.streamList, obj, rv) {
	case bookmarkListEnd:
		if err := w.endList(ctx, s.h, s.sync, rv, s.n); err != nil {
			return err
		}
		s.streamList, s.origin = false, event.OriginWatch
	case bookmarkProgress:
		w.bookmarks.Inc()
		w.lastBookmark.Set(float64(readAt.UnixNano()) / 1e9)
		if err := s.h(ctx, &Item{Kind: ItemBookmark, ResourceVersion: rv, Epoch: w.epoch, ReadAt: readAt}); err != nil {
			return handlerError{err}
		}
		w.setRV(rv)
	}
	s.idle.Reset(w.o.IdleTimeout)
	return nil
}

// errorFrameErr is the error an ERROR frame with object obj ends a watch
// with: a Status error, or errStreamingUnsupported in a streaming list's
// initial events for the errors of a server that cannot send them.
func errorFrameErr(obj []byte, streamList bool) error {
	var st metav1.Status
	if err := json.Unmarshal(obj, &st); err != nil {
		return fmt.Errorf("bad ERROR frame: %w", err)
	}
	if st.Message == "" {
		// A Status without a message, or an object that is no Status,
		// would make an empty error ("error": ""): say what came.
		st.Message = fmt.Sprintf("ERROR watch frame without a message (code %d, reason %q): %.200s", st.Code, st.Reason, obj)
	}
	serr := &apierrors.StatusError{ErrStatus: st}
	if streamList && (st.Code == http.StatusBadRequest || st.Code == http.StatusUnprocessableEntity ||
		strings.Contains(st.Message, "RequestWatchProgress")) {
		return fmt.Errorf("%w: %v", errStreamingUnsupported, serr)
	}
	return serr
}
