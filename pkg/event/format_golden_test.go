package event_test

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/testutil"
	"github.com/relayd/relayd/pkg/event"
)

// The event format is a contract with every consumer (docs/CONSUMING.md,
// "The event on the wire"; docs/DEPLOY.md, "Upgrade and rollback: formats"). testdata/golden
// holds NATS messages exactly as this version writes them: object events in
// structured mode (one application/cloudevents+json document) and in binary
// mode (ce-* headers, the object as body), a resync delete with its final
// state unknown, an oversize event with a dotted name, the same change as
// the first sent without data (its reference exceeds the max payload), a
// modified event whose author lists are capped (relaydtruncated), and the
// sync control events. TestEventGoldenFiles checks that the encoder writes those bytes
// and that DecodeMessage reads them back to the expected attributes.
//
// A golden file is a NATS message as text: "subject: <subject>", then the
// headers sorted by name, one "<name>: <value>" line each (values are
// percent-encoded, never contain a line break), an empty line, and the body
// byte for byte. Regenerate them from the current code after an intended
// change with
//
//	go test ./pkg/event -run TestEventGoldenFiles -update
//
// and review the diff: any change to an existing file is a change of the
// wire format that consumers see, which docs/DEPLOY.md must then describe.
//
// Version field: events get none of relayd's own. The envelope is versioned
// by the CloudEvents specversion ("1.0"); relayd's part (the type names, the
// k8s* and relayd* extensions, the data of each payload mode) only ever
// grows: a new extension or a new member of a control event's data is added
// and old ones keep their meaning, which consumers written for CloudEvents
// tolerate (unknown extensions are ignored). An incompatible change would get
// new type names (<prefix>.object.v2.added, ...), which a consumer routing on
// type cannot mistake for the old ones, rather than a new extension that
// every existing consumer would ignore and every event would carry for
// nothing. So relayd adds no format-version extension.
var update = flag.Bool("update", false, "rewrite testdata/golden/*.msg from the current encoder")

// goldenTime is the time of every golden event.
var goldenTime = time.Date(2026, 11, 23, 10, 15, 2, 123456789, time.UTC)

type goldenEvent struct {
	file string
	opts event.EncoderOptions
	// change is encoded with Encode; nil means sync is encoded with Control.
	change *event.Change
	sync   event.SyncEvent
	want   event.Envelope // what DecodeMessage reads (Data: the body or the data member)
	// afterLegacy: a message no relayd wrote before the Nats-Msg-Id named
	// the cluster (testdata/msgid-v0 has none of it).
	afterLegacy bool
}

var (
	deployment = event.Resource{Group: "apps", Version: "v1", Resource: "deployments", Kind: "Deployment", Namespaced: true}
	configMap  = event.Resource{Version: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespaced: true}
	node       = event.Resource{Version: "v1", Resource: "nodes", Kind: "Node"}
)

const (
	webUID     = "6f2c1d3e-9a4b-4c5d-8e7f-0a1b2c3d4e5f"
	cmUID      = "0b7e4a12-3c5d-4e6f-8a9b-1c2d3e4f5a6b"
	nodeUID    = "d41d8cd9-8f00-4b20-9e98-00998ecf8427"
	webPayload = `{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"web","namespace":"shop","uid":"` + webUID + `","resourceVersion":"48213","generation":4,"labels":{"app":"web"}},"spec":{"replicas":3,"template":{"spec":{"containers":[{"name":"web","image":"registry.example/web:1.4"}]}}},"status":{"readyReplicas":3}}`
	ctlRes     = `"group":"apps","version":"v1","resource":"deployments","kind":"Deployment","namespaced":true,"labelSelector":"tier in (web,api)"`
	ctlData    = `{"namespace":"shop","epoch":3,"reason":"expired","fromResourceVersion":"48213","toResourceVersion":"50122",` + ctlRes + `}`
	ctlDone    = `{"namespace":"shop","epoch":3,"reason":"expired","fromResourceVersion":"48213","toResourceVersion":"50122",` + ctlRes + `,"counts":{"added":2,"modified":5,"deleted":1,"unchanged":40,"total":47}}`
)

