package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	yaml "go.yaml.in/yaml/v3"

	"github.com/relayd/relayd/internal/testutil"
)

var updateSchema = flag.Bool("update", false, "rewrite the config schema in deploy/helm/relayd/values.schema.json and docs/config.schema.json from Schema()")

const (
	valuesSchemaFile = "deploy/helm/relayd/values.schema.json"
	docsSchemaFile   = "docs/config.schema.json"
	regenerate       = "run `make schema` (go test ./pkg/config -run TestSchemaFilesAreGenerated -update) and commit the result"
)

// renderedSchemas returns, from Schema(), the chart's values schema with
// its properties.config replaced (the rest of the file byte for byte as
// in values) and the editors' schema.
func renderedSchemas(t *testing.T, values []byte) (chart, docs []byte) {
	t.Helper()
	s, err := Schema()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	start, end, err := configSpan(values)
	if err != nil {
		t.Fatalf("%s: %v", valuesSchemaFile, err)
	}
	chart = slices.Concat(values[:start], []byte(renderJSON(raw, "    ", len(`    "config": `))), values[end:])

	d, err := schemaGen{doc: goDocs(t)}.config()
	if err != nil {
		t.Fatal(err)
	}
	d.Schema, d.Title = "http://json-schema.org/draft-07/schema#", "relayd configuration file"
	if raw, err = json.Marshal(d); err != nil {
		t.Fatal(err)
	}
	return chart, []byte(renderJSON(raw, "", 0) + "\n")
}

// goDocs returns the Go doc comment of each field of pkg/config's structs,
// on one line, for the descriptions of docs/config.schema.json.
func goDocs(t *testing.T) func(reflect.Type, reflect.StructField) string {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	docs := map[string]string{}
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok {
				return true
			}
			if st, ok := ts.Type.(*ast.StructType); ok {
				for _, fld := range st.Fields.List {
					for _, name := range fld.Names {
						docs[ts.Name.Name+"."+name.Name] = strings.Join(strings.Fields(fld.Doc.Text()), " ")
					}
				}
			}
			return false
		})
	}
	// "Cluster names ..." reads "cluster names ..." (its key) in an editor.
	return func(st reflect.Type, f reflect.StructField) string {
		d := docs[st.Name()+"."+f.Name]
		if rest, ok := strings.CutPrefix(d, f.Name+" "); ok {
			key, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			d = key + " " + rest
		}
		return d
	}
}

// TestSchemaFilesAreGenerated: the committed schemas are what Schema()
// derives from the config structs now.
func TestSchemaFilesAreGenerated(t *testing.T) {
	root := testutil.RepoRootT(t)
	values, err := os.ReadFile(filepath.Join(root, valuesSchemaFile))
	if err != nil {
		t.Fatal(err)
	}
	chart, docs := renderedSchemas(t, values)
	for _, f := range []struct {
		path string
		want []byte
	}{{valuesSchemaFile, chart}, {docsSchemaFile, docs}} {
		path := filepath.Join(root, f.path)
		if *updateSchema {
			if err := os.WriteFile(path, f.want, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Errorf("%v: %s", err, regenerate)
			continue
		}
		if !bytes.Equal(got, f.want) {
			t.Errorf("%s is not the schema of pkg/config's structs now (first difference at line %d): %s", f.path, firstDiffLine(got, f.want), regenerate)
		}
	}
}

func firstDiffLine(a, b []byte) int {
	la, lb := strings.Split(string(a), "\n"), strings.Split(string(b), "\n")
	for i := range min(len(la), len(lb)) {
		if la[i] != lb[i] {
			return i + 1
		}
	}
	return min(len(la), len(lb)) + 1
}

// configSpan finds the bytes of the value of properties.config in a JSON
// object.
func configSpan(data []byte) (start, end int, err error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	inObject := func() error {
		if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
			return fmt.Errorf("expected an object (%v)", err)
		}
		return nil
	}
	// seek reads keys of the current object up to key, skipping the
	// values of the others.
	seek := func(key string) error {
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				return err
			}
			if tok == key {
				return nil
			}
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return err
			}
		}
		return fmt.Errorf("no key %q", key)
	}
	if err := inObject(); err != nil {
		return 0, 0, err
	}
	if err := seek("properties"); err != nil {
		return 0, 0, err
	}
	if err := inObject(); err != nil {
		return 0, 0, err
	}
	if err := seek("config"); err != nil {
		return 0, 0, err
	}
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return 0, 0, err
	}
	end = int(dec.InputOffset())
	start = end - len(raw)
	if !bytes.Equal(data[start:end], raw) {
		return 0, 0, errors.New("cannot locate properties.config")
	}
	return start, end, nil
}

