package docs

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/relayd/relayd/internal/testutil"
	"github.com/relayd/relayd/pkg/event"
)

// extRE matches a CloudEvents extension name of relayd: k8s… or relayd…
// followed by lower-case letters only (CloudEvents attribute names are
// [a-z0-9]; relayd's have no digits). "k8s.prod.>", "relayd_events_total"
// and "relayd-index-<cluster>" do not match.
var extRE = regexp.MustCompile(`\b(?:k8s|relayd)[a-z]+\b`)

// envelopeExtensions are the extension names pkg/event decodes: the JSON
// names of event.Envelope's fields that start with k8s or relayd.
func envelopeExtensions(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	typ := reflect.TypeFor[event.Envelope]()
	for i := range typ.NumField() {
		name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
		if extRE.MatchString(name) && extRE.FindString(name) == name {
			out[name] = true
		}
	}
	if len(out) == 0 {
		t.Fatal("event.Envelope has no k8s*/relayd* fields: the reflection finds nothing")
	}
	return out
}

// writtenExtensions are the extension names in the string literals of
// pkg/event's non-test code: what the encoders write (`,"relaydoversize":true`,
// HeaderPrefix+"k8sname") and the names the decoders accept
// (event.LegacyFinalUnknown). A name the encoder writes but Envelope does
// not decode is found here.
func writtenExtensions(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, f := range eventFiles(t) {
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range extRE.FindAllString(s, -1) {
				out[m] = true
			}
			return true
		})
	}
	return out
}

// eventFiles parses pkg/event's non-test Go files.
func eventFiles(t *testing.T) []*ast.File {
	t.Helper()
	dir := filepath.Join(testutil.RepoRootT(t), "pkg", "event")
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var out []*ast.File
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, f)
	}
	if len(out) == 0 {
		t.Fatalf("no Go files in %s", dir)
	}
	return out
}

// legacyExtensions are the values of pkg/event's exported string constants
// named Legacy… that are extension names: names older relayd builds wrote,
// which the decoders still accept (event.LegacyFinalUnknown).
func legacyExtensions(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, f := range eventFiles(t) {
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			for _, sp := range g.Specs {
				vs := sp.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if !strings.HasPrefix(n.Name, "Legacy") || i >= len(vs.Values) {
						continue
					}
					if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
						if v, err := strconv.Unquote(lit.Value); err == nil && extRE.FindString(v) == v {
							out[v] = true
						}
					}
				}
			}
		}
	}
	return out
}

// codeExtensions is every extension name pkg/event knows.
func codeExtensions(t *testing.T) map[string]bool {
	t.Helper()
	out := envelopeExtensions(t)
	for n := range writtenExtensions(t) {
		out[n] = true
	}
	return out
}

// schemaExtensions are the k8s*/relayd* property names of
// docs/event.schema.json, wherever they appear in it.
func schemaExtensions(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testutil.RepoRootT(t), "docs", "event.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatalf("docs/event.schema.json: %v", err)
	}
	out := map[string]bool{}
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if props, ok := v["properties"].(map[string]any); ok {
				for k := range props {
					if extRE.FindString(k) == k {
						out[k] = true
					}
				}
			}
			for _, c := range v {
				walk(c)
			}
		case []any:
			for _, c := range v {
				walk(c)
			}
		}
	}
	walk(doc)
	return out
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// olderRE: words that say a paragraph speaks of what older builds did.
var olderRE = regexp.MustCompile(`(?i)\b(?:older|earlier|before|legacy|previous)\b`)

// TestDocumentedExtensionsExist: every k8s*/relayd* word in a code span of
// README.md or docs/*.md is an extension name pkg/event knows, and a legacy
// name (one older builds wrote) appears only in a paragraph, list item or
// table row that speaks of older builds, never as today's name.
func TestDocumentedExtensionsExist(t *testing.T) {
	code, legacy := codeExtensions(t), legacyExtensions(t)
	if len(legacy) == 0 {
		t.Fatal("pkg/event has no Legacy… extension constant: the scan is broken (or the legacy name was dropped: remove this check)")
	}
	seen := 0
	for _, f := range markdownFiles(t) {
		for _, s := range codeSpans(f.Text) {
			for _, name := range extRE.FindAllString(s.text, -1) {
				seen++
				if !code[name] {
					t.Errorf("%s:%d: `%s` names the extension %q, which pkg/event neither writes nor decodes (it knows %s)",
						f.Rel, s.line, s.text, name, strings.Join(sortedKeys(code), ", "))
				}
			}
		}
		for _, b := range testutil.MarkdownBlocks(f.Text) {
			for _, name := range sortedKeys(legacy) {
				if strings.Contains(b.Text, "`"+name) && !olderRE.MatchString(b.Text) {
					t.Errorf("%s:%d: names %q, which only older relayd builds wrote, without saying so (today's name is in pkg/event's Envelope)", f.Rel, b.Line, name)
				}
			}
		}
	}
	if seen == 0 {
		t.Fatal("no extension name found in any code span of the docs: the scan is broken")
	}
}

// TestExtensionsAreDocumented: every extension pkg/event writes or decodes
// is named in a code span of docs/CONSUMING.md, and the JSON Schema
// describes exactly the ones Envelope decodes (the legacy name, accepted
// only when reading, is not in the schema).
func TestExtensionsAreDocumented(t *testing.T) {
	f := readMarkdown(t, "docs/CONSUMING.md")
	documented := map[string]bool{}
	for _, s := range codeSpans(f.Text) {
		for _, name := range extRE.FindAllString(s.text, -1) {
			documented[name] = true
		}
	}
	for _, name := range sortedKeys(codeExtensions(t)) {
		if !documented[name] {
			t.Errorf("pkg/event knows the extension %q, but docs/CONSUMING.md does not name it in a code span", name)
		}
	}
	env, schema := envelopeExtensions(t), schemaExtensions(t)
	for _, name := range sortedKeys(env) {
		if !schema[name] {
			t.Errorf("event.Envelope decodes %q, which docs/event.schema.json does not describe", name)
		}
	}
	for _, name := range sortedKeys(schema) {
		if !env[name] {
			t.Errorf("docs/event.schema.json describes %q, which event.Envelope does not decode", name)
		}
	}
}
