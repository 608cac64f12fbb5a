package testenv_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/relayd/relayd/internal/testenv"
)

// Two flavours: env has the watch cache on (bookmarks, streaming list);
// noCache has it off (deterministic 410 after CompactNow).
var env, noCache *testenv.Env

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, testenv.Options{}, &env, nil))
}

func startNoCache(t *testing.T) *testenv.Env {
	t.Helper()
	if noCache != nil {
		return noCache
	}
	e, err := testenv.Start(t.Context(), testenv.Options{DisableWatchCache: true})
	if err != nil {
		t.Fatal(err)
	}
	noCache = e
	t.Cleanup(func() { noCache.Stop(); noCache = nil })
	return e
}

func makeNamespace(t *testing.T, cs *kubernetes.Clientset, name string) {
	t.Helper()
	_, err := cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

func nextEvent(t *testing.T, w watch.Interface) watch.Event {
	t.Helper()
	select {
	case ev, ok := <-w.ResultChan():
		if !ok {
			t.Fatal("watch closed")
		}
		return ev
	case <-time.After(10 * time.Second):
		t.Fatal("no watch event within 10s")
	}
	panic("unreachable")
}

func TestConfigMapCreateAndWatch(t *testing.T) {
	ctx := t.Context()
	cs := env.Clientset(t, false)
	makeNamespace(t, cs, "watch-basic")

	v, err := cs.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if v.GitVersion != testenv.K8sVersion {
		t.Fatalf("server version %s, want %s", v.GitVersion, testenv.K8sVersion)
	}

	cm, err := cs.CoreV1().ConfigMaps("watch-basic").Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "one"}, Data: map[string]string{"k": "v1"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := cs.CoreV1().ConfigMaps("watch-basic").Watch(ctx, metav1.ListOptions{ResourceVersion: cm.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	cm.Data["k"] = "v2"
	upd, err := cs.CoreV1().ConfigMaps("watch-basic").Update(ctx, cm, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ev := nextEvent(t, w)
	got, ok := ev.Object.(*corev1.ConfigMap)
	if ev.Type != watch.Modified || !ok || got.Data["k"] != "v2" || got.ResourceVersion != upd.ResourceVersion {
		t.Fatalf("got %s %#v, want MODIFIED k=v2 rv=%s", ev.Type, ev.Object, upd.ResourceVersion)
	}
	if err := cs.CoreV1().ConfigMaps("watch-basic").Delete(ctx, "one", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if ev := nextEvent(t, w); ev.Type != watch.Deleted {
		t.Fatalf("got %s, want DELETED", ev.Type)
	}
}

func TestStreamingListEndsWithInitialEventsBookmark(t *testing.T) {
	ctx := t.Context()
	cs := env.Clientset(t, false)
	makeNamespace(t, cs, "streaming")
	for i := range 3 {
		_, err := cs.CoreV1().ConfigMaps("streaming").Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%d", i)}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	yes := true
	w, err := cs.CoreV1().ConfigMaps("streaming").Watch(ctx, metav1.ListOptions{
		SendInitialEvents:    &yes,
		ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan,
		AllowWatchBookmarks:  true,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	added := 0
	for {
		ev := nextEvent(t, w)
		if ev.Type == watch.Added {
			added++
			continue
		}
		if ev.Type != watch.Bookmark {
			t.Fatalf("unexpected %s before the initial-events-end bookmark", ev.Type)
		}
		cm := ev.Object.(*corev1.ConfigMap)
		if cm.Annotations[metav1.InitialEventsAnnotationKey] != "true" {
			t.Fatalf("bookmark without %s annotation: %v", metav1.InitialEventsAnnotationKey, cm.Annotations)
		}
		if cm.ResourceVersion == "" {
			t.Fatal("initial-events-end bookmark has no resourceVersion")
		}
		break
	}
	if added != 3 {
		t.Fatalf("got %d ADDED before the bookmark, want 3", added)
	}
}

func TestWatchFromCompactedVersionIsExpired(t *testing.T) {
	e := startNoCache(t)
	ctx := t.Context()
	cs := e.Clientset(t, false)
	makeNamespace(t, cs, "compact")
	cm, err := cs.CoreV1().ConfigMaps("compact").Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "c"}, Data: map[string]string{"n": "0"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	oldRV := cm.ResourceVersion
	for i := 1; i <= 5; i++ {
		cm.Data["n"] = fmt.Sprint(i)
		if cm, err = cs.CoreV1().ConfigMaps("compact").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.CompactNow(ctx); err != nil {
		t.Fatal(err)
	}
	w, err := cs.CoreV1().ConfigMaps("compact").Watch(ctx, metav1.ListOptions{ResourceVersion: oldRV})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	ev := nextEvent(t, w)
	if ev.Type != watch.Error {
		t.Fatalf("got %s, want ERROR", ev.Type)
	}
	if err := apierrors.FromObject(ev.Object); !apierrors.IsResourceExpired(err) {
		t.Fatalf("got %v, want 410 Expired", err)
	}

	// The apiserver comes back on the same port and data after a restart.
	if err := e.RestartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := cs.CoreV1().ConfigMaps("compact").Get(ctx, "c", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Data["n"] != "5" {
		t.Fatalf("after restart n=%q, want 5", got.Data["n"])
	}
}

func TestRestrictedIdentityNeedsRBAC(t *testing.T) {
	ctx := t.Context()
	admin := env.Clientset(t, false)
	restricted := env.Clientset(t, true)
	makeNamespace(t, admin, "rbac")

	_, err := restricted.CoreV1().ConfigMaps("rbac").List(ctx, metav1.ListOptions{})
	if !apierrors.IsForbidden(err) {
		t.Fatalf("before the RoleBinding: got %v, want Forbidden", err)
	}
	_, err = admin.RbacV1().Roles("rbac").Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "cm-reader"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"list", "watch"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = admin.RbacV1().RoleBindings("rbac").Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "cm-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "cm-reader"},
		Subjects:   []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: testenv.RestrictedUser}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// RBAC caches settle within milliseconds; poll briefly.
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err = restricted.CoreV1().ConfigMaps("rbac").List(ctx, metav1.ListOptions{})
		if err == nil {
			break
		}
		if !apierrors.IsForbidden(err) || time.Now().After(deadline) {
			t.Fatalf("after the RoleBinding: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Still refused outside the bound namespace.
	if _, err := restricted.CoreV1().ConfigMaps("default").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("in another namespace: got %v, want Forbidden", err)
	}
}

func TestJetStreamDuplicateAndRestart(t *testing.T) {
	ctx := t.Context()
	n := testenv.NATST(t, testenv.NATSOptions{})
	nc, err := nats.Connect(n.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: "T", Subjects: []string{"t.>"}, Storage: jetstream.FileStorage, Duplicates: 2 * time.Minute,
	}); err != nil {
		t.Fatal(err)
	}
	a1, err := js.Publish(ctx, "t.a", []byte("1"), jetstream.WithMsgID("uid-1/100"))
	if err != nil {
		t.Fatal(err)
	}
	a2, err := js.Publish(ctx, "t.a", []byte("1"), jetstream.WithMsgID("uid-1/100"))
	if err != nil {
		t.Fatal(err)
	}
	if a1.Duplicate || !a2.Duplicate || a1.Sequence != a2.Sequence {
		t.Fatalf("acks %+v %+v: want the second to be a duplicate of the first", a1, a2)
	}
	if _, err := js.Publish(ctx, "t.b", []byte("2"), jetstream.WithMsgID("uid-2/101")); err != nil {
		t.Fatal(err)
	}

	n.Stop()
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	// The client reconnects by itself to the same port.
	var info *jetstream.StreamInfo
	deadline := time.Now().Add(15 * time.Second)
	for {
		s, err := js.Stream(ctx, "T")
		if err == nil {
			info, err = s.Info(ctx)
		}
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stream after restart: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if info.State.Msgs != 2 {
		t.Fatalf("after restart the stream holds %d messages, want 2", info.State.Msgs)
	}
	// Dedup state survives the restart too.
	a3, err := js.Publish(ctx, "t.a", []byte("1"), jetstream.WithMsgID("uid-1/100"))
	if err != nil {
		t.Fatal(err)
	}
	if !a3.Duplicate {
		t.Fatalf("after restart: %+v, want duplicate", a3)
	}
}

func TestMissingBinariesNameTheMakeTarget(t *testing.T) {
	t.Setenv("RELAYD_TESTENV_BIN", t.TempDir())
	_, err := testenv.Start(t.Context(), testenv.Options{})
	if err == nil {
		t.Fatal("Start succeeded without binaries")
	}
	if want := "make testenv-bins"; !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not name %q", err, want)
	}
}

func TestCompactNowHonoursContext(t *testing.T) {
	// A cancelled context surfaces as an error, not a panic or a hang.
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := env.CompactNow(ctx)
	if err == nil || !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
}
