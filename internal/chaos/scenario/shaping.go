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
//     hold history.Marker).
//
// They run in every scenario, under every fault.
type shaped struct {
	namespaces []string // to create
	kinds      []record.Kind
	prefixes   []record.Prefix
	cpKeys     map[string]string // checkpoint key -> source
	shaping    map[string]history.Shaping
	yaml       string // appended to the config's sources
}

func shapedSources(ns string) shaped {
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
