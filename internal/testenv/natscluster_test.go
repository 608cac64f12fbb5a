package testenv_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/internal/testenv"
)

// A three-server cluster of nats-server processes: an R3 stream and an R3
// bucket live on all three; the stream leader killed with SIGKILL (its
// process gone), a new one is elected and still drops a duplicate
// Nats-Msg-Id; two of three stopped cleanly, writes fail (no quorum) and
// nothing is stored; everything back, writes go on, and the restarted
// servers are on their old ports with their old stores.
func TestNATSCluster(t *testing.T) {
	c, err := testenv.StartNATSCluster(3, testenv.NATSClusterOptions{Name: "tc"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for i := range c.Len() {
				t.Logf("%s log:\n%s", c.Name(i), c.Log(i))
			}
		}
		c.Shutdown()
	})
	if got := strings.Count(c.URLs(), ","); got != 2 {
		t.Fatalf("URLs() = %q, want 3 comma-separated URLs", c.URLs())
	}
	nc, err := nats.Connect(c.URLs(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	cfg := jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, Replicas: 3, Duplicates: 10 * time.Minute}
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "B", Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"S", "KV_B"} {
		if err := c.WaitStreamCurrent(s, 30*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	// publish retries until the deadline: a leader change takes seconds.
	publish := func(id string, within time.Duration) (*jetstream.PubAck, error) {
		deadline := time.Now().Add(within)
		for {
			pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			ack, err := js.Publish(pctx, "s.x", []byte(id), jetstream.WithMsgID(id))
			cancel()
			if err == nil || time.Now().After(deadline) {
				return ack, err
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	for i := range 10 {
		if _, err := publish(fmt.Sprint("m", i), 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := kv.Put(ctx, "k", []byte("1")); err != nil {
		t.Fatal(err)
	}

	// The stream leader is killed (SIGKILL: no step-down): its process is
	// gone, another server is elected, and the duplicate window survived
	// the change.
	old, err := c.WaitStreamLeader("S", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	pid := c.Pid(old)
	st, err := c.Kill(old)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("killed %s (pid %d): %v", c.Name(old), pid, st)
	if ws, ok := st.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("%s (pid %d) ended with %v, want a SIGKILL", c.Name(old), pid, st)
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("process %d after Kill: kill(pid, 0) = %v, want ESRCH (gone)", pid, err)
	}
	if c.Pid(old) != 0 || slices.Contains(c.Running(), old) {
		t.Fatalf("server %d still counted as running after Kill: %v", old, c.Running())
	}
	leader, err := c.WaitStreamLeader("S", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if leader == old {
		t.Fatalf("killed server %d still leads", old)
	}
	t.Logf("%s leads S after the kill", c.Name(leader))
	ack, err := publish("m3", 30*time.Second)
	if err != nil {
		t.Fatalf("publish after the leader change: %v", err)
	}
	if !ack.Duplicate || ack.Sequence != 4 {
		t.Errorf("m3 again after the leader change: %+v, want a duplicate of sequence 4", ack)
	}
	if _, err := publish("m10", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	// The bucket's own stream may have had its leader on the killed server
	// too: its election can end after the stream's.
	deadline := time.Now().Add(30 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := kv.Put(pctx, "k", []byte("2"))
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("bucket write with 2 of 3 servers, for 30s: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := c.Start(old); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitReady(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitStreamCurrent("S", 30*time.Second); err != nil {
		t.Fatal(err)
	}

	// Quorum lost: two of three stopped, writes are refused (they time
	// out) and none is stored.
	down := []int{(leader + 1) % 3, (leader + 2) % 3}
	for _, i := range down {
		if st := c.Stop(i); st == nil || !st.Success() {
			t.Fatalf("clean stop of %s ended with %v, want exit status 0", c.Name(i), st)
		}
	}
	if got := c.Running(); len(got) != 1 || got[0] != leader {
		t.Fatalf("running %v, want only %d", got, leader)
	}
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	_, err = js.Publish(pctx, "s.x", []byte("lost?"), jetstream.WithMsgID("m11"))
	cancel()
	if err == nil {
		t.Fatal("a publish was acknowledged by 1 of 3 servers of an R3 stream")
	}
	t.Logf("publish without quorum: %v", err)
	if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, jetstream.ErrNoStreamResponse) {
		t.Logf("(an error other than a timeout: %T)", err)
	}
	if err := c.StartAll(60 * time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := publish("m11", 60*time.Second); err != nil {
		t.Fatalf("publish after quorum regained: %v", err)
	}
	s, err := js.Stream(ctx, "S")
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 12 {
		t.Errorf("stream holds %d messages, want 12 (m0..m11, each once)", info.State.Msgs)
	}
	if len(info.Cluster.Replicas) != 2 {
		t.Errorf("stream has %d replicas besides its leader, want 2: %+v", len(info.Cluster.Replicas), info.Cluster)
	}
	e, err := kv.Get(ctx, "k")
	if err != nil || string(e.Value()) != "2" {
		t.Errorf("bucket k = %v (%v), want 2", e, err)
	}
	// Every server, the killed one too, is back on its old client port.
	for i := range 3 {
		snc, err := nats.Connect(c.URL(i))
		if err != nil {
			t.Errorf("server %d at %s: %v", i, c.URL(i), err)
			continue
		}
		if got := snc.ConnectedServerName(); got != c.Name(i) {
			t.Errorf("%s is %s, want %s", c.URL(i), got, c.Name(i))
		}
		snc.Close()
	}
}

// The cluster's nats-server binary must be go.mod's version: missing, or
// reporting another version, is an error naming the make target.
func TestNATSServerBinIsGoModsVersion(t *testing.T) {
	bin, err := testenv.NATSServerBin()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("nats-server: %s", bin)
	missing := filepath.Join(t.TempDir(), "nats-server")
	t.Setenv("RELAYD_NATS_SERVER", missing)
	if _, err := testenv.NATSServerBin(); err == nil || !strings.Contains(err.Error(), "make nats-server-bin") {
		t.Errorf("NATSServerBin with %s missing: %v, want an error naming make nats-server-bin", missing, err)
	}
	if err := os.WriteFile(missing, []byte("#!/bin/sh\necho 'nats-server: v2.0.0'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := testenv.NATSServerBin(); err == nil || !strings.Contains(err.Error(), `reports "nats-server: v2.0.0"`) {
		t.Errorf("NATSServerBin with a v2.0.0 binary: %v, want it refused", err)
	}
	if _, err := testenv.StartNATSCluster(1, testenv.NATSClusterOptions{}); err == nil {
		t.Error("StartNATSCluster started a cluster of another version's binary")
	}
}
