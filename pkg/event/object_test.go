package event

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

func TestParseObject(t *testing.T) {
	pod := loadPod(t)
	tests := []struct {
		name string
		raw  string
		want Meta
	}{
		{"core pod fixture", string(pod), Meta{
			APIVersion: "v1", Kind: "Pod", Namespace: "shop", Name: "checkout-api-7f9c8d6b5-x2k4p",
			UID: "3f1c2b7e-9a4d-4e8b-b1c2-5d6e7f8a9b0c", ResourceVersion: "48213377",
		}},
		{"namespaced CRD",
			`{"apiVersion":"monitoring.coreos.com/v1","kind":"ServiceMonitor","metadata":{"name":"api","namespace":"obs","uid":"u-1","resourceVersion":"99","labels":{"a":"b"}},"spec":{"endpoints":[{"port":"http"}]}}`,
			Meta{"monitoring.coreos.com/v1", "ServiceMonitor", "obs", "api", "u-1", "99"}},
		{"cluster-scoped",
			`{"apiVersion":"cert-manager.io/v1","kind":"ClusterIssuer","metadata":{"name":"letsencrypt","uid":"u-2","resourceVersion":"7"},"spec":{}}`,
			Meta{"cert-manager.io/v1", "ClusterIssuer", "", "letsencrypt", "u-2", "7"}},
		{"list item without type meta", `{"metadata":{"name":"x","namespace":"d","uid":"u","resourceVersion":"1"},"spec":{}}`,
			Meta{"", "", "d", "x", "u", "1"}},
		{"bookmark", `{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"12345","creationTimestamp":null,"annotations":{"k8s.io/initial-events-end":"true"}}}`,
			Meta{APIVersion: "v1", Kind: "Pod", ResourceVersion: "12345"}},
		{"metadata first, keys reordered", `{"metadata":{"uid":"u","resourceVersion":"1","name":"n"},"kind":"K","apiVersion":"v"}`,
			Meta{"v", "K", "", "n", "u", "1"}},
		{"escaped values",
			`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a\u002eb","namespace":"n\"s\\","uid":"\ud83d\ude00\t","resourceVersion":"\/1"}}`,
			Meta{"v1", "ConfigMap", `n"s\`, "a.b", "😀\t", "/1"}},
		{"escaped keys", `{"\u0061piVersion":"v1","\u006bind":"Pod","m\u0065tadata":{"n\u0061me":"x","\u0075id":"u","resourceV\u0065rsion":"2","n\u0061mespace":"d"}}`,
			Meta{"v1", "Pod", "d", "x", "u", "2"}},
		{"null fields", `{"apiVersion":null,"kind":null,"metadata":{"name":null,"namespace":null,"uid":null,"resourceVersion":null}}`,
			Meta{}},
		{"lone surrogate and invalid UTF-8", "{\"metadata\":{\"name\":\"a\\ud800b\",\"uid\":\"\xff\",\"resourceVersion\":\"\\udc00\\u0041\",\"namespace\":\"\\ud83d\\u0041\"}}",
			Meta{Name: "a\uFFFDb", UID: "\uFFFD", ResourceVersion: "\uFFFDA", Namespace: "\uFFFDA"}},
		{"non-ASCII", `{"metadata":{"name":"grüße-日本"}}`, Meta{Name: "grüße-日本"}},
		{"whitespace everywhere", " \n\t{ \"kind\" : \"K\" ,\r\n \"metadata\" : { \"name\" : \"n\" , \"managedFields\" : [ ] } } \n",
			Meta{Kind: "K", Name: "n"}},
		{"case-sensitive keys", `{"Kind":"K","metadata":{"Name":"n","UID":"u"}}`, Meta{}},
		{"nested lookalikes ignored", `{"spec":{"metadata":{"name":"inner"},"kind":"inner"},"metadata":{"labels":{"name":"label"},"name":"outer"}}`,
			Meta{Name: "outer"}},
		{"deepest nesting allowed", `{"metadata":{},"x":` + strings.Repeat("[", maxDepth-1) + strings.Repeat("]", maxDepth-1) + `}`, Meta{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := ParseObject([]byte(tt.raw))
			if err != nil {
				t.Fatalf("ParseObject: %v", err)
			}
			if o.Meta != tt.want {
				t.Errorf("Meta = %#v\nwant   %#v", o.Meta, tt.want)
			}
			if !json.Valid([]byte(tt.raw)) {
				t.Fatal("test input is not valid JSON")
			}
			if got := metaByEncodingJSON(t, []byte(tt.raw)); got != o.Meta {
				t.Errorf("encoding/json reads %#v", got)
			}
			checkPayloads(t, []byte(tt.raw), &o)
		})
	}
}

func TestParseObjectAliasesInput(t *testing.T) {
	raw := []byte(`{"metadata":{"name":"n"}}`)
	o, err := ParseObject(raw)
	if err != nil {
		t.Fatal(err)
	}
	if &o.Raw[0] != &raw[0] || len(o.Raw) != len(raw) {
		t.Fatal("Object.Raw is not the input slice")
	}
}

func TestParseObjectErrors(t *testing.T) {
	deep := `{"metadata":{},"x":` + strings.Repeat("[", maxDepth) + strings.Repeat("]", maxDepth) + `}`
	tests := []struct {
		name, raw, want string
		syntax          bool // a *SyntaxError, and json.Valid must agree
	}{
		{"empty", "", "object is empty", false},
		{"blank", " \n ", "object is empty", false},
		{"array", `[{"metadata":{}}]`, "object is not a JSON object", false},
		{"string", `"x"`, "object is not a JSON object", false},
		{"null", `null`, "object is not a JSON object", false},
		{"open brace", `{`, "truncated JSON at offset 1", true},
		{"truncated metadata", `{"metadata":{}`, "truncated JSON at offset 14", true},
		{"truncated in string", `{"metadata":{"name":"ab`, "truncated JSON at offset 23", true},
		{"truncated in escape", `{"metadata":{"name":"a\u00`, "truncated JSON at offset 26", true},
		{"truncated in skipped value", `{"metadata":{},"spec":{"a":[1,2`, "truncated JSON at offset 31", true},
		{"truncated after key", `{"metadata":{},"spec"`, "truncated JSON at offset 21", true},
		{"truncated number", `{"metadata":{},"a":-`, "truncated JSON at offset 20", true},
		{"truncated literal", `{"metadata":{},"a":tr`, "truncated JSON at offset 21", true},
		{"missing metadata", `{"apiVersion":"v1","kind":"Pod"}`, "missing metadata", false},
		{"empty object", `{}`, "missing metadata", false},
		{"metadata array", `{"metadata":[]}`, "metadata is not a JSON object", false},
		{"metadata null", `{"metadata":null}`, "metadata is not a JSON object", false},
		{"uid number", `{"metadata":{"uid":5}}`, "metadata.uid is not a string", false},
		{"name object", `{"metadata":{"name":{}}}`, "metadata.name is not a string", false},
		{"namespace bool", `{"metadata":{"namespace":true}}`, "metadata.namespace is not a string", false},
		{"resourceVersion number", `{"metadata":{"resourceVersion":123}}`, "metadata.resourceVersion is not a string", false},
		{"apiVersion bool", `{"apiVersion":true,"metadata":{}}`, "apiVersion is not a string", false},
		{"kind array", `{"kind":["Pod"],"metadata":{}}`, "kind is not a string", false},
		{"duplicate name", `{"metadata":{"name":"a","name":"b"}}`, "duplicate key metadata.name", false},
		{"duplicate escaped uid", `{"metadata":{"uid":"a","\u0075id":"b"}}`, "duplicate key metadata.uid", false},
		{"duplicate metadata", `{"metadata":{},"metadata":{}}`, "duplicate key metadata", false},
		{"duplicate kind", `{"kind":"a","metadata":{},"kind":null}`, "duplicate key kind", false},
		{"duplicate managedFields", `{"metadata":{"managedFields":[],"managedFields":null}}`, "duplicate key metadata.managedFields", false},
		{"trailing data", `{"metadata":{}} x`, "invalid JSON at offset 16: invalid character 'x' after top-level value", true},
		{"two objects", `{"metadata":{}}{}`, "invalid JSON at offset 15: invalid character '{' after top-level value", true},
		{"unquoted key", `{metadata:{}}`, "invalid JSON at offset 1: invalid character 'm' looking for beginning of object key string", true},
		{"trailing comma in object", `{"metadata":{},}`, "invalid JSON at offset 15: invalid character '}' looking for beginning of object key string", true},
		{"missing colon", `{"metadata":{},"spec" 1}`, "invalid JSON at offset 22: invalid character '1' after object key", true},
		{"missing comma", `{"metadata":{} "spec":1}`, "invalid JSON at offset 15: invalid character '\"' after object key:value pair", true},
		{"missing comma in metadata", `{"metadata":{"name":"a" "uid":"b"}}`, "invalid JSON at offset 24: invalid character '\"' after object key:value pair", true},
		{"bad literal", `{"metadata":{},"spec":{"a":tru}}`, "invalid JSON at offset 30: invalid character '}' in literal true (expecting 'e')", true},
		{"control char in string", "{\"metadata\":{},\"spec\":\"a\x01\"}", "invalid JSON at offset 24: invalid character byte 0x01 in string literal", true},
		{"control char in name", "{\"metadata\":{\"name\":\"a\nb\"}}", "invalid JSON at offset 22: invalid character byte 0x0a in string literal", true},
		{"bad escape", `{"metadata":{},"spec":"\q"}`, "invalid JSON at offset 24: invalid character 'q' in string escape code", true},
		{"bad unicode escape", `{"metadata":{"name":"\u12G4"}}`, "invalid JSON at offset 25: invalid character 'G' in \\u hexadecimal character escape", true},
		{"leading zero", `{"metadata":{},"spec":01}`, "invalid JSON at offset 23: invalid character '1' after object key:value pair", true},
		{"lone minus", `{"metadata":{},"spec":-}`, "invalid JSON at offset 23: invalid character '}' in numeric literal", true},
		{"bare decimal point", `{"metadata":{},"spec":1.}`, "invalid JSON at offset 24: invalid character '}' after decimal point in numeric literal", true},
		{"empty exponent", `{"metadata":{},"spec":1e+}`, "invalid JSON at offset 25: invalid character '}' in exponent of numeric literal", true},
		{"trailing comma in array", `{"metadata":{},"spec":[1,]}`, "invalid JSON at offset 25: invalid character ']' looking for beginning of value", true},
		{"missing comma in array", `{"metadata":{},"spec":[1 2]}`, "invalid JSON at offset 25: invalid character '2' after array element", true},
		{"single quotes", `{"metadata":{},"spec":'a'}`, `invalid JSON at offset 22: invalid character '\'' looking for beginning of value`, true},
		{"invalid after valid metadata", `{"metadata":{"name":"n","uid":"u"},"status":{"x":NaN}}`, "invalid JSON at offset 49: invalid character 'N' looking for beginning of value", true},
		{"invalid inside managedFields", `{"metadata":{"managedFields":[{"a":}]}}`, "invalid JSON at offset 35: invalid character '}' looking for beginning of value", true},
		{"too deep", deep, "invalid JSON at offset 10018: exceeded max nesting depth 10000", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseObject([]byte(tt.raw))
			if err == nil {
				t.Fatalf("ParseObject(%q) succeeded, want error %q", tt.raw, tt.want)
			}
			if err.Error() != tt.want {
				t.Errorf("error = %q\nwant    %q", err, tt.want)
			}
			var se *SyntaxError
			if errors.As(err, &se) != tt.syntax {
				t.Errorf("SyntaxError = %v, want %v", !tt.syntax, tt.syntax)
			}
			if tt.syntax && json.Valid([]byte(tt.raw)) {
				t.Errorf("json.Valid accepts %q", tt.raw)
			}
		})
	}
}

func TestManagedFieldsStripping(t *testing.T) {
	tests := []struct {
		name, raw, full, metadata string
	}{
		{"first",
			`{"apiVersion":"v1","kind":"Pod","metadata":{"managedFields":[{"manager":"m","fieldsV1":{"f:a":{}}}],"name":"x","uid":"u"},"spec":{}}`,
			`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"x","uid":"u"},"spec":{}}`,
			`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"x","uid":"u"}}`},
		{"middle",
			`{"kind":"Pod","metadata":{"name":"x","managedFields":[],"uid":"u"}}`,
			`{"kind":"Pod","metadata":{"name":"x","uid":"u"}}`,
			`{"apiVersion":"","kind":"Pod","metadata":{"name":"x","uid":"u"}}`},
		{"last",
			`{"metadata":{"name":"x","uid":"u","managedFields":[{"a":"}]"}]},"status":{}}`,
			`{"metadata":{"name":"x","uid":"u"},"status":{}}`,
			`{"apiVersion":"","kind":"","metadata":{"name":"x","uid":"u"}}`},
		{"only member",
			`{"metadata":{"managedFields":[]}}`,
			`{"metadata":{}}`,
			`{"apiVersion":"","kind":"","metadata":{}}`},
		{"null value",
			`{"metadata":{"name":"x","managedFields":null}}`,
			`{"metadata":{"name":"x"}}`,
			`{"apiVersion":"","kind":"","metadata":{"name":"x"}}`},
		{"escaped key",
			`{"metadata":{"managed\u0046ields":[1],"name":"x"}}`,
			`{"metadata":{"name":"x"}}`,
			`{"apiVersion":"","kind":"","metadata":{"name":"x"}}`},
		{"pretty first",
			"{\n  \"metadata\": {\n    \"managedFields\": [\n      {}\n    ],\n    \"name\": \"x\"\n  }\n}",
			"{\n  \"metadata\": {\n    \"name\": \"x\"\n  }\n}",
			"{\"apiVersion\":\"\",\"kind\":\"\",\"metadata\":{\n    \"name\": \"x\"\n  }}"},
		{"pretty middle",
			"{\n  \"metadata\": {\n    \"name\": \"x\",\n    \"managedFields\": [],\n    \"uid\": \"u\"\n  }\n}",
			"{\n  \"metadata\": {\n    \"name\": \"x\",\n    \"uid\": \"u\"\n  }\n}",
			"{\"apiVersion\":\"\",\"kind\":\"\",\"metadata\":{\n    \"name\": \"x\",\n    \"uid\": \"u\"\n  }}"},
		{"pretty last",
			"{\n  \"metadata\": {\n    \"name\": \"x\",\n    \"managedFields\": []\n  }\n}",
			"{\n  \"metadata\": {\n    \"name\": \"x\"\n  }\n}",
			"{\"apiVersion\":\"\",\"kind\":\"\",\"metadata\":{\n    \"name\": \"x\"\n  }}"},
		{"pretty only",
			"{ \"metadata\" : { \"managedFields\" : [ ] } }",
			"{ \"metadata\" : {  } }",
			"{\"apiVersion\":\"\",\"kind\":\"\",\"metadata\":{  }}"},
		{"spaces around commas",
			`{"metadata":{"a":1 , "managedFields":[] , "b":2}}`,
			`{"metadata":{"a":1 , "b":2}}`,
			`{"apiVersion":"","kind":"","metadata":{"a":1 , "b":2}}`},
		{"not at top level or in spec",
			`{"managedFields":[1],"metadata":{"name":"x"},"spec":{"metadata":{"managedFields":[2]}}}`,
			`{"managedFields":[1],"metadata":{"name":"x"},"spec":{"metadata":{"managedFields":[2]}}}`,
			`{"apiVersion":"","kind":"","metadata":{"name":"x"}}`},
		{"surrounding whitespace trimmed",
			" \n{\"metadata\":{\"managedFields\":[]}}\n ",
			`{"metadata":{}}`,
			`{"apiVersion":"","kind":"","metadata":{}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := ParseObject([]byte(tt.raw))
			if err != nil {
				t.Fatal(err)
			}
			if got := string(o.AppendPayload(nil, PayloadFull, false)); got != tt.full {
				t.Errorf("full:\n got %q\nwant %q", got, tt.full)
			}
			if got := string(o.AppendPayload(nil, PayloadMetadata, false)); got != tt.metadata {
				t.Errorf("metadata:\n got %q\nwant %q", got, tt.metadata)
			}
			if got, want := string(o.AppendPayload(nil, PayloadFull, true)), strings.TrimSpace(tt.raw); got != want {
				t.Errorf("full, keepManagedFields:\n got %q\nwant %q", got, want)
			}
			checkPayloads(t, []byte(tt.raw), &o)
		})
	}
}

func TestAppendPayloadPod(t *testing.T) {
	raw := loadPod(t)
	o, err := ParseObject(raw)
	if err != nil {
		t.Fatal(err)
	}
	full := o.AppendPayload(nil, PayloadFull, false)
	if strings.Contains(string(full), "managedFields") || strings.Contains(string(full), "kube-scheduler") {
		t.Error("full payload still contains managedFields")
	}
	if len(full) >= len(raw)-3000 {
		t.Errorf("full payload is %d bytes, raw %d: managedFields not removed?", len(full), len(raw))
	}
	checkPayloads(t, raw, &o)

	// Appending to a non-empty dst keeps the prefix.
	dst := o.AppendPayload([]byte("prefix:"), PayloadReference, false)
	want := `prefix:{"apiVersion":"v1","kind":"Pod","namespace":"shop","name":"checkout-api-7f9c8d6b5-x2k4p","uid":"3f1c2b7e-9a4d-4e8b-b1c2-5d6e7f8a9b0c","resourceVersion":"48213377"}`
	if string(dst) != want {
		t.Errorf("reference:\n got %s\nwant %s", dst, want)
	}
	// Unknown modes are treated as full.
	if got := o.AppendPayload(nil, "", false); string(got) != string(full) {
		t.Error(`mode "" is not treated as full`)
	}
}

func TestDefaultTypeMeta(t *testing.T) {
	tests := []struct{ raw, full string }{
		{`{"metadata":{"name":"x","managedFields":[]},"spec":{}}`,
			`{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"x"},"spec":{}}`},
		{` { "kind":"Deployment", "metadata":{"name":"x"}}`,
			`{"apiVersion":"apps/v1", "kind":"Deployment", "metadata":{"name":"x"}}`},
		{`{"apiVersion":null,"metadata":{"name":"x"}}`, // present (null): not injected twice
			`{"kind":"Deployment","apiVersion":null,"metadata":{"name":"x"}}`},
		{`{"apiVersion":"v2","kind":"Other","metadata":{}}`, // present: untouched
			`{"apiVersion":"v2","kind":"Other","metadata":{}}`},
	}
	for _, tt := range tests {
		o, err := ParseObject([]byte(tt.raw))
		if err != nil {
			t.Fatal(err)
		}
		o.DefaultTypeMeta("apps/v1", "Deployment")
		got := o.AppendPayload(nil, PayloadFull, false)
		if string(got) != tt.full {
			t.Errorf("%s:\n got %s\nwant %s", tt.raw, got, tt.full)
		}
		if !json.Valid(got) {
			t.Errorf("invalid JSON %s", got)
		}
	}
	o, _ := ParseObject([]byte(`{"metadata":{"name":"x","uid":"u","resourceVersion":"1"}}`))
	o.DefaultTypeMeta("apps/v1", "Deployment")
	if got, want := string(o.AppendPayload(nil, PayloadMetadata, false)), `{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"x","uid":"u","resourceVersion":"1"}}`; got != want {
		t.Errorf("metadata:\n got %s\nwant %s", got, want)
	}
}

func TestAppendPayloadUnparsedObject(t *testing.T) {
	o := Object{Meta: Meta{APIVersion: "v1", Kind: "Secret", Name: "s", UID: "u", ResourceVersion: "3"}}
	want := `{"apiVersion":"v1","kind":"Secret","name":"s","uid":"u","resourceVersion":"3"}`
	for _, mode := range []PayloadMode{PayloadFull, PayloadMetadata, PayloadReference} {
		if got := string(o.AppendPayload(nil, mode, false)); got != want {
			t.Errorf("%s: got %s, want %s", mode, got, want)
		}
	}
}

func TestAppendReference(t *testing.T) {
	tests := []struct {
		m    Meta
		want string
	}{
		{Meta{"v1", "Pod", "default", "web-0", "u-1", "42"},
			`{"apiVersion":"v1","kind":"Pod","namespace":"default","name":"web-0","uid":"u-1","resourceVersion":"42"}`},
		{Meta{"rbac.authorization.k8s.io/v1", "ClusterRole", "", "view", "u-2", "7"},
			`{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRole","name":"view","uid":"u-2","resourceVersion":"7"}`},
		{Meta{Name: "a\"b\\c\n\x00<>&\u2028\xff"},
			`{"apiVersion":"","kind":"","name":"a\"b\\c\n\u0000<>&\u2028\ufffd","uid":"","resourceVersion":""}`},
	}
	for _, tt := range tests {
		got := AppendReference(nil, tt.m)
		if string(got) != tt.want {
			t.Errorf("AppendReference(%#v)\n got %s\nwant %s", tt.m, got, tt.want)
		}
		if !json.Valid(got) {
			t.Errorf("invalid JSON: %s", got)
		}
	}
}

func TestParseWatchFrame(t *testing.T) {
	obj := `{"metadata":{"name":"n"}}`
	tests := []struct{ frame, typ, object string }{
		{`{"type":"ADDED","object":` + obj + `}`, "ADDED", obj},
		{`{"object":` + obj + `,"type":"DELETED"}`, "DELETED", obj},
		{" {\n \"type\" : \"MODIFIED\" ,\n \"object\" : " + obj + " }\n", "MODIFIED", obj},
		{`{"type":"BOOKMARK","extra":[1,{"x":null}],"object":{"kind":"Pod","metadata":{"resourceVersion":"5"}}}`, "BOOKMARK", `{"kind":"Pod","metadata":{"resourceVersion":"5"}}`},
		{`{"type":"ERROR","object":{"kind":"Status","code":410}}`, "ERROR", `{"kind":"Status","code":410}`},
		{`{"t\u0079pe":"ADD\u0045D","\u006fbject":{}}`, "ADDED", `{}`},
		{`{"type":"custom","object":{}}`, "custom", `{}`},
	}
	for _, tt := range tests {
		typ, object, err := ParseWatchFrame([]byte(tt.frame))
		if err != nil {
			t.Errorf("ParseWatchFrame(%q): %v", tt.frame, err)
			continue
		}
		if typ != tt.typ || string(object) != tt.object {
			t.Errorf("ParseWatchFrame(%q) = %q, %q; want %q, %q", tt.frame, typ, object, tt.typ, tt.object)
		}
		if cap(object) != len(object) {
			t.Errorf("object slice has spare capacity %d: appends would overwrite the frame", cap(object)-len(object))
		}
	}
}

func TestParseWatchFrameErrors(t *testing.T) {
	tests := []struct{ frame, want string }{
		{``, "watch frame is empty"},
		{`[]`, "watch frame is not a JSON object"},
		{`{"type":"ADDED"}`, "watch frame has no object"},
		{`{"object":{}}`, "watch frame has no type"},
		{`{}`, "watch frame has no type"},
		{`{"type":1,"object":{}}`, "watch frame type is not a string"},
		{`{"type":"ADDED","object":[]}`, "watch frame object is not a JSON object"},
		{`{"type":"ADDED","object":null}`, "watch frame object is not a JSON object"},
		{`{"type":"ADDED","type":"DELETED","object":{}}`, "watch frame has duplicate key type"},
		{`{"type":"ADDED","object":{},"object":{}}`, "watch frame has duplicate key object"},
		{`{"type":"ADDED","object":{"metadata":{}`, "truncated JSON at offset 39"},
		{`{"type":"ADDED","object":{}`, "truncated JSON at offset 27"},
		{`{"type":"ADDED","object":{"a":x}}`, "invalid JSON at offset 30: invalid character 'x' looking for beginning of value"},
		{`{"type":"ADDED","object":{},"extra":[}`, "invalid JSON at offset 37: invalid character '}' looking for beginning of value"},
		{`{"type":"ADDED","object":{}} {}`, "invalid JSON at offset 29: invalid character '{' after top-level value"},
		{`{"type":"ADD` + "\n" + `","object":{}}`, "invalid JSON at offset 12: invalid character byte 0x0a in string literal"},
	}
	for _, tt := range tests {
		_, _, err := ParseWatchFrame([]byte(tt.frame))
		if err == nil || err.Error() != tt.want {
			t.Errorf("ParseWatchFrame(%q) error = %v, want %q", tt.frame, err, tt.want)
		}
	}
}

func TestParseWatchEvent(t *testing.T) {
	pod := loadPod(t)
	frame := append(append([]byte(`{"type":"MODIFIED","object":`), pod...), '}')
	typ, o, err := ParseWatchEvent(frame)
	if err != nil {
		t.Fatal(err)
	}
	want, err := ParseObject(pod)
	if err != nil {
		t.Fatal(err)
	}
	if typ != "MODIFIED" || o.Meta != want.Meta || string(o.Raw) != string(pod) {
		t.Fatalf("ParseWatchEvent = %q, %#v", typ, o.Meta)
	}
	for _, mode := range []PayloadMode{PayloadFull, PayloadMetadata, PayloadReference} {
		for _, keep := range []bool{false, true} {
			if got, w := o.AppendPayload(nil, mode, keep), want.AppendPayload(nil, mode, keep); string(got) != string(w) {
				t.Errorf("%s keep=%v: payload differs from ParseObject's", mode, keep)
			}
		}
	}

	// Errors keep frame offsets and ParseObject's messages.
	for _, tt := range []struct{ frame, want string }{
		{`{"type":"ADDED","object":{"kind":"Status"}}`, "missing metadata"},
		{`{"type":"ADDED","object":{"metadata":{"uid":1}}}`, "metadata.uid is not a string"},
		{`{"type":"ADDED","object":{"metadata":{"name":"a",}}}`, "invalid JSON at offset 49: invalid character '}' looking for beginning of object key string"},
		{`{"type":"ADDED"}`, "watch frame has no object"},
		{`{"object":{"metadata":{}}}`, "watch frame has no type"},
	} {
		if _, _, err := ParseWatchEvent([]byte(tt.frame)); err == nil || err.Error() != tt.want {
			t.Errorf("ParseWatchEvent(%q) error = %v, want %q", tt.frame, err, tt.want)
		}
	}
}

func TestTypeFromWatch(t *testing.T) {
	for in, want := range map[string]Type{"ADDED": Added, "MODIFIED": Modified, "DELETED": Deleted} {
		if got, ok := TypeFromWatch(in); !ok || got != want {
			t.Errorf("TypeFromWatch(%q) = %q, %v", in, got, ok)
		}
	}
	for _, in := range []string{"BOOKMARK", "ERROR", "added", ""} {
		if _, ok := TypeFromWatch(in); ok {
			t.Errorf("TypeFromWatch(%q) ok", in)
		}
	}
}

func TestResourceAPIVersion(t *testing.T) {
	if got := (Resource{Version: "v1"}).APIVersion(); got != "v1" {
		t.Errorf("core: %q", got)
	}
	if got := (Resource{Group: "apps", Version: "v1"}).APIVersion(); got != "apps/v1" {
		t.Errorf("apps: %q", got)
	}
}

// TestTopMembers checks the spans of the object's own members that the
// parse records (for pkg/filter), in ParseObject and ParseWatchEvent, and
// past MaxTopMembers the key of the next one.
func TestTopMembers(t *testing.T) {
	members := func(o *Object) (got []string, next string) {
		n, nx := o.TopMembers()
		for j := range n {
			k, end := o.TopMember(j)
			got = append(got, string(o.Raw[k:end]))
		}
		if nx != 0 {
			next = string(o.Raw[nx : nx+4])
		}
		return got, next
	}
	raw := ` { "kind" : "Pod", "metadata":{"name":"a","labels":{"x":"y"}},"spec": {"c":[1,{"d":"}"}]} , "status":null } `
	want := []string{`"kind" : "Pod"`, `"metadata":{"name":"a","labels":{"x":"y"}}`, `"spec": {"c":[1,{"d":"}"}]}`, `"status":null`}
	o, err := ParseObject([]byte(raw))
	if err != nil {
		t.Fatal(err)
	}
	if got, next := members(&o); !slices.Equal(got, want) || next != "" {
		t.Errorf("ParseObject: %q, next %q; want %q", got, next, want)
	}
	_, o, err = ParseWatchEvent([]byte(`{"type":"ADDED", "object":` + raw + `}`))
	if err != nil {
		t.Fatal(err)
	}
	if got, next := members(&o); !slices.Equal(got, want) || next != "" {
		t.Errorf("ParseWatchEvent: %q, next %q; want %q", got, next, want)
	}

	var b strings.Builder
	b.WriteString(`{"metadata":{}`)
	for k := range 10 {
		fmt.Fprintf(&b, `,"m%d":%d`, k, k)
	}
	b.WriteString("}")
	o, err = ParseObject([]byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	got, next := members(&o)
	if len(got) != MaxTopMembers || got[0] != `"metadata":{}` || got[MaxTopMembers-1] != `"m6":6` || next != `"m7"` {
		t.Errorf("11 members: %q, next %q", got, next)
	}

	if n, next := (&Object{Raw: []byte(raw)}).TopMembers(); n != 0 || next != 0 {
		t.Errorf("an Object not from a parse: %d members, next %d", n, next)
	}
}
