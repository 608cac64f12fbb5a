package event

import (
	"bytes"
	"encoding/json"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestNewEncoder(t *testing.T) {
	e, err := NewEncoder(EncoderOptions{Cluster: "prod_eu-1", Source: "Pods-2"})
	if err != nil {
		t.Fatal(err)
	}
	if e.Options().Prefix != DefaultPrefix {
		t.Errorf("Prefix not defaulted: %q", e.Options().Prefix)
	}
	if _, err := NewEncoder(EncoderOptions{Prefix: "acme.k8s", Cluster: "c", Source: "s", MaxPayload: 1 << 20, Binary: true}); err != nil {
		t.Errorf("dotted prefix rejected: %v", err)
	}
	tests := []struct {
		o    EncoderOptions
		want string
	}{
		{EncoderOptions{}, "EncoderOptions.Cluster must not be empty\nEncoderOptions.Source must not be empty"},
		{EncoderOptions{Cluster: "a.b", Source: "s"}, `EncoderOptions.Cluster "a.b" is invalid: want one token of A-Z a-z 0-9 _ - (no dots)`},
		{EncoderOptions{Cluster: "c", Source: "s*"}, `EncoderOptions.Source "s*" is invalid: want one token of A-Z a-z 0-9 _ - (no dots)`},
		{EncoderOptions{Cluster: "c", Source: "sü"}, `EncoderOptions.Source "sü" is invalid: want one token of A-Z a-z 0-9 _ - (no dots)`},
		{EncoderOptions{Prefix: "a..b", Cluster: "c", Source: "s"}, `EncoderOptions.Prefix "a..b" is invalid: want dot-separated tokens of A-Z a-z 0-9 _ -`},
		{EncoderOptions{Prefix: "k8s.", Cluster: "c", Source: "s"}, `EncoderOptions.Prefix "k8s." is invalid: want dot-separated tokens of A-Z a-z 0-9 _ -`},
		{EncoderOptions{Prefix: "k8s.>", Cluster: "c", Source: "s"}, `EncoderOptions.Prefix "k8s.>" is invalid: want dot-separated tokens of A-Z a-z 0-9 _ -`},
		{EncoderOptions{Prefix: "k 8s", Cluster: "c d", Source: "s", MaxPayload: -1},
			"EncoderOptions.Prefix \"k 8s\" is invalid: want dot-separated tokens of A-Z a-z 0-9 _ -\n" +
				"EncoderOptions.Cluster \"c d\" is invalid: want one token of A-Z a-z 0-9 _ - (no dots)\n" +
				"EncoderOptions.MaxPayload -1 must not be negative"},
	}
	for _, tt := range tests {
		_, err := NewEncoder(tt.o)
		if err == nil || err.Error() != tt.want {
			t.Errorf("NewEncoder(%+v) error = %v\nwant %q", tt.o, err, tt.want)
		}
	}
}

var testTime = time.Date(2026, 3, 14, 10, 26, 53, 123, time.FixedZone("CET", 3600))

const testTimeString = "2026-03-14T09:26:53.000000123Z"

func podChange(t testing.TB, mode PayloadMode) (*Change, Object) {
	t.Helper()
	o, err := ParseObject(loadPod(t))
	if err != nil {
		t.Fatal(err)
	}
	return &Change{
		Type: Modified, Origin: OriginWatch, Epoch: 3, Time: testTime,
		Resource: podsResource, Meta: o.Meta, Payload: mode,
		Data: o.AppendPayload(nil, mode, false),
	}, o
}

// decodeBody decodes a structured body into its members, checking that the
// key set is exactly keys.
func decodeBody(t *testing.T, body []byte, keys ...string) map[string]json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("body is not JSON: %v\n%s", err, body)
	}
	var got []string
	for k := range m {
		got = append(got, k)
	}
	slices.Sort(got)
	keys = slices.Sorted(slices.Values(keys))
	if !slices.Equal(got, keys) {
		t.Fatalf("body keys = %v\nwant        %v", got, keys)
	}
	return m
}

var objectKeys = []string{
	"specversion", "id", "source", "type", "subject", "time", "datacontenttype",
	"k8scluster", "k8sapiversion", "k8skind", "k8sresource", "k8sname", "k8suid", "k8sresourceversion",
	"relaydsource", "relaydorigin", "relaydepoch", "relaydpayload", "data",
}