func goldenEvents() []goldenEvent {
	structured := event.EncoderOptions{Cluster: "prod-eu-1", Source: "deploys"}
	binary := structured
	binary.Binary = true
	cms := event.EncoderOptions{Cluster: "prod-eu-1", Source: "cms"}
	cmsBinary := cms
	cmsBinary.Binary = true
	nodes := event.EncoderOptions{Prefix: "acme.k8s", Cluster: "prod-eu-1", Source: "nodes", MaxPayload: 1100}
	nodesBinary := nodes
	nodesBinary.Binary = true

	web := func() *event.Change {
		return &event.Change{
			Type: event.Modified, Origin: event.OriginWatch, Epoch: 3, Time: goldenTime, Resource: deployment,
			Meta:    event.Meta{Namespace: "shop", Name: "web", UID: webUID, ResourceVersion: "48213"},
			Payload: event.PayloadFull, Data: []byte(webPayload),
			Dropped: []string{"spec.template.spec.containers[*].env", `metadata.annotations["example.com/token"]`},
		}
	}
	webEnv := event.Envelope{
		SpecVersion: "1.0", ID: webUID + "/48213", Source: "/relayd/prod-eu-1/deploys", Type: "k8s.object.modified",
		Subject: "/apis/apps/v1/namespaces/shop/deployments/web", Time: goldenTime, DataContentType: "application/json",
		K8sCluster: "prod-eu-1", K8sAPIVersion: "apps/v1", K8sKind: "Deployment", K8sResource: "deployments",
		K8sNamespace: "shop", K8sName: "web", K8sUID: webUID, K8sResourceVersion: "48213",
		RelaydSource: "deploys", RelaydOrigin: "watch", RelaydEpoch: 3, RelaydPayload: "full",
		RelaydDropped: `spec.template.spec.containers[*].env,metadata.annotations["example.com/token"]`,
		Data:          []byte(webPayload),
	}

	cmDelete := func() *event.Change {
		return &event.Change{
			Type: event.Deleted, Origin: event.OriginResync, Epoch: 7, Time: goldenTime, Resource: configMap,
			Meta:              event.Meta{Namespace: "shop", Name: "settings", UID: cmUID, ResourceVersion: "50001"},
			FinalStateUnknown: true,
		}
	}
	cmRef := `{"apiVersion":"v1","kind":"ConfigMap","namespace":"shop","name":"settings","uid":"` + cmUID + `","resourceVersion":"50001"}`
	cmEnv := event.Envelope{
		SpecVersion: "1.0", ID: cmUID + "/50001/deleted", Source: "/relayd/prod-eu-1/cms", Type: "k8s.object.deleted",
		Subject: "/api/v1/namespaces/shop/configmaps/settings", Time: goldenTime, DataContentType: "application/json",
		K8sCluster: "prod-eu-1", K8sAPIVersion: "v1", K8sKind: "ConfigMap", K8sResource: "configmaps",
		K8sNamespace: "shop", K8sName: "settings", K8sUID: cmUID, K8sResourceVersion: "50001",
		RelaydSource: "cms", RelaydOrigin: "resync", RelaydEpoch: 7, RelaydPayload: "reference",
		RelaydFinalUnknown: true, Data: []byte(cmRef),
	}

	// A node whose full payload exceeds MaxPayload: sent as a reference,
	// relaydoversize=true, relayddropped left out. Its dotted name is
	// escaped in the subject token ("%2E"), not in ce-subject or k8sname.
	// (The quotes of web's relayddropped show binary mode's
	// percent-encoding of header values: "%22".)
	nodeName := "worker-1.eu.example"
	bigNode := `{"apiVersion":"v1","kind":"Node","metadata":{"name":"` + nodeName + `","uid":"` + nodeUID + `","resourceVersion":"777"},"status":{"images":["` + strings.Repeat("x", 1200) + `"]}}`
	nodeAdd := func() *event.Change {
		return &event.Change{
			Type: event.Added, Origin: event.OriginInitial, Epoch: 1, Time: goldenTime, Resource: node,
			Meta:    event.Meta{Name: nodeName, UID: nodeUID, ResourceVersion: "777"},
			Payload: event.PayloadFull, Data: []byte(bigNode), Dropped: []string{"status.images"},
		}
	}
	nodeRef := `{"apiVersion":"v1","kind":"Node","name":"` + nodeName + `","uid":"` + nodeUID + `","resourceVersion":"777"}`
	nodeEnv := event.Envelope{
		SpecVersion: "1.0", ID: nodeUID + "/777", Source: "/relayd/prod-eu-1/nodes", Type: "acme.k8s.object.added",
		Subject: "/api/v1/nodes/" + nodeName, Time: goldenTime, DataContentType: "application/json",
		K8sCluster: "prod-eu-1", K8sAPIVersion: "v1", K8sKind: "Node", K8sResource: "nodes",
		K8sName: nodeName, K8sUID: nodeUID, K8sResourceVersion: "777",
		RelaydSource: "nodes", RelaydOrigin: "initial", RelaydEpoch: 1, RelaydPayload: "reference", RelaydOversize: true,
		Data: []byte(nodeRef),
	}

	// The same change under a max payload that even its reference event
	// exceeds: sent without data (no datacontenttype, relaydpayload
	// "none", relaydoversize and relaydunencodable), relayddropped left out.
	tiny := structured
	tiny.MaxPayload = 800
	tinyBinary := binary
	tinyBinary.MaxPayload = 800
	bareEnv := webEnv
	bareEnv.DataContentType, bareEnv.RelaydPayload, bareEnv.RelaydDropped, bareEnv.Data = "", "none", "", nil
	bareEnv.RelaydOversize, bareEnv.RelaydUnencodable = true, true
	binaryBareEnv := bareEnv
	binaryBareEnv.Data = []byte{}

	started := event.SyncEvent{Namespace: "shop", Epoch: 3, Reason: "expired", FromResourceVersion: "48213", ToResourceVersion: "50122",
		Resource: deployment, LabelSelector: "tier in (web,api)", Time: goldenTime}
	completed := started
	completed.Completed = true
	completed.Counts = event.SyncCounts{Added: 2, Modified: 5, Deleted: 1, Unchanged: 40, Total: 47}
	ctlEnv := func(phase, data string) event.Envelope {
		return event.Envelope{
			SpecVersion: "1.0", ID: "sync/shop/3/" + phase, Source: "/relayd/prod-eu-1/deploys", Type: "k8s.source.sync." + phase,
			Subject: "/relayd/deploys", Time: goldenTime, DataContentType: "application/json",
			K8sCluster: "prod-eu-1", K8sNamespace: "shop", RelaydSource: "deploys", RelaydEpoch: 3, Data: []byte(data),
		}
	}
	clusterStarted := event.SyncEvent{Epoch: 1, Reason: "initial", ToResourceVersion: "700", Resource: node, Time: goldenTime}
	clusterEnv := event.Envelope{
		SpecVersion: "1.0", ID: "sync/_/1/started", Source: "/relayd/prod-eu-1/nodes", Type: "acme.k8s.source.sync.started",
		Subject: "/relayd/nodes", Time: goldenTime, DataContentType: "application/json",
		K8sCluster: "prod-eu-1", RelaydSource: "nodes", RelaydEpoch: 1,
		Data: []byte(`{"namespace":"","epoch":1,"reason":"initial","fromResourceVersion":"","toResourceVersion":"700",` +
			`"group":"","version":"v1","resource":"nodes","kind":"Node","namespaced":false}`),
	}

	// What changed: two of the source's changedPaths changed, one is not
	// known (relaydchanged, relaydchangedunknown).
	webChanged := func() *event.Change {
		c := web()
		c.Dropped = nil
		c.Changed = event.ChangedSet{Paths: []string{"spec", "status", "metadata.labels"}, Changed: 0b101, Unknown: 0b010}
		return c
	}
	changedEnv := webEnv
	changedEnv.RelaydDropped, changedEnv.RelaydChanged, changedEnv.RelaydChangedUnknown = "", "spec,metadata.labels", "status"

	// A resync on request (relayd resync --full): the markers carry the
	// request id and full; the objects' ids end in /full/<epoch>.
	requested := completed
	requested.Epoch, requested.Reason, requested.RequestID, requested.Full = 4, event.RelistRequested, "r-5f2c9e01aa31", true
	requestedEnv := ctlEnv("completed", strings.Replace(strings.Replace(ctlDone, `"reason":"expired"`, `"reason":"requested","requestId":"r-5f2c9e01aa31","full":true`, 1), `"epoch":3`, `"epoch":4`, 1))
	requestedEnv.ID, requestedEnv.RelaydEpoch = "sync/shop/4/completed", 4
	webFull := func() *event.Change {
		c := web()
		c.Origin, c.Epoch, c.IDSuffix = event.OriginResync, 4, "/full/4"
		return c
	}
	webFullEnv := webEnv
	webFullEnv.ID, webFullEnv.RelaydOrigin, webFullEnv.RelaydEpoch = webUID+"/48213/full/4", "resync", 4

	// Scope: the object left the source's filter (a deleted event with
	// its current data, relaydscope left), and one entered it (an added
	// event, relaydscope entered).
	webScope := func(typ event.Type, s event.Scope) *event.Change {
		c := web()
		c.Dropped, c.Type, c.Scope = nil, typ, s
		return c
	}
	leftEnv, enteredEnv := webEnv, webEnv
	leftEnv.RelaydDropped, leftEnv.Type, leftEnv.RelaydScope, leftEnv.ID = "", "k8s.object.deleted", "left", webUID+"/48213/deleted"
	enteredEnv.RelaydDropped, enteredEnv.Type, enteredEnv.RelaydScope, enteredEnv.ID = "", "k8s.object.added", "entered", webUID+"/48213"

	// Truncated: 17 managers wrote in the same second, one past
	// MaxAuthorEntries: the first 16 are named, and relaydtruncated says
	// the three lists are incomplete (docs/CONSUMING.md, "Truncated
	// extensions").
	var mf []string
	for i := range event.MaxAuthorEntries + 1 {
		mf = append(mf, fmt.Sprintf(`{"manager":"ctl-%02d","operation":"Update","apiVersion":"apps/v1","time":"2026-11-23T10:15:01Z","fieldsType":"FieldsV1","fieldsV1":{}}`, i))
	}
	many, err := event.ParseObject([]byte(`{"metadata":{"name":"web","managedFields":[` + strings.Join(mf, ",") + `]}}`))
	if err != nil {
		panic(err)
	}
	webTruncated := func() *event.Change {
		c := web()
		c.Dropped, c.Author = nil, many.Author()
		return c
	}
	truncatedEnv := webEnv
	truncatedEnv.RelaydDropped = ""
	truncatedEnv.K8sManager = strings.TrimSuffix(strings.Repeat("ctl-%02d,", event.MaxAuthorEntries), ",")
	truncatedEnv.K8sManager = fmt.Sprintf(truncatedEnv.K8sManager, func() []any {
		var n []any
		for i := range event.MaxAuthorEntries {
			n = append(n, i)
		}
		return n
	}()...)
	truncatedEnv.K8sOperation = strings.TrimSuffix(strings.Repeat("Update,", event.MaxAuthorEntries), ",")
	truncatedEnv.RelaydTruncated = "k8smanager,k8soperation,k8ssubresource"

	return []goldenEvent{
		{afterLegacy: true, file: "structured-deleted-scope-left.msg", opts: structured, change: webScope(event.Deleted, event.ScopeLeft), want: leftEnv},
		{afterLegacy: true, file: "binary-deleted-scope-left.msg", opts: binary, change: webScope(event.Deleted, event.ScopeLeft), want: leftEnv},
		{afterLegacy: true, file: "structured-added-scope-entered.msg", opts: structured, change: webScope(event.Added, event.ScopeEntered), want: enteredEnv},
		{afterLegacy: true, file: "binary-added-scope-entered.msg", opts: binary, change: webScope(event.Added, event.ScopeEntered), want: enteredEnv},
		{afterLegacy: true, file: "structured-modified-truncated.msg", opts: structured, change: webTruncated(), want: truncatedEnv},
		{afterLegacy: true, file: "binary-modified-truncated.msg", opts: binary, change: webTruncated(), want: truncatedEnv},
		{file: "structured-modified-changed.msg", opts: structured, change: webChanged(), want: changedEnv},
		{file: "binary-modified-changed.msg", opts: binary, change: webChanged(), want: changedEnv},
		{afterLegacy: true, file: "structured-sync-completed-requested.msg", opts: structured, sync: requested, want: requestedEnv},
		{afterLegacy: true, file: "binary-sync-completed-requested.msg", opts: binary, sync: requested, want: requestedEnv},
		{afterLegacy: true, file: "structured-modified-full-resync.msg", opts: structured, change: webFull(), want: webFullEnv},
		{afterLegacy: true, file: "binary-modified-full-resync.msg", opts: binary, change: webFull(), want: webFullEnv},
		{file: "structured-modified-full.msg", opts: structured, change: web(), want: webEnv},
		{file: "binary-modified-full.msg", opts: binary, change: web(), want: webEnv},
		{file: "structured-deleted-resync-final-state-unknown.msg", opts: cms, change: cmDelete(), want: cmEnv},
		{file: "binary-deleted-resync-final-state-unknown.msg", opts: cmsBinary, change: cmDelete(), want: cmEnv},
		{file: "structured-added-oversize-cluster-scoped.msg", opts: nodes, change: nodeAdd(), want: nodeEnv},
		{file: "binary-added-oversize-cluster-scoped.msg", opts: nodesBinary, change: nodeAdd(), want: nodeEnv},
		{file: "structured-modified-unencodable.msg", opts: tiny, change: web(), want: bareEnv},
		{file: "binary-modified-unencodable.msg", opts: tinyBinary, change: web(), want: binaryBareEnv},
		{file: "structured-sync-started.msg", opts: structured, sync: started, want: ctlEnv("started", ctlData)},
		{file: "structured-sync-completed.msg", opts: structured, sync: completed, want: ctlEnv("completed", ctlDone)},
		{file: "binary-sync-completed.msg", opts: binary, sync: completed, want: ctlEnv("completed", ctlDone)},
		{file: "structured-sync-started-cluster-scoped.msg", opts: nodes, sync: clusterStarted, want: clusterEnv},
	}
}

