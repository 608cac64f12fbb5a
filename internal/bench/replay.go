package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Replay is what the replay server serves for one resource.
type Replay struct {
	Group, Version, Resource, Kind string
	Namespaced                     bool
	// ListRV is the resourceVersion of LIST responses (which have no items).
	ListRV string
	// Watch is sent, once, to the first watch request that does not ask for
	// initial events; later watches get nothing (they are held open), so a
	// consumer that reconnects cannot count an event twice.
	Watch [][]byte
	// Metadata, if set, is sent instead of Watch to a watch that asks for
	// PartialObjectMetadata (Accept: …;as=PartialObjectMetadata;…): the same
	// events recorded with that header. Without it, such a watch gets Watch
	// (whole objects), as relayd read before it asked for metadata only.
	Metadata [][]byte
	// Paced, if set, is called after Watch has been sent to that first
	// watch, to write more frames with send (each call flushed to the
	// connection) until it returns; ctx ends with the watch or the server.
	Paced func(ctx context.Context, send func(frames [][]byte) error)
	// Initial is sent to every streaming list (sendInitialEvents=true),
	// followed by the k8s.io/initial-events-end bookmark at InitialRV and,
	// after the first streaming list only, by After.
	Initial   [][]byte
	InitialRV string
	After     [][]byte
	// InitialFrame, if set, makes the streaming list's frames instead of
	// Initial: frame i of InitialCount, made as it is sent, so that a
	// million objects are never all in the harness's memory.
	InitialFrame func(i int) []byte
	InitialCount int
}

func (r *Replay) apiVersion() string {
	if r.Group == "" {
		return r.Version
	}
	return r.Group + "/" + r.Version
}

// Server is a TLS + HTTP/2 server (as the apiserver) that speaks enough of
// the Kubernetes API for relayd and client-go watch consumers: discovery,
// LIST (no items: it only tells the resourceVersion), watch (frames at full
// speed), the streaming list, and get/create/update of ConfigMaps for
// relayd's checkpoint. It serves recorded frames from memory; namespaces
// and selectors in watch requests are ignored.
type Server struct {
	srv     *httptest.Server
	replays map[string]*Replay // "group/version/resource"

	// OnWatch, if set, is called before the first frame of Replay.Watch is
	// written (the consumer has started its watch).
	OnWatch func()

	mu          sync.Mutex
	watchServed map[*Replay]bool
	afterServed map[*Replay]bool
	expire      chan struct{}
	expireRes   map[*Replay]chan struct{}
	closing     chan struct{}
	cms         map[string]*corev1.ConfigMap
	cmRV        int64

	// CheckpointWrites counts ConfigMap updates (not dry runs).
	CheckpointWrites atomic.Int64
	// Watches counts watch requests; StreamingLists those with
	// sendInitialEvents=true.
	Watches, StreamingLists atomic.Int64
	// WatchSent is when the last frame of Replay.Watch was handed to the
	// connection (UnixNano; 0 before).
	WatchSent atomic.Int64
	// MetadataWatches counts watch requests that asked for
	// PartialObjectMetadata; SentBytes the bytes of frames (and their
	// newlines) written to watches.
	MetadataWatches, SentBytes atomic.Int64
}

// NewServer starts a replay server for replays.
func NewServer(replays ...*Replay) *Server {
	s := &Server{
		replays:     map[string]*Replay{},
		watchServed: map[*Replay]bool{},
		afterServed: map[*Replay]bool{},
		expire:      make(chan struct{}),
		expireRes:   map[*Replay]chan struct{}{},
		closing:     make(chan struct{}),
		cms:         map[string]*corev1.ConfigMap{},
	}
	for _, r := range replays {
		s.replays[r.Group+"/"+r.Version+"/"+r.Resource] = r
	}
	s.srv = httptest.NewUnstartedServer(http.HandlerFunc(s.serve))
	s.srv.EnableHTTP2 = true
	s.srv.Config.ErrorLog = nil
	s.srv.StartTLS()
	return s
}

// URL is the server's https:// URL.
func (s *Server) URL() string { return s.srv.URL }

// Close ends every held watch and stops the server.
func (s *Server) Close() {
	s.mu.Lock()
	select {
	case <-s.closing:
	default:
		close(s.closing)
	}
	s.mu.Unlock()
	s.srv.Close()
}

// Expire ends every held watch with a 410 Expired ERROR frame.
func (s *Server) Expire() {
	s.mu.Lock()
	close(s.expire)
	s.expire = make(chan struct{})
	s.mu.Unlock()
}

// ExpireResource ends the held watches of one resource (e.g. "pods") with
// a 410 Expired ERROR frame; the other resources' watches go on.
func (s *Server) ExpireResource(resource string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, rp := range s.replays {
		if c := s.expireRes[rp]; rp.Resource == resource && c != nil {
			close(c)
			delete(s.expireRes, rp)
		}
	}
}

