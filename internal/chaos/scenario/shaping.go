package scenario

import (
	"fmt"
	"maps"
	"slices"

	"github.com/relayd/relayd/internal/chaos/history"
	"github.com/relayd/relayd/internal/chaos/record"
)

// shaped are the sources of the chaos config that shape their events
// (docs/CONFIGURATION.md, "Payload safety" and "Change filtering"), each
// over a namespace or kind of its own so that the reference attributes
// every change to its source:
//
//   - dropped: ConfigMaps of <ns>-d with drop [data.secret]; the writer
//     puts history.Marker into data.secret;
//   - gadgets: Gadgets (record.GadgetGVR, a status subresource) of <ns>
//     with ignoreChanges [status]; the writer makes spec updates and
//     status-only updates, and the reference digests every version
//     without status;
//   - meta: Gadgets of <ns>-m with payload metadata (their spec and status
//     hold history.Marker);
//   - scoped (Params.Filter): ConfigMaps of <ns>-f with a filter on the
//     label tier, which the writer sets to gold, silver or nothing on
//     every write (record.ScopedConfigMaps): objects enter and leave the
//     filter's scope all the time; the reference records every version's
//     labels, and the checker evaluates the filter's Go equivalent
//     (history.Filter) on them.
//
// They run in every scenario, under every fault.
type shaped struct {
	namespaces []string // to create
	kinds      []record.Kind
	prefixes   []record.Prefix
	cpKeys     map[string]string // checkpoint key -> source
	shaping    map[string]history.Shaping
	filters    map[string]history.Filter
	yaml       string // appended to the config's sources
}

// scopeFilter is the filtered source's CEL expression: the label tier is
// gold (history.Filter's Go equivalent evaluates the same).
const scopeFilter = "has(object.metadata.labels) && '" + record.ScopeLabel + "' in object.metadata.labels && object.metadata.labels['" +
	record.ScopeLabel + "'] == '" + record.ScopeValue + "'"

func shapedSources(ns string, filter bool, objects int) shaped {
	nsD, nsM := ns+"-d", ns+"-m"
	gadgets := "/registry/" + record.GadgetGVR.Group + "/" + record.GadgetGVR.Resource + "/"
	s := shaped{
		namespaces: []string{nsD, nsM},
		kinds:      []record.Kind{record.SecretConfigMaps("dropped", nsD), record.Gadgets("gadgets", ns), record.Gadgets("meta", nsM)},
		prefixes: []record.Prefix{
			{Key: "/registry/configmaps/" + nsD + "/", Source: "dropped"},
			{Key: gadgets + ns + "/", Source: "gadgets", Ignore: []string{"status"}},
			{Key: gadgets + nsM + "/", Source: "meta"},
		},
		cpKeys: map[string]string{"dropped." + nsD: "dropped", "gadgets." + ns: "gadgets", "meta." + nsM: "meta"},
		shaping: map[string]history.Shaping{
			"dropped": {Drop: []string{"data.secret"}},
			"gadgets": {IgnoreChanges: []string{"status"}},
			"meta":    {Payload: "metadata"},
		},
	}
	gv := record.GadgetGVR.GroupVersion().String()
	s.yaml = fmt.Sprintf(`  - name: dropped
    apiVersion: v1
    kind: ConfigMap
    namespaces: [%[1]s]
    drop: [data.secret]
  - name: gadgets
    apiVersion: %[3]s
    kind: Gadget
    namespaces: [%[2]s]
    ignoreChanges: [status]
  - name: meta
    apiVersion: %[3]s
    kind: Gadget
    namespaces: [%[4]s]
    payload: metadata
`, nsD, ns, gv, nsM)
	if filter {
		nsF := ns + "-f"
		s.namespaces = append(s.namespaces, nsF)
		// A third of the names: more updates per object, so more of them
		// enter and leave scope.
		k := record.ScopedConfigMaps("scoped", nsF)
		k.Objects = max(objects/3, 4)
		s.kinds = append(s.kinds, k)
		s.prefixes = append(s.prefixes, record.Prefix{Key: "/registry/configmaps/" + nsF + "/", Source: "scoped", Labels: true})
		s.cpKeys["scoped."+nsF] = "scoped"
		s.filters = map[string]history.Filter{"scoped": {Expr: scopeFilter, Label: record.ScopeLabel, Value: record.ScopeValue}}
		s.yaml += fmt.Sprintf(`  - name: scoped
    apiVersion: v1
    kind: ConfigMap
    namespaces: [%s]
    filter: %q
`, nsF, scopeFilter)
	}
	return s
}

// sources returns the sources' names, sorted.
func (s shaped) sources() []string {
	var out []string
	for _, src := range s.cpKeys {
		out = append(out, src)
	}
	slices.Sort(out)
	return out
}

// cpKeysWith returns s's checkpoint keys plus keys.
func (s shaped) cpKeysWith(keys map[string]string) map[string]string {
	out := maps.Clone(keys)
	maps.Copy(out, s.cpKeys)
	return out
}
