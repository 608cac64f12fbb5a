package index

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/relayd/relayd/pkg/event"
)

// CatchUpConsumerInactive is how long the NATS server keeps the index
// catch-up's consumer after its last pull. A catch-up read (shared by the
// watches that start together, see CatchUp) reads through one ordered
// consumer (nats.go replaces it only after a gap in its delivery)
// and never deletes it, so relayd needs no right to delete consumers on a
// shared stream (docs/DEPLOY.md, "NATS permissions"): the server removes it
// this long after the read ends; without a threshold of our own it would
// keep it for nats.go's default of 5 minutes. The read pulls continuously,
// so a slow catch-up does not outlive its consumer.
const CatchUpConsumerInactive = 30 * time.Second

// CatchUpReader reads the event stream for CatchUp.
//
// The stream may be shared with other clusters' relayds and other
// publishers (docs/GUARANTEES.md, "A shared stream"): a catch-up reads only
// relayd's own subjects and applies only the messages relayd wrote.
type CatchUpReader struct {
	JetStream jetstream.JetStream
	Stream    string // the event stream's name
	// Subject is relayd's own subjects, "<prefix>.<cluster>.>": the only
	// ones a catch-up reads (its consumer's filter).
	Subject string
	// Cluster is relayd's cluster name. A message on Subject whose
	// k8scluster or CloudEvents source names another cluster, or that is
	// no relayd event at all, was written by another publisher: it is
	// counted (Foreign), logged once per catch-up and never applied.
	Cluster string
	// Foreign, if set, counts those messages by the source whose catch-up
	// read them.
	Foreign *prometheus.CounterVec
	// OnLastSeq, if set, is given the stream's last sequence at the start
	// of every catch-up read (relayd seeds the sink's stream sequence with
	// it).
	OnLastSeq func(uint64)

	init  sync.Once
	reads coalescer[catchUpCall, CatchUpResult] // see CatchUp
}

// CatchUpOf names the watch a catch-up is for: only the object events of
// its source (and namespace, "" for all) are applied.
type CatchUpOf struct {
	Source, Namespace string
	From              uint64 // first stream sequence to read; 0: no catch-up
	// Legacy asks for CatchUpResult.Legacy: set when the watch resumes
	// from a checkpoint (and so republishes what came after it), not for a
	// whole-stream read.
	Legacy bool
	// EpochOnly reads only CatchUpResult.Epoch: the index is left as it is
	// (a watch that relists because its bucket was lost, and whose epoch
	// floor went with the bucket).
	EpochOnly bool
}

// Fix is one correction a catch-up found: the bucket's entry of UID must
// become Object, or be deleted.
type Fix struct {
	UID     string
	Object  Object
	Deleted bool
}

// CatchUpResult is what CatchUp read and found.
type CatchUpResult struct {
	To    uint64 // the stream's last sequence when the catch-up began
	Read  int    // messages read in [From, To]
	Fixes []Fix  // the bucket entries to write, one per object at most
	// Legacy holds the CloudEvents ids of the watch's messages in the range
	// that an older relayd stored with a Nats-Msg-Id without the cluster
	// (event.Encoder.LegacyMsgID): republished after an upgrade, they must
	// get that id again to be dropped as duplicates. Nil when none.
	Legacy map[string]struct{}
	// Foreign is how many messages in the range another publisher wrote.
	Foreign int
	// Epoch is the highest relaydepoch of the watch's messages in the
	// range (0: none): a relist after it must take a higher one, or its
	// sync markers would repeat Nats-Msg-Ids JetStream drops as duplicates.
	Epoch uint64
	// Last holds, with Legacy (a resume from the checkpoint), the
	// resourceVersion of the last message of each object of the watch in
	// the range (uid -> resourceVersion): the watch replays the changes
	// before it, and must publish none of them again (see the watch's
	// replay fences). Nil when none.
	Last map[string]string
}

