package event

import (
	"bytes"
	"encoding/json"
	"os"
	"reflect"
	"testing"
)

func loadPod(tb testing.TB) []byte {
	tb.Helper()
	raw, err := os.ReadFile("testdata/pod.json")
	if err != nil {
		tb.Fatal(err)
	}
	return bytes.TrimSpace(raw)
}

// decodeJSON decodes b with encoding/json (numbers kept as json.Number).
func decodeJSON(tb testing.TB, b []byte) any {
	tb.Helper()
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		tb.Fatalf("encoding/json cannot decode %q: %v", b, err)
	}
	return v
}

// withoutManagedFields decodes raw and deletes metadata.managedFields: what a
// full payload must decode to.
func withoutManagedFields(tb testing.TB, raw []byte) map[string]any {
	tb.Helper()
	m := decodeJSON(tb, raw).(map[string]any)
	if md, ok := m["metadata"].(map[string]any); ok {
		delete(md, "managedFields")
	}
	return m
}

// stringField returns m[key] as the Meta field encoding/json sees: the
// string, or "" for absent and null.
func stringField(tb testing.TB, m map[string]any, key string) string {
	tb.Helper()
	switch v := m[key].(type) {
	case nil:
		return ""
	case string:
		return v
	default:
		tb.Fatalf("%s is %T, not a string", key, v)
		return ""
	}
}

// metaByEncodingJSON extracts Meta from raw with encoding/json.
func metaByEncodingJSON(tb testing.TB, raw []byte) Meta {
	tb.Helper()
	m := decodeJSON(tb, raw).(map[string]any)
	md, _ := m["metadata"].(map[string]any)
	return Meta{
		APIVersion:      stringField(tb, m, "apiVersion"),
		Kind:            stringField(tb, m, "kind"),
		Namespace:       stringField(tb, md, "namespace"),
		Name:            stringField(tb, md, "name"),
		UID:             stringField(tb, md, "uid"),
		ResourceVersion: stringField(tb, md, "resourceVersion"),
	}
}

// checkPayloads checks every payload mode of o (parsed from raw) against
// encoding/json's reading of raw.
func checkPayloads(tb testing.TB, raw []byte, o *Object) {
	tb.Helper()
	for _, keep := range []bool{false, true} {
		full := o.AppendPayload(nil, PayloadFull, keep)
		if !json.Valid(full) {
			tb.Fatalf("full payload (keep=%v) is not valid JSON: %q", keep, full)
		}
		want := decodeJSON(tb, raw).(map[string]any)
		if !keep {
			want = withoutManagedFields(tb, raw)
		}
		if got := decodeJSON(tb, full); !reflect.DeepEqual(got, any(want)) {
			tb.Fatalf("full payload (keep=%v) decodes to\n%v\nwant\n%v", keep, got, want)
		}
		if keep && !bytes.Equal(full, bytes.TrimSpace(raw)) {
			tb.Fatalf("full payload with managedFields kept is not byte-identical:\n%q\n%q", full, raw)
		}

		md := o.AppendPayload(nil, PayloadMetadata, keep)
		if !json.Valid(md) {
			tb.Fatalf("metadata payload is not valid JSON: %q", md)
		}
		wantMD := map[string]any{"apiVersion": o.Meta.APIVersion, "kind": o.Meta.Kind, "metadata": want["metadata"]}
		if got := decodeJSON(tb, md); !reflect.DeepEqual(got, any(wantMD)) {
			tb.Fatalf("metadata payload decodes to\n%v\nwant\n%v", got, wantMD)
		}
	}
	ref := o.AppendPayload(nil, PayloadReference, false)
	if !json.Valid(ref) {
		tb.Fatalf("reference payload is not valid JSON: %q", ref)
	}
	wantRef := map[string]any{
		"apiVersion": o.Meta.APIVersion, "kind": o.Meta.Kind, "name": o.Meta.Name,
		"uid": o.Meta.UID, "resourceVersion": o.Meta.ResourceVersion,
	}
	if o.Meta.Namespace != "" {
		wantRef["namespace"] = o.Meta.Namespace
	}
	if got := decodeJSON(tb, ref); !reflect.DeepEqual(got, any(wantRef)) {
		tb.Fatalf("reference payload decodes to\n%v\nwant\n%v", got, wantRef)
	}
}
