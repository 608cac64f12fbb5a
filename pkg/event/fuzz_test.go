package event

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/cespare/xxhash/v2"
)

func parseSeeds(tb testing.TB) [][]byte {
	seeds := [][]byte{
		loadPod(tb),
		[]byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a","namespace":"b","uid":"c","resourceVersion":"1","managedFields":[{"x":1}]}}`),
		[]byte(`{"metadata":{"managedFields":[],"name":"a\u002eb"},"spec":{"x":[1,2.5e-3,-0,true,false,null,"s"]}}`),
		[]byte(" {\n \"metadata\" : { \"name\" : \"n\" , \"managedFields\" : null } } "),
		[]byte(`{"\u006bind":"K","metadata":{"n\u0061me":"\ud83d\ude00","uid":"\ud800"}}`),
		[]byte("{\"metadata\":{\"name\":\"\xff\xfe\"}}"),
		[]byte(`{"metadata":{"name":"a","name":"b"}}`),
		[]byte(`{"metadata":{}`),
		[]byte(`{"metadata":{},"a":[[[[[]]]]]}`),
		[]byte(`{"type":"ADDED","object":{"metadata":{"name":"x","managedFields":[]}}}`),
		[]byte(`[]`),
		[]byte(``),
	}
	return seeds
}

// FuzzParseObject checks that ParseObject never panics, agrees with
// json.Valid on syntax, produces valid JSON in every payload mode, and reads
// the same Meta as encoding/json.
func FuzzParseObject(f *testing.F) {
	for _, s := range parseSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		orig := bytes.Clone(raw)
		o, err := ParseObject(raw)
		if !bytes.Equal(raw, orig) {
			t.Fatal("ParseObject modified its input")
		}
		valid := json.Valid(raw)
		if err != nil {
			var se *SyntaxError
			if errors.As(err, &se) && valid {
				t.Fatalf("ParseObject(%q) = %v but json.Valid accepts it", raw, err)
			}
			return
		}
		if !valid {
			t.Fatalf("ParseObject accepted invalid JSON %q", raw)
		}
		if got := metaByEncodingJSON(t, raw); got != o.Meta {
			t.Fatalf("Meta = %#v, encoding/json reads %#v", o.Meta, got)
		}
		checkPayloads(t, raw, &o)
		// Shaped with a nil Shaping: managedFields and the last-applied
		// annotation removed; the fingerprint.
		checkShaped(t, raw, &o, nil)
		checkNoRemovedValues(t, raw, &o, nil)
		checkFingerprint(t, raw, &o, nil)

		// With type meta defaulted, full and metadata payloads stay valid.
		o.DefaultTypeMeta("example.com/v1", "Thing")
		for _, mode := range []PayloadMode{PayloadFull, PayloadMetadata, PayloadReference} {
			if p := o.AppendPayload([]byte("x"), mode, false); !json.Valid(p[1:]) {
				t.Fatalf("%s payload with defaulted type meta is invalid: %q", mode, p[1:])
			}
		}

		// The same object inside a watch frame parses the same.
		frame := append(append([]byte(`{"object":`), raw...), `,"type":"ADDED"}`...)
		typ, fo, err := ParseWatchEvent(frame)
		if se := (*SyntaxError)(nil); errors.As(err, &se) && se.Msg == errDepth(0).(*SyntaxError).Msg {
			return // one level deeper than the object alone
		}
		if err != nil {
			t.Fatalf("ParseWatchEvent of a frame around a valid object: %v", err)
		}
		if typ != "ADDED" || fo.Meta != metaByEncodingJSON(t, raw) {
			t.Fatalf("ParseWatchEvent = %q, %#v", typ, fo.Meta)
		}
		o2, _ := ParseObject(raw)
		if a, b := fo.AppendPayload(nil, PayloadFull, false), o2.AppendPayload(nil, PayloadFull, false); !bytes.Equal(a, b) {
			t.Fatalf("ParseWatchEvent payload %q, ParseObject payload %q", a, b)
		}
	})
}