// encode builds g's message with an encoder of g's options, which it returns
// too.
func (g goldenEvent) encode(t *testing.T) (*event.Encoder, event.Message) {
	t.Helper()
	enc, err := event.NewEncoder(g.opts)
	if err != nil {
		t.Fatal(err)
	}
	if g.change == nil {
		return enc, enc.Control(g.sync)
	}
	msg, err := enc.Encode(g.change)
	if err != nil {
		t.Fatal(err)
	}
	return enc, msg
}

func TestEventGoldenFiles(t *testing.T) {
	for _, g := range goldenEvents() {
		t.Run(g.file, func(t *testing.T) {
			path := filepath.Join("testdata", "golden", g.file)
			enc, msg := g.encode(t)
			written := renderMessage(msg)
			// The current code writes the golden bytes.
			golden := testutil.Golden(t, path, written, *update, "the event format")

			// The current code reads them.
			subject, header, body, err := parseMessage(golden)
			if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			env, err := event.DecodeMessage(header, body)
			if err != nil {
				t.Fatalf("DecodeMessage(%s): %v", path, err)
			}
			if !reflect.DeepEqual(env, g.want) {
				t.Errorf("DecodeMessage(%s):\n got %+v\nwant %+v", path, env, g.want)
			}
			if !bytes.Equal(env.Data, g.want.Data) {
				t.Errorf("%s: data %s, want %s", path, env.Data, g.want.Data)
			}
			prefix := enc.Options().Prefix + "." + g.opts.Cluster
			if got, want := header[event.HeaderMsgID], []string{prefix + "/" + g.opts.Source + "/" + g.want.ID}; !slices.Equal(got, want) {
				t.Errorf("%s: Nats-Msg-Id %q, want %q", path, got, want)
			}
			if g.change == nil {
				if want := enc.ControlSubject(g.sync.Completed); subject != want {
					t.Errorf("%s: subject %q, want %q", path, subject, want)
				}
				return
			}
			p, err := event.ParseSubject(subject)
			if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			c := g.change
			want := event.SubjectParts{Prefix: enc.Options().Prefix, Cluster: g.opts.Cluster, Group: c.Resource.Group, Version: c.Resource.Version,
				Resource: c.Resource.Resource, Namespace: c.Meta.Namespace, Name: c.Meta.Name, Type: c.Type}
			if p != want {
				t.Errorf("%s: subject %q parses as %+v, want %+v", path, subject, p, want)
			}
		})
	}
}

