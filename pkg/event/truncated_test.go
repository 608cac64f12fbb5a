package event

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// capEntry is a managedFields entry with the given raw (JSON-escaped)
// manager and subresource ("": none).
func capEntry(manager, sub, time string) string {
	s := `{"manager":"` + manager + `","operation":"Update","apiVersion":"v1","time":"` + time + `","fieldsType":"FieldsV1","fieldsV1":{"f:data":{}}`
	if sub != "" {
		s += `,"subresource":"` + sub + `"`
	}
	return s + "}"
}

// authorOf is the Author of a ConfigMap with managedFields entries.
func authorOf(t testing.TB, entries ...string) (Author, *Object) {
	t.Helper()
	o, err := ParseObject([]byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","namespace":"ns","uid":"u","resourceVersion":"5","managedFields":[` +
		strings.Join(entries, ",") + `]}}`))
	if err != nil {
		t.Fatal(err)
	}
	return o.Author(), &o
}

// encodeBoth encodes c in both content modes (max payload limit, 0: none)
// and returns what DecodeMessage reads of each, checking that the
// messages fit and that Message.Truncated agrees with relaydtruncated.
func encodeBoth(t *testing.T, c *Change, limit int) [2]Envelope {
	t.Helper()
	var out [2]Envelope
	for i, binary := range []bool{false, true} {
		e := newTestEncoder(t, EncoderOptions{Cluster: "prod", Source: "cms", Binary: binary, MaxPayload: limit})
		msg, err := e.Encode(c)
		if err != nil {
			t.Fatalf("binary %v: %v", binary, err)
		}
		if limit > 0 && msg.Size() > limit {
			t.Fatalf("binary %v: %d bytes, over the max payload %d", binary, msg.Size(), limit)
		}
		env, err := DecodeMessage(msg.Header, msg.Data)
		if err != nil {
			t.Fatalf("binary %v: %v", binary, err)
		}
		if msg.Truncated != (env.RelaydTruncated != "") {
			t.Errorf("binary %v: Message.Truncated %v, relaydtruncated %q", binary, msg.Truncated, env.RelaydTruncated)
		}
		out[i] = env
	}
	return out
}

func cmChange(a Author) *Change {
	return &Change{Type: Modified, Origin: OriginWatch, Epoch: 1, Time: testTime,
		Resource: Resource{Version: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespaced: true},
		Meta:     Meta{Namespace: "ns", Name: "a", UID: "u", ResourceVersion: "5"}, Payload: PayloadFull, Data: []byte(`{}`), Author: a}
}

const capTime = "2026-11-26T10:00:00Z"

