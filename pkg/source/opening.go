package source

import "net/http"

// DefaultOpening is how many requests relayd's watches and lists may have
// waiting for the apiserver's response headers at once (LimitOpening).
const DefaultOpening = 64

// LimitOpening returns rt bounded to n requests waiting for their
// response's headers at once. A watch holds a slot only while it is being
// opened, never while it streams.
//
// Why: a request that finds no HTTP/2 connection with a free stream (none
// yet, or every one at the apiserver's limit of streams per connection)
// makes Go's transport dial a connection of its own. Thousands of watches
// starting together (a source listing thousands of namespaces, resumed
// from its checkpoint) then dialled thousands of TLS connections at once,
// until relayd ran out of file descriptors ("socket: too many open
// files") and the apiserver spent its CPU on handshakes. Bounded, at most
// n connections are dialled at a time and the streams fill the
// connections that exist (docs/PERFORMANCE.md, "Memory per watch").
func LimitOpening(rt http.RoundTripper, n int) http.RoundTripper {
	return &openingLimit{rt: rt, slots: make(chan struct{}, n)}
}

type openingLimit struct {
	rt    http.RoundTripper
	slots chan struct{}
}

// RoundTrip implements http.RoundTripper.
func (l *openingLimit) RoundTrip(req *http.Request) (*http.Response, error) {
	select {
	case l.slots <- struct{}{}:
	case <-req.Context().Done():
		return nil, req.Context().Err()
	}
	defer func() { <-l.slots }()
	return l.rt.RoundTrip(req)
}

// WrappedRoundTripper lets client-go see the transport underneath
// (k8s.io/apimachinery/pkg/util/net.RoundTripperWrapper).
func (l *openingLimit) WrappedRoundTripper() http.RoundTripper { return l.rt }
