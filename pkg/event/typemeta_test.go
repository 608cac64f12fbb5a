package event

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// A PartialObjectMetadata as the apiserver sends it for a ConfigMap watched
// with Accept: application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1
// (captured from kube-apiserver v1.37).
const partialCM = `{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"name":"c0","namespace":"ns","uid":"0bac5b57","resourceVersion":"209","creationTimestamp":"2026-11-23T17:36:46Z","labels":{"a":"b"},"managedFields":[{"manager":"m","operation":"Update","apiVersion":"v1","fieldsType":"FieldsV1","fieldsV1":{"f:data":{".":{},"f:big":{}}}}]}}`

func decodeMap(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("not a JSON object: %v: %s", err, b)
	}
	return m
}

// checkRealType checks every payload mode of o, overridden to v1
// ConfigMap: the type is the override's, the metadata is the object's, and
// the full payload of a PartialObjectMetadata is its metadata payload.
func checkRealType(t *testing.T, o *Object, raw string) {
	t.Helper()
	if o.Meta.APIVersion != "v1" || o.Meta.Kind != "ConfigMap" {
		t.Fatalf("Meta type %s %s, want v1 ConfigMap", o.Meta.APIVersion, o.Meta.Kind)
	}
	if o.Meta.Name != "c0" || o.Meta.Namespace != "ns" || o.Meta.UID != "0bac5b57" || o.Meta.ResourceVersion != "209" {
		t.Fatalf("Meta identity changed: %+v", o.Meta)
	}
	wantMD := decodeMap(t, []byte(raw))["metadata"].(map[string]any)
	for _, keep := range []bool{false, true} {
		md := wantMD
		if !keep {
			md = map[string]any{}
			for k, v := range wantMD {
				if k != "managedFields" {
					md[k] = v
				}
			}
		}
		want := map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": md}
		for _, mode := range []PayloadMode{PayloadMetadata, PayloadFull} {
			p := o.AppendPayload(nil, mode, keep)
			if got := decodeMap(t, p); !reflect.DeepEqual(got, want) {
				t.Errorf("%s payload (keepManagedFields=%v):\n%s\nwant %v", mode, keep, p, want)
			}
			if bytes.Contains(p, []byte("PartialObjectMetadata")) || bytes.Contains(p, []byte("meta.k8s.io")) {
				t.Errorf("%s payload names the apiserver's type: %s", mode, p)
			}
		}
	}
	ref := o.AppendPayload(nil, PayloadReference, false)
	want := `{"apiVersion":"v1","kind":"ConfigMap","namespace":"ns","name":"c0","uid":"0bac5b57","resourceVersion":"209"}`
	if string(ref) != want {
		t.Errorf("reference payload %s, want %s", ref, want)
	}
}

func TestOverrideTypeMetaOfPartialObjectMetadata(t *testing.T) {
	frame := `{"type":"ADDED","object":` + partialCM + "}"
	tests := []struct {
		name, raw string
		watch     bool
	}{
		{"list item", partialCM, false},
		{"watch frame", frame, true},
		{"apiVersion first", strings.Replace(partialCM, `"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1"`, `"apiVersion":"meta.k8s.io/v1","kind":"PartialObjectMetadata"`, 1), false},
		{"whitespace", strings.NewReplacer(`{"kind"`, "{ \n\t\"kind\" ", `,"apiVersion":`, " ,\r\n\"apiVersion\" : ", `,"metadata":`, ` , "metadata" :  `).Replace(partialCM) + "  \n", false},
		{"kind only", strings.Replace(partialCM, `"apiVersion":"meta.k8s.io/v1",`, "", 1), false},
		{"null apiVersion", strings.Replace(partialCM, `"meta.k8s.io/v1"`, "null", 1), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var o Object
			var err error
			raw := tc.raw
			if tc.watch {
				_, o, err = ParseWatchEvent([]byte(tc.raw))
				raw = partialCM
			} else {
				o, err = ParseObject([]byte(tc.raw))
			}
			if err != nil {
				t.Fatal(err)
			}
			before := string(o.Raw)
			o.OverrideTypeMeta("v1", "ConfigMap")
			if string(o.Raw) != before {
				t.Fatal("OverrideTypeMeta modified Raw")
			}
			checkRealType(t, &o, raw)
			o.OverrideTypeMeta("v1", "ConfigMap") // idempotent
			checkRealType(t, &o, raw)
		})
	}
}

