package event

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"sync"
	"time"
)

// DefaultPrefix is the subject and CloudEvents type prefix used when
// EncoderOptions.Prefix is empty.
const DefaultPrefix = "k8s"

// Content types and header names.
const (
	ContentTypeCloudEvents = "application/cloudevents+json"
	ContentTypeJSON        = "application/json"
	HeaderContentType      = "Content-Type"
	HeaderMsgID            = "Nats-Msg-Id"
	// HeaderPrefix starts the header of every CloudEvents attribute in
	// binary content mode ("ce-id", "ce-k8sname", ...).
	HeaderPrefix = "ce-"
	// SpecVersion is the CloudEvents version relayd emits.
	SpecVersion = "1.0"
)

// TimeLayout is RFC 3339 with a fixed nine-digit fraction; times are
// formatted in UTC, so the zone is always "Z".
const TimeLayout = "2006-01-02T15:04:05.000000000Z07:00"

// EncoderOptions configures an Encoder.
type EncoderOptions struct {
	// Prefix is the first subject token(s) and the CloudEvents type prefix;
	// DefaultPrefix ("k8s") when empty. Dot-separated tokens of A-Z a-z 0-9
	// _ -, e.g. "k8s" or "acme.k8s".
	Prefix string
	// Cluster is the cluster name: one token of A-Z a-z 0-9 _ -.
	Cluster string
	// Source is the relayd source name from the config: one token of
	// A-Z a-z 0-9 _ -.
	Source string
	// Binary selects binary content mode (ce-* headers, body = data)
	// instead of structured mode (one application/cloudevents+json document).
	Binary bool
	// MaxPayload is the NATS server's max payload in bytes (headers plus
	// body); 0 means no limit.
	MaxPayload int
}

// Encoder builds the NATS messages of one relayd source. It is immutable
// and safe for concurrent use.
type Encoder struct {
	opts EncoderOptions

	subjPrefix   string // "<prefix>.<cluster>."
	ceSource     string // "/relayd/<cluster>/<source>"
	objType      string // "<prefix>.object."
	objTypes     [3]string
	ctlSubjects  [2]string
	ctlTypes     [2]string
	ctlSubject   string // "/relayd/<source>"
	msgIDPrefix  string // "<prefix>.<cluster>/<source>/"
	jsonSrcType  string // `,"source":"…","type":"<prefix>.object.`
	jsonDCT      string // `,"datacontenttype":"application/json"`
	jsonCluster  string // `,"k8scluster":"…"`
	jsonRelaydSr string // `,"relaydsource":"…"`
	// bodies are structured event bodies given back by Message.Release,
	// for the next events: a watch's events are stored one after another,
	// so a few buffers serve all of them instead of one allocation (of the
	// object's size) per event (docs/PERFORMANCE.md, "What bounds it").
	bodies sync.Pool
}

// body is a structured event body from Encoder.bodies.
type body struct {
	b    []byte
	pool *sync.Pool
}

// maxPooledBody bounds the bodies kept for reuse: a rare large object's
// buffer is collected, not held.
const maxPooledBody = 64 << 10

// newBody returns an empty buffer of capacity n or more: a released one if
// one is big enough.
func (e *Encoder) newBody(n int) *body {
	if b, _ := e.bodies.Get().(*body); b != nil && cap(b.b) >= n {
		return b
	}
	return &body{b: make([]byte, 0, n), pool: &e.bodies}
}

// Release gives m's body back to the Encoder that built it, for a later
// message of that Encoder, and sets m.Data to nil. Call it only once m
// and every copy of it are no longer used: the sink does, when the
// message is stored and its entry done. A message never released is
// simply collected; one without a body of its own (a binary event, a
// marker) is left as it is.
func (m *Message) Release() {
	b := m.body
	if b == nil {
		return
	}
	m.body, m.Data = nil, nil
	if cap(b.b) <= maxPooledBody {
		b.b = b.b[:0]
		b.pool.Put(b)
	}
}

