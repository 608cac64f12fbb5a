package event

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
)

// Which managedFields entries Author names, and how the extensions carry
// them (docs/CONSUMING.md, "Who changed it").
func TestAuthorNamesTheNewestEntries(t *testing.T) {
	entry := func(manager, op, sub, time string) string {
		s := `{"manager":"` + manager + `","operation":"` + op + `","apiVersion":"v1","fieldsType":"FieldsV1","fieldsV1":{"f:data":{".":{},"f:k":{}}}`
		if sub != "" {
			s += `,"subresource":"` + sub + `"`
		}
		if time != "" {
			s += `,"time":"` + time + `"`
		}
		return s + "}"
	}
	obj := func(mf string) string {
		m := `"name":"a","namespace":"ns","uid":"u","resourceVersion":"5"`
		if mf != "" {
			m += `,"managedFields":` + mf
		}
		return `{"apiVersion":"v1","kind":"ConfigMap","metadata":{` + m + `},"data":{"k":"v"}}`
	}
	for _, c := range []struct {
		name, mf         string
		manager, op, sub string
	}{
		{"no managedFields", "", "", "", ""},
		{"null managedFields", "null", "", "", ""},
		{"empty list", "[]", "", "", ""},
		{"one entry", "[" + entry("kubectl-client-side-apply", "Update", "", "2026-11-26T10:00:00Z") + "]", "kubectl-client-side-apply", "Update", ""},
		{"the newest of two", "[" + entry("kubectl", "Apply", "", "2026-11-26T10:00:00Z") + "," + entry("operator", "Update", "", "2026-11-26T10:00:07Z") + "]", "operator", "Update", ""},
		{"the newest first in the list", "[" + entry("operator", "Update", "", "2026-11-26T10:00:07Z") + "," + entry("kubectl", "Apply", "", "2026-11-26T10:00:00Z") + "]", "operator", "Update", ""},
		{"a status update", "[" + entry("kubectl", "Apply", "", "2026-11-26T10:00:00Z") + "," + entry("kubelet", "Update", "status", "2026-11-26T10:00:07Z") + "]", "kubelet", "Update", "status"},
		{"two managers in the same second, item for item", "[" + entry("kubectl", "Apply", "", "2026-11-26T10:00:07Z") + "," + entry("old", "Update", "", "2026-11-26T09:00:00Z") + "," + entry("kubelet", "Update", "status", "2026-11-26T10:00:07Z") + "]",
			"kubectl,kubelet", "Apply,Update", ",status"},
		{"same second, no subresource: none", "[" + entry("a", "Apply", "", "2026-11-26T10:00:07Z") + "," + entry("b", "Update", "", "2026-11-26T10:00:07Z") + "]", "a,b", "Apply,Update", ""},
		{"five in the same second (past the inline entries)", "[" + strings.Repeat(entry("m", "Update", "", "2026-11-26T10:00:07Z")+",", 4) + entry("n", "Update", "scale", "2026-11-26T10:00:07Z") + "]",
			"m,m,m,m,n", "Update,Update,Update,Update,Update", ",,,,scale"},
		{"an entry without a time is not named", "[" + entry("untimed", "Update", "", "") + "," + entry("timed", "Update", "", "2026-11-26T10:00:00Z") + "]", "timed", "Update", ""},
		{"only entries without a time", "[" + entry("untimed", "Update", "", "") + "]", "", "", ""},
		{"escaped name, alone: decoded", "[" + entry(`my\u002fmanager`, "Update", "", "2026-11-26T10:00:00Z") + "]", "my/manager", "Update", ""},
		{"',' and '%' inside a list item: percent-encoded", "[" + entry(`a,b%`, "Update", "", "2026-11-26T10:00:00Z") + "," + entry(`c\u002cd`, "Apply", "", "2026-11-26T10:00:00Z") + "]", "a%2Cb%25,c%2Cd", "Update,Apply", ""},
		{"',' in a single name: as it is", "[" + entry("a,b", "Update", "", "2026-11-26T10:00:00Z") + "]", "a,b", "Update", ""},
		{"members of other types are ignored", `[{"manager":7,"operation":"Update","time":"2026-11-26T10:00:00Z"}]`, "", "Update", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			o, err := ParseObject([]byte(obj(c.mf)))
			if err != nil {
				t.Fatal(err)
			}
			a := o.Author()
			if got := [3]string{a.Manager(), a.Operation(), a.Subresource()}; got != [3]string{c.manager, c.op, c.sub} {
				t.Errorf("Author = %q, want %q", got, [3]string{c.manager, c.op, c.sub})
			}
			// Both content modes carry the same values.
			for _, binary := range []bool{false, true} {
				e := newTestEncoder(t, EncoderOptions{Cluster: "prod", Source: "cms", Binary: binary})
				msg, err := e.Encode(&Change{Type: Modified, Origin: OriginWatch, Epoch: 1, Time: testTime, Resource: Resource{Version: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespaced: true}, Meta: o.Meta,
					Payload: PayloadFull, Data: o.AppendPayload(nil, PayloadFull, false), Author: a})
				if err != nil {
					t.Fatal(err)
				}
				env, err := DecodeMessage(msg.Header, msg.Data)
				if err != nil {
					t.Fatal(err)
				}
				if got := [3]string{env.K8sManager, env.K8sOperation, env.K8sSubresource}; got != [3]string{c.manager, c.op, c.sub} {
					t.Errorf("binary %v: extensions %q, want %q", binary, got, [3]string{c.manager, c.op, c.sub})
				}
				if !binary && a.Len() == 0 && strings.Contains(string(msg.Data), "k8smanager") {
					t.Errorf("an event naming nobody carries k8smanager: %s", msg.Data)
				}
				if !binary && c.sub == "" && strings.Contains(string(msg.Data), "k8ssubresource") {
					t.Errorf("k8ssubresource present without a subresource: %s", msg.Data)
				}
			}
		})
	}
}

