package sink

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap/zaptest"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/pkg/event"
)

// Against a real nats-server: relayd's event stream EV is gone and a stream
// of another name captures its subjects; the bucket's stream KV_x does not
// exist. Every publish names the stream that must store it, so neither the
// event nor the index write is stored elsewhere or acknowledged: the
// watermark holds and the sink says why, naming the stream, until the
// right streams are there.
func TestPublishesAreStoredOnlyInTheirStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	n := testenv.NATST(t, testenv.NATSOptions{})
	nc, err := nats.Connect(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	other, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "OTHER", Subjects: []string{"ev.>"}})
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	reasons := make(chan string, 100)
	s, err := New(Options{JetStream: js, Logger: zaptest.NewLogger(t), Metrics: m,
		RetryBackoff: wait.Backoff{Duration: 10 * time.Millisecond, Factor: 2, Steps: 1 << 30, Cap: 200 * time.Millisecond},
		EventStream:  "EV", FollowUpStream: "KV_x",
		OnUndeliverable: func(why string) { reasons <- why },
	})
	if err != nil {
		t.Fatal(err)
	}
	adv := make(chan Advance, 100)
	p := s.NewPipeline("src", func(a Advance) { adv <- a })
	t.Cleanup(p.Close)
	e := Entry{
		Msg:       &event.Message{Subject: "ev.a", MsgID: "src/a/1", Data: []byte("{}")},
		FollowUp:  &event.Message{Subject: "$KV.x.src._.a", Data: []byte(`{"uid":"a"}`)},
		ObjectKey: "a", ResourceVersion: "1", Type: event.Added, Origin: event.OriginWatch,
	}
	if err := p.Submit(ctx, e); err != nil {
		t.Fatal(err)
	}

	waitReason(t, reasons, "events for stream EV are refused: another stream captures their subjects", "expected stream does not match")
	noAdvance(t, adv)
	if info, err := other.Info(ctx); err != nil || info.State.Msgs != 0 {
		t.Errorf("stream OTHER holds %v messages (%v), want 0: relayd's event was stored in another stream", info.State.Msgs, err)
	}
	if v := testutil.ToFloat64(m.PublishErrors.WithLabelValues("src", "wrong-stream")); v == 0 {
		t.Error(`relayd_publish_errors_total{reason="wrong-stream"} = 0`)
	}

	// The right stream is back: the event is stored there; the index
	// write, for a bucket that does not exist, gets no response.
	if err := js.DeleteStream(ctx, "OTHER"); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EV", Subjects: []string{"ev.>"}}); err != nil {
		t.Fatal(err)
	}
	waitReason(t, reasons, "index writes for stream KV_x get no response")
	noAdvance(t, adv)

	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "x"}); err != nil {
		t.Fatal(err)
	}
	waitReason(t, reasons, "")
	if a := nextAdvance(t, adv); a.ResourceVersion != "1" {
		t.Errorf("advance %+v, want resourceVersion 1", a)
	}
	for stream, subj := range map[string]string{"EV": "ev.a", "KV_x": "$KV.x.src._.a"} {
		st, err := js.Stream(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.GetLastMsgForSubject(ctx, subj); err != nil {
			t.Errorf("%s not in stream %s: %v", subj, stream, err)
		}
	}
}

// waitReason waits for an OnUndeliverable report holding every want ("":
// the report that all is stored again).
func waitReason(t *testing.T, reasons chan string, want ...string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	var last []string
	for {
		select {
		case got := <-reasons:
			last = append(last, got)
			ok := (want[0] == "") == (got == "")
			for _, w := range want {
				ok = ok && strings.Contains(got, w)
			}
			if ok {
				return
			}
		case <-deadline:
			t.Fatalf("no report with %q within 10s; reports: %q", want, last)
		}
	}
}
