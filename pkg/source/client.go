package source

import (
	"fmt"
	"net/http"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/relayd/relayd/pkg/event"
)

// Clients makes the REST clients and the Watchers of resources: Config's
// apiserver access, requests made on HTTP.
type Clients struct {
	Config *rest.Config
	HTTP   *http.Client
}

// Connect prepares relayd's apiserver access from rc: a copy with relayd's
// user agent and a client-side rate limit of 50 requests/s (client-go's
// default of 5 would throttle the discovery of many watches; the
// apiserver's priority and fairness protects it), the HTTP client the
// API clients share, and the watches' client over the same transport,
// whose opening of requests is limited (LimitOpening).
func Connect(rc *rest.Config) (cfg *rest.Config, shared, watches *http.Client, err error) {
	cfg = rest.CopyConfig(rc)
	if cfg.UserAgent == "" {
		cfg.UserAgent = "relayd"
	}
	if cfg.QPS == 0 {
		cfg.QPS, cfg.Burst = 50, 100
	}
	shared, err = rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("kubernetes client: %w", err)
	}
	watches = &http.Client{Transport: LimitOpening(shared.Transport, DefaultOpening), Timeout: shared.Timeout}
	return cfg, shared, watches, nil
}

// RESTClient returns a JSON REST client for res's group/version.
func (c Clients) RESTClient(res event.Resource) (rest.Interface, error) {
	cfg := rest.CopyConfig(c.Config)
	cfg.GroupVersion = &schema.GroupVersion{Group: res.Group, Version: res.Version}
	cfg.APIPath = "/apis"
	if res.Group == "" {
		cfg.APIPath = "/api"
	}
	cfg.ContentType = "application/json"
	cfg.AcceptContentTypes = "application/json"
	cfg.NegotiatedSerializer = scheme.Codecs.WithoutConversion()
	if cfg.UserAgent == "" {
		cfg.UserAgent = "relayd"
	}
	return rest.RESTClientForConfigAndClient(cfg, c.HTTP)
}

// NewWatcher returns the Watcher of o with a REST client (o.Client) for
// o.Resource.
func (c Clients) NewWatcher(o Options) (*Watcher, error) {
	client, err := c.RESTClient(o.Resource)
	if err != nil {
		return nil, fmt.Errorf("source %q: %w", o.Source, err)
	}
	o.Client = client
	return New(o)
}