// frameShaping is the Shaping FuzzParseWatchFrame applies to the objects
// of valid frames.
var frameShaping = func() *Shaping {
	s, err := NewShaping(ShapingOptions{
		Drop:          []string{"spec.containers[*].env", "status", "metadata.labels", "x[*][*].y", `metadata.annotations["a"]`},
		IgnoreChanges: []string{"metadata.annotations", "spec.containers[*].image", "x"},
	})
	if err != nil {
		panic(err)
	}
	return s
}()

// FuzzParseWatchFrame checks that ParseWatchFrame and ParseWatchEvent never
// panic, agree with json.Valid on syntax and with encoding/json on the type
// and object.
func FuzzParseWatchFrame(f *testing.F) {
	// The 8 KB pod is left out: FuzzParseObject covers it, and minimizing
	// inputs grown from it would take most of a short fuzzing run.
	for _, s := range parseSeeds(f)[1:] {
		f.Add(s)
		f.Add(append(append([]byte(`{"type":"MODIFIED","object":`), s...), '}'))
	}
	f.Add([]byte(`{"object":{},"type":"ERROR","extra":{"a":[1]}}`))
	f.Add([]byte(`{"type":"A\u0044DED","object":{}}`))
	f.Add([]byte(`{"type":"ADDED","object":{"metadata":{"labels":{"a":"bcdefg"},"annotations":{"a":"secret-a","b":"y"}},"spec":{"containers":[{"env":[{"value":"secret-env"}],"image":"i"},{"image":"j"}]},"x":[[{"y":1,"z":2}],{"y":3}],"status":{"s":"status-value"}}}`))
	f.Fuzz(func(t *testing.T, frame []byte) {
		typ, object, err := ParseWatchFrame(frame)
		valid := json.Valid(frame)
		var se *SyntaxError
		if err != nil && errors.As(err, &se) && valid {
			t.Fatalf("ParseWatchFrame(%q) = %v but json.Valid accepts it", frame, err)
		}
		if err == nil {
			if !valid {
				t.Fatalf("ParseWatchFrame accepted invalid JSON %q", frame)
			}
			var w struct {
				Type   *string         `json:"type"`
				Object json.RawMessage `json:"object"`
			}
			// Decode into a map first: encoding/json struct fields match
			// case-insensitively, the watch frame keys do not.
			var m map[string]json.RawMessage
			if err := json.Unmarshal(frame, &m); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(m["type"], &w.Type); err != nil || w.Type == nil || *w.Type != typ {
				t.Fatalf("type %q, encoding/json %v (%v)", typ, w.Type, err)
			}
			if !bytes.Equal(m["object"], object) || len(object) == 0 || object[0] != '{' {
				t.Fatalf("object %q, encoding/json %q", object, m["object"])
			}
		}
		etyp, o, eerr := ParseWatchEvent(frame)
		if eerr == nil {
			if err != nil || etyp != typ || !bytes.Equal(o.Raw, object) {
				t.Fatalf("ParseWatchEvent = %q, %q, %v; ParseWatchFrame = %q, %q, %v", etyp, o.Raw, eerr, typ, object, err)
			}
			po, perr := ParseObject(object)
			if perr != nil || po.Meta != o.Meta {
				t.Fatalf("ParseObject(object) = %#v, %v; ParseWatchEvent Meta %#v", po.Meta, perr, o.Meta)
			}
			for _, mode := range []PayloadMode{PayloadFull, PayloadMetadata, PayloadReference} {
				if a, b := o.AppendPayload(nil, mode, false), po.AppendPayload(nil, mode, false); !bytes.Equal(a, b) || !json.Valid(a) {
					t.Fatalf("%s: ParseWatchEvent payload %q, ParseObject %q", mode, a, b)
				}
			}

			// The shaped parse of the frame agrees with that of the object.
			_, so, serr := ParseWatchEventShaped(frame, frameShaping)
			sp, sperr := ParseObjectShaped(object, frameShaping)
			if serr != nil || sperr != nil || so.Meta != o.Meta {
				t.Fatalf("shaped: ParseWatchEventShaped %v, ParseObjectShaped %v", serr, sperr)
			}
			for _, mode := range []PayloadMode{PayloadFull, PayloadMetadata, PayloadReference} {
				a, da := so.AppendShaped(nil, mode, frameShaping)
				b, db := sp.AppendShaped(nil, mode, frameShaping)
				if !bytes.Equal(a, b) || !slices.Equal(da, db) {
					t.Fatalf("%s: shaped frame payload %q %q, object %q %q", mode, a, da, b, db)
				}
			}
			if so.Fingerprint(frameShaping) != sp.Fingerprint(frameShaping) {
				t.Fatal("shaped: fingerprints differ")
			}
			checkShaped(t, object, &sp, frameShaping)
			checkNoRemovedValues(t, object, &sp, frameShaping)
			checkFingerprint(t, object, &sp, frameShaping)
		} else if errors.As(eerr, &se) && valid {
			t.Fatalf("ParseWatchEvent(%q) = %v but json.Valid accepts it", frame, eerr)
		}
	})
}

