package config

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"

	yaml "go.yaml.in/yaml/v3"
)

// maxVisits bounds the work of the diagnostic walk (nodes and keys
// visited, counting each alias expansion again), so that a document that
// multiplies itself through aliases and merge keys ("billion laughs") fails
// fast instead of exhausting memory or time. A real configuration needs a
// few hundred visits; one with a thousand sources, a few tens of thousands.
const maxVisits = 200_000

// walker decodes a yaml.Node tree into a Config by reflection, following
// go.yaml.in/yaml/v3's decoding rules (FuzzParse checks that it agrees with
// the yaml package's strict decoder), and records what the yaml package
// would only report as one flat error: every unknown or duplicate key,
// every type mismatch, each with its key path and line. It is relayd's only
// decoder of a config document. It also records the
// line of every key and list item, so that validation problems found later
// can point into the file.
type walker struct {
	problems []Problem
	// failed holds the paths whose value could not be decoded; validation
	// problems at or below them are dropped as consequences.
	failed []string
	lines  map[string]int
	// scalars are the scalar values by key path, for placing problems
	// inside a value (a filter's expression).
	scalars map[string]*yaml.Node
	// active holds the alias nodes being expanded, to stop cycles.
	active map[*yaml.Node]bool
	fields map[reflect.Type]structFields
	visits int
	abort  bool
}

func newWalker() *walker {
	return &walker{
		lines:   map[string]int{},
		scalars: map[string]*yaml.Node{},
		active:  map[*yaml.Node]bool{},
		fields:  map[reflect.Type]structFields{},
	}
}

// tick counts one unit of work and reports whether the walk may go on.
func (w *walker) tick() bool {
	if w.abort {
		return false
	}
	w.visits++
	if w.visits > maxVisits {
		w.abort = true
		w.fail("", 0, "document contains excessive aliasing (too many alias or merge key expansions)")
		return false
	}
	return true
}

func (w *walker) problem(path string, line int, msg string) {
	w.problems = append(w.problems, Problem{Line: line, Path: path, Message: msg})
}

func (w *walker) fail(path string, line int, msg string) {
	w.problem(path, line, msg)
	w.failed = append(w.failed, path)
}

func (w *walker) record(path string, line int) {
	if _, ok := w.lines[path]; !ok && line > 0 {
		w.lines[path] = line
	}
}

// walk decodes n into v, which must be addressable.
func (w *walker) walk(n *yaml.Node, v reflect.Value, path string) {
	if !w.tick() {
		return
	}
	if n.Kind == yaml.AliasNode {
		if w.active[n] || n.Alias == nil {
			w.fail(path, n.Line, fmt.Sprintf("alias *%s refers to a node that contains it", n.Value))
			return
		}
		w.active[n] = true
		w.walk(n.Alias, v, path)
		delete(w.active, n)
		return
	}
	if _, ok := v.Addr().Interface().(yaml.Unmarshaler); ok {
		w.leaf(n, v, path)
		return
	}
	if v.Kind() == reflect.Pointer && reflect.PointerTo(v.Type().Elem()).Implements(unmarshalerIface) { // an optional *Duration
		if isNull(n) {
			v.SetZero()
			return
		}
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		w.leaf(n, v.Elem(), path)
		return
	}
	switch {
	case v.Kind() == reflect.Struct:
		if isNull(n) {
			return
		}
		w.mapping(n, v, path, nil)
	case v.Kind() == reflect.Pointer && v.Type().Elem().Kind() == reflect.Struct:
		if isNull(n) {
			v.SetZero()
			return
		}
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		w.mapping(n, v.Elem(), path, nil)
	case v.Kind() == reflect.Slice:
		w.sequence(n, v, path)
	default:
		w.leaf(n, v, path)
	}
}

