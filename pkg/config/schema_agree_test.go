package config

import (
	"cmp"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	yaml "go.yaml.in/yaml/v3"

	"github.com/relayd/relayd/internal/testutil"
)

// repoConfigs are the configuration files of the repository, by path
// (a chart values file: its config), each of which Parse accepts.
func repoConfigs(t *testing.T) map[string][]byte {
	t.Helper()
	root := testutil.RepoRootT(t)
	files := []string{"config.example.yaml", "deploy/base/config.yaml"}
	for _, glob := range []string{"deploy/overlays/*/config.yaml", "pkg/config/testdata/good-*.yaml"} {
		m, err := filepath.Glob(filepath.Join(root, glob))
		if err != nil || len(m) == 0 {
			t.Fatalf("no %s (%v)", glob, err)
		}
		for _, f := range m {
			rel, _ := filepath.Rel(root, f)
			files = append(files, rel)
		}
	}
	out := map[string][]byte{}
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		out[f] = data
	}
	for _, f := range []string{"deploy/helm/relayd/values.yaml", "deploy/helm/relayd/ci/all-options-values.yaml"} {
		data, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		var values struct {
			Config yaml.Node `yaml:"config"`
		}
		if err := yaml.Unmarshal(data, &values); err != nil {
			t.Fatal(err)
		}
		doc, err := yaml.Marshal(&values.Config)
		if err != nil {
			t.Fatal(err)
		}
		out[f+" (config)"] = doc
	}
	return out
}

// TestSchemaAcceptsEveryConfigOfTheRepository: every config the repository
// ships or tests as valid is valid for Parse and for the schema.
func TestSchemaAcceptsEveryConfigOfTheRepository(t *testing.T) {
	sch := compiledSchema(t)
	configs := repoConfigs(t)
	if len(configs) < 10 {
		t.Fatalf("found %d configs, want the example, deploy/base, 3 overlays, the chart's 2 and pkg/config's good ones", len(configs))
	}
	for name, doc := range configs {
		if _, err := Parse(doc, name); err != nil {
			t.Errorf("%s: Parse: %v", name, err)
		}
		if errs := schemaErrors(t, sch, doc); errs != nil {
			t.Errorf("%s: the schema refuses a valid config:\n%s", name, strings.Join(errs, "\n"))
		}
	}
}

// minimalSource is good-minimal.yaml up to its source's name: each mistake
// below adds to its source or replaces it.
const minimalHead = "cluster: prod-eu-1\nnats:\n  url: nats://127.0.0.1:4222\n  stream:\n    name: K8S\n"

