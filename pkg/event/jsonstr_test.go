package event

import (
	"bytes"
	"encoding/json"
	"testing"
)

// encodingJSONString is what encoding/json writes for s with HTML escaping
// off.
func encodingJSONString(tb testing.TB, s string) string {
	tb.Helper()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s); err != nil {
		tb.Fatal(err)
	}
	return string(bytes.TrimSuffix(buf.Bytes(), []byte("\n")))
}

var jsonStringSeeds = []string{
	"", "plain", `quote"`, `back\slash`, "nl\n cr\r tab\t bs\b ff\f", "\x00\x01\x1f\x7f",
	"<script>&amp;</script>", "ü日本😀", "\u2028\u2029", "\xff", "a\xc3", "\xed\xa0\x80", // invalid UTF-8, encoded surrogate
	"\xef\xbf\xbd", "mixed \"\\\n\xfe ok",
}

func TestAppendJSONString(t *testing.T) {
	for _, s := range jsonStringSeeds {
		got := string(appendJSONString([]byte("x"), s))[1:]
		if want := encodingJSONString(t, s); got != want {
			t.Errorf("appendJSONString(%q) = %s, encoding/json %s", s, got, want)
		}
	}
}

func FuzzAppendJSONString(f *testing.F) {
	for _, s := range jsonStringSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := appendJSONString(nil, s)
		if want := encodingJSONString(t, s); string(got) != want {
			t.Fatalf("appendJSONString(%q) = %s, encoding/json %s", s, got, want)
		}
		// And the scanner reads it back as encoding/json does.
		end, flags, err := scanString(got, 0)
		if err != nil || end != len(got) {
			t.Fatalf("scanString(%s) = %d, %v", got, end, err)
		}
		var dec string
		if err := json.Unmarshal(got, &dec); err != nil {
			t.Fatal(err)
		}
		inner := got[1 : len(got)-1]
		if stringIsPlain(inner, flags) {
			if string(inner) != dec {
				t.Fatalf("plain %q decodes to %q", inner, dec)
			}
		} else if u := string(appendUnquoted(nil, inner)); u != dec {
			t.Fatalf("appendUnquoted(%s) = %q, encoding/json %q", inner, u, dec)
		}
	})
}
