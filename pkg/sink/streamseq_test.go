package sink

import (
	"errors"
	"testing"

	"github.com/nats-io/nats.go"
)

// TestStreamSeqIsAtOrBeforeEveryLaterMessage: an Advance's StreamSeq must
// be at or before the stored sequence of every message of the entries
// after it, even when an earlier message is retried and stored after a
// later one (a restart reads the stream from there to catch the index up).
func TestStreamSeqIsAtOrBeforeEveryLaterMessage(t *testing.T) {
	fake, p, _, adv := newPipeline(t, 8)
	ctx := t.Context()
	p.SeedStreamSeq(100) // the stream's last sequence when the watch started

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

// TestStreamSeqUnknownBeforeAnyAckOrSeed: without a seed and before any
// PubAck the pipeline cannot bound the stream sequence and says so (0).
func TestStreamSeqUnknownBeforeAnyAckOrSeed(t *testing.T) {
	fake, p, _, adv := newPipeline(t, 8)
	if err := p.Submit(t.Context(), entry("a", "A", "1")); err != nil {
		t.Fatal(err)
	}
	ackSeq(fake.next(t), 7)
	if got := nextAdvance(t, adv); got.StreamSeq != 0 {
		t.Fatalf("advance %+v, want StreamSeq 0 (unknown)", got)
	}
}
