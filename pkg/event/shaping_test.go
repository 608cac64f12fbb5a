package event

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
)

func mustShaping(tb testing.TB, o ShapingOptions) *Shaping {
	tb.Helper()
	s, err := NewShaping(o)
	if err != nil {
		tb.Fatalf("NewShaping(%+v): %v", o, err)
	}
	return s
}

// deleteTree removes from the decoded JSON value v the members selected by
// p: the reference semantics of a path.
func deleteTree(v any, segs []pathSeg) {
	if len(segs) == 0 {
		return
	}
	sg := segs[0]
	if sg.all {
		if a, ok := v.([]any); ok {
			for _, e := range a {
				deleteTree(e, segs[1:])
			}
		}
		return
	}
	m, ok := v.(map[string]any)
	if !ok {
		return
	}
	if len(segs) == 1 {
		delete(m, sg.name)
		return
	}
	if c, ok := m[sg.name]; ok {
		deleteTree(c, segs[1:])
	}
}

// selects reports whether p selects at least one member of v.
func selects(v any, segs []pathSeg) bool {
	if len(segs) == 0 {
		return false
	}
	sg := segs[0]
	if sg.all {
		a, _ := v.([]any)
		for _, e := range a {
			if selects(e, segs[1:]) {
				return true
			}
		}
		return false
	}
	m, ok := v.(map[string]any)
	if !ok {
		return false
	}
	c, ok := m[sg.name]
	if !ok {
		return false
	}
	return len(segs) == 1 || selects(c, segs[1:])
}

var (
	pathManagedFields = []pathSeg{{name: "metadata"}, {name: "managedFields"}}
	pathLastApplied   = []pathSeg{{name: "metadata"}, {name: "annotations"}, {name: LastAppliedAnnotation}}
)

// wantShaped is what the full payload of raw shaped by s decodes to.
func wantShaped(tb testing.TB, raw []byte, s *Shaping) map[string]any {
	tb.Helper()
	m := decodeJSON(tb, raw).(map[string]any)
	o := s.Options()
	for _, d := range o.Drop {
		deleteTree(m, MustParsePathTest(tb, d).segs)
	}
	if !o.KeepManagedFields {
		deleteTree(m, pathManagedFields)
	}
	if !o.KeepLastApplied {
		deleteTree(m, pathLastApplied)
	}
	return m
}

// MustParsePathTest parses a path known to be valid.
func MustParsePathTest(tb testing.TB, s string) Path {
	tb.Helper()
	p, err := ParsePath(s)
	if err != nil {
		tb.Fatalf("ParsePath(%q): %v", s, err)
	}
	return p
}

// checkShaped checks the full and metadata payloads of o (parsed from raw
// with s) against encoding/json's reading of raw minus the cuts, and that
// the reported dropped paths are among those that select something.
func checkShaped(tb testing.TB, raw []byte, o *Object, s *Shaping) {
	tb.Helper()
	want := wantShaped(tb, raw, s)
	orig := decodeJSON(tb, raw).(map[string]any)
	for _, mode := range []PayloadMode{PayloadFull, PayloadMetadata, PayloadReference} {
		got, dropped := o.AppendShaped([]byte("x"), mode, s)
		got = got[1:]
		if !json.Valid(got) {
			tb.Fatalf("%s payload is not valid JSON: %q", mode, got)
		}
		var w any = want
		scope := any(orig)
		switch mode {
		case PayloadMetadata:
			w = map[string]any{"apiVersion": o.Meta.APIVersion, "kind": o.Meta.Kind, "metadata": want["metadata"]}
			scope = map[string]any{"metadata": orig["metadata"]}
		case PayloadReference:
			w = decodeJSON(tb, AppendReference(nil, o.Meta))
			scope = nil
		}
		if g := decodeJSON(tb, got); !reflect.DeepEqual(g, w) {
			tb.Fatalf("%s payload decodes to\n%v\nwant\n%v\n(payload %s)", mode, g, w, got)
		}
		for _, d := range dropped {
			if !slices.Contains(s.DropPaths(), d) {
				tb.Fatalf("%s: dropped %q is not a drop path", mode, d)
			}
			// (With duplicate keys, a path may remove something from a
			// member that encoding/json's reading, the last one, lacks.)
			if !selects(scope, MustParsePathTest(tb, d).segs) && !hasDuplicateKeys(raw) {
				tb.Fatalf("%s: dropped %q selects nothing in %s", mode, d, raw)
			}
		}
		if len(dropped) == 0 && dropped != nil {
			tb.Fatalf("%s: empty non-nil dropped list", mode)
		}
	}
}

// hasDuplicateKeys reports whether an object of the valid JSON raw has a
// key twice.
func hasDuplicateKeys(raw []byte) bool {
	d := json.NewDecoder(bytes.NewReader(raw))
	type frame struct {
		obj   bool
		key   bool // the next string token is a key
		names map[string]bool
	}
	var stack []*frame
	for {
		tok, err := d.Token()
		if err != nil {
			return false
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if top != nil && top.obj && top.key {
			if k, ok := tok.(string); ok {
				if top.names[k] {
					return true
				}
				top.names[k] = true
				top.key = false
				continue
			}
		}
		if top != nil && top.obj {
			top.key = true // after this value comes a key
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{obj: true, key: true, names: map[string]bool{}})
		case json.Delim('['):
			stack = append(stack, &frame{})
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
			if len(stack) > 0 && stack[len(stack)-1].obj {
				stack[len(stack)-1].key = true
			}
		}
	}
}

