package testenv

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// JSRequest sends a JetStream API request on nc to subj (with its API
// prefix, e.g. "$JS.API.STREAM.INFO.K8S"), body as JSON unless nil, and
// returns the "config" of the response key by key, each value as the server
// wrote it. An error response is an error naming the subject. This is the
// server's own view of a stream, not what nats.go makes of it.
func JSRequest(ctx context.Context, nc *nats.Conn, subj string, body any) (map[string]json.RawMessage, error) {
	var data []byte
	if body != nil {
		var err error
		if data, err = json.Marshal(body); err != nil {
			return nil, err
		}
	}
	msg, err := nc.RequestWithContext(ctx, subj, data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", subj, err)
	}
	var resp struct {
		Error *struct {
			Code        int    `json:"code"`
			ErrCode     int    `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
		Config map[string]json.RawMessage `json:"config"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return nil, fmt.Errorf("%s: %w: %s", subj, err, msg.Data)
	}
	if e := resp.Error; e != nil {
		return nil, fmt.Errorf("%s: %s (code %d, err_code %d)", subj, e.Description, e.Code, e.ErrCode)
	}
	return resp.Config, nil
}

// RawStream is a stream configuration as the JSON body of STREAM.CREATE.
type RawStream struct {
	Variant, Name string
	Config        map[string]any
}

// StreamsAwayFromDefaults are stream configurations that between them hold
// every setting nats-server v2.15.2 accepts away from its default (settings
// that exclude each other are in different variants: "limits", "rollups",
// "counter", "mirror", "sealed"). stream gives each variant its name and
// subjects; the sources and the mirror read origin (see CreateRawStreams),
// one source through the JetStream API of another domain (farAPI). Every
// variant has max_msgs_per_subject 5, so that a "KV_" stream is a key-value
// bucket to nats.go.
func StreamsAwayFromDefaults(origin string, stream func(variant string) (name string, subjects []string)) []RawStream {
	var out []RawStream
	for _, v := range []string{"limits", "rollups", "counter", "mirror", "sealed"} {
		name, subjects := stream(v)
		c := map[string]any{
			"name": name, "description": "shared: " + v, "subjects": subjects,
			"max_consumers": 7, "max_msgs": 100000, "max_bytes": 1 << 30, "max_age": 72 * time.Hour,
			"max_msgs_per_subject": 5, "max_msg_size": 65536, "duplicate_window": 5 * time.Minute,
			"compression": "s2", "allow_direct": true, "deny_delete": true,
			"placement":       map[string]any{"tags": []string{"ssd"}},
			"consumer_limits": map[string]any{"inactive_threshold": time.Hour, "max_ack_pending": 100},
			"metadata":        map[string]string{"owner": "team-a", "managed-by": "gitops"},
		}
		for k, x := range variantSettings(v, origin, name, subjects[0]) {
			c[k] = x
		}
		switch v {
		case "mirror":
			delete(c, "subjects")
		case "sealed":
			delete(c, "max_age") // sealing clears it: nothing ages out of a sealed stream
		}
		out = append(out, RawStream{Variant: v, Name: name, Config: c})
	}
	return out
}

// farAPI is the JetStream API prefix of the domain an external source of
// StreamsAwayFromDefaults reads from. CreateRawStreams answers it: the
// server waits 30 s for an answer, even after its shutdown.
const farAPI = "$JS.far.API"

// variantSettings are the settings of one variant of StreamsAwayFromDefaults
// on top of the common ones; subject is the variant's first subject.
func variantSettings(v, origin, name, subject string) map[string]any {
	switch v {
	case "limits":
		return map[string]any{
			"retention": "interest", "discard": "new", "discard_new_per_subject": true, "no_ack": true,
			"first_seq": 100, "deny_purge": true, "allow_msg_ttl": true, "allow_atomic": true, "allow_batched": true,
			"subject_transform": map[string]any{"src": subject, "dest": "transformed." + subject},
			"republish":         map[string]any{"src": subject, "dest": "republished." + subject, "headers_only": true},
			"sources": []any{
				map[string]any{"name": origin, "opt_start_seq": 3, "filter_subject": origin + ".a.>"},
				map[string]any{"name": origin, "opt_start_time": "2026-01-02T03:04:05.123456789Z",
					"subject_transforms": []any{map[string]any{"src": origin + ".b.*", "dest": origin + ".b.x.{{wildcard(1)}}"}}},
				map[string]any{"name": origin, "consumer": map[string]any{"name": "sourcing", "deliver_subject": "deliver." + name}},
				map[string]any{"name": origin, "filter_subject": origin + ".c.>", "external": map[string]any{"api": farAPI, "deliver": "deliver.far"}},
			},
		}
	case "rollups":
		return map[string]any{
			"retention": "workqueue", "allow_rollup_hdrs": true, "allow_msg_ttl": true,
			"subject_delete_marker_ttl": 10 * time.Minute, "allow_msg_schedules": true, "persist_mode": "async",
		}
	case "counter":
		return map[string]any{"storage": "memory", "allow_msg_counter": true, "allow_atomic": true}
	case "mirror":
		return map[string]any{"mirror": map[string]any{"name": origin, "filter_subject": origin + ".>"}, "mirror_direct": true}
	}
	return nil
}

// CreateRawStreams creates, through the JetStream API under prefix (e.g.
// "$JS.API."), the stream origin (subjects "<origin>.>", direct get: the
// mirror's direct get follows its origin's), the durable consumers of
// origin that sources name, and then each of streams; the variant "sealed"
// is sealed by an update after it is created (the server refuses to create
// a sealed stream). While nc is open, it answers requests to farAPI. Each
// setting of streams must come back in the server's STREAM.INFO, or it is
// an error naming it. It returns that STREAM.INFO config of each of
// streams, and the config origin was created with: a stream with every
// setting at its default but its name and subjects.
func CreateRawStreams(ctx context.Context, nc *nats.Conn, prefix, origin string, streams []RawStream) (infos []map[string]json.RawMessage, defaults map[string]json.RawMessage, err error) {
	defaults, err = JSRequest(ctx, nc, prefix+"STREAM.CREATE."+origin, map[string]any{"name": origin, "subjects": []string{origin + ".>"}})
	if err != nil {
		return nil, nil, err
	}
	if _, err := JSRequest(ctx, nc, prefix+"STREAM.UPDATE."+origin, map[string]any{"name": origin, "subjects": []string{origin + ".>"}, "allow_direct": true}); err != nil {
		return nil, nil, err
	}
	if err := answerFarAPI(nc); err != nil {
		return nil, nil, err
	}
	for _, s := range streams {
		if err := createSourceConsumers(ctx, nc, prefix, s); err != nil {
			return nil, nil, err
		}
		if _, err := JSRequest(ctx, nc, prefix+"STREAM.CREATE."+s.Name, s.Config); err != nil {
			return nil, nil, fmt.Errorf("variant %s: %w", s.Variant, err)
		}
		if s.Variant == "sealed" {
			sealed := maps(s.Config)
			sealed["sealed"] = true
			if _, err := JSRequest(ctx, nc, prefix+"STREAM.UPDATE."+s.Name, sealed); err != nil {
				return nil, nil, fmt.Errorf("variant %s: seal: %w", s.Variant, err)
			}
		}
		info, err := JSRequest(ctx, nc, prefix+"STREAM.INFO."+s.Name, nil)
		if err != nil {
			return nil, nil, err
		}
		if missing := notIn(s.Config, info); len(missing) > 0 {
			return nil, nil, fmt.Errorf("variant %s: the server did not keep %s: %s", s.Variant, strings.Join(missing, ", "), mustJSON(info))
		}
		infos = append(infos, info)
	}
	return infos, defaults, nil
}

// answerFarAPI answers each request to farAPI on nc, while it is open,
// with an API error: there is no such domain.
func answerFarAPI(nc *nats.Conn) error {
	_, err := nc.Subscribe(farAPI+".>", func(m *nats.Msg) {
		_ = m.Respond([]byte(`{"type":"io.nats.jetstream.api.v1.consumer_create_response","error":{"code":503,"err_code":10039,"description":"JetStream not enabled"}}`))
	})
	if err != nil {
		return err
	}
	return nc.Flush()
}

// createSourceConsumers creates the durable consumer each source of s
// with a "consumer" reads (durable sourcing needs one that exists: the
// server only resets it, and without one its setup waits for an answer).
func createSourceConsumers(ctx context.Context, nc *nats.Conn, prefix string, s RawStream) error {
	sources, _ := s.Config["sources"].([]any)
	for _, src := range sources {
		src, _ := src.(map[string]any)
		c, ok := src["consumer"].(map[string]any)
		if !ok {
			continue
		}
		stream, name := src["name"].(string), c["name"].(string)
		if _, err := JSRequest(ctx, nc, prefix+"CONSUMER.CREATE."+stream+"."+name, map[string]any{"stream_name": stream, "config": map[string]any{
			"durable_name": name, "deliver_subject": c["deliver_subject"], "ack_policy": "flow_control", "max_ack_pending": 1000,
		}}); err != nil {
			return fmt.Errorf("variant %s: consumer %s of its source %s: %w", s.Variant, name, stream, err)
		}
	}
	return nil
}

func maps(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// notIn names each key of want whose value is not in got (JSON subset:
// objects may have more keys in got).
func notIn(want map[string]any, got map[string]json.RawMessage) []string {
	var out []string
	for k, v := range want {
		var g any
		if raw, ok := got[k]; !ok || json.Unmarshal(raw, &g) != nil || !subset(normalize(v), g) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

func normalize(v any) any {
	var out any
	_ = json.Unmarshal(mustJSON(v), &out)
	return out
}

func subset(want, got any) bool {
	w, ok := want.(map[string]any)
	if !ok {
		return reflect.DeepEqual(want, got)
	}
	g, ok := got.(map[string]any)
	if !ok {
		return false
	}
	for k, v := range w {
		if !subset(v, g[k]) {
			return false
		}
	}
	return true
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// DiffConfigs names each key of two stream configs (as JSRequest returns
// them) whose value is not byte for byte the same, or that only one has,
// with both values; keys in except are not compared.
func DiffConfigs(before, after map[string]json.RawMessage, except ...string) []string {
	var out []string
	for k := range mergeKeys(before, after) {
		if slices.Contains(except, k) {
			continue
		}
		b, inB := before[k]
		a, inA := after[k]
		if inB != inA || !bytes.Equal(b, a) {
			out = append(out, fmt.Sprintf("%s: %s before, %s after", k, orAbsent(b, inB), orAbsent(a, inA)))
		}
	}
	slices.Sort(out)
	return out
}

func mergeKeys(a, b map[string]json.RawMessage) map[string]bool {
	out := map[string]bool{}
	for k := range a {
		out[k] = true
	}
	for k := range b {
		out[k] = true
	}
	return out
}

func orAbsent(v json.RawMessage, ok bool) string {
	if !ok {
		return "absent"
	}
	return string(v)
}

// NotAwayFromDefault are the settings of nats-server's StreamConfig that
// StreamsAwayFromDefaults leaves at their default on a single server, and
// why. Keys are "<type>.<json name>".
func NotAwayFromDefault() map[string]string {
	return map[string]string{
		"StreamConfig.num_replicas": "a single server stores one replica only (pkg/stream tests it on a cluster)",
		"Placement.cluster":         "a single server is in no cluster to place a stream in (pkg/stream tests it on a cluster)",
		"Placement.preferred":       `the server refuses it in a stream's configuration ("preferred server not permitted in placement")`,
	}
}

// UncoveredStreamSettings lists the settings of nats-server's StreamConfig,
// nested ones included, found by reflection on the server's own type, as
// "<type>.<json name>", that none of configs holds away from its default, but
// for those in NotAwayFromDefault. A top-level setting is away from its
// default when its value differs from the one in defaults (the config of a
// stream created with only a name and subjects); a nested one when it is set
// and not zero.
func UncoveredStreamSettings(configs []map[string]json.RawMessage, defaults map[string]json.RawMessage) []string {
	all := map[string]bool{}
	settings(reflect.TypeFor[server.StreamConfig](), all)
	covered := map[string]bool{}
	for _, c := range configs {
		top := map[string]json.RawMessage{}
		for k, v := range c {
			if d, ok := defaults[k]; !ok || !bytes.Equal(d, v) {
				top[k] = v
			}
		}
		cover(reflect.TypeFor[server.StreamConfig](), mustJSON(top), covered)
	}
	var out []string
	for s := range all {
		if _, skip := NotAwayFromDefault()[s]; !covered[s] && !skip {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return out
}

var marshaler = reflect.TypeFor[json.Marshaler]()

// structOf is the struct type settings of type t are nested in (through
// pointers and slices), or nil when a value of t is a single setting.
func structOf(t reflect.Type) reflect.Type {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || t.Implements(marshaler) || reflect.PointerTo(t).Implements(marshaler) {
		return nil
	}
	return t
}

// jsonFields are the exported fields of struct type t by JSON name.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if !f.IsExported() || name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}

func settings(t reflect.Type, into map[string]bool) {
	for name, ft := range jsonFields(t) {
		key := t.Name() + "." + name
		if into[key] {
			continue
		}
		into[key] = true
		if st := structOf(ft); st != nil {
			settings(st, into)
		}
	}
}

// cover marks each setting of struct type t that raw (its JSON: an object,
// or an array of objects) holds set and not zero.
func cover(t reflect.Type, raw json.RawMessage, covered map[string]bool) {
	var list []json.RawMessage
	if json.Unmarshal(raw, &list) == nil {
		for _, e := range list {
			cover(t, e, covered)
		}
		return
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(raw, &obj) != nil {
		return
	}
	for name, ft := range jsonFields(t) {
		v, ok := obj[name]
		if !ok || isZero(v) {
			continue
		}
		covered[t.Name()+"."+name] = true
		if st := structOf(ft); st != nil {
			cover(st, v, covered)
		}
	}
}

func isZero(v json.RawMessage) bool {
	switch string(bytes.TrimSpace(v)) {
	case "null", `""`, "0", "false", "{}", "[]":
		return true
	}
	return false
}
