package sink

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// TestStreamSeqIsAtOrBeforeEveryLaterMessage: an Advance's StreamSeq must
// be at or before the stored sequence of every message of the entries
// after it, even when an earlier message is retried and stored after a
// later one (a restart reads the stream from there to catch the index up).
func TestStreamSeqIsAtOrBeforeEveryLaterMessage(t *testing.T) {
	fake, p, _, adv := newPipeline(t, 8)
	ctx := t.Context()
	p.s.SeedStreamSeq(100) // the stream's last sequence when the watch started

	// a is published first but fails; b is stored at 101; a's retry at 102.
	if err := p.Submit(ctx, entry("a", "A", "1")); err != nil {
		t.Fatal(err)
	}
	a := fake.next(t)
	if err := p.Submit(ctx, entry("b", "B", "2")); err != nil {
		t.Fatal(err)
	}
	b := fake.next(t)
	fail(a, errors.Join(nats.ErrTimeout))
	ackSeq(b, 101)
	aRetry := fake.next(t)
	ackSeq(aRetry, 102)

	// The watermark reaches a (rv 1): b (after it, stored at 101) must not
	// be skipped by a reader starting at StreamSeq.
	got := nextAdvance(t, adv)
	if got.ResourceVersion != "1" || got.StreamSeq == 0 || got.StreamSeq > 101 {
		t.Fatalf("advance to a: %+v, want StreamSeq in [1, 101]", got)
	}
	got = nextAdvance(t, adv)
	if got.ResourceVersion != "2" || got.StreamSeq == 0 || got.StreamSeq > 101 {
		t.Fatalf("advance to b: %+v, want StreamSeq in [1, 101]", got)
	}

	// Later entries are published after the acks of 101 and 102: their
	// messages are stored after 102, and the bound tightens to it.
	if err := p.Submit(ctx, entry("c", "C", "3")); err != nil {
		t.Fatal(err)
	}
	ackSeq(fake.next(t), 103)
	if got = nextAdvance(t, adv); got.ResourceVersion != "3" || got.StreamSeq != 103 {
		t.Fatalf("advance to c: %+v, want StreamSeq 103", got)
	}
}

// TestStreamSeqBeforeAnyAckOrSeedIsOne: without a seed and before any
// PubAck the only bound is the stream's first sequence: 1, never 0
// (which a restart would read as "not known" and skip the catch-up).
func TestStreamSeqBeforeAnyAckOrSeedIsOne(t *testing.T) {
	fake, p, _, adv := newPipeline(t, 8)
	if err := p.Submit(t.Context(), entry("a", "A", "1")); err != nil {
		t.Fatal(err)
	}
	ackSeq(fake.next(t), 7)
	if got := nextAdvance(t, adv); got.StreamSeq != 1 {
		t.Fatalf("advance %+v, want StreamSeq 1", got)
	}
}

// TestStreamSeqFollowsEveryPipelinesAcks: the bound is shared by the
// pipelines of one sink. A watch that publishes nothing for a while still
// checkpoints a recent stream sequence (bookmarks move its position), so
// that a restart does not read the stream from its last own message.
func TestStreamSeqFollowsEveryPipelinesAcks(t *testing.T) {
	fake, busy, _, _ := newPipeline(t, 8)
	idleAdv := make(chan Advance, 8)
	idle := busy.s.NewPipeline("idle", func(a Advance) { idleAdv <- a })
	t.Cleanup(idle.Close)
	for i, seq := range []uint64{500, 501, 502} {
		if err := busy.Submit(t.Context(), entry(fmt.Sprint("o", i), "X", fmt.Sprint(i+1))); err != nil {
			t.Fatal(err)
		}
		ackSeq(fake.next(t), seq)
	}
	// The busy pipeline's acks arrive on its own goroutine.
	deadline := time.Now().Add(5 * time.Second)
	for busy.s.evSeq.Load() < 502 {
		if time.Now().After(deadline) {
			t.Fatalf("sink saw acks up to %d, want 502", busy.s.evSeq.Load())
		}
		time.Sleep(time.Millisecond)
	}
	if err := idle.Submit(t.Context(), Entry{ResourceVersion: "9", Bookmark: true}); err != nil {
		t.Fatal(err)
	}
	if got := nextAdvance(t, idleAdv); got.ResourceVersion != "9" || got.StreamSeq != 503 {
		t.Fatalf("idle pipeline's advance %+v, want StreamSeq 503", got)
	}
}