func TestShapedPayloads(t *testing.T) {
	const la = `"kubectl.kubernetes.io/last-applied-configuration":"{\"data\":{\"password\":\"aHVudGVyMg==\"}}\n"`
	tests := []struct {
		name      string
		opts      ShapingOptions
		raw       string
		full      string
		dropped   []string
		metadata  string   // "" when not checked
		mdDropped []string // dropped in the metadata payload
	}{
		{name: "first member", opts: ShapingOptions{Drop: []string{"spec.a"}},
			raw:  `{"metadata":{"name":"x"},"spec":{"a":1,"b":2}}`,
			full: `{"metadata":{"name":"x"},"spec":{"b":2}}`, dropped: []string{"spec.a"}},
		{name: "last member", opts: ShapingOptions{Drop: []string{"spec.b"}},
			raw:  `{"metadata":{"name":"x"},"spec":{"a":1,"b":2}}`,
			full: `{"metadata":{"name":"x"},"spec":{"a":1}}`, dropped: []string{"spec.b"}},
		{name: "middle member", opts: ShapingOptions{Drop: []string{"spec.b"}},
			raw:  `{"metadata":{},"spec":{"a":1,"b":2,"c":3}}`,
			full: `{"metadata":{},"spec":{"a":1,"c":3}}`, dropped: []string{"spec.b"}},
		{name: "only member", opts: ShapingOptions{Drop: []string{"spec.a"}},
			raw:  `{"metadata":{},"spec":{"a":1}}`,
			full: `{"metadata":{},"spec":{}}`, dropped: []string{"spec.a"}},
		{name: "trailing run", opts: ShapingOptions{Drop: []string{"spec.c", "spec.b"}},
			raw:  `{"metadata":{},"spec":{"a":1,"b":2,"c":3}}`,
			full: `{"metadata":{},"spec":{"a":1}}`, dropped: []string{"spec.c", "spec.b"}},
		{name: "leading run", opts: ShapingOptions{Drop: []string{"spec.a", "spec.b"}},
			raw:  `{"metadata":{},"spec":{"a":1,"b":2,"c":3}}`,
			full: `{"metadata":{},"spec":{"c":3}}`, dropped: []string{"spec.a", "spec.b"}},
		{name: "every member", opts: ShapingOptions{Drop: []string{"spec.a", "spec.b", "spec.c"}},
			raw:  `{"metadata":{},"spec":{"a":1,"b":2,"c":3}}`,
			full: `{"metadata":{},"spec":{}}`, dropped: []string{"spec.a", "spec.b", "spec.c"}},
		{name: "alternating", opts: ShapingOptions{Drop: []string{"spec.a", "spec.c", "spec.e"}},
			raw:  `{"metadata":{},"spec":{"a":1,"b":2,"c":3,"d":4,"e":5}}`,
			full: `{"metadata":{},"spec":{"b":2,"d":4}}`, dropped: []string{"spec.a", "spec.c", "spec.e"}},
		{name: "top level, before and after metadata", opts: ShapingOptions{Drop: []string{"status", "spec"}},
			raw:  `{"spec":{"x":1},"metadata":{"name":"n"},"status":{"y":[2]}}`,
			full: `{"metadata":{"name":"n"}}`, dropped: []string{"status", "spec"},
			metadata: `{"apiVersion":"","kind":"","metadata":{"name":"n"}}`},
		{name: "pretty printed", opts: ShapingOptions{Drop: []string{"spec.b", "spec.c"}},
			raw:  "{\n  \"metadata\": {},\n  \"spec\": {\n    \"a\": 1,\n    \"b\": 2 ,\n    \"c\": 3\n  }\n}",
			full: "{\n  \"metadata\": {},\n  \"spec\": {\n    \"a\": 1\n  }\n}", dropped: []string{"spec.b", "spec.c"}},
		{name: "pretty printed, first", opts: ShapingOptions{Drop: []string{"spec.a"}},
			raw:  "{ \"metadata\" : { } , \"spec\" : { \"a\" : 1 , \"b\" : 2 } }",
			full: "{ \"metadata\" : { } , \"spec\" : { \"b\" : 2 } }", dropped: []string{"spec.a"}},
		{name: "through arrays",
			opts:    ShapingOptions{Drop: []string{"spec.containers[*].env"}},
			raw:     `{"metadata":{},"spec":{"containers":[{"name":"a","env":[{"name":"K","value":"secret-1"}]},{"name":"b"},{"env":[],"name":"c"},"str",[1],null,{"env":{"x":1}}]}}`,
			full:    `{"metadata":{},"spec":{"containers":[{"name":"a"},{"name":"b"},{"name":"c"},"str",[1],null,{}]}}`,
			dropped: []string{"spec.containers[*].env"}},
		{name: "nested arrays",
			opts:    ShapingOptions{Drop: []string{"a[*][*].x", "a[*].y"}},
			raw:     `{"metadata":{},"a":[[{"x":1,"z":2}],[{"x":3},5],{"y":1,"x":2}]}`,
			full:    `{"metadata":{},"a":[[{"z":2}],[{},5],{"x":2}]}`,
			dropped: []string{"a[*][*].x", "a[*].y"}},
		{name: "arrays of arrays, deeper",
			opts:    ShapingOptions{Drop: []string{"spec.containers[*].env[*].value"}},
			raw:     `{"metadata":{},"spec":{"containers":[{"env":[{"name":"A","value":"s3cr3t-a"},{"name":"B","valueFrom":{}}]},{"env":[{"value":"s3cr3t-b","name":"C"}]}]}}`,
			full:    `{"metadata":{},"spec":{"containers":[{"env":[{"name":"A"},{"name":"B","valueFrom":{}}]},{"env":[{"name":"C"}]}]}}`,
			dropped: []string{"spec.containers[*].env[*].value"}},
		{name: "outer cut wins",
			opts: ShapingOptions{Drop: []string{"spec.template.spec", "spec", "status.x"}},
			raw:  `{"metadata":{},"spec":{"template":{"spec":{"a":1}},"replicas":2},"status":{"x":1}}`,
			full: `{"metadata":{},"status":{}}`, dropped: []string{"spec", "status.x"}},
		{name: "outer cut wins, inner first in the object",
			opts: ShapingOptions{Drop: []string{"spec.a.b", "spec.a", "spec.c"}},
			raw:  `{"metadata":{},"spec":{"a":{"b":1,"x":2},"c":3,"d":4}}`,
			full: `{"metadata":{},"spec":{"d":4}}`, dropped: []string{"spec.a", "spec.c"}},
		{name: "wrong types select nothing",
			opts: ShapingOptions{Drop: []string{"spec.containers.env", "spec.template[*].x", "spec.s.x", "spec.n[*].x"}},
			raw:  `{"metadata":{},"spec":{"containers":[{"env":1}],"template":{"x":1},"s":"str","n":null}}`,
			full: `{"metadata":{},"spec":{"containers":[{"env":1}],"template":{"x":1},"s":"str","n":null}}`},
		{name: "absent members select nothing",
			opts: ShapingOptions{Drop: []string{"spec.nope", "nope.x"}},
			raw:  `{"metadata":{},"spec":{"a":1}}`,
			full: `{"metadata":{},"spec":{"a":1}}`},
		{name: "inside metadata",
			opts:      ShapingOptions{Drop: []string{"metadata.labels", `metadata.annotations["example.com/token"]`, "spec"}},
			raw:       `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x","labels":{"a":"b"},"annotations":{"example.com/token":"t0ps3cret","other":"v"}},"spec":{"s":1}}`,
			full:      `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x","annotations":{"other":"v"}}}`,
			dropped:   []string{"metadata.labels", `metadata.annotations["example.com/token"]`, "spec"},
			metadata:  `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x","annotations":{"other":"v"}}}`,
			mdDropped: []string{"metadata.labels", `metadata.annotations["example.com/token"]`}},
		{name: "last-applied removed by default",
			raw:      `{"metadata":{"name":"x","annotations":{` + la + `,"a":"b"}},"data":{"password":"aHVudGVyMg=="}}`,
			full:     `{"metadata":{"name":"x","annotations":{"a":"b"}},"data":{"password":"aHVudGVyMg=="}}`,
			metadata: `{"apiVersion":"","kind":"","metadata":{"name":"x","annotations":{"a":"b"}}}`},
		{name: "last-applied the only annotation",
			raw:      `{"metadata":{"annotations":{` + la + `},"name":"x"}}`,
			full:     `{"metadata":{"annotations":{},"name":"x"}}`,
			metadata: `{"apiVersion":"","kind":"","metadata":{"annotations":{},"name":"x"}}`},
		{name: "last-applied kept",
			opts:     ShapingOptions{KeepLastApplied: true},
			raw:      `{"metadata":{"annotations":{` + la + `},"name":"x"}}`,
			full:     `{"metadata":{"annotations":{` + la + `},"name":"x"}}`,
			metadata: `{"apiVersion":"","kind":"","metadata":{"annotations":{` + la + `},"name":"x"}}`},
		{name: "last-applied dropped explicitly though kept",
			opts:      ShapingOptions{KeepLastApplied: true, Drop: []string{`metadata.annotations["kubectl.kubernetes.io/last-applied-configuration"]`}},
			raw:       `{"metadata":{"annotations":{"z":"1",` + la + `},"name":"x"}}`,
			full:      `{"metadata":{"annotations":{"z":"1"},"name":"x"}}`,
			dropped:   []string{`metadata.annotations["kubectl.kubernetes.io/last-applied-configuration"]`},
			metadata:  `{"apiVersion":"","kind":"","metadata":{"annotations":{"z":"1"},"name":"x"}}`,
			mdDropped: []string{`metadata.annotations["kubectl.kubernetes.io/last-applied-configuration"]`}},
		{name: "annotations dropped whole: outer cut wins over last-applied",
			opts:      ShapingOptions{Drop: []string{"metadata.annotations"}},
			raw:       `{"metadata":{"name":"x","annotations":{` + la + `}}}`,
			full:      `{"metadata":{"name":"x"}}`,
			dropped:   []string{"metadata.annotations"},
			metadata:  `{"apiVersion":"","kind":"","metadata":{"name":"x"}}`,
			mdDropped: []string{"metadata.annotations"}},
		{name: "managedFields and last-applied adjacent, with a drop",
			opts:      ShapingOptions{Drop: []string{"metadata.labels"}},
			raw:       `{"metadata":{"name":"x","managedFields":[{"m":1}],"labels":{"a":"b"},"annotations":{` + la + `}}}`,
			full:      `{"metadata":{"name":"x","annotations":{}}}`,
			dropped:   []string{"metadata.labels"},
			metadata:  `{"apiVersion":"","kind":"","metadata":{"name":"x","annotations":{}}}`,
			mdDropped: []string{"metadata.labels"}},
		{name: "managedFields kept",
			opts: ShapingOptions{KeepManagedFields: true, Drop: []string{"metadata.labels"}},
			raw:  `{"metadata":{"name":"x","labels":{},"managedFields":[{"m":1}]}}`,
			full: `{"metadata":{"name":"x","managedFields":[{"m":1}]}}`, dropped: []string{"metadata.labels"}},
		{name: "managedFields dropped explicitly though kept",
			opts: ShapingOptions{KeepManagedFields: true, Drop: []string{"metadata.managedFields"}},
			raw:  `{"metadata":{"name":"x","managedFields":[{"m":1}]}}`,
			full: `{"metadata":{"name":"x"}}`, dropped: []string{"metadata.managedFields"}},
		{name: "escaped keys in the object",
			opts: ShapingOptions{Drop: []string{"spec.a", `metadata.annotations["x/y"]`}},
			raw:  `{"m\u0065tadata":{"annotations":{"x\/y":"1","k\u0075bectl.kubernetes.io/last-applied-configuration":"{}"}},"sp\u0065c":{"\u0061":1,"b":2}}`,
			full: `{"m\u0065tadata":{"annotations":{}},"sp\u0065c":{"b":2}}`, dropped: []string{"spec.a", `metadata.annotations["x/y"]`}},
		{name: "duplicate keys: both removed",
			opts: ShapingOptions{Drop: []string{"spec.a"}},
			raw:  `{"metadata":{},"spec":{"a":1,"b":3,"a":2}}`,
			full: `{"metadata":{},"spec":{"b":3}}`, dropped: []string{"spec.a"}},
		{name: "duplicate last-applied: both removed",
			raw:  `{"metadata":{"annotations":{` + la + `,"b":1,` + la + `}}}`,
			full: `{"metadata":{"annotations":{"b":1}}}`},
		{name: "quoted and empty names",
			opts: ShapingOptions{Drop: []string{`data[""]`, `data["tls.key"]`, `data["a,b"]`}},
			raw:  `{"metadata":{},"data":{"":"e","tls.key":"k","tls.crt":"c","a,b":"x"}}`,
			full: `{"metadata":{},"data":{"tls.crt":"c"}}`, dropped: []string{`data[""]`, `data["tls.key"]`, `data["a\u002cb"]`}},
		{name: "metadata payload: drops outside metadata not reported",
			opts:      ShapingOptions{Drop: []string{"spec", "metadata.labels"}},
			raw:       `{"kind":"K","metadata":{"labels":{"a":"b"},"name":"n"},"spec":{}}`,
			full:      `{"kind":"K","metadata":{"name":"n"}}`,
			dropped:   []string{"spec", "metadata.labels"},
			metadata:  `{"apiVersion":"","kind":"K","metadata":{"name":"n"}}`,
			mdDropped: []string{"metadata.labels"}},
		{name: "member named like a top-level field inside metadata",
			opts:     ShapingOptions{Drop: []string{"metadata.spec"}},
			raw:      `{"metadata":{"spec":1,"name":"n"},"spec":2}`,
			full:     `{"metadata":{"name":"n"},"spec":2}`,
			dropped:  []string{"metadata.spec"},
			metadata: `{"apiVersion":"","kind":"","metadata":{"name":"n"}}`, mdDropped: []string{"metadata.spec"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := mustShaping(t, tt.opts)
			if tt.opts.Drop == nil && tt.opts.IgnoreChanges == nil && !tt.opts.KeepLastApplied && !tt.opts.KeepManagedFields {
				s = nil // the zero options: exercise the nil Shaping
			}
			o, err := ParseObjectShaped([]byte(tt.raw), s)
			if err != nil {
				t.Fatal(err)
			}
			got, dropped := o.AppendShaped(nil, PayloadFull, s)
			if string(got) != tt.full {
				t.Errorf("full:\n got %s\nwant %s", got, tt.full)
			}
			if !slices.Equal(dropped, tt.dropped) {
				t.Errorf("full: dropped %q, want %q", dropped, tt.dropped)
			}
			if tt.metadata != "" {
				got, dropped := o.AppendShaped(nil, PayloadMetadata, s)
				if string(got) != tt.metadata {
					t.Errorf("metadata:\n got %s\nwant %s", got, tt.metadata)
				}
				if !slices.Equal(dropped, tt.mdDropped) {
					t.Errorf("metadata: dropped %q, want %q", dropped, tt.mdDropped)
				}
			}
			if _, dropped := o.AppendShaped(nil, PayloadReference, s); dropped != nil {
				t.Errorf("reference: dropped %q", dropped)
			}
			checkShaped(t, []byte(tt.raw), &o, s)

			// The same object inside a watch frame gives the same payloads.
			frame := []byte(`{"type":"MODIFIED","object":` + tt.raw + `}`)
			typ, fo, err := ParseWatchEventShaped(frame, s)
			if err != nil || typ != "MODIFIED" {
				t.Fatalf("ParseWatchEventShaped: %q, %v", typ, err)
			}
			for _, mode := range []PayloadMode{PayloadFull, PayloadMetadata, PayloadReference} {
				a, da := fo.AppendShaped(nil, mode, s)
				b, db := o.AppendShaped(nil, mode, s)
				if !bytes.Equal(a, b) || !slices.Equal(da, db) {
					t.Errorf("%s: from the frame %s %q, alone %s %q", mode, a, da, b, db)
				}
			}
			if fo.Fingerprint(s) != o.Fingerprint(s) {
				t.Error("fingerprint differs between the frame and the object alone")
			}
			// AppendPayload keeps its contract: only managedFields go.
			if got, want := o.AppendPayload(nil, PayloadFull, false), mustParse(t, tt.raw).AppendPayload(nil, PayloadFull, false); !bytes.Equal(got, want) {
				t.Errorf("AppendPayload of a shaped parse:\n got %s\nwant %s", got, want)
			}
		})
	}
}

