package checkpoint

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// relayd_checkpoint_last_write_timestamp_seconds is, per source this store
// follows, the least recent last write of its watches' positions (keys
// not yet written by this store do not count); 0 before a first write;
// gone once the source is unfollowed (it stopped running here), and not
// brought back by a write that ends after that.
func TestLastWriteFollowsTheSourcesRunningHere(t *testing.T) {
	admin := env.Clientset(t, false)
	ns := env.Namespace(t)
	clock := newClock()
	m := newMetrics(t)
	s := newStore(t, admin.CoreV1(), ns, func(o *Options) { o.Metrics = m; o.Now = clock.Now })
	mustLoad(t, s)
	podsA, podsB, cms := Key("pods", "a"), Key("pods", "b"), Key("cms", "")
	m.InitSource("cms")
	m.InitSource("pods")
	s.Follow("pods", []string{podsA, podsB})
	s.Follow("cms", []string{cms})

	const head = "# HELP relayd_checkpoint_last_write_timestamp_seconds Unix time of the least recent last write of the source's positions (one per watch) by this process; 0 until a first write.\n" +
		"# TYPE relayd_checkpoint_last_write_timestamp_seconds gauge\n"
	want := func(step string, series map[string]time.Time) {
		t.Helper()
		exp := head
		for _, src := range []string{"cms", "pods"} {
			if at, ok := series[src]; ok {
				exp += `relayd_checkpoint_last_write_timestamp_seconds{source="` + src + `"} ` + strconv.FormatFloat(unixSeconds(at), 'g', -1, 64) + "\n"
			}
		}
		if err := testutil.CollectAndCompare(m.LastWrite, strings.NewReader(exp)); err != nil {
			t.Errorf("%s: %v", step, err)
		}
	}
	flush := func(keys ...string) time.Time {
		t.Helper()
		for _, k := range keys {
			s.Advance(k, pos(strconv.FormatInt(clock.Now().UnixNano(), 10), 0), false)
		}
		if err := s.Flush(t.Context()); err != nil {
			t.Fatal(err)
		}
		return clock.Now()
	}
	var never time.Time
	want("at first", map[string]time.Time{"cms": never, "pods": never})
	t0 := flush(podsA)
	want("pods/a written", map[string]time.Time{"cms": never, "pods": t0})
	clock.Add(10 * time.Second)
	t1 := flush(podsB)
	want("pods/b written later", map[string]time.Time{"cms": never, "pods": t0})
	clock.Add(5 * time.Second)
	t2 := flush(podsA, cms)
	want("pods/a and cms written", map[string]time.Time{"cms": t2, "pods": t1})

	s.Unfollow("pods")
	want("pods stopped here", map[string]time.Time{"cms": t2})
	clock.Add(5 * time.Second)
	flush(podsA) // a flush that ends after pods stopped here
	want("a late write of pods", map[string]time.Time{"cms": t2})
	s.Follow("pods", []string{podsA, podsB})
	want("pods again", map[string]time.Time{"cms": t2, "pods": t1})
}