// NewEncoder validates o and returns an Encoder. Errors name the offending
// field; all problems are reported at once.
func NewEncoder(o EncoderOptions) (*Encoder, error) {
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	var errs []error
	for _, tok := range strings.Split(o.Prefix, ".") {
		if !validToken(tok) {
			errs = append(errs, fmt.Errorf("EncoderOptions.Prefix %q is invalid: want dot-separated tokens of A-Z a-z 0-9 _ -", o.Prefix))
			break
		}
	}
	check := func(field, v string) {
		switch {
		case v == "":
			errs = append(errs, fmt.Errorf("EncoderOptions.%s must not be empty", field))
		case !validToken(v):
			errs = append(errs, fmt.Errorf("EncoderOptions.%s %q is invalid: want one token of A-Z a-z 0-9 _ - (no dots)", field, v))
		}
	}
	check("Cluster", o.Cluster)
	check("Source", o.Source)
	if o.MaxPayload < 0 {
		errs = append(errs, fmt.Errorf("EncoderOptions.MaxPayload %d must not be negative", o.MaxPayload))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	e := &Encoder{opts: o}
	e.subjPrefix = o.Prefix + "." + o.Cluster + "."
	e.ceSource = "/relayd/" + o.Cluster + "/" + o.Source
	e.objType = o.Prefix + ".object."
	for i, t := range []Type{Added, Modified, Deleted} {
		e.objTypes[i] = e.objType + string(t)
	}
	e.ctlSubjects = [2]string{
		e.subjPrefix + ControlToken + "." + o.Source + ".sync.started",
		e.subjPrefix + ControlToken + "." + o.Source + ".sync.completed",
	}
	e.ctlTypes = [2]string{o.Prefix + ".source.sync.started", o.Prefix + ".source.sync.completed"}
	e.ctlSubject = "/relayd/" + o.Source
	e.msgIDPrefix = o.Prefix + "." + o.Cluster + "/" + o.Source + "/"
	// The option values are plain ASCII tokens: no JSON escaping needed.
	e.jsonSrcType = `,"source":"` + e.ceSource + `","type":"` + e.objType
	e.jsonDCT = `,"datacontenttype":"` + ContentTypeJSON + `"`
	e.jsonCluster = `,"k8scluster":"` + o.Cluster + `"`
	e.jsonRelaydSr = `,"relaydsource":"` + o.Source + `"`
	return e, nil
}

// Options returns the options the Encoder was built with (Prefix defaulted).
func (e *Encoder) Options() EncoderOptions { return e.opts }

// Subject returns the subject of a change of type t to the object
// namespace/name of resource r (see the package doc for the grammar).
func (e *Encoder) Subject(r Resource, namespace, name string, t Type) string {
	return string(e.AppendSubject(make([]byte, 0, 96), r, namespace, name, t))
}

// AppendSubject appends Subject(r, namespace, name, t) to dst.
func (e *Encoder) AppendSubject(dst []byte, r Resource, namespace, name string, t Type) []byte {
	return appendObjectSubject(dst, e.subjPrefix, r, namespace, name, t)
}

// ControlSubject returns the subject of the sync.started (completed=false)
// or sync.completed control event of this source.
func (e *Encoder) ControlSubject(completed bool) string { return e.ctlSubjects[b2i(completed)] }

func typeIndex(t Type) int {
	switch t {
	case Added:
		return 0
	case Modified:
		return 1
	}
	return 2
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Change is one object change to publish.
type Change struct {
	Type     Type
	Origin   Origin
	Epoch    uint64    // per source, +1 on every relist
	Time     time.Time // when relayd read the change; time.Now() if zero
	Resource Resource
	// Meta identifies the object. Empty APIVersion and Kind default to
	// Resource.APIVersion() and Resource.Kind.
	Meta Meta
	// Payload is the mode Data was built with.
	Payload PayloadMode
	// Data is the payload JSON built by Object.AppendPayload (or
	// AppendReference); it is embedded as is, so it must be valid JSON.
	// When empty, the reference payload is built from Meta and sent with
	// relaydpayload "reference" (e.g. for a delete with a final state
	// unknown).
	Data []byte
	// FinalStateUnknown marks a delete inferred after a gap (relist after a
	// 410): the object was gone and its final state was never seen.
	FinalStateUnknown bool
	// Dropped lists the canonical paths of the Shaping's Drop paths that
	// removed something from Data (as returned by Object.AppendShaped).
	// When non-empty, the event carries the relayddropped extension: the
	// paths joined by ",". It is left out when the payload is replaced by
	// the reference because of MaxPayload. Each path must be non-empty and
	// must not contain ',' (canonical paths never do).
	Dropped []string
	// IDSuffix is appended to the CloudEvents id and the Nats-Msg-Id
	// ("/full/<epoch>" for the objects of a full resync, which JetStream
	// must not drop as duplicates of their first publication); "" for none.
	IDSuffix string
	// Author is who made the change (Object.Author): the extensions
	// k8smanager, k8soperation and k8ssubresource. The zero Author adds
	// none of them.
	Author Author
	// Changed is which of the source's changedPaths differ from the
	// version published before (a modified event): the extensions
	// relaydchanged and relaydchangedunknown. The zero ChangedSet adds
	// neither.
	Changed ChangedSet
	// Scope is the relaydscope extension: ScopeEntered on an added event
	// of an existing object that started to match the source's filter,
	// ScopeLeft on a deleted event of one that stopped matching
	// (docs/CONSUMING.md, "Filters: entering and leaving scope"); "" adds
	// none.
	Scope Scope
}

// Message is one NATS message. Header has the type of nats.Header.
type Message struct {
	Subject string
	// MsgID is "<prefix>.<cluster>/<source>/<id>", also in
	// Header["Nats-Msg-Id"], so that JetStream drops a replay inside its
	// duplicate window, and only a replay: the subject namespace relayd
	// owns (<prefix>.<cluster>) is part of it, so relayds of other clusters
	// sharing the stream never deduplicate each other's messages.
	MsgID  string
	Header map[string][]string
	// Data is the body. In binary mode it aliases Change.Data.
	Data []byte
	// Oversize is true when the payload was replaced by the reference
	// because the event exceeded EncoderOptions.MaxPayload.
	Oversize bool
	// Unencodable is true when even the reference event exceeded
	// EncoderOptions.MaxPayload and the event was sent without data
	// (relaydpayload "none", relaydoversize and relaydunencodable true):
	// only its attributes and extensions name the change. Oversize is
	// true too.
	Unencodable bool
	// Truncated is true when the event carries the relaydtruncated
	// extension: k8smanager, k8soperation, k8ssubresource, relaydchanged
	// or relaydchangedunknown did not fit within MaxAuthorEntries and
	// MaxExtensionBytes (or, on an event without data, the max payload)
	// and name only part of what they would.
	Truncated bool
	// body is the buffer of Data when the Encoder may reuse it (Release).
	body *body
}

// Size is the number of bytes NATS counts against the server's max payload:
// the encoded headers ("NATS/1.0\r\n", "Key: value\r\n" per value, "\r\n")
// plus the body.
func (m *Message) Size() int {
	n := len(m.Data)
	if len(m.Header) > 0 {
		n += len("NATS/1.0\r\n") + len("\r\n")
		for k, vs := range m.Header {
			for _, v := range vs {
				n += len(k) + len(": ") + len(v) + len("\r\n")
			}
		}
	}
	return n
}

// Encode builds the NATS message for c.
//
// The CloudEvents id is <uid>/<resourceVersion> (plus "/deleted" for
// deletes) and MsgID is <prefix>.<cluster>/<source>/<id>. In structured mode the body is one
// JSON document with the attributes, the extensions and "data" (c.Data
// embedded as is, last); in binary mode every attribute and extension is a
// "ce-<name>" header, percent-encoded like the CloudEvents HTTP binding
// (space, '"', '%' and bytes outside 0x21-0x7e as %HH), and the body is
// c.Data.
//
// If MaxPayload is set and the message would exceed it, it is rebuilt with
// the reference payload and relaydoversize=true. If even that is too big, it
// is rebuilt without data (no datacontenttype either), relaydpayload "none"
// and relaydunencodable=true besides relaydoversize (Message.Unencodable):
// the change still reaches the stream, named by its attributes, and
// consumers re-read the object (docs/CONSUMING.md). If that too exceeds
// MaxPayload, or c is invalid (unknown type, origin or payload mode; no
// name, uid or resourceVersion; no resource), Encode returns an error
// naming the object.
func (e *Encoder) Encode(c *Change) (Message, error) {
	if err := e.validate(c); err != nil {
		return Message{}, err
	}
	m := c.Meta
	if m.APIVersion == "" {
		m.APIVersion = c.Resource.APIVersion()
	}
	if m.Kind == "" {
		m.Kind = c.Resource.Kind
	}
	data, mode := c.Data, c.Payload
	if len(data) == 0 {
		data, mode = AppendReference(nil, m), PayloadReference
	}
	ts := c.Time
	if ts.IsZero() {
		ts = time.Now()
	}
	ev := objectEvent{c: c, m: m, ts: ts}
	var ta, tc uint8
	ev.author, ta = c.Author.capped()
	ev.changed, tc = c.Changed.capped()
	ev.trunc = ta | tc
	ev.subject, ev.msgID = e.subjectAndMsgID(c, &m)
	ev.id = ev.msgID[len(e.msgIDPrefix):]

	msg := e.build(&ev, data, mode, formAsIs)
	limit := e.opts.MaxPayload
	if limit <= 0 {
		return msg, nil
	}
	full := msg.Size()
	if full <= limit {
		return msg, nil
	}
	msg.Release() // not published: its body can serve the next event
	msg = e.build(&ev, AppendReference(nil, m), PayloadReference, formReference)
	msg.Oversize = true
	ref := msg.Size()
	if ref <= limit {
		return msg, nil
	}
	msg.Release()
	msg = e.build(&ev, nil, PayloadNone, formBare)
	msg.Oversize, msg.Unencodable = true, true
	size := msg.Size()
	if size > limit && ev.author.n+bits.OnesCount64(ev.changed.Changed|ev.changed.Unknown) > 0 {
		// Without the extensions writers control: only the object's
		// identity is left, which the apiserver bounds.
		ev.trunc |= ev.author.truncBits() | ev.changed.truncBits()
		ev.author, ev.changed = &Author{}, &ChangedSet{}
		msg = e.build(&ev, nil, PayloadNone, formBare)
		msg.Oversize, msg.Unencodable = true, true
		size = msg.Size()
	}
	if size > limit {
		return Message{}, fmt.Errorf("%s: event of %d bytes (%d with the reference payload, %d without data) exceeds the NATS max payload of %d bytes",
			describe(c), full, ref, size, limit)
	}
	return msg, nil
}

// form is how much of a change an object event carries.
type form int

const (
	formAsIs      form = iota // the data given
	formReference             // the reference instead: relaydoversize
	formBare                  // no data: relaydoversize and relaydunencodable
)

// objectEvent carries what both builders need.
type objectEvent struct {
	c       *Change
	m       Meta // c.Meta with APIVersion/Kind defaulted
	subject string
	msgID   string
	id      string // suffix of msgID
	ts      time.Time
	// author and changed are c.Author and c.Changed within the caps
	// (capped); trunc names the extensions they leave incomplete.
	author  *Author
	changed *ChangedSet
	trunc   uint8
}

func (e *Encoder) build(ev *objectEvent, data []byte, mode PayloadMode, f form) Message {
	var m Message
	if e.opts.Binary {
		m = e.buildBinary(ev, data, mode, f)
	} else {
		m = e.buildStructured(ev, data, mode, f)
	}
	m.Truncated = ev.trunc != 0
	return m
}

// subjectAndMsgID returns the subject and the MsgID of c, sharing one
// allocation.
func (e *Encoder) subjectAndMsgID(c *Change, m *Meta) (subject, msgID string) {
	var buf [640]byte // fits every subject up to MaxSubjectLen without escaping to the heap
	subj := appendObjectSubject(buf[:0], e.subjPrefix, c.Resource, m.Namespace, m.Name, c.Type)
	n := len(subj) + len(e.msgIDPrefix) + len(m.UID) + 1 + len(m.ResourceVersion) + len("/deleted") + len(c.IDSuffix)
	var b strings.Builder
	b.Grow(n)
	b.Write(subj)
	b.WriteString(e.msgIDPrefix)
	b.WriteString(m.UID)
	b.WriteByte('/')
	b.WriteString(m.ResourceVersion)
	if c.Type == Deleted {
		b.WriteString("/deleted")
	}
	b.WriteString(c.IDSuffix)
	all := b.String()
	return all[:len(subj)], all[len(subj):]
}

func (e *Encoder) validate(c *Change) error {
	if c == nil {
		return errors.New("encode: nil change")
	}
	var problem string
	switch {
	case !c.Type.Valid():
		problem = "invalid change type " + strconv.Quote(string(c.Type))
	case !c.Origin.Valid():
		problem = "invalid origin " + strconv.Quote(string(c.Origin))
	case len(c.Data) > 0 && !c.Payload.Valid():
		problem = "invalid payload mode " + strconv.Quote(string(c.Payload))
	case c.Resource.Version == "" || c.Resource.Resource == "":
		problem = "resource has no version or no resource name"
	case c.Meta.Name == "":
		problem = "object has no metadata.name"
	case c.Meta.UID == "":
		problem = "object has no metadata.uid"
	case c.Meta.ResourceVersion == "":
		problem = "object has no metadata.resourceVersion"
	case hasControl(c.Meta.UID):
		problem = "metadata.uid contains control characters"
	case hasControl(c.Meta.ResourceVersion):
		problem = "metadata.resourceVersion contains control characters"
	default:
		for _, p := range c.Dropped {
			if p == "" || strings.IndexByte(p, ',') >= 0 {
				return errors.New(describe(c) + ": dropped path " + strconv.Quote(p) + " is empty or contains a comma")
			}
		}
		return nil
	}
	return errors.New(describe(c) + ": " + problem)
}

// describe names the object of c for errors.
func describe(c *Change) string {
	r := c.Resource.Resource
	if c.Resource.Group != "" {
		r += "." + c.Resource.Group
	}
	name := c.Meta.Name
	if c.Meta.Namespace != "" {
		name = c.Meta.Namespace + "/" + name
	}
	return fmt.Sprintf("encode %s %q (uid %q, resourceVersion %q)", r, name, c.Meta.UID, c.Meta.ResourceVersion)
}

func hasControl(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] == 0x7f {
			return true
		}
	}
	return false
}

