package event

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
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
		} else if errors.As(eerr, &se) && valid {
			t.Fatalf("ParseWatchEvent(%q) = %v but json.Valid accepts it", frame, eerr)
		}
	})
}
