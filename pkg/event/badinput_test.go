package event

// Bad watch frames, as a broken proxy, a crashing apiserver or a cut
// connection can deliver them: truncated, oversized, not JSON at all, and
// the Status objects of ERROR frames. Each must either parse exactly or fail
// with an error that names the problem (and, for syntax, the offset), never
// panic. The fuzzers in fuzz_test.go explore around these; the seed files in
// testdata/fuzz/FuzzParseWatchFrame make the same shapes part of every
// `go test` run.

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// podFrame is a real-sized watch frame (the 8 KB pod) without trailing
// whitespace, so that every strict prefix is incomplete.
func podFrame(tb testing.TB) []byte {
	return append(append([]byte(`{"type":"MODIFIED","object":`), loadPod(tb)...), '}')
}

// Every cut of a frame (a connection closed mid-frame) is reported as
// truncated at the exact length read, by both frame parsers.
func TestTruncatedWatchFrameNamesTheOffset(t *testing.T) {
	frame := podFrame(t)
	if _, _, err := ParseWatchEvent(frame); err != nil {
		t.Fatalf("the uncut frame: %v", err)
	}
	for n := 0; n < len(frame); n++ {
		cut := frame[:n]
		for name, parse := range map[string]func([]byte) error{
			"ParseWatchFrame": func(b []byte) error { _, _, err := ParseWatchFrame(b); return err },
			"ParseWatchEvent": func(b []byte) error { _, _, err := ParseWatchEvent(b); return err },
		} {
			err := parse(cut)
			if n == 0 {
				if err == nil || err.Error() != "watch frame is empty" {
					t.Fatalf("%s(empty) = %v, want watch frame is empty", name, err)
				}
				continue
			}
			var se *SyntaxError
			if !errors.As(err, &se) || !se.Truncated || se.Offset != n {
				t.Fatalf("%s(frame[:%d]) = %v, want a truncated SyntaxError at offset %d (tail %q)", name, n, err, n, tail(cut))
			}
			if want := "truncated JSON at offset "; !strings.HasPrefix(err.Error(), want) {
				t.Fatalf("%s(frame[:%d]) says %q", name, n, err)
			}
		}
	}
}

func tail(b []byte) []byte {
	if len(b) > 20 {
		return b[len(b)-20:]
	}
	return b
}

// An object far above any NATS max payload parses like a small one (size is
// the encoder's business: it sends such objects as references), and nesting
// deeper than encoding/json accepts is an error, not a stack overflow.
func TestOversizedWatchFrames(t *testing.T) {
	big := strings.Repeat("x", 16<<20)
	frame := []byte(`{"type":"ADDED","object":{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"big","namespace":"ns","uid":"u","resourceVersion":"7"},"data":{"k":"` + big + `"}}}`)
	typ, o, err := ParseWatchEvent(frame)
	if err != nil || typ != "ADDED" || o.Meta.Name != "big" || o.Meta.ResourceVersion != "7" {
		t.Fatalf("16 MiB frame: %q %+v %v", typ, o.Meta, err)
	}
	if full := o.AppendPayload(nil, PayloadFull, false); len(full) < len(big) || !json.Valid(full) {
		t.Fatalf("full payload of the 16 MiB object: %d bytes, valid %v", len(full), json.Valid(full))
	}
	if ref := o.AppendPayload(nil, PayloadReference, false); len(ref) > 256 || !bytes.Contains(ref, []byte(`"name":"big"`)) {
		t.Fatalf("reference payload %q", ref)
	}

	for _, depth := range []int{maxDepth - 2, maxDepth + 1, 100 * maxDepth} {
		nested := []byte(`{"type":"ADDED","object":{"metadata":{},"spec":` + strings.Repeat("[", depth) + strings.Repeat("]", depth) + `}}`)
		_, _, err := ParseWatchEvent(nested)
		_, _, ferr := ParseWatchFrame(nested)
		valid := json.Valid(nested)
		for _, e := range []error{err, ferr} {
			if valid != (e == nil) {
				t.Fatalf("depth %d: error %v, json.Valid %v", depth, e, valid)
			}
			if e != nil && !strings.Contains(e.Error(), "exceeded max nesting depth") {
				t.Errorf("depth %d: error %q does not say the nesting is too deep", depth, e)
			}
		}
	}
}

