package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"k8s.io/apimachinery/pkg/util/resourceversion"

	"github.com/relayd/relayd/pkg/event"
)

// Entry is what the view holds for one object: its last applied state, or
// a tombstone once it was deleted (so that an older event replayed later
// cannot bring it back).
type Entry struct {
	Source          string          `json:"source"`
	APIVersion      string          `json:"apiVersion"`
	Kind            string          `json:"kind"`
	Resource        string          `json:"resource"`
	Namespace       string          `json:"namespace,omitempty"`
	Name            string          `json:"name"`
	UID             string          `json:"uid"`
	ResourceVersion string          `json:"resourceVersion"`
	Payload         string          `json:"payload"`
	Object          json.RawMessage `json:"object,omitempty"`
	// Deleted marks a tombstone; DeletedAt is when the view applied it.
	Deleted   bool      `json:"deleted,omitempty"`
	DeletedAt time.Time `json:"deletedAt,omitzero"`
}

// Action is what the view does with an object event.
type Action int

// The actions of Decide.
const (
	Skip   Action = iota // older than (or, for added/modified, as old as) what the view holds
	Store                // store the event's object
	Delete               // replace the entry with a tombstone
)

func (a Action) String() string {
	return [...]string{"skip", "store", "delete"}[a]
}

// ErrIncomparable is Decide's error for a resourceVersion that is not an
// integer (Kubernetes before v1.35 did not promise one): retrying cannot
// help.
var ErrIncomparable = errors.New("resourceVersions cannot be compared")

// Decide applies the contract's ordering rule (docs/CONSUMING.md, "Keeping
// a view of the cluster") to one object event: an added or modified event
// is stored only if its resourceVersion is newer than the held entry's
// (tombstone included); a delete is applied if its resourceVersion is newer
// or equal (a delete a relist inferred carries the last version relayd
// published, which may be the held one). held is nil when the view holds
// nothing for the object.
func Decide(held *Entry, typ, rv string) (Action, error) {
	del := typ == "deleted"
	if held == nil {
		if del {
			// Keep a tombstone even for an object never seen, so that an
			// older added replayed later stays dead.
			return Delete, nil
		}
		return Store, nil
	}
	c, err := resourceversion.CompareResourceVersion(rv, held.ResourceVersion)
	if err != nil {
		return Skip, fmt.Errorf("%w: %q with held %q: %v", ErrIncomparable, rv, held.ResourceVersion, err)
	}
	switch {
	case del && c > 0, del && c == 0 && !held.Deleted:
		return Delete, nil
	case !del && c > 0:
		return Store, nil
	}
	return Skip, nil
}

// View is a materialized view of relayd's objects in a JetStream key-value
// bucket: key <source>.<uid>, value an Entry as JSON. Being in JetStream, it
// survives the consumer's restarts, and is stored before the event is
// acknowledged.
type View struct {
	kv jetstream.KeyValue
}

// OpenView opens (creating if needed) the view's bucket.
func OpenView(ctx context.Context, js jetstream.JetStream, bucket string) (*View, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, Description: "materialized view of relayd's events (examples/consumer)"})
	if err != nil {
		return nil, fmt.Errorf("view bucket %s: %w", bucket, err)
	}
	return &View{kv: kv}, nil
}

func key(source, uid string) string { return source + "." + uid }

// Get returns the entry of an object, nil if the view holds none.
func (v *View) Get(ctx context.Context, source, uid string) (*Entry, error) {
	kve, err := v.kv.Get(ctx, key(source, uid))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var e Entry
	if err := json.Unmarshal(kve.Value(), &e); err != nil {
		return nil, fmt.Errorf("view entry %s: %w", kve.Key(), err)
	}
	return &e, nil
}

// Put stores an entry.
func (v *View) Put(ctx context.Context, e *Entry) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	_, err = v.kv.Put(ctx, key(e.Source, e.UID), b)
	return err
}

// Entries returns every entry of a source (all sources when source is ""),
// tombstones included.
func (v *View) Entries(ctx context.Context, source string) ([]*Entry, error) {
	filter := ">"
	if source != "" {
		filter = source + ".>"
	}
	lister, err := v.kv.ListKeysFiltered(ctx, filter)
	if err != nil {
		return nil, err
	}
	var out []*Entry
	for k := range lister.Keys() {
		if strings.HasPrefix(k, "_") {
			continue // the view's own keys (resume.go)
		}
		src, uid, _ := strings.Cut(k, ".")
		e, err := v.Get(ctx, src, uid)
		if err != nil {
			return nil, err
		}
		if e != nil {
			out = append(out, e)
		}
	}
	return out, nil
}

// PruneTombstones removes the tombstones applied before cutoff and returns
// how many it removed. A key written meanwhile (the object came back at a
// newer version) is left alone: the removal is conditional on the
// revision read.
func (v *View) PruneTombstones(ctx context.Context, cutoff time.Time) (int, error) {
	lister, err := v.kv.ListKeys(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for k := range lister.Keys() {
		if strings.HasPrefix(k, "_") {
			continue // the view's own keys (resume.go)
		}
		kve, err := v.kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return n, err
		}
		var e Entry
		if err := json.Unmarshal(kve.Value(), &e); err != nil {
			return n, fmt.Errorf("view entry %s: %w", k, err)
		}
		if !e.Deleted || !e.DeletedAt.Before(cutoff) {
			continue
		}
		err = v.kv.Purge(ctx, k, jetstream.LastRevision(kve.Revision()))
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			continue // rewritten since it was read
		}
		if err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// Apply applies one object event to the view and returns what it did.
func (v *View) Apply(ctx context.Context, env *event.Envelope) (Action, error) {
	held, err := v.Get(ctx, env.RelaydSource, env.K8sUID)
	if err != nil {
		return Skip, err
	}
	typ := env.Type[strings.LastIndexByte(env.Type, '.')+1:]
	act, err := Decide(held, typ, env.K8sResourceVersion)
	if err != nil || act == Skip {
		return act, err
	}
	e := &Entry{
		Source: env.RelaydSource, APIVersion: env.K8sAPIVersion, Kind: env.K8sKind, Resource: env.K8sResource,
		Namespace: env.K8sNamespace, Name: env.K8sName, UID: env.K8sUID, ResourceVersion: env.K8sResourceVersion,
		Payload: env.RelaydPayload,
	}
	if act == Delete {
		e.Deleted, e.DeletedAt = true, time.Now().UTC()
	} else {
		e.Object = env.Data
	}
	return act, v.Put(ctx, e)
}
