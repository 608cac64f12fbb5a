package relay_test

// A change whose event does not fit the NATS server's max payload even with
// the reference payload, through relayd against the real servers (a NATS
// server with a small max_payload): it is published without data, flagged
// relaydunencodable, and counted; the position moves past it only once that
// event is stored. If not even that fits, the source stalls at the change:
// neither published nor skipped (docs/GUARANTEES.md, "Other decisions an
// operator should know").

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/pkg/event"
	"github.com/relayd/relayd/pkg/sink"
)

// longName is a ConfigMap name of the maximum length (a DNS subdomain of
// 253 characters): its identity alone makes the events large.
var longName = strings.Repeat("u", 253)

// unencodableLimits returns the smallest and the largest event without data
// that a change of longName can have under any fixture (namespace of 1 to 63
// characters, cluster "c" and up to 6 digits, resourceVersion of 1 to 20
// digits, a delete's longer id, the test's client named as the author of
// the others: docs/CONSUMING.md, "Who changed it") and the smallest
// reference event it can have. bareMax includes the header the sink adds to
// each publish for the longest stream name a fixture can have: a server
// max payload of bareMax sends every change of it without data, one under
// bareMin none.
func unencodableLimits(t *testing.T) (bareMin, bareMax, refMin int) {
	t.Helper()
	cm := event.Resource{Version: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespaced: true}
	manager, _, _ := strings.Cut(rest.DefaultKubernetesUserAgent(), "/")
	o, err := event.ParseObject([]byte(fmt.Sprintf(`{"metadata":{"name":"x","managedFields":[{"manager":%q,"operation":"Update","time":"2026-01-01T00:00:00Z"}]}}`, manager)))
	if err != nil {
		t.Fatal(err)
	}
	author := o.Author()
	encode := func(cluster, ns, rv string, typ event.Type, limit int) event.Message {
		enc, err := event.NewEncoder(event.EncoderOptions{Cluster: cluster, Source: "cms", MaxPayload: limit})
		if err != nil {
			t.Fatal(err)
		}
		c := event.Change{Type: typ, Origin: event.OriginWatch, Resource: cm, Time: time.Now(),
			Meta: event.Meta{Namespace: ns, Name: longName, UID: strings.Repeat("0", 36), ResourceVersion: rv}}
		if typ != event.Deleted {
			c.Author = author
		}
		msg, err := enc.Encode(&c)
		if err != nil {
			t.Fatal(err)
		}
		return msg
	}
	bare := func(cluster, ns, rv string, typ event.Type) int {
		ref := encode(cluster, ns, rv, typ, 0)
		msg := encode(cluster, ns, rv, typ, ref.Size()-1)
		if !msg.Unencodable {
			t.Fatalf("no event without data under %d bytes", ref.Size()-1)
		}
		return msg.Size()
	}
	ref := encode("c", "n", "1", event.Added, 0)
	largest := max(bare("c999999", strings.Repeat("n", 63), strings.Repeat("9", 20), event.Deleted),
		bare("c999999", strings.Repeat("n", 63), strings.Repeat("9", 20), event.Modified))
	return bare("c", "n", "1", event.Added), largest + sink.HeaderBytes("S999999999"), ref.Size()
}

func TestUnencodableChangeIsPublishedWithoutData(t *testing.T) {
	_, bareMax, refMin := unencodableLimits(t)
	if bareMax-sink.HeaderBytes("S0") >= refMin {
		t.Fatalf("no max payload between %d (largest bare event and header) and %d (smallest reference event)", bareMax, refMin)
	}
	n := testenv.NATST(t, testenv.NATSOptions{MaxPayload: int32(bareMax)})
	f := newFixture(t, env, n, cmSource)
	r := f.start(nil, true)
	long := f.createCM(longName, map[string]string{"l": "1"}, map[string]string{"k": "v"})
	long2 := f.updateCM(long, "k", "w")
	f.deleteCM(longName)
	after := f.createCM("after", nil, nil)

	var deletedRV string
	got := f.waitStored(30*time.Second, isEvent("added", longName, long.ResourceVersion), isEvent("modified", longName, long2.ResourceVersion),
		isEvent("deleted", longName, ""), isEvent("added", "after", after.ResourceVersion))
	for _, m := range got {
		e := m.Env
		if e.K8sName != longName {
			continue
		}
		if !e.RelaydUnencodable || !e.RelaydOversize || e.RelaydPayload != "none" || len(e.Data) != 0 || e.DataContentType != "" ||
			e.K8sUID != string(long.UID) || e.K8sNamespace != f.ns || e.K8sKind != "ConfigMap" || !strings.HasSuffix(m.Subject, "."+strings.TrimPrefix(e.Type, "k8s.object.")) {
			t.Errorf("message %d %s: unencodable=%v oversize=%v payload=%q datacontenttype=%q data=%q uid=%s ns=%s kind=%s, want the flagged event without data",
				m.Seq, m.Subject, e.RelaydUnencodable, e.RelaydOversize, e.RelaydPayload, e.DataContentType, e.Data, e.K8sUID, e.K8sNamespace, e.K8sKind)
		}
		if strings.HasSuffix(e.Type, ".deleted") {
			deletedRV = e.K8sResourceVersion
		} else if manager, _, _ := strings.Cut(rest.DefaultKubernetesUserAgent(), "/"); e.K8sManager != manager &&
			(e.K8sManager != "" || !strings.HasSuffix(e.Type, ".modified")) {
			// unencodableLimits counts this author in the events' size (a
			// modify within the create's second names nobody)
			t.Errorf("message %d %s: k8smanager %q, want the test's client %q", m.Seq, e.Type, e.K8sManager, manager)
		}
	}
	if v := metricValue(t, r.reg, "relayd_events_unencodable_total", map[string]string{"source": "cms"}); v < 3 {
		t.Errorf("relayd_events_unencodable_total{cms} = %v, want >= 3 (added, modified, deleted)", v)
	}
	if v := metricValue(t, r.reg, "relayd_publish_errors_total", map[string]string{"source": "cms", "reason": "unencodable"}); v != 0 {
		t.Errorf("relayd_publish_errors_total{cms,unencodable} = %v, want 0: every change could be published", v)
	}
	// The position moved past the three changes, to "after" or beyond.
	f.checkpointWithin("cms."+f.ns, after.ResourceVersion, "")
	if rvNum(t, deletedRV) > rvNum(t, after.ResourceVersion) {
		t.Errorf("delete at %s after the later create at %s", deletedRV, after.ResourceVersion)
	}
}