// testdata/msgid-v0 holds the golden messages as relayd wrote them before
// the Nats-Msg-Id named the cluster ("<source>/<id>"; the rest of the bytes
// is what this version writes). After an upgrade, relayd republishes the
// changes after its checkpoint that the older version stored with such ids
// with the same ids (Encoder.UseLegacyMsgID), so that JetStream drops them
// as duplicates: that must give these bytes exactly. The sync markers of
// those versions did not name the resource and selectors in their data
// (members added later, which JetStream's duplicate check, on the
// Nats-Msg-Id alone, does not look at): they are encoded without them here.
func TestLegacyMsgIDReproducesOlderVersion(t *testing.T) {
	for _, g := range goldenEvents() {
		if g.afterLegacy {
			continue
		}
		t.Run(g.file, func(t *testing.T) {
			g.sync.Resource, g.sync.LabelSelector, g.sync.FieldSelector = event.Resource{}, "", ""
			enc, msg := g.encode(t)
			if got := enc.ID(&msg); got != g.want.ID {
				t.Errorf("ID = %q, want the CloudEvents id %q", got, g.want.ID)
			}
			current := string(renderMessage(msg))
			enc.UseLegacyMsgID(&msg)
			old, err := os.ReadFile(filepath.Join("testdata", "msgid-v0", g.file))
			if err != nil {
				t.Fatal(err)
			}
			if got := string(renderMessage(msg)); got != string(old) {
				t.Errorf("with the legacy Nats-Msg-Id:\n got %q\nwant %q", got, old)
			}
			if string(renderMessage(msg)) == current {
				t.Error("UseLegacyMsgID changed nothing")
			}
		})
	}
	var m event.Message
	enc, _ := event.NewEncoder(event.EncoderOptions{Cluster: "a", Source: "s"})
	if got := enc.ID(&m); got != "" {
		t.Errorf("ID of a message the encoder did not build = %q, want \"\"", got)
	}
}

