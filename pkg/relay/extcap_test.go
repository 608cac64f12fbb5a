package relay_test

// What writers put in managedFields, through relayd against the real
// servers: the largest managedFields the apiserver keeps on an object, with
// the longest, most percent-heavy manager and subresource names it accepts,
// makes an event that arrives capped and flagged relaydtruncated, and the
// source goes on to its next object (docs/CONSUMING.md, "Truncated
// extensions"). Before the caps the event was over 1 MiB even without
// data, and the source stalled at it.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/pkg/event"
)

// Longest names the apiserver accepts in a managedFields entry
// (k8s.io/apimachinery's ValidateManagedFields): a manager of 128 bytes of
// printable characters, a subresource of 256 bytes of anything. '%' and ','
// grow the most: a list item writes them %25 and %2C, a ce-* header then
// writes each '%' as %25 again.
const (
	maxManagerLen     = 128
	maxSubresourceLen = 256
)

func heavyManager(i int) string {
	return fmt.Sprintf("%06d", i) + strings.Repeat("%,", (maxManagerLen-6)/2)
}

var heavySubresource = strings.Repeat("%", maxSubresourceLen)

// heavyEntries are n Apply entries with the heaviest names, all of the same
// second, entry i owning data key dataKey(i).
func heavyEntries(n int) []metav1.ManagedFieldsEntry {
	at := metav1.NewTime(time.Now().Truncate(time.Second))
	out := make([]metav1.ManagedFieldsEntry, n)
	for i := range out {
		out[i] = metav1.ManagedFieldsEntry{
			Manager: heavyManager(i), Operation: metav1.ManagedFieldsOperationApply, APIVersion: "v1", Time: &at,
			Subresource: heavySubresource, FieldsType: "FieldsV1",
			FieldsV1: metav1.NewFieldsV1(`{"f:data":{"f:` + dataKey(i) + `":{}}}`),
		}
	}
	return out
}

func dataKey(i int) string { return fmt.Sprintf("k%06d", i) }

// createKeyed creates ConfigMap name with data keys dataKey(0..n-1).
func createKeyed(ctx context.Context, cs kubernetes.Interface, ns, name string, n int) (*corev1.ConfigMap, error) {
	data := make(map[string]string, n)
	for i := range n {
		data[dataKey(i)] = ""
	}
	return cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: data}, metav1.CreateOptions{})
}

// setManagedFields replaces cm's managedFields by heavyEntries(n) in an
// update that changes nothing else, and returns what the apiserver stored.
func setManagedFields(ctx context.Context, cs kubernetes.Interface, cm *corev1.ConfigMap, n int) (*corev1.ConfigMap, error) {
	c := cm.DeepCopy()
	c.ManagedFields = heavyEntries(n)
	return cs.CoreV1().ConfigMaps(c.Namespace).Update(ctx, c, metav1.UpdateOptions{})
}

// largestManagedFields finds the most heavyEntries the apiserver keeps on a
// ConfigMap (doubling, then bisecting), with the error of the smallest
// count it refused.
func largestManagedFields(t *testing.T, f *fixture) (int, error) {
	t.Helper()
	ctx := t.Context()
	const ceiling = 1 << 14
	cm, err := createKeyed(ctx, f.cs, f.ns, "probe", ceiling)
	if err != nil {
		t.Fatal(err)
	}
	defer f.deleteCM("probe")
	keeps := func(n int) (bool, error) {
		got, err := setManagedFields(ctx, f.cs, cm, n)
		if err != nil {
			return false, err
		}
		cm = got
		if len(got.ManagedFields) != n {
			return false, fmt.Errorf("stored %d managedFields entries of %d", len(got.ManagedFields), n)
		}
		return true, nil
	}
	lo, hi := 0, 1024 // lo kept, hi not (yet known)
	var refused error
	for {
		ok, err := keeps(hi)
		if !ok {
			refused = err
			break
		}
		if lo = hi; hi >= ceiling {
			t.Fatalf("the apiserver keeps %d managedFields entries, the probe's ceiling", hi)
		}
		hi *= 2
	}
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		if ok, err := keeps(mid); ok {
			lo = mid
		} else {
			hi, refused = mid, err
		}
	}
	return lo, refused
}

