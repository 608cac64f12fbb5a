package relay_test

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/relayd/relayd/pkg/config"
	"github.com/relayd/relayd/pkg/event"
	"github.com/relayd/relayd/pkg/index"
	"github.com/relayd/relayd/pkg/relay"
)

// rotatedAt is the annotation the fingerprint test's sources ignore.
const rotatedAt = "example.com/rotated-at"

// fpEntry is the fingerprint part of an index bucket entry.
type fpEntry struct {
	raw         []byte
	Fingerprint string `json:"fingerprint"`
	KeyID       string `json:"fingerprintKeyID"`
}

// fpRig is the fingerprint test's fixture with what it keeps looking at.
type fpRig struct {
	*fixture
	shaping *event.Shaping // the sources' (both ignore rotatedAt)
}

// newKeyFile writes a random key to a file and returns its path and key.
func (r *fpRig) newKeyFile(name string) (string, *event.FingerprintKey) {
	r.t.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		r.t.Fatal(err)
	}
	secret := hex.EncodeToString(b) + "\n" // as `openssl rand -hex 32` writes it
	path := filepath.Join(r.t.TempDir(), name)
	if err := os.WriteFile(path, []byte(secret), 0o600); err != nil {
		r.t.Fatal(err)
	}
	k, err := event.NewFingerprintKey([]byte(secret))
	if err != nil {
		r.t.Fatal(err)
	}
	return path, k
}

// entry reads the bucket entry of obj under source.
func (r *fpRig) entry(source string, obj metav1.Object) fpEntry {
	r.t.Helper()
	e, err := r.indexBucket().Get(r.t.Context(), index.Key(index.Prefix(source, r.ns), string(obj.GetUID())))
	if err != nil {
		r.t.Fatalf("index entry of %s %s: %v", source, obj.GetName(), err)
	}
	v := fpEntry{raw: e.Value()}
	if err := json.Unmarshal(e.Value(), &v); err != nil {
		r.t.Fatal(err)
	}
	return v
}

// fingerprints reads the object at resource/name from the apiserver, as
// the watch does (JSON), and returns its fingerprint unkeyed and under k.
func (r *fpRig) fingerprints(resource, name string, k *event.FingerprintKey) (unkeyed, keyed string) {
	r.t.Helper()
	raw, err := r.cs.CoreV1().RESTClient().Get().Namespace(r.ns).Resource(resource).Name(name).
		SetHeader("Accept", runtime.ContentTypeJSON).DoRaw(r.t.Context())
	if err != nil {
		r.t.Fatal(err)
	}
	o, err := event.ParseObjectShaped(raw, r.shaping)
	if err != nil {
		r.t.Fatal(err)
	}
	return fmt.Sprintf("%016x", o.Fingerprint(r.shaping)), fmt.Sprintf("%016x", event.NewFingerprinter(k).Fingerprint(&o))
}

// update applies edit to obj (a Secret or ConfigMap), writes it, keeps
// what the apiserver returned in obj and returns its resourceVersion.
func (r *fpRig) update(obj runtime.Object, edit func()) string {
	r.t.Helper()
	edit()
	ctx := r.t.Context()
	switch o := obj.(type) {
	case *corev1.Secret:
		out, err := r.cs.CoreV1().Secrets(r.ns).Update(ctx, o, metav1.UpdateOptions{})
		if err != nil {
			r.t.Fatal(err)
		}
		*o = *out
		return o.ResourceVersion
	case *corev1.ConfigMap:
		out, err := r.cs.CoreV1().ConfigMaps(r.ns).Update(ctx, o, metav1.UpdateOptions{})
		if err != nil {
			r.t.Fatal(err)
		}
		*o = *out
		return o.ResourceVersion
	}
	r.t.Fatalf("cannot update %T", obj)
	return ""
}

// lastSeq is the stream's last sequence.
func (r *fpRig) lastSeq() uint64 {
	ms := r.stored()
	if len(ms) == 0 {
		return 0
	}
	return ms[len(ms)-1].Seq
}

