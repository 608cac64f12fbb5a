package deploy

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.yaml.in/yaml/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/relayd/relayd/pkg/shard"
)

// TestHAOverlayShipsALeasePerSource: the ha overlay turns sharding on and
// ships, for every source of its config, the pre-created Lease and its name
// in a Role with get and update only — and nothing else about Leases.
func TestHAOverlayShipsALeasePerSource(t *testing.T) {
	b := loadBundle(t, haDir)
	if !b.cfg.Sharding.Enabled {
		t.Fatal("the ha overlay's config does not enable sharding")
	}
	want := sets.New[string]()
	for _, src := range b.cfg.Sources {
		want.Insert(shard.LeaseName(b.cfg.Sharding.LeasePrefix, src.Name))
	}
	shipped := sets.New[string]()
	for _, o := range b.objs {
		if o.GetKind() == "Lease" {
			shipped.Insert(o.GetName())
			if o.GetNamespace() != b.namespace() {
				t.Errorf("Lease %s is in namespace %q, want relayd's %q (checkpoint.namespace)", o.GetName(), o.GetNamespace(), b.namespace())
			}
		}
	}
	if !shipped.Equal(want) {
		t.Errorf("Leases shipped %v, want one per source %v", sets.List(shipped), sets.List(want))
	}
	granted := sets.New[string]()
	for _, p := range permissions(t, b.objs) {
		if p.resource != "leases" {
			continue
		}
		if p.group != "coordination.k8s.io" || p.roleKind != "Role" || (p.verb != "get" && p.verb != "update") || len(p.resourceNames) == 0 {
			t.Errorf("unexpected Lease permission %s", p)
		}
		granted.Insert(p.verb + " " + strings.Join(p.resourceNames, ","))
	}
	names := strings.Join(sets.List(want), ",")
	if exp := sets.New("get "+names, "update "+names); !granted.Equal(exp) {
		t.Errorf("Lease permissions %v, want %v", sets.List(granted), sets.List(exp))
	}
}

// TestHAOverlayRunsShardedAndEveryLeaseRuleIsNeeded applies the rendered
// ha overlay to the real apiserver and runs two relayd binaries as its
// ServiceAccount (POD_NAME relayd-a and relayd-b; only the NATS URL and the
// sharding timings differ from the shipped config): both become ready, the
// two sources are spread one per replica, each relays a change of its
// source; then without each Lease permission, relayd says which.
func TestHAOverlayRunsShardedAndEveryLeaseRuleIsNeeded(t *testing.T) {
	fast := func(root *yaml.Node) {
		sh := mapValue(t, root, "sharding")
		setKey(t, sh, "leaseDuration", "4s")
		setKey(t, sh, "renewDeadline", "3s")
		setKey(t, sh, "retryPeriod", "500ms")
	}
	in := newInstallOf(t, env, natsSrv.URL(), haDir, fast)
	b, ctx := in.b, t.Context()
	resetCheckpoint(t, in.c, b.namespace(), b.checkpointCM.Name)
	holders := func() map[string]string {
		out := map[string]string{}
		for _, src := range b.cfg.Sources {
			l, err := in.c.cs.CoordinationV1().Leases(b.namespace()).Get(ctx, shard.LeaseName(b.cfg.Sharding.LeasePrefix, src.Name), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if h := l.Spec.HolderIdentity; h != nil && *h != "" {
				out[src.Name] = *h
			}
		}
		return out
	}

	t.Run("two replicas share the sources", func(t *testing.T) {
		nc, err := nats.Connect(in.natsURL)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		sub, err := nc.SubscribeSync(b.cfg.StreamSubject())
		if err != nil {
			t.Fatal(err)
		}
		ra, rb := in.runAs(t, "relayd-a"), in.runAs(t, "relayd-b")
		in.waitReady(t, ra)
		in.waitReady(t, rb)
		eventually(t, ra, 30*time.Second, "one source per replica", func() error {
			h := holders()
			ids := sets.New[string]()
			for _, id := range h {
				ids.Insert(id)
			}
			if len(h) != len(b.cfg.Sources) || !ids.Equal(sets.New("relayd-a", "relayd-b")) {
				return fmt.Errorf("holders %v", h)
			}
			return nil
		})
		h := holders()
		t.Logf("holders: %v", h)
		for src, id := range h {
			r := map[string]*relayd{"relayd-a": ra, "relayd-b": rb}[id]
			if err := r.metricAtLeast("relayd_source_leader", map[string]string{"source": src}, 1); err != nil {
				t.Errorf("%s holds the Lease of %s but does not report leading it: %v", id, src, err)
			}
		}

		probeNS := fmt.Sprintf("ha-probe-%d", time.Now().UnixNano())
		in.c.ensureNamespace(t, probeNS)
		if _, err := in.c.cs.CoreV1().ConfigMaps(probeNS).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "probe"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		want := strings.TrimSuffix(b.cfg.StreamSubject(), ">") + "core.v1.configmaps." + probeNS + ".probe.added"
		deadline := time.Now().Add(30 * time.Second)
		for {
			m, err := sub.NextMsg(time.Until(deadline))
			if err != nil {
				t.Fatalf("waiting for %s: %v", want, err)
			}
			if m.Subject == want {
				break
			}
		}
		for _, r := range []*relayd{ra, rb} {
			if err := r.stop(t, in.grace); err != nil {
				t.Errorf("stop: %v", err)
			}
		}
		if h := holders(); len(h) != 0 {
			t.Errorf("Leases still held after both replicas stopped: %v", h)
		}
	})
	if t.Failed() {
		return
	}

	var leasePerms []permission
	for _, p := range permissions(t, b.objs) {
		if p.resource == "leases" {
			leasePerms = append(leasePerms, p)
		}
	}
	sort.Slice(leasePerms, func(i, j int) bool { return leasePerms[i].String() < leasePerms[j].String() })
	if len(leasePerms) != 2 {
		t.Fatalf("want the get and update Lease permissions, have %v", leasePerms)
	}
	for _, p := range leasePerms {
		t.Run("without "+p.String(), func(t *testing.T) {
			in.without(t, p, func() {
				r := in.runAs(t, "relayd-a")
				eventually(t, r, 30*time.Second, "an error naming "+p.String(), func() error {
					for _, e := range r.entries() {
						if e.level == "error" && strings.Contains(e.text, "sharding cannot start") &&
							strings.Contains(e.text, fmt.Sprintf("cannot %s resource \"leases\"", p.verb)) &&
							strings.Contains(e.text, b.namespace()+"/"+p.resourceNames[0]) {
							t.Logf("relayd logs [%s]: %s", e.level, e.text)
							return nil
						}
					}
					return fmt.Errorf("no error log names %s", p)
				})
				// Readiness names the first thing missing: the checkpoints
				// may still be loading when the Lease is refused.
				var code int
				var body string
				eventually(t, r, 30*time.Second, "/readyz naming sharding", func() error {
					var err error
					if code, body, err = r.probe("/readyz"); err != nil || code != 503 || !strings.Contains(body, "sharding not started") {
						return fmt.Errorf("/readyz = %d %q (%v), want 503 naming sharding", code, body, err)
					}
					return nil
				})
				t.Logf("/readyz: %d %s", code, body)
				if err := r.stop(t, in.grace); err != nil {
					t.Errorf("stop: %v", err)
				}
			})
		})
	}
}