func mustParse(tb testing.TB, raw string) *Object {
	tb.Helper()
	o, err := ParseObject([]byte(raw))
	if err != nil {
		tb.Fatal(err)
	}
	return &o
}

func TestShapedDefaultTypeMeta(t *testing.T) {
	s := mustShaping(t, ShapingOptions{Drop: []string{"spec"}})
	for _, tt := range []struct{ raw, full string }{
		{`{"spec":{},"metadata":{"name":"x"}}`, `{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"x"}}`},
		{`{"metadata":{"name":"x"},"spec":{}}`, `{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"x"}}`},
		{`{"kind":"Deployment","spec":{},"metadata":{"name":"x"}}`, `{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"x"}}`},
	} {
		o, err := ParseObjectShaped([]byte(tt.raw), s)
		if err != nil {
			t.Fatal(err)
		}
		o.DefaultTypeMeta("apps/v1", "Deployment")
		got, dropped := o.AppendShaped(nil, PayloadFull, s)
		if string(got) != tt.full || !slices.Equal(dropped, []string{"spec"}) {
			t.Errorf("%s:\n got %s %q\nwant %s", tt.raw, got, dropped, tt.full)
		}
	}
}

func TestShapedPod(t *testing.T) {
	raw := loadPod(t)
	s := mustShaping(t, ShapingOptions{
		Drop:          []string{"spec.containers[*].env", "status.conditions"},
		IgnoreChanges: []string{"status"},
	})
	o, err := ParseObjectShaped(raw, s)
	if err != nil {
		t.Fatal(err)
	}
	checkShaped(t, raw, &o, s)
	full, dropped := o.AppendShaped(nil, PayloadFull, s)
	if !slices.Equal(dropped, []string{"status.conditions"}) && !slices.Equal(dropped, []string{"spec.containers[*].env", "status.conditions"}) {
		t.Errorf("dropped %q", dropped)
	}
	if bytes.Contains(full, []byte(`"conditions"`)) || bytes.Contains(full, []byte("managedFields")) {
		t.Errorf("full payload keeps a dropped member: %s", full)
	}
	// Appending to a non-empty dst keeps the prefix.
	got, _ := o.AppendShaped([]byte("prefix:"), PayloadFull, s)
	if string(got) != "prefix:"+string(full) {
		t.Error("prefix lost")
	}
	// A nil Shaping is AppendPayload minus the last-applied annotation.
	po := mustParse(t, string(raw))
	a, d := po.AppendShaped(nil, PayloadFull, nil)
	if d != nil || !reflect.DeepEqual(decodeJSON(t, a), any(wantShaped(t, raw, nil))) {
		t.Errorf("nil Shaping: %q", d)
	}
}

