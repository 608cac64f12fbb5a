package relay_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/pkg/event"
)

// apiTraffic records relayd's requests to the apiserver and every response
// body byte it read.
type apiTraffic struct {
	mu        sync.Mutex
	responses []*apiResponse
}

type apiResponse struct {
	path, accept string
	indexCheck   bool         // relay.Options.IndexCheck's consistent LIST
	body         bytes.Buffer // guarded by apiTraffic.mu
}

func (a *apiTraffic) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		r := &apiResponse{path: req.URL.Path, accept: req.Header.Get("Accept"),
			indexCheck: req.URL.Query().Get("resourceVersionMatch") == string(metav1.ResourceVersionMatchExact)}
		a.mu.Lock()
		a.responses = append(a.responses, r)
		a.mu.Unlock()
		resp, err := rt.RoundTrip(req)
		if resp != nil && resp.Body != nil {
			resp.Body = &recordedBody{resp.Body, a, r}
		}
		return resp, err
	})
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

type recordedBody struct {
	io.ReadCloser
	a *apiTraffic
	r *apiResponse
}

func (b *recordedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.a.mu.Lock()
	b.r.body.Write(p[:n])
	b.a.mu.Unlock()
	return n, err
}

// rawStored returns every message of the fixture's stream as stored.
func (f *fixture) rawStored() []*jetstream.RawStreamMsg {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(f.t.Context(), 20*time.Second)
	defer cancel()
	s, err := f.js.Stream(ctx, f.stream)
	if err != nil {
		f.t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		f.t.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		rm, err := s.GetMsg(ctx, seq)
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				continue
			}
			f.t.Fatal(err)
		}
		out = append(out, rm)
	}
	return out
}

// Sources with payload metadata and reference read PartialObjectMetadata
// from the apiserver (pkg/source Options.MetadataOnly): their events must
// still name the real resource (payload apiVersion/kind, the k8sapiversion
// and k8skind extensions, the CloudEvents subject, the NATS subject's
// group, version and resource tokens), never meta.k8s.io/v1
// PartialObjectMetadata, and carry no byte of the objects' data. A payload
// full source over the same ConfigMaps is the control: its events do carry
// the data.
func TestPartialMetadataSourcesPublishTheRealResourceAndNoData(t *testing.T) {
	forEachVersion(t, partialMetadataSources)
}

