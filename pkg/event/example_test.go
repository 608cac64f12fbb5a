package event_test

import (
	"fmt"
	"time"

	"github.com/relayd/relayd/pkg/event"
)

func ExampleEncodeToken() {
	for _, s := range []string{"web-0", "a.b", "50%", "ü"} {
		fmt.Println(event.EncodeToken(s))
	}
	// Output:
	// web-0
	// a%2Eb
	// 50%25
	// %C3%BC
}

func ExampleEncoder_Subject() {
	e, err := event.NewEncoder(event.EncoderOptions{Cluster: "prod", Source: "pods"})
	if err != nil {
		panic(err)
	}
	pods := event.Resource{Version: "v1", Resource: "pods", Kind: "Pod", Namespaced: true}
	issuers := event.Resource{Group: "cert-manager.io", Version: "v1", Resource: "clusterissuers", Kind: "ClusterIssuer"}
	fmt.Println(e.Subject(pods, "default", "web-0", event.Added))
	fmt.Println(e.Subject(issuers, "", "letsencrypt", event.Deleted))
	fmt.Println(e.ControlSubject(true))
	// Output:
	// k8s.prod.core.v1.pods.default.web-0.added
	// k8s.prod.cert-manager%2Eio.v1.clusterissuers._.letsencrypt.deleted
	// k8s.prod._relayd.pods.sync.completed
}

func ExampleParseWatchEvent() {
	frame := []byte(`{"type":"MODIFIED","object":{"apiVersion":"v1","kind":"ConfigMap",` +
		`"metadata":{"name":"cfg","namespace":"default","uid":"6f1c","resourceVersion":"42",` +
		`"managedFields":[{"manager":"kubectl"}]},"data":{"k":"v"}}}`)
	typ, obj, err := event.ParseWatchEvent(frame)
	if err != nil {
		panic(err)
	}
	fmt.Println(typ, obj.Meta.Namespace, obj.Meta.Name, obj.Meta.ResourceVersion)
	fmt.Println(string(obj.AppendPayload(nil, event.PayloadFull, false)))
	fmt.Println(string(obj.AppendPayload(nil, event.PayloadReference, false)))
	// Output:
	// MODIFIED default cfg 42
	// {"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cfg","namespace":"default","uid":"6f1c","resourceVersion":"42"},"data":{"k":"v"}}
	// {"apiVersion":"v1","kind":"ConfigMap","namespace":"default","name":"cfg","uid":"6f1c","resourceVersion":"42"}
}

func ExampleEncoder_Encode() {
	e, err := event.NewEncoder(event.EncoderOptions{Cluster: "prod", Source: "cms"})
	if err != nil {
		panic(err)
	}
	obj, err := event.ParseObject([]byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cfg","namespace":"default","uid":"6f1c","resourceVersion":"42"}}`))
	if err != nil {
		panic(err)
	}
	msg, err := e.Encode(&event.Change{
		Type: event.Added, Origin: event.OriginWatch, Epoch: 1,
		Time:     time.Date(2026, 3, 14, 9, 26, 53, 0, time.UTC),
		Resource: event.Resource{Version: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespaced: true},
		Meta:     obj.Meta, Payload: event.PayloadReference,
		Data: obj.AppendPayload(nil, event.PayloadReference, false),
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(msg.Subject)
	fmt.Println(msg.MsgID)
	fmt.Println(string(msg.Data))
	// Output:
	// k8s.prod.core.v1.configmaps.default.cfg.added
	// k8s.prod/cms/6f1c/42
	// {"specversion":"1.0","id":"6f1c/42","source":"/relayd/prod/cms","type":"k8s.object.added","subject":"/api/v1/namespaces/default/configmaps/cfg","time":"2026-03-14T09:26:53.000000000Z","datacontenttype":"application/json","k8scluster":"prod","k8sapiversion":"v1","k8skind":"ConfigMap","k8sresource":"configmaps","k8snamespace":"default","k8sname":"cfg","k8suid":"6f1c","k8sresourceversion":"42","relaydsource":"cms","relaydorigin":"watch","relaydepoch":1,"relaydpayload":"reference","data":{"apiVersion":"v1","kind":"ConfigMap","namespace":"default","name":"cfg","uid":"6f1c","resourceVersion":"42"}}
}
