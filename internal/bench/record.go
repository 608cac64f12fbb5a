package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/pkg/event"
	"github.com/relayd/relayd/pkg/source"
)

// recordingVersion changes whenever what Record writes changes, so that a
// cached recording of an older harness is not reused. 2: the pod watch is
// also recorded as PartialObjectMetadata (stream pods-metadata).
const recordingVersion = 2

// Stream is one recorded watch: the frames exactly as the apiserver sent
// them, one per line, and what is needed to serve them again.
type Stream struct {
	Name       string `json:"name"`
	Group      string `json:"group"`
	Version    string `json:"version"`
	Resource   string `json:"resource"`
	Kind       string `json:"kind"`
	Namespaced bool   `json:"namespaced"`
	// StartRV is the resourceVersion the recorded watch started from.
	StartRV string `json:"startRV"`
	// Events is the number of frames (ADDED, MODIFIED, DELETED only).
	Events int   `json:"events"`
	Bytes  int64 `json:"bytes"`
	// Accept is the Accept header the watch was recorded with; "" for
	// whole objects (application/json).
	Accept string `json:"accept,omitempty"`

	frames [][]byte // each without its newline; aliases data
}

// Frames returns the recorded frames (without newlines).
func (s *Stream) Frames() [][]byte { return s.frames }

// APIVersion is "v1" or "group/version".
func (s *Stream) APIVersion() string {
	if s.Group == "" {
		return s.Version
	}
	return s.Group + "/" + s.Version
}

// Recording is what Record produced: a pod stream, the same pod events as
// PartialObjectMetadata (what relayd reads for payload metadata and
// reference), a custom-resource stream and one ConfigMap (the template of
// the memory measurement's objects).
type Recording struct {
	Version   int                `json:"version"`
	K8s       string             `json:"kubernetes"`
	Streams   []*Stream          `json:"streams"`
	ConfigMap json.RawMessage    `json:"configMap"`
	Created   time.Time          `json:"created"`
	Options   RecordOptions      `json:"options"`
	byName    map[string]*Stream // filled by load
}

// Stream returns the stream called name, or nil.
func (r *Recording) Stream(name string) *Stream {
	if r == nil {
		return nil
	}
	return r.byName[name]
}

// RecordOptions sizes a recording.
type RecordOptions struct {
	// PodEvents and WidgetEvents are the number of watch events to record;
	// each object makes 5 (added, 3 × modified, deleted), so they are rounded
	// up to a multiple of 5.
	PodEvents    int `json:"podEvents"`
	WidgetEvents int `json:"widgetEvents"`
	// Workers write concurrently (default 16).
	Workers int                           `json:"-"`
	Logf    func(format string, a ...any) `json:"-"`
}

// RecordingDir is where a recording of o is cached under root.
func RecordingDir(root string, o RecordOptions) string {
	return filepath.Join(root, fmt.Sprintf("recording-v%d-pods%d-widgets%d", recordingVersion, roundUp5(o.PodEvents), roundUp5(o.WidgetEvents)))
}

func roundUp5(n int) int { return (n + 4) / 5 * 5 }

// LoadOrRecord loads the recording in dir, or records one with a fresh
// apiserver from start (called only when needed) and stores it there.
func LoadOrRecord(ctx context.Context, dir string, o RecordOptions, start func() (*testenv.Env, error)) (*Recording, error) {
	if r, err := LoadRecording(dir); err == nil {
		return r, nil
	}
	env, err := start()
	if err != nil {
		return nil, err
	}
	if err := Record(ctx, env, dir, o); err != nil {
		return nil, err
	}
	return LoadRecording(dir)
}

// LoadRecording reads a recording written by Record.
func LoadRecording(dir string) (*Recording, error) {
	b, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		return nil, err
	}
	var r Recording
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("bench: %s: %w", dir, err)
	}
	if r.Version != recordingVersion {
		return nil, fmt.Errorf("bench: %s is recording version %d, want %d", dir, r.Version, recordingVersion)
	}
	r.byName = map[string]*Stream{}
	for _, s := range r.Streams {
		data, err := os.ReadFile(filepath.Join(dir, s.Name+".jsonl"))
		if err != nil {
			return nil, err
		}
		s.frames = splitFrames(data)
		if len(s.frames) != s.Events {
			return nil, fmt.Errorf("bench: %s: %d frames in %s.jsonl, manifest says %d", dir, len(s.frames), s.Name, s.Events)
		}
		r.byName[s.Name] = s
	}
	return &r, nil
}