// mapping decodes a mapping node into the struct v. merged is nil, or, while
// expanding a merge key ("<<"), the set of keys already set explicitly or by
// an earlier merged mapping, which win (YAML merge key semantics, as
// implemented by yaml.v3).
func (w *walker) mapping(n *yaml.Node, v reflect.Value, path string, merged map[string]bool) {
	if n.Kind != yaml.MappingNode {
		w.fail(path, n.Line, "expected a mapping, got "+describeNode(n))
		return
	}
	fields, ok := w.fields[v.Type()]
	if !ok {
		fields = fieldsOf(v.Type())
		w.fields[v.Type()] = fields
	}
	seen := map[string]int{}
	var mergeNode *yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		if !w.tick() {
			return
		}
		if isMergeKey(k) {
			if first, dup := seen["<<"]; dup {
				w.problem(path, k.Line, fmt.Sprintf("duplicate merge key \"<<\" (first at line %d)", first))
				continue
			}
			seen["<<"] = k.Line
			mergeNode = val
			continue
		}
		key, ok := keyName(k)
		if !ok {
			w.problem(path, k.Line, "mapping keys must be strings, got "+describeNode(resolveAlias(k)))
			continue
		}
		keyPath := joinKey(path, key)
		if first, dup := seen[key]; dup {
			w.problem(keyPath, k.Line, fmt.Sprintf("duplicate key (first at line %d)", first))
			continue
		}
		seen[key] = k.Line
		if merged != nil {
			if merged[key] {
				continue
			}
			merged[key] = true
		}
		idx, ok := fields.index[key]
		if !ok {
			w.problem(keyPath, k.Line, unknownKeyMessage(key, fields.names))
			continue
		}
		w.record(keyPath, k.Line)
		w.walk(val, v.Field(idx), keyPath)
	}
	if mergeNode == nil {
		return
	}
	if merged == nil {
		merged = map[string]bool{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			if key, ok := keyName(n.Content[i]); ok && !isMergeKey(n.Content[i]) {
				merged[key] = true
			}
		}
	}
	w.merge(mergeNode, v, path, merged)
}

// merge expands the value of a merge key: a mapping, an alias of one, or a
// list of those.
func (w *walker) merge(m *yaml.Node, v reflect.Value, path string, merged map[string]bool) {
	const want = "the merge key \"<<\" needs a mapping or a list of mappings, got "
	items := []*yaml.Node{m}
	if m.Kind == yaml.SequenceNode {
		items = m.Content
	} else if t := resolveAlias(m); t.Kind != yaml.MappingNode {
		w.fail(path, m.Line, want+describeNode(t))
		return
	}
	for _, it := range items {
		if !w.tick() {
			return
		}
		if t := resolveAlias(it); t.Kind != yaml.MappingNode {
			w.fail(path, it.Line, want+describeNode(t))
			return
		}
		if it.Kind == yaml.AliasNode {
			if w.active[it] {
				w.fail(path, it.Line, fmt.Sprintf("alias *%s refers to a node that contains it", it.Value))
				return
			}
			w.active[it] = true
			w.mapping(it.Alias, v, path, merged)
			delete(w.active, it)
			continue
		}
		w.mapping(it, v, path, merged)
	}
}

// sequence decodes a list node into the slice v.
func (w *walker) sequence(n *yaml.Node, v reflect.Value, path string) {
	if isNull(n) {
		v.SetZero()
		return
	}
	if n.Kind != yaml.SequenceNode {
		w.fail(path, n.Line, "expected a list, got "+describeNode(n))
		return
	}
	s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
	for i, it := range n.Content {
		p := path + "[" + strconv.Itoa(i) + "]"
		w.record(p, it.Line)
		if isNull(resolveAlias(it)) {
			// yaml.v3 silently drops a null item (a stray "-"); it is
			// almost certainly a mistake, so say so.
			w.fail(p, it.Line, "expected "+describeType(v.Type().Elem())+", got null")
			continue
		}
		w.walk(it, s.Index(i), p)
	}
	v.Set(s)
}

var unmarshalerIface = reflect.TypeFor[yaml.Unmarshaler]()

// leaf decodes a scalar into v with the yaml package itself, so that the
// accepted spellings are exactly yaml.v3's, but with two stricter rules:
// integers must be written as integers (yaml.v3 would truncate 1.5 to 1),
// and lists or mappings are reported with the key path.
func (w *walker) leaf(n *yaml.Node, v reflect.Value, path string) {
	if u, ok := v.Addr().Interface().(yaml.Unmarshaler); ok {
		// As in yaml.v3: a null leaves the value alone, anything else
		// goes to the type's own UnmarshalYAML, whose error we keep.
		if isNull(n) {
			return
		}
		if err := u.UnmarshalYAML(n); err != nil {
			w.fail(path, n.Line, err.Error())
		}
		return
	}
	if n.Kind == yaml.ScalarNode {
		w.scalars[path] = n
	}
	want := describeType(v.Type())
	if n.Kind != yaml.ScalarNode {
		w.fail(path, n.Line, "expected "+want+", got "+describeNode(n))
		return
	}
	k := v.Kind()
	if k == reflect.Pointer {
		k = v.Type().Elem().Kind()
	}
	if isIntKind(k) && !isNull(n) && n.ShortTag() != "!!int" {
		w.fail(path, n.Line, "expected "+want+", got "+describeNode(n))
		return
	}
	if err := n.Decode(v.Addr().Interface()); err != nil {
		w.fail(path, n.Line, "expected "+want+", got "+describeNode(n))
	}
}