// The caps of k8smanager, k8soperation and k8ssubresource at their exact
// boundaries (MaxAuthorEntries entries, MaxExtensionBytes bytes of each
// value), in both content modes (docs/CONSUMING.md, "Truncated
// extensions").
func TestAuthorCapsAtTheBoundaries(t *testing.T) {
	all := "k8smanager,k8soperation,k8ssubresource"
	many := func(n int, sub string) []string {
		var es []string
		for i := range n {
			es = append(es, capEntry(fmt.Sprintf("m%d", i), sub, capTime))
		}
		return es
	}
	names := func(n int) string {
		var ms []string
		for i := range n {
			ms = append(ms, fmt.Sprintf("m%d", i))
		}
		return strings.Join(ms, ",")
	}
	ops := func(n int) string { return strings.TrimSuffix(strings.Repeat("Update,", n), ",") }
	x := func(n int) string { return strings.Repeat("x", n) }
	pct := func(n int) string { return strings.Repeat("%", n) }
	half := MaxExtensionBytes / 2
	for _, c := range []struct {
		name             string
		entries          []string
		manager, op, sub string
		truncated        string
	}{
		{"MaxAuthorEntries entries: all named", many(MaxAuthorEntries, ""), names(MaxAuthorEntries), ops(MaxAuthorEntries), "", ""},
		{"one more: the first MaxAuthorEntries named", many(MaxAuthorEntries+1, ""), names(MaxAuthorEntries), ops(MaxAuthorEntries), "", all},
		{"1,000 entries with a subresource", many(1000, "status"), names(MaxAuthorEntries), ops(MaxAuthorEntries), strings.TrimSuffix(strings.Repeat("status,", MaxAuthorEntries), ","), all},
		{"two managers of MaxExtensionBytes with the comma", []string{capEntry(x(half), "", capTime), capEntry(x(half-1), "", capTime)},
			x(half) + "," + x(half-1), "Update,Update", "", ""},
		{"one byte more: the first named alone", []string{capEntry(x(half), "", capTime), capEntry(x(half), "", capTime)},
			x(half), "Update", "", all},
		{"percent-encoded list items count as encoded", []string{capEntry(pct((MaxExtensionBytes-2)/3), "", capTime), capEntry("a", "", capTime)},
			strings.Repeat("%25", (MaxExtensionBytes-2)/3) + ",a", "Update,Update", "", ""},
		{"one '%' more: the first named alone, not list-encoded", []string{capEntry(pct((MaxExtensionBytes-2)/3+1), "", capTime), capEntry("a", "", capTime)},
			pct((MaxExtensionBytes-2)/3 + 1), "Update", "", all},
		{"a single manager of MaxExtensionBytes", []string{capEntry(x(MaxExtensionBytes), "", capTime)}, x(MaxExtensionBytes), "Update", "", ""},
		{"one byte more: cut", []string{capEntry(x(MaxExtensionBytes+1), "", capTime)}, x(MaxExtensionBytes), "Update", "", "k8smanager"},
		{"cut at a character boundary", []string{capEntry("a"+strings.Repeat("é", half), "", capTime)}, "a" + strings.Repeat("é", half-1), "Update", "", "k8smanager"},
		{"escapes decode before they count", []string{capEntry(strings.Repeat(`\u0078`, MaxExtensionBytes), "", capTime)}, x(MaxExtensionBytes), "Update", "", ""},
		{"a subresource too long: cut, the manager complete", []string{capEntry("m", x(MaxExtensionBytes+5), capTime)}, "m", "Update", x(MaxExtensionBytes), "k8ssubresource"},
		{"a long first entry of several: alone and cut", []string{capEntry(x(MaxExtensionBytes+1), "", capTime), capEntry("b", "", capTime)},
			x(MaxExtensionBytes), "Update", "", "k8smanager,k8soperation,k8ssubresource"},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, _ := authorOf(t, c.entries...)
			for i, env := range encodeBoth(t, cmChange(a), 0) {
				if got := [4]string{env.K8sManager, env.K8sOperation, env.K8sSubresource, env.RelaydTruncated}; got != [4]string{c.manager, c.op, c.sub, c.truncated} {
					t.Errorf("binary %v: manager, operation, subresource, truncated =\n%.200q\nwant\n%.200q", i == 1, got, [4]string{c.manager, c.op, c.sub, c.truncated})
				}
			}
		})
	}
}