// jsonNode is a JSON value with its object keys in document order.
type jsonNode struct {
	keys   []string
	vals   []*jsonNode
	object bool
	array  bool
	scalar string
}

func parseJSON(dec *json.Decoder) (*jsonNode, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	n := &jsonNode{}
	switch tok {
	case json.Delim('{'), json.Delim('['):
		n.object, n.array = tok == json.Delim('{'), tok == json.Delim('[')
		for dec.More() {
			if n.object {
				k, err := dec.Token()
				if err != nil {
					return nil, err
				}
				n.keys = append(n.keys, k.(string))
			}
			v, err := parseJSON(dec)
			if err != nil {
				return nil, err
			}
			n.vals = append(n.vals, v)
		}
		_, err = dec.Token()
		return n, err
	}
	n.scalar = jsonText(tok)
	return n, nil
}

// jsonText is v in JSON, without escaping <, > and &.
func jsonText(v any) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		panic(err)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// inline is n on one line, in the chart schema's style ({"a": 1, "b": [2]}).
func (n *jsonNode) inline() string {
	if !n.object && !n.array {
		return n.scalar
	}
	parts := make([]string, len(n.vals))
	for i, v := range n.vals {
		if n.object {
			parts[i] = jsonText(n.keys[i]) + ": "
		}
		parts[i] += v.inline()
	}
	if n.object {
		return "{" + strings.Join(parts, ", ") + "}"
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// pretty is n on one line when that fits in 120 columns from column col,
// else one member a line, indented under indent.
func (n *jsonNode) pretty(indent string, col int) string {
	if s := n.inline(); col+len(s) <= 120 || len(n.vals) == 0 {
		return s
	}
	var b strings.Builder
	open, closing := "[", "]"
	if n.object {
		open, closing = "{", "}"
	}
	b.WriteString(open + "\n")
	in := indent + "  "
	for i, v := range n.vals {
		line := in
		if n.object {
			line += jsonText(n.keys[i]) + ": "
		}
		b.WriteString(line + v.pretty(in, len(line)))
		if i < len(n.vals)-1 {
			b.WriteString(",")
		}
		b.WriteString("\n")
	}
	b.WriteString(indent + closing)
	return b.String()
}

// renderJSON formats the JSON value raw for a line indented by indent, at
// column col.
func renderJSON(raw []byte, indent string, col int) string {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	n, err := parseJSON(dec)
	if err != nil {
		panic(err)
	}
	return n.pretty(indent, col)
}

// compiledSchema is Schema(), compiled by the JSON Schema validator helm
// uses.
func compiledSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	s, err := Schema()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft7)
	if err := c.AddResource("config.schema.json", doc); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile("config.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	return sch
}

// schemaErrors validates a YAML document against the schema as helm does
// (YAML read into JSON values), and returns the instance location and
// message of each leaf error, e.g. "/sources/0: additional properties
// 'namespace' not allowed"; nil when it validates.
func schemaErrors(t *testing.T, sch *jsonschema.Schema, doc []byte) []string {
	t.Helper()
	var v any
	if err := yaml.Unmarshal(doc, &v); err != nil {
		t.Fatal(err)
	}
	return validateValue(t, sch, v)
}

// validateValue is schemaErrors of a YAML document already decoded.
func validateValue(t *testing.T, sch *jsonschema.Schema, v any) []string {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	err = sch.Validate(inst)
	if err == nil {
		return nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		t.Fatal(err)
	}
	var out []string
	var leaves func(e *jsonschema.ValidationError)
	leaves = func(e *jsonschema.ValidationError) {
		if len(e.Causes) == 0 {
			out = append(out, e.Error()) // at '/sources/0': additional properties 'namespace' not allowed
		}
		for _, c := range e.Causes {
			leaves(c)
		}
	}
	leaves(ve)
	return out
}