// appendCESubject appends the CloudEvents subject of an object:
// /api/v1[/namespaces/<ns>]/<resource>/<name> for the core group,
// /apis/<group>/<version>/... otherwise. With escape, the pieces are
// JSON-escaped (for the contents of a JSON string).
func appendCESubject(dst []byte, r Resource, ns, name string, escape bool) []byte {
	add := func(dst []byte, s string) []byte {
		if escape {
			return appendJSONStringContent(dst, s)
		}
		return append(dst, s...)
	}
	if r.Group == "" {
		dst = append(dst, "/api/"...)
	} else {
		dst = append(add(append(dst, "/apis/"...), r.Group), '/')
	}
	dst = add(dst, r.Version)
	if ns != "" {
		dst = add(append(dst, "/namespaces/"...), ns)
	}
	dst = add(append(dst, '/'), r.Resource)
	return add(append(dst, '/'), name)
}

func (e *Encoder) buildStructured(ev *objectEvent, data []byte, mode PayloadMode, f form) Message {
	c, m := ev.c, &ev.m
	oversize, bare := f != formAsIs, f == formBare
	r := &c.Resource
	// Fixed text is ~470 bytes; strings are counted twice (subject path,
	// extensions), escapes are rare and only make append grow once.
	n := 600 + len(data) + len(ev.id) + dropLen(c.Dropped) + 2*(len(m.Namespace)+len(m.Name)+len(r.Group)+len(r.Version)+len(r.Resource)) +
		len(m.APIVersion) + len(m.Kind) + len(m.UID) + len(m.ResourceVersion) + len(e.jsonSrcType) + len(e.jsonCluster) + ev.author.jsonLen() + ev.changed.jsonLen()
	buf := e.newBody(n)
	b := append(buf.b[:0], `{"specversion":"`+SpecVersion+`","id":`...)
	b = appendJSONString(b, ev.id)
	b = append(b, e.jsonSrcType...)
	b = append(b, c.Type...)
	b = append(b, `","subject":"`...)
	b = appendCESubject(b, *r, m.Namespace, m.Name, true)
	b = append(b, `","time":"`...)
	b = ev.ts.UTC().AppendFormat(b, TimeLayout)
	b = append(b, '"')
	if !bare {
		b = append(b, e.jsonDCT...)
	}
	b = append(b, e.jsonCluster...)
	b = appendJSONField(append(b, ','), "k8sapiversion", m.APIVersion)
	b = appendJSONField(append(b, ','), "k8skind", m.Kind)
	b = appendJSONField(append(b, ','), "k8sresource", r.Resource)
	if m.Namespace != "" {
		b = appendJSONField(append(b, ','), "k8snamespace", m.Namespace)
	}
	b = appendJSONField(append(b, ','), "k8sname", m.Name)
	b = appendJSONField(append(b, ','), "k8suid", m.UID)
	b = appendJSONField(append(b, ','), "k8sresourceversion", m.ResourceVersion)
	b = ev.author.appendJSON(b)
	b = append(b, e.jsonRelaydSr...)
	b = append(b, `,"relaydorigin":"`...)
	b = append(b, c.Origin...)
	b = append(b, `","relaydepoch":`...)
	b = strconv.AppendUint(b, c.Epoch, 10)
	b = append(b, `,"relaydpayload":"`...)
	b = append(b, mode...)
	b = appendStructuredFlags(append(b, '"'), ev, oversize, bare)
	if !bare {
		b = append(b, `,"data":`...)
		b = append(b, data...)
	}
	b = append(b, '}')

	vals := []string{ContentTypeCloudEvents, ev.msgID}
	buf.b = b
	return Message{
		Subject: ev.subject,
		MsgID:   ev.msgID,
		Header: map[string][]string{
			HeaderContentType: vals[0:1:1],
			HeaderMsgID:       vals[1:2:2],
		},
		Data: b,
		body: buf,
	}
}

