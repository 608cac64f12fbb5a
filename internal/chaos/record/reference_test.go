package record

import (
	"bytes"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A write of the checkpoint ConfigMap, stored as etcd stores it
// (protobuf), becomes one CheckpointWrite per source: the resourceVersion
// its key holds, 0 for a missing key.
func TestCheckpointWritesAreRecorded(t *testing.T) {
	cm := &corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Name: "cp", Namespace: "cpns"},
		Data:       map[string]string{"cms.ns": `{"resourceVersion":"1234","epoch":3}`},
	}
	var b bytes.Buffer
	if err := protoCodec.Encode(cm, &b); err != nil {
		t.Fatal(err)
	}
	p := &Prefix{Key: "/registry/configmaps/cpns/cp", Checkpoint: map[string]string{"cms.ns": "cms", "widgets.ns": "widgets"}}
	r := &Reference{}
	if err := r.checkpoint(p, "77", b.Bytes()); err != nil {
		t.Fatal(err)
	}
	got := r.Checkpoints()
	if len(got) != 2 || got[0].Source != "cms" || got[0].CheckpointRV != 1234 || got[0].Rev != 77 ||
		got[1].Source != "widgets" || got[1].CheckpointRV != 0 || got[0].Seen.IsZero() {
		t.Errorf("checkpoint writes %+v", got)
	}
	if err := r.checkpoint(p, "78", []byte("not protobuf")); err == nil {
		t.Errorf("an undecodable checkpoint ConfigMap is not an error")
	}
}
