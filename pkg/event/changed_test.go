package event

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// changedTestPaths are the changedPaths of the property test: whole
// members, nested ones, a quoted key, and members below values that are
// not always objects.
var changedTestPaths = []string{
	"spec", "status", "metadata.labels", "spec.a", "spec.a.b", `metadata.annotations["x.y/z"]`, "data", "spec.c", `spec["x.y/z"].a`,
}

// The property: for random pairs of objects, relaydchanged (the Changed
// set) names exactly the paths whose values differ in a JSON comparison:
// both objects decoded by encoding/json, each path's member looked up
// (absent when a step is missing or not an object), present/absent and
// the values compared with reflect.DeepEqual. Member order, whitespace,
// string escapes and number spellings do not count; null is not absent.
// Pairs are a reserialised copy, a copy with a few members changed,
// removed or set to null, a copy with its arrays (nested ones too)
// reordered — [1,2] is not [2,1] — or an unrelated object.
func TestChangedPathsEqualJSONComparison(t *testing.T) {
	sh, err := NewShaping(ShapingOptions{ChangedPaths: changedTestPaths})
	if err != nil {
		t.Fatal(err)
	}
	paths := make([]Path, len(changedTestPaths))
	for i, s := range changedTestPaths {
		if paths[i], err = ParsePath(s); err != nil {
			t.Fatal(err)
		}
	}
	r := rand.New(rand.NewPCG(29, 2))
	var f *Fingerprinter
	const pairs = 20000
	var kinds [4]int
	var differ, same, reordered int
	for n := range pairs {
		a := genObject(r)
		var b map[string]any
		kind := r.IntN(4)
		kinds[kind]++
		switch kind {
		case 0:
			b = a
		case 1:
			b = mutate(r, deepCopy(a).(map[string]any))
		case 2:
			b = deepCopy(a).(map[string]any)
			if reorder(r, b) {
				reordered++
			}
		default:
			b = genObject(r)
		}
		ra, rb := serialize(r, a), serialize(r, b)
		oa, err := ParseObjectShaped(ra, sh)
		if err != nil {
			t.Fatalf("pair %d: %s: %v", n, ra, err)
		}
		ob, err := ParseObjectShaped(rb, sh)
		if err != nil {
			t.Fatalf("pair %d: %s: %v", n, rb, err)
		}
		got := CompareChanged(sh.ChangedPaths(), PathsString(f.PathFingerprints(&oa, nil)), f.PathFingerprints(&ob, nil))
		var ja, jb any
		if err := json.Unmarshal(ra, &ja); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(rb, &jb); err != nil {
			t.Fatal(err)
		}
		var want uint64
		for i, p := range paths {
			va, pa := lookup(ja, p)
			vb, pb := lookup(jb, p)
			if pa != pb || !reflect.DeepEqual(va, vb) {
				want |= 1 << i
			}
		}
		if got.Changed != want || got.Unknown != 0 {
			t.Fatalf("pair %d:\n%s\n%s\nrelaydchanged %q (unknown %q), JSON comparison %q", n, ra, rb,
				got.list(got.Changed), got.list(got.Unknown), got.list(want))
		}
		if want != 0 {
			differ++
		}
		if want != 1<<len(paths)-1 {
			same++
		}
	}
	// The pairs exercise both answers, and arrays whose order changed.
	if differ < pairs/3 || same < pairs/3 || reordered < pairs/50 {
		t.Fatalf("%d pairs with a changed path, %d with an unchanged one, %d with an array reordered: the generator does not exercise each", differ, same, reordered)
	}
	t.Logf("%d pairs (copies, mutations, reorders, unrelated: %v): %d with a changed path, %d with an unchanged path, %d with an array reordered; all equal to the JSON comparison", pairs, kinds, differ, same, reordered)
}

// list is the paths of bits, as relaydchanged carries them.
func (s *ChangedSet) list(bits uint64) string { return string(s.appendList(nil, bits, false)) }

// lookup is the value at p in a decoded JSON value, and whether there is one.
func lookup(v any, p Path) (any, bool) {
	for _, sg := range p.segs {
		m, ok := v.(map[string]any)
		if !ok {
			return nil, false
		}
		if v, ok = m[sg.name]; !ok {
			return nil, false
		}
	}
	return v, true
}

var genKeys = []string{"a", "b", "c", "x.y/z", "é", "q\"uote"}

