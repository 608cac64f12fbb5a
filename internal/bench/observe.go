package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// Sample is one line of the Prometheus text format.
type Sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// Samples is a scrape.
type Samples []Sample

// Scrape reads http://addr/metrics.
func Scrape(ctx context.Context, addr string) (Samples, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("bench: scrape %s: HTTP %d", addr, resp.StatusCode)
	}
	var out Samples
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if s, ok := parseSample(sc.Text()); ok {
			out = append(out, s)
		}
	}
	return out, sc.Err()
}

func parseSample(line string) (Sample, bool) {
	line = strings.TrimSpace(line)
	if line == "" || line[0] == '#' {
		return Sample{}, false
	}
	s := Sample{Labels: map[string]string{}}
	i := strings.IndexAny(line, "{ ")
	if i < 0 {
		return Sample{}, false
	}
	s.Name = line[:i]
	rest := line[i:]
	if rest[0] == '{' {
		j := 1
		for j < len(rest) && rest[j] != '}' {
			k := strings.IndexByte(rest[j:], '=')
			if k < 0 || j+k+1 >= len(rest) || rest[j+k+1] != '"' {
				return Sample{}, false
			}
			key := rest[j : j+k]
			j += k + 2
			var v strings.Builder
			for j < len(rest) && rest[j] != '"' {
				if rest[j] == '\\' && j+1 < len(rest) {
					j++
					if rest[j] == 'n' {
						v.WriteByte('\n')
						j++
						continue
					}
				}
				v.WriteByte(rest[j])
				j++
			}
			j++ // closing quote
			s.Labels[key] = v.String()
			if j < len(rest) && rest[j] == ',' {
				j++
			}
		}
		if j >= len(rest) {
			return Sample{}, false
		}
		rest = rest[j+1:]
	}
	f := strings.Fields(rest)
	if len(f) == 0 {
		return Sample{}, false
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return Sample{}, false
	}
	s.Value = v
	return s, true
}

// Sum adds the values of name whose labels include match.
func (ss Samples) Sum(name string, match map[string]string) float64 {
	var sum float64
	for _, s := range ss {
		if s.Name != name {
			continue
		}
		ok := true
		for k, v := range match {
			if s.Labels[k] != v {
				ok = false
				break
			}
		}
		if ok {
			sum += s.Value
		}
	}
	return sum
}

// Has reports whether the scrape has a series called name.
func (ss Samples) Has(name string) bool {
	for _, s := range ss {
		if s.Name == name {
			return true
		}
	}
	return false
}

// HistogramQuantile estimates quantile q of histogram name (labels match)
// by linear interpolation inside its buckets, like PromQL's
// histogram_quantile, from the difference of two scrapes (before may be nil).
func HistogramQuantile(q float64, name string, match map[string]string, before, after Samples) float64 {
	type bucket struct{ le, n float64 }
	collect := func(ss Samples) map[float64]float64 {
		m := map[float64]float64{}
		for _, s := range ss {
			if s.Name != name+"_bucket" {
				continue
			}
			ok := true
			for k, v := range match {
				if s.Labels[k] != v {
					ok = false
				}
			}
			if !ok {
				continue
			}
			le, err := strconv.ParseFloat(s.Labels["le"], 64)
			if err != nil {
				continue
			}
			m[le] += s.Value
		}
		return m
	}
	a, b := collect(after), collect(before)
	var bs []bucket
	for le, n := range a {
		bs = append(bs, bucket{le, n - b[le]})
	}
	sort.Slice(bs, func(i, j int) bool { return bs[i].le < bs[j].le })
	if len(bs) == 0 || bs[len(bs)-1].n == 0 {
		return -1
	}
	rank := q * bs[len(bs)-1].n
	prevLE, prevN := 0.0, 0.0
	for _, bk := range bs {
		if bk.n >= rank {
			if math.IsInf(bk.le, 1) {
				return prevLE
			}
			if bk.n == prevN {
				return bk.le
			}
			return prevLE + (bk.le-prevLE)*(rank-prevN)/(bk.n-prevN)
		}
		prevLE, prevN = bk.le, bk.n
	}
	return prevLE
}

