package relay_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/pkg/event"
)

// raw returns the bytes (headers and data) of every message in the
// fixture's stream.
func (f *fixture) raw() [][]byte {
	f.t.Helper()
	ctx := f.t.Context()
	s, err := f.js.Stream(ctx, f.stream)
	if err != nil {
		f.t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		f.t.Fatal(err)
	}
	var out [][]byte
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			f.t.Fatal(err)
		}
		var b bytes.Buffer
		for k, vs := range m.Header {
			fmt.Fprintf(&b, "%s: %s\n", k, strings.Join(vs, ","))
		}
		b.Write(m.Data)
		out = append(out, b.Bytes())
	}
	return out
}

// kubectlApplied returns the last-applied annotation client-side
// `kubectl apply` would store for obj: the whole object as applied.
func kubectlApplied(t *testing.T, obj any) string {
	t.Helper()
	b, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// No object data where none was asked for: a ConfigMap and a Secret applied
// with kubectl (their data in the last-applied annotation), watched in
// every payload mode. No data value appears in any message's bytes; other
// annotations are kept; a source that keeps the annotation explicitly gets
// it.
func TestPayloadNeverLeaksData(t *testing.T) {
	f := newFixture(t, env, natsSrv, `
  - name: cm-full
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]
  - name: cm-meta
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]
    payload: metadata
  - name: cm-ref
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]
    payload: reference
  - name: secret-meta
    apiVersion: v1
    kind: Secret
    namespaces: [$NS]
    payload: metadata
  - name: secret-full
    apiVersion: v1
    kind: Secret
    namespaces: [$NS]
    payload: full
    allowSecretData: true
    drop: [data, stringData]
  - name: cm-keep
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]
    payload: metadata
    keepLastAppliedConfiguration: true`)
	const cmValue, secretValue = "cm-value-must-not-leak-1b2c", "secret-value-must-not-leak-9f8e"
	ctx := t.Context()
	cm := &corev1.ConfigMap{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Name: "applied", Namespace: f.ns, Annotations: map[string]string{"team": "payments"}},
		Data:       map[string]string{"password": cmValue}}
	cm.Annotations[event.LastAppliedAnnotation] = kubectlApplied(t, cm)
	if _, err := f.cs.CoreV1().ConfigMaps(f.ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sec := &corev1.Secret{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{Name: "applied", Namespace: f.ns, Annotations: map[string]string{"team": "payments"}},
		StringData: map[string]string{"token": secretValue}}
	sec.Annotations[event.LastAppliedAnnotation] = kubectlApplied(t, sec)
	if _, err := f.cs.CoreV1().Secrets(f.ns).Create(ctx, sec, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.start(nil, true)
	ms := f.waitStored(30*time.Second, func(m msg) bool { return m.Env.RelaydSource == "cm-full" && m.Env.K8sName == "applied" },
		func(m msg) bool { return m.Env.RelaydSource == "cm-meta" && m.Env.K8sName == "applied" },
		func(m msg) bool { return m.Env.RelaydSource == "cm-ref" && m.Env.K8sName == "applied" },
		func(m msg) bool { return m.Env.RelaydSource == "secret-meta" && m.Env.K8sName == "applied" },
		func(m msg) bool { return m.Env.RelaydSource == "secret-full" && m.Env.K8sName == "applied" },
		func(m msg) bool { return m.Env.RelaydSource == "cm-keep" && m.Env.K8sName == "applied" })

	// The Secret's data is stored base64-encoded; look for that too.
	b64, _ := json.Marshal([]byte(secretValue))
	for _, raw := range f.raw() {
		for _, v := range [][]byte{[]byte(secretValue), bytes.Trim(b64, `"`)} {
			if bytes.Contains(raw, v) {
				t.Errorf("a message carries the Secret's data:\n%s", raw)
			}
		}
		// cm-full asked for the data (once, in "data"); cm-keep for the
		// annotation that holds it.
		asked := bytes.Contains(raw, []byte(`"relaydsource":"cm-full"`)) && bytes.Count(raw, []byte(cmValue)) == 1 ||
			bytes.Contains(raw, []byte(`"relaydsource":"cm-keep"`))
		if bytes.Contains(raw, []byte(cmValue)) && !asked {
			t.Errorf("a message carries the ConfigMap's data:\n%s", raw)
		}
	}
	for _, m := range ms {
		if m.Env.K8sName != "applied" {
			continue
		}
		data := string(m.Env.Data)
		switch m.Env.RelaydSource {
		case "cm-full", "cm-meta", "secret-meta", "secret-full":
			if !strings.Contains(data, `"team":"payments"`) {
				t.Errorf("%s: other annotations were not kept: %s", m.Env.RelaydSource, data)
			}
			if strings.Contains(data, "last-applied-configuration") {
				t.Errorf("%s: the last-applied annotation was published: %s", m.Env.RelaydSource, data)
			}
		case "cm-keep":
			if !strings.Contains(data, "last-applied-configuration") {
				t.Errorf("keepLastAppliedConfiguration: the annotation is missing: %s", data)
			}
		}
		if m.Env.RelaydSource == "secret-full" && m.Env.RelaydDropped != "data,stringData" && m.Env.RelaydDropped != "data" {
			t.Errorf("secret-full: relayddropped %q, want the dropped data", m.Env.RelaydDropped)
		}
	}
}

// drop removes exactly the listed fields: every other byte of the object
// is the object's own.
func TestDropRemovesOnlyTheListedFields(t *testing.T) {
	f := newFixture(t, env, natsSrv, `
  - name: deploys
    apiVersion: apps/v1
    kind: Deployment
    namespaces: [$NS]
    drop: ['spec.template.spec.containers[*].env', 'metadata.annotations["example.com/token"]']`)
	ctx := t.Context()
	one := int32(1)
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: f.ns, Annotations: map[string]string{"example.com/token": "tok-must-not-leak", "keep": "me"}},
		Spec: appsv1.DeploymentSpec{
			Replicas: &one,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web"}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{
					{Name: "app", Image: "example/app:1", Env: []corev1.EnvVar{{Name: "DB_PASSWORD", Value: "env-one-must-not-leak"}}},
					{Name: "sidecar", Image: "example/side:1", Env: []corev1.EnvVar{{Name: "API_KEY", Value: "env-two-must-not-leak"}}},
				}},
			},
		},
	}
	if _, err := f.cs.AppsV1().Deployments(f.ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.start(nil, true)
	ms := f.waitStored(30*time.Second, func(m msg) bool { return m.Env.K8sName == "web" })
	for _, raw := range f.raw() {
		for _, v := range []string{"env-one-must-not-leak", "env-two-must-not-leak", "tok-must-not-leak"} {
			if bytes.Contains(raw, []byte(v)) {
				t.Errorf("a message carries the dropped value %q:\n%s", v, raw)
			}
		}
	}
	var got msg
	for _, m := range ms {
		if m.Env.K8sName == "web" {
			got = m
		}
	}
	if got.Env.RelaydDropped != `spec.template.spec.containers[*].env,metadata.annotations["example.com/token"]` {
		t.Errorf("relayddropped = %q", got.Env.RelaydDropped)
	}
	// The object as the apiserver has it, minus what relayd always and
	// what this source drops, equals the payload.
	body, err := f.cs.AppsV1().RESTClient().Get().Namespace(f.ns).Resource("deployments").Name("web").DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var want, payload map[string]any
	if err := json.Unmarshal(body, &want); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(got.Env.Data, &payload); err != nil {
		t.Fatal(err)
	}
	meta := want["metadata"].(map[string]any)
	delete(meta, "managedFields")
	delete(meta["annotations"].(map[string]any), "example.com/token")
	for _, c := range want["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["containers"].([]any) {
		delete(c.(map[string]any), "env")
	}
	if meta["resourceVersion"] != payload["metadata"].(map[string]any)["resourceVersion"] {
		t.Fatalf("the Deployment changed since it was published (no controllers run here?)")
	}
	if !reflect.DeepEqual(want, payload) {
		a, _ := json.MarshalIndent(want, "", " ")
		b, _ := json.MarshalIndent(payload, "", " ")
		t.Errorf("payload differs from the object minus the dropped fields:\nwant %s\n got %s", a, b)
	}
}