// CatchUp brings x (loaded from the bucket) up to what the event stream
// holds for one watch. An index entry is written after its event's PubAck,
// so a crash between the two leaves the bucket behind the stream. A watch
// that resumes from its checkpoint replays those changes and rewrites their
// entries, but one whose position has expired (410) relists instead and
// would compare the list with the stale entries: a delete of an object
// whose last version never reached the bucket would go unreported, or be
// reported with an older resourceVersion than one already published. So,
// before anything else, every message of the watch on the stream from
// c.From on (read on relayd's own subjects, written by relayd itself: see
// CatchUpReader) is applied to x, in stream order (per object that is publish
// order); the objects whose entry ends up different from the bucket's are
// returned as Fixes, once each (written message by message, an object seen
// several times would be written back through its older versions).
//
// The catch-ups asked for together (the watches of a relayd start
// together) share one read (see coalescer): one stream info request and one
// ordered consumer on relayd's subjects from the lowest c.From among them
// to the stream's last sequence when the read began, each message decoded
// once and applied to the index of every watch it belongs to whose range
// holds it. The number of consumers and JetStream API requests at start
// does not grow with the number of watches (docs/ARCHITECTURE.md,
// "Start-up reads are shared").
func (s *CatchUpReader) CatchUp(ctx context.Context, log *zap.Logger, x *Index, c CatchUpOf) (CatchUpResult, error) {
	s.init.Do(func() { s.reads.read = s.readShared })
	return s.reads.do(ctx, catchUpCall{log: log, x: x, c: c})
}

// catchUpCall is one CatchUp call.
type catchUpCall struct {
	log *zap.Logger
	x   *Index
	c   CatchUpOf
}

// readShared is the shared read of the catch-ups qs.
func (s *CatchUpReader) readShared(ctx context.Context, qs []catchUpCall) ([]CatchUpResult, error) {
	stream, err := s.JetStream.Stream(ctx, s.Stream)
	if err != nil {
		return nil, err
	}
	st := stream.CachedInfo().State
	if s.OnLastSeq != nil {
		s.OnLastSeq(st.LastSeq)
	}
	out := make([]CatchUpResult, len(qs))
	r := reader{cluster: s.Cluster, watches: map[string][]*applier{}}
	var low *applier
	for i, q := range qs {
		out[i].To = st.LastSeq
		if q.c.From == 0 || q.c.From > st.LastSeq {
			continue
		}
		a := &applier{x: q.x, c: q.c, log: q.log, before: map[string]before{}}
		r.add(a)
		if low == nil || a.c.From < low.c.From {
			low = a
		}
	}
	if low == nil {
		return out, nil
	}
	if low.c.From < st.FirstSeq {
		low.log.Warn("stream messages removed by its limits before the index caught up",
			zap.Uint64("fromStreamSeq", low.c.From), zap.Uint64("streamFirstSeq", st.FirstSeq),
			zap.String("effect", "if the index lacked any of their changes, it still does"))
	}
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{s.Subject},
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy, OptStartSeq: low.c.From,
		InactiveThreshold: CatchUpConsumerInactive,
	})
	if err != nil {
		return nil, err
	}
	sort.SliceStable(r.all, func(i, j int) bool { return r.all[i].c.From < r.all[j].c.From })
	if err := r.readAll(ctx, cons, low.c.From, st.LastSeq); err != nil {
		return nil, err
	}
	r.reached(math.MaxUint64)
	for i, q := range qs {
		for _, a := range r.watches[watchKey(q.c.Source, q.c.Namespace)] {
			if a.x == q.x {
				out[i].Read, out[i].Fixes, out[i].Legacy, out[i].Foreign, out[i].Last = r.read-a.readFrom, a.fixes(), a.legacy, a.foreign, a.last
				out[i].Epoch = a.epoch
			}
		}
	}
	s.reportForeign(r.watches)
	return out, nil
}

