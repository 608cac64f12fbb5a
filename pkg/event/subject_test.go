package event

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
)

func TestEncodeToken(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", ""},
		{"web-0", "web-0"},
		{"a.b", "a%2Eb"},
		{"50%", "50%25"},
		{"ü", "%C3%BC"},
		{"*", "%2A"},
		{">", "%3E"},
		{"a b\tc\nd", "a%20b%09c%0Ad"},
		{"\x00\x1f\x7f", "%00%1F%7F"},
		{"%2E", "%252E"},
		{"example.com/v1", "example%2Ecom/v1"},
		{"system:controller:x", "system:controller:x"},
		{"_", "_"},
		{"core", "core"},
		{"%H", "%25H"},
		{"😀", "%F0%9F%98%80"},
		{"\xff", "%FF"},
	}
	for _, tt := range tests {
		if got := EncodeToken(tt.in); got != tt.want {
			t.Errorf("EncodeToken(%q) = %q, want %q", tt.in, got, tt.want)
		}
		if got := string(AppendToken([]byte("x."), tt.in)); got != "x."+tt.want {
			t.Errorf("AppendToken(%q) = %q", tt.in, got)
		}
		if got, err := DecodeToken(tt.want); err != nil || got != tt.in {
			t.Errorf("DecodeToken(%q) = %q, %v; want %q", tt.want, got, err, tt.in)
		}
	}
}

func TestEncodeTokenNoAlloc(t *testing.T) {
	if n := testing.AllocsPerRun(100, func() { _ = EncodeToken("checkout-api-7f9c8d6b5-x2k4p") }); n != 0 {
		t.Errorf("EncodeToken of a plain name allocates %v times", n)
	}
}

