package scenario

import (
	"fmt"
	"strings"
	"time"

	"k8s.io/client-go/rest"

	"github.com/relayd/relayd/internal/chaos/record"
	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/pkg/event"
	"github.com/relayd/relayd/pkg/sink"
)

// Changes whose events fit the NATS max payload only without data
// (Scenario.UnencodableEvery): every UnencodableEvery-th object of each
// kind the writer writes has a name of 253 characters (the longest a
// Kubernetes name can be), and relayd runs against a NATS server of the
// run's own whose max_payload is the largest event without data such an
// object can have: its reference events do not fit, the other objects'
// do. Every change of those objects must reach the stream flagged
// relaydunencodable (history, trace.go).

// longNameLen is the longest name of an object (a DNS subdomain).
const longNameLen = 253

// writerKinds is what the writer writes in s: ConfigMaps (source cms) and
// Widgets (source widgets), with long names for every UnencodableEvery-th
// object.
func writerKinds(s Scenario) []record.Kind {
	kinds := []record.Kind{record.ConfigMaps("cms"), record.Widgets("widgets", testenv.WidgetGVR)}
	if s.UnencodableEvery <= 0 {
		return kinds
	}
	for i := range kinds {
		src, every := kinds[i].Source, s.UnencodableEvery
		kinds[i].Name = func(n int) string {
			name := fmt.Sprintf("%s-%d", src, n)
			if n%every == 0 {
				name += "-" + strings.Repeat("x", longNameLen-len(name)-1)
			}
			return name
		}
	}
	return kinds
}

// unencodableNames names ("<source>/<name>") the objects of kinds whose
// events fit the max payload only without data.
func unencodableNames(s Scenario, kinds []record.Kind, objects int) []string {
	var out []string
	for _, k := range kinds {
		if k.Name == nil {
			continue // named "<source>-<n>": never long
		}
		for n := 0; s.UnencodableEvery > 0 && n < objects; n++ {
			if name := k.Name(n); len(name) == longNameLen {
				out = append(out, k.Source+"/"+name)
			}
		}
	}
	return out
}

// unencodablePayload is the max payload for the run's cluster, namespace
// and stream: the largest event without data of a long-named object (a
// resync delete of a resourceVersion of 20 digits, or a change of one that
// names the writer as its author, docs/CONSUMING.md "Who changed it"), plus
// the header the sink adds to each publish, checked to be smaller than its
// smallest reference event (an add of a resourceVersion of one digit).
func unencodablePayload(cluster, ns, stream string, kinds []record.Kind) (int32, error) {
	long := strings.Repeat("x", longNameLen)
	author, err := writerAuthor()
	if err != nil {
		return 0, err
	}
	largest, smallestRef := 0, 0
	for _, k := range kinds {
		res := event.Resource{Group: k.GVR.Group, Version: k.GVR.Version, Resource: k.GVR.Resource, Kind: k.Kind, Namespaced: true}
		encode := func(rv string, t event.Type, limit int) (event.Message, error) {
			enc, err := event.NewEncoder(event.EncoderOptions{Cluster: cluster, Source: k.Source, MaxPayload: limit})
			if err != nil {
				return event.Message{}, err
			}
			c := event.Change{Type: t, Origin: event.OriginResync, Time: time.Now(), Resource: res, FinalStateUnknown: t == event.Deleted,
				Meta: event.Meta{Namespace: ns, Name: long, UID: strings.Repeat("0", 36), ResourceVersion: rv}}
			if t != event.Deleted {
				c.Author = author
			}
			return enc.Encode(&c)
		}
		for _, t := range []event.Type{event.Deleted, event.Modified} {
			big, err := encode(strings.Repeat("9", 20), t, 0)
			if err != nil {
				return 0, err
			}
			if big, err = encode(strings.Repeat("9", 20), t, big.Size()-1); err != nil || !big.Unencodable {
				return 0, fmt.Errorf("%s: no event without data (%v)", k.Source, err)
			}
			largest = max(largest, big.Size())
		}
		ref, err := encode("1", event.Added, 0)
		if err != nil {
			return 0, err
		}
		if smallestRef == 0 || ref.Size() < smallestRef {
			smallestRef = ref.Size()
		}
	}
	if largest >= smallestRef {
		return 0, fmt.Errorf("no max payload fits every event without data (%d bytes) and no reference event (%d bytes)", largest, smallestRef)
	}
	return int32(largest + sink.HeaderBytes(stream)), nil
}

// writerAuthor is who the writer's changes name: the field manager the
// apiserver derives from the writer's user agent (client-go's default:
// the binary's name), operation Update.
func writerAuthor() (event.Author, error) {
	manager, _, _ := strings.Cut(rest.DefaultKubernetesUserAgent(), "/")
	raw := fmt.Sprintf(`{"metadata":{"name":"x","managedFields":[{"manager":%q,"operation":"Update","time":"2026-01-01T00:00:00Z"}]}}`, manager)
	o, err := event.ParseObject([]byte(raw))
	if err != nil {
		return event.Author{}, err
	}
	return o.Author(), nil
}

// ownNATS returns e with a NATS server of the run's own, whose max payload
// fits the long-named objects' events only without data, and a func that
// shuts it down; e itself when s has no UnencodableEvery.
func ownNATS(e *Env, s Scenario, cluster, ns, stream string) (*Env, func(), error) {
	if s.UnencodableEvery <= 0 {
		return e, func() {}, nil
	}
	limit, err := unencodablePayload(cluster, ns, stream, writerKinds(s))
	if err != nil {
		return nil, nil, fmt.Errorf("scenario %s: %w", s.Name, err)
	}
	n, err := testenv.StartNATS(testenv.NATSOptions{MaxPayload: limit})
	if err != nil {
		return nil, nil, fmt.Errorf("scenario %s: %w", s.Name, err)
	}
	own := *e
	own.NATS = n
	if e.Logf != nil {
		e.Logf("own NATS server with max_payload %d", limit)
	}
	return &own, n.Shutdown, nil
}