// structFields maps the YAML key of each field of a struct to its index.
type structFields struct {
	index map[string]int
	names []string
}

func fieldsOf(t reflect.Type) structFields {
	f := structFields{index: map[string]int{}}
	for i := range t.NumField() {
		sf := t.Field(i)
		if !sf.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(sf.Tag.Get("yaml"), ",")
		if name == "" || name == "-" {
			continue
		}
		f.index[name] = i
		f.names = append(f.names, name)
	}
	return f
}

func isIntKind(k reflect.Kind) bool {
	switch k {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return true
	}
	return false
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// isMergeKey mirrors yaml.v3's test for the "<<" merge key.
func isMergeKey(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.Value == "<<" &&
		(n.Tag == "" || n.Tag == "!" || n.ShortTag() == "!!merge")
}

// resolveAlias follows alias nodes (bounded, in case of a malformed tree).
func resolveAlias(n *yaml.Node) *yaml.Node {
	for i := 0; i < 16 && n.Kind == yaml.AliasNode && n.Alias != nil; i++ {
		n = n.Alias
	}
	return n
}

// keyName returns the text of a scalar mapping key.
func keyName(k *yaml.Node) (string, bool) {
	k = resolveAlias(k)
	if k.Kind != yaml.ScalarNode || isNull(k) {
		return "", false
	}
	return k.Value, true
}

// joinKey appends a key to a path: "a.b", or a["x.y"] for keys that are not
// plain words, so that a path always reads back unambiguously.
func joinKey(path, key string) string {
	if !isPlainKey(key) {
		return path + "[" + strconv.Quote(key) + "]"
	}
	if path == "" {
		return key
	}
	return path + "." + key
}

func isPlainKey(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

// describeType names what a Go type expects, for "expected X" messages.
func describeType(t reflect.Type) string {
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch k := t.Kind(); {
	case k == reflect.String:
		return "a string"
	case isIntKind(k):
		return "an integer"
	case k == reflect.Float32 || k == reflect.Float64:
		return "a number"
	case k == reflect.Bool:
		return "true or false"
	case k == reflect.Slice:
		return "a list"
	case k == reflect.Struct:
		return "a mapping"
	}
	return "a " + t.String()
}

// describeNode names what a node holds, for "got X" messages.
func describeNode(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	case yaml.DocumentNode:
		return "a document"
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return "null"
		case "!!str", "!!binary", "!!timestamp":
			return strconv.Quote(n.Value)
		}
		return n.Value
	}
	return "nothing"
}

// unknownKeyMessage suggests the closest known key, or lists them all.
func unknownKeyMessage(key string, known []string) string {
	if s := suggest(key, known); s != "" {
		return fmt.Sprintf("unknown key (did you mean %q?)", s)
	}
	return "unknown key (valid keys: " + strings.Join(known, ", ") + ")"
}

// Suggest returns the element of known closest to word (ignoring case,
// within an edit distance of 2, 1 for words of up to 4 letters), or "":
// the "did you mean" of unknown keys, and of kinds no apiserver serves
// (pkg/source).
func Suggest(word string, known []string) string { return suggest(word, known) }

func suggest(key string, known []string) string {
	lk := strings.ToLower(key)
	best, bestDist := "", 0
	for _, k := range known {
		d := editDistance(lk, strings.ToLower(k))
		if d == 0 {
			return k
		}
		if best == "" || d < bestDist {
			best, bestDist = k, d
		}
	}
	limit := 2
	if len(key) <= 4 {
		limit = 1
	}
	if best != "" && bestDist <= limit {
		return best
	}
	return ""
}

// editDistance is the optimal string alignment distance (Levenshtein with
// adjacent transpositions) between a and b, in bytes. Inputs longer than
// 64 bytes are not worth a suggestion and return a large distance.
func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 1 << 30
	}
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}
