package resync

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/relayd/relayd/pkg/event"
	"github.com/relayd/relayd/pkg/watch"
)

// Target is one watch of a source (a *watch.Watch).
type Target interface {
	Namespace() string
	Resync(r watch.Request) (running string, err error)
	// Resyncing is the id of the resync asked for and not completed.
	Resyncing() string
}

// Targets converts the watches of a source to Targets.
func Targets[T Target](ws []T) []Target {
	out := make([]Target, len(ws))
	for i, w := range ws {
		out[i] = w
	}
	return out
}

// DefaultMinFullInterval is ServerOptions.MinFullInterval's default (the
// config's resync.minFullInterval).
const DefaultMinFullInterval = 5 * time.Minute

// refusalLogInterval is how often at most a refused reply subject is
// logged; the lines between are summed up in the next.
const refusalLogInterval = time.Minute

// ServerOptions configure a Server.
type ServerOptions struct {
	Conn            *nats.Conn
	Prefix, Cluster string
	Logger          *zap.Logger
	// Replies are the reply subjects answered on; a request with another
	// is neither answered nor acted on.
	Replies ReplyPolicy
	// MinFullInterval is the least time between the start of a full
	// resync of a source and the next (and between the completion of one
	// and the next); default DefaultMinFullInterval.
	MinFullInterval time.Duration
	// Metrics count the requests; nil: not counted.
	Metrics *Metrics
	// Now is the clock; default time.Now.
	Now func() time.Time
	// Remember is how many request ids per source are remembered for
	// duplicate detection; default 256.
	Remember int
}

// Server answers the resync requests of the sources this replica runs.
type Server struct {
	o  ServerOptions
	mu sync.Mutex
	// seen are the accepted requests by source and id, oldest first.
	seen map[string][]*accepted
	subs map[string]*nats.Subscription // by source
	// lastFull is when the last full resync of a source started or
	// completed, whichever is later.
	lastFull map[string]time.Time
	refused  refusals
	// captured are the event stream's subjects (SetStreamSubjects).
	captured atomic.Pointer[[]string]
}

// accepted is a request the server accepted.
type accepted struct {
	id, source string
	full       bool
	namespaces []string
	completed  map[string]event.SyncCounts
}

// refusals are the refused reply subjects not logged yet.
type refusals struct {
	logged time.Time // the last line
	n      int       // refused since
}

