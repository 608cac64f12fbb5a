package source

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"

	"github.com/relayd/relayd/pkg/config"
	"github.com/relayd/relayd/pkg/event"
)

// Resolve turns a source's apiVersion+kind or group/version/resource into
// a served, watchable resource, using discovery for that group/version only.
// A kind (or resource) that is not served is reported with the nearest one
// that is: in that group/version, else in the preferred version of any
// group ("kind Deploymnet is not served in apps/v1; did you mean
// Deployment?").
func Resolve(disco discovery.DiscoveryInterface, src *config.Source) (event.Resource, error) {
	group, version := src.GroupVersion()
	gv := schema.GroupVersion{Group: group, Version: version}.String()
	list, err := disco.ServerResourcesForGroupVersion(gv)
	if err != nil {
		if apierrors.IsNotFound(err) {
			return event.Resource{}, fmt.Errorf("apiVersion %s is not served by the apiserver (is its CRD or API service installed?)%s", gv, elsewhere(disco, src, gv))
		}
		return event.Resource{}, fmt.Errorf("discovery of %s: %w", gv, err)
	}
	var matches []metav1.APIResource
	var served []string
	for _, r := range list.APIResources {
		if strings.Contains(r.Name, "/") { // subresource
			continue
		}
		if src.Resource != nil {
			if r.Name == src.Resource.Resource {
				matches = append(matches, r)
			}
			served = append(served, r.Name)
		} else {
			if r.Kind == src.Kind {
				matches = append(matches, r)
			}
			served = append(served, r.Kind)
		}
	}
	sort.Strings(served)
	served = slices.Compact(served)
	what := "kind " + src.Kind
	if src.Resource != nil {
		what = "resource " + src.Resource.Resource
	}
	switch len(matches) {
	case 0:
		hint := elsewhere(disco, src, gv)
		if s := config.Suggest(name(src), served); s != "" {
			hint = fmt.Sprintf("; did you mean %s?", s)
		}
		return event.Resource{}, fmt.Errorf("%s is not served in %s%s (served: %s)", what, gv, hint, strings.Join(served, ", "))
	case 1:
	default:
		names := make([]string, len(matches))
		for i, m := range matches {
			names[i] = m.Name
		}
		return event.Resource{}, fmt.Errorf("%s is ambiguous in %s (resources %s): name the resource with group/version/resource", what, gv, strings.Join(names, ", "))
	}
	r := matches[0]
	if !slices.Contains(r.Verbs, "list") || !slices.Contains(r.Verbs, "watch") {
		return event.Resource{}, fmt.Errorf("%s in %s cannot be watched (verbs: %s)", what, gv, strings.Join(r.Verbs, ", "))
	}
	if !r.Namespaced && len(src.Namespaces) > 0 {
		return event.Resource{}, fmt.Errorf("%s in %s is cluster-scoped, but namespaces are set", what, gv)
	}
	return event.Resource{Group: group, Version: version, Resource: r.Name, Kind: r.Kind, Namespaced: r.Namespaced}, nil
}

// name is the kind, or the resource, that src names.
func name(src *config.Source) string {
	if src.Resource != nil {
		return src.Resource.Resource
	}
	return src.Kind
}

// elsewhere says where else a kind like src's is served, e.g. "; did you
// mean Deployment in apps/v1?", or returns "". It asks discovery for the
// preferred version of every group (a partial answer will do: an
// aggregated API that is down leaves its groups out).
func elsewhere(disco discovery.DiscoveryInterface, src *config.Source, notIn string) string {
	if src.Resource != nil {
		return ""
	}
	lists, _ := disco.ServerPreferredResources()
	var kinds []string
	where := map[string][]string{}
	for _, l := range lists {
		if l == nil || l.GroupVersion == notIn {
			continue
		}
		for _, r := range l.APIResources {
			if strings.Contains(r.Name, "/") {
				continue
			}
			if _, ok := where[r.Kind]; !ok {
				kinds = append(kinds, r.Kind)
			}
			where[r.Kind] = append(where[r.Kind], l.GroupVersion)
		}
	}
	s := config.Suggest(src.Kind, kinds)
	if s == "" {
		return ""
	}
	return fmt.Sprintf("; did you mean %s in %s?", s, strings.Join(where[s], " or "))
}

// SharedResolver resolves one source for all of its watches: a source
// listing 10,000 namespaces has 10,000 watches, which start together, and
// a discovery request for each would queue them behind the apiserver
// client's rate limiter for minutes. Calls made while a request is in
// flight wait for it and share its result (success or error); no result
// outlives its request, so a watch that resolves again after an error (a
// deleted CRD) asks discovery again.
type SharedResolver struct {
	disco discovery.DiscoveryInterface
	mu    sync.Mutex
	call  *resolveCall // the request in flight, nil if none
}

type resolveCall struct {
	done chan struct{}
	res  event.Resource
	err  error
}

// NewSharedResolver returns a SharedResolver over disco, for one source.
func NewSharedResolver(disco discovery.DiscoveryInterface) *SharedResolver {
	return &SharedResolver{disco: disco}
}

// Resolve is [Resolve] for src, sharing a request in flight. Every call
// must pass the same source.
func (s *SharedResolver) Resolve(src *config.Source) (event.Resource, error) {
	s.mu.Lock()
	if c := s.call; c != nil {
		s.mu.Unlock()
		<-c.done
		return c.res, c.err
	}
	// The waiters are released even if Resolve panics (the watch recovers
	// it), with an error rather than an empty resource.
	c := &resolveCall{done: make(chan struct{}), err: errors.New("discovery did not complete")}
	s.call = c
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.call = nil
		s.mu.Unlock()
		close(c.done)
	}()
	c.res, c.err = Resolve(s.disco, src)
	return c.res, c.err
}
