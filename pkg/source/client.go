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