func TestAppendShapedUnparsedObject(t *testing.T) {
	o := Object{Meta: Meta{APIVersion: "v1", Kind: "Secret", Name: "s", UID: "u", ResourceVersion: "3"}}
	s := mustShaping(t, ShapingOptions{Drop: []string{"data"}})
	want := `{"apiVersion":"v1","kind":"Secret","name":"s","uid":"u","resourceVersion":"3"}`
	for _, mode := range []PayloadMode{PayloadFull, PayloadMetadata, PayloadReference} {
		if got, d := o.AppendShaped(nil, mode, s); string(got) != want || d != nil {
			t.Errorf("%s: got %s %q, want %s", mode, got, d, want)
		}
	}
	if o.Fingerprint(s) != 0 {
		t.Error("fingerprint of an unparsed object is not 0")
	}
}

// secretValues are strings that must never appear in a metadata payload.
var secretValues = []string{"aHVudGVyMg==", "plain-text-secret", "cm-value-123", "spec-value-456", "status-value-789"}

// TestMetadataPayloadCarriesNoData checks, for objects of odd shapes, that
// the metadata payload is exactly {apiVersion, kind, metadata} and never
// contains a data, stringData, spec or status value, with or without a
// Shaping, and that the full payload of a nil Shaping never carries the
// last-applied annotation.
func TestMetadataPayloadCarriesNoData(t *testing.T) {
	laSecret := `"kubectl.kubernetes.io/last-applied-configuration":"{\"apiVersion\":\"v1\",\"data\":{\"password\":\"aHVudGVyMg==\"},\"kind\":\"Secret\",\"stringData\":{\"x\":\"plain-text-secret\"}}\n"`
	laCM := `"kubectl.kubernetes.io/last-applied-configuration":"{\"apiVersion\":\"v1\",\"data\":{\"k\":\"cm-value-123\"},\"kind\":\"ConfigMap\"}\n"`
	var huge strings.Builder
	huge.WriteString(`{"metadata":{"name":"big","labels":{`)
	for i := range 5000 {
		if i > 0 {
			huge.WriteByte(',')
		}
		fmt.Fprintf(&huge, `"l%d":"v%d"`, i, i)
	}
	huge.WriteString(`},"annotations":{"big":"` + strings.Repeat("x", 1<<20) + `",` + laSecret + `}},"data":{"password":"aHVudGVyMg=="}}`)
	objects := map[string]string{
		"secret":                      `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"db","namespace":"shop","uid":"u","resourceVersion":"9","annotations":{` + laSecret + `},"managedFields":[{"manager":"kubectl","fieldsV1":{"f:data":{"f:password":{}}}}]},"data":{"password":"aHVudGVyMg=="},"stringData":{"x":"plain-text-secret"},"type":"Opaque"}`,
		"secret, data first":          `{"data":{"password":"aHVudGVyMg=="},"stringData":{"x":"plain-text-secret"},"metadata":{"annotations":{` + laSecret + `}},"kind":"Secret","apiVersion":"v1"}`,
		"configmap with last-applied": `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cm","annotations":{"a":"b",` + laCM + `}},"data":{"k":"cm-value-123"}}`,
		"top-level data spec status":  `{"apiVersion":"x/v1","kind":"X","spec":{"s":"spec-value-456"},"metadata":{"name":"n","labels":{"data":"d","spec":"s","status":"t"}},"status":{"s":"status-value-789"},"data":{"d":"cm-value-123"},"stringData":{"s":"plain-text-secret"}}`,
		"metadata last, pretty":       "{\n \"data\" : {\"a\":\"aHVudGVyMg==\"} ,\n \"metadata\" : {\n  \"annotations\" : {\n   " + laCM + "\n  }\n }\n}",
		"empty metadata":              `{"data":{"a":"aHVudGVyMg=="},"metadata":{},"status":{"s":"status-value-789"}}`,
		"huge metadata":               huge.String(),
	}
	shapings := map[string]*Shaping{
		"nil":  nil,
		"drop": mustShaping(t, ShapingOptions{Drop: []string{"metadata.labels", "data"}, IgnoreChanges: []string{"status"}}),
		"keep": mustShaping(t, ShapingOptions{KeepManagedFields: true}),
	}
	for oname, raw := range objects {
		for sname, s := range shapings {
			t.Run(oname+"/"+sname, func(t *testing.T) {
				o, err := ParseObjectShaped([]byte(raw), s)
				if err != nil {
					t.Fatal(err)
				}
				checkShaped(t, []byte(raw), &o, s)
				md, _ := o.AppendShaped(nil, PayloadMetadata, s)
				m := decodeJSON(t, md).(map[string]any)
				keys := slices.Sorted(func(yield func(string) bool) {
					for k := range m {
						if !yield(k) {
							return
						}
					}
				})
				if !slices.Equal(keys, []string{"apiVersion", "kind", "metadata"}) {
					t.Errorf("metadata payload has members %q", keys)
				}
				for _, v := range secretValues {
					if bytes.Contains(md, []byte(v)) {
						t.Errorf("metadata payload contains %q", v)
					}
				}
				if bytes.Contains(md, []byte("last-applied-configuration")) {
					t.Error("metadata payload contains the last-applied annotation")
				}
				full, _ := o.AppendShaped(nil, PayloadFull, s)
				if bytes.Contains(full, []byte("last-applied-configuration")) {
					t.Error("full payload contains the last-applied annotation")
				}
			})
		}
	}
}

