package config

import (
	"testing"
)

func filterDoc(filterLines string) []byte {
	return []byte("cluster: dev\nnats:\n  url: nats://127.0.0.1:4222\n  stream: {name: K8S}\nsources:\n  - name: p\n    apiVersion: v1\n    kind: Pod\n" + filterLines)
}

// TestFilterPositions: a problem inside the expression is placed at the
// file's line and column where the text before it is in the file
// verbatim, else at the line only.
func TestFilterPositions(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		// An escape after the position does not matter.
		{`    filter: "x == 1 && object.kind == '\x50od'"` + "\n", `f.yaml:9:14: sources[0].filter: invalid expression at column 1: undeclared reference to 'x'`},
		// An escape before it moves the text: the line only.
		{`    filter: "object.kind == '\x50od' && x == 1"` + "\n", `f.yaml:9: sources[0].filter: invalid expression at column 25: undeclared reference to 'x'`},
		{`    filter: 'object.kind == ''Pod'' && x'` + "\n", `f.yaml:9: sources[0].filter: invalid expression at column 25: undeclared reference to 'x'`},
		// Multi-byte characters count as one column, in both.
		{`    filter: "'é' == 'é' && y"` + "\n", `f.yaml:9:28: sources[0].filter: invalid expression at column 15: undeclared reference to 'y'`},
		// A plain scalar folded over two lines: the second line is the
		// first's continuation, not in the file as it.
		{"    filter: object.kind == 'Pod' &&\n      z\n", `f.yaml:9: sources[0].filter: invalid expression at column 25: undeclared reference to 'z'`},
		{"    filter: |-\n      object.kind == 'Pod' &&\n\n        w\n", `f.yaml:12:9: sources[0].filter: invalid expression at line 3, column 3: undeclared reference to 'w'`},
	} {
		_, err := Parse(filterDoc(tc.doc), "f.yaml")
		if err == nil || err.Error() != tc.want {
			t.Errorf("%s\ngot  %v\nwant %s", tc.doc, err, tc.want)
		}
	}
}

// A Config built in Go has no file: the problem names the key and the
// position in the expression only.
func TestFilterProblemWithoutFile(t *testing.T) {
	cfg, err := Parse(filterDoc(""), "f.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c := *cfg
	c.origin = nil
	c.Sources = []Source{cfg.Sources[0]}
	c.Sources[0].Filter = "object.kind == 'Pod' && q"
	err = c.Validate()
	const want = `sources[0].filter: invalid expression at column 25: undeclared reference to 'q'`
	if err == nil || err.Error() != want {
		t.Errorf("Validate: %v, want %s", err, want)
	}
	c.Sources[0].Filter = "object.kind == 'Pod'"
	if err := c.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
}