// schemaMistakes are mistakes that both the schema and Parse refuse: the
// document, the schema's error (an instance location and its words) and
// Parse's.
var schemaMistakes = []struct{ name, doc, schema, parse string }{
	{"namespace for namespaces in a source", minimalHead + "sources:\n  - {name: pods, apiVersion: v1, kind: Pod, namespace: shop}\n",
		"at '/sources/0': additional properties 'namespace' not allowed", `sources[0].namespace: unknown key (did you mean "namespaces"?)`},
	{"unknown top-level key", minimalHead + "sourcez:\n  - {name: pods, apiVersion: v1, kind: Pod}\n",
		"at '': additional properties 'sourcez' not allowed", `sourcez: unknown key (did you mean "sources"?)`},
	{"unknown key under nats", minimalHead + "  urls: [nats://a:4222]\nsources: [{name: pods, apiVersion: v1, kind: Pod}]\n",
		"at '/nats': additional properties 'urls' not allowed", `nats.urls: unknown key (did you mean "url"?)`},
	{"unknown key under nats.stream", minimalHead + "    maxMsgs: 10\nsources: [{name: pods, apiVersion: v1, kind: Pod}]\n",
		"at '/nats/stream': additional properties 'maxMsgs' not allowed", "nats.stream.maxMsgs: unknown key"},
	{"unknown key under nats.tls", minimalHead + "  tls: {ca: /ca.crt}\nsources: [{name: pods, apiVersion: v1, kind: Pod}]\n",
		"at '/nats/tls': additional properties 'ca' not allowed", "nats.tls.ca: unknown key"},
	{"unknown key under checkpoint", minimalHead + "checkpoint: {interval: 5s}\nsources: [{name: pods, apiVersion: v1, kind: Pod}]\n",
		"at '/checkpoint': additional properties 'interval' not allowed", "checkpoint.interval: unknown key"},
	{"unknown key under watch", minimalHead + "watch: {timout: 5m}\nsources: [{name: pods, apiVersion: v1, kind: Pod}]\n",
		"at '/watch': additional properties 'timout' not allowed", `watch.timout: unknown key (did you mean "timeout"?)`},
	{"unknown key under watch.relistBackoff", minimalHead + "watch: {relistBackoff: {maximum: 5m}}\nsources: [{name: pods, apiVersion: v1, kind: Pod}]\n",
		"at '/watch/relistBackoff': additional properties 'maximum' not allowed", "watch.relistBackoff.maximum: unknown key"},
	{"unknown key under sharding", minimalHead + "sharding: {enable: true}\nsources: [{name: pods, apiVersion: v1, kind: Pod}]\n",
		"at '/sharding': additional properties 'enable' not allowed", `sharding.enable: unknown key (did you mean "enabled"?)`},
	{"unknown key under a source's resource", minimalHead + "sources: [{name: pods, resource: {version: v1, resource: pods, kind: Pod}}]\n",
		"at '/sources/0/resource': additional properties 'kind' not allowed", "sources[0].resource.kind: unknown key"},
	{"a string for an integer", minimalHead + "  maxInFlight: lots\nsources: [{name: pods, apiVersion: v1, kind: Pod}]\n",
		"at '/nats/maxInFlight': got string, want integer", `nats.maxInFlight: expected an integer, got "lots"`},
	{"a string for a boolean", minimalHead + "    create: sometimes\nsources: [{name: pods, apiVersion: v1, kind: Pod}]\n",
		"at '/nats/stream/create': got string, want boolean", `nats.stream.create: expected true or false, got "sometimes"`},
	{"a string for a list", minimalHead + "sources: [{name: pods, apiVersion: v1, kind: Pod, namespaces: shop}]\n",
		"at '/sources/0/namespaces': got string, want array", `sources[0].namespaces: expected a list, got "shop"`},
	{"a list for a mapping", minimalHead + "sources: [{name: pods, apiVersion: v1, kind: Pod}]\nwatch: [timeout]\n",
		"at '/watch': got array, want object", "watch: expected a mapping, got a list"},
	{"a bad payload", minimalHead + "sources: [{name: pods, apiVersion: v1, kind: Pod, payload: everything}]\n",
		"at '/sources/0/payload': value must be one of 'full', 'metadata', 'reference'", `sources[0].payload: "everything" is not a valid payload (must be full, metadata or reference)`},
	{"a bad event type", minimalHead + "sources: [{name: pods, apiVersion: v1, kind: Pod, eventTypes: [created]}]\n",
		"at '/sources/0/eventTypes/0': value must be one of 'added', 'modified', 'deleted'", `sources[0].eventTypes[0]: "created" is not a valid event type (must be added, modified or deleted)`},
	{"a bad initial mode", minimalHead + "sources: [{name: pods, apiVersion: v1, kind: Pod, initial: latest}]\n",
		"at '/sources/0/initial': value must be one of 'snapshot', 'none'", `sources[0].initial: "latest" is not a valid initial mode (must be snapshot or none)`},
	{"a bad CloudEvents mode", minimalHead + "cloudevents: {mode: batch}\nsources: [{name: pods, apiVersion: v1, kind: Pod}]\n",
		"at '/cloudevents/mode': value must be one of 'structured', 'binary'", `cloudevents.mode: "batch" is not a valid mode (must be structured or binary)`},
	{"a bad storage", minimalHead + "    storage: disk\nsources: [{name: pods, apiVersion: v1, kind: Pod}]\n",
		"at '/nats/stream/storage': value must be one of 'file', 'memory'", `nats.stream.storage: "disk" is not a valid storage type (must be file or memory)`},
	{"a duration in words", minimalHead + "watch: {timeout: 5 minutes}\nsources: [{name: pods, apiVersion: v1, kind: Pod}]\n",
		"at '/watch/timeout': '5 minutes' does not match pattern", `watch.timeout: invalid duration "5 minutes"`},
	{"a duration without a unit", minimalHead + "shutdown: {drainTimeout: 20}\nsources: [{name: pods, apiVersion: v1, kind: Pod}]\n",
		"at '/shutdown/drainTimeout': maximum: got 20, want 0", `shutdown.drainTimeout: invalid duration "20"`},
	{"a negative duration", minimalHead + "checkpoint: {flushInterval: -5s}\nsources: [{name: pods, apiVersion: v1, kind: Pod}]\n",
		"at '/checkpoint/flushInterval': '-5s' does not match pattern", "checkpoint.flushInterval: must be at least 100ms, got -5s"},
	{"no cluster", "nats: {url: nats://a:4222, stream: {name: K8S}}\nsources: [{name: pods, apiVersion: v1, kind: Pod}]\n",
		"at '': missing property 'cluster'", "cluster: required"},
	{"no nats.url", "cluster: a\nnats: {stream: {name: K8S}}\nsources: [{name: pods, apiVersion: v1, kind: Pod}]\n",
		"at '/nats': missing property 'url'", "nats.url: required"},
	{"no stream name", "cluster: a\nnats: {url: nats://a:4222, stream: {create: true}}\nsources: [{name: pods, apiVersion: v1, kind: Pod}]\n",
		"at '/nats/stream': missing property 'name'", "nats.stream.name: required"},
	{"no sources", minimalHead + "sources: []\n",
		"at '/sources': minItems: got 0, want 1", "sources: at least one source is required"},
	{"a source without a name", minimalHead + "sources: [{apiVersion: v1, kind: Pod}]\n",
		"at '/sources/0': missing property 'name'", "sources[0].name: required"},
	{"a resource without a version", minimalHead + "sources: [{name: pods, resource: {resource: pods}}]\n",
		"at '/sources/0/resource': missing property 'version'", "sources[0].resource.version: required"},
	{"a namespace that is no name", minimalHead + "sources: [{name: pods, apiVersion: v1, kind: Pod, namespaces: [kube_system]}]\n",
		"at '/sources/0/namespaces/0': 'kube_system' does not match pattern", `sources[0].namespaces[0]: "kube_system" is not a valid namespace name`},
	{"a namespace twice", minimalHead + "sources: [{name: pods, apiVersion: v1, kind: Pod, namespaces: [shop, shop]}]\n",
		"at '/sources/0/namespaces': items at 0 and 1 are equal", `sources[0].namespaces[1]: duplicate namespace "shop"`},
	{"an event type twice", minimalHead + "sources: [{name: pods, apiVersion: v1, kind: Pod, eventTypes: [added, added]}]\n",
		"at '/sources/0/eventTypes': items at 0 and 1 are equal", `sources[0].eventTypes[1]: duplicate event type "added"`},
	{"a drop path twice", minimalHead + "sources: [{name: pods, apiVersion: v1, kind: Pod, drop: [spec, spec]}]\n",
		"at '/sources/0/drop': items at 0 and 1 are equal", `sources[0].drop[1]: duplicate path "spec"`},
	{"an empty drop path", minimalHead + "sources: [{name: pods, apiVersion: v1, kind: Pod, drop: ['']}]\n",
		"at '/sources/0/drop/0': minLength: got 0, want 1", "sources[0].drop[0]: "},
	{"a source name that is no DNS label", minimalHead + "sources: [{name: My_Pods, apiVersion: v1, kind: Pod}]\n",
		"at '/sources/0/name': 'My_Pods' does not match pattern", `sources[0].name: "My_Pods" is not a valid source name`},
	{"the core group by name in an apiVersion", minimalHead + "sources: [{name: pods, apiVersion: core/v1, kind: Pod}]\n",
		"at '/sources/0/apiVersion': 'not' failed", `sources[0].apiVersion: "core/v1" is not a valid apiVersion`},
	{"the core group by name in a resource", minimalHead + "sources: [{name: pods, resource: {group: core, version: v1, resource: pods}}]\n",
		"at '/sources/0/resource/group': 'not' failed", `sources[0].resource.group: the core API group is written as ""`},
	{"a kind in lower case", minimalHead + "sources: [{name: pods, apiVersion: v1, kind: pod}]\n",
		"at '/sources/0/kind': 'pod' does not match pattern", `sources[0].kind: "pod" is not a valid kind`},
	{"a version that is no DNS-1035 label", minimalHead + "sources: [{name: pods, resource: {version: 1v, resource: pods}}]\n",
		"at '/sources/0/resource/version': '1v' does not match pattern", `sources[0].resource.version: "1v" is not a valid API version`},
	{"a dotted cluster", "cluster: prod.eu\nnats: {url: nats://a:4222, stream: {name: K8S}}\nsources: [{name: pods, apiVersion: v1, kind: Pod}]\n",
		"at '/cluster': 'prod.eu' does not match pattern", `cluster: "prod.eu" is not a valid cluster name`},
	{"an empty prefix token", minimalHead + "prefix: k8s..x\nsources: [{name: pods, apiVersion: v1, kind: Pod}]\n",
		"at '/prefix': 'k8s..x' does not match pattern", `prefix: "k8s..x" is not a valid prefix`},
	{"a Lease prefix in capitals", minimalHead + "sharding: {leasePrefix: Relayd}\nsources: [{name: pods, apiVersion: v1, kind: Pod}]\n",
		"at '/sharding/leasePrefix': 'Relayd' does not match pattern", `sharding.leasePrefix: "Relayd" is not a valid prefix`},
	{"a checkpoint name with a space", minimalHead + "checkpoint: {name: relayd checkpoint}\nsources: [{name: pods, apiVersion: v1, kind: Pod}]\n",
		"at '/checkpoint/name': 'relayd checkpoint' does not match pattern", `checkpoint.name: "relayd checkpoint" is not a valid ConfigMap name`},
	{"a filter on Secrets without allowSecretData", minimalHead + "sources: [{name: s, apiVersion: v1, kind: Secret, payload: metadata, filter: 'has(object.data.x)'}]\n",
		"at '/sources/0/filter': value must be ''", "sources[0].filter: evaluates the Secret's data"},
	{"managedFields of Secrets without allowSecretData", minimalHead + "sources: [{name: s, resource: {version: v1, resource: secrets}, payload: reference, keepManagedFields: true}]\n",
		"at '/sources/0/keepManagedFields': value must be false", "sources[0].keepManagedFields: true publishes the name of every data key"},
	{"changedPaths on Secrets without allowSecretData", minimalHead + "sources: [{name: s, apiVersion: v1, kind: Secret, payload: metadata, changedPaths: [data]}]\n",
		"at '/sources/0/changedPaths': maxItems: got 1, want 0", "sources[0].changedPaths: fingerprints parts of the Secret"},
	{"a dotted bucket", minimalHead + "  index: {bucket: relayd.index}\nsources: [{name: pods, apiVersion: v1, kind: Pod}]\n",
		"at '/nats/index/bucket': 'relayd.index' does not match pattern", `nats.index.bucket: "relayd.index" is not a valid bucket name`},
}