func TestUnpublishableChangeStallsTheSource(t *testing.T) {
	bareMin, _, _ := unencodableLimits(t)
	// Under the smallest event without data of longName, over the sync
	// markers and index entries (under 700 bytes).
	n := testenv.NATST(t, testenv.NATSOptions{MaxPayload: int32(bareMin - 1)})
	f := newFixture(t, env, n, cmSource)
	r := f.start(nil, true)
	before := f.createCM("before", nil, nil)
	f.waitStored(30*time.Second, isEvent("added", "before", before.ResourceVersion))
	long := f.createCM(longName, nil, nil)
	f.createCM("after", nil, nil)

	// Retried, not skipped: the failures are counted again and again.
	f.eventually(30*time.Second, "unencodable publish errors retried", func() error {
		if v := metricValue(t, r.reg, "relayd_publish_errors_total", map[string]string{"source": "cms", "reason": "unencodable"}); v < 3 {
			return fmt.Errorf("relayd_publish_errors_total{cms,unencodable} = %v, want >= 3", v)
		}
		return nil
	})
	f.checkpointHolds("cms."+f.ns, long.ResourceVersion)
	for _, m := range f.stored() {
		if m.Env.K8sName == longName || m.Env.K8sName == "after" {
			t.Errorf("message %d: %s %s published past a change that could not be", m.Seq, m.Env.Type, m.Env.K8sName)
		}
	}
	if v := metricValue(t, r.reg, "relayd_events_unencodable_total", map[string]string{"source": "cms"}); v != 0 {
		t.Errorf("relayd_events_unencodable_total{cms} = %v, want 0", v)
	}
}

// Events of every size around the NATS max payload are stored: the encoder
// leaves room for the header the sink adds to each publish
// (Nats-Expected-Stream), so no event that fits as encoded is refused by
// the client. Those that do not fit go as references. (An event within
// that header's bytes of the limit used to be refused at every retry, and
// its source stalled.)
func TestEventsAroundTheMaxPayloadAreStored(t *testing.T) {
	const maxPayload = 2048
	n := testenv.NATST(t, testenv.NATSOptions{MaxPayload: maxPayload})
	f := newFixture(t, env, n, cmSource)
	r := f.start(nil, true)
	// The payload grows by 8 bytes from one object to the next, from well
	// under the limit to over it: some land within the header's bytes of it.
	var want []func(msg) bool
	for i := range 100 {
		name := fmt.Sprintf("s-%03d", i)
		f.createCM(name, nil, map[string]string{"v": strings.Repeat("x", 800+8*i)})
		want = append(want, isEvent("added", name, ""))
	}
	got := f.waitStored(60*time.Second, want...)
	full, refs := 0, 0
	for _, m := range got {
		if !strings.HasPrefix(m.Env.K8sName, "s-") {
			continue
		}
		switch m.Env.RelaydPayload {
		case "full":
			full++
		case "reference":
			refs++
		}
	}
	if full == 0 || refs == 0 {
		t.Errorf("%d full events and %d references: the sizes did not straddle the max payload", full, refs)
	}
	for _, reason := range []string{"error", "unencodable"} {
		if v := metricValue(t, r.reg, "relayd_publish_errors_total", map[string]string{"source": "cms", "reason": reason}); v != 0 {
			t.Errorf("relayd_publish_errors_total{cms,%s} = %v, want 0", reason, v)
		}
	}
}