// Reading who changed a pod, and carrying it in a structured event, costs no
// allocation.
func TestAuthorAllocatesNothing(t *testing.T) {
	raw := loadPod(t)
	o, err := ParseObject(raw)
	if err != nil {
		t.Fatal(err)
	}
	a := o.Author()
	if a.Manager() != "kubelet" || a.Subresource() != "status" {
		t.Fatalf("pod fixture: Author %q/%q, want kubelet/status", a.Manager(), a.Subresource())
	}
	frame := append(append([]byte(`{"type":"MODIFIED","object":`), raw...), '}')
	_, fo, err := ParseWatchEvent(frame)
	if err != nil {
		t.Fatal(err)
	}
	if b := fo.Author(); b.Manager() != a.Manager() || b.Subresource() != a.Subresource() {
		t.Errorf("from a watch frame: %q/%q, from the object: %q/%q", b.Manager(), b.Subresource(), a.Manager(), a.Subresource())
	}
	_, d := o.AuthorSince(0)
	if _, fd := fo.AuthorSince(0); fd != d || d == 0 {
		t.Errorf("digest from a watch frame %x, from the object %x", fd, d)
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = o.AuthorSince(d) }); n != 0 {
		t.Errorf("AuthorSince: %v allocations, want 0", n)
	}
	e := newTestEncoder(t, EncoderOptions{Cluster: "prod", Source: "pods"})
	c := &Change{Type: Modified, Origin: OriginWatch, Epoch: 1, Time: testTime, Resource: podsResource, Meta: o.Meta,
		Payload: PayloadFull, Data: o.AppendPayload(nil, PayloadFull, false)}
	encode := func() {
		m, err := e.Encode(c)
		if err != nil {
			t.Fatal(err)
		}
		m.Release()
	}
	without := testing.AllocsPerRun(100, encode)
	c.Author = a
	if with := testing.AllocsPerRun(100, encode); with != without {
		t.Errorf("Encode: %v allocations with the author, %v without", with, without)
	}
}