// What comes back when something other than the apiserver answers, or the
// apiserver answers with something other than a watch stream.
func TestNonJSONWatchFrames(t *testing.T) {
	tests := []struct{ name, frame, want string }{
		{"html error page", "<html><body>502 Bad Gateway</body></html>", "watch frame is not a JSON object"},
		{"plain text", "404 page not found\n", "watch frame is not a JSON object"},
		{"protobuf envelope", "k8s\x00\n\x0c\n\x02v1\x12\x06Status", "watch frame is not a JSON object"},
		{"yaml", "type: ADDED\nobject: {}\n", "watch frame is not a JSON object"},
		{"null", "null", "watch frame is not a JSON object"},
		{"array of frames", `[{"type":"ADDED","object":{"metadata":{}}}]`, "watch frame is not a JSON object"},
		{"whitespace only", " \r\n\t", "watch frame is empty"},
		{"two frames run together", `{"type":"ADDED","object":{"metadata":{}}}{"type":"ADDED","object":{"metadata":{}}}`, "invalid JSON at offset 41: invalid character '{' after top-level value"},
		{"single quotes", `{'type':'ADDED'}`, "invalid JSON at offset 1: invalid character '\\'' looking for beginning of object key string"},
		{"trailing comma", `{"type":"ADDED","object":{"metadata":{}},}`, "invalid JSON at offset 41: invalid character '}' looking for beginning of object key string"},
		{"NUL byte", "{\"type\":\"ADDED\x00\",\"object\":{}}", "invalid JSON at offset 14: invalid character byte 0x00 in string literal"},
		{"invalid UTF-8 is kept, not an error", "{\"type\":\"ADDED\",\"object\":{\"metadata\":{\"name\":\"\xff\"}}}", ""},
		{"no type", `{"object":{"metadata":{}}}`, "watch frame has no type"},
		{"no object", `{"type":"ADDED"}`, "watch frame has no object"},
		{"type is a number", `{"type":1,"object":{}}`, "watch frame type is not a string"},
		{"object is a string", `{"type":"ERROR","object":"boom"}`, "watch frame object is not a JSON object"},
		{"object is null", `{"type":"DELETED","object":null}`, "watch frame object is not a JSON object"},
		{"duplicate type", `{"type":"ADDED","type":"DELETED","object":{}}`, "watch frame has duplicate key type"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := ParseWatchFrame([]byte(tc.frame))
			_, _, eerr := ParseWatchEvent([]byte(tc.frame))
			if tc.want == "" {
				if err != nil || eerr != nil {
					t.Fatalf("ParseWatchFrame: %v, ParseWatchEvent: %v, want both to accept it", err, eerr)
				}
				return
			}
			if err == nil || err.Error() != tc.want {
				t.Errorf("ParseWatchFrame = %v, want %q", err, tc.want)
			}
			if eerr == nil || eerr.Error() != tc.want {
				t.Errorf("ParseWatchEvent = %v, want %q", eerr, tc.want)
			}
		})
	}
}

// ERROR frames carry a metav1.Status (metadata {}), exactly as the
// apiserver writes them; both parsers hand back the Status unchanged. A
// frame whose object has no metadata is rejected by ParseWatchEvent only,
// so the source falls back to ParseWatchFrame for ERROR frames.
func TestStatusWatchFrames(t *testing.T) {
	statuses := map[string]string{
		"410 expired":   `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 1 (5)","reason":"Expired","code":410}`,
		"410 gone":      `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"The resourceVersion for the provided watch is too old.","reason":"Gone","code":410}`,
		"500 internal":  `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Internal error occurred: etcdserver: request timed out","reason":"InternalError","details":{"causes":[{"message":"etcdserver: request timed out"}]},"code":500}`,
		"403 forbidden": `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"configmaps is forbidden: User \"relayd\" cannot watch resource \"configmaps\" in API group \"\" in the namespace \"x\"","reason":"Forbidden","details":{"kind":"configmaps"},"code":403}`,
		"404 not found": `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the server could not find the requested resource","reason":"NotFound","details":{},"code":404}`,
	}
	for name, st := range statuses {
		frame := []byte(`{"type":"ERROR","object":` + st + `}`)
		typ, obj, err := ParseWatchFrame(frame)
		if err != nil || typ != "ERROR" || string(obj) != st {
			t.Errorf("%s: ParseWatchFrame = %q, %q, %v", name, typ, obj, err)
		}
		typ, o, err := ParseWatchEvent(frame)
		if err != nil || typ != "ERROR" || string(o.Raw) != st || o.Meta.Kind != "Status" || o.Meta.Name != "" {
			t.Errorf("%s: ParseWatchEvent = %q, %+v, %v", name, typ, o.Meta, err)
		}
	}

	// A Status without metadata (older servers, proxies): only the frame parser.
	bare := []byte(`{"type":"ERROR","object":{"kind":"Status","code":500,"message":"boom"}}`)
	if _, _, err := ParseWatchEvent(bare); err == nil || err.Error() != "missing metadata" {
		t.Errorf("ParseWatchEvent(status without metadata) = %v, want missing metadata", err)
	}
	if typ, obj, err := ParseWatchFrame(bare); err != nil || typ != "ERROR" || !bytes.Contains(obj, []byte(`"boom"`)) {
		t.Errorf("ParseWatchFrame(status without metadata) = %q, %q, %v", typ, obj, err)
	}
	// The same shape with an object type must not pass as an object change.
	if _, _, err := ParseWatchEvent([]byte(`{"type":"ADDED","object":{"kind":"Status","code":500}}`)); err == nil {
		t.Error("ParseWatchEvent accepted an ADDED frame whose object has no metadata")
	}
}
