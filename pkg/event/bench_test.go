package event

import (
	"encoding/json"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes/scheme"
)

func BenchmarkParseObject(b *testing.B) {
	raw := loadPod(b)
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseObject(raw); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParseWatchEvent(b *testing.B) {
	frame := append(append([]byte(`{"type":"MODIFIED","object":`), loadPod(b)...), '}')
	b.SetBytes(int64(len(frame)))
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := ParseWatchEvent(frame); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParseWatchFrame(b *testing.B) {
	frame := append(append([]byte(`{"type":"MODIFIED","object":`), loadPod(b)...), '}')
	b.SetBytes(int64(len(frame)))
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := ParseWatchFrame(frame); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAppendPayload(b *testing.B) {
	o, err := ParseObject(loadPod(b))
	if err != nil {
		b.Fatal(err)
	}
	for _, mode := range []PayloadMode{PayloadFull, PayloadMetadata, PayloadReference} {
		b.Run(string(mode), func(b *testing.B) {
			dst := make([]byte, 0, 16<<10)
			b.ReportAllocs()
			for b.Loop() {
				dst = o.AppendPayload(dst[:0], mode, false)
			}
			b.SetBytes(int64(len(dst)))
		})
	}
}

func BenchmarkEncode(b *testing.B) {
	for _, binary := range []bool{false, true} {
		name := "structured"
		if binary {
			name = "binary"
		}
		b.Run(name, func(b *testing.B) {
			e := newTestEncoder(b, EncoderOptions{Cluster: "prod", Source: "pods", Binary: binary, MaxPayload: 1 << 20})
			c, _ := podChange(b, PayloadFull)
			b.SetBytes(int64(len(c.Data)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := e.Encode(c); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkPipeline is the per-event hot path of a source: parse the watch
// frame, build the full payload, encode the structured event.
func BenchmarkPipeline(b *testing.B) {
	frame := append(append([]byte(`{"type":"MODIFIED","object":`), loadPod(b)...), '}')
	e := newTestEncoder(b, EncoderOptions{Cluster: "prod", Source: "pods", MaxPayload: 1 << 20})
	b.SetBytes(int64(len(frame)))
	b.ReportAllocs()
	for b.Loop() {
		typ, o, err := ParseWatchEvent(frame)
		if err != nil {
			b.Fatal(err)
		}
		t, _ := TypeFromWatch(typ)
		c := Change{Type: t, Origin: OriginWatch, Epoch: 1, Time: testTime, Resource: podsResource, Meta: o.Meta,
			Payload: PayloadFull, Data: o.AppendPayload(nil, PayloadFull, false)}
		if _, err := e.Encode(&c); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncodeToken(b *testing.B) {
	for _, tc := range []struct{ name, in string }{
		{"plain", "checkout-api-7f9c8d6b5-x2k4p"},
		{"escaped", "node-17.eu-west-1.compute.internal"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = EncodeToken(tc.in)
			}
		})
	}
}

func BenchmarkSubject(b *testing.B) {
	e := newTestEncoder(b, EncoderOptions{Cluster: "prod", Source: "pods"})
	b.ReportAllocs()
	for b.Loop() {
		_ = e.Subject(deployResource, "shop", "checkout-api", Modified)
	}
}

// Baselines: what the same input costs with encoding/json.

func BenchmarkBaselineJSONValid(b *testing.B) {
	raw := loadPod(b)
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		if !json.Valid(raw) {
			b.Fatal("invalid")
		}
	}
}

func BenchmarkBaselineUnmarshalMeta(b *testing.B) {
	raw := loadPod(b)
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		var v struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Namespace       string `json:"namespace"`
				Name            string `json:"name"`
				UID             string `json:"uid"`
				ResourceVersion string `json:"resourceVersion"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal(raw, &v); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkBaselineUnmarshalMapStripMarshal(b *testing.B) {
	raw := loadPod(b)
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		var v map[string]any
		if err := json.Unmarshal(raw, &v); err != nil {
			b.Fatal(err)
		}
		delete(v["metadata"].(map[string]any), "managedFields")
		if _, err := json.Marshal(v); err != nil {
			b.Fatal(err)
		}
	}
}

// The benchmarks below name the hot-path steps (docs/PERFORMANCE.md) one by one, so
// that `make bench` (benchstat) shows each step's cost and allocations:
// frame parse, metadata extraction, managedFields stripping, envelope build
// and subject encoding; then the same work done the client-go way.

// BenchmarkHotPath runs each step on the pod fixture (8 KB with
// managedFields and status).
func BenchmarkHotPath(b *testing.B) {
	raw := loadPod(b)
	frame := append(append([]byte(`{"type":"MODIFIED","object":`), raw...), '}')
	b.Run("frame-parse", func(b *testing.B) {
		b.SetBytes(int64(len(frame)))
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := ParseWatchFrame(frame); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("frame-parse+metadata", func(b *testing.B) {
		b.SetBytes(int64(len(frame)))
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := ParseWatchEvent(frame); err != nil {
				b.Fatal(err)
			}
		}
	})
	_, o, err := ParseWatchEvent(frame)
	if err != nil {
		b.Fatal(err)
	}
	for _, keep := range []bool{false, true} {
		name := "payload-strip-managedfields"
		if keep {
			name = "payload-keep-managedfields"
		}
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(raw)))
			b.ReportAllocs()
			for b.Loop() {
				_ = o.AppendPayload(nil, PayloadFull, keep)
			}
		})
	}
	// Who made the change: the managedFields entries compared with the
	// previous version's digest (docs/CONSUMING.md, "Who changed it").
	_, digest := o.AuthorSince(0)
	b.Run("author", func(b *testing.B) {
		b.SetBytes(int64(len(raw)))
		b.ReportAllocs()
		for b.Loop() {
			_, _ = o.AuthorSince(digest)
		}
	})
	e := newTestEncoder(b, EncoderOptions{Cluster: "prod", Source: "pods", MaxPayload: 1 << 20})
	c := &Change{Type: Modified, Origin: OriginWatch, Epoch: 1, Time: testTime, Resource: podsResource, Meta: o.Meta,
		Payload: PayloadFull, Data: o.AppendPayload(nil, PayloadFull, false)}
	b.Run("envelope", func(b *testing.B) {
		b.SetBytes(int64(len(c.Data)))
		b.ReportAllocs()
		for b.Loop() {
			if _, err := e.Encode(c); err != nil {
				b.Fatal(err)
			}
		}
	})
	ca := *c
	ca.Author, _ = o.AuthorSince(0)
	b.Run("envelope+author", func(b *testing.B) {
		b.SetBytes(int64(len(ca.Data)))
		b.ReportAllocs()
		for b.Loop() {
			if _, err := e.Encode(&ca); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("subject", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = e.AppendSubject(make([]byte, 0, 128), podsResource, o.Meta.Namespace, o.Meta.Name, Modified)
		}
	})
}

// BenchmarkBaselineClientGoDecode is what a client-go watch consumer pays
// per frame for the same pod: the typed decoder (corev1.Pod) and the
// unstructured one (dynamic client), both from client-go's JSON serializers.
func BenchmarkBaselineClientGoDecode(b *testing.B) {
	raw := loadPod(b)
	b.Run("typed", func(b *testing.B) {
		dec := scheme.Codecs.UniversalDeserializer()
		b.SetBytes(int64(len(raw)))
		b.ReportAllocs()
		for b.Loop() {
			var pod corev1.Pod
			if _, _, err := dec.Decode(raw, nil, &pod); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("unstructured", func(b *testing.B) {
		b.SetBytes(int64(len(raw)))
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := unstructured.UnstructuredJSONScheme.Decode(raw, nil, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkShaping measures what payload shaping costs on the per-event hot
// path, on the pod fixture (8 KB: managedFields, env, status): the watch
// frame parse plus the full payload, plain (ParseWatchEvent +
// AppendPayload) next to shaped (ParseWatchEventShaped + AppendShaped,
// dropping the containers' env and the status conditions, ignoring status),
// and the steps alone.
func BenchmarkShaping(b *testing.B) {
	frame := append(append([]byte(`{"type":"MODIFIED","object":`), loadPod(b)...), '}')
	s, err := NewShaping(ShapingOptions{
		Drop:          []string{"spec.containers[*].env", "status.conditions"},
		IgnoreChanges: []string{"status"},
	})
	if err != nil {
		b.Fatal(err)
	}
	dst := make([]byte, 0, 16<<10)
	b.Run("plain", func(b *testing.B) {
		b.SetBytes(int64(len(frame)))
		b.ReportAllocs()
		for b.Loop() {
			_, o, err := ParseWatchEvent(frame)
			if err != nil {
				b.Fatal(err)
			}
			dst = o.AppendPayload(dst[:0], PayloadFull, false)
		}
	})
	b.Run("shaped-nil", func(b *testing.B) {
		b.SetBytes(int64(len(frame)))
		b.ReportAllocs()
		for b.Loop() {
			_, o, err := ParseWatchEventShaped(frame, nil)
			if err != nil {
				b.Fatal(err)
			}
			dst, _ = o.AppendShaped(dst[:0], PayloadFull, nil)
		}
	})
	b.Run("shaped", func(b *testing.B) {
		b.SetBytes(int64(len(frame)))
		b.ReportAllocs()
		for b.Loop() {
			_, o, err := ParseWatchEventShaped(frame, s)
			if err != nil {
				b.Fatal(err)
			}
			dst, _ = o.AppendShaped(dst[:0], PayloadFull, s)
		}
	})
	b.Run("shaped+fingerprint", func(b *testing.B) {
		b.SetBytes(int64(len(frame)))
		b.ReportAllocs()
		for b.Loop() {
			_, o, err := ParseWatchEventShaped(frame, s)
			if err != nil {
				b.Fatal(err)
			}
			dst, _ = o.AppendShaped(dst[:0], PayloadFull, s)
			_ = o.Fingerprint(s)
		}
	})
	keyed := NewFingerprinter(mustKey("0123456789abcdef0123456789abcdef"))
	b.Run("shaped+fingerprint-keyed", func(b *testing.B) {
		b.SetBytes(int64(len(frame)))
		b.ReportAllocs()
		for b.Loop() {
			_, o, err := ParseWatchEventShaped(frame, s)
			if err != nil {
				b.Fatal(err)
			}
			dst, _ = o.AppendShaped(dst[:0], PayloadFull, s)
			_ = keyed.Fingerprint(&o)
		}
	})
	_, o, err := ParseWatchEventShaped(frame, s)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("append-shaped", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			dst, _ = o.AppendShaped(dst[:0], PayloadFull, s)
		}
		b.SetBytes(int64(len(dst)))
	})
	b.Run("fingerprint", func(b *testing.B) {
		b.SetBytes(int64(len(o.Raw)))
		b.ReportAllocs()
		for b.Loop() {
			_ = o.Fingerprint(s)
		}
	})
	b.Run("fingerprint-keyed", func(b *testing.B) {
		b.SetBytes(int64(len(o.Raw)))
		b.ReportAllocs()
		for b.Loop() {
			_ = keyed.Fingerprint(&o)
		}
	})
	b.Run("parse-path", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := ParsePath(`spec.template.spec.containers[*].env[*]["valueFrom"]`); err != nil {
				b.Fatal(err)
			}
		}
	})
}