// relaydchanged and relaydchangedunknown keep the paths that fit within
// MaxExtensionBytes, at the exact boundary.
func TestChangedCapsAtTheBoundaries(t *testing.T) {
	path := func(c byte, n int) string { return "data." + strings.Repeat(string(c), n-len("data.")) }
	// Three paths, joined: 2048 bytes exactly, or one more.
	exact := []string{path('a', 1000), path('b', 1000), path('c', MaxExtensionBytes-2002)}
	over := []string{path('a', 1000), path('b', 1000), path('c', MaxExtensionBytes-2001)}
	for _, c := range []struct {
		name               string
		paths              []string
		changed, unknown   uint64
		wantC, wantU, want string
	}{
		{"all paths, joined, of MaxExtensionBytes", exact, 0b111, 0, strings.Join(exact, ","), "", ""},
		{"one byte more: the last left out", over, 0b111, 0, strings.Join(over[:2], ","), "", "relaydchanged"},
		{"unknown too", over, 0b001, 0b110, over[0], strings.Join(over[1:], ","), ""},
		{"both", over, 0b111, 0b111, strings.Join(over[:2], ","), strings.Join(over[:2], ","), "relaydchanged,relaydchangedunknown"},
		{"a path longer than the cap alone: none listed", []string{path('z', MaxExtensionBytes+1), "spec"}, 0b11, 0, "", "", "relaydchanged"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ch := cmChange(Author{})
			ch.Changed = ChangedSet{Paths: c.paths, Changed: c.changed, Unknown: c.unknown}
			for i, env := range encodeBoth(t, ch, 0) {
				if got := [3]string{env.RelaydChanged, env.RelaydChangedUnknown, env.RelaydTruncated}; got != [3]string{c.wantC, c.wantU, c.want} {
					t.Errorf("binary %v: changed, unknown, truncated = %.120q, want %.120q", i == 1, got, [3]string{c.wantC, c.wantU, c.want})
				}
			}
		})
	}
}

// The largest extensions writers can make fit: 1,000 managedFields entries
// of the same second (and, with the previous version's digest, all new)
// with the longest percent-heavy names stay within a bound far under the
// NATS default max payload of 1 MiB, in both content modes. (They made the
// event about 1.5 MiB without data, and Encode failed.)
func TestWriterExtensionsAreBounded(t *testing.T) {
	var es []string
	for i := range 1000 {
		// 128 bytes of '%' and ',' (the apiserver's limit for a manager), a
		// 256-byte subresource of control characters and '"' (its limit):
		// the most each byte grows when list-, header- and JSON-escaped.
		es = append(es, capEntry(fmt.Sprintf("%04d", i)+strings.Repeat("%,", 62), strings.Repeat(`\u0001\"`, 128), capTime))
	}
	a, o := authorOf(t, es...)
	if a.Len() != MaxAuthorEntries {
		t.Fatalf("Author names %d entries, want %d", a.Len(), MaxAuthorEntries)
	}
	changed, _ := o.AuthorSince(1)
	if changed.Len() != MaxAuthorEntries {
		t.Fatalf("AuthorSince names %d entries, want %d", changed.Len(), MaxAuthorEntries)
	}
	paths := make([]string, MaxChangedPaths)
	for i := range paths {
		paths[i] = fmt.Sprintf(`metadata.annotations["%02d%s"]`, i, strings.Repeat("\x01", 200))
	}
	for _, author := range []Author{a, changed} {
		ch := cmChange(author)
		ch.Data = nil // the reference: the extensions make the size
		ch.Changed = ChangedSet{Paths: paths, Changed: 1<<MaxChangedPaths - 1, Unknown: 1<<MaxChangedPaths - 1}
		for _, binary := range []bool{false, true} {
			e := newTestEncoder(t, EncoderOptions{Cluster: "prod", Source: "cms", Binary: binary, MaxPayload: 1 << 20})
			msg, err := e.Encode(ch)
			if err != nil {
				t.Fatalf("binary %v: %v", binary, err)
			}
			// Five extensions of at most MaxExtensionBytes, each at most 6
			// times as long on the wire, and 1 KiB for the rest.
			if bound := 5*6*MaxExtensionBytes + 1024; msg.Size() > bound || msg.Oversize || !msg.Truncated {
				t.Errorf("binary %v: %d bytes (bound %d), oversize %v, truncated %v", binary, msg.Size(), bound, msg.Oversize, msg.Truncated)
			}
			env, err := DecodeMessage(msg.Header, msg.Data)
			if err != nil {
				t.Fatal(err)
			}
			for name, v := range map[string]string{"k8smanager": env.K8sManager, "k8ssubresource": env.K8sSubresource, "relaydchanged": env.RelaydChanged, "relaydchangedunknown": env.RelaydChangedUnknown} {
				if len(v) > MaxExtensionBytes || v == "" {
					t.Errorf("binary %v: %s of %d bytes", binary, name, len(v))
				}
			}
			if want := "k8smanager,k8soperation,k8ssubresource,relaydchanged,relaydchangedunknown"; env.RelaydTruncated != want {
				t.Errorf("binary %v: relaydtruncated %q, want %q", binary, env.RelaydTruncated, want)
			}
		}
	}
}

