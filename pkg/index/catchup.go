package index

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/relayd/relayd/pkg/event"
)

// CatchUpConsumerInactive is how long the NATS server keeps the index
// catch-up's consumer after its last pull. nats.go's ordered consumer
// replaces its server-side consumer on every Fetch (deleting the one it
// replaces) but never deletes the last one; without a threshold of our own
// the server would keep it for nats.go's default of 5 minutes. Every Fetch
// creates a fresh consumer, so a slow catch-up cannot outlive it.
const CatchUpConsumerInactive = 30 * time.Second

// StreamReader reads the event stream for CatchUp.
type StreamReader struct {
	JetStream jetstream.JetStream
	Stream    string // the event stream's name
	// OnLastSeq, if set, is given the stream's last sequence at the start
	// of every catch-up (relayd seeds the sink's stream sequence with it).
	OnLastSeq func(uint64)
}

// CatchUpOf names the watch a catch-up is for: only the object events of
// its source (and namespace, "" for all) are applied.
type CatchUpOf struct {
	Source, Namespace string
	From              uint64 // first stream sequence to read; 0: no catch-up
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
// c.From on is applied to x, in stream order (per object that is publish
// order); the objects whose entry ends up different from the bucket's are
// returned as Fixes, once each (written message by message, an object seen
// several times would be written back through its older versions).
func (s *StreamReader) CatchUp(ctx context.Context, log *zap.Logger, x *Index, c CatchUpOf) (CatchUpResult, error) {
	stream, err := s.JetStream.Stream(ctx, s.Stream)
	if err != nil {
		return CatchUpResult{}, err
	}
	st := stream.CachedInfo().State
	res := CatchUpResult{To: st.LastSeq}
	if s.OnLastSeq != nil {
		s.OnLastSeq(st.LastSeq)
	}
	if c.From == 0 || c.From > st.LastSeq {
		return res, nil
	}
	if c.From < st.FirstSeq {
		log.Warn("stream messages removed by its limits before the index caught up",
			zap.Uint64("fromStreamSeq", c.From), zap.Uint64("streamFirstSeq", st.FirstSeq),
			zap.String("effect", "if the index lacked any of their changes, it still does"))
	}
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: c.From,
		InactiveThreshold: CatchUpConsumerInactive,
	})
	if err != nil {
		return res, err
	}
	a := applier{x: x, c: c, before: map[string]before{}}
	for next := c.From; next <= res.To; {
		n, err := a.fetch(cons, &next, res.To)
		if err != nil {
			return res, err
		}
		if n == 0 {
			if err := gone(ctx, log, stream, next, res.To, a.err); err != nil {
				return res, err
			}
			break
		}
	}
	res.Read, res.Fixes = a.read, a.fixes()
	return res, nil
}

// before is an object's index entry before the catch-up.
type before struct {
	o     Object
	known bool
}

// applier applies a catch-up's messages to the index.
type applier struct {
	x    *Index
	c    CatchUpOf
	read int
	// uid -> its entry before the catch-up, for each object of the watch
	// in the range: a few for a checkpoint's range, up to every object of
	// the watch for a whole-stream read (for as long as the catch-up runs).
	before map[string]before
	err    error // the last batch's error (nil or a timeout), for gone's message
}

// fetch reads one batch from *next on (no more than the range up to last
// holds: a pull waits until its batch is full or it expires), applies it
// and moves *next past it. It returns how many messages came (0: none).
func (a *applier) fetch(cons jetstream.Consumer, next *uint64, last uint64) (int, error) {
	batch, err := cons.Fetch(int(min(500, last-*next+1)), jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		return 0, err
	}
	n := 0
	for m := range batch.Messages() {
		n++
		md, err := m.Metadata()
		if err != nil {
			return n, err
		}
		*next = md.Sequence.Stream + 1
		if md.Sequence.Stream > last {
			break
		}
		a.read++
		a.apply(m.Headers(), m.Data())
	}
	a.err = batch.Error()
	if a.err != nil && !errors.Is(a.err, nats.ErrTimeout) {
		return n, a.err
	}
	return n, nil
}

// apply applies one stream message to the index if it is an object event
// of the watch.
func (a *applier) apply(h nats.Header, data []byte) {
	env, err := event.DecodeMessage(h, data)
	if err != nil || env.RelaydSource != a.c.Source || env.K8sUID == "" ||
		(a.c.Namespace != "" && env.K8sNamespace != a.c.Namespace) {
		return // not an object event of this watch
	}
	o := Object{UID: env.K8sUID, Namespace: env.K8sNamespace, Name: env.K8sName, ResourceVersion: env.K8sResourceVersion}
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

// gone is called when a fetch from next brought nothing: either the rest of
// the range up to last is gone (stream limits; logged, nil), or the read
// failed (a refused or lost consumer request looks the same from here; an
// error, with the batch's error berr if it had one).
func gone(ctx context.Context, log *zap.Logger, stream jetstream.Stream, next, last uint64, berr error) error {
	info, err := stream.Info(ctx, jetstream.WithDeletedDetails(true))
	if err != nil {
		return err
	}
	if held := heldIn(info.State, next, last); held > 0 {
		return fmt.Errorf("could not read the stream from sequence %d to %d (%d messages there): %w",
			next, last, held, cmp.Or(berr, nats.ErrTimeout))
	}
	log.Warn("stream messages removed by its limits before the index caught up",
		zap.Uint64("fromStreamSeq", next), zap.Uint64("toStreamSeq", last), zap.Uint64("streamFirstSeq", info.State.FirstSeq),
		zap.String("effect", "their changes are missing from the index"))
	return nil
}

// heldIn is how many messages st holds with sequences in [lo, hi].
func heldIn(st jetstream.StreamState, lo, hi uint64) uint64 {
	if st.Msgs == 0 {
		return 0
	}
	lo, hi = max(lo, st.FirstSeq), min(hi, st.LastSeq)
	if lo > hi {
		return 0
	}
	n := hi - lo + 1
	for _, d := range st.Deleted {
		if d >= lo && d <= hi {
			n--
		}
	}
	return n
}
