package source

import (
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/pkg/config"
)

// resolve against a real apiserver's discovery: the errors a user sees for
// a bad source.
func TestResolveAgainstRealDiscovery(t *testing.T) {
	e := testenv.StartT(t, testenv.Options{})
	cs, err := kubernetes.NewForConfig(e.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	disco := cs.Discovery()
	cases := []struct {
		name string
		src  config.Source
		want string // error substring, or "" for success
		res  string
		nsd  bool
	}{
		{"core kind", config.Source{APIVersion: "v1", Kind: "ConfigMap"}, "", "configmaps", true},
		{"group kind", config.Source{APIVersion: "apps/v1", Kind: "Deployment"}, "", "deployments", true},
		{"cluster-scoped", config.Source{APIVersion: "v1", Kind: "Namespace"}, "", "namespaces", false},
		{"by resource", config.Source{Resource: &config.Resource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "roles"}}, "", "roles", true},
		{"unknown kind", config.Source{APIVersion: "v1", Kind: "Frobnicator"}, "kind Frobnicator is not served in v1 (served: ", "", false},
		{"unknown group", config.Source{APIVersion: "example.org/v9", Kind: "Thing"}, "apiVersion example.org/v9 is not served by the apiserver (is its CRD or API service installed?)", "", false},
		// Misspelled kinds: the nearest served kind, in the same
		// group/version or another group's.
		{"misspelled group kind", config.Source{APIVersion: "apps/v1", Kind: "Deploymnet"}, "kind Deploymnet is not served in apps/v1; did you mean Deployment? (served: ", "", false},
		{"misspelled core kind", config.Source{APIVersion: "v1", Kind: "ConfigMpa"}, "kind ConfigMpa is not served in v1; did you mean ConfigMap? (served: ", "", false},
		{"kind of another group", config.Source{APIVersion: "v1", Kind: "Deployment"}, "kind Deployment is not served in v1; did you mean Deployment in apps/v1? (served: ", "", false},
		{"misspelled kind in an unknown group", config.Source{APIVersion: "example.org/v1", Kind: "Deploymnet"},
			"apiVersion example.org/v1 is not served by the apiserver (is its CRD or API service installed?); did you mean Deployment in apps/v1?", "", false},
		{"misspelled resource", config.Source{Resource: &config.Resource{Group: "apps", Version: "v1", Resource: "deploymnets"}}, "resource deploymnets is not served in apps/v1; did you mean deployments? (served: ", "", false},
		{"not watchable", config.Source{APIVersion: "v1", Kind: "Binding"}, "kind Binding in v1 cannot be watched (verbs: create)", "", false},
		{"namespaces on cluster kind", config.Source{APIVersion: "v1", Kind: "Node", Namespaces: []string{"a"}}, "kind Node in v1 is cluster-scoped, but namespaces are set", "", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := Resolve(disco, &c.src)
			if c.want != "" {
				if err == nil || !strings.Contains(err.Error(), c.want) {
					t.Fatalf("got %v, want an error containing %q", err, c.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r.Resource != c.res || r.Namespaced != c.nsd {
				t.Fatalf("got %+v, want resource %s namespaced=%v", r, c.res, c.nsd)
			}
		})
	}
}

// countingDiscovery counts the group/version discovery requests made
// through it (to the real apiserver), each held for delay first, so that
// calls made meanwhile find it in flight.
type countingDiscovery struct {
	discovery.DiscoveryInterface
	n     atomic.Int64
	delay time.Duration
}

func (c *countingDiscovery) ServerResourcesForGroupVersion(gv string) (*metav1.APIResourceList, error) {
	c.n.Add(1)
	time.Sleep(c.delay)
	return c.DiscoveryInterface.ServerResourcesForGroupVersion(gv)
}

// The watches of one source that start together share one discovery
// request: 200 watches (a source listing 200 namespaces) resolving at once,
// while the request is in flight, ask the apiserver once and all get the
// same resource. No result outlives its request: a later call (a watch
// resolving again after an error: a deleted CRD) asks again, and so does
// each try of a source whose kind is missing.
func TestSharedResolverSharesTheRequestInFlight(t *testing.T) {
	cs, err := kubernetes.NewForConfig(apiserver(t).AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	disco := &countingDiscovery{DiscoveryInterface: cs.Discovery(), delay: time.Second}
	src := &config.Source{APIVersion: "apps/v1", Kind: "Deployment"}
	r := NewSharedResolver(disco)
	var wg sync.WaitGroup
	start := make(chan struct{})
	got := make([]string, 200)
	errs := make([]error, 200)
	for i := range got {
		wg.Go(func() {
			<-start
			res, err := r.Resolve(src)
			got[i], errs[i] = res.Resource, err
		})
	}
	close(start)
	wg.Wait()
	for i := range got {
		if errs[i] != nil || got[i] != "deployments" {
			t.Fatalf("watch %d: %q, %v; want deployments", i, got[i], errs[i])
		}
	}
	if n := disco.n.Load(); n != 1 {
		t.Errorf("200 watches of one source resolving at once made %d discovery requests, want 1", n)
	}

	disco.n.Store(0)
	disco.delay = 0
	if _, err := r.Resolve(src); err != nil {
		t.Fatal(err)
	}
	missing := &config.Source{APIVersion: "v1", Kind: "Frobnicator"}
	bad := NewSharedResolver(disco)
	for range 3 {
		if _, err := bad.Resolve(missing); err == nil || !strings.Contains(err.Error(), "kind Frobnicator is not served in v1") {
			t.Fatalf("got %v, want kind Frobnicator is not served", err)
		}
	}
	if n := disco.n.Load(); n != 4 {
		t.Errorf("a later call and 3 tries of a missing kind made %d discovery requests, want 4 (no result outlives its request)", n)
	}
}