// Fingerprints under nats.index.fingerprintKeyFile, against the real
// servers. A ConfigMap source first runs unkeyed (the bucket holds the
// plain xxhash64 of the object). Then relayd runs with a key and a Secret
// source with ignoreChanges: the ConfigMap's unkeyed fingerprint is removed
// from the bucket at start and costs one extra modified event; changes
// confined to the ignored annotation are suppressed, others (a label, the
// data, which the metadata payload does not carry) are published; the
// bucket holds the keyed fingerprint and the key's ID, never the unkeyed
// hash, and no data. Then a new key: the same, once more.
func TestFingerprintsAreKeyed(t *testing.T) {
	alongside(t)
	const ignore = `
    payload: metadata
    ignoreChanges: ['metadata.annotations["` + rotatedAt + `"]']`
	f := newFixture(t, env, natsSrv, `
  - name: cms
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]`+ignore)
	s, err := event.NewShaping(event.ShapingOptions{IgnoreChanges: []string{`metadata.annotations["` + rotatedAt + `"]`}})
	if err != nil {
		t.Fatal(err)
	}
	r := &fpRig{fixture: f, shaping: s}
	ctx := t.Context()
	const password = "hunter2" // low entropy: what an unkeyed hash would give away
	cm := f.createCM("cfg", nil, map[string]string{"password": password})
	r.update(cm, func() { cm.Annotations = map[string]string{rotatedAt: "0"} })

	// Unkeyed: the bucket holds the xxhash64, without a key ID.
	run := f.start(nil, true)
	f.waitStored(30*time.Second, isEvent("added", "cfg", cm.ResourceVersion))
	unkeyed, _ := r.fingerprints("configmaps", "cfg", nil)
	f.eventually(10*time.Second, "the ConfigMap's unkeyed fingerprint in the bucket", func() error {
		if e := r.entry("cms", cm); e.Fingerprint != unkeyed || e.KeyID != "" {
			return fmt.Errorf("entry %s, want fingerprint %s and no key ID", e.raw, unkeyed)
		}
		return nil
	})
	run.stop(t)

	// With key A and a Secret source.
	f.cfgYAML += strings.ReplaceAll(`
  - name: secrets
    apiVersion: v1
    kind: Secret
    namespaces: [$NS]
    allowSecretData: true`+ignore, "$NS", f.ns)
	pathA, keyA := r.newKeyFile("key-a")
	f.setNATS("  index:\n    fingerprintKeyFile: " + pathA)
	sec, err := f.cs.CoreV1().Secrets(f.ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "db", Annotations: map[string]string{rotatedAt: "0"}},
		StringData: map[string]string{"password": password}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	createdRV, before := sec.ResourceVersion, r.lastSeq()
	run = f.start(nil, true)
	f.waitStored(30*time.Second, isEvent("added", "db", createdRV))
	r.checkDropped("cms", cm)
	r.checkOneExtra("cms", cm, keyA, before)

	// Suppressed: the ignored annotation. Published: a label, the data.
	for i := 1; i <= 3; i++ {
		r.update(sec, func() { sec.Annotations[rotatedAt] = fmt.Sprint(i) })
	}
	labelRV := r.update(sec, func() { sec.Labels = map[string]string{"tier": "db"} })
	dataRV := r.update(sec, func() { sec.Data["password"] = []byte(password + "!") })
	f.waitStored(30*time.Second, isEvent("modified", "db", dataRV))
	f.checkpointWithin("secrets."+f.ns, dataRV, "")
	want := []string{"added db@" + createdRV + " initial", "modified db@" + labelRV + " watch", "modified db@" + dataRV + " watch"}
	sort.Strings(want) // as objectEvents
	if got := objectEvents(f.stored(), "secrets", before); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("Secret events %q, want %q", got, want)
	}
	if n := metricValue(t, run.reg, "relayd_events_suppressed_total", map[string]string{"source": "secrets"}); n != 3 {
		t.Errorf("relayd_events_suppressed_total{secrets} = %v, want 3", n)
	}
	r.checkKeyed("secrets", "secrets", sec, keyA, password)
	run.stop(t)

	// Key B: the same, once more.
	pathB, keyB := r.newKeyFile("key-b")
	f.cfgYAML = strings.Replace(f.cfgYAML, pathA, pathB, 1)
	before = r.lastSeq()
	run = f.start(nil, true)
	r.checkDropped("secrets", sec)
	r.checkOneExtra("secrets", sec, keyB, before)
	r.checkKeyed("secrets", "secrets", sec, keyB, password)
	run.stop(t)
}