// appendStructuredFlags appends the structured event's relayd extensions
// that only some events carry: oversize, unencodable, final state
// unknown, dropped, changed, scope and truncated.
func appendStructuredFlags(b []byte, ev *objectEvent, oversize, bare bool) []byte {
	c := ev.c
	if oversize {
		b = append(b, `,"relaydoversize":true`...)
	}
	if bare {
		b = append(b, `,"relaydunencodable":true`...)
	}
	if c.FinalStateUnknown {
		b = append(b, `,"relaydfinalunknown":true`...)
	}
	if len(c.Dropped) > 0 && !oversize {
		b = append(b, `,"relayddropped":"`...)
		for i, p := range c.Dropped {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONStringContent(b, p)
		}
		b = append(b, '"')
	}
	b = ev.changed.appendJSON(b)
	b = c.Scope.appendJSON(b)
	if ev.trunc != 0 {
		b = append(b, `,"relaydtruncated":"`...)
		b = append(appendTruncated(b, ev.trunc), '"')
	}
	return b
}

// dropLen is the length of the relayddropped member of c.Dropped, for
// sizing (escapes aside).
func dropLen(dropped []string) int {
	if len(dropped) == 0 {
		return 0
	}
	n := len(`,"relayddropped":""`)
	for _, p := range dropped {
		n += len(p) + 1
	}
	return n
}