// With the previous version's digest, the author is the entries that
// differ from it; without it, the newest second; the digest is not known
// past maxDigestEntries entries.
func TestAuthorSinceNamesTheEntriesThatDiffer(t *testing.T) {
	entry := func(manager, sub, time, fields string) string {
		s := `{"manager":"` + manager + `","operation":"Update","apiVersion":"apps/v1","time":"` + time + `","fieldsType":"FieldsV1","fieldsV1":{` + fields + `}`
		if sub != "" {
			s += `,"subresource":"` + sub + `"`
		}
		return s + "}"
	}
	untimed := `{"manager":"hpa","operation":"Update","apiVersion":"apps/v1","fieldsType":"FieldsV1","fieldsV1":{"f:spec":{"f:replicas":{}}},"subresource":"scale"}`
	parse := func(entries ...string) *Object {
		raw := `{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"web","uid":"u","resourceVersion":"9","managedFields":[` + strings.Join(entries, ",") + `]},"spec":{}}`
		o, err := ParseObject([]byte(raw))
		if err != nil {
			t.Fatal(err)
		}
		return &o
	}
	alice := entry("alice", "", "2026-11-26T10:00:00Z", `"f:spec":{"f:template":{}}`)
	bob := entry("bob", "", "2026-11-26T10:00:00Z", `"f:metadata":{"f:labels":{}}`)
	bob2 := entry("bob", "", "2026-11-26T10:00:00Z", `"f:metadata":{"f:labels":{},"f:annotations":{}}`)
	carol := entry("carol", "status", "2026-11-26T09:59:59Z", `"f:status":{}`)
	for _, c := range []struct {
		name       string
		prev, next *Object
		want       [3]string
	}{
		{"first sight: the newest second", nil, parse(alice, bob, carol), [3]string{"alice,bob", "Update,Update", ""}},
		{"an entry added", parse(alice), parse(alice, bob), [3]string{"bob", "Update", ""}},
		{"an entry rewritten by its manager", parse(alice, bob), parse(alice, entry("bob", "", "2026-11-26T10:00:05Z", `"f:metadata":{"f:labels":{},"f:annotations":{}}`)), [3]string{"bob", "Update", ""}},
		{"a manager writing twice within one second: nobody", parse(alice, bob), parse(alice, bob2), [3]string{}},
		{"an older entry rewritten: named although not the newest", parse(entry("alice", "", "2026-11-26T10:00:09Z", ""), carol), parse(entry("alice", "", "2026-11-26T10:00:09Z", ""), entry("carol", "status", "2026-11-26T10:00:03Z", `"f:status":{"f:replicas":{}}`)), [3]string{"carol", "Update", "status"}},
		{"a scale update: its entry has no time", parse(alice, bob), parse(alice, untimed, bob), [3]string{"hpa", "Update", "scale"}},
		{"fields taken over: the entry that lost them is not named", parse(entry("alice", "", "2026-11-26T10:00:00Z", `"f:spec":{"f:replicas":{},"f:template":{}}`), bob), parse(entry("alice", "", "2026-11-26T10:00:00Z", `"f:spec":{"f:template":{}}`), untimed, bob), [3]string{"hpa", "Update", "scale"}},
		{"a second scale by the same manager: nobody", parse(alice, untimed), parse(alice, untimed), [3]string{}},
		{"managedFields unchanged: nobody", parse(alice, bob), parse(alice, bob), [3]string{}},
		{"managedFields removed: nobody", parse(alice, bob), parse(), [3]string{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var prev uint64
			if c.prev != nil {
				var a Author
				a, prev = c.prev.AuthorSince(0)
				if prev == 0 && a.Len() > 0 {
					t.Fatalf("no digest for %d entries", a.Len())
				}
			}
			a, _ := c.next.AuthorSince(prev)
			if got := [3]string{a.Manager(), a.Operation(), a.Subresource()}; got != c.want {
				t.Errorf("author %q, want %q", got, c.want)
			}
		})
	}
	_, d := parse(alice, bob, carol, untimed).AuthorSince(0)
	if d == 0 {
		t.Errorf("no digest for %d entries", maxDigestEntries)
	}
	if _, d := parse(alice, bob, carol, untimed, entry("dave", "", "2026-11-26T10:00:00Z", "")).AuthorSince(0); d != 0 {
		t.Errorf("digest %x for %d entries, want 0 (not known)", d, maxDigestEntries+1)
	}
	if a, _ := parse(alice, bob2).AuthorSince(0); a.Len() != 2 {
		t.Errorf("not known (digest 0): %d entries named, want the newest second's 2", a.Len())
	}
}