func splitFrames(data []byte) [][]byte {
	var out [][]byte
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			out = append(out, data)
			break
		}
		if i > 0 {
			out = append(out, data[:i:i])
		}
		data = data[i+1:]
	}
	return out
}

// Record writes the recording into dir (created; an existing manifest is
// replaced last, so an interrupted recording is never taken for a complete
// one): it creates objects on env's apiserver and records the watch events
// they cause, byte for byte.
func Record(ctx context.Context, env *testenv.Env, dir string, o RecordOptions) error {
	if o.Workers <= 0 {
		o.Workers = 16
	}
	logf := o.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	_ = os.Remove(filepath.Join(dir, "manifest.json"))
	cfg := env.AdminConfig()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	const nsCount = 8
	var namespaces []string
	for i := range nsCount {
		ns := fmt.Sprintf("bench-%d", i)
		namespaces = append(namespaces, ns)
		if err := ensureNamespace(ctx, cs, ns); err != nil {
			return err
		}
	}
	rec := &Recording{Version: recordingVersion, K8s: testenv.K8sVersion, Created: time.Now().UTC(), Options: o}

	// Pods: create, kubelet status (starting), kubelet status (running),
	// an annotation, delete. Each phase runs over all pods, so the events
	// of one pod are far apart in the stream, as in a rollout.
	pods := roundUp5(o.PodEvents) / 5
	t0 := time.Now()
	podStream := &Stream{Name: "pods", Version: "v1", Resource: "pods", Kind: "Pod", Namespaced: true}
	podMetaStream := &Stream{Name: "pods-metadata", Version: "v1", Resource: "pods", Kind: "Pod", Namespaced: true,
		Accept: source.AcceptPartialObjectMetadata}
	err = recordStream(ctx, cs.CoreV1().RESTClient(), []*Stream{podStream, podMetaStream}, dir, pods*5, func(ctx context.Context) error {
		objs := make([]*corev1.Pod, pods)
		phases := []func(ctx context.Context, i int) error{
			func(ctx context.Context, i int) error {
				p := benchPod(namespaces[i%nsCount], i)
				var err error
				objs[i], err = cs.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{FieldManager: managerRS})
				return err
			},
			func(ctx context.Context, i int) error {
				kubeletStatus(objs[i], i, false)
				var err error
				objs[i], err = cs.CoreV1().Pods(objs[i].Namespace).UpdateStatus(ctx, objs[i], metav1.UpdateOptions{FieldManager: managerKubelet})
				return err
			},
			func(ctx context.Context, i int) error {
				kubeletStatus(objs[i], i, true)
				var err error
				objs[i], err = cs.CoreV1().Pods(objs[i].Namespace).UpdateStatus(ctx, objs[i], metav1.UpdateOptions{FieldManager: managerKubelet})
				return err
			},
			func(ctx context.Context, i int) error {
				patch := []byte(`{"metadata":{"annotations":{"kubectl.kubernetes.io/default-container":"api","sidecar.example.com/status":"{\"version\":\"1.22.3\",\"initContainers\":null,\"containers\":[\"proxy\"],\"volumes\":null}"}}}`)
				_, err := cs.CoreV1().Pods(objs[i].Namespace).Patch(ctx, objs[i].Name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: managerKubectl})
				return err
			},
			func(ctx context.Context, i int) error {
				return cs.CoreV1().Pods(objs[i].Namespace).Delete(ctx, objs[i].Name, metav1.DeleteOptions{GracePeriodSeconds: ptrTo(int64(0))})
			},
		}
		for n, ph := range phases {
			if err := parallel(ctx, pods, o.Workers, ph); err != nil {
				return fmt.Errorf("pods phase %d: %w", n+1, err)
			}
			logf("bench: recording: pods phase %d/5 done (%d pods, %v)", n+1, pods, time.Since(t0).Round(time.Second))
		}
		return nil
	})
	if err != nil {
		return err
	}
	rec.Streams = append(rec.Streams, podStream, podMetaStream)

	// A custom resource: create, three spec changes by an operator, delete.
	if err := env.InstallWidgetCRD(ctx); err != nil {
		return err
	}
	widgets := roundUp5(o.WidgetEvents) / 5
	t0 = time.Now()
	wc, err := widgetClient(cfg)
	if err != nil {
		return err
	}
	wStream := &Stream{Name: "widgets", Group: testenv.WidgetGVR.Group, Version: testenv.WidgetGVR.Version,
		Resource: testenv.WidgetGVR.Resource, Kind: "Widget", Namespaced: true}
	err = recordStream(ctx, wc, []*Stream{wStream}, dir, widgets*5, func(ctx context.Context) error {
		res := dyn.Resource(testenv.WidgetGVR)
		phases := []func(ctx context.Context, i int) error{
			func(ctx context.Context, i int) error {
				w := benchWidget(namespaces[i%nsCount], i)
				_, err := res.Namespace(namespaces[i%nsCount]).Create(ctx, &unstructured.Unstructured{Object: w},
					metav1.CreateOptions{FieldManager: "kubectl-client-side-apply"})
				return err
			},
		}
		for k := 1; k <= 3; k++ {
			phases = append(phases, func(ctx context.Context, i int) error {
				patch := fmt.Appendf(nil, `{"spec":{"size":%d}}`, (i+k)%10+k*10)
				_, err := res.Namespace(namespaces[i%nsCount]).Patch(ctx, fmt.Sprintf("widget-%05d", i), types.MergePatchType, patch,
					metav1.PatchOptions{FieldManager: "widget-operator"})
				return err
			})
		}
		phases = append(phases, func(ctx context.Context, i int) error {
			return res.Namespace(namespaces[i%nsCount]).Delete(ctx, fmt.Sprintf("widget-%05d", i), metav1.DeleteOptions{})
		})
		for n, ph := range phases {
			if err := parallel(ctx, widgets, o.Workers, ph); err != nil {
				return fmt.Errorf("widgets phase %d: %w", n+1, err)
			}
		}
		logf("bench: recording: %d widgets done (%v)", widgets, time.Since(t0).Round(time.Second))
		return nil
	})
	if err != nil {
		return err
	}
	rec.Streams = append(rec.Streams, wStream)

	// The ConfigMap template, as a GET returns it.
	cm := benchConfigMap(namespaces[0])
	if _, err := cs.CoreV1().ConfigMaps(cm.Namespace).Create(ctx, cm, metav1.CreateOptions{FieldManager: "kubectl-client-side-apply"}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	raw, err := cs.CoreV1().RESTClient().Get().Namespace(cm.Namespace).Resource("configmaps").Name(cm.Name).DoRaw(ctx)
	if err != nil {
		return err
	}
	rec.ConfigMap = bytes.TrimSpace(raw)

	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "manifest.json"), b, 0o644)
}

