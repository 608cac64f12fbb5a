package index

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// canonicalSeeds are bucket values in and around the layout parseCanonical
// reads: every one it accepts must read as encoding/json reads it.
var canonicalSeeds = []string{
	`{"uid":"6f2c1d3e-9a4b-4c5d-8e7f-0a1b2c3d4e5f","namespace":"shop","name":"web","resourceVersion":"48213","fingerprint":"00c0ffee12345678","v":1}`,
	`{"uid":"u","name":"n","resourceVersion":"1"}`,
	`{"uid":"u","namespace":"","name":"n","resourceVersion":"1","v":0}`,
	`{"uid":"u","name":"n","resourceVersion":"1","v":2}`,
	`{"uid":"u","name":"n","resourceVersion":"1","v":01}`,
	`{"uid":"u","name":"n","resourceVersion":"1","v":1.0}`,
	`{"uid":"u","name":"n","resourceVersion":"1","v":1000}`,
	`{"uid":"u","name":"n","resourceVersion":"1","v":-1}`,
	`{"uid":"u","name":"n","resourceVersion":"1"} `,
	`{ "uid":"u","name":"n","resourceVersion":"1"}`,
	`{"uid":"u","name":"n","resourceVersion":"1","extra":1}`,
	`{"name":"n","uid":"u","resourceVersion":"1"}`,
	`{"UID":"u","name":"n","resourceVersion":"1"}`,
	`{"uid":"u\u0041","name":"n","resourceVersion":"1"}`,
	`{"uid":"u\"","name":"n","resourceVersion":"1"}`,
	`{"uid":"ü","name":"n","resourceVersion":"1"}`,
	"{\"uid\":\"\xff\",\"name\":\"n\",\"resourceVersion\":\"1\"}",
	"{\"uid\":\"a\tb\",\"name\":\"n\",\"resourceVersion\":\"1\"}",
	`{"uid":"u","name":"n","resourceVersion":"1","fingerprint":"ABCDEFabcdef0123","fingerprintKeyID":"k"}`,
	`{"uid":"u","name":"n","resourceVersion":"1","fingerprint":"xyz"}`,
	`{"uid":"u","name":"n","resourceVersion":"1","fingerprint":""}`,
	`{"uid":"u","name":"n","resourceVersion":null}`,
	`{"uid":"u","name":"n","resourceVersion":1}`,
	`{"uid":"u","name":"n","resourceVersion":"1"`,
	`{"uid":"u","name":"n"}`,
	`{"uid":"u","uid":"v","name":"n","resourceVersion":"1"}`,
	``,
	`null`,
}

// FuzzParseCanonical: a value parseCanonical accepts reads exactly as
// encoding/json reads it (the slow path of Load): same members, same
// version.
func FuzzParseCanonical(f *testing.F) {
	for _, s := range canonicalSeeds {
		f.Add([]byte(s))
	}
	golden, _ := filepath.Glob(filepath.Join(goldenDir, "value-*.json"))
	for _, g := range golden {
		b, err := os.ReadFile(g)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r, ok := parseCanonical(data)
		if !ok {
			return
		}
		var v value
		if err := json.Unmarshal(data, &v); err != nil {
			t.Fatalf("parseCanonical read %q, encoding/json refuses it: %v", data, err)
		}
		got := value{UID: string(r.f.uid), Namespace: string(r.f.ns), Name: string(r.f.name), ResourceVersion: string(r.f.rv),
			Fingerprint: string(r.fingerprint), FingerprintKeyID: string(r.kid), Managers: string(r.managers), Paths: string(r.paths), V: r.v}
		if got != v {
			t.Fatalf("%q: parseCanonical read %+v, encoding/json %+v", data, got, v)
		}
		if fp, ok := parseHex64(r.fingerprint); ok {
			if want, err := v.object(); err != nil || want.Fingerprint != fp {
				t.Fatalf("%q: fingerprint %x, encoding/json path %x (%v)", data, fp, want.Fingerprint, err)
			}
		}
	})
}

// TestPutMsgIsCanonical: every value relayd writes is read by
// parseCanonical (Load decodes it without encoding/json), whatever its
// optional members, and the golden values of every format version are too.
func TestPutMsgIsCanonical(t *testing.T) {
	b := &Bucket{subjPre: "$KV.b.", keyID: "dcd201a6c8c10f67"}
	for _, o := range []Object{
		{UID: uid(1), Namespace: "shop", Name: "web-0", ResourceVersion: "10", Fingerprint: 0xc0ffee},
		{UID: uid(2), Name: "node-1", ResourceVersion: "11"},
		{UID: "not-a-uuid", Namespace: "ns", Name: "b", ResourceVersion: "opaque-rv"},
	} {
		for _, keyed := range []*Bucket{b, {subjPre: b.subjPre}} {
			data := keyed.PutMsg("src._", o).Data
			if _, ok := parseCanonical(data); !ok {
				t.Errorf("parseCanonical does not read %s, written by PutMsg", data)
			}
		}
	}
	golden, err := filepath.Glob(filepath.Join(goldenDir, "value-*.json"))
	if err != nil || len(golden) == 0 {
		t.Fatalf("golden values: %v, %v", golden, err)
	}
	for _, g := range golden {
		data, err := os.ReadFile(g)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := parseCanonical([]byte(strings.TrimSuffix(string(data), "\n"))); !ok {
			t.Errorf("parseCanonical does not read %s: %s", g, data)
		}
	}
}