// checkDropped waits until the bucket entry of obj has no fingerprint: the
// one stored was made under another key.
func (r *fpRig) checkDropped(source string, obj metav1.Object) {
	r.t.Helper()
	r.eventually(10*time.Second, "the fingerprint of another key removed from "+obj.GetName()+"'s entry", func() error {
		if e := r.entry(source, obj); e.Fingerprint != "" || e.KeyID != "" {
			return fmt.Errorf("entry %s", e.raw)
		}
		return nil
	})
}

// checkOneExtra changes obj twice in the ignored annotation only: the
// first change is published (the fingerprint it had is gone), the second
// is suppressed; the entry then holds the fingerprint under k.
func (r *fpRig) checkOneExtra(source string, obj runtime.Object, k *event.FingerprintKey, after uint64) {
	r.t.Helper()
	m := obj.(metav1.Object)
	set := func(v string) func() { return func() { m.SetAnnotations(map[string]string{rotatedAt: v}) } }
	first := r.update(obj, set("extra-1"))
	second := r.update(obj, set("extra-2"))
	r.checkpointWithin(source+"."+r.ns, second, "")
	got := objectEvents(r.stored(), source, after)
	if want := "modified " + m.GetName() + "@" + first + " watch"; len(got) != 1 || got[0] != want {
		r.t.Errorf("%s after the key changed: %q, want only %q", source, got, want)
	}
	resource := map[string]string{"cms": "configmaps", "secrets": "secrets"}[source]
	if e := r.entry(source, m); e.KeyID != k.ID() || e.Fingerprint == "" {
		r.t.Errorf("%s entry %s, want a fingerprint under key ID %s", source, e.raw, k.ID())
	} else if _, keyed := r.fingerprints(resource, m.GetName(), k); e.Fingerprint != keyed {
		// The entry keeps the published version (first), whose
		// fingerprint is the current one's: only the annotation differs.
		r.t.Errorf("%s entry fingerprint %s, want the keyed %s", source, e.Fingerprint, keyed)
	}
}

// checkKeyed checks obj's bucket entry: the fingerprint under k with k's
// ID, not the unkeyed one, and nothing of the data.
func (r *fpRig) checkKeyed(source, resource string, obj metav1.Object, k *event.FingerprintKey, data string) {
	r.t.Helper()
	unkeyed, keyed := r.fingerprints(resource, obj.GetName(), k)
	e := r.entry(source, obj)
	if e.Fingerprint != keyed || e.KeyID != k.ID() {
		r.t.Errorf("entry %s, want fingerprint %s (keyed) and key ID %s", e.raw, keyed, k.ID())
	}
	if unkeyed == keyed || bytes.Contains(e.raw, []byte(unkeyed)) {
		r.t.Errorf("entry %s holds the unkeyed fingerprint %s", e.raw, unkeyed)
	}
	if bytes.Contains(e.raw, []byte(data)) {
		r.t.Errorf("entry %s holds the data", e.raw)
	}
}

// A key file that is missing or too short stops relayd at start with an
// error naming the setting and the file.
func TestBadFingerprintKeyFile(t *testing.T) {
	dir := t.TempDir()
	short := filepath.Join(dir, "short")
	if err := os.WriteFile(short, []byte("tiny\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing")
	for path, want := range map[string]string{
		missing: "nats.index.fingerprintKeyFile: open " + missing + ": no such file or directory",
		short:   "nats.index.fingerprintKeyFile: " + short + ": the key is 4 bytes (surrounding whitespace trimmed); it must be at least 16, e.g. the output of `openssl rand -hex 32`",
	} {
		cfg, err := config.Parse([]byte(`
cluster: c
nats:
  url: `+natsSrv.URL()+`
  stream: {name: S}
  index: {fingerprintKeyFile: `+path+`}
sources:
  - {name: cms, apiVersion: v1, kind: ConfigMap}
`), "test.yaml")
		if err != nil {
			t.Fatal(err)
		}
		err = relay.Run(t.Context(), relay.Options{Config: cfg, RestConfig: env.AdminConfig(), Logger: zaptest.NewLogger(t), Registry: prometheus.NewRegistry()})
		if err == nil || err.Error() != want {
			t.Errorf("Run with key file %s: %v, want %s", path, err, want)
		}
	}
}