// FuzzParsePath checks that ParsePath never panics, reports errors as
// *PathError at an offset inside the input, and that String round-trips.
func FuzzParsePath(f *testing.F) {
	for _, s := range []string{
		"spec", "spec.template.spec.containers[*].env", `metadata.annotations["example.com/token"]`,
		`a["\"\\\/\b\f\n\r\t\u0041\ud83d\ude00"]`, `a["x,y"]`, `a[""][*][*].b`, "a[0]", "a..b", `a["x`, "[*]", `["a"].b`,
		`a["\ud800"]`, "a[\"\x01\"]", "a\xff", `a.["b"]`, "a[*", "",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParsePath(s)
		if err != nil {
			var pe *PathError
			if !errors.As(err, &pe) || pe.Offset < -1 || pe.Offset > len(s) || pe.Msg == "" {
				t.Fatalf("ParsePath(%q): error %#v", s, err)
			}
			return
		}
		if p.Len() == 0 {
			t.Fatalf("ParsePath(%q) returned an empty path", s)
		}
		c := p.String()
		q, err := ParsePath(c)
		if err != nil || !q.Equal(p) {
			t.Fatalf("ParsePath(%q).String() = %q, which parses to %v, %v", s, c, q.segs, err)
		}
		if q.String() != c {
			t.Fatalf("String is not canonical: %q then %q", c, q.String())
		}
		if strings.Contains(c, ",") {
			t.Fatalf("canonical path %q contains a comma", c)
		}
		if !utf8.ValidString(c) {
			t.Fatalf("canonical path %q is not UTF-8", c)
		}
	})
}