func TestEncodeStructured(t *testing.T) {
	e := newTestEncoder(t, EncoderOptions{Cluster: "prod", Source: "pods"})
	c, _ := podChange(t, PayloadFull)
	msg, err := e.Encode(c)
	if err != nil {
		t.Fatal(err)
	}
	if msg.Subject != "k8s.prod.core.v1.pods.shop.checkout-api-7f9c8d6b5-x2k4p.modified" {
		t.Errorf("Subject = %q", msg.Subject)
	}
	const id = "3f1c2b7e-9a4d-4e8b-b1c2-5d6e7f8a9b0c/48213377"
	if msg.MsgID != "k8s.prod/pods/"+id {
		t.Errorf("MsgID = %q", msg.MsgID)
	}
	wantHeader := map[string][]string{"Content-Type": {"application/cloudevents+json"}, "Nats-Msg-Id": {"k8s.prod/pods/" + id}}
	if !reflect.DeepEqual(msg.Header, wantHeader) {
		t.Errorf("Header = %v", msg.Header)
	}

	m := decodeBody(t, msg.Data, append(objectKeys, "k8snamespace")...)
	want := map[string]string{
		"specversion":        `"1.0"`,
		"id":                 `"` + id + `"`,
		"source":             `"/relayd/prod/pods"`,
		"type":               `"k8s.object.modified"`,
		"subject":            `"/api/v1/namespaces/shop/pods/checkout-api-7f9c8d6b5-x2k4p"`,
		"time":               `"` + testTimeString + `"`,
		"datacontenttype":    `"application/json"`,
		"k8scluster":         `"prod"`,
		"k8sapiversion":      `"v1"`,
		"k8skind":            `"Pod"`,
		"k8sresource":        `"pods"`,
		"k8snamespace":       `"shop"`,
		"k8sname":            `"checkout-api-7f9c8d6b5-x2k4p"`,
		"k8suid":             `"3f1c2b7e-9a4d-4e8b-b1c2-5d6e7f8a9b0c"`,
		"k8sresourceversion": `"48213377"`,
		"relaydsource":       `"pods"`,
		"relaydorigin":       `"watch"`,
		"relaydepoch":        `3`,
		"relaydpayload":      `"full"`,
	}
	for k, v := range want {
		if string(m[k]) != v {
			t.Errorf("%s = %s, want %s", k, m[k], v)
		}
	}
	if !bytes.Equal(m["data"], c.Data) {
		t.Error("data is not the payload byte for byte")
	}
	if !bytes.HasSuffix(msg.Data, append(append([]byte(`,"data":`), c.Data...), '}')) {
		t.Error(`"data" is not the last member`)
	}

	env, err := DecodeStructured(msg.Data)
	if err != nil {
		t.Fatal(err)
	}
	wantEnv := Envelope{
		SpecVersion: "1.0", ID: id, Source: "/relayd/prod/pods", Type: "k8s.object.modified",
		Subject: "/api/v1/namespaces/shop/pods/checkout-api-7f9c8d6b5-x2k4p", Time: testTime.UTC(),
		DataContentType: "application/json", K8sCluster: "prod", K8sAPIVersion: "v1", K8sKind: "Pod",
		K8sResource: "pods", K8sNamespace: "shop", K8sName: "checkout-api-7f9c8d6b5-x2k4p",
		K8sUID: "3f1c2b7e-9a4d-4e8b-b1c2-5d6e7f8a9b0c", K8sResourceVersion: "48213377",
		RelaydSource: "pods", RelaydOrigin: "watch", RelaydEpoch: 3, RelaydPayload: "full", Data: c.Data,
	}
	if !reflect.DeepEqual(env, wantEnv) {
		t.Errorf("DecodeStructured =\n%+v\nwant\n%+v", env, wantEnv)
	}
	if got, err := DecodeMessage(msg.Header, msg.Data); err != nil || !reflect.DeepEqual(got, wantEnv) {
		t.Errorf("DecodeMessage = %+v, %v", got, err)
	}
	checkSize(t, &msg)
}

