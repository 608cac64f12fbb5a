package deploy

import (
	"encoding/json"
	"maps"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
)

// TestCheckpointSurvivesReapply: re-applying the shipped checkpoint
// manifest keeps the keys relayd wrote (with its own field manager, by
// update, as pkg/checkpoint does), both with `kubectl apply` (client-side:
// the three-way strategic merge patch from the last-applied annotation,
// computed with the same apimachinery function kubectl uses) and with
// `kubectl apply --server-side`. The manifest's next revision adds a label,
// so the re-apply really patches the object. `kubectl replace` does wipe
// them: the control that shows this test would see a wipe.
func TestCheckpointSurvivesReapply(t *testing.T) {
	b := loadBundle(t, baseDir)
	c := newCluster(t, env)
	ctx := t.Context()
	written := map[string]string{
		"configmaps":  `{"resourceVersion":"4711","epoch":1,"updated":"2026-01-01T00:00:00Z"}`,
		"deployments": `{"resourceVersion":"4712","epoch":1,"updated":"2026-01-01T00:00:00Z"}`,
	}
	revision := func(ns string, next bool) *unstructured.Unstructured {
		o := find(t, b.objs, "ConfigMap", b.checkpointCM.Name).DeepCopy()
		o.SetNamespace(ns)
		if next {
			l := o.GetLabels()
			l["example.com/revision"] = "2"
			o.SetLabels(l)
		}
		return o
	}
	relaydWrites := func(ns string) {
		cm, err := c.cs.CoreV1().ConfigMaps(ns).Get(ctx, b.checkpointCM.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		maps.Copy(cm.Data, written)
		if _, err := c.cs.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{FieldManager: "relayd"}); err != nil {
			t.Fatal(err)
		}
	}
	check := func(ns string, wantKept bool) {
		t.Helper()
		cm, err := c.cs.CoreV1().ConfigMaps(ns).Get(ctx, b.checkpointCM.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if cm.Labels["example.com/revision"] != "2" {
			t.Errorf("the re-apply did not apply the new revision: labels %v", cm.Labels)
		}
		if kept := maps.Equal(cm.Data, written); kept != wantKept {
			t.Errorf("after the re-apply the data is %v; want relayd's keys kept=%v", cm.Data, wantKept)
		}
	}

	t.Run("kubectl apply", func(t *testing.T) {
		ns := "reapply-client-side"
		c.ensureNamespace(t, ns)
		clientSideApply(t, c, revision(ns, false))
		relaydWrites(ns)
		clientSideApply(t, c, revision(ns, true))
		check(ns, true)
	})
	t.Run("kubectl apply --server-side", func(t *testing.T) {
		ns := "reapply-server-side"
		c.ensureNamespace(t, ns)
		c.apply(t, revision(ns, false))
		relaydWrites(ns)
		c.apply(t, revision(ns, true))
		check(ns, true)
	})
	t.Run("kubectl replace wipes it (control)", func(t *testing.T) {
		ns := "reapply-replace"
		c.ensureNamespace(t, ns)
		c.apply(t, revision(ns, false))
		relaydWrites(ns)
		live, err := c.cs.CoreV1().ConfigMaps(ns).Get(ctx, b.checkpointCM.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cm := typed[corev1.ConfigMap](t, revision(ns, true))
		cm.ResourceVersion = live.ResourceVersion
		if _, err := c.cs.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{FieldManager: "kubectl-replace"}); err != nil {
			t.Fatal(err)
		}
		check(ns, false)
	})
}

// clientSideApply does what `kubectl apply` (client-side) does for a typed
// object: create it with the last-applied-configuration annotation, or
// patch it with the three-way strategic merge patch of (last applied,
// manifest, live).
func clientSideApply(t *testing.T, c *cluster, o *unstructured.Unstructured) {
	t.Helper()
	ctx := t.Context()
	bare := o.DeepCopy()
	ann := bare.GetAnnotations()
	delete(ann, corev1.LastAppliedConfigAnnotation)
	bare.SetAnnotations(ann)
	original, err := json.Marshal(bare.Object)
	if err != nil {
		t.Fatal(err)
	}
	mod := bare.DeepCopy()
	ann = mod.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	ann[corev1.LastAppliedConfigAnnotation] = string(original)
	mod.SetAnnotations(ann)
	modified, err := json.Marshal(mod.Object)
	if err != nil {
		t.Fatal(err)
	}
	cms := c.cs.CoreV1().ConfigMaps(o.GetNamespace())
	live, err := cms.Get(ctx, o.GetName(), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		if _, err := cms.Create(ctx, typed[corev1.ConfigMap](t, mod), metav1.CreateOptions{FieldManager: "kubectl-client-side-apply"}); err != nil {
			t.Fatal(err)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	current, err := json.Marshal(live)
	if err != nil {
		t.Fatal(err)
	}
	lookup, err := strategicpatch.NewPatchMetaFromStruct(&corev1.ConfigMap{})
	if err != nil {
		t.Fatal(err)
	}
	patch, err := strategicpatch.CreateThreeWayMergePatch([]byte(live.Annotations[corev1.LastAppliedConfigAnnotation]), modified, current, lookup, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kubectl apply's patch: %s", patch)
	if _, err := cms.Patch(ctx, o.GetName(), types.StrategicMergePatchType, patch, metav1.PatchOptions{FieldManager: "kubectl-client-side-apply"}); err != nil {
		t.Fatal(err)
	}
}
