package docs

import (
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/relayd/relayd/pkg/config"
)

// configPaths returns every key path of the config file, from the yaml
// tags of config.Config: "nats.stream.name", "sources[].resource.group".
// top holds the top-level keys.
func configPaths(t *testing.T) (paths, top map[string]bool) {
	t.Helper()
	paths, top = map[string]bool{}, map[string]bool{}
	var walk func(typ reflect.Type, prefix string)
	walk = func(typ reflect.Type, prefix string) {
		for typ.Kind() == reflect.Pointer {
			typ = typ.Elem()
		}
		switch typ.Kind() {
		case reflect.Slice:
			if e := typ.Elem(); e.Kind() == reflect.Struct || e.Kind() == reflect.Pointer {
				walk(e, prefix+"[]")
			}
			return
		case reflect.Struct:
		default:
			return
		}
		for i := range typ.NumField() {
			name, _, _ := strings.Cut(typ.Field(i).Tag.Get("yaml"), ",")
			if name == "" || name == "-" {
				continue
			}
			p := name
			if prefix != "" {
				p = prefix + "." + name
			} else {
				top[name] = true
			}
			paths[p] = true
			walk(typ.Field(i).Type, p)
		}
	}
	walk(reflect.TypeFor[config.Config](), "")
	if len(top) == 0 {
		t.Fatal("config.Config has no yaml keys: the reflection finds nothing")
	}
	return paths, top
}

// keyPathRE is a dotted key path, with an optional [N] or [] after a key;
// what follows it in a span (": true", " = …") is not part of it.
var (
	keyPathRE = regexp.MustCompile(`^[a-z][A-Za-z0-9]*(?:\[\d*\])?(?:\.[a-z][A-Za-z0-9]*(?:\[\d*\])?)+`)
	indexRE   = regexp.MustCompile(`\[\d*\]`)
)

// TestDocumentedConfigKeysExist: every code span of README.md or docs/*.md
// that starts with a dotted path whose first key is a top-level config key
// (`nats.index.fingerprintKeyFile`, `watch.maxObjectBytes: 1`) names a key
// pkg/config decodes.
func TestDocumentedConfigKeysExist(t *testing.T) {
	paths, top := configPaths(t)
	seen := 0
	for _, f := range markdownFiles(t) {
		for _, s := range codeSpans(f.Text) {
			p := keyPathRE.FindString(s.text)
			if p == "" {
				continue
			}
			// A path followed by more path-like text is something else
			// (a file name, a subject, a field path with quoted names).
			if rest := s.text[len(p):]; rest != "" && !strings.HasPrefix(rest, ":") && !strings.HasPrefix(rest, " ") {
				continue
			}
			first, _, _ := strings.Cut(indexRE.ReplaceAllString(p, ""), ".")
			if !top[first] {
				continue
			}
			seen++
			if norm := indexRE.ReplaceAllString(p, "[]"); !paths[norm] {
				t.Errorf("%s:%d: `%s` names the config key %s, which pkg/config does not have", f.Rel, s.line, s.text, p)
			}
		}
	}
	if seen == 0 {
		t.Fatal("no config key path found in the docs: the scan is broken")
	}
}