func TestNewShapingErrors(t *testing.T) {
	const identity = `cannot be dropped: apiVersion, kind, metadata and metadata.name, namespace, uid and resourceVersion identify the object`
	tests := []struct {
		opts ShapingOptions
		want string
	}{
		{ShapingOptions{Drop: []string{"spec", "spec.a]"}}, `drop[1]: unexpected "]" at offset 6`},
		{ShapingOptions{Drop: []string{""}}, `drop[0]: empty path`},
		{ShapingOptions{Drop: []string{"metadata"}}, `drop[0]: "metadata" ` + identity},
		{ShapingOptions{Drop: []string{"apiVersion"}}, `drop[0]: "apiVersion" ` + identity},
		{ShapingOptions{Drop: []string{`["kind"]`}}, `drop[0]: "kind" ` + identity},
		{ShapingOptions{Drop: []string{"kind.x"}}, `drop[0]: "kind.x" ` + identity},
		{ShapingOptions{Drop: []string{"metadata.name"}}, `drop[0]: "metadata.name" ` + identity},
		{ShapingOptions{Drop: []string{"metadata.namespace"}}, `drop[0]: "metadata.namespace" ` + identity},
		{ShapingOptions{Drop: []string{"metadata.uid"}}, `drop[0]: "metadata.uid" ` + identity},
		{ShapingOptions{Drop: []string{`metadata["resourceVersion"].x`}}, `drop[0]: "metadata.resourceVersion.x" ` + identity},
		{ShapingOptions{Drop: []string{"spec.containers[*]"}}, `drop[0]: "spec.containers[*]" ends with [*]: a path selects a member (to remove the whole list, use "spec.containers")`},
		{ShapingOptions{Drop: []string{"spec.a", `spec["a"]`}}, `drop[1]: duplicate path "spec.a" (first at drop[0])`},
		{ShapingOptions{IgnoreChanges: []string{"status", "x[0]"}}, `ignoreChanges[1]: [N] indexes are not supported (use [*]) at offset 1`},
		{ShapingOptions{IgnoreChanges: []string{"status[*]"}}, `ignoreChanges[0]: "status[*]" ends with [*]: a path selects a member (to remove the whole list, use "status")`},
		{ShapingOptions{IgnoreChanges: []string{"status", "status"}}, `ignoreChanges[1]: duplicate path "status" (first at ignoreChanges[0])`},
		{ShapingOptions{Drop: []string{"a..b", "metadata"}, IgnoreChanges: []string{"["}},
			"drop[0]: empty member name at offset 2\n" + `drop[1]: "metadata" ` + identity + "\n" + `ignoreChanges[0]: unterminated "[" at offset 0`},
	}
	for _, tt := range tests {
		s, err := NewShaping(tt.opts)
		if err == nil || s != nil {
			t.Errorf("NewShaping(%+v) = %v, %v; want error %s", tt.opts, s, err, tt.want)
			continue
		}
		if err.Error() != tt.want {
			t.Errorf("NewShaping(%+v) error\n got %s\nwant %s", tt.opts, err, tt.want)
		}
		var se *ShapingError
		if !errors.As(err, &se) {
			t.Errorf("error %T is not a *ShapingError", err)
		}
	}
	// Allowed: metadata members that do not identify the object, and any
	// ignore path.
	ok := ShapingOptions{
		Drop:          []string{"metadata.labels", "metadata.managedFields", "metadata.generation", "metadataX", "spec.kind", "spec.metadata"},
		IgnoreChanges: []string{"metadata", "kind", "metadata.resourceVersion", "spec.containers[*].image"},
	}
	s, err := NewShaping(ok)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Options(); !reflect.DeepEqual(got, ok) {
		t.Errorf("Options() = %+v", got)
	}
	if !slices.Equal(s.DropPaths(), ok.Drop) || !slices.Equal(s.IgnorePaths(), ok.IgnoreChanges) {
		t.Errorf("DropPaths %q IgnorePaths %q", s.DropPaths(), s.IgnorePaths())
	}
	var nilS *Shaping
	if !reflect.DeepEqual(nilS.Options(), ShapingOptions{}) || nilS.DropPaths() != nil || nilS.IgnorePaths() != nil {
		t.Error("nil Shaping accessors")
	}
	// The options are copied.
	in := ShapingOptions{Drop: []string{"spec"}}
	s = mustShaping(t, in)
	in.Drop[0] = "status"
	if s.Options().Drop[0] != "spec" {
		t.Error("NewShaping does not copy Drop")
	}
}

