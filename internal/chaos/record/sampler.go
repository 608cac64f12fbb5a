package record

import (
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/relayd/relayd/internal/chaos/history"
)

// Sampler reads relayd's checkpoint ConfigMap now and then and, right
// after, the stream's last sequence: the checker then verifies that every
// change at or below the checkpoint was on the stream by then.
type Sampler struct {
	cs       kubernetes.Interface
	js       jetstream.JetStream
	stream   string
	ns, name string
	keys     map[string]string // checkpoint data key -> source

	mu          sync.Mutex
	samples     []history.Sample
	attempts    int // samples tried
	errs        int // tries that yielded no sample of some source
	unavailable int // of those, tries whose reads failed (a server down or unreachable)
}

// NewSampler samples the checkpoint ConfigMap ns/name; keys maps its data
// keys (e.g. "cms.<ns>") to source names.
func NewSampler(cs kubernetes.Interface, js jetstream.JetStream, stream, ns, name string, keys map[string]string) *Sampler {
	return &Sampler{cs: cs, js: js, stream: stream, ns: ns, name: name, keys: keys}
}

// Run samples every interval (jittered) until ctx ends. A try that yields
// no sample of some source (a server unavailable, the source's key
// missing, unparsable or at resourceVersion 0) counts as failed; one whose
// reads failed also as unavailable.
func (s *Sampler) Run(ctx context.Context, interval time.Duration) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval/2 + rand.N(interval)):
		}
		s.sample(ctx)
	}
}

func (s *Sampler) sample(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	s.mu.Lock()
	s.attempts++
	s.mu.Unlock()
	at := time.Now()
	cm, err := s.cs.CoreV1().ConfigMaps(s.ns).Get(ctx, s.name, metav1.GetOptions{})
	read := time.Now()
	if err != nil {
		s.fail(err)
		return
	}
	st, err := s.js.Stream(ctx, s.stream)
	if err != nil {
		s.fail(err)
		return
	}
	info, err := st.Info(ctx)
	if err != nil {
		s.fail(err)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	got := 0
	for k, v := range cm.Data {
		src, ok := s.keys[k]
		if !ok {
			continue
		}
		var p struct {
			ResourceVersion string `json:"resourceVersion"`
		}
		if json.Unmarshal([]byte(v), &p) != nil {
			continue
		}
		rv, err := history.ParseRV(p.ResourceVersion)
		if err != nil || rv == 0 {
			continue
		}
		got++
		s.samples = append(s.samples, history.Sample{At: at, Read: read, Source: src, CheckpointRV: rv, StreamLastSeq: info.State.LastSeq})
	}
	if got < len(s.keys) {
		s.errs++
	}
}

// fail counts a try whose read failed; unavailable unless the server
// answered it with an error of the request itself (the ConfigMap or the
// stream not found, forbidden, invalid): then the sampler is wrong, not a
// server down.
func (s *Sampler) fail(err error) {
	var st apierrors.APIStatus
	var jsErr jetstream.JetStreamError
	answered := errors.Is(err, jetstream.ErrStreamNotFound) || errors.As(err, &jsErr)
	if errors.As(err, &st) {
		code := st.Status().Code
		answered = code != 0 && code < 500 && code != 429
	}
	s.mu.Lock()
	s.errs++
	if !answered {
		s.unavailable++
	}
	s.mu.Unlock()
}

// Record puts the samples so far into h, with how many tries there were,
// how many of them failed (yielded no sample of some source) and how many
// of those found a server unavailable.
func (s *Sampler) Record(h *history.History) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h.Samples = append([]history.Sample(nil), s.samples...)
	h.SampleAttempts, h.SampleErrors, h.SampleUnavailable = s.attempts, s.errs, s.unavailable
}
