package checkpoint

import (
	"context"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/relayd/relayd/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, testenv.Options{}, &env, nil))
}

const cmName = "relayd-checkpoint"

// grant gives the restricted user the verbs on the one checkpoint ConfigMap
// (resourceNames), like deploy/'s Role, and waits until RBAC lets it get.
func grant(t *testing.T, restricted *kubernetes.Clientset, ns string, verbs ...string) {
	t.Helper()
	env.Grant(t, ns, "relayd-checkpoint", []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"},
		ResourceNames: []string{cmName}, Verbs: verbs}},
		func(ctx context.Context) error {
			_, err := restricted.CoreV1().ConfigMaps(ns).Get(ctx, cmName, metav1.GetOptions{})
			return err
		})
}

// counting wraps a ConfigMapsGetter: it counts real (not dry-run) updates
// and can run a hook before each, e.g. to provoke a conflict or fail.
type counting struct {
	corev1client.ConfigMapsGetter
	updates   atomic.Int64 // update calls that reached the apiserver
	ok        atomic.Int64 // ... and succeeded
	conflicts atomic.Int64

	mu           sync.Mutex
	beforeUpdate func(n int64) error // n: 1-based number of this update call
}

func (c *counting) ConfigMaps(ns string) corev1client.ConfigMapInterface {
	return &countingCMs{ConfigMapInterface: c.ConfigMapsGetter.ConfigMaps(ns), c: c}
}

func (c *counting) setHook(f func(n int64) error) {
	c.mu.Lock()
	c.beforeUpdate = f
	c.mu.Unlock()
}

type countingCMs struct {
	corev1client.ConfigMapInterface
	c *counting
}

func (w *countingCMs) Update(ctx context.Context, cm *corev1.ConfigMap, o metav1.UpdateOptions) (*corev1.ConfigMap, error) {
	if len(o.DryRun) > 0 {
		return w.ConfigMapInterface.Update(ctx, cm, o)
	}
	n := w.c.updates.Add(1)
	w.c.mu.Lock()
	hook := w.c.beforeUpdate
	w.c.mu.Unlock()
	if hook != nil {
		if err := hook(n); err != nil {
			return nil, err
		}
	}
	out, err := w.ConfigMapInterface.Update(ctx, cm, o)
	switch {
	case err == nil:
		w.c.ok.Add(1)
	case apierrors.IsConflict(err):
		w.c.conflicts.Add(1)
	}
	return out, err
}

// fakeClock is a settable Options.Now.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *fakeClock {
	return &fakeClock{t: time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// newMetrics returns the store's metrics, registered on a fresh registry.
func newMetrics(t *testing.T) *Metrics {
	t.Helper()
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// counts is the writes m counted as stored and as failed.
func counts(m *Metrics) (ok, failed int) {
	return int(testutil.ToFloat64(m.Writes)), int(testutil.ToFloat64(m.Errors))
}

func newStore(t *testing.T, client corev1client.ConfigMapsGetter, ns string, tweak func(*Options)) *Store {
	t.Helper()
	o := Options{Client: client, Namespace: ns, Name: cmName, Logger: zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))}
	if tweak != nil {
		tweak(&o)
	}
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func mustLoad(t *testing.T, s *Store) {
	t.Helper()
	if err := s.Load(t.Context()); err != nil {
		t.Fatal(err)
	}
}

func getCM(t *testing.T, admin *kubernetes.Clientset, ns string) *corev1.ConfigMap {
	t.Helper()
	cm, err := admin.CoreV1().ConfigMaps(ns).Get(t.Context(), cmName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return cm
}

// cmWatch counts the MODIFIED events of the checkpoint ConfigMap from a
// resourceVersion on: the apiserver's own count of writes.
type cmWatch struct {
	w watch.Interface
}

func watchCM(t *testing.T, admin *kubernetes.Clientset, ns, fromRV string) *cmWatch {
	t.Helper()
	w, err := admin.CoreV1().ConfigMaps(ns).Watch(t.Context(), metav1.ListOptions{
		ResourceVersion: fromRV,
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", cmName).String(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	return &cmWatch{w: w}
}

// modifiedUntil returns how many MODIFIED events arrive up to and including
// the one with resourceVersion rv.
func (c *cmWatch) modifiedUntil(t *testing.T, rv string) int {
	t.Helper()
	n := 0
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev, ok := <-c.w.ResultChan():
			if !ok {
				t.Fatal("watch closed")
			}
			cm, isCM := ev.Object.(*corev1.ConfigMap)
			if !isCM {
				t.Fatalf("unexpected watch event %s %T", ev.Type, ev.Object)
			}
			if ev.Type == watch.Modified {
				n++
			}
			if cm.ResourceVersion == rv {
				return n
			}
		case <-timeout:
			t.Fatalf("no event with resourceVersion %s within 10s (saw %d MODIFIED)", rv, n)
		}
	}
}

func pos(rv string, epoch uint64) Position { return Position{ResourceVersion: rv, Epoch: epoch} }

// wantPos checks key's position in a freshly loaded store.
func wantPos(t *testing.T, s *Store, key, rv string, epoch uint64) Position {
	t.Helper()
	p, ok := s.Get(key)
	if !ok || p.ResourceVersion != rv || p.Epoch != epoch || p.Updated.IsZero() {
		t.Fatalf("key %q: got %+v (ok=%v), want resourceVersion %s epoch %d with a time", key, p, ok, rv, epoch)
	}
	return p
}