// reportForeign counts and logs, once per source, the messages a shared
// read found on relayd's subjects that relayd did not write.
func (s *CatchUpReader) reportForeign(watches map[string][]*applier) {
	first := map[string]*applier{} // per source, its watch that saw the most
	for _, as := range watches {
		for _, a := range as {
			if f := first[a.c.Source]; a.foreign > 0 && (f == nil || a.foreign > f.foreign) {
				first[a.c.Source] = a
			}
		}
	}
	for src, a := range first {
		if s.Foreign != nil {
			s.Foreign.WithLabelValues(src).Add(float64(a.foreign))
		}
		a.log.Warn("messages on relayd's own subjects that it did not write; not applied to the index",
			zap.Int("messages", a.foreign), zap.String("subjects", s.Subject), zap.Uint64("firstStreamSeq", a.firstForeign),
			zap.String("first", a.why),
			zap.String("remedy", "only this relayd may publish on its subjects: give every cluster's relayd its own cluster name and restrict other publishers (docs/DEPLOY.md, NATS permissions)"))
	}
}

// watchKey keys a watch's appliers in reader.watches.
func watchKey(source, namespace string) string { return source + "/" + namespace }

// reader is a shared catch-up read: it decodes each message once and hands
// it to the appliers of the watches it belongs to.
type reader struct {
	cluster string                // relayd's cluster name
	watches map[string][]*applier // watchKey -> the catch-ups of that watch
	all     []*applier            // every catch-up, by From once reading
	next    int                   // all[:next] have their From read
	read    int                   // messages read
}

func (r *reader) add(a *applier) {
	k := watchKey(a.c.Source, a.c.Namespace)
	r.watches[k] = append(r.watches[k], a)
	r.all = append(r.all, a)
}

// before is an object's index entry before the catch-up.
type before struct {
	o     Object
	known bool
}

// applier applies a catch-up's messages to the index.
type applier struct {
	x   *Index
	c   CatchUpOf
	log *zap.Logger
	// readFrom is how many messages the shared read had read before this
	// catch-up's range began.
	readFrom int
	// uid -> its entry before the catch-up, for each object of the watch
	// in the range: a few for a checkpoint's range, up to every object of
	// the watch for a whole-stream read (for as long as the catch-up runs).
	before map[string]before

	legacy       map[string]struct{} // see CatchUpResult.Legacy
	last         map[string]string   // see CatchUpResult.Last
	epoch        uint64              // see CatchUpResult.Epoch
	foreign      int                 // see CatchUpResult.Foreign
	firstForeign uint64              // the stream sequence of the first
	why          string              // and what was wrong with it
}

// readAll reads the consumer's messages (relayd's subjects, from stream
// sequence next on) up to sequence last. The read ends at the first message
// past last, or at a message after which nothing was pending on relayd's
// subjects when it was delivered (what came after it was published after
// the catch-up began), or at once if the consumer had nothing pending when
// it was created. Five seconds without a message while some are pending is
// a lost pull; the third in a row fails the read, as does the end of ctx.
func (r *reader) readAll(ctx context.Context, cons jetstream.Consumer, next, last uint64) error {
	it, err := cons.Messages(jetstream.PullMaxMessages(int(min(500, last-next+1))))
	if err != nil {
		return err
	}
	defer it.Stop()
	if info := cons.CachedInfo(); info != nil && info.NumPending == 0 {
		return nil
	}
	for empty := 0; next <= last; {
		if err := ctx.Err(); err != nil {
			return err
		}
		m, err := it.Next(jetstream.NextMaxWait(5 * time.Second))
		if errors.Is(err, nats.ErrTimeout) {
			if empty++; empty == 3 {
				return fmt.Errorf("could not read the stream from sequence %d to %d: %w", next, last, err)
			}
			continue
		}
		if err != nil {
			return err
		}
		empty = 0
		md, err := m.Metadata()
		if err != nil {
			return err
		}
		if next = md.Sequence.Stream + 1; md.Sequence.Stream > last {
			return nil
		}
		r.apply(md.Sequence.Stream, m.Subject(), m.Headers(), m.Data())
		if md.NumPending == 0 {
			return nil
		}
	}
	return nil
}

