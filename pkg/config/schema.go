package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"

	yaml "go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/util/validation"
)

// JSONSchema is a JSON Schema (draft-07) node, as much of the vocabulary
// as Schema needs. Its fields marshal in declaration order.
type JSONSchema struct {
	Schema      string `json:"$schema,omitempty"`
	Title       string `json:"title,omitempty"`
	Description string `json:"description,omitempty"`
	// Type is a type name or a list of them.
	Type                 any           `json:"type,omitempty"`
	Enum                 []string      `json:"enum,omitempty"`
	Const                any           `json:"const,omitempty"`
	Pattern              string        `json:"pattern,omitempty"`
	MaxLength            int           `json:"maxLength,omitempty"`
	MinLength            int           `json:"minLength,omitempty"`
	Minimum              *float64      `json:"minimum,omitempty"`
	Maximum              *float64      `json:"maximum,omitempty"`
	Not                  *JSONSchema   `json:"not,omitempty"`
	Required             []string      `json:"required,omitempty"`
	AdditionalProperties *bool         `json:"additionalProperties,omitempty"`
	Properties           Properties    `json:"properties,omitempty"`
	Items                *JSONSchema   `json:"items,omitempty"`
	MinItems             int           `json:"minItems,omitempty"`
	MaxItems             *int          `json:"maxItems,omitempty"`
	UniqueItems          bool          `json:"uniqueItems,omitempty"`
	AnyOf                []*JSONSchema `json:"anyOf,omitempty"`
	// If and Then state a rule between the keys of an object (see
	// schemaRuler).
	If   *JSONSchema `json:"if,omitempty"`
	Then *JSONSchema `json:"then,omitempty"`
}

// schemaRuler is implemented by the struct types of the configuration
// with a rule between their keys that a JSON Schema can state as if/then:
// object adds it to the type's schema.
type schemaRuler interface {
	schemaRule() (ifs, then *JSONSchema)
}

// Property is one entry of JSONSchema.Properties.
type Property struct {
	Name   string
	Schema *JSONSchema
}

// Properties are the properties of an object schema, in the order of the
// struct fields they come from.
type Properties []Property

