package event

import (
	"errors"
	"strings"
	"testing"
)

func TestScanList(t *testing.T) {
	page := []byte(` {"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"42","continue":"abc"},` +
		`"items":[{"metadata":{"name":"a"}} , {"metadata":{"name":"b","annotations":{"x":"[]{}"}}}]}`)
	var items []string
	meta, err := ScanList(page, func(b []byte) error {
		items = append(items, string(b))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if string(meta) != `{"resourceVersion":"42","continue":"abc"}` {
		t.Errorf("metadata = %s", meta)
	}
	want := []string{`{"metadata":{"name":"a"}}`, `{"metadata":{"name":"b","annotations":{"x":"[]{}"}}}`}
	if strings.Join(items, "|") != strings.Join(want, "|") {
		t.Errorf("items = %q, want %q", items, want)
	}
	// Escaped keys are still the keys; items null and empty are no items.
	for _, p := range []string{`{"\u0069tems":[],"metadata":{}}`, `{"items":null,"metadata":{}}`, `{"metadata":{}}`} {
		n := 0
		meta, err := ScanList([]byte(p), func([]byte) error { n++; return nil })
		if err != nil || n != 0 || string(meta) != "{}" {
			t.Errorf("%s: items %d, metadata %s, err %v", p, n, meta, err)
		}
	}
}

func TestScanListAliasesThePage(t *testing.T) {
	page := []byte(`{"items":[{"a":1}]}`)
	var got []byte
	if _, err := ScanList(page, func(b []byte) error { got = b; return nil }); err != nil {
		t.Fatal(err)
	}
	page[12] = 'b' // the item's first key
	if string(got) != `{"b":1}` {
		t.Errorf("item %s does not alias the page", got)
	}
}

func TestScanListErrors(t *testing.T) {
	stop := errors.New("stop")
	for _, c := range []struct{ page, want string }{
		{``, "list response is empty"},
		{`[]`, "list response is not a JSON object"},
		{`{"items":{}}`, "list response items is not an array"},
		{`{"items":[1]}`, "list response item is not a JSON object"},
		{`{"items":[{"a":1}`, "truncated JSON"},
		{`{"items":[{"a":1}],"metadata":{"x":}}`, "invalid JSON"},
		{`{"items":[{"a":1}]`, "truncated JSON"},
	} {
		_, err := ScanList([]byte(c.page), func([]byte) error { return nil })
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: err %v, want %q", c.page, err, c.want)
		}
	}
	n := 0
	_, err := ScanList([]byte(`{"items":[{},{},{}]}`), func([]byte) error { n++; return stop })
	if !errors.Is(err, stop) || n != 1 {
		t.Errorf("item error: got %v after %d items, want stop after 1", err, n)
	}
}