// AckSnoop sees every JetStream PubAck on a NATS server: it subscribes to
// _INBOX.>, where relayd's async publishes get their acks (its own
// connection uses another inbox prefix). Counting acks tells when relayd
// has finished without asking relayd anything (and without costing it
// CPU); their arrival times give the PubAck side of the lag.
type AckSnoop struct {
	nc  *nats.Conn
	sub *nats.Subscription

	mu      sync.Mutex
	counts  map[string]int64
	lastAck time.Time
	times   map[string]map[uint64]time.Time // stream -> seq -> first ack, for streams in record
	record  map[string]bool
	notify  chan struct{}
}

// SnoopAcks connects to url and starts snooping.
func SnoopAcks(url string) (*AckSnoop, error) {
	nc, err := nats.Connect(url, nats.CustomInboxPrefix("_BENCH"), nats.Name("relayd-bench-snoop"))
	if err != nil {
		return nil, err
	}
	a := &AckSnoop{nc: nc, counts: map[string]int64{}, times: map[string]map[uint64]time.Time{},
		record: map[string]bool{}, notify: make(chan struct{}, 1)}
	a.sub, err = nc.Subscribe("_INBOX.>", a.handle)
	if err != nil {
		nc.Close()
		return nil, err
	}
	_ = a.sub.SetPendingLimits(-1, -1)
	if err := nc.Flush(); err != nil {
		nc.Close()
		return nil, err
	}
	return a, nil
}

func (a *AckSnoop) handle(m *nats.Msg) {
	now := time.Now()
	if len(m.Data) == 0 || len(m.Data) > 512 || m.Data[0] != '{' {
		return
	}
	var ack struct {
		Stream string `json:"stream"`
		Seq    uint64 `json:"seq"`
		Type   string `json:"type"`
	}
	if json.Unmarshal(m.Data, &ack) != nil || ack.Stream == "" || ack.Seq == 0 || ack.Type != "" {
		return
	}
	a.mu.Lock()
	a.counts[ack.Stream]++
	a.lastAck = now
	if a.record[ack.Stream] {
		t := a.times[ack.Stream]
		if t == nil {
			t = map[uint64]time.Time{}
			a.times[ack.Stream] = t
		}
		if _, ok := t[ack.Seq]; !ok {
			t[ack.Seq] = now
		}
	}
	a.mu.Unlock()
	select {
	case a.notify <- struct{}{}:
	default:
	}
}

// Record keeps the arrival time of every ack of stream (see AckTime).
func (a *AckSnoop) Record(stream string) {
	a.mu.Lock()
	a.record[stream] = true
	a.mu.Unlock()
}

// AckTime is when the first ack of stream's message seq was seen.
func (a *AckSnoop) AckTime(stream string, seq uint64) (time.Time, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t, ok := a.times[stream][seq]
	return t, ok
}

// Count is the number of acks seen for stream.
func (a *AckSnoop) Count(stream string) int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.counts[stream]
}

// LastAck is when the last ack (any stream) was seen.
func (a *AckSnoop) LastAck() time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.lastAck
}

// WaitCount waits until stream has at least n acks; alive is checked on
// every wake-up and its error ends the wait (e.g. relayd exited).
func (a *AckSnoop) WaitCount(ctx context.Context, stream string, n int64, timeout time.Duration, alive func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		if a.Count(stream) >= n {
			return nil
		}
		if alive != nil {
			if err := alive(); err != nil {
				return err
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("bench: %d of %d acks on stream %s within %v", a.Count(stream), n, stream, timeout)
		}
		select {
		case <-a.notify:
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Quiet waits until no ack has arrived for d and returns the last ack time.
func (a *AckSnoop) Quiet(ctx context.Context, d time.Duration) time.Time {
	for {
		last := a.LastAck()
		wait := time.Until(last.Add(d))
		if wait <= 0 {
			return last
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return last
		}
	}
}

// Close stops snooping.
func (a *AckSnoop) Close() { a.nc.Close() }