// headerBuilder fills a header map whose values share one backing array.
type headerBuilder struct {
	h    map[string][]string
	vals []string
}

func newHeaderBuilder(n int) headerBuilder {
	return headerBuilder{h: make(map[string][]string, n), vals: make([]string, 0, n)}
}

func (hb *headerBuilder) add(k, v string) {
	hb.vals = append(hb.vals, v)
	i := len(hb.vals)
	hb.h[k] = hb.vals[i-1 : i : i]
}

// ce adds a ce-* header (key is the full header name) with a
// percent-encoded value.
func (hb *headerBuilder) ce(key, v string) { hb.add(key, encodeHeaderValue(v)) }

func (e *Encoder) buildBinary(ev *objectEvent, data []byte, mode PayloadMode, f form) Message {
	c, m := ev.c, &ev.m
	oversize, bare := f != formAsIs, f == formBare
	hb := newHeaderBuilder(24)
	hb.ce(HeaderPrefix+"specversion", SpecVersion)
	hb.ce(HeaderPrefix+"id", ev.id)
	hb.ce(HeaderPrefix+"source", e.ceSource)
	hb.ce(HeaderPrefix+"type", e.objTypes[typeIndex(c.Type)])
	hb.ce(HeaderPrefix+"subject", string(appendCESubject(make([]byte, 0, 64), c.Resource, m.Namespace, m.Name, false)))
	hb.ce(HeaderPrefix+"time", string(ev.ts.UTC().AppendFormat(make([]byte, 0, 32), TimeLayout)))
	hb.ce(HeaderPrefix+"k8scluster", e.opts.Cluster)
	hb.ce(HeaderPrefix+"k8sapiversion", m.APIVersion)
	hb.ce(HeaderPrefix+"k8skind", m.Kind)
	hb.ce(HeaderPrefix+"k8sresource", c.Resource.Resource)
	if m.Namespace != "" {
		hb.ce(HeaderPrefix+"k8snamespace", m.Namespace)
	}
	hb.ce(HeaderPrefix+"k8sname", m.Name)
	hb.ce(HeaderPrefix+"k8suid", m.UID)
	hb.ce(HeaderPrefix+"k8sresourceversion", m.ResourceVersion)
	if a := ev.author; a.n > 0 {
		hb.ce(HeaderPrefix+"k8smanager", string(a.appendPart(nil, authorManager)))
		hb.ce(HeaderPrefix+"k8soperation", string(a.appendPart(nil, authorOperation)))
		if a.has(authorSubresource) {
			hb.ce(HeaderPrefix+"k8ssubresource", string(a.appendPart(nil, authorSubresource)))
		}
	}
	hb.ce(HeaderPrefix+"relaydsource", e.opts.Source)
	hb.ce(HeaderPrefix+"relaydorigin", string(c.Origin))
	hb.ce(HeaderPrefix+"relaydepoch", strconv.FormatUint(c.Epoch, 10))
	hb.ce(HeaderPrefix+"relaydpayload", string(mode))
	if oversize {
		hb.ce(HeaderPrefix+"relaydoversize", "true")
	}
	if bare {
		hb.ce(HeaderPrefix+"relaydunencodable", "true")
	}
	if c.FinalStateUnknown {
		hb.ce(HeaderPrefix+"relaydfinalunknown", "true")
	}
	if len(c.Dropped) > 0 && !oversize {
		hb.ce(HeaderPrefix+"relayddropped", strings.Join(c.Dropped, ","))
	}
	ev.changed.headers(&hb)
	c.Scope.header(&hb)
	if ev.trunc != 0 {
		hb.ce(HeaderPrefix+"relaydtruncated", string(appendTruncated(nil, ev.trunc)))
	}
	if !bare {
		hb.add(HeaderContentType, ContentTypeJSON)
	}
	hb.add(HeaderMsgID, ev.msgID)
	return Message{Subject: ev.subject, MsgID: ev.msgID, Header: hb.h, Data: data}
}

