package sink

import (
	"context"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// errorReason's label for each kind of publish error, wrapped as the sink
// sees them. Most are produced by the real servers in other tests (outages,
// a full stream, another stream); this pins the mapping of each.
func TestErrorReason(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{jetstream.ErrAsyncPublishTimeout, "timeout"},
		{context.DeadlineExceeded, "timeout"},
		{nats.ErrNoResponders, "no-stream"},
		{nats.ErrConnectionClosed, "disconnected"},
		{jetstream.ErrTooManyStalledMsgs, "stalled"},
		{nats.ErrMaxPayload, "max-payload"},
		{&jetstream.APIError{ErrorCode: errCodeStoreFailed}, "stream-full"},
		{&jetstream.APIError{ErrorCode: 10999}, "rejected"},
		{fmt.Errorf("boom"), "error"},
	} {
		if got := errorReason(fmt.Errorf("publish: %w", c.err)); got != c.want {
			t.Errorf("errorReason(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}
