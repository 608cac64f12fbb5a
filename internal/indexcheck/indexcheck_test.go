package indexcheck

import (
	"strings"
	"testing"

	"github.com/relayd/relayd/pkg/event"
	"github.com/relayd/relayd/pkg/index"
)

// compareIndex is the comparison of the index consistency check
// (RELAYD_INDEX_CHECK): each difference between an index (the bucket read
// back, or the in-memory one) and the LIST names the object, what the index
// has and what the list has.
func TestCompareIndexNamesTheObjectAndBothVersions(t *testing.T) {
	listed := []listedObject{
		{meta: event.Meta{Namespace: "ns", Name: "a", UID: "uid-a", ResourceVersion: "12"}},
		{meta: event.Meta{Namespace: "ns", Name: "b", UID: "uid-b", ResourceVersion: "15"}},
	}
	build := func(objs ...index.Object) *index.Index {
		x := index.New()
		for _, o := range objs {
			x.Put(o)
		}
		return x
	}
	a := index.Object{UID: "uid-a", Namespace: "ns", Name: "a", ResourceVersion: "12"}
	b := index.Object{UID: "uid-b", Namespace: "ns", Name: "b", ResourceVersion: "15"}
	for _, c := range []struct {
		name string
		x    *index.Index
		want []string // "" for no error
	}{
		{"same", build(a, b), nil},
		{"stale", build(a, index.Object{UID: "uid-b", Namespace: "ns", Name: "b", ResourceVersion: "14"}),
			[]string{"ns/b (uid uid-b)", `the index bucket "IX" has ns/b at resourceVersion 14`, "the list at 20 has ns/b at resourceVersion 15"}},
		{"missing", build(a),
			[]string{"ns/b (uid uid-b)", `the index bucket "IX" does not have it`, "the list at 20 has it at resourceVersion 15"}},
		{"extra", build(a, b, index.Object{UID: "uid-c", Namespace: "ns", Name: "c", ResourceVersion: "9"}),
			[]string{`the index bucket "IX" has 3 objects, the list at 20 has 2`, "ns/c (uid uid-c) at resourceVersion 9"}},
	} {
		err := compareIndex(`the index bucket "IX"`, c.x, listed, "20", false)
		if c.want == nil {
			if err != nil {
				t.Errorf("%s: %v", c.name, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%s: no difference reported", c.name)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not say %q", c.name, err, w)
			}
		}
	}
}
