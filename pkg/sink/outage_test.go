package sink

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/internal/testutil"
	"github.com/relayd/relayd/pkg/config"
	"github.com/relayd/relayd/pkg/event"
	"github.com/relayd/relayd/pkg/natsconn"
)

// countingPublisher counts the publishes made while the connection was
// down.
type countingPublisher struct {
	Publisher
	nc *nats.Conn

	mu             sync.Mutex
	all, whileDown int
}

func (p *countingPublisher) PublishMsgAsync(m *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	p.mu.Lock()
	p.all++
	if !p.nc.IsConnected() {
		p.whileDown++
	}
	p.mu.Unlock()
	return p.Publisher.PublishMsgAsync(m, opts...)
}

func (p *countingPublisher) counts() (all, whileDown int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.all, p.whileDown
}

// Against a real nats-server that stops while a publish is in flight: its
// PubAck times out, and the sink, with a 1ms retry backoff, publishes it
// again only once the connection is back (natsconn.Conn.Up, told by
// nats.go's reconnect handler), not while NATS is down; the event is
// stored once and the watermark advances.
func TestRetryWaitsForTheReconnect(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	srv := testenv.NATST(t, testenv.NATSOptions{})
	conn, err := natsconn.New(natsconn.Options{Config: &config.NATS{URL: srv.URL()}, Name: "sink-outage-test",
		Logger: zaptest.NewLogger(t), Extra: []nats.Option{nats.ReconnectWait(100 * time.Millisecond)}})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := conn.Dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	str, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EV", Subjects: []string{"ev.>"}, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	pub := &countingPublisher{Publisher: js, nc: nc}
	s, err := New(Options{JetStream: pub, Logger: zaptest.NewLogger(t), Metrics: m, EventStream: "EV",
		RetryBackoff: wait.Backoff{Duration: time.Millisecond, Factor: 1, Steps: 1 << 30},
		Connected:    conn.Up,
	})
	if err != nil {
		t.Fatal(err)
	}
	adv := make(chan Advance, 10)
	p := s.NewPipeline("src", func(a Advance) { adv <- a })
	t.Cleanup(p.Close)

	srv.Stop()
	testutil.Eventually(t, 10*time.Second, "disconnected", func() error {
		select {
		case <-conn.Up():
			return errNotYet
		default:
			return nil
		}
	})
	e := Entry{Msg: &event.Message{Subject: "ev.a", MsgID: "src/a/1", Data: []byte("{}")},
		ObjectKey: "a", ResourceVersion: "1", Type: event.Added, Origin: event.OriginWatch}
	if err := p.Submit(ctx, e); err != nil {
		t.Fatal(err)
	}
	// The PubAck times out after 500ms; a sink that retried meanwhile would
	// publish every millisecond from then on.
	testutil.Eventually(t, 10*time.Second, "the publish failed", func() error {
		if publishErrors(t, reg) == 0 {
			return errNotYet
		}
		return nil
	})
	time.Sleep(time.Second)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case a := <-adv:
		if a.ResourceVersion != "1" {
			t.Errorf("advanced to %q, want 1", a.ResourceVersion)
		}
	case <-ctx.Done():
		t.Fatal("the event was not acknowledged after NATS returned")
	}
	all, whileDown := pub.counts()
	if whileDown != 1 || all < 2 {
		t.Errorf("%d publishes, %d of them while NATS was down; want the first while down, then the retries after the reconnect", all, whileDown)
	}
	info, err := str.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Errorf("stream holds %d messages, want 1", info.State.Msgs)
	}
}

var errNotYet = errors.New("not yet")

// publishErrors is the sum of relayd_publish_errors_total in reg.
func publishErrors(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == "relayd_publish_errors_total" {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}