func genValue(r *rand.Rand, depth int) any {
	k := r.IntN(8)
	if depth <= 0 && k < 2 {
		k += 2
	}
	switch k {
	case 0, 1:
		m := map[string]any{}
		for range r.IntN(4) {
			m[genKeys[r.IntN(len(genKeys))]] = genValue(r, depth-1)
		}
		return m
	case 2:
		if depth <= 0 {
			return nil
		}
		l := make([]any, r.IntN(4))
		for i := range l {
			l[i] = genValue(r, depth-1)
		}
		return l
	case 3:
		return []string{"", "x", "é", "a\"b", "tab\t", "\u2028", "y"}[r.IntN(7)]
	case 4:
		return []float64{0, 1, 1.5, 100, -2}[r.IntN(5)]
	case 5:
		return r.IntN(2) == 0
	}
	return nil
}

func genObject(r *rand.Rand) map[string]any {
	meta := map[string]any{"name": "o", "uid": "u", "resourceVersion": strconv.Itoa(r.IntN(1000))}
	if r.IntN(3) > 0 {
		meta["labels"] = genValue(r, 1)
	}
	if r.IntN(3) > 0 {
		meta["annotations"] = map[string]any{"x.y/z": genValue(r, 1), "other": "v"}
	}
	o := map[string]any{"apiVersion": "v1", "kind": "Thing", "metadata": meta}
	for _, k := range []string{"spec", "status", "data"} {
		if r.IntN(4) > 0 {
			o[k] = genValue(r, 3)
		}
	}
	return o
}

func deepCopy(v any) any {
	switch v := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(v))
		for k, x := range v {
			m[k] = deepCopy(x)
		}
		return m
	case []any:
		l := make([]any, len(v))
		for i, x := range v {
			l[i] = deepCopy(x)
		}
		return l
	}
	return v
}

// mutate changes, removes or nulls one to three members somewhere in o.
func mutate(r *rand.Rand, o map[string]any) map[string]any {
	for range 1 + r.IntN(3) {
		m := o
		for {
			keys := make([]string, 0, len(m))
			for k := range m {
				switch k {
				case "apiVersion", "kind", "name", "uid", "resourceVersion": // identity: strings
				default:
					keys = append(keys, k)
				}
			}
			slices.Sort(keys)
			if len(keys) == 0 {
				m[genKeys[r.IntN(len(genKeys))]] = genValue(r, 1)
				break
			}
			k := keys[r.IntN(len(keys))]
			if sub, ok := m[k].(map[string]any); ok && (k == "metadata" || r.IntN(3) > 0) {
				m = sub
				continue
			}
			switch r.IntN(3) {
			case 0:
				delete(m, k)
			case 1:
				m[k] = nil
			default:
				m[k] = genValue(r, 2)
			}
			break
		}
	}
	return o
}

// reorder permutes the arrays in v, nested ones (arrays in arrays, in
// objects) too, each with probability 1/2 (rotated by one, so that an
// array of two or more elements that are not all equal changes order).
// It reports whether some array's order changed.
func reorder(r *rand.Rand, v any) bool {
	changed := false
	switch v := v.(type) {
	case map[string]any:
		for _, k := range slices.Sorted(maps.Keys(v)) {
			changed = reorder(r, v[k]) || changed
		}
	case []any:
		for _, x := range v {
			changed = reorder(r, x) || changed
		}
		if len(v) > 1 && r.IntN(2) == 0 {
			before := fmt.Sprint(v)
			first := v[0]
			copy(v, v[1:])
			v[len(v)-1] = first
			changed = changed || fmt.Sprint(v) != before
		}
	}
	return changed
}

// serialize writes v as JSON with its members in a random order, random
// whitespace, strings with random \u escapes and numbers in random
// spellings (1, 1.0, 1e0, 10e-1; 0 as -0).
func serialize(r *rand.Rand, v any) []byte {
	var b bytes.Buffer
	ser(r, &b, v)
	return b.Bytes()
}