// The encoder takes apiVersion and kind from Meta: the extensions and the
// subject name the real resource.
func TestOverrideTypeMetaEncoded(t *testing.T) {
	o, err := ParseObject([]byte(partialCM))
	if err != nil {
		t.Fatal(err)
	}
	o.OverrideTypeMeta("example.com/v1", "Widget")
	e, err := NewEncoder(EncoderOptions{Cluster: "c", Source: "s"})
	if err != nil {
		t.Fatal(err)
	}
	res := Resource{Group: "example.com", Version: "v1", Resource: "widgets", Kind: "Widget", Namespaced: true}
	for _, mode := range []PayloadMode{PayloadMetadata, PayloadReference} {
		for _, binary := range []bool{false, true} {
			if binary {
				if e, err = NewEncoder(EncoderOptions{Cluster: "c", Source: "s", Binary: true}); err != nil {
					t.Fatal(err)
				}
			}
			msg, err := e.Encode(&Change{Type: Added, Origin: OriginWatch, Resource: res, Meta: o.Meta, Payload: mode,
				Data: o.AppendPayload(nil, mode, false)})
			if err != nil {
				t.Fatal(err)
			}
			env, err := DecodeMessage(msg.Header, msg.Data)
			if err != nil {
				t.Fatal(err)
			}
			if env.K8sAPIVersion != "example.com/v1" || env.K8sKind != "Widget" {
				t.Errorf("%s binary=%v: k8sapiversion %q k8skind %q", mode, binary, env.K8sAPIVersion, env.K8sKind)
			}
			if msg.Subject != "k8s.c.example%2Ecom.v1.widgets.ns.c0.added" {
				t.Errorf("subject %s", msg.Subject)
			}
			d := decodeMap(t, env.Data)
			if d["apiVersion"] != "example.com/v1" || d["kind"] != "Widget" {
				t.Errorf("%s binary=%v: data %s", mode, binary, env.Data)
			}
			all := append(append([]byte(nil), msg.Data...), []byte(strings.Join(headerValues(msg.Header), " "))...)
			if bytes.Contains(all, []byte("PartialObjectMetadata")) || bytes.Contains(all, []byte("meta.k8s.io")) {
				t.Errorf("%s binary=%v: message names the apiserver's type:\n%s", mode, binary, all)
			}
		}
	}
}

func headerValues(h map[string][]string) []string {
	var out []string
	for _, vs := range h {
		out = append(out, vs...)
	}
	return out
}

// Objects that are not a PartialObjectMetadata keep their bytes.
func TestOverrideTypeMetaOfOtherObjects(t *testing.T) {
	t.Run("same type is a no-op", func(t *testing.T) {
		raw := `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c0","uid":"u","resourceVersion":"1"},"data":{"k":"v"}}`
		o, err := ParseObject([]byte(raw))
		if err != nil {
			t.Fatal(err)
		}
		o.OverrideTypeMeta("v1", "ConfigMap")
		if got := o.AppendPayload(nil, PayloadFull, true); string(got) != raw {
			t.Errorf("full payload %s, want the object", got)
		}
	})
	t.Run("list item without type members", func(t *testing.T) {
		raw := `{"metadata":{"name":"c0","uid":"u","resourceVersion":"1"},"data":{"k":"v"}}`
		o, err := ParseObject([]byte(raw))
		if err != nil {
			t.Fatal(err)
		}
		d := o
		o.OverrideTypeMeta("v1", "ConfigMap")
		d.DefaultTypeMeta("v1", "ConfigMap")
		if got, want := o.AppendPayload(nil, PayloadFull, true), d.AppendPayload(nil, PayloadFull, true); !bytes.Equal(got, want) {
			t.Errorf("full payload %s, want %s (as with DefaultTypeMeta)", got, want)
		}
	})
	// Not the apiserver's shape for a PartialObjectMetadata: relayd never
	// publishes these in full. The full payload keeps the object's own
	// members; metadata and reference payloads carry the override.
	for name, raw := range map[string]string{
		"whole object":      `{"apiVersion":"meta.k8s.io/v1","kind":"PartialObjectMetadata","metadata":{"name":"c0","uid":"u","resourceVersion":"1"},"data":{"k":"v"}}`,
		"metadata not last": `{"metadata":{"name":"c0","uid":"u","resourceVersion":"1"},"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1"}`,
		"escaped key":       `{"\u006bind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"name":"c0","uid":"u","resourceVersion":"1"}}`,
		"escaped value":     `{"kind":"Partial\u004fbjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"name":"c0","uid":"u","resourceVersion":"1"}}`,
	} {
		t.Run(name, func(t *testing.T) {
			o, err := ParseObject([]byte(raw))
			if err != nil {
				t.Fatal(err)
			}
			o.OverrideTypeMeta("v1", "ConfigMap")
			if got := o.AppendPayload(nil, PayloadFull, true); string(got) != raw {
				t.Errorf("full payload %s, want the object unchanged", got)
			}
			for _, mode := range []PayloadMode{PayloadMetadata, PayloadReference} {
				d := decodeMap(t, o.AppendPayload(nil, mode, true))
				if d["apiVersion"] != "v1" || d["kind"] != "ConfigMap" {
					t.Errorf("%s payload type %v %v", mode, d["apiVersion"], d["kind"])
				}
			}
		})
	}
	t.Run("unparsed object", func(t *testing.T) {
		o := Object{Meta: Meta{APIVersion: "meta.k8s.io/v1", Kind: "PartialObjectMetadata", Name: "c0", UID: "u", ResourceVersion: "1"}}
		o.OverrideTypeMeta("v1", "ConfigMap")
		want := `{"apiVersion":"v1","kind":"ConfigMap","name":"c0","uid":"u","resourceVersion":"1"}`
		if got := o.AppendPayload(nil, PayloadFull, false); string(got) != want {
			t.Errorf("payload %s, want %s", got, want)
		}
	})
}

func BenchmarkOverrideTypeMeta(b *testing.B) {
	raw := []byte(partialCM)
	b.ReportAllocs()
	for b.Loop() {
		o, err := ParseObject(raw)
		if err != nil {
			b.Fatal(err)
		}
		o.OverrideTypeMeta("v1", "ConfigMap")
	}
}