// NewServer returns a Server; Serve subscribes for each source.
func NewServer(o ServerOptions) *Server {
	if o.Remember <= 0 {
		o.Remember = 256
	}
	if o.MinFullInterval <= 0 {
		o.MinFullInterval = DefaultMinFullInterval
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if len(o.Replies.Inboxes) == 0 {
		o.Replies.Inboxes = []string{DefaultInboxPrefix}
	}
	s := &Server{o: o, seen: map[string][]*accepted{}, subs: map[string]*nats.Subscription{}, lastFull: map[string]time.Time{}}
	if s.o.Replies.Captured == nil {
		s.o.Replies.Captured = func() []string {
			if p := s.captured.Load(); p != nil {
				return *p
			}
			return nil
		}
	}
	return s
}

// Serve answers the requests for source, whose watches are ts, until Stop
// (source). A subscription that fails is logged: the source then has no
// responder, which the client reports. A nil Server serves nothing.
func (s *Server) Serve(source string, ts []Target) {
	if s == nil {
		return
	}
	s.Stop(source)
	subj := Subject(s.o.Prefix, s.o.Cluster, source)
	sub, err := s.o.Conn.Subscribe(subj, func(m *nats.Msg) {
		rep, ok := s.serve(source, ts, m.Reply, m.Data)
		if !ok {
			return
		}
		b, _ := json.Marshal(rep)
		if err := m.Respond(b); err != nil {
			s.o.Logger.Warn("cannot answer a resync request", zap.String("source", source), zap.Error(err))
		}
	})
	if err != nil {
		s.o.Logger.Error("cannot subscribe to the resync requests of a source; `relayd resync` cannot reach it", zap.String("source", source), zap.String("subject", subj), zap.Error(err))
		return
	}
	s.mu.Lock()
	s.subs[source] = sub
	s.mu.Unlock()
}

// SetStreamSubjects records the event stream's subjects as last found
// (stream.Keep): no answer goes to a subject they capture. Without
// ServerOptions.Replies.Captured, these are the ones checked. A nil
// Server ignores it.
func (s *Server) SetStreamSubjects(subjects []string) {
	if s != nil && subjects != nil {
		s.captured.Store(&subjects)
	}
}

// Stop stops answering the requests for source.
func (s *Server) Stop(source string) {
	if s == nil {
		return
	}
	s.mu.Lock()
	sub := s.subs[source]
	delete(s.subs, source)
	s.mu.Unlock()
	if sub != nil {
		_ = sub.Unsubscribe()
	}
}

// serve handles one request for source with reply subject reply: the
// reply to send, and whether to send one (false: the reply subject is
// refused, and the request was not acted on).
func (s *Server) serve(source string, ts []Target, reply string, data []byte) (Reply, bool) {
	if why := s.o.Replies.Check(reply); why != "" {
		s.count(source, ResultBadReply)
		s.refusedReply(source, reply, why)
		return Reply{}, false
	}
	rep, result := s.handle(source, ts, data)
	s.count(source, result)
	return rep, true
}

func (s *Server) count(source, result string) {
	if s.o.Metrics != nil {
		s.o.Metrics.Requests.WithLabelValues(source, result).Inc()
	}
}

// refusedReply logs a refused reply subject: the first at once, the next
// ones at most once per refusalLogInterval, with how many there were.
func (s *Server) refusedReply(source, reply, why string) {
	s.mu.Lock()
	r := &s.refused
	r.n++
	now := s.o.Now()
	if !r.logged.IsZero() && now.Sub(r.logged) < refusalLogInterval {
		s.mu.Unlock()
		return
	}
	n := r.n
	r.n, r.logged = 0, now
	s.mu.Unlock()
	s.o.Logger.Warn("resync requests not answered and not acted on: their reply subject is not an inbox relayd answers on (a requester trying to make relayd publish elsewhere, or an inbox prefix missing from resync.requesterInboxPrefixes); requests counts them since the previous line of this kind (at most one a minute), replySubject is the last",
		zap.Int("requests", n),
		zap.String("source", source), zap.String("replySubject", reply), zap.String("reason", why),
		zap.Strings("inboxPrefixes", s.o.Replies.Inboxes))
}

// handle answers one request for source, with the result to count.
func (s *Server) handle(source string, ts []Target, data []byte) (Reply, string) {
	var req Request
	if err := json.Unmarshal(data, &req); err != nil {
		return Reply{Source: source, Error: "request is not valid JSON: " + err.Error()}, ResultInvalid
	}
	rep := Reply{ID: req.ID, Source: source}
	if err := CheckID(req.ID); err != nil {
		rep.Error = err.Error()
		return rep, ResultInvalid
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if a := s.find(source, req.ID); a != nil {
		rep.Duplicate, rep.Namespaces, rep.Completed = true, a.namespaces, maps(a.completed)
		return rep, ResultDuplicate
	}
	scope, err := inScope(source, ts, req.Namespace)
	if err != nil {
		rep.Error = err.Error()
		return rep, ResultInvalid
	}
	// One resync of a source at a time, whatever the namespaces: asked of
	// no watch while any of the source's runs (so none runs half of it).
	for _, t := range ts {
		if running := t.Resyncing(); running != "" {
			rep.Error = fmt.Sprintf("source %q: resync %q is still running; retry when it completed", source, running)
			return rep, ResultRunning
		}
	}
	now := s.o.Now()
	if last, ok := s.lastFull[source]; req.Full && ok && now.Sub(last) < s.o.MinFullInterval {
		next := last.Add(s.o.MinFullInterval)
		rep.Error = fmt.Sprintf("source %q: the last full resync started or completed at %s; the next is allowed from %s, in %s (resync.minFullInterval %s); a resync without --full is allowed now",
			source, last.UTC().Format(time.RFC3339), next.UTC().Format(time.RFC3339), next.Sub(now).Round(time.Second), s.o.MinFullInterval)
		rep.NextFull = next.UTC()
		return rep, ResultTooSoon
	}
	a := &accepted{id: req.ID, source: source, full: req.Full, completed: map[string]event.SyncCounts{}}
	for _, t := range scope {
		ns := t.Namespace()
		running, err := t.Resync(watch.Request{ID: req.ID, Full: req.Full, Done: func(c event.SyncCounts) { s.done(a, ns, c) }})
		if errors.Is(err, watch.ErrResyncRunning) {
			// Unreachable while the server is the only one asking the
			// watches: it checked Resyncing above, under s.mu.
			rep.Error = fmt.Sprintf("source %q: resync %q is still running; retry when it completed", source, running)
			return rep, ResultRunning
		}
		a.namespaces = append(a.namespaces, ns)
	}
	s.remember(source, a)
	if req.Full {
		s.lastFull[source] = now
	}
	rep.Namespaces = a.namespaces
	s.o.Logger.Info("resync requested", zap.String("source", source), zap.String("requestId", req.ID),
		zap.Strings("namespaces", a.namespaces), zap.Bool("full", req.Full))
	return rep, ResultAccepted
}

// inScope are the watches of source a request for namespace ns relists.
func inScope(source string, ts []Target, ns string) ([]Target, error) {
	if ns == "" {
		return ts, nil
	}
	var names []string
	for _, t := range ts {
		if t.Namespace() == ns {
			return []Target{t}, nil
		}
		names = append(names, t.Namespace())
	}
	if slices.Contains(names, "") {
		return nil, fmt.Errorf("source %q watches all namespaces (or a cluster-scoped kind) in one watch: --namespace cannot narrow its resync", source)
	}
	return nil, fmt.Errorf("source %q does not watch namespace %q (it watches %s)", source, ns, strings.Join(names, ", "))
}

func (s *Server) find(source, id string) *accepted {
	for _, a := range s.seen[source] {
		if a.id == id {
			return a
		}
	}
	return nil
}

func (s *Server) remember(source string, a *accepted) {
	l := append(s.seen[source], a)
	if len(l) > s.o.Remember {
		l = l[len(l)-s.o.Remember:]
	}
	s.seen[source] = l
}

// done records the counts of a watch's sync.completed of request a.
func (s *Server) done(a *accepted, ns string, c event.SyncCounts) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a.completed[ns] = c
	if a.full && len(a.completed) == len(a.namespaces) {
		s.lastFull[a.source] = s.o.Now()
	}
}

func maps(m map[string]event.SyncCounts) map[string]event.SyncCounts {
	if len(m) == 0 {
		return nil
	}
	out := make(map[string]event.SyncCounts, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
