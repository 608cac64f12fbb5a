// Package faultproxy is a loopback TCP proxy that injects network faults
// between relayd and the servers it talks to (kube-apiserver, NATS): added
// latency, dropped (reset) connections, refused connections, half-closed
// connections and silent partitions ("black holes": connections stay open,
// nothing gets through).
//
// The proxy forwards bytes and knows nothing of the protocols above it, so
// TLS to the apiserver works through it unchanged (the apiserver's
// certificate names 127.0.0.1, not a port). Faults are switched at run time
// and apply to existing connections as well as new ones. It listens on
// 127.0.0.1 only.
package faultproxy

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy forwards connections from a loopback port to a target address.
type Proxy struct {
	target string
	ln     net.Listener

	mu        sync.Mutex
	conns     map[*link]struct{}
	latency   time.Duration
	dropP     float64 // probability of resetting a connection per forwarded chunk
	refuse    bool
	blackhole bool
	closed    bool
	resumed   *sync.Cond // signalled when blackhole ends or the proxy closes

	wg sync.WaitGroup

	// Counters (for the results table and tests).
	accepted, resets, refused atomic.Int64
}

// link is one proxied connection: client side and server side.
type link struct {
	client, server net.Conn
	once           sync.Once
	clientHalf     atomic.Bool // HalfClose: the client got a FIN; server data is discarded
}

// New starts a proxy on 127.0.0.1 (random port) that forwards to target
// (host:port).
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen: %w", err)
	}
	p := &Proxy{target: target, ln: ln, conns: map[*link]struct{}{}}
	p.resumed = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// Addr is the proxy's address (127.0.0.1:port).
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Port is the proxy's port.
func (p *Proxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

// Target is the forwarded-to address.
func (p *Proxy) Target() string { return p.target }

// Stats are counters since the proxy started.
type Stats struct {
	Accepted int64 // connections accepted
	Resets   int64 // connections reset by a fault (Reset, drop probability, Refuse)
	Refused  int64 // connections refused while Refuse was on
	Open     int   // connections open now
}

// Stats returns the counters.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	n := len(p.conns)
	p.mu.Unlock()
	return Stats{Accepted: p.accepted.Load(), Resets: p.resets.Load(), Refused: p.refused.Load(), Open: n}
}

// SetLatency delays every forwarded chunk, in both directions, by d (0: none).
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	p.latency = d
	p.mu.Unlock()
}

// SetDropProbability makes every forwarded chunk reset its connection with
// probability prob (0: never).
func (p *Proxy) SetDropProbability(prob float64) {
	p.mu.Lock()
	p.dropP = prob
	p.mu.Unlock()
}

// Refuse makes the proxy reset new connections at once (on: true) — a server
// that is down behind a listening load balancer.
func (p *Proxy) Refuse(on bool) {
	p.mu.Lock()
	p.refuse = on
	p.mu.Unlock()
}

// Blackhole stops (on: true) or resumes forwarding on every connection, old
// and new, without closing any: a silent partition, in which both ends see
// an open connection and nothing arrives. Data read meanwhile is held and
// delivered on resume, as TCP would after a partition heals.
func (p *Proxy) Blackhole(on bool) {
	p.mu.Lock()
	p.blackhole = on
	if !on {
		p.resumed.Broadcast()
	}
	p.mu.Unlock()
}

// Reset aborts every open connection with a TCP RST (both sides) and returns
// how many there were.
func (p *Proxy) Reset() int {
	p.mu.Lock()
	ls := make([]*link, 0, len(p.conns))
	for l := range p.conns {
		ls = append(ls, l)
	}
	p.mu.Unlock()
	for _, l := range ls {
		if p.abort(l) {
			p.resets.Add(1)
		}
	}
	return len(ls)
}

// HalfClose half-closes every open connection towards the client: the
// client reads EOF, while what it sends still reaches the server and what
// the server sends is lost (a half-open connection: the server believes it
// is intact). It returns how many connections it affected.
func (p *Proxy) HalfClose() int {
	p.mu.Lock()
	ls := make([]*link, 0, len(p.conns))
	for l := range p.conns {
		ls = append(ls, l)
	}
	p.mu.Unlock()
	for _, l := range ls {
		l.clientHalf.Store(true)
		if tc, ok := l.client.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
	}
	return len(ls)
}

// Heal turns every fault off (latency, drops, refusal, black hole).
func (p *Proxy) Heal() {
	p.SetLatency(0)
	p.SetDropProbability(0)
	p.Refuse(false)
	p.Blackhole(false)
}

// Close stops the proxy and closes every connection.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.blackhole = false
	p.resumed.Broadcast()
	p.mu.Unlock()
	_ = p.ln.Close()
	p.Reset()
	p.wg.Wait()
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		p.accepted.Add(1)
		p.mu.Lock()
		refuse := p.refuse
		p.mu.Unlock()
		if refuse {
			p.refused.Add(1)
			p.resets.Add(1)
			rst(c)
			continue
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	server, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		rst(client) // the server is down: the client sees a reset, like a refused connection
		return
	}
	l := &link{client: client, server: server}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		rst(client)
		rst(server)
		return
	}
	p.conns[l] = struct{}{}
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { p.pipe(l, server, client); done <- struct{}{} }()
	go func() { p.pipe(l, client, server); done <- struct{}{} }()
	<-done
	<-done
	p.mu.Lock()
	delete(p.conns, l)
	p.mu.Unlock()
	_ = client.Close()
	_ = server.Close()
}

// pipe copies src to dst chunk by chunk, applying the faults. When src ends
// cleanly it half-closes dst, so a client's or server's FIN is passed on.
func (p *Proxy) pipe(l *link, dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.forward(l, dst, buf[:n]) {
				return
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				if tc, ok := dst.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
				}
			} else {
				p.abort(l)
			}
			return
		}
	}
}

// forward writes one chunk after the configured faults; false means the
// connection is gone.
func (p *Proxy) forward(l *link, dst net.Conn, b []byte) bool {
	p.mu.Lock()
	for p.blackhole && !p.closed {
		p.resumed.Wait()
	}
	latency, dropP, closed := p.latency, p.dropP, p.closed
	p.mu.Unlock()
	if closed {
		return false
	}
	if dst == l.client && l.clientHalf.Load() {
		return true // lost on the way: the server believes it was sent
	}
	if dropP > 0 && rand.Float64() < dropP {
		if p.abort(l) {
			p.resets.Add(1)
		}
		return false
	}
	if latency > 0 {
		time.Sleep(latency)
	}
	if _, err := dst.Write(b); err != nil {
		p.abort(l)
		return false
	}
	return true
}

// abort resets both sides of a link; true for the call that did it.
func (p *Proxy) abort(l *link) bool {
	did := false
	l.once.Do(func() {
		did = true
		rst(l.client)
		rst(l.server)
	})
	return did
}

// rst closes c with SO_LINGER 0, which sends a TCP RST instead of a FIN.
func rst(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}
