package stream

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

func TestCaptures(t *testing.T) {
	for _, tt := range []struct {
		stream, pattern string
		want            bool
	}{
		{"k8s.east.>", "k8s.east.>", true},
		{"k8s.>", "k8s.east.>", true},
		{">", "k8s.east.>", true},
		{"k8s.*.>", "k8s.east.>", true},
		{"*.east.>", "k8s.east.>", true},
		{"k8s.west.>", "k8s.east.>", false},
		{"k8s.east", "k8s.east.>", false},
		{"k8s.east.*", "k8s.east.>", false}, // one token only; relayd's subjects have several
		{"k8s.east.*.>", "k8s.east.>", false},
		{"audit.>", "k8s.east.>", false},
		{"k8s", "k8s.east.>", false},
		{"k8s.east.>", "k8s.>", false},
		{"acme.k8s.east.>", "acme.k8s.east.>", true},
		{"acme.*.east.>", "acme.k8s.east.>", true},
	} {
		if got := Captures(tt.stream, tt.pattern); got != tt.want {
			t.Errorf("Captures(%q, %q) = %v, want %v", tt.stream, tt.pattern, got, tt.want)
		}
	}
}

func want() Want {
	return Want{Name: "EVENTS", Subject: "k8s.east.>", Create: true, DuplicateWindow: 10 * time.Minute,
		Replicas: 1, Storage: jetstream.FileStorage, MaxAge: 168 * time.Hour, MaxBytes: -1}
}

func TestCheckOwnStreamIsClean(t *testing.T) {
	w := want()
	if p := Check(w.Config(), w); p.AddSubject || p.Blocker != "" || len(p.Warnings) > 0 {
		t.Fatalf("a stream as relayd creates it: %+v", p)
	}
}

func TestCheck(t *testing.T) {
	admin := jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"audit.>"}, MaxAge: 72 * time.Hour, MaxBytes: -1,
		Duplicates: 10 * time.Minute, Replicas: 1, Storage: jetstream.FileStorage, Discard: jetstream.DiscardOld}
	for _, tt := range []struct {
		name     string
		edit     func(*jetstream.StreamConfig, *Want)
		add      bool
		blocker  string // substring; "" = none
		warnings []string
	}{
		{name: "shared stream: add the subject, warn, change nothing else", add: true,
			warnings: []string{"discard is old, nats.stream.discard is new", "maxAge is 72h, nats.stream.maxAge is 168h"}},
		{name: "already captured by a wider subject", edit: func(c *jetstream.StreamConfig, _ *Want) { c.Subjects = append(c.Subjects, "k8s.>") },
			warnings: []string{"discard is old", "maxAge is 72h"}},
		{name: "create false: not captured blocks, naming both", edit: func(_ *jetstream.StreamConfig, w *Want) { w.Create = false },
			blocker: `stream EVENTS has subjects ["audit.>"], none of which captures relayd's "k8s.east.>"`, warnings: []string{"discard", "maxAge"}},
		{name: "30s duplicate window blocks", edit: func(c *jetstream.StreamConfig, _ *Want) {
			c.Duplicates = 30 * time.Second
			c.Subjects = []string{"k8s.>"}
		},
			blocker: "duplicate window of 30s, under 1m", warnings: []string{"discard", "maxAge"}},
		{name: "shorter duplicate window warns", edit: func(c *jetstream.StreamConfig, _ *Want) {
			c.Duplicates = 2 * time.Minute
			c.Subjects = []string{"k8s.>"}
		},
			warnings: []string{"duplicateWindow is 2m, nats.stream.duplicateWindow is 10m", "discard", "maxAge"}},
		{name: "no limits", edit: func(c *jetstream.StreamConfig, _ *Want) {
			c.MaxAge, c.Discard, c.MaxMsgs, c.Subjects = 0, jetstream.DiscardNew, -1, []string{"k8s.>"}
		}, warnings: []string{"stream EVENTS has no limits"}},
		{name: "replicas and storage", edit: func(c *jetstream.StreamConfig, _ *Want) {
			c.Replicas, c.Storage, c.MaxAge, c.Discard, c.MaxBytes, c.Subjects = 3, jetstream.MemoryStorage, 168*time.Hour, jetstream.DiscardNew, 1<<30, []string{"k8s.>"}
		}, warnings: []string{"maxBytes is 1073741824, nats.stream.maxBytes is -1", "replicas is 3, nats.stream.replicas is 1", "storage is Memory, nats.stream.storage is File"}},
		{name: "sealed: blocks, no subject added", edit: func(c *jetstream.StreamConfig, _ *Want) { c.Sealed = true },
			blocker: "stream EVENTS is sealed: it takes no messages", warnings: []string{"discard", "maxAge"}},
		{name: "mirror", edit: func(c *jetstream.StreamConfig, _ *Want) {
			c.Mirror, c.Subjects = &jetstream.StreamSource{Name: "ORIGIN"}, nil
		}, blocker: "is a mirror of ORIGIN", warnings: []string{"discard", "maxAge"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, w := admin, want()
			c.Subjects = append([]string(nil), admin.Subjects...)
			if tt.edit != nil {
				tt.edit(&c, &w)
			}
			p := Check(c, w)
			if p.AddSubject != tt.add {
				t.Errorf("AddSubject = %v, want %v", p.AddSubject, tt.add)
			}
			if (tt.blocker == "") != (p.Blocker == "") || !strings.Contains(p.Blocker, tt.blocker) {
				t.Errorf("Blocker = %q, want one containing %q", p.Blocker, tt.blocker)
			}
			if len(p.Warnings) != len(tt.warnings) {
				t.Fatalf("warnings %q, want %d like %q", p.Warnings, len(tt.warnings), tt.warnings)
			}
			for i, w := range tt.warnings {
				if !strings.Contains(p.Warnings[i], w) || !strings.HasPrefix(p.Warnings[i], "stream EVENTS") {
					t.Errorf("warning %d = %q, want it to contain %q", i, p.Warnings[i], w)
				}
			}
		})
	}
}

func TestLeaderless(t *testing.T) {
	info := func(replicas int, cluster *jetstream.ClusterInfo) *jetstream.StreamInfo {
		return &jetstream.StreamInfo{Config: jetstream.StreamConfig{Name: "K8S", Replicas: replicas}, Cluster: cluster}
	}
	for _, c := range []struct {
		name string
		in   *jetstream.StreamInfo
		want string
	}{
		{"no info", nil, ""},
		{"single server", info(1, nil), ""},
		{"R1 in a cluster, no leader reported", info(1, &jetstream.ClusterInfo{Name: "c"}), ""},
		{"R3 with a leader", info(3, &jetstream.ClusterInfo{Name: "c", Leader: "n1"}), ""},
		{"R3 without a leader", info(3, &jetstream.ClusterInfo{Name: "c"}),
			`stream K8S (3 replicas) has no leader: its JetStream cluster "c" lost quorum or is electing one; publishes wait, nothing is lost`},
	} {
		if got := Leaderless(c.in); got != c.want {
			t.Errorf("%s: got %q, want %q", c.name, got, c.want)
		}
	}
}
