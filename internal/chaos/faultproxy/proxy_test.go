package faultproxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echoServer echoes lines; it stops with the test.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	conns := make(chan net.Conn, 64)
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns <- c
			go func() { _, _ = io.Copy(c, c); _ = c.Close() }()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
		close(conns)
		for c := range conns {
			_ = c.Close()
		}
	})
	return ln.Addr().String()
}

func dial(t *testing.T, p *Proxy) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c, bufio.NewReader(c)
}

func roundTrip(c net.Conn, r *bufio.Reader, msg string, timeout time.Duration) (string, error) {
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(c, msg+"\n"); err != nil {
		return "", err
	}
	line, err := r.ReadString('\n')
	return strings.TrimSuffix(line, "\n"), err
}

func newProxy(t *testing.T) *Proxy {
	t.Helper()
	p, err := New(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func TestForwardsAndLatency(t *testing.T) {
	p := newProxy(t)
	c, r := dial(t, p)
	if got, err := roundTrip(c, r, "hello", 5*time.Second); err != nil || got != "hello" {
		t.Fatalf("round trip = %q, %v", got, err)
	}
	p.SetLatency(150 * time.Millisecond)
	t0 := time.Now()
	if got, err := roundTrip(c, r, "slow", 5*time.Second); err != nil || got != "slow" {
		t.Fatalf("round trip = %q, %v", got, err)
	}
	if d := time.Since(t0); d < 300*time.Millisecond {
		t.Errorf("round trip took %v with 150ms latency each way", d)
	}
}

func TestResetAndRefuse(t *testing.T) {
	p := newProxy(t)
	c, r := dial(t, p)
	if _, err := roundTrip(c, r, "a", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if n := p.Reset(); n != 1 {
		t.Errorf("Reset affected %d connections, want 1", n)
	}
	if _, err := roundTrip(c, r, "b", 5*time.Second); err == nil {
		t.Error("connection still works after Reset")
	} else if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, io.EOF) && !errors.Is(err, syscall.EPIPE) {
		t.Logf("after reset: %v", err)
	}
	p.Refuse(true)
	// The proxy accepts and resets at once: on loopback the reset can
	// already fail the dial, which is a refusal too.
	if c2, err := net.Dial("tcp", p.Addr()); err == nil {
		t.Cleanup(func() { _ = c2.Close() })
		if _, err := roundTrip(c2, bufio.NewReader(c2), "c", 5*time.Second); err == nil {
			t.Error("a refused connection works")
		}
	} else if !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("dial while refusing: %v, want a reset", err)
	}
	p.Refuse(false)
	c3, r3 := dial(t, p)
	if got, err := roundTrip(c3, r3, "d", 5*time.Second); err != nil || got != "d" {
		t.Fatalf("after Refuse(false): %q, %v", got, err)
	}
	if s := p.Stats(); s.Refused != 1 || s.Resets != 2 || s.Accepted != 3 {
		t.Errorf("stats %+v, want 1 refused, 2 resets, 3 accepted", s)
	}
}

func TestBlackholeHoldsThenDelivers(t *testing.T) {
	p := newProxy(t)
	c, r := dial(t, p)
	if _, err := roundTrip(c, r, "a", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Blackhole(true)
	if _, err := roundTrip(c, r, "b", 300*time.Millisecond); err == nil {
		t.Fatal("data got through a black hole")
	} else if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Fatalf("want a timeout in a black hole, got %v", err)
	}
	p.Blackhole(false)
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := r.ReadString('\n')
	if err != nil || line != "b\n" {
		t.Fatalf("after healing: %q, %v", line, err)
	}
}

func TestHalfClose(t *testing.T) {
	p := newProxy(t)
	c, r := dial(t, p)
	if _, err := roundTrip(c, r, "a", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if n := p.HalfClose(); n != 1 {
		t.Fatalf("HalfClose affected %d connections", n)
	}
	if _, err := roundTrip(c, r, "b", 5*time.Second); !errors.Is(err, io.EOF) {
		t.Fatalf("want EOF on a half-closed connection, got %v", err)
	}
}

func TestDropProbability(t *testing.T) {
	p := newProxy(t)
	p.SetDropProbability(1)
	c, r := dial(t, p)
	if _, err := roundTrip(c, r, "a", 5*time.Second); err == nil {
		t.Fatal("data got through with drop probability 1")
	}
	p.Heal()
	c2, r2 := dial(t, p)
	if got, err := roundTrip(c2, r2, "b", 5*time.Second); err != nil || got != "b" {
		t.Fatalf("after Heal: %q, %v", got, err)
	}
}