func ser(r *rand.Rand, b *bytes.Buffer, v any) {
	ws := func() {
		if r.IntN(4) == 0 {
			b.WriteString([]string{" ", "\n", "\t ", "  "}[r.IntN(4)])
		}
	}
	ws()
	switch v := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		r.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			ws()
			serString(r, b, k)
			ws()
			b.WriteByte(':')
			ser(r, b, v[k])
		}
		ws()
		b.WriteByte('}')
	case []any:
		b.WriteByte('[')
		for i, x := range v {
			if i > 0 {
				b.WriteByte(',')
			}
			ser(r, b, x)
		}
		b.WriteByte(']')
	case string:
		serString(r, b, v)
	case float64:
		s := strconv.FormatFloat(v, 'g', -1, 64)
		switch r.IntN(4) {
		case 0:
			if v == float64(int64(v)) {
				s = fmt.Sprintf("%.1f", v)
			}
		case 1:
			s = strconv.FormatFloat(v, 'e', -1, 64)
		case 2:
			if v == 0 {
				s = "-0"
			} else if v == 1 {
				s = "10e-1"
			}
		}
		b.WriteString(s)
	case bool:
		b.WriteString(strconv.FormatBool(v))
	case nil:
		b.WriteString("null")
	}
	ws()
}

func serString(r *rand.Rand, b *bytes.Buffer, s string) {
	if r.IntN(2) == 0 {
		j, _ := json.Marshal(s)
		b.Write(j)
		return
	}
	b.WriteByte('"')
	for _, c := range s {
		switch {
		case c == '"' || c == '\\' || c < 0x20 || r.IntN(3) == 0:
			fmt.Fprintf(b, `\u%04x`, c)
		default:
			b.WriteRune(c)
		}
	}
	b.WriteByte('"')
}

// The paths' fingerprints: a path's own content only, absent distinct from
// null, keyed ones differ from unkeyed ones and depend on the key.
func TestPathFingerprints(t *testing.T) {
	sh, err := NewShaping(ShapingOptions{ChangedPaths: []string{"spec", "status", "metadata.labels", "spec.x"}, Drop: []string{"spec.x"}})
	if err != nil {
		t.Fatal(err)
	}
	fps := func(f *Fingerprinter, raw string) []uint64 {
		t.Helper()
		o, err := ParseObjectShaped([]byte(raw), sh)
		if err != nil {
			t.Fatal(err)
		}
		return f.PathFingerprints(&o, nil)
	}
	base := fps(nil, `{"metadata":{"name":"a","labels":{"k":"v"}},"spec":{"x":1,"y":2},"status":null}`)
	for _, tc := range []struct {
		raw     string
		changed string
	}{
		{`{"metadata":{"labels":{"k":"v"},"name":"a","resourceVersion":"9"},"status":null,"spec":{"y":2.0,"x":1}}`, ""},
		{`{"metadata":{"name":"a","labels":{"k":"v"}},"spec":{"x":1,"y":3},"status":null}`, "spec"},
		{`{"metadata":{"name":"a","labels":{"k":"v"}},"spec":{"x":2,"y":2},"status":null}`, "spec,spec.x"},
		{`{"metadata":{"name":"a","labels":{"k":"v"}},"spec":{"x":1,"y":2}}`, "status"},
		{`{"metadata":{"name":"a","labels":{"k":"w"}},"spec":{"x":1,"y":2},"status":null}`, "metadata.labels"},
		{`{"metadata":{"name":"a"},"spec":{"y":2},"status":{}}`, "spec,status,metadata.labels,spec.x"},
	} {
		got := CompareChanged(sh.ChangedPaths(), PathsString(base), fps(nil, tc.raw))
		if s := got.list(got.Changed); s != tc.changed || got.Unknown != 0 {
			t.Errorf("%s: changed %q unknown %q, want %q", tc.raw, s, got.list(got.Unknown), tc.changed)
		}
	}
	if got := CompareChanged(sh.ChangedPaths(), "", base); got.Changed != 0 || got.list(got.Unknown) != "spec,status,metadata.labels,spec.x" {
		t.Errorf("no earlier fingerprints: changed %q unknown %q, want every path unknown", got.list(got.Changed), got.list(got.Unknown))
	}
	k1, _ := NewFingerprintKey([]byte("0123456789abcdef-one"))
	k2, _ := NewFingerprintKey([]byte("0123456789abcdef-two"))
	raw := `{"metadata":{"name":"a"},"spec":{"x":1}}`
	a, b, c := fps(nil, raw), fps(NewFingerprinter(k1), raw), fps(NewFingerprinter(k2), raw)
	for i := range a {
		if a[i] == b[i] || b[i] == c[i] || a[i] == PathUnknown || b[i] == PathUnknown {
			t.Errorf("path %d: unkeyed %x, key 1 %x, key 2 %x: want three different known fingerprints", i, a[i], b[i], c[i])
		}
	}
	if sh.PathSetID("") == sh.PathSetID(k1.ID()) || sh.PathSetID("") == 0 {
		t.Errorf("PathSetID does not depend on the key")
	}
	if (*Shaping)(nil).PathSetID("") != 0 {
		t.Errorf("PathSetID of no paths is not 0")
	}
}

