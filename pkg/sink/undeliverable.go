package sink

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// undeliverable tracks the pipelines whose publishes cannot be stored, by
// stream, and reports why (Options.OnUndeliverable) when that changes.
type undeliverable struct {
	report func(reason string)

	mu   sync.Mutex
	by   map[undeliverableKey]string // a pipeline's stream -> why its publishes cannot be stored
	last string                      // last reported
}

type undeliverableKey struct {
	p      *Pipeline
	stream string
}

// set records why p's publishes to stream cannot be stored ("" = they are
// again) and reports the new state of all pipelines if it changed.
func (u *undeliverable) set(p *Pipeline, stream, why string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	k := undeliverableKey{p, stream}
	if why == "" {
		delete(u.by, k)
	} else {
		u.by[k] = why
	}
	u.reportLocked()
}

// forget drops a closed pipeline.
func (u *undeliverable) forget(p *Pipeline) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for k := range u.by {
		if k.p == p {
			delete(u.by, k)
		}
	}
	u.reportLocked()
}

// reportLocked reports the distinct reasons, sorted, if they changed.
func (u *undeliverable) reportLocked() {
	var whys []string
	for _, why := range u.by {
		if !slices.Contains(whys, why) {
			whys = append(whys, why)
		}
	}
	slices.Sort(whys)
	reason := strings.Join(whys, "; ")
	if reason == u.last {
		return
	}
	u.last = reason
	if u.report != nil {
		u.report(reason)
	}
}

// isStreamMismatch reports JetStream's refusal of a message whose expected
// stream is not the one that captured its subject.
func isStreamMismatch(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeStreamMismatch
}

// undeliverableReason says why a publish to to.stream that failed with err
// cannot be stored, if it is for a reason an operator must fix: another
// stream captures the subject, or no stream answers on it. Other failures
// (timeouts, NATS down, a full stream) give "": they have their own reports
// (the NATS condition, the stream check, the metrics) or pass.
func undeliverableReason(err error, to target) string {
	stream := "their stream"
	if to.stream != "" {
		stream = "stream " + to.stream
	}
	switch {
	case isStreamMismatch(err):
		return fmt.Sprintf("%s for %s are refused: another stream captures their subjects (%v)", to.what, stream, err)
	case errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, nats.ErrNoResponders):
		return fmt.Sprintf("%s for %s get no response (%v): no stream captures their subjects where relayd publishes them (is it in another JetStream domain? nats.jsDomain)", to.what, stream, err)
	}
	return ""
}