// fingerprintBytes is what Fingerprint hashes.
func fingerprintBytes(o *Object) []byte {
	var c cutter
	c.init(o, o.start+1, o.end, fingerprintMask)
	return c.appendTo(o, []byte("{"))
}

func TestFingerprint(t *testing.T) {
	s := mustShaping(t, ShapingOptions{IgnoreChanges: []string{"status", "spec.replicas", "metadata.annotations[\"deployment.kubernetes.io/revision\"]"}, Drop: []string{"spec.secret"}})
	base := `{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"d","namespace":"ns","uid":"u","resourceVersion":"1","generation":1,"annotations":{"deployment.kubernetes.io/revision":"1","a":"b"},"managedFields":[{"m":1}]},"spec":{"replicas":1,"secret":"s1","image":"i1"},"status":{"ready":1}}`
	fp := func(raw string) uint64 {
		t.Helper()
		o, err := ParseObjectShaped([]byte(raw), s)
		if err != nil {
			t.Fatal(err)
		}
		b := fingerprintBytes(&o)
		if !json.Valid(b) {
			t.Fatalf("fingerprinted bytes are not JSON: %s", b)
		}
		if o.Fingerprint(s) != xxhash.Sum64(b) {
			t.Fatal("Fingerprint is not the xxhash of the kept bytes")
		}
		return o.Fingerprint(s)
	}
	want := fp(base)
	same := map[string]string{
		"resourceVersion":       strings.Replace(base, `"resourceVersion":"1"`, `"resourceVersion":"2"`, 1),
		"generation":            strings.Replace(base, `"generation":1`, `"generation":7`, 1),
		"managedFields":         strings.Replace(base, `[{"m":1}]`, `[{"m":2},{"m":3}]`, 1),
		"no managedFields":      strings.Replace(base, `,"managedFields":[{"m":1}]`, ``, 1),
		"status":                strings.Replace(base, `"ready":1`, `"ready":3,"x":[1]`, 1),
		"no status":             strings.Replace(base, `,"status":{"ready":1}`, ``, 1),
		"replicas":              strings.Replace(base, `"replicas":1`, `"replicas":5`, 1),
		"revision annotation":   strings.Replace(base, `"deployment.kubernetes.io/revision":"1"`, `"deployment.kubernetes.io/revision":"2"`, 1),
		"list item, no type":    strings.Replace(base, `"apiVersion":"apps/v1","kind":"Deployment",`, ``, 1),
		"type members reversed": strings.Replace(base, `"apiVersion":"apps/v1","kind":"Deployment",`, `"kind":"Deployment","apiVersion":"apps/v1",`, 1),
		"in a frame":            base, // checked below
	}
	for name, raw := range same {
		if got := fp(raw); got != want {
			t.Errorf("%s: fingerprint changed", name)
		}
	}
	_, fo, err := ParseWatchEventShaped([]byte(`{"type":"ADDED","object":`+base+`}`), s)
	if err != nil || fo.Fingerprint(s) != want {
		t.Errorf("frame: %v", err)
	}
	different := map[string]string{
		"image":               strings.Replace(base, `"image":"i1"`, `"image":"i2"`, 1),
		"dropped but watched": strings.Replace(base, `"secret":"s1"`, `"secret":"s2"`, 1),
		"label added":         strings.Replace(base, `"a":"b"`, `"a":"b","c":"d"`, 1),
		"annotation":          strings.Replace(base, `"a":"b"`, `"a":"c"`, 1),
		"name":                strings.Replace(base, `"name":"d"`, `"name":"e"`, 1),
		"whitespace":          strings.Replace(base, `"image":"i1"`, `"image": "i1"`, 1),
		"member order":        strings.Replace(base, `"secret":"s1","image":"i1"`, `"image":"i1","secret":"s1"`, 1),
	}
	for name, raw := range different {
		if got := fp(raw); got == want {
			t.Errorf("%s: fingerprint unchanged", name)
		}
	}
	// Without ignore paths, status counts.
	o := mustParse(t, base)
	o2 := mustParse(t, strings.Replace(base, `"ready":1`, `"ready":2`, 1))
	if o.Fingerprint(nil) == o2.Fingerprint(nil) {
		t.Error("nil Shaping ignores status")
	}
	// Stable across processes and versions: a fixed value for fixed bytes.
	const golden = `{"metadata":{"name":"x"},"spec":{}}`
	g := mustParse(t, `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"x","resourceVersion":"5","generation":2,"managedFields":[]},"spec":{}}`)
	if got := string(fingerprintBytes(g)); got != golden {
		t.Errorf("fingerprinted bytes %s, want %s", got, golden)
	}
	if got, want := g.Fingerprint(nil), uint64(0x6aa88e72d35f660a); got != want {
		t.Errorf("Fingerprint = %#x, want %#x: the fingerprint of the same bytes must never change", got, want)
	}
	if got := g.Fingerprint(nil); got != xxhash.Sum64String(golden) {
		t.Errorf("Fingerprint = %#x, want xxhash64(%s) = %#x", got, golden, xxhash.Sum64String(golden))
	}
}

