package relay_test

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A value an estimated-cheap filter chokes on does not stall its source
// (docs/CONFIGURATION.md, "Filters", limits): a 12-byte quantity
// (1e-100000000 took 73 s to parse) is not a quantity, and split("") on a
// 900 KB value stops at the work budget (fail open: the ConfigMap is in
// scope, the failure counted once). The ConfigMap written after both is
// relayed by each source: the barrier that shows nothing stalled. (cm-q
// excludes on error: under -race on a loaded machine even reading past
// 900 KB can meet the 40 ms wall-clock backstop, which must not change
// what this test expects.)
func TestFilterWorkBoundOnRealObjects(t *testing.T) {
	f := newFixture(t, env, natsSrv, `
  - name: cm-q
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]
    filter: "has(object.data) && has(object.data.mem) && isQuantity(object.data.mem)"
    filterOnError: exclude
  - name: cm-split
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]
    filter: "has(object.data) && (has(object.data.big) && object.data.big.split('').size() > 0 || has(object.data.mem) && object.data.mem == '1')"`)
	ctx := t.Context()
	r := f.start(nil, true)
	for _, cm := range []*corev1.ConfigMap{
		{ObjectMeta: metav1.ObjectMeta{Name: "poison"}, Data: map[string]string{"mem": "1e-100000000", "big": strings.Repeat("a", 900<<10)}},
		{ObjectMeta: metav1.ObjectMeta{Name: "after"}, Data: map[string]string{"mem": "1"}},
	} {
		if _, err := f.cs.CoreV1().ConfigMaps(f.ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	f.expectScope("cm-q", 0, "added after - watch")
	f.expectScope("cm-split", 0, "added after - watch", "added poison - watch")
	if n := metricValue(t, r.reg, "relayd_filter_errors_total", map[string]string{"source": "cm-split"}); n != 1 {
		t.Errorf("relayd_filter_errors_total{source=cm-split} = %v, want 1", n)
	}
}
