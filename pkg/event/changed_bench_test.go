package event

import "testing"

// BenchmarkChangedPaths is the cost of changedPaths per pod event
// (docs/PERFORMANCE.md, "What changed costs"): the frame parse with three
// changedPaths next to the plain one, fingerprinting the paths,
// comparing them with the indexed version's, and the envelope with
// relaydchanged next to the one without.
func BenchmarkChangedPaths(b *testing.B) {
	defer func() { pathsSink = "" }()
	raw := loadPod(b)
	frame := append(append([]byte(`{"type":"MODIFIED","object":`), raw...), '}')
	sh, err := NewShaping(ShapingOptions{ChangedPaths: []string{"spec", "status", "metadata.labels"}})
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		sh   *Shaping
	}{{"parse", nil}, {"parse+changedpaths", sh}} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(int64(len(frame)))
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := ParseWatchEventShaped(frame, tc.sh); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	_, o, err := ParseWatchEventShaped(frame, sh)
	if err != nil {
		b.Fatal(err)
	}
	var f *Fingerprinter
	buf := f.PathFingerprints(&o, nil)
	prev := PathsString(buf)
	b.Run("fingerprint", func(b *testing.B) {
		b.SetBytes(int64(len(raw)))
		b.ReportAllocs()
		for b.Loop() {
			buf = f.PathFingerprints(&o, buf)
		}
	})
	b.Run("compare", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = CompareChanged(sh.ChangedPaths(), prev, buf)
		}
	})
	// What the watch does per event: fingerprint, compare, and the index's
	// copy (PathsString).
	b.Run("watch", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			buf = f.PathFingerprints(&o, buf)
			_ = CompareChanged(sh.ChangedPaths(), prev, buf)
			pathsSink = PathsString(buf)
		}
	})
	for _, binary := range []bool{false, true} {
		e := newTestEncoder(b, EncoderOptions{Cluster: "prod", Source: "pods", MaxPayload: 1 << 20, Binary: binary})
		c := &Change{Type: Modified, Origin: OriginWatch, Epoch: 1, Time: testTime, Resource: podsResource, Meta: o.Meta,
			Payload: PayloadFull, Data: o.AppendPayload(nil, PayloadFull, false)}
		mode := "structured"
		if binary {
			mode = "binary"
		}
		for _, with := range []bool{false, true} {
			name := "envelope-" + mode
			if with {
				name += "+changed"
				c.Changed = ChangedSet{Paths: sh.ChangedPaths(), Changed: 0b101}
			}
			b.Run(name, func(b *testing.B) {
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
}

var pathsSink string
