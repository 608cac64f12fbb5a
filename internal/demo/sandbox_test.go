package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/relayd/relayd/internal/testutil"
	"github.com/relayd/relayd/pkg/event"
)

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var (
	kubeconfigLine = regexp.MustCompile(`(?m)^  KUBECONFIG +(\S+)$`)
	natsLine       = regexp.MustCompile(`(?m)^  NATS +(\S+) `)
)

// make sandbox: the servers and relayd keep running, reachable with the
// KUBECONFIG and NATS URL it prints: an object created with that kubeconfig
// reaches the stream. Cancelling (Ctrl-C) ends it cleanly: every process
// stopped, the working dir removed.
func TestSandboxRelaysUntilStoppedAndLeavesNothing(t *testing.T) {
	if os.Getenv("RELAYD_BIN") == "" {
		t.Fatal("RELAYD_BIN is not set: run `make build` and set RELAYD_BIN=$PWD/bin/relayd (make test does both)")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out syncBuffer
	d := &demo{out: &printer{w: &out}, t0: time.Now(), events: newEventLog(), sandbox: true}
	done := make(chan error, 1)
	go func() { done <- d.run(ctx) }()
	var kc, url string
	ended := func() error {
		select {
		case err := <-done:
			d.cleanup(true)
			return fmt.Errorf("the sandbox ended before it was ready: %v\n%s", err, out.String())
		default:
			return nil
		}
	}
	testutil.EventuallyUnless(t, 3*time.Minute, "the sandbox prints that it is ready", ended, func() error {
		m, n := kubeconfigLine.FindStringSubmatch(out.String()), natsLine.FindStringSubmatch(out.String())
		if m == nil || n == nil {
			return errors.New("no KUBECONFIG and NATS lines yet")
		}
		kc, url = m[1], n[1]
		return nil
	})

	cfg, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "try-me", Labels: map[string]string{"app": "shop"}}, Data: map[string]string{"k": "v"}}
	if _, err := cs.CoreV1().ConfigMaps("demo").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, "try-me's added event on stream K8S", func() error {
		s, err := js.Stream(ctx, "K8S")
		if err != nil {
			return err
		}
		m, err := s.GetLastMsgForSubject(ctx, "k8s.demo.core.v1.configmaps.demo.try-me.added")
		if err != nil {
			return err
		}
		env, err := event.DecodeMessage(m.Header, m.Data)
		if err != nil || env.K8sName != "try-me" {
			return errors.Join(err, errors.New("not try-me's event"))
		}
		return nil
	})
	nc.Close()

	cancel()
	if err := <-done; err != nil {
		t.Fatalf("sandbox: %v\n%s", err, out.String())
	}
	d.cleanup(false)
	if !d.relayd.exited() || !d.tail.exited() {
		t.Error("relayd or relayd tail still running after cleanup")
	}
	if _, err := os.Stat(d.tmp); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("working dir %s left behind (%v)", d.tmp, err)
	}
}