// FuzzShaped checks, for arbitrary object JSON and paths, that the shaped
// parse fails exactly when ParseObject does; that the full and metadata
// payloads are valid JSON and decode to encoding/json's reading of the
// object minus the selected members; that they never contain a removed
// string value; that the fingerprint hashes the object minus the ignored
// and volatile members; and that a watch frame around the object gives the
// same results.
func FuzzShaped(f *testing.F) {
	type seed struct {
		raw          string
		d1, d2, ign  string
		keepMF, keep bool
	}
	la := `"kubectl.kubernetes.io/last-applied-configuration":"{\"data\":{\"password\":\"aHVudGVyMg==\"}}"`
	for _, s := range []seed{
		{`{"metadata":{"name":"x"},"spec":{"a":1,"b":2,"c":3}}`, "spec.b", "spec.c", "spec.a", false, false},
		{`{"metadata":{"annotations":{` + la + `},"managedFields":[]},"data":{"k":"secret-value"}}`, "data.k", "", "status", false, false},
		{`{"metadata":{"annotations":{` + la + `,"a":"b"}},"data":{"k":"secret-value"}}`, "data", "metadata.annotations", "data.k", true, true},
		{`{"metadata":{},"spec":{"containers":[{"name":"a","env":[{"name":"K","value":"secret-1"}]},{"name":"b"},"s",[1]]}}`, "spec.containers[*].env", "spec.containers[*].env[*].value", "spec.containers[*].name", false, false},
		{`{"metadata":{},"a":[[{"x":1,"z":2}],[{"x":3},5],{"y":1}]}`, "a[*][*].x", "a[*].y", "a[*][*].z", false, false},
		{`{"metadata":{},"spec":{"template":{"spec":{"a":1}},"r":2},"status":{"x":1}}`, "spec.template.spec", "spec", "spec.template", false, false},
		{"{ \"metadata\" : { \"labels\" : { \"a\" : \"bcdefg\" } , \"name\" : \"n\" } , \"spec\" : [ ] }", "metadata.labels.a", "spec", "metadata.labels", false, false},
		{`{"m\u0065tadata":{"annotations":{"x\/y":"1"}},"sp\u0065c":{"\u0061":1,"b":2}}`, `metadata.annotations["x/y"]`, "spec.a", "spec.b", false, false},
		{`{"metadata":{},"data":{"":"e","tls.key":"k","a,b":"x"}}`, `data[""]`, `data["tls.key"]`, `data["a,b"]`, false, false},
		{string(loadPod(f)), "spec.containers[*].env", "status.conditions", "status", false, false},
	} {
		f.Add([]byte(s.raw), s.d1, s.d2, s.ign, s.keepMF, s.keep)
	}
	f.Fuzz(func(t *testing.T, raw []byte, d1, d2, ign string, keepMF, keepLA bool) {
		opts := ShapingOptions{KeepManagedFields: keepMF, KeepLastApplied: keepLA}
		for _, d := range []string{d1, d2} {
			if d != "" {
				opts.Drop = append(opts.Drop, d)
			}
		}
		if ign != "" {
			opts.IgnoreChanges = []string{ign}
		}
		s, err := NewShaping(opts)
		if err != nil {
			var se *ShapingError
			if !errors.As(err, &se) {
				t.Fatalf("NewShaping error %T %v", err, err)
			}
			return
		}
		o, err := ParseObjectShaped(raw, s)
		po, perr := ParseObject(raw)
		if (err == nil) != (perr == nil) || err != nil && err.Error() != perr.Error() {
			t.Fatalf("ParseObjectShaped error %v, ParseObject error %v", err, perr)
		}
		if err != nil {
			return
		}
		if o.Meta != po.Meta {
			t.Fatalf("Meta %#v, ParseObject %#v", o.Meta, po.Meta)
		}
		checkShaped(t, raw, &o, s)
		checkNoRemovedValues(t, raw, &o, s)
		checkFingerprint(t, raw, &o, s)

		frame := append(append([]byte(`{"object":`), raw...), `,"type":"ADDED"}`...)
		_, fo, err := ParseWatchEventShaped(frame, s)
		if se := (*SyntaxError)(nil); errors.As(err, &se) && se.Msg == errDepth(0).(*SyntaxError).Msg {
			return // one level deeper than the object alone
		}
		if err != nil {
			t.Fatalf("ParseWatchEventShaped of a frame around a valid object: %v", err)
		}
		for _, mode := range []PayloadMode{PayloadFull, PayloadMetadata} {
			a, da := fo.AppendShaped(nil, mode, s)
			b, db := o.AppendShaped(nil, mode, s)
			if !bytes.Equal(a, b) || !slices.Equal(da, db) {
				t.Fatalf("%s: frame %q %q, object %q %q", mode, a, da, b, db)
			}
		}
		if fo.Fingerprint(s) != o.Fingerprint(s) {
			t.Fatal("fingerprint differs between the frame and the object")
		}
	})
}