func TestEncodeDropped(t *testing.T) {
	s := mustShaping(t, ShapingOptions{Drop: []string{"spec.containers[*].env", `metadata.annotations["a \"b\",c/ü"]`, "status.nothing"}})
	raw := loadPod(t)
	raw = bytes.Replace(raw, []byte(`"annotations":{`), []byte(`"annotations":{"a \"b\",c/ü":"x",`), 1)
	o, err := ParseObjectShaped(raw, s)
	if err != nil {
		t.Fatal(err)
	}
	data, dropped := o.AppendShaped(nil, PayloadFull, s)
	wantDropped := []string{"spec.containers[*].env", `metadata.annotations["a \"b\"\u002cc/ü"]`}
	if !slices.Equal(dropped, wantDropped) {
		t.Fatalf("dropped %q, want %q", dropped, wantDropped)
	}
	joined := strings.Join(wantDropped, ",")
	for _, binary := range []bool{false, true} {
		e := newTestEncoder(t, EncoderOptions{Cluster: "prod", Source: "pods", Binary: binary})
		c := &Change{Type: Modified, Origin: OriginWatch, Epoch: 1, Time: testTime, Resource: podsResource,
			Meta: o.Meta, Payload: PayloadFull, Data: data, Dropped: dropped}
		msg, err := e.Encode(c)
		if err != nil {
			t.Fatal(err)
		}
		if binary {
			if got := msg.Header["ce-relayddropped"]; len(got) != 1 || got[0] != encodeHeaderValue(joined) {
				t.Errorf("ce-relayddropped = %q", got)
			}
		} else {
			m := decodeBody(t, msg.Data, append(objectKeys, "k8snamespace", "relayddropped")...)
			var v string
			if err := json.Unmarshal(m["relayddropped"], &v); err != nil || v != joined {
				t.Errorf("relayddropped = %s (%v)", m["relayddropped"], err)
			}
		}
		env, err := DecodeMessage(msg.Header, msg.Data)
		if err != nil {
			t.Fatal(err)
		}
		if env.RelaydDropped != joined {
			t.Errorf("binary=%v: RelaydDropped = %q, want %q", binary, env.RelaydDropped, joined)
		}
		// The extension splits back into the canonical paths, which parse.
		for i, p := range strings.Split(env.RelaydDropped, ",") {
			if p != wantDropped[i] {
				t.Errorf("split %d = %q", i, p)
			}
			if _, err := ParsePath(p); err != nil {
				t.Error(err)
			}
		}
		checkSize(t, &msg)

		// Downgraded to the reference payload: nothing was dropped from it.
		small := newTestEncoder(t, EncoderOptions{Cluster: "prod", Source: "pods", Binary: binary, MaxPayload: msg.Size() - 1})
		msg, err = small.Encode(c)
		if err != nil || !msg.Oversize {
			t.Fatalf("oversize: %v, %v", msg.Oversize, err)
		}
		if env, err := DecodeMessage(msg.Header, msg.Data); err != nil || env.RelaydDropped != "" {
			t.Errorf("binary=%v: oversize event carries relayddropped %q (%v)", binary, env.RelaydDropped, err)
		}

		// No dropped paths: no extension.
		c.Dropped = nil
		msg, _ = e.Encode(c)
		if env, _ := DecodeMessage(msg.Header, msg.Data); env.RelaydDropped != "" || bytes.Contains(msg.Data, []byte("relayddropped")) || msg.Header["ce-relayddropped"] != nil {
			t.Errorf("binary=%v: relayddropped without dropped paths", binary)
		}

		// Invalid paths are rejected.
		for _, bad := range []string{"", "a,b"} {
			c.Dropped = []string{"ok", bad}
			if _, err := e.Encode(c); err == nil || !strings.Contains(err.Error(), "dropped path") {
				t.Errorf("Dropped %q: error %v", bad, err)
			}
		}
	}
}