// An event without data whose writer-controlled extensions still exceed
// the max payload is sent without them, and relaydtruncated names them:
// never an error that stalls the source.
func TestBareEventLeavesOutWriterExtensions(t *testing.T) {
	var es []string
	for i := range MaxAuthorEntries {
		es = append(es, capEntry(fmt.Sprintf("manager-%02d-%s", i, strings.Repeat("m", 100)), "status", capTime))
	}
	a, _ := authorOf(t, es...)
	ch := cmChange(a)
	ch.Changed = ChangedSet{Paths: []string{"data", "metadata.labels"}, Changed: 1, Unknown: 2}
	for _, binary := range []bool{false, true} {
		e := newTestEncoder(t, EncoderOptions{Cluster: "prod", Source: "cms", Binary: binary})
		full, err := e.Encode(ch)
		if err != nil {
			t.Fatal(err)
		}
		bare := newTestEncoder(t, EncoderOptions{Cluster: "prod", Source: "cms", Binary: binary, MaxPayload: 1200})
		msg, err := bare.Encode(ch)
		if err != nil {
			t.Fatalf("binary %v (%d bytes with data): %v", binary, full.Size(), err)
		}
		env, err := DecodeMessage(msg.Header, msg.Data)
		if err != nil {
			t.Fatal(err)
		}
		if !msg.Unencodable || !msg.Truncated || msg.Size() > 1200 || env.K8sManager != "" || env.K8sOperation != "" || env.K8sSubresource != "" || env.RelaydChanged != "" || env.RelaydChangedUnknown != "" ||
			env.RelaydTruncated != "k8smanager,k8soperation,k8ssubresource,relaydchanged,relaydchangedunknown" || env.K8sName != "a" || env.K8sUID != "u" {
			t.Errorf("binary %v: %d bytes, unencodable %v, truncated %v, envelope %+v", binary, msg.Size(), msg.Unencodable, msg.Truncated, env)
		}
	}
	// Under a max payload the extensions fit in, they stay.
	for _, env := range encodeBoth(t, ch, 4096) {
		if env.RelaydTruncated != "" || env.K8sManager == "" || env.RelaydChanged != "data" {
			t.Errorf("under 4 KiB: %+v", env)
		}
	}
}

// The structured body stays valid JSON whatever is cut.
func TestTruncatedStructuredIsJSON(t *testing.T) {
	a, _ := authorOf(t, capEntry(strings.Repeat(`\"é`, MaxExtensionBytes), "", capTime))
	e := newTestEncoder(t, EncoderOptions{Cluster: "prod", Source: "cms"})
	msg, err := e.Encode(cmChange(a))
	if err != nil {
		t.Fatal(err)
	}
	if !json.Valid(msg.Data) {
		t.Fatalf("invalid JSON: %.300s", msg.Data)
	}
}

