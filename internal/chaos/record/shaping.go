package record

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/relayd/relayd/internal/chaos/history"
	"github.com/relayd/relayd/pkg/event"
)

// GadgetGVR is the chaos suite's own CRD: a Widget-like kind with a status
// subresource, so that the writer makes status-only updates
// (InstallGadgetCRD).
var GadgetGVR = schema.GroupVersionResource{Group: "chaos.example.com", Version: "v1", Resource: "gadgets"}

// SecretConfigMaps is the ConfigMap kind in namespace ns with, besides
// data.i, a data.secret holding history.Marker (the source drops it).
func SecretConfigMaps(source, ns string) Kind {
	k := ConfigMaps(source)
	k.Namespace = ns
	k.Body = func(o *unstructured.Unstructured, i int) {
		_ = unstructured.SetNestedStringMap(o.Object, map[string]string{"i": strconv.Itoa(i), "secret": history.Marker + strconv.Itoa(i)}, "data")
	}
	return k
}

// ScopeLabel is the label the writer sets on the objects of ScopedConfigMaps,
// and ScopeValue the value a filter on it selects.
const (
	ScopeLabel = "tier"
	ScopeValue = "gold"
)

// ScopedConfigMaps is the ConfigMap kind in namespace ns whose label tier
// the writer sets anew on every write: for write number i, none (no
// labels at all) when i%3 is 0, "gold" when 1, "silver" when 2. A filter
// on tier=gold then sees about 4 in 9 updates enter or leave its scope.
func ScopedConfigMaps(source, ns string) Kind {
	k := ConfigMaps(source)
	k.Namespace = ns
	body := k.Body
	k.Body = func(o *unstructured.Unstructured, i int) {
		body(o, i)
		switch i % 3 {
		case 0:
			o.SetLabels(nil)
		case 1:
			o.SetLabels(map[string]string{ScopeLabel: ScopeValue})
		default:
			o.SetLabels(map[string]string{ScopeLabel: "silver"})
		}
	}
	return k
}

// Gadgets is the Gadget kind in namespace ns: updates change spec.size and
// spec.note, status updates status.observed and status.phase (the notes
// and phases hold history.Marker).
func Gadgets(source, ns string) Kind {
	return Kind{Source: source, GVR: GadgetGVR, APIVersion: GadgetGVR.Group + "/" + GadgetGVR.Version, Kind: "Gadget", Namespace: ns,
		Body: func(o *unstructured.Unstructured, i int) {
			_ = unstructured.SetNestedField(o.Object, int64(i), "spec", "size")
			_ = unstructured.SetNestedField(o.Object, history.Marker+"spec-"+strconv.Itoa(i), "spec", "note")
		},
		Status: func(o *unstructured.Unstructured, i int) {
			_ = unstructured.SetNestedField(o.Object, int64(i), "status", "observed")
			_ = unstructured.SetNestedField(o.Object, history.Marker+"status-"+strconv.Itoa(i), "status", "phase")
		}}
}