func TestLargestManagedFieldsAreRelayedTruncated(t *testing.T) {
	probe := newFixture(t, env, natsSrv, cmSource)
	largest, refused := largestManagedFields(t, probe)
	t.Logf("the apiserver keeps at most %d managedFields entries with a %d-byte manager and a %d-byte subresource on a ConfigMap; one more: %v",
		largest, maxManagerLen, maxSubresourceLen, refused)
	if largest <= event.MaxAuthorEntries {
		t.Fatalf("the apiserver keeps only %d entries: the test needs more than %d", largest, event.MaxAuthorEntries)
	}

	for _, mode := range []string{"structured", "binary"} {
		t.Run(mode, func(t *testing.T) {
			// The default max payload of NATS: 1 MiB.
			f := newFixture(t, env, natsSrv, cmSource+"\ncloudevents:\n  mode: "+mode)
			r := f.start(nil, true)
			ctx := t.Context()
			before := f.createCM("before", nil, nil)
			f.waitStored(30*time.Second, isEvent("added", "before", before.ResourceVersion))
			created, err := createKeyed(ctx, f.cs, f.ns, "heavy", largest)
			if err != nil {
				t.Fatal(err)
			}
			heavy, err := setManagedFields(ctx, f.cs, created, largest)
			if err != nil {
				t.Fatal(err)
			}
			after := f.createCM("after", nil, nil)

			got := f.waitStored(60*time.Second, isEvent("modified", "heavy", heavy.ResourceVersion), isEvent("added", "after", after.ResourceVersion))
			var heavySeq, afterSeq uint64
			for _, m := range got {
				e := m.Env
				switch {
				case e.K8sName == "after":
					afterSeq = m.Seq
				case e.K8sName == "heavy" && e.K8sResourceVersion == heavy.ResourceVersion:
					heavySeq = m.Seq
					checkHeavyEvent(t, m, changedEntries(created.ManagedFields, heavy.ManagedFields))
				}
			}
			if afterSeq < heavySeq {
				t.Errorf("the next object's event (seq %d) was stored before the heavy one's (seq %d)", afterSeq, heavySeq)
			}
			for _, reason := range []string{"error", "unencodable"} {
				if v := metricValue(t, r.reg, "relayd_publish_errors_total", map[string]string{"source": "cms", "reason": reason}); v != 0 {
					t.Errorf("relayd_publish_errors_total{cms,%s} = %v, want 0", reason, v)
				}
			}
		})
	}
}

// changedEntries are the entries of cur that differ from all of prev's in
// anything but their fields, in order: those a modified event names
// (docs/CONSUMING.md, "Who changed it").
func changedEntries(prev, cur []metav1.ManagedFieldsEntry) []metav1.ManagedFieldsEntry {
	header := func(e metav1.ManagedFieldsEntry) metav1.ManagedFieldsEntry { e.FieldsV1 = nil; return e }
	var out []metav1.ManagedFieldsEntry
	for _, e := range cur {
		if !slices.ContainsFunc(prev, func(p metav1.ManagedFieldsEntry) bool { return equality.Semantic.DeepEqual(header(p), header(e)) }) {
			out = append(out, e)
		}
	}
	return out
}

// checkHeavyEvent checks the modified event of an object whose changed
// managedFields entries are mf: it names the first of them, within the
// caps, carries the full object (not a reference), and says that the three
// lists are truncated.
func checkHeavyEvent(t *testing.T, m msg, mf []metav1.ManagedFieldsEntry) {
	t.Helper()
	e := m.Env
	if e.RelaydPayload != "full" || e.RelaydOversize || e.RelaydUnencodable {
		t.Errorf("message %d: payload %q oversize %v unencodable %v, want the full object", m.Seq, e.RelaydPayload, e.RelaydOversize, e.RelaydUnencodable)
	}
	if want := "k8smanager,k8soperation,k8ssubresource"; e.RelaydTruncated != want {
		t.Errorf("message %d: relaydtruncated %q, want %q", m.Seq, e.RelaydTruncated, want)
	}
	unescape := strings.NewReplacer("%2C", ",", "%25", "%")
	managers, ops, subs := strings.Split(e.K8sManager, ","), strings.Split(e.K8sOperation, ","), strings.Split(e.K8sSubresource, ",")
	if len(mf) <= event.MaxAuthorEntries {
		t.Fatalf("message %d: only %d entries changed", m.Seq, len(mf))
	}
	if len(managers) < 2 || len(managers) > event.MaxAuthorEntries || len(ops) != len(managers) || len(subs) != len(managers) {
		t.Fatalf("message %d: %d managers, %d operations, %d subresources, want 2 to %d of each", m.Seq, len(managers), len(ops), len(subs), event.MaxAuthorEntries)
	}
	for name, v := range map[string]string{"k8smanager": e.K8sManager, "k8soperation": e.K8sOperation, "k8ssubresource": e.K8sSubresource} {
		if len(v) > event.MaxExtensionBytes {
			t.Errorf("message %d: %s of %d bytes, over %d", m.Seq, name, len(v), event.MaxExtensionBytes)
		}
	}
	for i := range managers {
		w := mf[i]
		if got := [3]string{unescape.Replace(managers[i]), ops[i], unescape.Replace(subs[i])}; got != [3]string{w.Manager, string(w.Operation), w.Subresource} {
			t.Errorf("message %d: item %d is %.40q, want managedFields[%d] %.40q", m.Seq, i, got, i, [3]string{w.Manager, string(w.Operation), w.Subresource})
		}
	}
	t.Logf("message %d: k8smanager names %d of %d entries (%d bytes), relaydtruncated %q", m.Seq, len(managers), len(mf), len(e.K8sManager), e.RelaydTruncated)
}