// MarshalJSON writes p as a JSON object in its order.
func (p Properties) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, prop := range p {
		if i > 0 {
			b.WriteByte(',')
		}
		k, err := json.Marshal(prop.Name)
		if err != nil {
			return nil, err
		}
		v, err := json.Marshal(prop.Schema)
		if err != nil {
			return nil, err
		}
		b.Write(k)
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// SchemaDescriber is implemented by the scalar types of the configuration
// whose values reflection cannot describe: a type that reads its own YAML
// (Duration) or has a fixed set of values (Mode, Storage, Payload,
// Initial, EventType). Schema takes their JSONSchema as is. A type that
// implements yaml.Unmarshaler must implement it: Schema fails otherwise.
type SchemaDescriber interface {
	JSONSchema() *JSONSchema
}

// Schema returns the JSON Schema of the configuration file, derived by
// reflection from Config: every key (its yaml tag) with its type, no other
// keys at any level, the required keys, the values of each enumerated
// type, durations as the strings Duration accepts, and the names relayd
// holds to a syntax (a field's `schema` tag: see stringFormats). What a
// JSON Schema cannot say (rules between fields, ranges, selectors,
// shaping paths, URLs) only Parse and `relayd check-config` check
// (docs/CONFIGURATION.md, "Editor and chart schema"). The chart's
// values.schema.json holds it as properties.config, docs/config.schema.json
// for editors; `make schema` writes both.
func Schema() (*JSONSchema, error) {
	return schemaGen{}.config()
}

// schemaGen derives a schema; doc, if set, gives the description of a
// field of a struct type (docs/config.schema.json takes the Go doc
// comments, for editors).
type schemaGen struct {
	doc func(t reflect.Type, f reflect.StructField) string
}

func (g schemaGen) config() (*JSONSchema, error) {
	s, err := g.of(reflect.TypeFor[Config](), fieldTag{})
	if err != nil {
		return nil, err
	}
	s.Description = "relayd's config file (every key: config.example.yaml; reference: pkg/config). " +
		"Generated from pkg/config by `make schema`; `relayd check-config` also checks what a schema cannot (docs/CONFIGURATION.md)."
	return s, nil
}

// fieldTag is a field's `schema` tag: "required", "unique" (a list without
// duplicates) and the name of a string format, comma-separated.
type fieldTag struct {
	required, unique bool
	format           string
}

func parseFieldTag(tag string) (fieldTag, error) {
	var f fieldTag
	for opt := range strings.SplitSeq(tag, ",") {
		switch opt {
		case "":
		case "required":
			f.required = true
		case "unique":
			f.unique = true
		default:
			if _, ok := stringFormats[opt]; !ok {
				return f, fmt.Errorf("unknown schema tag option %q", opt)
			}
			f.format = opt
		}
	}
	return f, nil
}

// stringFormat is a syntax relayd holds a string to, as a JSON Schema
// pattern and as the Go check Validate applies (compared by the tests).
type stringFormat struct {
	// body is the pattern without anchors; an optional key also takes "".
	body      string
	maxLength int
	// not is a value the pattern admits that relayd refuses.
	not   string
	valid func(string) bool
}

const (
	dns1123LabelRE     = `[a-z0-9]([-a-z0-9]*[a-z0-9])?`
	dns1123SubdomainRE = dns1123LabelRE + `(\.` + dns1123LabelRE + `)*`
	tokenRE            = `[A-Za-z0-9_-]+`
)

// stringFormats are the names a `schema` tag may give.
var stringFormats = map[string]stringFormat{
	"token":            {body: tokenRE, valid: isToken},
	"subjectPrefix":    {body: tokenRE + `(\.` + tokenRE + `)*`, valid: isSubjectPrefix},
	"dns1123Label":     {body: dns1123LabelRE, maxLength: 63, valid: isDNS1123Label},
	"dns1123Subdomain": {body: dns1123SubdomainRE, maxLength: 253, valid: isDNS1123Subdomain},
	"dns1035Label":     {body: `[a-z]([-a-z0-9]*[a-z0-9])?`, maxLength: 63, valid: isDNS1035Label},
	"apiGroup": {body: dns1123SubdomainRE, maxLength: 253, not: "core",
		valid: func(s string) bool { return s != "core" && isDNS1123Subdomain(s) }},
	// The version is bounded to 63 characters in the pattern; a group over
	// 253 characters is left to Validate.
	"apiVersion": {body: `(` + dns1123SubdomainRE + `/)?[a-z]([-a-z0-9]{0,61}[a-z0-9])?`, maxLength: 253 + 1 + 63,
		not: "core/", valid: func(s string) bool { return checkAPIVersion(s) == "" }},
	"kind": {body: `[A-Z][A-Za-z0-9]*`, valid: isKind},
}

// pattern is the anchored pattern of f; optional admits "".
func (f stringFormat) pattern(optional bool) string {
	if optional {
		return "^(" + f.body + ")?$"
	}
	return "^" + f.body + "$"
}

func (f stringFormat) schema(optional bool) *JSONSchema {
	s := &JSONSchema{Type: "string", Pattern: f.pattern(optional), MaxLength: f.maxLength}
	switch {
	case f.not == "":
	case strings.HasSuffix(f.not, "/"):
		s.Not = &JSONSchema{Pattern: "^" + f.not}
	default:
		s.Not = &JSONSchema{Enum: []string{f.not}}
	}
	return s
}

var (
	describerType   = reflect.TypeFor[SchemaDescriber]()
	rulerType       = reflect.TypeFor[schemaRuler]()
	unmarshalerType = reflect.TypeFor[yaml.Unmarshaler]()
)

// of derives the schema of a value of type t held by a field tagged tag.
func (g schemaGen) of(t reflect.Type, tag fieldTag) (*JSONSchema, error) {
	if t.Kind() == reflect.Pointer { // optional (*Duration): the schema of its value
		return g.of(t.Elem(), tag)
	}
	if t.Implements(describerType) {
		return reflect.Zero(t).Interface().(SchemaDescriber).JSONSchema(), nil
	}
	if reflect.PointerTo(t).Implements(unmarshalerType) {
		return nil, fmt.Errorf("type %s reads its own YAML (UnmarshalYAML) but has no JSONSchema method (SchemaDescriber)", t)
	}
	switch k := t.Kind(); {
	case k == reflect.Pointer:
		return g.of(t.Elem(), tag)
	case k == reflect.Struct:
		return g.object(t)
	case k == reflect.Slice:
		items, err := g.of(t.Elem(), fieldTag{required: true, format: tag.format})
		if err != nil {
			return nil, err
		}
		s := &JSONSchema{Type: "array", Items: items, UniqueItems: tag.unique}
		if tag.required {
			s.MinItems = 1
		}
		return s, nil
	case k == reflect.String:
		if tag.format != "" {
			return stringFormats[tag.format].schema(!tag.required), nil
		}
		s := &JSONSchema{Type: "string"}
		if tag.required {
			s.MinLength = 1
		}
		return s, nil
	case k == reflect.Bool:
		return &JSONSchema{Type: "boolean"}, nil
	case isIntKind(k):
		return &JSONSchema{Type: "integer"}, nil
	case k == reflect.Float32 || k == reflect.Float64:
		return &JSONSchema{Type: "number"}, nil
	}
	return nil, fmt.Errorf("type %s: no JSON Schema for kind %s", t, t.Kind())
}

// object is the schema of a struct: its yaml keys, in field order, and no
// other.
func (g schemaGen) object(t reflect.Type) (*JSONSchema, error) {
	no := false
	s := &JSONSchema{Type: "object", AdditionalProperties: &no}
	for i := range t.NumField() {
		sf := t.Field(i)
		name, _, _ := strings.Cut(sf.Tag.Get("yaml"), ",")
		if !sf.IsExported() || name == "" || name == "-" {
			continue
		}
		tag, err := parseFieldTag(sf.Tag.Get("schema"))
		if err != nil {
			return nil, fmt.Errorf("%s.%s: %w", t.Name(), sf.Name, err)
		}
		ps, err := g.of(sf.Type, tag)
		if err != nil {
			return nil, fmt.Errorf("%s.%s: %w", t.Name(), sf.Name, err)
		}
		if g.doc != nil {
			if d := g.doc(t, sf); d != "" {
				ps.Description = strings.TrimSpace(d + " " + ps.Description)
			}
		}
		s.Properties = append(s.Properties, Property{Name: name, Schema: ps})
		if tag.required {
			s.Required = append(s.Required, name)
		}
	}
	if t.Implements(rulerType) {
		s.If, s.Then = reflect.Zero(t).Interface().(schemaRuler).schemaRule()
	}
	return s, nil
}

// enumSchema is the schema of a string type with the values vs.
func enumSchema[T ~string](vs []T) *JSONSchema {
	s := &JSONSchema{Type: "string"}
	for _, v := range vs {
		s.Enum = append(s.Enum, string(v))
	}
	return s
}

// durationPattern is what Duration.UnmarshalYAML accepts
// (time.ParseDuration) without a minus sign: every negative duration is
// refused by Validate, "-0" aside.
const durationPattern = `^([-+]?0|\+?(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$`

// JSONSchema describes a Duration: a string such as "30s", or 0.
func (Duration) JSONSchema() *JSONSchema {
	zero := 0.0
	return &JSONSchema{
		Description: `A Go duration: "500ms", "30s", "5m", "1h30m"; 0 takes the default.`,
		Type:        []string{"string", "integer"}, Pattern: durationPattern, Minimum: &zero, Maximum: &zero,
	}
}

// JSONSchema describes a Mode: one of modes.
func (Mode) JSONSchema() *JSONSchema { return enumSchema(modes) }

// JSONSchema describes a Storage: one of storages.
func (Storage) JSONSchema() *JSONSchema { return enumSchema(storages) }

// JSONSchema describes a Payload: one of payloads.
func (Payload) JSONSchema() *JSONSchema { return enumSchema(payloads) }

// JSONSchema describes an Initial: one of initials.
func (Initial) JSONSchema() *JSONSchema { return enumSchema(initials) }

// JSONSchema describes an EventType: one of AllEventTypes.
func (EventType) JSONSchema() *JSONSchema { return enumSchema(AllEventTypes()) }

func isDNS1123Subdomain(s string) bool { return len(validation.IsDNS1123Subdomain(s)) == 0 }

func isDNS1035Label(s string) bool { return len(validation.IsDNS1035Label(s)) == 0 }

// schemaRule states the Secret guard of Validate (payload): a source of
// core v1 Secrets, by apiVersion+kind or by resource, without
// allowSecretData: true publishes, fingerprints and evaluates no data: its
// payload is metadata or reference (full is the default), and it keeps no
// managedFields or last-applied annotation, has no ignoreChanges,
// changedPaths or filter.
func (Source) schemaRule() (ifs, then *JSONSchema) {
	str := func(v string) *JSONSchema { return &JSONSchema{Const: v} }
	ifs = &JSONSchema{
		AnyOf: []*JSONSchema{
			{Required: []string{"apiVersion", "kind"}, Properties: Properties{{"apiVersion", str("v1")}, {"kind", str("Secret")}}},
			{Required: []string{"resource"}, Properties: Properties{{"resource", &JSONSchema{
				Required: []string{"resource"}, Properties: Properties{{"group", str("")}, {"resource", str("secrets")}}}}}},
		},
		Not: &JSONSchema{Required: []string{"allowSecretData"}, Properties: Properties{{"allowSecretData", &JSONSchema{Const: true}}}},
	}
	zero := 0
	none := &JSONSchema{MaxItems: &zero}
	then = &JSONSchema{
		Description: "A source of Secrets without allowSecretData: true publishes, fingerprints and evaluates none of their data: " +
			"payload metadata or reference, and no keepManagedFields, keepLastAppliedConfiguration, ignoreChanges, changedPaths or filter.",
		Required: []string{"payload"},
		Properties: Properties{
			{"payload", &JSONSchema{Enum: []string{string(PayloadMetadata), string(PayloadReference)}}},
			{"keepManagedFields", &JSONSchema{Const: false}},
			{"keepLastAppliedConfiguration", &JSONSchema{Const: false}},
			{"ignoreChanges", none},
			{"changedPaths", none},
			{"filter", str("")},
		},
	}
	return ifs, then
}
