package event

import (
	"bytes"
	"encoding/json"
	"strconv"
	"testing"
	"time"
)

// TestHeartbeat: the heartbeat's subject, ids, envelope and data in
// structured mode, byte for byte; the same event in binary mode; and ids
// that differ for heartbeats a nanosecond apart.
func TestHeartbeat(t *testing.T) {
	e := newTestEncoder(t, EncoderOptions{Cluster: "prod", Source: "pods"})
	read := testTime.Add(-3 * time.Second)
	h := HeartbeatEvent{Namespace: "shop", Epoch: 4, ResourceVersion: "250", StreamSeq: 77, LastRead: read, Interval: time.Minute, Time: testTime}
	m := e.Heartbeat(h)
	if m.Subject != "k8s.prod._relayd.pods.heartbeat" || m.Subject != e.HeartbeatSubject() {
		t.Errorf("Subject = %q", m.Subject)
	}
	id := "heartbeat/shop/" + strconv.FormatInt(testTime.UnixNano(), 10)
	if m.MsgID != "k8s.prod/pods/"+id || m.Header["Nats-Msg-Id"][0] != m.MsgID {
		t.Errorf("MsgID = %q", m.MsgID)
	}
	wantBody := `{"specversion":"1.0","id":"` + id + `","source":"/relayd/prod/pods","type":"k8s.source.heartbeat",` +
		`"subject":"/relayd/pods","time":"` + testTimeString + `","datacontenttype":"application/json","k8scluster":"prod",` +
		`"k8snamespace":"shop","relaydsource":"pods","relaydepoch":4,` +
		`"data":{"namespace":"shop","epoch":4,"resourceVersion":"250","streamSeq":77,"lastReadTime":"` + read.UTC().Format(TimeLayout) + `","intervalSeconds":60}}`
	if string(m.Data) != wantBody {
		t.Errorf("body\n got %s\nwant %s", m.Data, wantBody)
	}
	senv, err := DecodeStructured(m.Data)
	if err != nil {
		t.Fatal(err)
	}
	checkSize(t, &m)

	be := newTestEncoder(t, EncoderOptions{Cluster: "prod", Source: "pods", Binary: true})
	bm := be.Heartbeat(h)
	benv, err := DecodeMessage(bm.Header, bm.Data)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(benv.Data, senv.Data) || benv.Type != senv.Type || benv.ID != senv.ID || benv.K8sNamespace != "shop" ||
		benv.RelaydEpoch != 4 || benv.RelaydSource != "pods" || benv.Subject != "/relayd/pods" || !benv.Time.Equal(testTime) ||
		bm.Header["Content-Type"][0] != ContentTypeJSON || bm.MsgID != m.MsgID || bm.Subject != m.Subject {
		t.Errorf("binary heartbeat %+v", benv)
	}
	checkSize(t, &bm)

	// Cluster-wide watch, nothing read yet: no k8snamespace, no lastReadTime.
	h2 := HeartbeatEvent{Epoch: 1, ResourceVersion: "9", Interval: 1500 * time.Millisecond, Time: testTime.Add(time.Nanosecond)}
	m2 := e.Heartbeat(h2)
	if m2.MsgID == m.MsgID {
		t.Errorf("two heartbeats share the Nats-Msg-Id %q", m.MsgID)
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(m2.Data, &doc); err != nil {
		t.Fatal(err)
	}
	if _, ok := doc["k8snamespace"]; ok {
		t.Error("k8snamespace set for a cluster-wide watch")
	}
	if want := `{"namespace":"","epoch":1,"resourceVersion":"9","streamSeq":0,"intervalSeconds":1.5}`; string(doc["data"]) != want {
		t.Errorf("data %s, want %s", doc["data"], want)
	}
	if _, ok := be.Heartbeat(h2).Header["ce-k8snamespace"]; ok {
		t.Error("ce-k8snamespace set for a cluster-wide watch")
	}
}
