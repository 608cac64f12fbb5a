package filter

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"testing"

	"github.com/relayd/relayd/pkg/event"
)

// fuzzExprs are evaluated on every fuzzed input.
var fuzzExprs = []string{
	`object.kind == 'Pod'`,
	`has(object.metadata.name) && object.metadata.name.startsWith('a')`,
	`object.spec.containers.exists(c, c.image.matches('^r'))`,
	`object.exists(k, has(object.a) || k == 'x')`,
	`size(object) > 1 && object.l[0] == object.a`,
	`object.?status.?phase.orValue('') == 'Running'`,
	`object == {'a': 1}`,
	`object.l.all(e, e in object.l)`,
}

// FuzzMatch: Match never panics, and on valid JSON objects without
// duplicate keys it gives what the decoded map gives.
func FuzzMatch(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":1,"l":[1,2]}`, `{"kind":"Pod","metadata":{"name":"a\u0062"}}`,
		`{"spec":{"containers":[{"image":"r1"},{"image":"x"}]}}`, `{"a":1.5e3,"x":null}`, `{"a":[`, `{"a" 1}`} {
		f.Add([]byte(s))
	}
	if raw, err := os.ReadFile("../event/testdata/pod.json"); err == nil {
		f.Add(raw)
	}
	filters := make([]*Filter, len(fuzzExprs))
	for i, e := range fuzzExprs {
		filters[i] = mustCompile(f, e)
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		ref, rerr := decodeJSON(raw)
		_, isObj := ref.(map[string]any)
		comparable := rerr == nil && isObj && !duplicateKeys(raw)
		for i, flt := range filters {
			got, gerr := flt.Match(raw)
			if !comparable {
				continue
			}
			want, werr := flt.matchValue(ref)
			if got != want || (gerr == nil) != (werr == nil) {
				t.Fatalf("%s on %q: lazy %v, %v; decoded %v, %v", fuzzExprs[i], raw, got, gerr, want, werr)
			}
			// The validated path (MatchParsed) on valid JSON.
			if got, _, gerr = flt.match(raw, true); got != want || (gerr == nil) != (werr == nil) {
				t.Fatalf("%s on %q (valid): lazy %v, %v; decoded %v, %v", fuzzExprs[i], raw, got, gerr, want, werr)
			}
			// On the members the parse found, when it takes raw.
			if obj, err := event.ParseObject(raw); err == nil {
				if got, gerr = flt.MatchParsed(&obj); got != want || (gerr == nil) != (werr == nil) {
					t.Fatalf("%s on %q (parsed): lazy %v, %v; decoded %v, %v", fuzzExprs[i], raw, got, gerr, want, werr)
				}
			}
		}
	})
}

// duplicateKeys reports whether valid JSON data has an object with a key
// twice (encoding/json keeps the last, the lazy value the first).
func duplicateKeys(data []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(data))
	type frame struct {
		obj  bool
		key  bool
		seen map[string]bool
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return false
		}
		if err != nil {
			return false
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if top != nil && top.obj && top.key {
			if d, ok := tok.(json.Delim); !ok || d != '}' {
				k := tok.(string)
				if top.seen[k] {
					return true
				}
				top.seen[k] = true
				top.key = false
				continue
			}
		}
		if top != nil && top.obj && !top.key {
			top.key = true
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{obj: true, key: true, seen: map[string]bool{}})
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