// checkNoRemovedValues checks that no string removed from a payload (by a
// drop path, managedFields or the last-applied annotation) appears in it,
// for strings long and plain enough to be recognised and that do not
// appear in what the payload keeps. Only for inputs without escapes, whose
// bytes are what they decode to.
func checkNoRemovedValues(tb testing.TB, raw []byte, o *Object, s *Shaping) {
	tb.Helper()
	if bytes.IndexByte(raw, '\\') >= 0 {
		return
	}
	orig := decodeJSON(tb, raw).(map[string]any)
	opts := s.Options()
	var removed [][]pathSeg
	for _, d := range opts.Drop {
		removed = append(removed, MustParsePathTest(tb, d).segs)
	}
	if !opts.KeepManagedFields {
		removed = append(removed, pathManagedFields)
	}
	if !opts.KeepLastApplied {
		removed = append(removed, pathLastApplied)
	}
	var strs []string
	for _, p := range removed {
		collectSelected(orig, p, func(v any) { collectStrings(v, &strs) })
	}
	want := wantShaped(tb, raw, s)
	for _, mode := range []PayloadMode{PayloadFull, PayloadMetadata} {
		var w any = want
		if mode == PayloadMetadata {
			w = map[string]any{"apiVersion": o.Meta.APIVersion, "kind": o.Meta.Kind, "metadata": want["metadata"]}
		}
		kept, err := json.Marshal(w)
		if err != nil {
			tb.Fatal(err)
		}
		payload, _ := o.AppendShaped(nil, mode, s)
		for _, v := range strs {
			if len(v) < 5 || !plainValue(v) || bytes.Contains(kept, []byte(v)) {
				continue
			}
			if bytes.Contains(payload, []byte(v)) {
				tb.Fatalf("%s payload contains the removed value %q: %s", mode, v, payload)
			}
		}
	}
}

// plainValue reports whether v is made of characters that appear as they
// are inside a JSON string and never span two tokens.
func plainValue(v string) bool {
	for i := 0; i < len(v); i++ {
		c := v[i]
		if !(isPlainName(c) || c == '.' || c == '/' || c == '=' || c == '+') {
			return false
		}
	}
	return true
}

// collectSelected calls fn with every value p selects in v.
func collectSelected(v any, p []pathSeg, fn func(any)) {
	if len(p) == 0 {
		return
	}
	if p[0].all {
		if a, ok := v.([]any); ok {
			for _, e := range a {
				collectSelected(e, p[1:], fn)
			}
		}
		return
	}
	m, ok := v.(map[string]any)
	if !ok {
		return
	}
	c, ok := m[p[0].name]
	if !ok {
		return
	}
	if len(p) == 1 {
		fn(c)
		return
	}
	collectSelected(c, p[1:], fn)
}

// collectStrings appends every string and object key in v to out.
func collectStrings(v any, out *[]string) {
	switch v := v.(type) {
	case string:
		*out = append(*out, v)
	case []any:
		for _, e := range v {
			collectStrings(e, out)
		}
	case map[string]any:
		for k, e := range v {
			*out = append(*out, k)
			collectStrings(e, out)
		}
	}
}

// checkFingerprint checks that the fingerprint hashes valid JSON equal to
// the object minus its ignored and volatile members.
func checkFingerprint(tb testing.TB, raw []byte, o *Object, s *Shaping) {
	tb.Helper()
	b := fingerprintBytes(o)
	if !json.Valid(b) {
		tb.Fatalf("fingerprinted bytes are not valid JSON: %q", b)
	}
	if o.Fingerprint(s) != xxhash.Sum64(b) {
		tb.Fatal("Fingerprint is not the xxhash of the kept bytes")
	}
	if NewFingerprinter(testKey).Fingerprint(o) != hmac64("0123456789abcdef0123456789abcdef", b) {
		tb.Fatal("the keyed Fingerprint is not the HMAC-SHA256 of the kept bytes")
	}
	want := decodeJSON(tb, raw).(map[string]any)
	for _, p := range s.Options().IgnoreChanges {
		deleteTree(want, MustParsePathTest(tb, p).segs)
	}
	for _, p := range [][]pathSeg{
		{{name: "apiVersion"}}, {{name: "kind"}}, pathManagedFields,
		{{name: "metadata"}, {name: "resourceVersion"}}, {{name: "metadata"}, {name: "generation"}},
	} {
		deleteTree(want, p)
	}
	if got := decodeJSON(tb, b); !reflect.DeepEqual(got, any(want)) {
		tb.Fatalf("fingerprinted bytes decode to\n%v\nwant\n%v", got, want)
	}
}