// checkSize compares Message.Size with the bytes nats.go puts on the wire:
// "NATS/1.0\r\n" + http.Header.Write + "\r\n" + body.
func checkSize(t *testing.T, msg *Message) {
	t.Helper()
	var b bytes.Buffer
	b.WriteString("NATS/1.0\r\n")
	if err := http.Header(msg.Header).Write(&b); err != nil {
		t.Fatal(err)
	}
	b.WriteString("\r\n")
	if got, want := msg.Size(), b.Len()+len(msg.Data); got != want {
		t.Errorf("Size() = %d, wire size %d", got, want)
	}
}

func TestEncodeVariants(t *testing.T) {
	e := newTestEncoder(t, EncoderOptions{Prefix: "acme.k8s", Cluster: "prod", Source: "src"})
	base := Change{Type: Added, Origin: OriginInitial, Epoch: 0, Time: testTime, Payload: PayloadReference}
	tests := []struct {
		name      string
		mod       func(c *Change)
		subject   string
		ceSubject string
		id        string
		extra     map[string]string // members beyond objectKeys
	}{
		{"group namespaced", func(c *Change) {
			c.Resource = deployResource
			c.Meta = Meta{Namespace: "shop", Name: "api", UID: "u1", ResourceVersion: "10"}
		}, "acme.k8s.prod.apps.v1.deployments.shop.api.added", "/apis/apps/v1/namespaces/shop/deployments/api", "u1/10",
			map[string]string{"k8snamespace": `"shop"`}},
		{"group cluster-scoped", func(c *Change) {
			c.Resource = issuerResource
			c.Meta = Meta{Name: "le", UID: "u2", ResourceVersion: "11"}
		}, "acme.k8s.prod.cert-manager%2Eio.v1.clusterissuers._.le.added", "/apis/cert-manager.io/v1/clusterissuers/le", "u2/11", nil},
		{"core cluster-scoped", func(c *Change) {
			c.Resource = Resource{Version: "v1", Resource: "nodes", Kind: "Node"}
			c.Meta = Meta{Name: "worker-1", UID: "u3", ResourceVersion: "12"}
		}, "acme.k8s.prod.core.v1.nodes._.worker-1.added", "/api/v1/nodes/worker-1", "u3/12", nil},
		{"deleted, final state unknown", func(c *Change) {
			c.Type, c.Origin, c.Epoch, c.FinalStateUnknown = Deleted, OriginResync, 7, true
			c.Resource = podsResource
			c.Meta = Meta{Namespace: "ns", Name: "p", UID: "u4", ResourceVersion: "13"}
		}, "acme.k8s.prod.core.v1.pods.ns.p.deleted", "/api/v1/namespaces/ns/pods/p", "u4/13/deleted",
			map[string]string{"k8snamespace": `"ns"`, "relaydfinalunknown": "true"}},
		{"escaping", func(c *Change) {
			c.Resource = Resource{Group: "x.io", Version: "v1", Resource: "things"}
			c.Meta = Meta{Namespace: "ns", Name: "a\"b\\c</x>\u2028é", UID: "u5", ResourceVersion: "14"}
		}, "acme.k8s.prod.x%2Eio.v1.things.ns.a\"b\\c</x%3E%E2%80%A8%C3%A9.added", "/apis/x.io/v1/namespaces/ns/things/a\"b\\c</x>\u2028é", "u5/14",
			map[string]string{"k8snamespace": `"ns"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := base
			tt.mod(&c)
			c.Data = AppendReference(nil, c.Meta)
			msg, err := e.Encode(&c)
			if err != nil {
				t.Fatal(err)
			}
			if msg.Subject != tt.subject {
				t.Errorf("Subject = %q, want %q", msg.Subject, tt.subject)
			}
			keys := slices.Clone(objectKeys)
			for k := range tt.extra {
				keys = append(keys, k)
			}
			m := decodeBody(t, msg.Data, keys...)
			var ceSubject, id, typ string
			json.Unmarshal(m["subject"], &ceSubject)
			json.Unmarshal(m["id"], &id)
			json.Unmarshal(m["type"], &typ)
			if ceSubject != tt.ceSubject || id != tt.id || typ != "acme.k8s.object."+string(c.Type) {
				t.Errorf("subject, id, type = %q, %q, %q; want %q, %q", ceSubject, id, typ, tt.ceSubject, tt.id)
			}
			if msg.MsgID != "acme.k8s.prod/src/"+tt.id {
				t.Errorf("MsgID = %q", msg.MsgID)
			}
			for k, v := range tt.extra {
				if string(m[k]) != v {
					t.Errorf("%s = %s, want %s", k, m[k], v)
				}
			}
			env, err := DecodeStructured(msg.Data)
			if err != nil {
				t.Fatal(err)
			}
			wantAPIVersion := c.Resource.APIVersion()
			if env.K8sName != c.Meta.Name || env.K8sAPIVersion != wantAPIVersion || env.RelaydOrigin != string(c.Origin) ||
				env.RelaydEpoch != c.Epoch || env.RelaydFinalUnknown != c.FinalStateUnknown {
				t.Errorf("envelope %+v", env)
			}

			// Binary mode carries the same attributes.
			be := newTestEncoder(t, EncoderOptions{Prefix: "acme.k8s", Cluster: "prod", Source: "src", Binary: true})
			bmsg, err := be.Encode(&c)
			if err != nil {
				t.Fatal(err)
			}
			benv, err := DecodeMessage(bmsg.Header, bmsg.Data)
			if err != nil {
				t.Fatal(err)
			}
			benv.DataContentType = env.DataContentType
			if !reflect.DeepEqual(benv, env) {
				t.Errorf("binary envelope\n%+v\nstructured\n%+v", benv, env)
			}
			checkSize(t, &bmsg)
		})
	}
}

func TestEncodeBinary(t *testing.T) {
	e := newTestEncoder(t, EncoderOptions{Cluster: "prod", Source: "pods", Binary: true})
	c, _ := podChange(t, PayloadMetadata)
	c.Type, c.Origin, c.FinalStateUnknown = Deleted, OriginResync, true
	msg, err := e.Encode(c)
	if err != nil {
		t.Fatal(err)
	}
	const id = "3f1c2b7e-9a4d-4e8b-b1c2-5d6e7f8a9b0c/48213377/deleted"
	want := map[string][]string{
		"ce-specversion":        {"1.0"},
		"ce-id":                 {id},
		"ce-source":             {"/relayd/prod/pods"},
		"ce-type":               {"k8s.object.deleted"},
		"ce-subject":            {"/api/v1/namespaces/shop/pods/checkout-api-7f9c8d6b5-x2k4p"},
		"ce-time":               {testTimeString},
		"ce-k8scluster":         {"prod"},
		"ce-k8sapiversion":      {"v1"},
		"ce-k8skind":            {"Pod"},
		"ce-k8sresource":        {"pods"},
		"ce-k8snamespace":       {"shop"},
		"ce-k8sname":            {"checkout-api-7f9c8d6b5-x2k4p"},
		"ce-k8suid":             {"3f1c2b7e-9a4d-4e8b-b1c2-5d6e7f8a9b0c"},
		"ce-k8sresourceversion": {"48213377"},
		"ce-relaydsource":       {"pods"},
		"ce-relaydorigin":       {"resync"},
		"ce-relaydepoch":        {"3"},
		"ce-relaydpayload":      {"metadata"},
		"ce-relaydfinalunknown": {"true"},
		"Content-Type":          {"application/json"},
		"Nats-Msg-Id":           {"k8s.prod/pods/" + id},
	}
	if !reflect.DeepEqual(msg.Header, want) {
		for k, v := range msg.Header {
			if !slices.Equal(want[k], v) {
				t.Errorf("header %s = %q, want %q", k, v, want[k])
			}
		}
		for k := range want {
			if _, ok := msg.Header[k]; !ok {
				t.Errorf("header %s missing", k)
			}
		}
	}
	if &msg.Data[0] != &c.Data[0] {
		t.Error("binary body is not the payload")
	}
	if msg.MsgID != "k8s.prod/pods/"+id || msg.Subject != "k8s.prod.core.v1.pods.shop.checkout-api-7f9c8d6b5-x2k4p.deleted" {
		t.Errorf("MsgID %q, Subject %q", msg.MsgID, msg.Subject)
	}
	// Values share a backing array but appending to one must not clobber
	// another.
	msg.Header["ce-id"] = append(msg.Header["ce-id"], "x")
	if msg.Header["ce-source"][0] != "/relayd/prod/pods" {
		t.Error("header values alias each other")
	}
	checkSize(t, &msg)
}

func TestEncodeBinaryPercentEncoding(t *testing.T) {
	e := newTestEncoder(t, EncoderOptions{Cluster: "c", Source: "s", Binary: true})
	name := " a\"%b\r\nü "
	c := &Change{Type: Added, Origin: OriginWatch, Time: testTime, Resource: podsResource,
		Meta: Meta{Namespace: "n", Name: name, UID: "u", ResourceVersion: "1"}}
	msg, err := e.Encode(c)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := msg.Header["ce-k8sname"][0], "%20a%22%25b%0D%0A%C3%BC%20"; got != want {
		t.Errorf("ce-k8sname = %q, want %q", got, want)
	}
	env, err := DecodeMessage(msg.Header, msg.Data)
	if err != nil {
		t.Fatal(err)
	}
	if env.K8sName != name || env.Subject != "/api/v1/namespaces/n/pods/"+name {
		t.Errorf("decoded name %q, subject %q", env.K8sName, env.Subject)
	}
	if env.RelaydPayload != "reference" || string(env.Data) != `{"apiVersion":"v1","kind":"Pod","namespace":"n","name":" a\"%b\r\nü ","uid":"u","resourceVersion":"1"}` {
		t.Errorf("no-data change: payload %q data %s", env.RelaydPayload, env.Data)
	}
}

func TestEncodeOversize(t *testing.T) {
	for _, binary := range []bool{false, true} {
		opts := EncoderOptions{Cluster: "prod", Source: "pods", Binary: binary}
		c, _ := podChange(t, PayloadFull)
		full, err := newTestEncoder(t, opts).Encode(c)
		if err != nil {
			t.Fatal(err)
		}

		// Exactly at the limit: sent as is.
		opts.MaxPayload = full.Size()
		msg, err := newTestEncoder(t, opts).Encode(c)
		if err != nil || !bytes.Equal(msg.Data, full.Data) {
			t.Fatalf("binary=%v: at the limit: %v", binary, err)
		}

		// One byte over: downgraded to the reference payload.
		opts.MaxPayload = full.Size() - 1
		msg, err = newTestEncoder(t, opts).Encode(c)
		if err != nil {
			t.Fatal(err)
		}
		if msg.Size() > opts.MaxPayload {
			t.Errorf("binary=%v: downgraded message is %d bytes", binary, msg.Size())
		}
		if !msg.Oversize {
			t.Errorf("binary=%v: Message.Oversize not set on a downgraded message", binary)
		}
		env, err := DecodeMessage(msg.Header, msg.Data)
		if err != nil {
			t.Fatal(err)
		}
		ref := AppendReference(nil, c.Meta)
		if !env.RelaydOversize || env.RelaydPayload != "reference" || !bytes.Equal(env.Data, ref) {
			t.Errorf("binary=%v: oversize=%v payload=%q data=%s", binary, env.RelaydOversize, env.RelaydPayload, env.Data)
		}
		if msg.MsgID != full.MsgID || msg.Subject != full.Subject {
			t.Errorf("binary=%v: downgrade changed the id or subject", binary)
		}
		if !binary {
			decodeBody(t, msg.Data, append(objectKeys, "k8snamespace", "relaydoversize")...)
			if !bytes.Contains(msg.Data, []byte(`,"relaydoversize":true,`)) {
				t.Error("relaydoversize is not the JSON boolean true")
			}
		} else if msg.Header["ce-relaydoversize"][0] != "true" {
			t.Error("ce-relaydoversize missing")
		}

		// One byte less than the reference event: sent without data.
		opts.MaxPayload = msg.Size() - 1
		bare, err := newTestEncoder(t, opts).Encode(c)
		if err != nil {
			t.Fatalf("binary=%v: too big as a reference: %v", binary, err)
		}
		checkBare(t, binary, bare, full, c, opts.MaxPayload)

		// Too big even without data.
		opts.MaxPayload = bare.Size() - 1
		_, err = newTestEncoder(t, opts).Encode(c)
		wantErr := `encode pods "shop/checkout-api-7f9c8d6b5-x2k4p" (uid "3f1c2b7e-9a4d-4e8b-b1c2-5d6e7f8a9b0c", resourceVersion "48213377"): event of ` +
			strconv.Itoa(full.Size()) + ` bytes (` + strconv.Itoa(msg.Size()) + ` with the reference payload, ` + strconv.Itoa(bare.Size()) +
			` without data) exceeds the NATS max payload of ` + strconv.Itoa(opts.MaxPayload) + ` bytes`
		if err == nil || err.Error() != wantErr {
			t.Errorf("binary=%v: error = %v\nwant %s", binary, err, wantErr)
		}
	}
}

// checkBare checks an event sent without data because its reference did not
// fit limit: same id, subject and identity as full, relaydpayload "none",
// relaydoversize and relaydunencodable, no data and no datacontenttype.
func checkBare(t *testing.T, binary bool, bare, full Message, c *Change, limit int) {
	t.Helper()
	if bare.Size() > limit || !bare.Oversize || !bare.Unencodable {
		t.Errorf("binary=%v: %d bytes (limit %d), Oversize=%v Unencodable=%v", binary, bare.Size(), limit, bare.Oversize, bare.Unencodable)
	}
	if bare.MsgID != full.MsgID || bare.Subject != full.Subject {
		t.Errorf("binary=%v: the bare event changed the id or subject", binary)
	}
	env, err := DecodeMessage(bare.Header, bare.Data)
	if err != nil {
		t.Fatal(err)
	}
	if !env.RelaydOversize || !env.RelaydUnencodable || env.RelaydPayload != "none" || len(env.Data) != 0 || env.DataContentType != "" {
		t.Errorf("binary=%v: oversize=%v unencodable=%v payload=%q datacontenttype=%q data=%s", binary,
			env.RelaydOversize, env.RelaydUnencodable, env.RelaydPayload, env.DataContentType, env.Data)
	}
	m := c.Meta
	if env.K8sUID != m.UID || env.K8sName != m.Name || env.K8sNamespace != m.Namespace || env.K8sResourceVersion != m.ResourceVersion || env.K8sKind != "Pod" {
		t.Errorf("binary=%v: identity %+v, want %+v", binary, env, m)
	}
	if !binary {
		keys := append(slices.DeleteFunc(slices.Clone(objectKeys), func(k string) bool { return k == "data" || k == "datacontenttype" }),
			"k8snamespace", "relaydoversize", "relaydunencodable")
		decodeBody(t, bare.Data, keys...)
		if !bytes.Contains(bare.Data, []byte(`,"relaydoversize":true,"relaydunencodable":true}`)) {
			t.Errorf("relaydunencodable is not the JSON boolean true last: %s", bare.Data)
		}
	} else if len(bare.Data) != 0 || bare.Header["ce-relaydunencodable"][0] != "true" || bare.Header[HeaderContentType] != nil {
		t.Errorf("binary bare event: body %q, headers %v", bare.Data, bare.Header)
	}
}

func TestEncodeErrors(t *testing.T) {
	e := newTestEncoder(t, EncoderOptions{Cluster: "c", Source: "s"})
	valid := Change{Type: Added, Origin: OriginWatch, Resource: deployResource, Payload: PayloadFull, Data: []byte(`{}`),
		Meta: Meta{Namespace: "ns", Name: "n", UID: "u", ResourceVersion: "1"}}
	if _, err := e.Encode(&valid); err != nil {
		t.Fatal(err)
	}
	const who = `encode deployments.apps "ns/n" (uid "u", resourceVersion "1"): `
	tests := []struct {
		mod  func(c *Change)
		want string
	}{
		{func(c *Change) { c.Type = "ADDED" }, who + `invalid change type "ADDED"`},
		{func(c *Change) { c.Origin = "" }, who + `invalid origin ""`},
		{func(c *Change) { c.Payload = "everything" }, who + `invalid payload mode "everything"`},
		{func(c *Change) { c.Resource.Resource = "" }, `encode .apps "ns/n" (uid "u", resourceVersion "1"): resource has no version or no resource name`},
		{func(c *Change) { c.Meta.Name = "" }, `encode deployments.apps "ns/" (uid "u", resourceVersion "1"): object has no metadata.name`},
		{func(c *Change) { c.Meta.UID = "" }, `encode deployments.apps "ns/n" (uid "", resourceVersion "1"): object has no metadata.uid`},
		{func(c *Change) { c.Meta.ResourceVersion = "" }, `encode deployments.apps "ns/n" (uid "u", resourceVersion ""): object has no metadata.resourceVersion`},
		{func(c *Change) { c.Meta.UID = "u\r\n" }, `encode deployments.apps "ns/n" (uid "u\r\n", resourceVersion "1"): metadata.uid contains control characters`},
	}
	for _, tt := range tests {
		c := valid
		tt.mod(&c)
		if _, err := e.Encode(&c); err == nil || err.Error() != tt.want {
			t.Errorf("error = %v\nwant %s", err, tt.want)
		}
	}
	if _, err := e.Encode(nil); err == nil {
		t.Error("Encode(nil) succeeded")
	}
	// No payload mode is needed when there is no data.
	c := valid
	c.Payload, c.Data = "", nil
	if _, err := e.Encode(&c); err != nil {
		t.Errorf("no data: %v", err)
	}
}

func TestEncodeZeroTime(t *testing.T) {
	e := newTestEncoder(t, EncoderOptions{Cluster: "c", Source: "s"})
	before := time.Now()
	msg, err := e.Encode(&Change{Type: Added, Origin: OriginWatch, Resource: podsResource,
		Meta: Meta{Name: "n", UID: "u", ResourceVersion: "1"}})
	if err != nil {
		t.Fatal(err)
	}
	env, err := DecodeStructured(msg.Data)
	if err != nil {
		t.Fatal(err)
	}
	if env.Time.Before(before.Add(-time.Second)) || env.Time.After(time.Now().Add(time.Second)) {
		t.Errorf("time = %v, want about now", env.Time)
	}
}

func TestControl(t *testing.T) {
	e := newTestEncoder(t, EncoderOptions{Cluster: "prod", Source: "pods"})
	started := e.Control(SyncEvent{Namespace: "", Epoch: 4, Reason: "expired", FromResourceVersion: "100", Time: testTime})
	if started.Subject != "k8s.prod._relayd.pods.sync.started" || started.Subject != e.ControlSubject(false) {
		t.Errorf("Subject = %q", started.Subject)
	}
	if started.MsgID != "k8s.prod/pods/sync/_/4/started" || started.Header["Nats-Msg-Id"][0] != started.MsgID {
		t.Errorf("MsgID = %q", started.MsgID)
	}
	wantBody := `{"specversion":"1.0","id":"sync/_/4/started","source":"/relayd/prod/pods","type":"k8s.source.sync.started",` +
		`"subject":"/relayd/pods","time":"` + testTimeString + `","datacontenttype":"application/json","k8scluster":"prod",` +
		`"relaydsource":"pods","relaydepoch":4,` +
		`"data":{"namespace":"","epoch":4,"reason":"expired","fromResourceVersion":"100","toResourceVersion":""}}`
	if string(started.Data) != wantBody {
		t.Errorf("started body\n got %s\nwant %s", started.Data, wantBody)
	}
	if _, err := DecodeStructured(started.Data); err != nil {
		t.Error(err)
	}
	checkSize(t, &started)

	s := SyncEvent{Completed: true, Namespace: "shop", Epoch: 4, Reason: "expired", FromResourceVersion: "100", ToResourceVersion: "250",
		Counts: SyncCounts{Added: 1, Modified: 2, Deleted: 3, Unchanged: 40, Total: 43}, Time: testTime}
	completed := e.Control(s)
	if completed.Subject != "k8s.prod._relayd.pods.sync.completed" || completed.Subject != e.ControlSubject(true) || completed.MsgID != "k8s.prod/pods/sync/shop/4/completed" {
		t.Errorf("Subject %q MsgID %q", completed.Subject, completed.MsgID)
	}
	m := decodeBody(t, completed.Data, "specversion", "id", "source", "type", "subject", "time", "datacontenttype",
		"k8scluster", "k8snamespace", "relaydsource", "relaydepoch", "data")
	if string(m["type"]) != `"k8s.source.sync.completed"` || string(m["k8snamespace"]) != `"shop"` {
		t.Errorf("type %s, k8snamespace %s", m["type"], m["k8snamespace"])
	}
	var data struct {
		Namespace           string     `json:"namespace"`
		Epoch               uint64     `json:"epoch"`
		Reason              string     `json:"reason"`
		FromResourceVersion string     `json:"fromResourceVersion"`
		ToResourceVersion   string     `json:"toResourceVersion"`
		Counts              SyncCounts `json:"counts"`
	}
	dec := json.NewDecoder(bytes.NewReader(m["data"]))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&data); err != nil {
		t.Fatal(err)
	}
	if data.Namespace != "shop" || data.Epoch != 4 || data.Reason != "expired" || data.FromResourceVersion != "100" ||
		data.ToResourceVersion != "250" || data.Counts != s.Counts {
		t.Errorf("data = %+v", data)
	}

	// Binary mode.
	be := newTestEncoder(t, EncoderOptions{Cluster: "prod", Source: "pods", Binary: true})
	bm := be.Control(s)
	benv, err := DecodeMessage(bm.Header, bm.Data)
	if err != nil {
		t.Fatal(err)
	}
	senv, _ := DecodeStructured(completed.Data)
	if !bytes.Equal(benv.Data, senv.Data) || benv.Type != senv.Type || benv.ID != senv.ID || benv.K8sNamespace != "shop" ||
		benv.RelaydEpoch != 4 || benv.Subject != "/relayd/pods" || !benv.Time.Equal(testTime) || bm.Header["Content-Type"][0] != "application/json" {
		t.Errorf("binary control event %+v", benv)
	}
	if _, ok := be.Control(SyncEvent{}).Header["ce-k8snamespace"]; ok {
		t.Error("ce-k8snamespace set for an empty namespace")
	}
	checkSize(t, &bm)
}

func TestDecodeErrors(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{`{`, "decode CloudEvent: unexpected end of JSON input"},
		{`{"specversion":"0.3","id":"i","source":"s","type":"t"}`, `decode CloudEvent: specversion "0.3", want "1.0"`},
		{`{"specversion":"1.0","source":"s","type":"t"}`, "decode CloudEvent: missing id"},
		{`{"specversion":"1.0","id":"i","type":"t"}`, "decode CloudEvent: missing source"},
		{`{"specversion":"1.0","id":"i","source":"s"}`, "decode CloudEvent: missing type"},
	} {
		if _, err := DecodeStructured([]byte(tt.in)); err == nil || err.Error() != tt.want {
			t.Errorf("DecodeStructured(%s) error = %v, want %q", tt.in, err, tt.want)
		}
	}
	h := map[string][]string{"ce-specversion": {"1.0"}, "ce-id": {"i"}, "ce-source": {"s"}, "ce-type": {"t"}, "ce-relaydepoch": {"x"}}
	if _, err := DecodeMessage(h, nil); err == nil || !strings.Contains(err.Error(), "header ce-relaydepoch") {
		t.Errorf("bad epoch: %v", err)
	}
	h["ce-relaydepoch"] = []string{"1"}
	h["CE-K8sName"] = []string{"a%2"}
	if _, err := DecodeMessage(h, nil); err == nil || !strings.Contains(err.Error(), "malformed percent-encoding") {
		t.Errorf("bad percent-encoding: %v", err)
	}
	h["CE-K8sName"] = []string{"a%2fb"}
	if env, err := DecodeMessage(h, nil); err != nil || env.K8sName != "a/b" {
		t.Errorf("case-insensitive header: %+v, %v", env, err)
	}
}

// A released message has no body; the encoder's next message, in the
// released buffer or not, is its own.
func TestReleasedBodyServesTheNextEvent(t *testing.T) {
	e := newTestEncoder(t, EncoderOptions{Cluster: "prod", Source: "pods", MaxPayload: 1 << 20})
	change := func(name string) *Change {
		return &Change{Type: Added, Origin: OriginWatch, Epoch: 1, Time: testTime, Resource: podsResource,
			Meta: Meta{UID: "u-" + name, Namespace: "ns", Name: name, ResourceVersion: "1"}}
	}
	m1, err := e.Encode(change("first-with-a-longer-name"))
	if err != nil {
		t.Fatal(err)
	}
	m1.Release()
	if m1.Data != nil {
		t.Errorf("released message keeps its body %.40q…", m1.Data)
	}
	m1.Release() // twice: nothing more
	for _, name := range []string{"b", "c"} {
		m, err := e.Encode(change(name))
		if err != nil {
			t.Fatal(err)
		}
		env, err := DecodeStructured(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		if env.K8sName != name || env.K8sUID != "u-"+name {
			t.Errorf("message of %s carries %s (%s)", name, env.K8sName, env.K8sUID)
		}
		m.Release()
	}
}