// WriteKubeconfig writes a kubeconfig that trusts the server.
func (s *Server) WriteKubeconfig(path string) error {
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.srv.Certificate().Raw})
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["replay"] = &clientcmdapi.Cluster{Server: s.srv.URL, CertificateAuthorityData: ca}
	cfg.AuthInfos["bench"] = &clientcmdapi.AuthInfo{Token: "bench"}
	cfg.Contexts["replay"] = &clientcmdapi.Context{Cluster: "replay", AuthInfo: "bench"}
	cfg.CurrentContext = "replay"
	return clientcmd.WriteToFile(*cfg, path)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(b)
}

func status(w http.ResponseWriter, code int, reason, msg string) {
	writeJSON(w, code, map[string]any{
		"kind": "Status", "apiVersion": "v1", "metadata": map[string]any{},
		"status": "Failure", "message": msg, "reason": reason, "code": code,
	})
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	var group, version string
	var rest []string
	switch {
	case len(parts) == 1 && parts[0] == "api":
		writeJSON(w, 200, map[string]any{"kind": "APIVersions", "versions": []string{"v1"},
			"serverAddressByClientCIDRs": []any{map[string]any{"clientCIDR": "0.0.0.0/0", "serverAddress": r.Host}}})
		return
	case len(parts) == 1 && parts[0] == "apis":
		s.groupList(w)
		return
	case len(parts) >= 2 && parts[0] == "api" && parts[1] == "v1":
		version, rest = "v1", parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		group, version, rest = parts[1], parts[2], parts[3:]
	default:
		status(w, 404, "NotFound", "the server could not find the requested resource")
		return
	}
	if len(rest) == 0 {
		s.resourceList(w, group, version)
		return
	}
	var ns, res, name string
	switch {
	case len(rest) == 1:
		res = rest[0]
	case len(rest) >= 3 && rest[0] == "namespaces":
		ns, res = rest[1], rest[2]
		if len(rest) == 4 {
			name = rest[3]
		}
	default:
		status(w, 404, "NotFound", "the server could not find the requested resource")
		return
	}
	if group == "" && res == "configmaps" && ns != "" && (name != "" || r.Method == http.MethodPost) {
		s.configMap(w, r, ns, name) // relayd's checkpoint
		return
	}
	rp := s.replays[group+"/"+version+"/"+res]
	if rp == nil || r.Method != http.MethodGet || name != "" {
		status(w, 404, "NotFound", fmt.Sprintf("%s %q not found", res, name))
		return
	}
	if r.URL.Query().Get("watch") == "true" || r.URL.Query().Get("watch") == "1" {
		s.watch(w, r, rp)
		return
	}
	writeJSON(w, 200, map[string]any{
		"kind": rp.Kind + "List", "apiVersion": rp.apiVersion(),
		"metadata": map[string]any{"resourceVersion": rp.ListRV}, "items": []any{},
	})
}