// TestSchemaAndParseRefuseTheSameMistakes: each mistake is refused by the
// schema, at its key, and by Parse, naming it.
func TestSchemaAndParseRefuseTheSameMistakes(t *testing.T) {
	sch := compiledSchema(t)
	for _, tc := range schemaMistakes {
		t.Run(tc.name, func(t *testing.T) {
			errs := schemaErrors(t, sch, []byte(tc.doc))
			if !slices.ContainsFunc(errs, func(e string) bool { return strings.Contains(e, tc.schema) }) {
				t.Errorf("the schema says %q, want %q", errs, tc.schema)
			}
			_, err := Parse([]byte(tc.doc), "c.yaml")
			if err == nil || !strings.Contains(err.Error(), tc.parse) {
				t.Errorf("Parse: %v; want %q", err, tc.parse)
			}
		})
	}
}

// schemaCannot are the fixtures of testdata/bad-*.yaml that the schema
// accepts, with the reason; the schema refuses every other one. Parse
// refuses them all (TestFixtures).
var schemaCannot = map[string]string{
	"bad-both-kind-and-resource.yaml":    "a rule between keys (apiVersion+kind or resource)",
	"bad-neither-kind-nor-resource.yaml": "a rule between keys (apiVersion+kind or resource)",
	"bad-duplicate-key.yaml":             "YAML: a JSON Schema sees the document after a YAML reader kept one of the two",
	"bad-duplicate-source-names.yaml":    "uniqueness of a key across list items",
	"bad-duplicate-window.yaml":          "a duration's range",
	"bad-idle-timeout.yaml":              "a duration's range, relative to another key",
	"bad-field-selector.yaml":            "the syntax of a field selector",
	"bad-label-selector.yaml":            "the syntax of a label selector",
	"bad-filter.yaml":                    "the syntax and types of a CEL expression",
	"bad-empty.yaml":                     "not a document: helm reads an empty config as null",
	"bad-syntax.yaml":                    "not YAML",
	"bad-two-documents.yaml":             "not one YAML document",
}

