package event

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	ce "github.com/cloudevents/sdk-go/v2/event"
)

// The hand-written structured encoder (Encode) next to CloudEvents sdk-go
// encoding the same event: the same attributes, extensions and data, in
// structured JSON mode, into the same Message (subject, Nats-Msg-Id,
// headers). docs/PERFORMANCE.md, "The encoder next to sdk-go", reports the
// figures; `benchstat -col /encoder` puts the two side by side.

// smallConfigMap is a ConfigMap as the apiserver sends it, without
// managedFields (~0.5 KB): the small end of the objects relayd relays.
const smallConfigMap = `{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"shop-settings","namespace":"shop",` +
	`"uid":"6f1c2b7a-3d4e-4f50-9a61-7b8c9d0e1f23","resourceVersion":"48213","creationTimestamp":"2026-11-20T10:12:31Z",` +
	`"labels":{"app.kubernetes.io/name":"shop","app.kubernetes.io/part-of":"storefront"},` +
	`"annotations":{"config.example.com/owner":"team-shop"}},` +
	`"data":{"LOG_LEVEL":"info","CACHE_TTL":"300s","FEATURE_FLAGS":"checkout-v2,search-suggest","UPSTREAM":"http://catalog.shop.svc:8080"}}`

// sdkEncode builds the structured message of c with sdk-go: what Encode
// builds for a change that fits MaxPayload (no oversize, no relayddropped,
// which the benchmark's changes do not have).
func sdkEncode(e *Encoder, c *Change) (Message, error) {
	m := c.Meta
	if m.APIVersion == "" {
		m.APIVersion = c.Resource.APIVersion()
	}
	if m.Kind == "" {
		m.Kind = c.Resource.Kind
	}
	subject, msgID := e.subjectAndMsgID(c, &m)
	ev := ce.New()
	ev.SetID(msgID[len(e.msgIDPrefix):])
	ev.SetSource(e.ceSource)
	ev.SetType(e.objType + string(c.Type))
	ev.SetSubject(string(appendCESubject(nil, c.Resource, m.Namespace, m.Name, true)))
	ev.SetTime(c.Time)
	ev.SetExtension("k8scluster", e.opts.Cluster)
	ev.SetExtension("k8sapiversion", m.APIVersion)
	ev.SetExtension("k8skind", m.Kind)
	ev.SetExtension("k8sresource", c.Resource.Resource)
	if m.Namespace != "" {
		ev.SetExtension("k8snamespace", m.Namespace)
	}
	ev.SetExtension("k8sname", m.Name)
	ev.SetExtension("k8suid", m.UID)
	ev.SetExtension("k8sresourceversion", m.ResourceVersion)
	ev.SetExtension("relaydsource", e.opts.Source)
	ev.SetExtension("relaydorigin", string(c.Origin))
	ev.SetExtension("relaydepoch", int32(c.Epoch))
	ev.SetExtension("relaydpayload", string(c.Payload))
	if c.FinalStateUnknown {
		ev.SetExtension("relaydfinalunknown", true)
	}
	// The payload is JSON already: sdk-go's way to embed encoded data
	// as is (SetData with a []byte would base64 it into data_base64).
	ev.SetDataContentType(ContentTypeJSON)
	ev.DataEncoded = c.Data
	body, err := json.Marshal(ev)
	if err != nil {
		return Message{}, err
	}
	return Message{
		Subject: subject, MsgID: msgID, Data: body,
		Header: map[string][]string{HeaderContentType: {ContentTypeCloudEvents}, HeaderMsgID: {msgID}},
	}, nil
}

// encoderCases are the changes both encoders are measured on: the 8.3 KB
// pod of testdata as relayd sends it by default (4.7 KB without
// managedFields) and whole (keepManagedFields), and the small ConfigMap.
func encoderCases(tb testing.TB) []struct {
	name string
	c    *Change
} {
	pod, o := podChange(tb, PayloadFull)
	whole := *pod
	whole.Data = o.AppendPayload(nil, PayloadFull, true)
	cmo, err := ParseObject([]byte(smallConfigMap))
	if err != nil {
		tb.Fatal(err)
	}
	cm := &Change{Type: Modified, Origin: OriginWatch, Epoch: 3, Time: testTime,
		Resource: Resource{Version: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespaced: true},
		Meta:     cmo.Meta, Payload: PayloadFull, Data: cmo.AppendPayload(nil, PayloadFull, false)}
	return []struct {
		name string
		c    *Change
	}{{"pod", pod}, {"pod-with-managedfields", &whole}, {"configmap", cm}}
}

// The benchmark compares like with like: sdk-go's message decodes to the
// same attributes, extensions and data as Encode's, with the same subject
// and headers.
func TestSDKEncodeSameEvent(t *testing.T) {
	e := newTestEncoder(t, EncoderOptions{Cluster: "prod", Source: "pods", MaxPayload: 1 << 20})
	for _, tc := range encoderCases(t) {
		want, err := e.Encode(tc.c)
		if err != nil {
			t.Fatal(err)
		}
		got, err := sdkEncode(e, tc.c)
		if err != nil {
			t.Fatal(err)
		}
		if got.Subject != want.Subject || got.MsgID != want.MsgID || !reflect.DeepEqual(got.Header, want.Header) {
			t.Errorf("%s: sdk-go message %s %s %v, want %s %s %v", tc.name, got.Subject, got.MsgID, got.Header, want.Subject, want.MsgID, want.Header)
		}
		g, w := decodeJSON(t, got.Data).(map[string]any), decodeJSON(t, want.Data).(map[string]any)
		// sdk-go writes RFC 3339 with the nanoseconds it has (none here);
		// relayd always writes nine digits: the same instant.
		gt, err1 := time.Parse(time.RFC3339Nano, g["time"].(string))
		wt, err2 := time.Parse(time.RFC3339Nano, w["time"].(string))
		if err1 != nil || err2 != nil || !gt.Equal(wt) {
			t.Errorf("%s: time %v, want %v (%v, %v)", tc.name, g["time"], w["time"], err1, err2)
		}
		delete(g, "time")
		delete(w, "time")
		if !reflect.DeepEqual(g, w) {
			t.Errorf("%s: sdk-go body decodes to\n%v\nwant\n%v", tc.name, g, w)
		}
	}
}

func BenchmarkEncodeVsSDK(b *testing.B) {
	e := newTestEncoder(b, EncoderOptions{Cluster: "prod", Source: "pods", MaxPayload: 1 << 20})
	for _, tc := range encoderCases(b) {
		b.Run("object="+tc.name+"/encoder=relayd", func(b *testing.B) {
			b.SetBytes(int64(len(tc.c.Data)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := e.Encode(tc.c); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("object="+tc.name+"/encoder=sdk-go", func(b *testing.B) {
			b.SetBytes(int64(len(tc.c.Data)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := sdkEncode(e, tc.c); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkControl is a sync.completed marker in structured mode (not on
// the hot path: two per list).
func BenchmarkControl(b *testing.B) {
	e := newTestEncoder(b, EncoderOptions{Cluster: "prod", Source: "deploys"})
	s := SyncEvent{Completed: true, Namespace: "shop", Epoch: 3, Reason: "expired", FromResourceVersion: "48213",
		ToResourceVersion: "50122", Resource: deployResource, LabelSelector: "tier in (web,api)", Time: testTime,
		Counts: SyncCounts{Added: 2, Modified: 5, Deleted: 1, Unchanged: 40, Total: 47}}
	b.ReportAllocs()
	for b.Loop() {
		e.Control(s)
	}
}