// Whatever managedFields entries writers make (n entries of the same
// second, managers and subresources of any bytes), the event encodes under
// NATS's default max payload, each extension within MaxExtensionBytes, and
// the lists name the first entries, item for item (a single one possibly
// cut), flagged relaydtruncated when they name less.
func FuzzWriterExtensionsFit(f *testing.F) {
	f.Add(uint16(1), "kubectl", "")
	f.Add(uint16(17), "m", "status")
	f.Add(uint16(1000), strings.Repeat("%,", 64), strings.Repeat("%", 256))
	f.Add(uint16(2), strings.Repeat("é", 1100), "\x01\"")
	f.Fuzz(func(t *testing.T, n uint16, manager, sub string) {
		n = n%200 + 1
		var es []string
		var managers, subs []string
		for i := range int(n) {
			m := fmt.Sprintf("%s%d", manager, i)
			mj, _ := json.Marshal(m)
			sj, _ := json.Marshal(sub)
			es = append(es, `{"manager":`+string(mj)+`,"operation":"Apply","time":"`+capTime+`","subresource":`+string(sj)+`}`)
			var dm, ds string // as encoding/json decodes them
			if json.Unmarshal(mj, &dm) != nil || json.Unmarshal(sj, &ds) != nil {
				t.Fatal("json round trip")
			}
			managers, subs = append(managers, dm), append(subs, ds)
		}
		a, _ := authorOf(t, es...)
		ch := cmChange(a)
		ch.Data = nil
		unescape := strings.NewReplacer("%2C", ",", "%25", "%")
		// check says whether the list v names want[:named], a single value
		// possibly cut (then it returns true: cut).
		check := func(name, v string, want []string, named int) (cut bool) {
			if len(v) > MaxExtensionBytes {
				t.Fatalf("%s of %d bytes", name, len(v))
			}
			if named == 1 {
				if v != want[0] && (!strings.HasPrefix(want[0], v) || len(want[0]) <= MaxExtensionBytes) {
					t.Fatalf("%s %.80q, want %.80q", name, v, want[0])
				}
				return v != want[0]
			}
			items := strings.Split(v, ",")
			if len(items) != named {
				t.Fatalf("%s has %d items, k8soperation %d", name, len(items), named)
			}
			for i, it := range items {
				if unescape.Replace(it) != want[i] {
					t.Fatalf("%s item %d %.80q, want %.80q", name, i, unescape.Replace(it), want[i])
				}
			}
			return false
		}
		for _, env := range encodeBoth(t, ch, 1<<20) {
			named := len(strings.Split(env.K8sOperation, ","))
			if named > MaxAuthorEntries || named > int(n) {
				t.Fatalf("%d entries named of %d", named, n)
			}
			want := ""
			if named < int(n) {
				want = "k8smanager,k8soperation,k8ssubresource"
			}
			mcut := check("k8smanager", env.K8sManager, managers, named)
			scut := false
			if sub != "" {
				scut = check("k8ssubresource", env.K8sSubresource, subs, named)
			} else if env.K8sSubresource != "" {
				t.Fatalf("k8ssubresource %.80q, want none", env.K8sSubresource)
			}
			if want == "" {
				var cut []string
				if mcut {
					cut = append(cut, "k8smanager")
				}
				if scut {
					cut = append(cut, "k8ssubresource")
				}
				want = strings.Join(cut, ",")
			}
			if env.RelaydTruncated != want {
				t.Fatalf("%d of %d entries named (cut: manager %v, subresource %v), relaydtruncated %q, want %q", named, n, mcut, scut, env.RelaydTruncated, want)
			}
		}
	})
}

// BenchmarkEncodeTruncated is the encode of an event whose author lists
// are capped: 1,000 managedFields entries of the same second with the
// longest percent-heavy names (the cost of the caps is that of the
// entries named, not of those left out).
func BenchmarkEncodeTruncated(b *testing.B) {
	var es []string
	for i := range 1000 {
		es = append(es, capEntry(fmt.Sprintf("%04d", i)+strings.Repeat("%,", 62), strings.Repeat("%", 256), capTime))
	}
	a, _ := authorOf(b, es...)
	for _, binary := range []bool{false, true} {
		b.Run(map[bool]string{false: "structured", true: "binary"}[binary], func(b *testing.B) {
			e := newTestEncoder(b, EncoderOptions{Cluster: "prod", Source: "cms", Binary: binary, MaxPayload: 1 << 20})
			c := cmChange(a)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := e.Encode(c); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