func widgetClient(cfg *rest.Config) (rest.Interface, error) {
	c := rest.CopyConfig(cfg)
	gv := testenv.WidgetGVR.GroupVersion()
	c.GroupVersion = &gv
	return restClientFor(c, "/apis")
}

// restClientFor is a JSON REST client for c.GroupVersion under apiPath.
func restClientFor(c *rest.Config, apiPath string) (rest.Interface, error) {
	c.APIPath = apiPath
	c.ContentType = "application/json"
	c.AcceptContentTypes = "application/json"
	c.NegotiatedSerializer = scheme.Codecs.WithoutConversion()
	return rest.RESTClientFor(c)
}

func ensureNamespace(ctx context.Context, cs kubernetes.Interface, ns string) error {
	_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	// Pods need their ServiceAccount, which no controller-manager creates here.
	_, err = cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}

// parallel runs f(ctx, i) for i in [0, n) on workers goroutines and returns
// the first error.
func parallel(ctx context.Context, n, workers int, f func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := f(ctx, i); err != nil {
					cancel(fmt.Errorf("item %d: %w", i, err))
					return
				}
			}
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return ctx.Err()
}

// listRV reads the collection's current resourceVersion.
func listRV(ctx context.Context, c rest.Interface, resource string) (string, error) {
	body, err := c.Get().Resource(resource).Param("limit", "1").DoRaw(ctx)
	if err != nil {
		return "", err
	}
	var l struct {
		Metadata metav1.ListMeta `json:"metadata"`
	}
	if err := json.Unmarshal(body, &l); err != nil {
		return "", err
	}
	return l.Metadata.ResourceVersion, nil
}