// ignoreChanges: [status] on Pods. Status-only updates are not published
// (but counted and checkpointed); label changes are. After a 410 gap with
// only status changes the relist publishes nothing for them; after kill -9
// the fingerprints come back from the bucket and nothing is republished.
func TestIgnoreChangesSuppressesStatusOnlyUpdates(t *testing.T) {
	noCache := testenv.StartT(t, testenv.Options{DisableWatchCache: true})
	f := newFixture(t, noCache, natsSrv, `
  - name: pods
    apiVersion: v1
    kind: Pod
    namespaces: [$NS]
    ignoreChanges: [status]`)
	ctx := t.Context()
	pods := f.cs.CoreV1().Pods(f.ns)
	// No controller-manager here: the ServiceAccount admission plugin
	// needs the namespace's default ServiceAccount to exist.
	if _, err := f.cs.CoreV1().ServiceAccounts(f.ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	no := false
	pod, err := pods.Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Labels: map[string]string{"v": "0"}},
		Spec: corev1.PodSpec{AutomountServiceAccountToken: &no, Containers: []corev1.Container{{Name: "c", Image: "example/app:1"}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	u := &runner{f: f} // in-process first, for the metric
	u.start()
	f.waitStored(30*time.Second, isEvent("added", "p", pod.ResourceVersion))
	status := func(i int) {
		t.Helper()
		pod.Status.Message = fmt.Sprintf("heartbeat %d", i)
		pod.Status.Conditions = []corev1.PodCondition{{Type: "Ready", Status: corev1.ConditionFalse, Reason: fmt.Sprintf("r%d", i)}}
		if pod, err = pods.UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	label := func(v string) {
		t.Helper()
		pod.Labels["v"] = v
		if pod, err = pods.Update(ctx, pod, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var labelRVs []string
	for i := range 20 {
		status(i)
		if i == 7 || i == 14 {
			label(fmt.Sprint(i))
			labelRVs = append(labelRVs, pod.ResourceVersion)
		}
	}
	lastStatus := pod.ResourceVersion
	f.checkpointWithin("pods."+f.ns, lastStatus, "")
	got := objectEvents(f.stored(), "pods", 0)
	if len(got) != 3 || !strings.HasPrefix(got[0], "added p@") || got[1] != "modified p@"+labelRVs[0]+" watch" || got[2] != "modified p@"+labelRVs[1]+" watch" {
		t.Fatalf("events %q, want the add and the two label changes (at %v) only", got, labelRVs)
	}
	if n := metricValue(t, u.r.reg, "relayd_events_suppressed_total", map[string]string{"source": "pods"}); n != 20 {
		t.Errorf("relayd_events_suppressed_total{pods} = %v, want 20", n)
	}

	// A 410 gap with only status changes: the relist finds the pod at a new
	// resourceVersion with the same fingerprint.
	u.stop()
	before := f.stored()[len(f.stored())-1].Seq
	for i := 20; i < 25; i++ {
		status(i)
	}
	if _, err := noCache.CompactNow(ctx); err != nil {
		t.Fatal(err)
	}
	u.start()
	ms := f.waitStored(60*time.Second, func(m msg) bool { return m.Seq > before && isSync("completed")(m) })
	c := markers(ms, "pods", "completed", before)
	if d := syncOf(t, c[0]); d.Reason != "expired" || d.Counts != (event.SyncCounts{Unchanged: 1, Total: 1}) {
		t.Errorf("relist after a status-only gap: reason %q counts %+v, want expired, 1 unchanged", d.Reason, d.Counts)
	}
	if ev := objectEvents(ms, "pods", before); len(ev) != 0 {
		t.Errorf("the relist published %q for status-only changes", ev)
	}

	// Now as a process: kill -9 while status changes go on, then a
	// restart: the fingerprint comes back from the bucket, nothing is
	// republished.
	u.stop()
	u = &runner{f: f, proc: f.binary()}
	u.start()
	status(25)
	f.checkpointWithin("pods."+f.ns, pod.ResourceVersion, "")
	u.kill()
	after := f.stored()[len(f.stored())-1].Seq
	status(26)
	u.start()
	label("final")
	f.waitStored(30*time.Second, isEvent("modified", "p", pod.ResourceVersion))
	if ev := objectEvents(f.stored(), "pods", after); len(ev) != 1 || ev[0] != "modified p@"+pod.ResourceVersion+" watch" {
		t.Errorf("after kill -9 and restart: %q, want only the label change", ev)
	}
	u.stop()
}

// TestReplayAfterACrashPublishesNoSuppressedVersion: with ignoreChanges, a
// watch that resumes from a checkpoint taken before a run of suppressed
// versions and the object's delete replays them. Published then, they
// would get Nats-Msg-Ids JetStream never saw and be stored after the
// delete: an object brought back after it was gone (found by the chaos
// suite, fp-after-ack). They are replays of versions older than the
// object's last message on the stream, and are not published again.
func TestReplayAfterACrashPublishesNoSuppressedVersion(t *testing.T) {
	f := newFixture(t, env, natsSrv, `
  - name: cms
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]
    ignoreChanges: [data]`)
	key := "cms." + f.ns
	x := f.createCM("x", map[string]string{"v": "1"}, map[string]string{"k": "0"})
	r := f.start(nil, true)
	f.waitStored(20*time.Second, isEvent("added", "x", x.ResourceVersion))
	f.checkpointWithin(key, x.ResourceVersion, "")
	cp, err := f.cs.CoreV1().ConfigMaps(f.ns).Get(t.Context(), "cp", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	before := cp.Data[key]

	// Two changes of data only (suppressed), a label change (published),
	// two more of data only, then the delete.
	x = f.updateCM(x, "k", "1")
	x = f.updateCM(x, "k", "2")
	x.Labels["v"] = "2"
	if x, err = f.cs.CoreV1().ConfigMaps(f.ns).Update(t.Context(), x, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	label := x.ResourceVersion
	x = f.updateCM(x, "k", "3")
	f.updateCM(x, "k", "4")
	f.deleteCM("x")
	ms := f.waitStored(20*time.Second, func(m msg) bool { return m.Env.K8sName == "x" && strings.HasSuffix(m.Env.Type, ".deleted") })
	want := objectEvents(ms, "cms", 0)
	if len(want) != 3 || want[2] != "modified x@"+label+" watch" {
		t.Fatalf("events before the crash %q, want the add, the label change at %s and the delete", want, label)
	}
	r.stop(t)

	// The state of a kill -9 before the checkpoint moved past the add: the
	// restarted watch resumes from there and replays every change of x.
	f.editCheckpoint(func(data map[string]string) { data[key] = before })
	last := f.stored()[len(f.stored())-1].Seq
	r = f.start(nil, true)
	y := f.createCM("y", nil, nil)
	ms = f.waitStored(20*time.Second, isEvent("added", "y", y.ResourceVersion))
	if got := objectEvents(ms, "cms", last); strings.Join(got, "\n") != "added y@"+y.ResourceVersion+" watch" {
		t.Errorf("after the replay the stream got:\n%s\nwant only y's add (x's suppressed versions must not come back after its delete)", strings.Join(got, "\n"))
	}
	r.stop(t)
}