// The entries the parse recorded read exactly as the member-by-member path
// reads the list, in the apiserver's layout and others; every list of up
// to maxMFEntries entries is read from the record.
func TestAuthorFastPathEqualsSlowPath(t *testing.T) {
	type entry struct {
		Manager     string          `json:"manager,omitempty"`
		Operation   string          `json:"operation,omitempty"`
		APIVersion  string          `json:"apiVersion,omitempty"`
		Time        *string         `json:"time,omitempty"`
		FieldsType  string          `json:"fieldsType,omitempty"`
		FieldsV1    json.RawMessage `json:"fieldsV1,omitempty"`
		Subresource string          `json:"subresource,omitempty"`
	}
	rng := rand.New(rand.NewPCG(1, 2))
	pick := func(xs ...string) string { return xs[rng.IntN(len(xs))] }
	var fields func(depth int) string
	fields = func(depth int) string {
		if depth > 3 || rng.IntN(3) == 0 {
			return "{}"
		}
		var ms []string
		for range rng.IntN(4) {
			k := pick(`"f:spec"`, `"f:replicas"`, `"."`, `"k:{\"name\":\"app\"}"`, `"v:\"x,y\""`, `"i:0"`)
			ms = append(ms, k+":"+fields(depth+1))
		}
		return "{" + strings.Join(ms, ",") + "}"
	}
	apiserver, other := 0, 0
	for n := range 3000 {
		es := []entry{}
		for range rng.IntN(maxMFEntries + 3) {
			e := entry{Manager: pick("kubectl", "kube-controller-manager", "a,b", "x%y", `q"t`, "é", "hpa"), Operation: pick("Apply", "Update"),
				APIVersion: "apps/v1", FieldsType: "FieldsV1", FieldsV1: json.RawMessage(fields(0))}
			if rng.IntN(4) > 0 {
				ts := pick("2026-11-26T10:00:00Z", "2026-11-26T10:00:01Z", "2026-11-26T09:59:59Z")
				e.Time = &ts
			}
			if rng.IntN(3) == 0 {
				e.Subresource = pick("status", "scale")
			}
			es = append(es, e)
		}
		mf, err := json.Marshal(es)
		if err != nil {
			t.Fatal(err)
		}
		layout := "apiserver"
		if n%5 == 4 && len(es) > 0 { // another member order, or spaces: the slow path's
			type otherEntry struct { // time and fieldsType after fieldsV1
				Manager     string          `json:"manager,omitempty"`
				Operation   string          `json:"operation,omitempty"`
				FieldsV1    json.RawMessage `json:"fieldsV1,omitempty"`
				Time        *string         `json:"time,omitempty"`
				FieldsType  string          `json:"fieldsType,omitempty"`
				Subresource string          `json:"subresource,omitempty"`
				APIVersion  string          `json:"apiVersion,omitempty"`
			}
			os := make([]otherEntry, len(es))
			for k, e := range es {
				os[k] = otherEntry{e.Manager, e.Operation, e.FieldsV1, e.Time, e.FieldsType, e.Subresource, e.APIVersion}
			}
			if mf, err = json.Marshal(os); err != nil {
				t.Fatal(err)
			}
			if rng.IntN(2) == 0 {
				mf = []byte(strings.ReplaceAll(string(mf), `,"`, `, "`))
			}
			layout = "other"
		}
		raw := `{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"w","uid":"u","resourceVersion":"1","managedFields":` + string(mf) + `}}`
		o, err := ParseObject([]byte(raw))
		if err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		m := &o.fix[fxManagedFields]
		data := o.Raw[:m.val]
		i := bytes.IndexByte(data[m.key:], '[') + m.key
		var prev uint64
		if rng.IntN(2) == 0 {
			prev = uint64(rng.Uint32())<<16 | 1
		}
		fast := entryScan{data: data, prev: prev, changed: Author{raw: o.Raw}, newest: Author{raw: o.Raw}}
		ok := fast.recorded(&o)
		slow := entryScan{data: data, prev: prev, changed: Author{raw: o.Raw}, newest: Author{raw: o.Raw}}
		slow.slow(i)
		if layout == "apiserver" {
			apiserver++
		}
		if ok != (len(es) <= maxMFEntries) {
			t.Fatalf("%d entries: the recorded path took it: %v\n%s", len(es), ok, mf)
		}
		if !ok {
			other++
			continue
		}
		for _, c := range []struct {
			name       string
			fast, slow *Author
		}{{"changed", &fast.changed, &slow.changed}, {"newest", &fast.newest, &slow.newest}} {
			f := [3]string{c.fast.Manager(), c.fast.Operation(), c.fast.Subresource()}
			s := [3]string{c.slow.Manager(), c.slow.Operation(), c.slow.Subresource()}
			if f != s {
				t.Fatalf("%s layout, %s: fast %q, slow %q\n%s", layout, c.name, f, s, mf)
			}
		}
		if fast.digest != slow.digest || fast.n != slow.n {
			t.Fatalf("%s layout: digest fast %x (%d entries), slow %x (%d)\n%s", layout, fast.digest, fast.n, slow.digest, slow.n, mf)
		}
	}
	if apiserver < 2000 || other < 200 {
		t.Errorf("%d lists in the apiserver's layout, %d lists past the recorded entries: too few to compare", apiserver, other)
	}
}