// TestSchemaRefusesTheBadFixturesItCan: the schema refuses each
// testdata/bad-*.yaml fixture except those in schemaCannot, which it
// accepts (a fixture the schema starts to refuse must leave the list, so
// the docs' list of what it cannot check stays true).
func TestSchemaRefusesTheBadFixturesItCan(t *testing.T) {
	sch := compiledSchema(t)
	files, err := filepath.Glob("testdata/bad-*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no testdata/bad-*.yaml (%v)", err)
	}
	for _, f := range files {
		name := filepath.Base(f)
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Parse(data, name); err == nil {
			t.Errorf("%s: Parse accepts it", name)
		}
		reason, cannot := schemaCannot[name]
		var v any
		if err := yaml.Unmarshal(data, &v); err != nil || v == nil {
			if !cannot {
				t.Errorf("%s: not a YAML document (%v); list it in schemaCannot", name, err)
			}
			continue
		}
		switch errs := schemaErrors(t, sch, data); {
		case cannot && errs != nil:
			t.Errorf("%s: the schema refuses it now (%s), but schemaCannot says it cannot (%s): remove it from the list", name, errs, reason)
		case !cannot && errs == nil:
			t.Errorf("%s: the schema accepts it, Parse refuses it", name)
		}
	}
	for name := range schemaCannot {
		if _, err := os.Stat(filepath.Join("testdata", name)); err != nil {
			t.Errorf("schemaCannot lists %s: %v", name, err)
		}
	}
}

