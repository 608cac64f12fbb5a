package source

// The metadata-only fetch (Options.MetadataOnly) against the real
// kube-apiserver, with every byte the watcher's client reads recorded: the
// data of the objects must never arrive, neither in the initial list
// (streaming or paginated), nor in watch events, nor in the relist after a
// 410; every item must carry the resource's apiVersion and kind; bookmarks
// and 410 ERROR frames (which the apiserver sends the same way with this
// Accept header) must still work. Each case also runs with whole objects as
// the control: there the data does arrive, so the check would catch it.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/pkg/event"
)

// wire records what a client sends and reads: each request as "LIST",
// "STREAM" (a streaming list) or "WATCH" plus its Accept header, and every
// response body byte.
type wire struct {
	mu       sync.Mutex
	requests []string
	read     bytes.Buffer
}

type wireRT struct {
	base http.RoundTripper
	w    *wire
}

func (t wireRT) RoundTrip(req *http.Request) (*http.Response, error) {
	q := req.URL.Query()
	kind := "LIST"
	if q.Get("sendInitialEvents") == "true" {
		kind = "STREAM"
	} else if q.Get("watch") == "true" {
		kind = "WATCH"
	}
	t.w.mu.Lock()
	t.w.requests = append(t.w.requests, kind+" "+req.Header.Get("Accept"))
	t.w.mu.Unlock()
	resp, err := t.base.RoundTrip(req)
	if resp != nil && resp.Body != nil {
		resp.Body = wireBody{resp.Body, t.w}
	}
	return resp, err
}

type wireBody struct {
	io.ReadCloser
	w *wire
}

func (b wireBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.w.mu.Lock()
	b.w.read.Write(p[:n])
	b.w.mu.Unlock()
	return n, err
}

func (w *wire) snapshot() ([]string, []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.requests...), bytes.Clone(w.read.Bytes())
}

var configMaps = event.Resource{Version: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespaced: true}

// realWatcher is a watcher of the ConfigMaps in ns on e, with a client
// configured as relayd's (JSON) whose traffic goes to w.
func realWatcher(t *testing.T, e *testenv.Env, ns string, o Options, w *wire) (*Watcher, *Metrics) {
	t.Helper()
	cfg := rest.CopyConfig(e.AdminConfig())
	cfg.GroupVersion = &schema.GroupVersion{Version: "v1"}
	cfg.APIPath = "/api"
	cfg.ContentType = "application/json"
	cfg.AcceptContentTypes = "application/json"
	cfg.NegotiatedSerializer = scheme.Codecs.WithoutConversion()
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return wireRT{rt, w} }
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hc.CloseIdleConnections)
	client, err := rest.RESTClientForConfigAndClient(cfg, hc)
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	o.Client, o.Resource, o.Source, o.Namespace, o.Metrics = client, configMaps, "s", ns, m
	o.Logger = zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	if o.Backoff.Duration == 0 {
		o.Backoff = wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Steps: 1 << 30, Cap: time.Second}
	}
	wt, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return wt, m
}

// seenItem is a copy of an Item and of the payloads built from it.
type seenItem struct {
	kind     ItemKind
	typ      event.Type
	origin   event.Origin
	meta     event.Meta
	rv       string
	sync     event.SyncEvent
	raw      []byte
	payloads map[event.PayloadMode][]byte
}

type seen struct {
	mu    sync.Mutex
	items []seenItem
}

func (s *seen) handle(_ context.Context, it *Item) error {
	c := seenItem{kind: it.Kind, typ: it.Type, origin: it.Origin, meta: it.Object.Meta, rv: it.ResourceVersion, sync: it.Sync}
	if it.Kind == ItemObject {
		c.raw = bytes.Clone(it.Object.Raw)
		c.payloads = map[event.PayloadMode][]byte{}
		for _, m := range []event.PayloadMode{event.PayloadMetadata, event.PayloadReference, event.PayloadFull} {
			c.payloads[m] = it.Object.AppendPayload(nil, m, false)
		}
	}
	s.mu.Lock()
	s.items = append(s.items, c)
	s.mu.Unlock()
	return nil
}

func (s *seen) all() []seenItem {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]seenItem(nil), s.items...)
}

