package testenv

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

// WidgetGVR is the test CRD's resource: widgets.example.com/v1 (kind
// Widget, namespaced, spec.color string and spec.size integer).
var WidgetGVR = schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "widgets"}

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// InstallWidgetCRD installs widgets.example.com (an existing one is kept)
// and waits until it is served and listed by discovery, which is what
// relayd needs to resolve apiVersion example.com/v1 + kind Widget.
func (e *Env) InstallWidgetCRD(ctx context.Context) error {
	dyn, err := dynamic.NewForConfig(e.AdminConfig())
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(e.AdminConfig())
	if err != nil {
		return err
	}
	crd := map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
		"metadata": map[string]any{"name": "widgets.example.com"},
		"spec": map[string]any{
			"group": "example.com", "scope": "Namespaced",
			"names": map[string]any{"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
			"versions": []any{map[string]any{
				"name": "v1", "served": true, "storage": true,
				"schema": map[string]any{"openAPIV3Schema": map[string]any{
					"type": "object",
					"properties": map[string]any{"spec": map[string]any{
						"type":       "object",
						"properties": map[string]any{"color": map[string]any{"type": "string"}, "size": map[string]any{"type": "integer"}},
					}},
				}},
			}},
		},
	}
	_, err = dyn.Resource(crdGVR).Create(ctx, &unstructured.Unstructured{Object: crd}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("testenv: create CRD widgets.example.com: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		err := func() error {
			if _, err := dyn.Resource(WidgetGVR).List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
				return err
			}
			rl, err := cs.Discovery().ServerResourcesForGroupVersion("example.com/v1")
			if err != nil {
				return err
			}
			if !slices.ContainsFunc(rl.APIResources, func(r metav1.APIResource) bool { return r.Kind == "Widget" }) {
				return errors.New("discovery does not list kind Widget yet")
			}
			return nil
		}()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("testenv: CRD widgets.example.com not served: %w", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