// TestSchemaFormatsAreValidates: each string format of a `schema` tag
// matches exactly the names Validate accepts, on a corpus of names and
// near misses; the duration pattern matches what Duration reads.
func TestSchemaFormatsAreValidates(t *testing.T) {
	corpus := []string{"a", "A", "0", "-", "_", "a-b", "a_b", "a.b", "a..b", ".a", "a.", "a/b", "a/", "/a", "v1", "1v", "v1beta1",
		"apps/v1", "core/v1", "core", "example.com/v1", "Example.com/v1", "example.com/V1", "-a", "a-", "Pod", "pod", "ConfigMap", "Config-Map",
		"K8S", "_INBOX_relayd", "k8s.prod.eu", "k8s.*", "k8s.>", "a b", "a\n", "\na", "a,b", "*", "é", "a" + strings.Repeat("b", 62), "a" + strings.Repeat("b", 63),
		strings.Repeat("a.", 126) + "a", strings.Repeat("a.", 127) + "a", "a/" + strings.Repeat("b", 63), "a/" + strings.Repeat("b", 64)}
	for name, f := range stringFormats {
		re := regexp.MustCompile(f.pattern(false))
		var notRE *regexp.Regexp
		if s := f.schema(false).Not; s != nil && s.Pattern != "" {
			notRE = regexp.MustCompile(s.Pattern)
		}
		for _, s := range corpus {
			schema := re.MatchString(s) && (f.maxLength == 0 || len([]rune(s)) <= f.maxLength) && s != f.not && (notRE == nil || !notRE.MatchString(s))
			if got := f.valid(s); got != schema {
				t.Errorf("format %s on %q: the schema says %v, Validate %v", name, s, schema, got)
			}
		}
	}
	re := regexp.MustCompile(durationPattern)
	for _, s := range []string{"0", "+0", "-0", "1s", "1.5h", ".5s", "5.s", "1h30m", "500ms", "1µs", "1μs", "1us", "1ns", "+5s",
		"5", "-5s", "5 s", "s", ".s", "1d", "1h-5m", "", "1.2.3s", "5S"} {
		var d Duration
		err := d.UnmarshalYAML(&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s})
		accepted := err == nil && d >= 0
		if re.MatchString(s) != accepted {
			t.Errorf("duration %q: the pattern matches %v, Duration reads it (as not negative) %v (%v)", s, re.MatchString(s), accepted, err)
		}
	}
}

