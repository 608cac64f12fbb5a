package deploy

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/internal/testutil"
)

// applyManager is the field manager of the test's server-side applies, as
// `kubectl apply --server-side` would use.
const applyManager = "kubectl"

// cluster is the admin's view of the test apiserver.
type cluster struct {
	cs     kubernetes.Interface
	dyn    dynamic.Interface
	mapper meta.RESTMapper
}

func newCluster(t testing.TB, e *testenv.Env) *cluster {
	t.Helper()
	cfg := e.AdminConfig()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &cluster{cs: cs, dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))}
}

func (c *cluster) ensureNamespace(t testing.TB, ns string) {
	t.Helper()
	_, err := c.cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// apply server-side-applies o (force, like `kubectl apply --server-side
// --force-conflicts`), so a field the manifest no longer sets is removed.
func (c *cluster) apply(t testing.TB, o *unstructured.Unstructured) *unstructured.Unstructured {
	t.Helper()
	gvk := o.GroupVersionKind()
	m, err := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		t.Fatalf("%s: %v", describe(o), err)
	}
	var ri dynamic.ResourceInterface = c.dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		ri = c.dyn.Resource(m.Resource).Namespace(o.GetNamespace())
	}
	got, err := ri.Apply(t.Context(), o.GetName(), o, metav1.ApplyOptions{FieldManager: applyManager, Force: true})
	if err != nil {
		t.Fatalf("apply %s: %v", describe(o), err)
	}
	return got
}

// serviceAccountToken gets a token for the ServiceAccount through the
// TokenRequest API, as the kubelet does for a projected token volume.
func (c *cluster) serviceAccountToken(t testing.TB, ns, name string) string {
	t.Helper()
	exp := int64(3600)
	tr, err := c.cs.CoreV1().ServiceAccounts(ns).CreateToken(t.Context(), name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("TokenRequest for ServiceAccount %s/%s: %v", ns, name, err)
	}
	return tr.Status.Token
}

// tokenClient is a clientset authenticated with a bearer token.
func tokenClient(t testing.TB, e *testenv.Env, token string) kubernetes.Interface {
	t.Helper()
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: e.Host(), BearerToken: token,
		TLSClientConfig: rest.TLSClientConfig{CAFile: e.CAFile()}, QPS: -1})
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// waitAccess waits until the token's identity may (allowed) or may not
// perform p, as the apiserver's authorizer sees it now (RBAC changes reach
// the authorizer through an informer, not at once).
func waitAccess(t testing.TB, as kubernetes.Interface, p permission, allowed bool) {
	t.Helper()
	ns := p.namespace
	name := ""
	if len(p.resourceNames) > 0 {
		name = p.resourceNames[0]
	}
	var last string
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		r, err := as.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: ns, Verb: p.verb, Group: p.group, Resource: p.resource, Name: name}},
		}, metav1.CreateOptions{})
		if err != nil {
			return false, err
		}
		last = fmt.Sprintf("allowed=%v reason=%q", r.Status.Allowed, r.Status.Reason)
		return r.Status.Allowed == allowed, nil
	})
	if err != nil {
		t.Fatalf("waiting for %s to be allowed=%v: %v (last review: %s)", p, allowed, err, last)
	}
}

func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// relayd is the real binary running as a child process, its output kept.
type relayd struct {
	cmd         *exec.Cmd
	done        chan struct{}
	err         error // Wait's result, valid after done
	healthAddr  string
	metricsAddr string

	mu    sync.Mutex
	lines []string
}

// startRelayd runs bin with args and exactly the environment envv (as in a
// container: nothing inherited).
func startRelayd(t testing.TB, bin string, args, envv []string, healthAddr, metricsAddr string) *relayd {
	t.Helper()
	r := &relayd{done: make(chan struct{}), healthAddr: healthAddr, metricsAddr: metricsAddr}
	r.cmd = exec.Command(bin, args...)
	r.cmd.Env = envv
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	pr, pw := io.Pipe()
	r.cmd.Stdout, r.cmd.Stderr = pw, pw
	if err := r.cmd.Start(); err != nil {
		t.Fatalf("start relayd: %v", err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			r.mu.Lock()
			r.lines = append(r.lines, sc.Text())
			r.mu.Unlock()
		}
		_, _ = io.Copy(io.Discard, pr)
	})
	go func() {
		r.err = r.cmd.Wait()
		_ = pw.Close()
		wg.Wait()
		close(r.done)
	}()
	t.Cleanup(func() {
		select {
		case <-r.done:
		default:
			_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
			<-r.done
		}
		if t.Failed() {
			t.Logf("relayd output:\n%s", strings.Join(r.output(), "\n"))
		}
	})
	return r
}

func (r *relayd) output() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.lines...)
}

// logEntry is one JSON log line of relayd (--log-format=json, as shipped).
type logEntry struct {
	raw   string
	level string
	text  string // every string field, decoded (JSON escapes gone), joined
}

func (r *relayd) entries() []logEntry {
	var out []logEntry
	for _, l := range r.output() {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			out = append(out, logEntry{raw: l, text: l})
			continue
		}
		var parts []string
		for _, k := range []string{"msg", "error", "logger", "source", "configMap"} {
			if s, ok := m[k].(string); ok {
				parts = append(parts, k+"="+s)
			}
		}
		lvl, _ := m["level"].(string)
		out = append(out, logEntry{raw: l, level: lvl, text: strings.Join(parts, " ")})
	}
	return out
}

// stop sends SIGTERM and waits up to grace for the exit.
func (r *relayd) stop(t testing.TB, grace time.Duration) error {
	t.Helper()
	_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-r.done:
		return r.err
	case <-time.After(grace):
		_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
		<-r.done
		return fmt.Errorf("relayd did not stop within %v of SIGTERM; killed", grace)
	}
}

func (r *relayd) exited() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// metricAtLeast checks a sample of relayd's /metrics (text format; the
// labels given must all match) is at least min.
func (r *relayd) metricAtLeast(name string, labels map[string]string, min float64) error {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + r.metricsAddr + "/metrics")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(l, name+"{") {
			continue
		}
		ok := true
		for k, v := range labels {
			ok = ok && strings.Contains(l, fmt.Sprintf("%s=%q", k, v))
		}
		if !ok {
			continue
		}
		f := strings.Fields(l)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return fmt.Errorf("%s: %v", l, err)
		}
		if v >= min {
			return nil
		}
		return fmt.Errorf("%s = %v, want >= %v", l, v, min)
	}
	return fmt.Errorf("no sample %s%v", name, labels)
}

// probe GETs path on the health listener: status and body.
func (r *relayd) probe(path string) (int, string, error) {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + r.healthAddr + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b)), nil
}

// eventually waits for cond, and gives up at once if r (when not nil) exits.
func eventually(t testing.TB, r *relayd, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	var stop func() error
	if r != nil {
		stop = func() error {
			if r.exited() {
				return fmt.Errorf("relayd exited (%v)", r.err)
			}
			return nil
		}
	}
	testutil.EventuallyUnless(t, timeout, what, stop, cond)
}

// writeKubeconfig writes a kubeconfig for a ServiceAccount token.
func writeKubeconfig(t testing.TB, e *testenv.Env, dir, user, token string) string {
	t.Helper()
	p := filepath.Join(dir, "kubeconfig")
	if err := testenv.WriteKubeconfigToken(p, e.Host(), e.CAFile(), user, token); err != nil {
		t.Fatal(err)
	}
	return p
}

func mkdir(t testing.TB, p string) string {
	t.Helper()
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}