func TestDecodeTokenErrors(t *testing.T) {
	tests := []struct{ in, want string }{
		{"%", `malformed escape at offset 0 in token "%"`},
		{"a%2", `malformed escape at offset 1 in token "a%2"`},
		{"%2e", `malformed escape at offset 0 in token "%2e"`},
		{"%G0", `malformed escape at offset 0 in token "%G0"`},
		{"%Habcdef", `malformed escape at offset 0 in token "%Habcdef"`},
		{"a.b", `invalid byte '.' at offset 1 in token "a.b"`},
		{"a%2E*", `invalid byte '*' at offset 4 in token "a%2E*"`},
		{"a b", `invalid byte ' ' at offset 1 in token "a b"`},
		{"ü", `invalid byte byte 0xc3 at offset 0 in token "ü"`},
		{">", `invalid byte '>' at offset 0 in token ">"`},
	}
	for _, tt := range tests {
		got, err := DecodeToken(tt.in)
		if err == nil || err.Error() != tt.want {
			t.Errorf("DecodeToken(%q) = %q, %v; want error %q", tt.in, got, err, tt.want)
		}
	}
	// Escapes of bytes EncodeToken keeps are accepted (placeholder escapes).
	for in, want := range map[string]string{"%63ore": "core", "%5F": "_", "%41%42": "AB"} {
		if got, err := DecodeToken(in); err != nil || got != want {
			t.Errorf("DecodeToken(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

func newTestEncoder(tb testing.TB, o EncoderOptions) *Encoder {
	tb.Helper()
	e, err := NewEncoder(o)
	if err != nil {
		tb.Fatal(err)
	}
	return e
}

var (
	podsResource   = Resource{Version: "v1", Resource: "pods", Kind: "Pod", Namespaced: true}
	deployResource = Resource{Group: "apps", Version: "v1", Resource: "deployments", Kind: "Deployment", Namespaced: true}
	issuerResource = Resource{Group: "cert-manager.io", Version: "v1", Resource: "clusterissuers", Kind: "ClusterIssuer"}
)

func TestSubject(t *testing.T) {
	e := newTestEncoder(t, EncoderOptions{Cluster: "prod-eu", Source: "pods"})
	tests := []struct {
		name      string
		r         Resource
		ns, obj   string
		typ       Type
		want      string
		prefixOpt string
	}{
		{"core namespaced", podsResource, "default", "web-0", Added, "k8s.prod-eu.core.v1.pods.default.web-0.added", ""},
		{"group", deployResource, "shop", "api", Modified, "k8s.prod-eu.apps.v1.deployments.shop.api.modified", ""},
		{"dotted group", issuerResource, "", "letsencrypt", Deleted, "k8s.prod-eu.cert-manager%2Eio.v1.clusterissuers._.letsencrypt.deleted", ""},
		{"group literally core", Resource{Group: "core", Version: "v1", Resource: "things"}, "ns", "x", Added, "k8s.prod-eu.%63ore.v1.things.ns.x.added", ""},
		{"namespace literally _", podsResource, "_", "x", Added, "k8s.prod-eu.core.v1.pods.%5F.x.added", ""},
		{"name literally _", podsResource, "ns", "_", Added, "k8s.prod-eu.core.v1.pods.ns.%5F.added", ""},
		{"name with dots", podsResource, "kube-system", "node.example.com", Added, "k8s.prod-eu.core.v1.pods.kube-system.node%2Eexample%2Ecom.added", ""},
		{"rbac name", Resource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterroles"}, "", "system:kube-scheduler", Added,
			"k8s.prod-eu.rbac%2Eauthorization%2Ek8s%2Eio.v1.clusterroles._.system:kube-scheduler.added", ""},
		{"empty name", podsResource, "ns", "", Added, "k8s.prod-eu.core.v1.pods.ns._.added", ""},
		{"multi-token prefix", podsResource, "default", "web-0", Added, "acme.k8s.prod-eu.core.v1.pods.default.web-0.added", "acme.k8s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			enc := e
			if tt.prefixOpt != "" {
				enc = newTestEncoder(t, EncoderOptions{Prefix: tt.prefixOpt, Cluster: "prod-eu", Source: "pods"})
			}
			got := enc.Subject(tt.r, tt.ns, tt.obj, tt.typ)
			if got != tt.want {
				t.Fatalf("Subject = %q\nwant      %q", got, tt.want)
			}
			checkValidSubject(t, got)
			p, err := ParseSubject(got)
			if err != nil {
				t.Fatal(err)
			}
			want := SubjectParts{Prefix: enc.Options().Prefix, Cluster: "prod-eu", Group: tt.r.Group, Version: tt.r.Version,
				Resource: tt.r.Resource, Namespace: tt.ns, Name: tt.obj, Type: tt.typ}
			if p != want {
				t.Errorf("ParseSubject = %+v\nwant           %+v", p, want)
			}
		})
	}
}

// checkValidSubject checks that s is a publishable NATS subject: non-empty
// tokens of printable ASCII without wildcards or whitespace.
func checkValidSubject(tb testing.TB, s string) {
	tb.Helper()
	for _, tok := range strings.Split(s, ".") {
		if tok == "" {
			tb.Fatalf("subject %q has an empty token", s)
		}
		if tok == "*" || tok == ">" || strings.ContainsAny(tok, "*> \t\r\n") {
			tb.Fatalf("subject %q has a wildcard or whitespace in token %q", s, tok)
		}
		for i := 0; i < len(tok); i++ {
			if tok[i] < 0x21 || tok[i] > 0x7e {
				tb.Fatalf("subject %q has byte %#x", s, tok[i])
			}
		}
	}
}

func TestSubjectHashFallback(t *testing.T) {
	e := newTestEncoder(t, EncoderOptions{Cluster: "c", Source: "s"})
	r := Resource{Group: "example.com", Version: "v1", Resource: "widgets"}
	base := len("k8s.c.example%2Ecom.v1.widgets.ns..modified")
	fits := strings.Repeat("n", MaxSubjectLen-base)
	if s := e.Subject(r, "ns", fits, Modified); len(s) != MaxSubjectLen || !strings.Contains(s, fits) {
		t.Fatalf("subject of exactly MaxSubjectLen bytes was hashed or mis-sized: %d", len(s))
	}
	long := fits + "n"
	sum := sha256.Sum256([]byte(long))
	wantTok := "%H" + hex.EncodeToString(sum[:16])
	s := e.Subject(r, "ns", long, Modified)
	if want := "k8s.c.example%2Ecom.v1.widgets.ns." + wantTok + ".modified"; s != want {
		t.Fatalf("Subject = %q\nwant %q", s, want)
	}
	if HashToken(long) != wantTok {
		t.Errorf("HashToken = %q", HashToken(long))
	}
	checkValidSubject(t, s)
	p, err := ParseSubject(s)
	if err != nil {
		t.Fatal(err)
	}
	if p.Name != "" || p.NameHash != wantTok || p.Namespace != "ns" || p.Type != Modified {
		t.Errorf("ParseSubject = %+v", p)
	}
	// Escaping counts: 200 dots take 600 bytes.
	if s := e.Subject(podsResource, "ns", strings.Repeat(".", 200), Added); !strings.Contains(s, "%H") {
		t.Errorf("escaped over-long name not hashed: %q", s)
	}
}

func TestParseSubjectErrors(t *testing.T) {
	tests := []struct{ in, want string }{
		{"k8s.c.core.v1.pods.ns.name", `subject "k8s.c.core.v1.pods.ns.name": not an object subject (too few tokens)`},
		{"k8s.c._relayd.src.sync.started", `subject "k8s.c._relayd.src.sync.started": a control subject, not an object subject (sync.started of source "src")`},
		{"x.k8s.acme.c._relayd.src.sync.completed", `subject "x.k8s.acme.c._relayd.src.sync.completed": a control subject, not an object subject (sync.completed of source "src")`},
		{"k8s.c._relayd.src.heartbeat", `subject "k8s.c._relayd.src.heartbeat": a control subject, not an object subject (heartbeat of source "src")`},
		{"a.b.c.d.c._relayd.src.heartbeat", `subject "a.b.c.d.c._relayd.src.heartbeat": a control subject, not an object subject (heartbeat of source "src")`},
		{"k8s.c._relayd.src.heartbeats", `subject "k8s.c._relayd.src.heartbeats": not an object subject (too few tokens)`},
		{"k8s.c.core.v1.pods.ns.name.created", `subject "k8s.c.core.v1.pods.ns.name.created": not an object subject (last token "created")`},
		{"k8s.c.core.v1.pods..name.added", `subject "k8s.c.core.v1.pods..name.added": empty token`},
		{".c.core.v1.pods.ns.name.added", `subject ".c.core.v1.pods.ns.name.added": invalid prefix token ""`},
		{"k8s.c%2E.core.v1.pods.ns.name.added", `subject "k8s.c%2E.core.v1.pods.ns.name.added": invalid cluster token "c%2E"`},
		{"k8s.c.core.v1.pods.ns.a%zz.added", `subject "k8s.c.core.v1.pods.ns.a%zz.added": name token: malformed escape at offset 1 in token "a%zz"`},
		{"k8s.c.core.v1.pods.n*s.x.added", `subject "k8s.c.core.v1.pods.n*s.x.added": namespace token: invalid byte '*' at offset 1 in token "n*s"`},
		{"k8s.c.core.v1.pods.ns.%Hxyz.added", `subject "k8s.c.core.v1.pods.ns.%Hxyz.added": malformed hash token "%Hxyz"`},
	}
	for _, tt := range tests {
		if _, err := ParseSubject(tt.in); err == nil || err.Error() != tt.want {
			t.Errorf("ParseSubject(%q) error = %v\nwant %q", tt.in, err, tt.want)
		} else if strings.Contains(tt.want, "control subject") != errors.Is(err, ErrControlSubject) {
			t.Errorf("ParseSubject(%q): errors.Is(ErrControlSubject) = %v", tt.in, errors.Is(err, ErrControlSubject))
		}
	}
}

// TestParseControlSubject: every control subject an Encoder builds parses
// back to its prefix, cluster, source and event; other subjects do not.
func TestParseControlSubject(t *testing.T) {
	for _, prefix := range []string{"k8s", "acme.k8s"} {
		e, err := NewEncoder(EncoderOptions{Prefix: prefix, Cluster: "c-1", Source: "pods"})
		if err != nil {
			t.Fatal(err)
		}
		for ev, subj := range map[string]string{"sync.started": e.ControlSubject(false), "sync.completed": e.ControlSubject(true), "heartbeat": e.HeartbeatSubject()} {
			got, err := ParseControlSubject(subj)
			if want := (ControlParts{Prefix: prefix, Cluster: "c-1", Source: "pods", Event: ev}); err != nil || got != want {
				t.Errorf("ParseControlSubject(%q) = %+v, %v; want %+v", subj, got, err, want)
			}
		}
		if _, err := ParseControlSubject(e.Subject(podsResource, "ns", "heartbeat", Added)); err == nil {
			t.Errorf("an object subject parsed as a control subject")
		}
	}
	for _, bad := range []string{"_relayd.src.heartbeat", "k8s.c.relayd.src.heartbeat", "k8s.c._relayd.s%2E.heartbeat", "k8s..c._relayd.src.heartbeat", "k8s.c._relayd.src.sync.ended"} {
		if p, err := ParseControlSubject(bad); err == nil {
			t.Errorf("ParseControlSubject(%q) = %+v, want an error", bad, p)
		}
	}
}

var tokenSeeds = []string{
	"", "a", "a.b", "50%", "ü", "*", ">", " ", "\t", "\x00", "\x7f", "\xff", "%", "%25", "%2E", "%H", "core", "_",
	"%63ore", "%5F", "..", "a b.c*d>e%f", "system:serviceaccount:kube-system:default", "日本語",
}

func FuzzTokenRoundTrip(f *testing.F) {
	for i, a := range tokenSeeds {
		f.Add(a, tokenSeeds[(i+1)%len(tokenSeeds)])
		f.Add(a, a)
	}
	e, err := NewEncoder(EncoderOptions{Prefix: "acme.k8s", Cluster: "c", Source: "s"})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		ta, tb := EncodeToken(a), EncodeToken(b)
		for _, c := range []struct{ in, tok string }{{a, ta}, {b, tb}} {
			dec, err := DecodeToken(c.tok)
			if err != nil {
				t.Fatalf("DecodeToken(EncodeToken(%q) = %q): %v", c.in, c.tok, err)
			}
			if dec != c.in {
				t.Fatalf("DecodeToken(EncodeToken(%q)) = %q", c.in, dec)
			}
			if c.in != "" && c.tok == "" {
				t.Fatalf("EncodeToken(%q) is empty", c.in)
			}
			for i := 0; i < len(c.tok); i++ {
				if ch := c.tok[i]; ch == '.' || ch == '*' || ch == '>' || ch <= ' ' || ch >= 0x7f {
					t.Fatalf("EncodeToken(%q) = %q has byte %#x", c.in, c.tok, ch)
				}
			}
			if strings.HasPrefix(c.tok, HashTokenPrefix) {
				t.Fatalf("EncodeToken(%q) = %q looks like a hash token", c.in, c.tok)
			}
		}
		// Injectivity: equal tokens decode to equal inputs.
		if a != b && ta == tb {
			t.Fatalf("EncodeToken(%q) == EncodeToken(%q) == %q", a, b, ta)
		}

		// Whole subjects: placeholders never collide, the result is a valid
		// subject and ParseSubject inverts it.
		r := Resource{Group: a, Version: b, Resource: a + b}
		sa, sb := e.Subject(r, a, b, Added), e.Subject(r, b, a, Added)
		for _, c := range []struct{ s, ns, name string }{{sa, a, b}, {sb, b, a}} {
			checkValidSubject(t, c.s)
			if len(c.s) > MaxSubjectLen && !strings.Contains(c.s, "."+HashTokenPrefix) {
				t.Fatalf("subject of %d bytes without hash token", len(c.s))
			}
			p, err := ParseSubject(c.s)
			if err != nil {
				t.Fatalf("ParseSubject(%q): %v", c.s, err)
			}
			if p.Group != r.Group || p.Version != r.Version || p.Resource != r.Resource || p.Namespace != c.ns || p.Type != Added {
				t.Fatalf("ParseSubject(%q) = %+v", c.s, p)
			}
			if p.NameHash == "" && p.Name != c.name || p.NameHash != "" && p.NameHash != HashToken(c.name) {
				t.Fatalf("ParseSubject(%q) name = %q / %q, want %q", c.s, p.Name, p.NameHash, c.name)
			}
		}
		if a != b && sa == sb {
			t.Fatalf("namespace/name swap collides: %q", sa)
		}
	})
}