func (s *Server) groupList(w http.ResponseWriter) {
	seen := map[string]bool{}
	var groups []any
	for _, rp := range s.replays {
		if rp.Group == "" || seen[rp.Group] {
			continue
		}
		seen[rp.Group] = true
		gv := map[string]any{"groupVersion": rp.apiVersion(), "version": rp.Version}
		groups = append(groups, map[string]any{"name": rp.Group, "versions": []any{gv}, "preferredVersion": gv})
	}
	writeJSON(w, 200, map[string]any{"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

func (s *Server) resourceList(w http.ResponseWriter, group, version string) {
	var res []any
	add := func(name, kind string, namespaced bool, verbs ...string) {
		res = append(res, map[string]any{"name": name, "singularName": strings.ToLower(kind), "namespaced": namespaced,
			"kind": kind, "verbs": verbs})
	}
	if group == "" && version == "v1" && s.replays["/v1/configmaps"] == nil {
		add("configmaps", "ConfigMap", true, "create", "get", "list", "update", "watch")
	}
	for _, rp := range s.replays {
		if rp.Group == group && rp.Version == version {
			add(rp.Resource, rp.Kind, rp.Namespaced, "create", "get", "list", "update", "watch")
		}
	}
	if res == nil {
		status(w, 404, "NotFound", "the server could not find the requested resource")
		return
	}
	gv := version
	if group != "" {
		gv = group + "/" + version
	}
	writeJSON(w, 200, map[string]any{"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": res})
}

// configMap serves get, create and update of ConfigMaps (relayd's
// checkpoint). Request bodies are JSON or protobuf (client-go's default for
// built-in kinds); responses are JSON.
func (s *Server) configMap(w http.ResponseWriter, r *http.Request, ns, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := ns + "/" + name
	switch r.Method {
	case http.MethodGet:
		cm, ok := s.cms[key]
		if !ok {
			status(w, 404, "NotFound", fmt.Sprintf("configmaps %q not found", name))
			return
		}
		writeJSON(w, 200, cm)
	case http.MethodPost, http.MethodPut:
		body, err := io.ReadAll(r.Body)
		if err != nil {
			status(w, 400, "BadRequest", err.Error())
			return
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(body, nil, nil)
		cm, ok := obj.(*corev1.ConfigMap)
		if err != nil || !ok {
			status(w, 400, "BadRequest", fmt.Sprintf("not a ConfigMap: %v", err))
			return
		}
		if r.Method == http.MethodPost {
			name = cm.Name
			key = ns + "/" + name
			if _, ok := s.cms[key]; ok {
				status(w, 409, "AlreadyExists", fmt.Sprintf("configmaps %q already exists", name))
				return
			}
		} else if _, ok := s.cms[key]; !ok {
			status(w, 404, "NotFound", fmt.Sprintf("configmaps %q not found", name))
			return
		}
		cm.Kind, cm.APIVersion = "ConfigMap", "v1"
		cm.Namespace = ns
		if r.URL.Query().Get("dryRun") != "" {
			writeJSON(w, 200, cm)
			return
		}
		s.cmRV++
		cm.ResourceVersion = strconv.FormatInt(s.cmRV, 10)
		if cm.UID == "" {
			cm.UID = types.UID(fmt.Sprintf("00000000-0000-4000-8000-%012d", s.cmRV))
			cm.CreationTimestamp = metav1.Now()
		}
		s.cms[key] = cm
		code := 200
		if r.Method == http.MethodPost {
			code = 201
		} else {
			s.CheckpointWrites.Add(1)
		}
		writeJSON(w, code, cm)
	default:
		status(w, 405, "MethodNotAllowed", r.Method)
	}
}

const expiredFrame = `{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"The resourceVersion for the provided watch is too old.","reason":"Expired","code":410}}`

func (s *Server) watch(w http.ResponseWriter, r *http.Request, rp *Replay) {
	s.Watches.Add(1)
	streamList := r.URL.Query().Get("sendInitialEvents") == "true"
	metadata := strings.Contains(r.Header.Get("Accept"), "as=PartialObjectMetadata")
	if metadata {
		s.MetadataWatches.Add(1)
	}
	s.mu.Lock()
	expire, closing := s.expire, s.closing
	expireRes := s.expireRes[rp]
	if expireRes == nil {
		expireRes = make(chan struct{})
		s.expireRes[rp] = expireRes
	}
	var frames [][]byte
	var after [][]byte
	first := false
	if streamList {
		frames = rp.Initial
		if !s.afterServed[rp] {
			s.afterServed[rp] = true
			after = rp.After
		}
	} else if !s.watchServed[rp] {
		s.watchServed[rp] = true
		frames, first = rp.Watch, true
		if metadata && rp.Metadata != nil {
			frames = rp.Metadata
		}
	}
	s.mu.Unlock()

	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	flush := func() {
		if fl != nil {
			fl.Flush()
		}
	}
	flush()
	bw := bufio.NewWriterSize(w, 128<<10)
	write := func(f []byte) error {
		// Counted before the write: a reader that has seen a frame must
		// also see it in SentBytes.
		s.SentBytes.Add(int64(len(f) + 1))
		if _, err := bw.Write(f); err != nil {
			return err
		}
		return bw.WriteByte('\n')
	}
	send := func(frames [][]byte) error {
		for _, f := range frames {
			if err := write(f); err != nil {
				return err
			}
		}
		if err := bw.Flush(); err != nil {
			return err
		}
		flush()
		return nil
	}
	if first && s.OnWatch != nil {
		s.OnWatch()
	}
	if streamList && rp.InitialFrame != nil {
		for i := range rp.InitialCount {
			if err := write(rp.InitialFrame(i)); err != nil {
				return
			}
		}
	}
	if err := send(frames); err != nil {
		return
	}
	if first {
		s.WatchSent.Store(time.Now().UnixNano())
	}
	if first && rp.Paced != nil {
		ctx, cancel := context.WithCancel(r.Context())
		go func() {
			select {
			case <-closing:
			case <-ctx.Done():
			}
			cancel()
		}()
		rp.Paced(ctx, send)
		cancel()
	}
	if streamList {
		s.StreamingLists.Add(1)
		end := fmt.Sprintf(`{"type":"BOOKMARK","object":{"kind":%q,"apiVersion":%q,"metadata":{"resourceVersion":%q,"creationTimestamp":null,"annotations":{"k8s.io/initial-events-end":"true"}}}}`,
			rp.Kind, rp.apiVersion(), rp.InitialRV)
		if err := send(append([][]byte{[]byte(end)}, after...)); err != nil {
			return
		}
	}
	select {
	case <-r.Context().Done():
	case <-closing:
	case <-expire:
		_ = send([][]byte{[]byte(expiredFrame)})
	case <-expireRes:
		_ = send([][]byte{[]byte(expiredFrame)})
	}
}
