package resync

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/relayd/relayd/pkg/event"
	"github.com/relayd/relayd/pkg/watch"
)

// Target is one watch of a source (a *watch.Watch).
type Target interface {
	Namespace() string
	Resync(r watch.Request) (running string, err error)
}

// Targets converts the watches of a source to Targets.
func Targets[T Target](ws []T) []Target {
	out := make([]Target, len(ws))
	for i, w := range ws {
		out[i] = w
	}
	return out
}

// ServerOptions configure a Server.
type ServerOptions struct {
	Conn            *nats.Conn
	Prefix, Cluster string
	Logger          *zap.Logger
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
}

// accepted is a request the server accepted.
type accepted struct {
	id         string
	namespaces []string
	completed  map[string]event.SyncCounts
}

// NewServer returns a Server; Serve subscribes for each source.
func NewServer(o ServerOptions) *Server {
	if o.Remember <= 0 {
		o.Remember = 256
	}
	return &Server{o: o, seen: map[string][]*accepted{}, subs: map[string]*nats.Subscription{}}
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
		rep := s.handle(source, ts, m.Data)
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

// handle answers one request for source.
func (s *Server) handle(source string, ts []Target, data []byte) Reply {
	var req Request
	if err := json.Unmarshal(data, &req); err != nil {
		return Reply{Source: source, Error: "request is not valid JSON: " + err.Error()}
	}
	rep := Reply{ID: req.ID, Source: source}
	if err := CheckID(req.ID); err != nil {
		rep.Error = err.Error()
		return rep
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if a := s.find(source, req.ID); a != nil {
		rep.Duplicate, rep.Namespaces, rep.Completed = true, a.namespaces, maps(a.completed)
		return rep
	}
	scope, err := inScope(source, ts, req.Namespace)
	if err != nil {
		rep.Error = err.Error()
		return rep
	}
	a := &accepted{id: req.ID, completed: map[string]event.SyncCounts{}}
	for _, t := range scope {
		ns := t.Namespace()
		running, err := t.Resync(watch.Request{ID: req.ID, Full: req.Full, Done: func(c event.SyncCounts) { s.done(a, ns, c) }})
		if errors.Is(err, watch.ErrResyncRunning) {
			rep.Error = fmt.Sprintf("source %q: resync %q is still running; retry when it completed", source, running)
			return rep // the watches asked before run this request's resync, as one that failed half-way: the id is not remembered
		}
		a.namespaces = append(a.namespaces, ns)
	}
	s.remember(source, a)
	rep.Namespaces = a.namespaces
	s.o.Logger.Info("resync requested", zap.String("source", source), zap.String("requestId", req.ID),
		zap.Strings("namespaces", a.namespaces), zap.Bool("full", req.Full))
	return rep
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