// apply applies one stream message (sequence seq) to the index of every
// catch-up whose range holds it: an object event, written by relayd, of the
// catch-up's watch. A message relayd did not write is counted as foreign by
// each of them.
func (r *reader) apply(seq uint64, subject string, h nats.Header, data []byte) {
	env, err := event.DecodeMessage(h, data)
	if err == nil {
		err = ours(&env, r.cluster)
	}
	r.reached(seq)
	r.read++
	if err != nil {
		for _, a := range r.all[:r.next] {
			if a.foreign++; a.foreign == 1 {
				a.firstForeign, a.why = seq, fmt.Sprintf("subject %q: %v", subject, err)
			}
		}
		return
	}
	for _, k := range []string{watchKey(env.RelaydSource, env.K8sNamespace), watchKey(env.RelaydSource, "")} {
		for _, a := range r.watches[k] {
			if a.c.From <= seq {
				a.apply(h, &env)
			}
		}
		if env.K8sNamespace == "" {
			break // one key: both are the same
		}
	}
}

// reached notes that the read got to sequence seq: the catch-ups whose
// range starts there or before count their messages from here on.
func (r *reader) reached(seq uint64) {
	for ; r.next < len(r.all) && r.all[r.next].c.From <= seq; r.next++ {
		r.all[r.next].readFrom = r.read
	}
}

// apply applies an object event of the watch that relayd wrote.
func (a *applier) apply(h nats.Header, env *event.Envelope) {
	a.epoch = max(a.epoch, env.RelaydEpoch)
	if a.c.EpochOnly {
		return
	}
	if a.c.Legacy && h.Get(event.HeaderMsgID) == env.RelaydSource+"/"+env.ID { // stored by an older relayd
		if a.legacy == nil {
			a.legacy = map[string]struct{}{}
		}
		a.legacy[env.ID] = struct{}{}
	}
	if env.K8sUID == "" {
		return // a sync marker
	}
	o := Object{UID: env.K8sUID, Namespace: env.K8sNamespace, Name: env.K8sName, ResourceVersion: env.K8sResourceVersion}
	if a.c.Legacy {
		if a.last == nil {
			a.last = map[string]string{}
		}
		a.last[o.UID] = o.ResourceVersion
	}
	cur, known := a.x.Get(o.UID)
	if _, seen := a.before[o.UID]; !seen {
		a.before[o.UID] = before{cur, known}
	}
	switch {
	case strings.HasSuffix(env.Type, ".object."+string(event.Deleted)):
		a.x.Delete(o.UID)
	case !known || cur != o:
		a.x.Put(o)
	}
}

// ours checks that a message on relayd's subjects is relayd's own: an
// event of its cluster, from a relayd source of that cluster.
func ours(env *event.Envelope, cluster string) error {
	switch {
	case env.K8sCluster != cluster:
		return fmt.Errorf("k8scluster %q, not %q", env.K8sCluster, cluster)
	case env.RelaydSource == "" || env.Source != "/relayd/"+cluster+"/"+env.RelaydSource:
		return fmt.Errorf("source %q, relaydsource %q: not a relayd source of cluster %q", env.Source, env.RelaydSource, cluster)
	}
	return nil
}

// fixes lists the objects whose entry differs from the one before.
func (a *applier) fixes() []Fix {
	var out []Fix
	for uid, was := range a.before {
		cur, known := a.x.Get(uid)
		switch {
		case known && (!was.known || was.o != cur):
			out = append(out, Fix{UID: uid, Object: cur})
		case !known && was.known:
			out = append(out, Fix{UID: uid, Deleted: true})
		}
	}
	return out
}