func TestManyDropPaths(t *testing.T) {
	var drop []string
	var obj strings.Builder
	obj.WriteString(`{"metadata":{},"spec":{`)
	for i := range 150 {
		drop = append(drop, fmt.Sprintf("spec.f%d", i))
		if i%3 != 1 { // every third path selects nothing
			fmt.Fprintf(&obj, `"f%d":%d,`, i, i)
		}
	}
	obj.WriteString(`"kept":true}}`)
	s := mustShaping(t, ShapingOptions{Drop: drop})
	o, err := ParseObjectShaped([]byte(obj.String()), s)
	if err != nil {
		t.Fatal(err)
	}
	got, dropped := o.AppendShaped(nil, PayloadFull, s)
	if string(got) != `{"metadata":{},"spec":{"kept":true}}` {
		t.Errorf("payload %s", got)
	}
	var want []string
	for i, d := range drop {
		if i%3 != 1 {
			want = append(want, d)
		}
	}
	if !slices.Equal(dropped, want) {
		t.Errorf("dropped %q\nwant %q", dropped, want)
	}
	checkShaped(t, []byte(obj.String()), &o, s)
}

// TestShapedRandom checks AppendShaped and Fingerprint against the
// reference (decode, delete the paths, compare) on random objects whose
// members share a few names, so that paths select many adjacent, nested
// and overlapping members, with random whitespace.
func TestShapedRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	names := []string{"a", "b", "c", "d"}
	ws := func(b *strings.Builder) {
		if rng.IntN(4) == 0 {
			b.WriteString([]string{" ", "\n  ", "\t", " \r\n"}[rng.IntN(4)])
		}
	}
	var value func(b *strings.Builder, depth int)
	object := func(b *strings.Builder, depth int, extra string) {
		b.WriteByte('{')
		n := rng.IntN(5)
		first := true
		member := func(k string, v func()) {
			if !first {
				ws(b)
				b.WriteByte(',')
			}
			first = false
			ws(b)
			b.WriteString(`"` + k + `"`)
			ws(b)
			b.WriteByte(':')
			ws(b)
			v()
		}
		if extra != "" && rng.IntN(2) == 0 {
			member("metadata", func() { b.WriteString(extra) })
			extra = ""
		}
		for range n {
			member(names[rng.IntN(len(names))], func() { value(b, depth+1) })
		}
		if extra != "" {
			member("metadata", func() { b.WriteString(extra) })
		}
		ws(b)
		b.WriteByte('}')
	}
	value = func(b *strings.Builder, depth int) {
		k := rng.IntN(6)
		if depth > 3 {
			k = 4
		}
		switch k {
		case 0, 1:
			object(b, depth, "")
		case 2, 3:
			b.WriteByte('[')
			for i := range rng.IntN(4) {
				if i > 0 {
					b.WriteByte(',')
					ws(b)
				}
				value(b, depth+1)
			}
			b.WriteByte(']')
		case 4:
			fmt.Fprintf(b, `"value-%d"`, rng.IntN(1000000))
		default:
			fmt.Fprintf(b, "%d", rng.IntN(100))
		}
	}
	randPath := func() string {
		var p strings.Builder
		p.WriteString(names[rng.IntN(len(names))])
		for range rng.IntN(4) {
			if rng.IntN(3) == 0 {
				p.WriteString("[*]")
			}
			p.WriteString("." + names[rng.IntN(len(names))])
		}
		return p.String()
	}
	for i := range 3000 {
		var meta strings.Builder
		object(&meta, 1, "")
		md := meta.String()
		if rng.IntN(2) == 0 {
			md = `{"name":"n","managedFields":[{"m":1}],"annotations":{"` + LastAppliedAnnotation + `":"la-secret-value","a":"b"},"resourceVersion":"5","generation":3}`
		}
		var b strings.Builder
		object(&b, 0, md)
		raw := []byte(b.String())
		opts := ShapingOptions{KeepManagedFields: rng.IntN(2) == 0, KeepLastApplied: rng.IntN(2) == 0}
		seen := map[string]bool{}
		for range rng.IntN(5) {
			if p := randPath(); !seen[p] {
				seen[p] = true
				opts.Drop = append(opts.Drop, p)
			}
		}
		if rng.IntN(3) == 0 {
			opts.Drop = append(opts.Drop, "metadata.a", "metadata.b")
		}
		for range rng.IntN(3) {
			if p := randPath(); !slices.Contains(opts.IgnoreChanges, p) {
				opts.IgnoreChanges = append(opts.IgnoreChanges, p)
			}
		}
		s := mustShaping(t, opts)
		o, err := ParseObjectShaped(raw, s)
		if err != nil {
			t.Fatalf("%d: %s: %v", i, raw, err)
		}
		checkShaped(t, raw, &o, s)
		checkNoRemovedValues(t, raw, &o, s)
		checkFingerprint(t, raw, &o, s)
	}
}

func TestHasDuplicateKeys(t *testing.T) {
	for raw, want := range map[string]bool{
		`{"a":1,"a":2}`:                    true,
		`{"a":{"a":1},"b":2}`:              false,
		`{"a":[{"b":1},{"b":2}]}`:          false,
		`{"a":[{"b":1,"b":2}]}`:            true,
		`{"x":{"y":[]},"z":{"y":1},"y":3}`: false,
		`{"x":{"y":[]},"x":1}`:             true,
	} {
		if got := hasDuplicateKeys([]byte(raw)); got != want {
			t.Errorf("hasDuplicateKeys(%s) = %v", raw, got)
		}
	}
}