// The extensions in both content modes, and what DecodeMessage reads back.
func TestEncodeChanged(t *testing.T) {
	for _, binary := range []bool{false, true} {
		e := newTestEncoder(t, EncoderOptions{Cluster: "prod", Source: "pods", MaxPayload: 1 << 20, Binary: binary})
		c, _ := podChange(t, PayloadFull)
		c.Type = Modified
		c.Changed = ChangedSet{Paths: []string{"spec", "status", `metadata.labels["a\"b"]`}, Changed: 0b101, Unknown: 0b010}
		m, err := e.Encode(c)
		if err != nil {
			t.Fatal(err)
		}
		env, err := DecodeMessage(m.Header, m.Data)
		if err != nil {
			t.Fatal(err)
		}
		if env.RelaydChanged != `spec,metadata.labels["a\"b"]` || env.RelaydChangedUnknown != "status" {
			t.Errorf("binary %v: relaydchanged %q, relaydchangedunknown %q", binary, env.RelaydChanged, env.RelaydChangedUnknown)
		}
		c.Changed = ChangedSet{Paths: []string{"spec"}}
		if m, err = e.Encode(c); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(m.Data), "relaydchanged") || fmt.Sprint(m.Header) != strings.ReplaceAll(fmt.Sprint(m.Header), "relaydchanged", "") {
			t.Errorf("binary %v: nothing changed, but the event has relaydchanged: %s %v", binary, m.Data, m.Header)
		}
	}
}

// changedPaths are refused with [*], above MaxChangedPaths and twice.
func TestChangedPathsRefused(t *testing.T) {
	many := make([]string, MaxChangedPaths+1)
	for i := range many {
		many[i] = "spec.p" + strconv.Itoa(i)
	}
	for _, tc := range []struct {
		paths []string
		want  string
	}{
		{[]string{"spec.containers[*].image"}, `changedPaths[0]: "spec.containers[*].image" has a [*] step`},
		{many, "changedPaths[64]: more than 64 changedPaths"},
		{[]string{"spec", `["spec"]`}, `changedPaths[1]: duplicate path "spec" (first at changedPaths[0])`},
	} {
		_, err := NewShaping(ShapingOptions{ChangedPaths: tc.paths})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want %q", tc.paths[:min(2, len(tc.paths))], err, tc.want)
		}
	}
}

// Fingerprinting the paths allocates nothing (dst has room); a Change
// without changedPaths encodes with exactly the allocations it had.
func TestChangedPathsAllocations(t *testing.T) {
	sh, err := NewShaping(ShapingOptions{ChangedPaths: []string{"spec", "status", "metadata.labels"}})
	if err != nil {
		t.Fatal(err)
	}
	raw := loadPod(t)
	o, err := ParseObjectShaped(raw, sh)
	if err != nil {
		t.Fatal(err)
	}
	var f *Fingerprinter
	buf := f.PathFingerprints(&o, nil)
	if n := testing.AllocsPerRun(100, func() { buf = f.PathFingerprints(&o, buf) }); n != 0 {
		t.Errorf("PathFingerprints: %v allocations, want 0", n)
	}
	prev := PathsString(buf)
	if n := testing.AllocsPerRun(100, func() { _ = CompareChanged(sh.ChangedPaths(), prev, buf) }); n != 0 {
		t.Errorf("CompareChanged: %v allocations, want 0", n)
	}
	e := newTestEncoder(t, EncoderOptions{Cluster: "prod", Source: "pods", MaxPayload: 1 << 20})
	c := &Change{Type: Modified, Origin: OriginWatch, Epoch: 1, Time: testTime, Resource: podsResource, Meta: o.Meta,
		Payload: PayloadFull, Data: o.AppendPayload(nil, PayloadFull, false)}
	encode := func() {
		if _, err := e.Encode(c); err != nil {
			t.Fatal(err)
		}
	}
	without := testing.AllocsPerRun(100, encode)
	c.Changed = ChangedSet{Paths: sh.ChangedPaths(), Changed: 0b011, Unknown: 0b100}
	if with := testing.AllocsPerRun(100, encode); with != without {
		t.Errorf("structured Encode with relaydchanged: %v allocations, without %v", with, without)
	}
}
