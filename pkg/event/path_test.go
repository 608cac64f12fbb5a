package event

import (
	"errors"
	"reflect"
	"testing"
)

func TestParsePath(t *testing.T) {
	tests := []struct {
		in    string
		segs  []pathSeg
		canon string // "" means in itself
	}{
		{"spec", []pathSeg{{name: "spec"}}, ""},
		{"spec.replicas", []pathSeg{{name: "spec"}, {name: "replicas"}}, ""},
		{"spec.template.spec.containers[*].env", []pathSeg{{name: "spec"}, {name: "template"}, {name: "spec"}, {name: "containers"}, {all: true}, {name: "env"}}, ""},
		{"spec.containers[*].env[*].valueFrom", []pathSeg{{name: "spec"}, {name: "containers"}, {all: true}, {name: "env"}, {all: true}, {name: "valueFrom"}}, ""},
		{"a[*][*].b", []pathSeg{{name: "a"}, {all: true}, {all: true}, {name: "b"}}, ""},
		{`metadata.annotations["example.com/token"]`, []pathSeg{{name: "metadata"}, {name: "annotations"}, {name: "example.com/token"}}, ""},
		{`metadata.annotations["kubectl.kubernetes.io/last-applied-configuration"]`, []pathSeg{{name: "metadata"}, {name: "annotations"}, {name: LastAppliedAnnotation}}, ""},
		{`data["tls.key"]`, []pathSeg{{name: "data"}, {name: "tls.key"}}, ""},
		{`["spec"].x`, []pathSeg{{name: "spec"}, {name: "x"}}, "spec.x"},
		{`a["b"]["c"]`, []pathSeg{{name: "a"}, {name: "b"}, {name: "c"}}, "a.b.c"},
		{`a[*]["b"]`, []pathSeg{{name: "a"}, {all: true}, {name: "b"}}, "a[*].b"},
		{`a[""]`, []pathSeg{{name: "a"}, {name: ""}}, ""},
		{`a["say \"hi\" \\ \/"]`, []pathSeg{{name: "a"}, {name: `say "hi" \ /`}}, `a["say \"hi\" \\ /"]`},
		{`a["\u0041\n\t\r\b\f\u0001\u007f"]`, []pathSeg{{name: "a"}, {name: "A\n\t\r\b\f\x01\x7f"}}, `a["A\n\t\r\b\f\u0001\u007f"]`},
		{`a["x,y"]`, []pathSeg{{name: "a"}, {name: "x,y"}}, `a["x\u002cy"]`},
		{`a["grüße 日本"]`, []pathSeg{{name: "a"}, {name: "grüße 日本"}}, ""},
		{`a["\ud83d\ude00"]`, []pathSeg{{name: "a"}, {name: "😀"}}, `a["😀"]`},
		{"x-kubernetes_1.0", []pathSeg{{name: "x-kubernetes_1"}, {name: "0"}}, ""},
		{`a["*"]`, []pathSeg{{name: "a"}, {name: "*"}}, ""},
		{`a["0"]`, []pathSeg{{name: "a"}, {name: "0"}}, "a.0"},
	}
	for _, tt := range tests {
		p, err := ParsePath(tt.in)
		if err != nil {
			t.Errorf("ParsePath(%q): %v", tt.in, err)
			continue
		}
		if !reflect.DeepEqual(p.segs, tt.segs) {
			t.Errorf("ParsePath(%q) = %#v, want %#v", tt.in, p.segs, tt.segs)
		}
		canon := tt.canon
		if canon == "" {
			canon = tt.in
		}
		if got := p.String(); got != canon {
			t.Errorf("ParsePath(%q).String() = %q, want %q", tt.in, got, canon)
		}
		q, err := ParsePath(p.String())
		if err != nil || !q.Equal(p) {
			t.Errorf("String %q does not round-trip: %v, %v", p.String(), q, err)
		}
		if p.Len() != len(tt.segs) {
			t.Errorf("Len = %d", p.Len())
		}
	}
}