// schemaStricter are the spellings that Parse reads (as unset, or converted
// to a string) and the schema refuses, as docs/CONFIGURATION.md says;
// everything else the schema refuses, Parse refuses too.
var schemaStricter = []struct{ name, doc, schema string }{
	{"null for unset", minimalHead + "prefix: ~\nsources: [{name: pods, apiVersion: v1, kind: Pod}]\n",
		"at '/prefix': got null, want string"},
	{"empty for a default of a fixed set", minimalHead + "sources: [{name: pods, apiVersion: v1, kind: Pod, payload: ''}]\n",
		"at '/sources/0/payload': value must be one of"},
	{"a number for a string", "cluster: 123\nnats: {url: nats://a:4222, stream: {name: K8S}}\nsources: [{name: pods, apiVersion: v1, kind: Pod}]\n",
		"at '/cluster': got number, want string"},
}

func TestSchemaIsStricterOnlyWhereTheDocsSay(t *testing.T) {
	sch := compiledSchema(t)
	for _, tc := range schemaStricter {
		if _, err := Parse([]byte(tc.doc), "c.yaml"); err != nil {
			t.Errorf("%s: Parse refuses it (%v): the docs need not mention it", tc.name, err)
		}
		errs := schemaErrors(t, sch, []byte(tc.doc))
		if !slices.ContainsFunc(errs, func(e string) bool { return strings.Contains(e, tc.schema) }) {
			t.Errorf("%s: the schema says %q, want %q", tc.name, errs, tc.schema)
		}
	}
}

// TestSchemaRequiredKeysAreRequiredByParse: in every config of the
// repository, leaving out a key the schema requires (or emptying a list it
// wants non-empty) makes Parse refuse the config, so the schema's
// `required` tags never refuse what relayd accepts.
func TestSchemaRequiredKeysAreRequiredByParse(t *testing.T) {
	s, err := Schema()
	if err != nil {
		t.Fatal(err)
	}
	checked := map[string]bool{}
	for name, doc := range repoConfigs(t) {
		var root yaml.Node
		if err := yaml.Unmarshal(doc, &root); err != nil {
			t.Fatal(err)
		}
		// without runs Parse on the document with n's content changed to
		// content, then restores it.
		without := func(n *yaml.Node, content []*yaml.Node, what string) {
			saved := n.Content
			n.Content = content
			defer func() { n.Content = saved }()
			out, err := yaml.Marshal(&root)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := Parse(out, name); err == nil {
				t.Errorf("%s: the schema requires %s, Parse accepts the config without it", name, what)
			}
			checked[what] = true
		}
		var visit func(s *JSONSchema, n *yaml.Node, path string)
		visit = func(s *JSONSchema, n *yaml.Node, path string) {
			switch {
			case n.Kind == yaml.MappingNode && s.Type == "object":
				for i := 0; i+1 < len(n.Content); i += 2 {
					key := n.Content[i].Value
					if slices.Contains(s.Required, key) {
						without(n, slices.Delete(slices.Clone(n.Content), i, i+2), path+"/"+key)
					}
					if j := slices.IndexFunc(s.Properties, func(p Property) bool { return p.Name == key }); j >= 0 {
						visit(s.Properties[j].Schema, n.Content[i+1], path+"/"+key)
					}
				}
			case n.Kind == yaml.SequenceNode && s.Type == "array":
				if s.MinItems > 0 {
					without(n, nil, path+" (an item)")
				}
				for _, it := range n.Content {
					visit(s.Items, it, path+"/*")
				}
			}
		}
		visit(s, root.Content[0], "")
	}
	for _, want := range []string{"/cluster", "/nats", "/nats/url", "/nats/stream", "/nats/stream/name", "/sources", "/sources (an item)",
		"/sources/*/name", "/sources/*/resource/version", "/sources/*/resource/resource"} {
		if !checked[want] {
			t.Errorf("no config of the repository has %s: its requirement is untested", want)
		}
	}
}

// mutants are the values TestSchemaNeverRefusesWhatParseAccepts puts in
// place of each scalar of the repository's configs: a YAML tag and text.
var mutants = [][2]string{
	{"!!null", "null"}, {"!!bool", "true"}, {"!!bool", "false"}, {"!!int", "0"}, {"!!int", "1"}, {"!!int", "-1"},
	{"!!int", "3"}, {"!!int", "65536"}, {"!!int", "2097152"}, {"!!float", "0.5"}, {"!!float", "1.5"},
	{"!!str", ""}, {"!!str", "x"}, {"!!str", "X"}, {"!!str", "a-b"}, {"!!str", "a_b"}, {"!!str", "a.b"}, {"!!str", "a b"},
	{"!!str", "core"}, {"!!str", "core/v1"}, {"!!str", "v1"}, {"!!str", "apps/v1"}, {"!!str", "Pod"}, {"!!str", "0"},
	{"!!str", "1s"}, {"!!str", "-1s"}, {"!!str", "90s"}, {"!!str", "2m"}, {"!!str", "1h"}, {"!!str", "file"}, {"!!str", "memory"},
	{"!!str", "metadata"}, {"!!str", "deleted"}, {"!!str", "none"}, {"!!str", "binary"}, {"!!str", "nats://a:4222"},
	{"!!str", "tls://a:4222"}, {"!!str", "/etc/relayd/x"}, {"!!str", "app=web"}, {"!!str", "metadata.name=x"}, {"!!str", "spec"},
}