// headerEscape marks the bytes percent-encoded in ce-* header values: the
// CloudEvents HTTP binding rule (space, '"', '%', outside 0x21-0x7e).
var headerEscape = func() (t [256]bool) {
	for c := 0; c < 256; c++ {
		t[c] = c <= ' ' || c == '"' || c == '%' || c >= 0x7f
	}
	return t
}()

// encodeHeaderValue percent-encodes v for a ce-* header; it returns v
// itself when nothing needs encoding.
func encodeHeaderValue(v string) string {
	for i := 0; i < len(v); i++ {
		if headerEscape[v[i]] {
			b := make([]byte, 0, len(v)+16)
			b = append(b, v[:i]...)
			for ; i < len(v); i++ {
				if c := v[i]; headerEscape[c] {
					b = append(b, '%', hexUpper[c>>4], hexUpper[c&0xf])
				} else {
					b = append(b, c)
				}
			}
			return string(b)
		}
	}
	return v
}

// SyncCounts are the object counts of a completed (re)list.
type SyncCounts struct {
	Added     int64 `json:"added"`     // new objects published
	Modified  int64 `json:"modified"`  // changed objects published
	Deleted   int64 `json:"deleted"`   // deletes inferred (final state unknown)
	Unchanged int64 `json:"unchanged"` // objects already published, suppressed
	Total     int64 `json:"total"`     // objects in the list
}