// waitFor waits until every condition holds for some item.
func (s *seen) waitFor(t *testing.T, timeout time.Duration, conds ...func(seenItem) bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		items := s.all()
		missing := -1
		for i, c := range conds {
			found := false
			for _, it := range items {
				if c(it) {
					found = true
					break
				}
			}
			if !found {
				missing = i
				break
			}
		}
		if missing < 0 {
			return
		}
		if time.Now().After(deadline) {
			var b strings.Builder
			for _, it := range items {
				fmt.Fprintf(&b, "  kind %d %s %s %s rv=%s %s\n", it.kind, it.typ, it.origin, it.meta.Name, it.rv, it.sync.Reason)
			}
			t.Fatalf("condition %d not met within %v; items:\n%s", missing, timeout, b.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func isObject(typ event.Type, origin event.Origin, name string) func(seenItem) bool {
	return func(it seenItem) bool {
		return it.kind == ItemObject && it.typ == typ && it.origin == origin && it.meta.Name == name
	}
}

func isKind(k ItemKind) func(seenItem) bool { return func(it seenItem) bool { return it.kind == k } }

// bigData is a ConfigMap's data: two 32 KiB values made of marker.
func bigData(marker string) map[string]string {
	v := strings.Repeat(marker, (32<<10)/len(marker))
	return map[string]string{"a": v, "b": v}
}

func newMarker() string { return "value-" + strconv.FormatUint(rand.Uint64(), 36) + "-" }

func createCM(t *testing.T, cs kubernetes.Interface, ns, name, marker string) *corev1.ConfigMap {
	t.Helper()
	cm, err := cs.CoreV1().ConfigMaps(ns).Create(t.Context(), &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "x"}},
		Data:       bigData(marker)}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return cm
}

// checkItems checks the objects the handler got and what the client read:
// metadataOnly, no marker anywhere and the resource's type on every item;
// otherwise (the control) the marker in every listed object.
func checkItems(t *testing.T, items []seenItem, w *wire, marker string, metadataOnly bool) {
	t.Helper()
	reqs, read := w.snapshot()
	t.Logf("%d bytes read from the apiserver in %d requests", len(read), len(reqs))
	mk := []byte(marker)
	if metadataOnly {
		if i := bytes.Index(read, mk); i >= 0 {
			t.Errorf("object data read from the apiserver: ...%s...", read[max(i-300, 0):min(i+50, len(read))])
		}
		for _, r := range reqs {
			kind, accept, _ := strings.Cut(r, " ")
			want := AcceptPartialObjectMetadata
			if kind == "LIST" {
				want = AcceptPartialObjectMetadataList
			}
			if accept != want {
				t.Errorf("%s request with Accept %q, want %q", kind, accept, want)
			}
		}
	} else if !bytes.Contains(read, mk) {
		t.Errorf("control: whole objects read without their data")
	}
	objects := 0
	for _, it := range items {
		if it.kind != ItemObject {
			continue
		}
		objects++
		if it.meta.APIVersion != "v1" || it.meta.Kind != "ConfigMap" {
			t.Errorf("%s %s: Meta type %q %q, want v1 ConfigMap", it.typ, it.meta.Name, it.meta.APIVersion, it.meta.Kind)
		}
		if it.meta.Namespace == "" || it.meta.UID == "" || it.meta.ResourceVersion == "" {
			t.Errorf("%s %s: Meta %+v incomplete", it.typ, it.meta.Name, it.meta)
		}
		if metadataOnly && bytes.Contains(it.raw, mk) {
			t.Errorf("%s %s: the object handed to the handler has data", it.typ, it.meta.Name)
		}
		if !metadataOnly && it.origin != event.OriginWatch && it.typ != event.Deleted && !bytes.Contains(it.raw, mk) {
			t.Errorf("control: listed %s without its data", it.meta.Name)
		}
		modes := []event.PayloadMode{event.PayloadMetadata, event.PayloadReference}
		if metadataOnly {
			// Never published, but it must not name the wrong type either.
			modes = append(modes, event.PayloadFull)
		}
		for _, mode := range modes {
			p := it.payloads[mode]
			var d struct {
				APIVersion string `json:"apiVersion"`
				Kind       string `json:"kind"`
				Metadata   struct {
					Labels map[string]string `json:"labels"`
				} `json:"metadata"`
			}
			if err := json.Unmarshal(p, &d); err != nil {
				t.Fatalf("%s payload of %s: %v: %s", mode, it.meta.Name, err, p)
			}
			if d.APIVersion != "v1" || d.Kind != "ConfigMap" || bytes.Contains(p, []byte("PartialObjectMetadata")) {
				t.Errorf("%s payload of %s names type %q %q: %.300s", mode, it.meta.Name, d.APIVersion, d.Kind, p)
			}
			if mode != event.PayloadReference && d.Metadata.Labels["app"] != "x" {
				t.Errorf("%s payload of %s lost the labels: %.300s", mode, it.meta.Name, p)
			}
			if metadataOnly && bytes.Contains(p, mk) {
				t.Errorf("%s payload of %s has data", mode, it.meta.Name)
			}
		}
	}
	if objects == 0 {
		t.Error("no objects")
	}
}

// The initial list (streaming, and paginated as after a refused streaming
// list), watch events (added, modified with new data, deleted) and periodic
// bookmarks, with and without MetadataOnly.
func TestMetadataOnlyListAndWatch(t *testing.T) {
	e := apiserver(t)
	cs := e.Clientset(t, false)
	for _, tc := range []struct {
		name                    string
		metadataOnly, paginated bool
	}{
		{"metadata/streaming list", true, false},
		{"metadata/paginated list", true, true},
		{"whole objects/streaming list", false, false},
		{"whole objects/paginated list", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := e.Namespace(t)
			marker := newMarker()
			for i := range 3 {
				createCM(t, cs, ns, fmt.Sprint("cm-", i), marker)
			}
			w := &wire{}
			// A 5 s watch gets a bookmark about 2 s before it ends.
			wt, m := realWatcher(t, e, ns, Options{Timeout: 5 * time.Second, PageSize: 2, MetadataOnly: tc.metadataOnly}, w)
			wt.noStream = tc.paginated
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			var s seen
			done := make(chan error, 1)
			go func() { done <- wt.Run(ctx, Start{Snapshot: true}, s.handle) }()

			s.waitFor(t, 30*time.Second, isKind(ItemSyncCompleted))
			cm0, err := cs.CoreV1().ConfigMaps(ns).Get(t.Context(), "cm-0", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			cm0.Data = bigData(marker + "changed-")
			if _, err := cs.CoreV1().ConfigMaps(ns).Update(t.Context(), cm0, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			createCM(t, cs, ns, "cm-3", marker)
			if err := cs.CoreV1().ConfigMaps(ns).Delete(t.Context(), "cm-1", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			s.waitFor(t, 30*time.Second,
				isObject(event.Modified, event.OriginWatch, "cm-0"),
				isObject(event.Added, event.OriginWatch, "cm-3"),
				isObject(event.Deleted, event.OriginWatch, "cm-1"),
				isKind(ItemBookmark))
			cancel()
			if err := <-done; err != context.Canceled {
				t.Errorf("Run returned %v", err)
			}

			items := s.all()
			var listed []string
			for _, it := range items {
				if it.kind == ItemObject && it.origin == event.OriginInitial {
					listed = append(listed, it.meta.Name)
				}
			}
			if strings.Join(listed, ",") != "cm-0,cm-1,cm-2" {
				t.Errorf("listed %v, want cm-0..cm-2", listed)
			}
			if v := testutil.ToFloat64(m.Bookmarks.WithLabelValues("s")); v < 1 {
				t.Errorf("relayd_bookmarks_total %v", v)
			}
			checkItems(t, items, w, marker, tc.metadataOnly)
			reqs, _ := w.snapshot()
			kinds := map[string]int{}
			for _, r := range reqs {
				k, _, _ := strings.Cut(r, " ")
				kinds[k]++
			}
			if tc.paginated && (kinds["LIST"] < 2 || kinds["STREAM"] > 0) {
				t.Errorf("requests %v, want a paginated LIST (2 pages) and no streaming list", reqs)
			}
			if !tc.paginated && (kinds["STREAM"] != 1 || kinds["LIST"] > 0) {
				t.Errorf("requests %v, want one streaming list and no LIST", reqs)
			}
		})
	}
}

// A watch from a compacted position gets a 410 ERROR frame (a Status, the
// same with the PartialObjectMetadata Accept header), and the relist (here
// a paginated LIST: this apiserver refuses the streaming list) reads no
// data either.
func TestMetadataOnlyRelistAfter410(t *testing.T) {
	e := testenv.StartT(t, testenv.Options{DisableWatchCache: true, ExtraAPIServerArgs: []string{"--feature-gates=WatchList=false"}})
	cs := e.Clientset(t, false)
	for _, metadataOnly := range []bool{true, false} {
		name := "metadata"
		if !metadataOnly {
			name = "whole objects"
		}
		t.Run(name, func(t *testing.T) {
			ns := e.Namespace(t)
			marker := newMarker()
			from := createCM(t, cs, ns, "cm-0", marker).ResourceVersion
			for i := 1; i <= 3; i++ {
				createCM(t, cs, ns, fmt.Sprint("cm-", i), marker)
			}
			if _, err := e.CompactNow(t.Context()); err != nil {
				t.Fatal(err)
			}
			w := &wire{}
			wt, m := realWatcher(t, e, ns, Options{Timeout: time.Minute, PageSize: 2, MetadataOnly: metadataOnly}, w)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			var s seen
			done := make(chan error, 1)
			go func() { done <- wt.Run(ctx, Start{ResourceVersion: from, Epoch: 1}, s.handle) }()
			s.waitFor(t, 30*time.Second, isKind(ItemSyncCompleted))
			createCM(t, cs, ns, "live", marker)
			s.waitFor(t, 30*time.Second, isObject(event.Added, event.OriginWatch, "live"))
			cancel()
			if err := <-done; err != context.Canceled {
				t.Errorf("Run returned %v", err)
			}

			items := s.all()
			var resynced []string
			for _, it := range items {
				switch {
				case it.kind == ItemObject && it.origin == event.OriginResync:
					resynced = append(resynced, it.meta.Name)
				case it.kind == ItemSyncCompleted && it.sync.Reason != event.RelistExpired:
					t.Errorf("sync.completed reason %q, want %q", it.sync.Reason, event.RelistExpired)
				}
			}
			if strings.Join(resynced, ",") != "cm-0,cm-1,cm-2,cm-3" {
				t.Errorf("relisted %v, want cm-0..cm-3", resynced)
			}
			// The refused streaming list counts as one too.
			if v := testutil.ToFloat64(m.Relists.WithLabelValues("s", string(event.RelistExpired))); v < 1 {
				t.Errorf("relists{expired} = %v, want >= 1", v)
			}
			if !wt.noStream {
				t.Error("the relist did not fall back to a paginated LIST: the apiserver flag did not take")
			}
			_, read := w.snapshot()
			if !bytes.Contains(read, []byte(`"reason":"Expired","code":410`)) {
				t.Errorf("no 410 ERROR frame read")
			}
			checkItems(t, items, w, marker, metadataOnly)
		})
	}
}

// A server that cannot convert to PartialObjectMetadata (406 Not
// Acceptable) gets requests for whole objects from then on: the source
// keeps working.
func TestMetadataOnlyFallsBackToWholeObjectsOn406(t *testing.T) {
	var mu sync.Mutex
	var accepts []string
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		accept := r.Header.Get("Accept")
		mu.Lock()
		accepts = append(accepts, accept)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch {
		case strings.Contains(accept, "as=PartialObjectMetadata"):
			w.WriteHeader(http.StatusNotAcceptable)
			fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"only the following media types are accepted: application/json","reason":"NotAcceptable","code":406}`)
		case r.URL.Query().Get("watch") != "true":
			fmt.Fprint(w, `{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"5"},"items":[]}`)
		default:
			fmt.Fprint(w, cm6+"\n")
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}
	})
	wt, _ := newWatcher(t, h, Options{MetadataOnly: true, Backoff: wait.Backoff{Duration: 10 * time.Millisecond, Factor: 1, Steps: 1 << 30}})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var s seen
	done := make(chan error, 1)
	go func() { done <- wt.Run(ctx, Start{}, s.handle) }()
	s.waitFor(t, 5*time.Second, isObject(event.Added, event.OriginWatch, "b"))
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	if len(accepts) != 3 || accepts[0] != AcceptPartialObjectMetadataList || strings.Contains(accepts[1]+accepts[2], "PartialObjectMetadata") {
		t.Errorf("Accept headers %q, want the PartialObjectMetadataList LIST refused, then a LIST and a watch of whole objects", accepts)
	}
	all := s.all()
	// The start from now hands on its first position (the LIST's
	// resourceVersion), then the watched object.
	if len(all) < 2 || all[0].kind != ItemBookmark || all[0].rv != "5" {
		t.Fatalf("items %+v, want the first position 5 first", all)
	}
	if it := all[1]; it.meta.APIVersion != "v1" || it.meta.Kind != "ConfigMap" || it.rv != "6" {
		t.Errorf("item %+v", it)
	}
}
