package deploy

import (
	"fmt"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/relayd/relayd/pkg/checkpoint"
)

// TestCheckpointConfigMapsAreShippedAndGrantedByName: every render ships
// and grants (get, update; by resourceNames) exactly the checkpoint
// ConfigMaps relayd uses for its config — <name>, <name>-1, … one per
// checkpoint.watchesPerConfigMap watches (pkg/config CheckpointShards,
// pkg/checkpoint ShardNames) — nothing more, nothing less. Beside the
// shipped renders, the chart with a config of more watches than one
// ConfigMap is planned to hold.
func TestCheckpointConfigMapsAreShippedAndGrantedByName(t *testing.T) {
	namespaces := make([]string, 7)
	for i := range namespaces {
		namespaces[i] = fmt.Sprintf("team-%d", i)
	}
	many := valuesDoc(t, map[string]any{"config": map[string]any{
		"checkpoint": map[string]any{"watchesPerConfigMap": 3},
		"sources": []any{
			map[string]any{"name": "cms", "resource": map[string]any{"version": "v1", "resource": "configmaps"}, "namespaces": namespaces},
			map[string]any{"name": "svcs", "resource": map[string]any{"version": "v1", "resource": "services"}},
		},
	}})
	renders := map[string]func() *bundle{
		"chart, 8 watches at 3 per ConfigMap": func() *bundle {
			return bundleOf(t, "chart (8 watches)", renderChart(t, "relayd", "relayd", many))
		},
	}
	for _, dir := range shipped {
		renders[dir] = func() *bundle { return loadBundle(t, dir) }
	}
	for name, load := range renders {
		t.Run(name, func(t *testing.T) {
			b := load()
			want := checkpoint.ShardNames(b.cfg.Checkpoint.Name, b.cfg.CheckpointShards())
			if name != "chart, 8 watches at 3 per ConfigMap" && len(want) != 1 {
				t.Errorf("a shipped config needs %d checkpoint ConfigMaps; the shipped ones are small", len(want))
			} else if name == "chart, 8 watches at 3 per ConfigMap" && len(want) != 3 {
				t.Errorf("8 watches at 3 per ConfigMap: relayd uses %v, want 3 ConfigMaps", want)
			}
			granted := map[string]sets.Set[string]{}
			for _, p := range permissions(t, b.objs) {
				if p.roleKind == "Role" && p.group == "" && p.resource == "configmaps" && p.namespace == b.namespace() {
					for _, n := range p.resourceNames {
						if granted[n] == nil {
							granted[n] = sets.New[string]()
						}
						granted[n].Insert(p.verb)
					}
				}
			}
			var grantedNames []string
			for n, verbs := range granted {
				grantedNames = append(grantedNames, n)
				if !verbs.Equal(sets.New("get", "update")) {
					t.Errorf("ConfigMap %s/%s is granted %v, want exactly get and update", b.namespace(), n, sets.List(verbs))
				}
			}
			slices.Sort(grantedNames)
			slices.Sort(want)
			if !slices.Equal(grantedNames, want) {
				t.Errorf("the Roles grant get/update on ConfigMaps %v in %s; relayd uses the checkpoint ConfigMaps %v", grantedNames, b.namespace(), want)
			}
			for _, n := range want {
				shipped := false
				for _, o := range b.objs {
					shipped = shipped || (o.GetKind() == "ConfigMap" && o.GetName() == n && o.GetNamespace() == b.namespace())
				}
				if !shipped {
					t.Errorf("checkpoint ConfigMap %s/%s is not shipped (relayd may not create it)", b.namespace(), n)
				}
			}
		})
	}
}