// TestSchemaNeverRefusesWhatParseAccepts: each scalar of each config of
// the repository, replaced by each of mutants: whenever Parse accepts the
// result, the schema accepts it too, but for the spellings
// docs/CONFIGURATION.md names (null, "" for a key with a fixed set of
// values, a number or boolean for a string).
func TestSchemaNeverRefusesWhatParseAccepts(t *testing.T) {
	sch := compiledSchema(t)
	s, err := Schema()
	if err != nil {
		t.Fatal(err)
	}
	var tried, parseOnly, schemaOnly int
	seen := map[string]bool{} // each key path once, in the smallest config that has it
	configs := repoConfigs(t)
	names := slices.SortedFunc(maps.Keys(configs), func(a, b string) int {
		return cmp.Or(len(configs[a])-len(configs[b]), strings.Compare(a, b))
	})
	for _, name := range names {
		doc := configs[name]
		var root yaml.Node
		if err := yaml.Unmarshal(doc, &root); err != nil {
			t.Fatal(err)
		}
		stripComments(&root) // the YAML to parse shrinks to a tenth
		var visit func(s *JSONSchema, n *yaml.Node, path string)
		visit = func(s *JSONSchema, n *yaml.Node, path string) {
			switch n.Kind {
			case yaml.MappingNode:
				for i := 0; i+1 < len(n.Content); i += 2 {
					if j := slices.IndexFunc(s.Properties, func(p Property) bool { return p.Name == n.Content[i].Value }); j >= 0 {
						visit(s.Properties[j].Schema, n.Content[i+1], path+"/"+n.Content[i].Value)
					}
				}
			case yaml.SequenceNode:
				for _, it := range n.Content {
					if s.Items != nil {
						visit(s.Items, it, path+"/*")
					}
				}
			case yaml.ScalarNode:
				if seen[path] {
					return
				}
				seen[path] = true
				saved := *n
				takesString := s.Type == "string" || slices.Contains(asStrings(s.Type), "string")
				for _, m := range mutants {
					if m[0] == "!!str" && !takesString {
						continue // refused by both as a string for a number or boolean
					}
					n.Tag, n.Value, n.Style = m[0], m[1], 0
					if m[0] == "!!str" {
						n.Style = yaml.DoubleQuotedStyle
					}
					out, err := yaml.Marshal(&root)
					if err != nil {
						t.Fatal(err)
					}
					tried++
					_, perr := Parse(out, name)
					var v any
					if err := root.Decode(&v); err != nil {
						t.Fatal(err)
					}
					serrs := validateValue(t, sch, v)
					documented := m[0] == "!!null" || (m[1] == "" && s.Enum != nil) || (m[0] != "!!str" && s.Type == "string")
					switch {
					case perr == nil && serrs != nil && !documented:
						t.Errorf("%s: %s = %s %q: Parse accepts it, the schema refuses it: %s", name, path, m[0], m[1], serrs)
					case perr == nil && serrs != nil:
						parseOnly++
					case perr != nil && serrs == nil:
						schemaOnly++
					}
				}
				*n = saved
			}
		}
		visit(s, root.Content[0], "")
	}
	t.Logf("%d mutants: %d accepted by Parse only (the documented spellings), %d by the schema only (for check-config)", tried, parseOnly, schemaOnly)
	if tried < 1500 {
		t.Errorf("only %d mutants tried", tried)
	}
}

func stripComments(n *yaml.Node) {
	n.HeadComment, n.LineComment, n.FootComment = "", "", ""
	for _, c := range n.Content {
		stripComments(c)
	}
}

func asStrings(v any) []string {
	s, _ := v.([]string)
	return s
}
