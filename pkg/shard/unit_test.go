package shard

import (
	"context"
	"sort"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func validOptions() Options {
	return Options{
		Client:    fake.NewClientset().CoordinationV1(),
		Namespace: "relayd",
		Identity:  "relayd-0",
		Sources:   []string{"pods", "deployments"},
		Logger:    zap.NewNop(),
		Run:       func(context.Context, string) {},
	}
}

func TestNewValidation(t *testing.T) {
	for _, tc := range []struct {
		name   string
		modify func(*Options)
		want   []string
	}{
		{"required", func(o *Options) { *o = Options{} }, []string{
			"shard: Options.Client is required",
			"shard: Options.Namespace is required",
			"shard: Options.Identity is required",
			"shard: Options.Logger is required",
			"shard: Options.Run is required",
			"shard: Options.Sources must name at least one source",
		}},
		{"duplicate source", func(o *Options) { o.Sources = []string{"a", "b", "a"} },
			[]string{`shard: Options.Sources[2]: duplicate source "a" (first at [0])`}},
		{"bad lease name", func(o *Options) { o.Sources = []string{"Pods"} },
			[]string{`shard: Options.Sources[0]: Lease name "relayd-Pods" is not valid`}},
		{"negative", func(o *Options) { o.RetryPeriod = -time.Second },
			[]string{"shard: Options.RetryPeriod must not be negative, got -1s"}},
		{"renew deadline", func(o *Options) { o.LeaseDuration = 3 * time.Second },
			[]string{"shard: Options.RenewDeadline (10s) must be less than Options.LeaseDuration (3s)"}},
		{"retry period", func(o *Options) { o.RetryPeriod = 10 * time.Second },
			[]string{"shard: Options.RetryPeriod (10s) must be less than Options.RenewDeadline (10s)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := validOptions()
			tc.modify(&o)
			_, err := New(o)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\ndoes not contain %q", err, w)
				}
			}
		})
	}

	s, err := New(validOptions())
	if err != nil {
		t.Fatal(err)
	}
	if s.leaseDuration != DefaultLeaseDuration || s.renewDeadline != DefaultRenewDeadline || s.retryPeriod != DefaultRetryPeriod ||
		s.leaseSeconds != 15 || s.slots[0].name != "relayd-deployments" || s.slots[1].name != "relayd-pods" {
		t.Errorf("defaults: %+v", s)
	}
	if err := s.Run(t.Context()); err == nil {
		// The fake has no Leases: Run fails at start, and only once.
		t.Error("Run without Leases succeeded")
	}
	if err := s.Run(t.Context()); err == nil || !strings.Contains(err.Error(), "only be called once") {
		t.Errorf("second Run: %v", err)
	}
}

func TestQuota(t *testing.T) {
	for _, tc := range []struct {
		members []string
		sources int
		want    map[string]int
	}{
		{[]string{"a"}, 5, map[string]int{"a": 5}},
		{[]string{"c", "a", "b"}, 6, map[string]int{"a": 2, "b": 2, "c": 2}},
		{[]string{"c", "a", "b"}, 7, map[string]int{"a": 3, "b": 2, "c": 2}},
		{[]string{"d", "c", "a", "b"}, 6, map[string]int{"a": 2, "b": 2, "c": 1, "d": 1}},
		{[]string{"a", "b", "c"}, 2, map[string]int{"a": 1, "b": 1, "c": 0}},
	} {
		total := 0
		for id, want := range tc.want {
			got := quota(tc.members, id, tc.sources)
			total += got
			if got != want {
				t.Errorf("quota(%v, %s, %d) = %d, want %d", tc.members, id, tc.sources, got, want)
			}
		}
		if total != tc.sources {
			t.Errorf("quotas of %v add up to %d, want %d", tc.members, total, tc.sources)
		}
	}
	if q := quota([]string{"a"}, "b", 3); q != 0 {
		t.Errorf("non-member quota = %d", q)
	}
}

// TestMembership: liveness by the observer's clock, "left" at once, the
// annotation pruned of the dead, our own heartbeat strictly increasing.
func TestMembership(t *testing.T) {
	s, err := New(validOptions())
	if err != nil {
		t.Fatal(err)
	}
	ttl := s.leaseDuration
	t0 := time.Now()
	wall := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	sl := s.slots[0]
	observe := func(at time.Time, heartbeats map[string]heartbeat) {
		l := &coordinationv1.Lease{}
		l.Annotations = map[string]string{MembersAnnotation: encodeMembers(heartbeats)}
		s.mu.Lock()
		s.observeLocked(sl, l, at)
		s.mu.Unlock()
	}
	alive := func(at time.Time) []string {
		s.mu.Lock()
		defer s.mu.Unlock()
		var out []string
		for id, m := range s.members {
			if m.alive(at, ttl) {
				out = append(out, id)
			}
		}
		sort.Strings(out)
		return out
	}

	c := heartbeat{Time: wall} // c never advances
	observe(t0, map[string]heartbeat{"b": {Time: wall}, "c": c, "relayd-0": {Time: wall}})
	if got := alive(t0); strings.Join(got, ",") != "b,c" {
		t.Fatalf("alive = %v", got)
	}
	// b advances, c does not: c is dead one LeaseDuration after it was seen.
	observe(t0.Add(ttl/2), map[string]heartbeat{"b": {Time: wall.Add(time.Second)}, "c": c})
	if got := alive(t0.Add(ttl)); strings.Join(got, ",") != "b" {
		t.Fatalf("alive = %v", got)
	}
	// An older copy of b's heartbeat does not count as news.
	observe(t0.Add(ttl), map[string]heartbeat{"b": {Time: wall}, "c": c})
	if got := alive(t0.Add(ttl/2 + ttl)); len(got) != 0 {
		t.Fatalf("alive = %v", got)
	}
	// b comes back, then leaves: dead at once.
	observe(t0.Add(2*ttl), map[string]heartbeat{"b": {Time: wall.Add(2 * time.Second)}, "c": c})
	observe(t0.Add(2*ttl+time.Second), map[string]heartbeat{"b": {Time: wall.Add(3 * time.Second), Left: true}, "c": c})
	if got := alive(t0.Add(2*ttl + time.Second)); len(got) != 0 {
		t.Fatalf("alive after leaving = %v", got)
	}

	// Writing prunes c (dead for a LeaseDuration) but keeps b's "left" mark
	// until it is a LeaseDuration old, and adds ours.
	s.mu.Lock()
	out := s.prepareLocked(sl.lease, writeHeartbeat, t0.Add(2*ttl+2*time.Second))
	out2 := s.prepareLocked(out, writeHeartbeat, t0.Add(2*ttl+2*time.Second))
	s.mu.Unlock()
	heartbeats, err := decodeMembers(out)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := heartbeats["c"]; ok || !heartbeats["b"].Left || heartbeats["relayd-0"].Time.IsZero() || heartbeats["relayd-0"].Left {
		t.Errorf("annotation = %s", out.Annotations[MembersAnnotation])
	}
	laterHeartbeats, _ := decodeMembers(out2)
	if !laterHeartbeats["relayd-0"].Time.After(heartbeats["relayd-0"].Time) {
		t.Errorf("heartbeat not increasing: %v then %v", heartbeats["relayd-0"].Time, laterHeartbeats["relayd-0"].Time)
	}
	if out.Spec.HolderIdentity != nil {
		t.Errorf("heartbeat changed the spec: %+v", out.Spec)
	}
}