// InstallGadgetCRD creates the Gadget CRD (if missing) and waits until it
// is served and discovery lists it.
func InstallGadgetCRD(ctx context.Context, rc *rest.Config) error {
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return err
	}
	dc, err := discovery.NewDiscoveryClientForConfig(rc)
	if err != nil {
		return err
	}
	obj := func(props map[string]any) map[string]any {
		return map[string]any{"type": "object", "properties": props}
	}
	crd := map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
		"metadata": map[string]any{"name": GadgetGVR.Resource + "." + GadgetGVR.Group},
		"spec": map[string]any{
			"group": GadgetGVR.Group, "scope": "Namespaced",
			"names": map[string]any{"plural": "gadgets", "singular": "gadget", "kind": "Gadget", "listKind": "GadgetList"},
			"versions": []any{map[string]any{
				"name": GadgetGVR.Version, "served": true, "storage": true,
				"subresources": map[string]any{"status": map[string]any{}},
				"schema": map[string]any{"openAPIV3Schema": obj(map[string]any{
					"spec":   obj(map[string]any{"size": map[string]any{"type": "integer"}, "note": map[string]any{"type": "string"}}),
					"status": obj(map[string]any{"observed": map[string]any{"type": "integer"}, "phase": map[string]any{"type": "string"}}),
				})},
			}},
		},
	}
	crdGVR := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	if _, err := dyn.Resource(crdGVR).Create(ctx, &unstructured.Unstructured{Object: crd}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create CRD %s.%s: %w", GadgetGVR.Resource, GadgetGVR.Group, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		_, err := dyn.Resource(GadgetGVR).List(ctx, metav1.ListOptions{Limit: 1})
		if err == nil {
			var rl *metav1.APIResourceList
			if rl, err = dc.ServerResourcesForGroupVersion(GadgetGVR.GroupVersion().String()); err == nil &&
				!slices.ContainsFunc(rl.APIResources, func(r metav1.APIResource) bool { return r.Name == "gadgets/status" }) {
				err = errors.New("discovery does not list gadgets/status yet")
			}
		}
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("CRD %s.%s not served: %w", GadgetGVR.Resource, GadgetGVR.Group, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// alwaysIgnored are the members relayd's fingerprint always leaves out
// (pkg/event, Object.Fingerprint).
var alwaysIgnored = []string{"apiVersion", "kind", "metadata.resourceVersion", "metadata.generation", "metadata.managedFields"}

// Digest identifies a stored object (JSON, as etcd holds custom resources)
// without the ignore paths (member names joined by dots) and the members
// relayd's fingerprint always leaves out: two versions have the same
// digest exactly when relayd's fingerprints of them are equal.
func Digest(value []byte, ignore []string) (string, error) {
	if !bytes.HasPrefix(bytes.TrimSpace(value), []byte("{")) {
		return "", errors.New("digest: not a JSON object (ignoreChanges sources must be of JSON-stored kinds)")
	}
	d := json.NewDecoder(bytes.NewReader(value))
	d.UseNumber()
	var m map[string]any
	if err := d.Decode(&m); err != nil {
		return "", fmt.Errorf("digest: %w", err)
	}
	for _, p := range append(slices.Clone(alwaysIgnored), ignore...) {
		parts := strings.Split(p, ".")
		parent := m
		for _, name := range parts[:len(parts)-1] {
			parent, _ = parent[name].(map[string]any)
		}
		delete(parent, parts[len(parts)-1])
	}
	b, err := json.Marshal(m) // map keys sorted
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8]), nil
}

// Probe records what an object message of a source shaped by sh carries:
// its payload mode, its data's top-level members, which of sh.Drop are in
// its data, and whether it contains history.Marker anywhere (data or
// header values).
func Probe(sh history.Shaping, header map[string][]string, data []byte) (*history.Content, error) {
	env, err := event.DecodeMessage(header, data)
	if err != nil {
		return nil, err
	}
	c := &history.Content{Payload: env.RelaydPayload, Marker: bytes.Contains(data, []byte(history.Marker))}
	for _, vs := range header {
		for _, v := range vs {
			c.Marker = c.Marker || strings.Contains(v, history.Marker)
		}
	}
	var m map[string]any
	if len(env.Data) > 0 && !bytes.Equal(bytes.TrimSpace(env.Data), []byte("null")) {
		if err := json.Unmarshal(env.Data, &m); err != nil {
			return nil, fmt.Errorf("probe: data: %w", err)
		}
	}
	for k := range m {
		c.Members = append(c.Members, k)
	}
	sort.Strings(c.Members)
	for _, p := range sh.Drop {
		parts := strings.Split(p, ".")
		cur := m
		for _, name := range parts[:len(parts)-1] {
			cur, _ = cur[name].(map[string]any)
		}
		if _, ok := cur[parts[len(parts)-1]]; ok {
			c.Present = append(c.Present, p)
		}
	}
	return c, nil
}