// Under a small max payload, an event that does not fit even without data
// because of its managedFields extensions is sent without them (the
// documented form without data, relaydtruncated naming them), and the
// source goes on: only the object's identity can stall a source. (Before,
// the source stalled at such an object.)
func TestUnencodableForItsManagedFieldsIsSentWithoutThem(t *testing.T) {
	for _, mode := range []string{"structured", "binary"} {
		t.Run(mode, func(t *testing.T) {
			// Over the sync markers, index entries and the events of the
			// other objects; under the event without data of an object
			// with heavy managedFields (about 3 KiB of extensions).
			n := testenv.NATST(t, testenv.NATSOptions{MaxPayload: 2048})
			f := newFixture(t, env, n, cmSource+"\ncloudevents:\n  mode: "+mode)
			r := f.start(nil, true)
			ctx := t.Context()
			const entries = 20
			created, err := createKeyed(ctx, f.cs, f.ns, "heavy", entries)
			if err != nil {
				t.Fatal(err)
			}
			heavy, err := setManagedFields(ctx, f.cs, created, entries)
			if err != nil {
				t.Fatal(err)
			}
			after := f.createCM("after", nil, nil)

			got := f.waitStored(60*time.Second, isEvent("modified", "heavy", heavy.ResourceVersion), isEvent("added", "after", after.ResourceVersion))
			var heavySeq, afterSeq uint64
			for _, m := range got {
				e := m.Env
				switch {
				case e.K8sName == "after":
					afterSeq = m.Seq
				case e.K8sName == "heavy" && e.K8sResourceVersion == heavy.ResourceVersion:
					heavySeq = m.Seq
					if !e.RelaydUnencodable || !e.RelaydOversize || e.RelaydPayload != "none" || len(e.Data) != 0 || e.K8sUID != string(heavy.UID) ||
						e.K8sManager != "" || e.K8sOperation != "" || e.K8sSubresource != "" || e.RelaydTruncated != "k8smanager,k8soperation,k8ssubresource" {
						t.Errorf("message %d: unencodable %v oversize %v payload %q data %q uid %s manager %.40q operation %.40q subresource %.40q truncated %q, want the event without data or managedFields extensions",
							m.Seq, e.RelaydUnencodable, e.RelaydOversize, e.RelaydPayload, e.Data, e.K8sUID, e.K8sManager, e.K8sOperation, e.K8sSubresource, e.RelaydTruncated)
					}
				}
			}
			if afterSeq < heavySeq {
				t.Errorf("the next object's event (seq %d) was stored before the heavy one's (seq %d)", afterSeq, heavySeq)
			}
			if v := metricValue(t, r.reg, "relayd_publish_errors_total", map[string]string{"source": "cms", "reason": "unencodable"}); v != 0 {
				t.Errorf("relayd_publish_errors_total{cms,unencodable} = %v, want 0", v)
			}
			if v := metricValue(t, r.reg, "relayd_events_unencodable_total", map[string]string{"source": "cms"}); v < 1 {
				t.Errorf("relayd_events_unencodable_total{cms} = %v, want >= 1", v)
			}
		})
	}
}