func partialMetadataSources(t *testing.T, e *testenv.Env) {
	f := newFixture(t, e, natsSrv, `
  - name: cms-metadata
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]
    payload: metadata
  - name: cms-reference
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]
    payload: reference
  - name: cms-full
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]
  - name: widgets-metadata
    apiVersion: example.com/v1
    kind: Widget
    namespaces: [$NS]
    payload: metadata
  - name: widgets-reference
    resource: {group: example.com, version: v1, resource: widgets}
    namespaces: [$NS]
    payload: reference`)
	dyn := installWidgetCRD(t, f)
	widgets := dyn.Resource(widgetGVR).Namespace(f.ns)
	ctx := t.Context()
	marker := "value-" + strconv.FormatUint(rand.Uint64(), 36) + "-"
	big := strings.Repeat(marker, (16<<10)/len(marker))
	labels := map[string]string{"app": "x"}
	newWidget := func(name, color string) *unstructured.Unstructured {
		w := widget(f.ns, name, map[string]any{"color": color, "size": 1})
		w.SetLabels(labels)
		return w
	}

	pre := f.createCM("pre", labels, map[string]string{"a": big})
	wpre, err := widgets.Create(ctx, newWidget("wpre", marker+"pre"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	traffic := &apiTraffic{}
	rc := rest.CopyConfig(e.AdminConfig())
	rc.WrapTransport = traffic.wrap
	f.start(rc, true)

	cm := f.createCM("live", labels, map[string]string{"a": big})
	cm = f.updateCM(cm, "b", big)
	f.deleteCM("live")
	w, err := widgets.Create(ctx, newWidget("wlive", marker+"blue"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w.Object["spec"] = map[string]any{"color": marker + "green", "size": 2}
	w2, err := widgets.Update(ctx, w, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := widgets.Delete(ctx, "wlive", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	from := func(src string, p func(msg) bool) func(msg) bool {
		return func(m msg) bool { return m.Env.RelaydSource == src && p(m) }
	}
	var want []func(msg) bool
	for _, src := range []string{"cms-metadata", "cms-reference", "cms-full"} {
		want = append(want,
			from(src, func(m msg) bool {
				return isEvent("added", "pre", pre.ResourceVersion)(m) && m.Env.RelaydOrigin == "initial"
			}),
			from(src, isEvent("added", "live", "")), from(src, isEvent("modified", "live", cm.ResourceVersion)), from(src, isEvent("deleted", "live", "")))
	}
	for _, src := range []string{"widgets-metadata", "widgets-reference"} {
		want = append(want,
			from(src, func(m msg) bool {
				return isEvent("added", "wpre", wpre.GetResourceVersion())(m) && m.Env.RelaydOrigin == "initial"
			}),
			from(src, isEvent("added", "wlive", w.GetResourceVersion())), from(src, isEvent("modified", "wlive", w2.GetResourceVersion())),
			from(src, isEvent("deleted", "wlive", "")))
	}
	f.waitStored(30*time.Second, want...)

	type resource struct{ apiVersion, kind, resource, groupToken, path string }
	cms := resource{"v1", "ConfigMap", "configmaps", "core", "/api/v1/namespaces/" + f.ns + "/configmaps/"}
	wds := resource{"example.com/v1", "Widget", "widgets", event.EncodeToken("example.com"), "/apis/example.com/v1/namespaces/" + f.ns + "/widgets/"}
	objects := map[string]int{}
	fullWithData := 0
	for _, rm := range f.rawStored() {
		all := append([]byte(rm.Subject+" "), rm.Data...)
		for k, vs := range rm.Header {
			all = append(all, (" " + k + ": " + strings.Join(vs, ","))...)
		}
		e, err := event.DecodeMessage(rm.Header, rm.Data)
		if err != nil {
			t.Fatalf("message %d: %v", rm.Sequence, err)
		}
		if e.RelaydSource == "cms-full" {
			if bytes.Contains(all, []byte(marker)) {
				fullWithData++
			}
			continue
		}
		if bytes.Contains(all, []byte(marker)) {
			t.Errorf("message %d of %s carries object data:\n%.500s", rm.Sequence, e.RelaydSource, all)
		}
		if bytes.Contains(all, []byte("PartialObjectMetadata")) || bytes.Contains(all, []byte("meta.k8s.io")) {
			t.Errorf("message %d of %s names the apiserver's PartialObjectMetadata type:\n%.500s", rm.Sequence, e.RelaydSource, all)
		}
		if !strings.Contains(e.Type, ".object.") {
			continue
		}
		objects[e.RelaydSource]++
		r, payload := cms, strings.TrimPrefix(e.RelaydSource, "cms-")
		if strings.HasPrefix(e.RelaydSource, "widgets-") {
			r, payload = wds, strings.TrimPrefix(e.RelaydSource, "widgets-")
		}
		if e.K8sAPIVersion != r.apiVersion || e.K8sKind != r.kind || e.K8sResource != r.resource {
			t.Errorf("%s %s: k8sapiversion %q k8skind %q k8sresource %q, want %s %s %s", e.RelaydSource, e.Type,
				e.K8sAPIVersion, e.K8sKind, e.K8sResource, r.apiVersion, r.kind, r.resource)
		}
		if e.Subject != r.path+e.K8sName {
			t.Errorf("%s %s: subject %q, want %q", e.RelaydSource, e.Type, e.Subject, r.path+e.K8sName)
		}
		tok := strings.Split(rm.Subject, ".")
		if len(tok) < 8 || tok[2] != r.groupToken || tok[3] != "v1" || tok[4] != r.resource {
			t.Errorf("%s %s: NATS subject %s, want group %s version v1 resource %s", e.RelaydSource, e.Type, rm.Subject, r.groupToken, r.resource)
		}
		if e.RelaydPayload != payload {
			t.Errorf("%s %s: relaydpayload %q, want %q", e.RelaydSource, e.Type, e.RelaydPayload, payload)
		}
		var d map[string]any
		if err := json.Unmarshal(e.Data, &d); err != nil {
			t.Fatalf("%s %s: data %v: %s", e.RelaydSource, e.Type, err, e.Data)
		}
		if d["apiVersion"] != r.apiVersion || d["kind"] != r.kind {
			t.Errorf("%s %s: data apiVersion %v kind %v, want %s %s", e.RelaydSource, e.Type, d["apiVersion"], d["kind"], r.apiVersion, r.kind)
		}
		if payload == "metadata" {
			md, _ := d["metadata"].(map[string]any)
			lb, _ := md["labels"].(map[string]any)
			if len(d) != 3 || md["uid"] != e.K8sUID || lb["app"] != "x" {
				t.Errorf("%s %s: metadata payload %s", e.RelaydSource, e.Type, e.Data)
			}
		}
	}
	for _, src := range []string{"cms-metadata", "cms-reference", "widgets-metadata", "widgets-reference"} {
		if objects[src] < 4 {
			t.Errorf("%d object events of %s, want 4", objects[src], src)
		}
	}
	if fullWithData < 3 {
		t.Errorf("control: %d events of the payload full source carry the data, want 3 (pre, live added and modified)", fullWithData)
	}

	// What relayd read: the metadata and reference sources asked for
	// PartialObjectMetadata and got no data; only the full source's
	// requests (and the Widget sources' never) read whole objects. The
	// consistency check of the tests' relays (relay.Options.IndexCheck: a
	// LIST after each relist, not made in production) reads whole objects
	// of every source.
	traffic.mu.Lock()
	defer traffic.mu.Unlock()
	metaReqs := map[string]int{}
	controlData := false
	for _, r := range traffic.responses {
		if r.indexCheck {
			continue
		}
		res := r.path[strings.LastIndex(r.path, "/")+1:]
		metadataOnly := strings.Contains(r.accept, "as=PartialObjectMetadata")
		if metadataOnly {
			metaReqs[res]++
			if bytes.Contains(r.body.Bytes(), []byte(marker)) {
				t.Errorf("GET %s (Accept %s) read object data", r.path, r.accept)
			}
		} else if res == "widgets" {
			t.Errorf("GET %s with Accept %q: the Widget sources publish no data", r.path, r.accept)
		} else if res == "configmaps" && bytes.Contains(r.body.Bytes(), []byte(marker)) {
			controlData = true
		}
	}
	if metaReqs["configmaps"] < 2 || metaReqs["widgets"] < 2 {
		t.Errorf("PartialObjectMetadata requests %v, want at least one per metadata/reference source", metaReqs)
	}
	if !controlData {
		t.Error("control: the payload full source read no object data")
	}
}
