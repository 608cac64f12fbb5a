package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/internal/testutil"
	"github.com/relayd/relayd/pkg/event"
	"github.com/relayd/relayd/pkg/stream"
)

// The consumer definitions outside Go that docs/CONSUMING.md shows, file by
// file: the doc shows each byte for byte (a fenced block after
// "<!-- file: <path> -->").
var clientFiles = []string{"examples/consumer/nats/consumer.json", "examples/consumer/python/consumer.py"}

func TestConsumingDocShowsTheClientFiles(t *testing.T) {
	root := testutil.RepoRootT(t)
	doc, err := os.ReadFile(filepath.Join(root, "docs", "CONSUMING.md"))
	if err != nil {
		t.Fatal(err)
	}
	samples := testutil.DocSamples(t, string(doc), "file")
	for _, f := range clientFiles {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		got, ok := samples[f]
		switch {
		case !ok:
			t.Errorf("docs/CONSUMING.md does not show %s (a fenced block after <!-- file: %s -->)", f, f)
		case got != string(b):
			t.Errorf("docs/CONSUMING.md's copy of %s differs from the file:\n doc: %q\nfile: %q", f, got, b)
		}
	}
}

// The nats CLI consumer definition (nats consumer add K8S --config
// examples/consumer/nats/consumer.json) is a JetStream consumer
// configuration that nats.go reads without an unknown member, follows
// docs/CONSUMING.md (durable, explicit ack, bounded deliveries spaced by a
// back-off, the object subjects and the markers of the source that
// publishes them), and that a real JetStream server accepts on a stream
// configured as relayd creates it; the consumer then delivers the source's
// Deployments and markers, in both CloudEvents modes, and nothing of
// another source.
func TestNATSCLIConsumerConfig(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(testutil.RepoRootT(t), clientFiles[0]))
	if err != nil {
		t.Fatal(err)
	}
	var cfg jetstream.ConsumerConfig
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil {
		t.Fatalf("%s: %v", clientFiles[0], err)
	}
	if cfg.Durable == "" || cfg.AckPolicy != jetstream.AckExplicitPolicy || cfg.MaxDeliver <= len(cfg.BackOff) || len(cfg.BackOff) == 0 ||
		!slices.Contains(cfg.FilterSubjects, "k8s.prod._relayd.deploys.>") {
		t.Errorf("%s: %+v: want a durable, explicit ack, a back-off with more deliveries than its steps, and the markers of source deploys", clientFiles[0], cfg)
	}

	_, js := connect(t)
	name := fmt.Sprint("CLI", runs.Add(1))
	want := stream.Want{Name: name, Subject: "k8s.prod.>", DuplicateWindow: 10 * time.Minute, MaxAge: 7 * 24 * time.Hour, MaxBytes: -1, Storage: jetstream.FileStorage}
	if _, err := js.CreateStream(t.Context(), want.Config()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(t.Context(), name) })
	deployments := event.Resource{Group: "apps", Version: "v1", Resource: "deployments", Kind: "Deployment", Namespaced: true}
	var wantSeqs []uint64
	for _, binary := range []bool{false, true} {
		deploys, cms := encoder(t, "prod", "deploys", binary), encoder(t, "prod", "cms", binary)
		ns := fmt.Sprint("shop-", binary)
		wantSeqs = append(wantSeqs, publish(t, js, deploys.Control(event.SyncEvent{Namespace: ns, Epoch: 1, Reason: "initial", Resource: deployments})))
		c := change(event.Added, ns, "web", "uid-web-"+ns, "10")
		c.Resource = deployments
		wantSeqs = append(wantSeqs, publish(t, js, encode(t, deploys, c)))
		publish(t, js, encode(t, cms, change(event.Added, ns, "settings", "uid-cm-"+ns, "11")))
		publish(t, js, cms.Control(event.SyncEvent{Completed: true, Namespace: ns, Epoch: 1, Reason: "initial", Resource: cmResource}))
		wantSeqs = append(wantSeqs, publish(t, js, deploys.Control(event.SyncEvent{Completed: true, Namespace: ns, Epoch: 1, Reason: "initial", Resource: deployments})))
	}

	cons, err := js.CreateConsumer(t.Context(), name, cfg)
	if err != nil {
		t.Fatalf("JetStream refuses %s: %v", clientFiles[0], err)
	}
	info, err := cons.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.AckWait != cfg.BackOff[0] {
		t.Errorf("ack wait %v, want the first back-off step %v", info.Config.AckWait, cfg.BackOff[0])
	}
	batch, err := cons.FetchNoWait(100)
	if err != nil {
		t.Fatal(err)
	}
	var got []uint64
	for m := range batch.Messages() {
		md, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, md.Sequence.Stream)
		env, err := event.DecodeMessage(m.Headers(), m.Data())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Check("k8s", "prod", m.Subject(), m.Headers().Get(event.HeaderMsgID), &env); err != nil {
			t.Errorf("seq %d: %v", md.Sequence.Stream, err)
		}
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	if batch.Error() != nil {
		t.Fatal(batch.Error())
	}
	if !slices.Equal(got, wantSeqs) {
		t.Errorf("the consumer delivered stream sequences %v, want %v (source deploys: its markers and its Deployment, in both modes)", got, wantSeqs)
	}
}

// The Python example (examples/consumer/python/consumer.py) compiles. It
// is not run: nats-py is not a dependency of this repository.
func TestPythonExampleCompiles(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not installed: the Python example is not compiled")
	}
	src := filepath.Join(testutil.RepoRootT(t), clientFiles[1])
	out, err := exec.Command(py, "-c", "import py_compile, sys; py_compile.compile(sys.argv[1], cfile=sys.argv[2], doraise=True)",
		src, filepath.Join(t.TempDir(), "consumer.pyc")).CombinedOutput()
	if err != nil {
		t.Errorf("python3 -m py_compile %s: %v\n%s", clientFiles[1], err, out)
	}
}