// testdata/legacy holds messages as earlier versions wrote them, where the
// format changed since: the current code still reads them to the same
// attributes. (Before the relaydfinalunknown extension had its name, it was
// relaydfinalstateunknown.)
func TestDecodesLegacyMessages(t *testing.T) {
	want := map[string]event.Envelope{}
	for _, g := range goldenEvents() {
		want[g.file] = g.want
	}
	files, err := filepath.Glob(filepath.Join("testdata", "legacy", "*.msg"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no testdata/legacy/*.msg (%v)", err)
	}
	for _, path := range files {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		_, header, body, err := parseMessage(b)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		env, err := event.DecodeMessage(header, body)
		if err != nil {
			t.Fatalf("DecodeMessage(%s): %v", path, err)
		}
		w, ok := want[filepath.Base(path)]
		if !ok {
			t.Fatalf("%s: no golden event of that name to compare with", path)
		}
		if !reflect.DeepEqual(env, w) {
			t.Errorf("DecodeMessage(%s):\n got %+v\nwant %+v", path, env, w)
		}
		if !bytes.Contains(b, []byte(event.LegacyFinalUnknown)) || !env.RelaydFinalUnknown {
			t.Errorf("%s: want a legacy %s extension read as RelaydFinalUnknown", path, event.LegacyFinalUnknown)
		}
	}
}

// renderMessage is the golden text of m (see the file comment).
func renderMessage(m event.Message) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "subject: %s\n", m.Subject)
	for _, k := range slices.Sorted(maps.Keys(m.Header)) {
		for _, v := range m.Header[k] {
			fmt.Fprintf(&b, "%s: %s\n", k, v)
		}
	}
	b.WriteByte('\n')
	b.Write(m.Data)
	return b.Bytes()
}

// parseMessage inverts renderMessage.
func parseMessage(b []byte) (subject string, header map[string][]string, body []byte, err error) {
	head, body, ok := bytes.Cut(b, []byte("\n\n"))
	if !ok {
		return "", nil, nil, errors.New("no empty line between the headers and the body")
	}
	lines := strings.Split(string(head), "\n")
	subject, ok = strings.CutPrefix(lines[0], "subject: ")
	if !ok {
		return "", nil, nil, fmt.Errorf("first line %q is not \"subject: ...\"", lines[0])
	}
	header = map[string][]string{}
	for _, l := range lines[1:] {
		k, v, ok := strings.Cut(l, ": ")
		if !ok {
			return "", nil, nil, fmt.Errorf("header line %q is not \"Name: value\"", l)
		}
		header[k] = append(header[k], v)
	}
	return subject, header, body, nil
}

// testdata/markers-v0 holds the sync markers as relayd wrote them before
// their data named the watched resource and selectors ("group", "version",
// "resource", "kind", "namespaced", "labelSelector", "fieldSelector"): the
// current code reads them to the same attributes, and their data is the
// current data without those members (a consumer that reconciles has to
// fall back to what it holds, docs/CONSUMING.md, "The sync markers").
func TestDecodesMarkersWithoutResource(t *testing.T) {
	want := map[string]goldenEvent{}
	for _, g := range goldenEvents() {
		want[g.file] = g
	}
	files, err := filepath.Glob(filepath.Join("testdata", "markers-v0", "*.msg"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no testdata/markers-v0/*.msg (%v)", err)
	}
	for _, path := range files {
		g, ok := want[filepath.Base(path)]
		if !ok || g.change != nil {
			t.Fatalf("%s: no golden sync marker of that name to compare with", path)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		_, header, body, err := parseMessage(b)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		env, err := event.DecodeMessage(header, body)
		if err != nil {
			t.Fatalf("DecodeMessage(%s): %v", path, err)
		}
		old := g.sync
		old.Resource, old.LabelSelector, old.FieldSelector = event.Resource{}, "", ""
		enc, err := event.NewEncoder(g.opts)
		if err != nil {
			t.Fatal(err)
		}
		oldEnv, err := event.DecodeMessage(enc.Control(old).Header, enc.Control(old).Data)
		if err != nil {
			t.Fatal(err)
		}
		w := g.want
		w.Data = oldEnv.Data
		if !reflect.DeepEqual(env, w) {
			t.Errorf("DecodeMessage(%s):\n got %+v\nwant %+v", path, env, w)
		}
		if bytes.Contains(env.Data, []byte(`"resource"`)) {
			t.Errorf("%s: data %s names a resource: not the older form", path, env.Data)
		}
	}
}