// recordStream watches the resource of streams (one resource, each stream
// with its own Accept header) in all namespaces from its current
// resourceVersion, runs write, and stores the first want frames of each
// stream in dir/<name>.jsonl: the same events, in each stream's form.
func recordStream(ctx context.Context, c rest.Interface, streams []*Stream, dir string, want int, write func(context.Context) error) error {
	rv, err := listRV(ctx, c, streams[0].Resource)
	if err != nil {
		return fmt.Errorf("bench: list %s: %w", streams[0].Resource, err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, len(streams))
	for _, s := range streams {
		s.StartRV = rv
		if err := s.record(wctx, c, dir, want, done); err != nil {
			return err
		}
	}
	if err := write(ctx); err != nil {
		return fmt.Errorf("bench: recording %s: %w", streams[0].Name, err)
	}
	timeout := time.After(2 * time.Minute)
	for range streams {
		select {
		case err := <-done:
			if err != nil {
				return err
			}
		case <-timeout:
			return fmt.Errorf("bench: recording %s: %d events did not arrive within 2m", streams[0].Resource, want)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// record opens s's watch from s.StartRV and stores its first want frames
// in dir/<name>.jsonl in the background; the outcome goes to done.
func (s *Stream) record(ctx context.Context, c rest.Interface, dir string, want int, done chan<- error) error {
	open := func(from string) (io.ReadCloser, error) {
		r := c.Get().Resource(s.Resource).Param("watch", "true").Param("resourceVersion", from).
			Param("timeoutSeconds", "3600")
		if s.Accept != "" {
			r = r.SetHeader("Accept", s.Accept)
		}
		return r.Stream(ctx)
	}
	body, err := open(s.StartRV)
	if err != nil {
		return fmt.Errorf("bench: watch %s: %w", s.Name, err)
	}
	f, err := os.Create(filepath.Join(dir, s.Name+".jsonl"))
	if err != nil {
		body.Close()
		return err
	}
	go func() {
		defer f.Close()
		defer func() { body.Close() }()
		bw := bufio.NewWriterSize(f, 1<<20)
		br := bufio.NewReaderSize(body, 1<<20)
		last := s.StartRV
		for s.Events < want {
			line, err := br.ReadBytes('\n')
			if err != nil {
				// The apiserver closes a watch whose reader falls behind
				// (a loaded machine): resume from the last frame read.
				if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
					body.Close()
					if body, err = open(last); err == nil {
						br.Reset(body)
						continue
					}
				}
				done <- fmt.Errorf("bench: recording %s after %d events: %w", s.Name, s.Events, err)
				return
			}
			line = bytes.TrimSpace(line)
			if len(line) == 0 {
				continue
			}
			typ, o, err := event.ParseWatchEvent(line)
			if err != nil {
				done <- fmt.Errorf("bench: recording %s: %w: %.300s", s.Name, err, line)
				return
			}
			if _, ok := event.TypeFromWatch(typ); !ok {
				done <- fmt.Errorf("bench: recording %s: unexpected %s frame: %.300s", s.Name, typ, line)
				return
			}
			last = o.Meta.ResourceVersion
			s.Events++
			s.Bytes += int64(len(line))
			bw.Write(line)
			bw.WriteByte('\n')
		}
		done <- bw.Flush()
	}()
	return nil
}