func TestParsePathErrors(t *testing.T) {
	tests := []struct {
		in, want string
		offset   int
	}{
		{"", "empty path", -1},
		{".spec", "empty member name at offset 0", 0},
		{"spec..x", "empty member name at offset 5", 5},
		{"spec.", "empty member name at offset 5", 5},
		{"metadata]", `unexpected "]" at offset 8`, 8},
		{"spec.a]b", `unexpected "]" at offset 6`, 6},
		{"spec.ports[0]", "[N] indexes are not supported (use [*]) at offset 10", 10},
		{"a[-1]", "[N] indexes are not supported (use [*]) at offset 1", 1},
		{`metadata.annotations["example.com/token`, "unterminated quoted member name starting at offset 20", 20},
		{`a["x\`, "unterminated quoted member name starting at offset 1", 1},
		{`a["x"`, `unterminated "[" at offset 1`, 1},
		{`a["x"x`, `unexpected "x" at offset 5 (want "]" after the quoted member name)`, 5},
		{"a[", `unterminated "[" at offset 1`, 1},
		{"a[*", `unterminated "[" at offset 1`, 1},
		{"a[*x", `unexpected "x" at offset 3 (write member names with characters other than letters, digits, '_' and '-' as ["..."])`, 3},
		{"a[x]", `unexpected "x" at offset 2 (write member names with characters other than letters, digits, '_' and '-' as ["..."])`, 2},
		{"[*].a", "[*] must follow a member name at offset 0", 0},
		{`a.["b"]`, `unexpected "[" at offset 2 (no "." before "[")`, 2},
		{"metadata.annotations.example.com/token", `unexpected "/" at offset 32 (write member names with characters other than letters, digits, '_' and '-' as ["..."])`, 32},
		{"a b", `unexpected " " at offset 1 (write member names with characters other than letters, digits, '_' and '-' as ["..."])`, 1},
		{"grüße", `unexpected "ü" at offset 2 (write member names with characters other than letters, digits, '_' and '-' as ["..."])`, 2},
		{"a\xff", `unexpected byte 0xff at offset 1 (write member names with characters other than letters, digits, '_' and '-' as ["..."])`, 1},
		{`a["\q"]`, `invalid escape "\\q" at offset 3`, 3},
		{`a["\u12"]`, `invalid \u escape at offset 3 (want four hex digits)`, 3},
		{`a["\ud800"]`, `invalid \u escape at offset 3 (unpaired surrogate)`, 3},
		{`a["\ud800\u0041"]`, `invalid \u escape at offset 3 (unpaired surrogate)`, 3},
		{"a[\"\x01\"]", `control character "\x01" in quoted member name at offset 3 (write it as a \u escape)`, 3},
		{"a[\"\xff\"]", "invalid UTF-8 at offset 3", 3},
		{"a*", `unexpected "*" at offset 1`, 1},
		{`a"b"`, `unexpected "\"" at offset 1`, 1},
	}
	for _, tt := range tests {
		_, err := ParsePath(tt.in)
		if err == nil {
			t.Errorf("ParsePath(%q) succeeded, want %q", tt.in, tt.want)
			continue
		}
		if err.Error() != tt.want {
			t.Errorf("ParsePath(%q) error\n got %s\nwant %s", tt.in, err, tt.want)
		}
		var pe *PathError
		if !errors.As(err, &pe) || pe.Offset != tt.offset {
			t.Errorf("ParsePath(%q): error %T %+v, want a *PathError at offset %d", tt.in, err, pe, tt.offset)
		}
	}
}

func TestZeroPath(t *testing.T) {
	var p Path
	if p.String() != "" || p.Len() != 0 || !p.Equal(Path{}) {
		t.Errorf("zero Path: %q %d", p.String(), p.Len())
	}
}