// SyncEvent describes a sync.started or sync.completed control event, which
// bracket the initial snapshot and every relist.
type SyncEvent struct {
	// Completed selects sync.completed; false is sync.started.
	Completed bool
	// Namespace is the watch scope; "" for all namespaces or a
	// cluster-scoped kind.
	Namespace string
	Epoch     uint64
	// Reason is why the sync happened.
	Reason RelistReason
	// RequestID is the id of the resync request (reason requested; data
	// member "requestId", left out when empty). Full: the request asked
	// for every object to be published again (data member "full", left
	// out when false).
	RequestID           string
	Full                bool
	FromResourceVersion string
	ToResourceVersion   string
	// Counts are sent only on sync.completed.
	Counts SyncCounts
	// Resource is the watched resource. Its group, version, resource,
	// kind and scope go into the data ("group", "version", "resource",
	// "kind", "namespaced"), with the selectors below: what a consumer's
	// reconcile LIST needs (docs/CONSUMING.md, "The sync markers"). All
	// of them are left out when Resource.Resource is empty.
	Resource Resource
	// LabelSelector and FieldSelector are the watch's selectors; each is
	// left out of the data when empty.
	LabelSelector, FieldSelector string
	// Time of the event; time.Now() if zero.
	Time time.Time
}

// Control builds the sync.started / sync.completed control event: subject
// <prefix>.<cluster>._relayd.<source>.sync.started|completed, type
// <prefix>.source.sync.started|completed, id
// sync/<namespace|_>/<epoch>/started|completed (Nats-Msg-Id
// <prefix>.<cluster>/<source>/<id>, as for objects), CloudEvents subject
// /relayd/<source>, extensions relaydsource, relaydepoch, k8scluster and
// k8snamespace (omitted when empty), and data (syncData)
// {"namespace","epoch","reason","fromResourceVersion","toResourceVersion",
// "group","version","resource","kind","namespaced"} plus "labelSelector"
// and "fieldSelector" when set and "counts" on sync.completed. MaxPayload
// does not apply (a control event is a few hundred bytes).
func (e *Encoder) Control(s SyncEvent) Message {
	phase := "started"
	if s.Completed {
		phase = "completed"
	}
	ns := s.Namespace
	if ns == "" {
		ns = EmptyToken
	}
	id := "sync/" + ns + "/" + strconv.FormatUint(s.Epoch, 10) + "/" + phase
	ts := s.Time
	if ts.IsZero() {
		ts = time.Now()
	}

	return e.controlMessage(e.ctlSubjects[b2i(s.Completed)], e.ctlTypes[b2i(s.Completed)], id, ts, s.Namespace, s.Epoch, syncData(&s))
}

// controlMessage is a control event (a sync marker, a heartbeat) with the
// given subject, type, CloudEvents id, time, namespace (omitted when
// empty), epoch and JSON data, in the Encoder's content mode.
func (e *Encoder) controlMessage(subject, typ, id string, ts time.Time, namespace string, epoch uint64, data []byte) Message {
	msgID := e.msgIDPrefix + id
	stamp := ts.UTC().Format(TimeLayout)
	if e.opts.Binary {
		hb := newHeaderBuilder(12)
		hb.ce(HeaderPrefix+"specversion", SpecVersion)
		hb.ce(HeaderPrefix+"id", id)
		hb.ce(HeaderPrefix+"source", e.ceSource)
		hb.ce(HeaderPrefix+"type", typ)
		hb.ce(HeaderPrefix+"subject", e.ctlSubject)
		hb.ce(HeaderPrefix+"time", stamp)
		hb.ce(HeaderPrefix+"k8scluster", e.opts.Cluster)
		if namespace != "" {
			hb.ce(HeaderPrefix+"k8snamespace", namespace)
		}
		hb.ce(HeaderPrefix+"relaydsource", e.opts.Source)
		hb.ce(HeaderPrefix+"relaydepoch", strconv.FormatUint(epoch, 10))
		hb.add(HeaderContentType, ContentTypeJSON)
		hb.add(HeaderMsgID, msgID)
		return Message{Subject: subject, MsgID: msgID, Header: hb.h, Data: data}
	}
	b := marshalJSON(controlEnvelope{
		SpecVersion: SpecVersion, ID: id, Source: e.ceSource, Type: typ, Subject: e.ctlSubject,
		Time: stamp, DataContentType: ContentTypeJSON, Cluster: e.opts.Cluster,
		Namespace: namespace, RelaydSource: e.opts.Source, Epoch: epoch, Data: data,
	})
	vals := []string{ContentTypeCloudEvents, msgID}
	return Message{
		Subject: subject,
		MsgID:   msgID,
		Header:  map[string][]string{HeaderContentType: vals[0:1:1], HeaderMsgID: vals[1:2:2]},
		Data:    b,
	}
}

// controlEnvelope is the structured form of a sync marker; the members in
// the order of the wire format (docs/CONSUMING.md, "The sync markers").
type controlEnvelope struct {
	SpecVersion     string          `json:"specversion"`
	ID              string          `json:"id"`
	Source          string          `json:"source"`
	Type            string          `json:"type"`
	Subject         string          `json:"subject"`
	Time            string          `json:"time"`
	DataContentType string          `json:"datacontenttype"`
	Cluster         string          `json:"k8scluster"`
	Namespace       string          `json:"k8snamespace,omitempty"`
	RelaydSource    string          `json:"relaydsource"`
	Epoch           uint64          `json:"relaydepoch"`
	Data            json.RawMessage `json:"data"`
}

// syncDataJSON is the data of a sync marker (see Control).
type syncDataJSON struct {
	Namespace           string `json:"namespace"`
	Epoch               uint64 `json:"epoch"`
	Reason              string `json:"reason"`
	RequestID           string `json:"requestId,omitempty"`
	Full                bool   `json:"full,omitempty"`
	FromResourceVersion string `json:"fromResourceVersion"`
	ToResourceVersion   string `json:"toResourceVersion"`
	*syncResourceJSON
	Counts *SyncCounts `json:"counts,omitempty"`
}

// syncResourceJSON is the watched resource and its selectors, all left
// out when the SyncEvent has no resource.
type syncResourceJSON struct {
	Group         string `json:"group"`
	Version       string `json:"version"`
	Resource      string `json:"resource"`
	Kind          string `json:"kind"`
	Namespaced    bool   `json:"namespaced"`
	LabelSelector string `json:"labelSelector,omitempty"`
	FieldSelector string `json:"fieldSelector,omitempty"`
}

// syncData is the JSON data of a sync marker (see Control).
func syncData(s *SyncEvent) []byte {
	d := syncDataJSON{Namespace: s.Namespace, Epoch: s.Epoch, Reason: string(s.Reason), RequestID: s.RequestID, Full: s.Full,
		FromResourceVersion: s.FromResourceVersion, ToResourceVersion: s.ToResourceVersion}
	if r := s.Resource; r.Resource != "" {
		d.syncResourceJSON = &syncResourceJSON{Group: r.Group, Version: r.Version, Resource: r.Resource, Kind: r.Kind,
			Namespaced: r.Namespaced, LabelSelector: s.LabelSelector, FieldSelector: s.FieldSelector}
	}
	if s.Completed {
		d.Counts = &s.Counts
	}
	return marshalJSON(d)
}

// marshalJSON is encoding/json's encoding of v without HTML escaping, the
// escaping appendJSONString does (and every event has); v's types cannot
// fail to encode.
func marshalJSON(v any) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		panic("event: " + err.Error())
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// ID returns the CloudEvents id of a message this Encoder built (the
// Nats-Msg-Id without its "<prefix>.<cluster>/<source>/" part); "" for a
// message it did not build.
func (e *Encoder) ID(m *Message) string {
	id, ok := strings.CutPrefix(m.MsgID, e.msgIDPrefix)
	if !ok {
		return ""
	}
	return id
}

// LegacyMsgID is the Nats-Msg-Id that relayd versions before the cluster
// was part of it gave the event with CloudEvents id: "<source>/<id>".
func (e *Encoder) LegacyMsgID(id string) string { return e.opts.Source + "/" + id }

// UseLegacyMsgID gives m, built by this Encoder, the Nats-Msg-Id an older
// relayd gave the same event (LegacyMsgID), so that JetStream drops its
// replay after an upgrade as a duplicate of what the older version stored
// (docs/DEPLOY.md, "Upgrade and rollback: formats").
func (e *Encoder) UseLegacyMsgID(m *Message) {
	m.MsgID = e.LegacyMsgID(e.ID(m))
	h := make(map[string][]string, len(m.Header))
	for k, v := range m.Header {
		h[k] = v
	}
	h[HeaderMsgID] = []string{m.MsgID}
	m.Header = h
}
