package event

import (
	"errors"
	"math"
	"strings"
)

// Object is one object's raw JSON plus what a single scan found in it.
//
// The zero Object (or one whose Raw was not produced by [ParseObject],
// [ParseWatchEvent] or their Shaped variants) has no byte spans;
// [Object.AppendPayload] and [Object.AppendShaped] then build the reference
// payload from Meta in every mode.
type Object struct {
	// Raw is the object's JSON. It aliases the input of ParseObject (or the
	// frame given to ParseWatchEvent) and must not be modified while the
	// Object is in use.
	Raw []byte
	// Meta holds the decoded identifying fields. AppendPayload reads
	// APIVersion and Kind from here (see DefaultTypeMeta).
	Meta Meta

	start, end         int  // the object itself in Raw, without surrounding whitespace
	metaStart, metaEnd int  // the metadata value ({...}) in Raw
	hasAPIVersion      bool // the object has an apiVersion member (possibly null)
	hasKind            bool // the object has a kind member (possibly null)

	// fix holds the members every parse records (apiVersion, kind,
	// metadata.resourceVersion, metadata.generation, metadata.managedFields
	// and the last-applied annotation), one slot each; key == 0 when
	// absent. A second member of the same name (a duplicate key) goes to
	// recs.
	fix [numFixed]member
	// mf holds the first len(mf) metadata.managedFields entries, as the
	// parse found them (Object.AuthorSince reads them without walking
	// fieldsV1 again); mfN counts every element of the list.
	mf   [maxMFEntries]mfEntry
	mfN  int32
	mfOK bool // the parse recorded the list (skipManagedFields)
	// recs holds the other members selected by the Shaping's paths, in the
	// order of their keys in Raw.
	recs []member
	// sh is the Shaping the object was parsed with (nil for none); its
	// drop paths are what member.drop indexes.
	sh *Shaping
	// top holds the object's first topN members as the parse found them
	// (Object.TopMembers); topNext is the key of the member after them (0:
	// none). topN == 0: not recorded.
	top     [MaxTopMembers]topSpan
	topN    int32
	topNext int32
}

// MaxTopMembers is how many of an object's own members the parse records
// for Object.TopMembers.
const MaxTopMembers = 8

// topSpan is one member of the object: its key's opening quote and the
// offset just past its value.
type topSpan struct{ key, end int32 }

// member is the position of one selected object member in Raw.
type member struct {
	key  int   // offset of the key's opening quote (> 0)
	val  int   // offset just past the value
	prev int   // offset just past the previous member's value in the same object; -1 if first
	next int   // offset of the next member's key in the same object; -1 if last
	drop int16 // index of the Shaping's drop path ending here; -1 if none
	chg  int16 // index of the Shaping's changedPaths path ending here; -1 if none
	mask uint8 // cat* bits: why the member was selected
}

// Why a member is recorded; a payload or a fingerprint leaves out the
// members whose mask intersects its own.
const (
	catDrop          uint8 = 1 << iota // a ShapingOptions.Drop path
	catIgnore                          // a ShapingOptions.IgnoreChanges path
	catManagedFields                   // metadata.managedFields
	catLastApplied                     // the last-applied-configuration annotation
	catVolatile                        // apiVersion, kind, metadata.resourceVersion, metadata.generation: not fingerprinted
	catChanged                         // a ShapingOptions.ChangedPaths path: fingerprinted on its own
)

// The slots of Object.fix.
const (
	fxAPIVersion = iota
	fxKind
	fxResourceVersion
	fxGeneration
	fxManagedFields
	fxLastApplied
	numFixed
)

// The identifying fields, in Meta field order.
const (
	fAPIVersion = iota
	fKind
	fNamespace
	fName
	fUID
	fResourceVersion
	numFields
)

var fieldNames = [numFields]string{
	"apiVersion", "kind", "metadata.namespace", "metadata.name", "metadata.uid", "metadata.resourceVersion",
}

// Keys recognised by the scan. The field keys share the f* numbering.
const (
	keyManagedFields = numFields + iota
	keyMetadata
	keyOther
)

// strSpan is the raw contents (between the quotes) of a string value.
type strSpan struct {
	start, end int
	flags      uint8
}

// ParseObject scans raw, one JSON object as found in a watch frame or a list
// item, exactly once. It validates the whole input (as strictly as
// json.Valid), extracts apiVersion, kind and
// metadata.{namespace,name,uid,resourceVersion} into Object.Meta (decoding
// JSON string escapes exactly like encoding/json) and remembers the byte span
// of metadata.managedFields so that AppendPayload can drop it (and those of
// the last-applied annotation, metadata.resourceVersion and
// metadata.generation, for AppendShaped and Fingerprint). It is
// ParseObjectShaped(raw, nil).
//
// Missing fields and JSON null leave the Meta field empty: list items of
// built-in kinds carry no apiVersion and kind, and a bookmark object carries
// only a resourceVersion. Only metadata itself is required. Duplicate keys
// among the fields above are rejected, so that no two readers can disagree on
// an object's identity.
//
// Errors name the problem: "object is empty", "object is not a JSON object",
// "missing metadata", "metadata is not a JSON object", "metadata.uid is not a
// string", "duplicate key metadata.uid", or a [*SyntaxError] ("truncated
// JSON at offset N", "invalid JSON at offset N: ...").
//
// Raw is not copied: the returned Object aliases raw. Leading and trailing
// whitespace is allowed and is not part of any payload.
func ParseObject(raw []byte) (Object, error) {
	return ParseObjectShaped(raw, nil)
}

// ParseObjectShaped is ParseObject that also records, in the same single
// pass, the members selected by the Drop and IgnoreChanges paths of s, for
// AppendShaped and Fingerprint. A nil s selects only the members every parse
// records (see ParseObject).
func ParseObjectShaped(raw []byte, s *Shaping) (Object, error) {
	i := skipWS(raw, 0)
	if i >= len(raw) {
		return Object{}, errors.New("object is empty")
	}
	if raw[i] != '{' {
		return Object{}, errors.New("object is not a JSON object")
	}
	o, end, err := parseObject(raw, i, 1, s)
	if err != nil {
		return Object{}, err
	}
	if j := skipWS(raw, end); j < len(raw) {
		return Object{}, errInvalid(raw, j, "after top-level value")
	}
	o.Raw = raw
	return o, nil
}

// Scan levels: the object itself, its metadata, or an object below either
// that a path leads into.
const (
	levelTop = iota
	levelMeta
	levelNested
)

// walker is the state of one parse.
type walker struct {
	data  []byte
	o     *Object
	spans [numFields]strSpan
	seen  uint16 // bit per key (f*, keyManagedFields, keyMetadata)
	top   bool   // record the object's members (offsets fit in int32)
}

// parseObject parses the object starting at data[i] == '{', at nesting depth
// depth, and returns it with spans relative to data (Raw unset) and the offset
// just past it.
func parseObject(data []byte, i, depth int, s *Shaping) (o Object, end int, err error) {
	root := defaultRoot
	if s != nil {
		root = s.root
	}
	o.sh = s
	w := walker{data: data, o: &o, top: len(data) <= math.MaxInt32}
	o.start = i
	if end, err = w.object(i, depth, root, levelTop); err != nil {
		return o, 0, err
	}
	if w.seen&(1<<keyMetadata) == 0 {
		return o, 0, errors.New("missing metadata")
	}
	o.end = end
	o.hasAPIVersion = w.seen&(1<<fAPIVersion) != 0
	o.hasKind = w.seen&(1<<fKind) != 0
	o.Meta = buildMeta(data, &w.spans)
	return o, end, nil
}

// object scans the object starting at data[i] == '{', whose members are at
// nesting depth depth, and returns the offset just past it. Members named by
// a child of n are recorded (when the child ends a path) and walked into
// (when paths go on below it); at levelTop and levelMeta the identifying
// fields are read as well.
func (w *walker) object(i, depth int, n *node, level int) (int, error) {
	data := w.data
	if depth > maxDepth {
		return 0, errDepth(i)
	}
	if level == levelMeta {
		w.o.metaStart = i
	}
	i = skipWS(data, i+1)
	if i >= len(data) {
		return 0, errTruncated(data)
	}
	if data[i] != '}' {
		var err error
		if i, err = w.members(i, depth, n, level); err != nil {
			return 0, err
		}
	}
	if level == levelMeta {
		w.o.metaEnd = i + 1
	}
	return i + 1, nil
}

// members scans the members of a non-empty object for object (whose
// arguments it takes), from the first key at data[i], and returns the
// offset of the object's closing '}'. It runs for every member of every
// object walked, so the value's dispatch and the separator stay written out
// here: one more call per member shows in the benchmarks.
func (w *walker) members(i, depth int, n *node, level int) (int, error) {
	data := w.data
	prevEnd := -1 // end of the previous member's value
	open := noMember
	for {
		keyStart := i
		var key int
		var c *node
		var err error
		if i, key, c, err = w.key(i, n, level); err != nil {
			return 0, err
		}
		if open != noMember {
			w.member(open).next = keyStart
			open = noMember
		}
		if c != nil && c.mask != 0 {
			open = w.open(c, keyStart, prevEnd)
		}
		switch {
		case key < numFields:
			i, err = parseStringField(data, i, &w.spans[key], fieldNames[key])
		case key == keyMetadata:
			if data[i] != '{' {
				return 0, errors.New("metadata is not a JSON object")
			}
			i, err = w.object(i, depth+1, c, levelMeta)
		case key == keyManagedFields && data[i] == '[' && (c == nil || c.all == nil):
			i, err = skipManagedFields(data, i, depth+1, w.o)
		case c != nil && c.kids != nil && data[i] == '{':
			i, err = w.object(i, depth+1, c, levelNested)
		case c != nil && c.all != nil && data[i] == '[':
			i, err = w.array(i, depth+1, c.all)
		default:
			i, err = skipValue(data, i, depth)
		}
		if err != nil {
			return 0, err
		}
		if open != noMember {
			w.member(open).val = i
		}
		if level == levelTop && w.top {
			w.topMember(keyStart, i)
		}
		prevEnd = i
		i = skipWS(data, i)
		if i >= len(data) {
			return 0, errTruncated(data)
		}
		if data[i] == '}' {
			return i, nil
		}
		if data[i] != ',' {
			return 0, errInvalid(data, i, "after object key:value pair")
		}
		i = skipWS(data, i+1)
		if i >= len(data) {
			return 0, errTruncated(data)
		}
	}
}

// key scans the member key at data[i] and the colon after it, and returns
// the offset of the member's value, the key's classification (keyOther
// below metadata) and the child of n it names (nil if none). A second
// metadata, metadata.managedFields or identifying field is an error.
func (w *walker) key(i int, n *node, level int) (next, key int, c *node, err error) {
	data := w.data
	if data[i] != '"' {
		return 0, 0, nil, errInvalid(data, i, "looking for beginning of object key string")
	}
	kend, kflags, err := scanString(data, i)
	if err != nil {
		return 0, 0, nil, err
	}
	k := data[i+1 : kend-1]
	var kbuf [64]byte
	if !stringIsPlain(k, kflags) {
		k = appendUnquoted(kbuf[:0], k)
	}
	// skipColon, written out for the common case: this saves a call per
	// member; skipColon itself reports what is wrong.
	next = skipWS(data, kend)
	if next >= len(data) || data[next] != ':' {
		_, err = skipColon(data, kend)
		return 0, 0, nil, err
	}
	if next = skipWS(data, next+1); next >= len(data) {
		return 0, 0, nil, errTruncated(data)
	}
	key = keyOther
	if level != levelNested {
		key = matchKey(k, level == levelTop)
		if key != keyOther {
			if w.seen&(1<<key) != 0 {
				return 0, 0, nil, errDuplicateKey(key)
			}
			w.seen |= 1 << key
		}
	}
	return next, key, n.child(k), nil
}

// errDuplicateKey reports a second member classified as key (one of the
// identifying fields, keyMetadata or keyManagedFields).
func errDuplicateKey(key int) error {
	switch key {
	case keyMetadata:
		return errors.New("duplicate key metadata")
	case keyManagedFields:
		return errors.New("duplicate key metadata.managedFields")
	}
	return errors.New("duplicate key " + fieldNames[key])
}

// afterMember reads what follows a member's value, which ends at data[i]:
// whitespace, then ',' and the next key, or the object's '}'. It returns the
// offset of the next key, or that of the '}' and last == true. (members,
// on the hot path, writes the same steps out.)
func afterMember(data []byte, i int) (next int, last bool, err error) {
	i = skipWS(data, i)
	if i >= len(data) {
		return 0, false, errTruncated(data)
	}
	if data[i] == '}' {
		return i, true, nil
	}
	if data[i] != ',' {
		return 0, false, errInvalid(data, i, "after object key:value pair")
	}
	i = skipWS(data, i+1)
	if i >= len(data) {
		return 0, false, errTruncated(data)
	}
	return i, false, nil
}

// array scans the array starting at data[i] == '[', whose elements are at
// nesting depth depth, walking every element with n (the node of a [*]
// step).
func (w *walker) array(i, depth int, n *node) (int, error) {
	data := w.data
	if depth > maxDepth {
		return 0, errDepth(i)
	}
	i = skipWS(data, i+1)
	if i >= len(data) {
		return 0, errTruncated(data)
	}
	if data[i] == ']' {
		return i + 1, nil
	}
	for {
		var err error
		switch {
		case i >= len(data):
			return 0, errTruncated(data)
		case data[i] == '{' && n.kids != nil:
			i, err = w.object(i, depth+1, n, levelNested)
		case data[i] == '[' && n.all != nil:
			i, err = w.array(i, depth+1, n.all)
		default:
			i, err = skipValue(data, i, depth)
		}
		if err != nil {
			return 0, err
		}
		i = skipWS(data, i)
		if i >= len(data) {
			return 0, errTruncated(data)
		}
		switch data[i] {
		case ',':
			i = skipWS(data, i+1)
		case ']':
			return i + 1, nil
		default:
			return 0, errInvalid(data, i, "after array element")
		}
	}
}

// noMember is the "none" value of the handles returned by walker.open.
const noMember = -1

// open records the member of node c whose key starts at keyStart and returns
// a handle to it: >= 0 is an index in recs, < -1 a slot of fix.
func (w *walker) open(c *node, keyStart, prevEnd int) int {
	m := member{key: keyStart, prev: prevEnd, next: -1, drop: c.drop, chg: c.chg, mask: c.mask}
	if c.fixed >= 0 && w.o.fix[c.fixed].key == 0 {
		w.o.fix[c.fixed] = m
		return -2 - int(c.fixed)
	}
	if w.o.recs == nil {
		w.o.recs = make([]member, 0, 8) // one allocation for most objects
	}
	w.o.recs = append(w.o.recs, m)
	return len(w.o.recs) - 1
}

func (w *walker) member(h int) *member { return w.o.at(h) }

// topMember records the object's member whose key starts at key and whose
// value ends at end.
func (w *walker) topMember(key, end int) {
	o := w.o
	if o.topN < MaxTopMembers {
		o.top[o.topN] = topSpan{int32(key), int32(end)}
		o.topN++
	} else if o.topNext == 0 {
		o.topNext = int32(key)
	}
}

// TopMembers returns the object's own members as the parse found them,
// for readers of Raw that would otherwise skip members to find one
// (pkg/filter): the first n of them (at most MaxTopMembers), each from
// its key's opening quote to just past its value (TopMember), and the
// offset in Raw of the next member's key, or 0 when there is none. An
// Object not produced by a parse has n == 0.
func (o *Object) TopMembers() (n, next int) {
	if !o.parsed() {
		return 0, 0
	}
	return int(o.topN), int(o.topNext)
}

// TopMember returns member j (< n of TopMembers): the offsets in Raw of
// its key's opening quote and of the byte just past its value.
func (o *Object) TopMember(j int) (key, end int) {
	t := o.top[j]
	return int(t.key), int(t.end)
}

// parseStringField reads the value at data[i] of one of the identifying
// fields: a string (recorded in sp) or null (left empty).
func parseStringField(data []byte, i int, sp *strSpan, name string) (int, error) {
	switch data[i] {
	case '"':
		end, flags, err := scanString(data, i)
		if err != nil {
			return 0, err
		}
		*sp = strSpan{start: i + 1, end: end - 1, flags: flags}
		return end, nil
	case 'n':
		return scanLiteral(data, i, "null")
	}
	return 0, errors.New(name + " is not a string")
}

// matchKey classifies a decoded object key at the top level or inside
// metadata.
func matchKey(k []byte, top bool) int {
	if top {
		switch string(k) {
		case "apiVersion":
			return fAPIVersion
		case "kind":
			return fKind
		case "metadata":
			return keyMetadata
		}
		return keyOther
	}
	switch string(k) {
	case "namespace":
		return fNamespace
	case "name":
		return fName
	case "uid":
		return fUID
	case "resourceVersion":
		return fResourceVersion
	case "managedFields":
		return keyManagedFields
	}
	return keyOther
}

// buildMeta decodes the recorded string spans into one allocation.
func buildMeta(data []byte, spans *[numFields]strSpan) Meta {
	total := 0
	for k := range spans {
		total += spans[k].end - spans[k].start
	}
	if total == 0 {
		return Meta{}
	}
	var b strings.Builder
	b.Grow(total)
	var offs [numFields + 1]int
	for k := range spans {
		offs[k] = b.Len()
		sp := &spans[k]
		s := data[sp.start:sp.end]
		if stringIsPlain(s, sp.flags) {
			b.Write(s)
		} else {
			var buf [128]byte
			b.Write(appendUnquoted(buf[:0], s))
		}
	}
	offs[numFields] = b.Len()
	all := b.String()
	return Meta{
		APIVersion:      all[offs[fAPIVersion]:offs[fAPIVersion+1]],
		Kind:            all[offs[fKind]:offs[fKind+1]],
		Namespace:       all[offs[fNamespace]:offs[fNamespace+1]],
		Name:            all[offs[fName]:offs[fName+1]],
		UID:             all[offs[fUID]:offs[fUID+1]],
		ResourceVersion: all[offs[fResourceVersion]:offs[fResourceVersion+1]],
	}
}

// shift moves every recorded offset by d (ParseWatchEvent: from frame
// offsets to offsets in the object).
func (o *Object) shift(d int) {
	o.start += d
	o.end += d
	o.metaStart += d
	o.metaEnd += d
	for k := range o.fix {
		o.fix[k].shift(d)
	}
	for k := range o.recs {
		o.recs[k].shift(d)
	}
	for k := range min(int(o.mfN), maxMFEntries) {
		o.mf[k].shift(d)
	}
	for k := range o.topN {
		o.top[k].key += int32(d)
		o.top[k].end += int32(d)
	}
	if o.topNext != 0 {
		o.topNext += int32(d)
	}
}

func (m *member) shift(d int) {
	if m.key == 0 {
		return
	}
	m.key += d
	m.val += d
	if m.prev >= 0 {
		m.prev += d
	}
	if m.next >= 0 {
		m.next += d
	}
}

// DefaultTypeMeta fills Meta.APIVersion and Meta.Kind when they are empty,
// typically with Resource.APIVersion() and Resource.Kind for list items,
// which the apiserver sends without apiVersion and kind. A full payload of an
// object that lacks these members then gets them inserted at its start, so
// consumers always see apiVersion and kind.
func (o *Object) DefaultTypeMeta(apiVersion, kind string) {
	if o.Meta.APIVersion == "" {
		o.Meta.APIVersion = apiVersion
	}
	if o.Meta.Kind == "" {
		o.Meta.Kind = kind
	}
}

// parsed reports whether o carries spans from ParseObject/ParseWatchEvent.
func (o *Object) parsed() bool {
	return o.end > o.start && o.end <= len(o.Raw) && o.metaEnd > o.metaStart
}

// AppendPayload appends the data for mode to dst and returns the extended
// slice:
//
//   - PayloadFull: the object JSON without metadata.managedFields (unless
//     keepManagedFields), otherwise byte-identical. If the object has no
//     apiVersion or kind member but Meta has one (see DefaultTypeMeta), the
//     member is inserted right after the opening brace.
//   - PayloadMetadata: {"apiVersion":..,"kind":..,"metadata":{..}} with the
//     object's metadata, managedFields dropped the same way.
//   - PayloadReference: see AppendReference.
//
// Any other mode is treated as PayloadFull. An Object without byte spans
// (not from ParseObject/ParseWatchEvent) yields the reference payload. The
// result is always valid JSON.
//
// AppendPayload removes nothing but managedFields, whatever Shaping the
// object was parsed with: [Object.AppendShaped] applies a Shaping's cuts
// and removes the last-applied annotation.
func (o *Object) AppendPayload(dst []byte, mode PayloadMode, keepManagedFields bool) []byte {
	var mask uint8
	if !keepManagedFields {
		mask = catManagedFields
	}
	var c cutter
	return o.appendPayload(dst, mode, mask, &c)
}

// appendPayload is AppendPayload leaving out the members whose mask
// intersects mask, cut by c (which then knows which drop paths removed
// something).
func (o *Object) appendPayload(dst []byte, mode PayloadMode, mask uint8, c *cutter) []byte {
	if mode == PayloadReference || !o.parsed() {
		return AppendReference(dst, o.Meta)
	}
	if mode == PayloadMetadata {
		dst = appendJSONField(append(dst, '{'), "apiVersion", o.Meta.APIVersion)
		dst = appendJSONField(append(dst, ','), "kind", o.Meta.Kind)
		dst = append(dst, `,"metadata":`...)
		c.init(o, o.metaStart, o.metaEnd, mask)
		dst = c.appendTo(o, dst)
		return append(dst, '}')
	}
	start := o.start
	injectAPIVersion := !o.hasAPIVersion && o.Meta.APIVersion != ""
	injectKind := !o.hasKind && o.Meta.Kind != ""
	if injectAPIVersion || injectKind {
		// The object keeps at least its metadata member (no path can
		// remove it), so a comma follows.
		dst = append(dst, '{')
		if injectAPIVersion {
			dst = append(appendJSONField(dst, "apiVersion", o.Meta.APIVersion), ',')
		}
		if injectKind {
			dst = append(appendJSONField(dst, "kind", o.Meta.Kind), ',')
		}
		start++
	}
	c.init(o, start, o.end, mask)
	return c.appendTo(o, dst)
}

// AppendReference appends the reference payload built from m alone:
// {"apiVersion":..,"kind":..,"namespace":..,"name":..,"uid":..,"resourceVersion":..}.
// namespace is omitted when empty (cluster-scoped objects); the other members
// are always present.
func AppendReference(dst []byte, m Meta) []byte {
	dst = appendJSONField(append(dst, '{'), "apiVersion", m.APIVersion)
	dst = appendJSONField(append(dst, ','), "kind", m.Kind)
	if m.Namespace != "" {
		dst = appendJSONField(append(dst, ','), "namespace", m.Namespace)
	}
	dst = appendJSONField(append(dst, ','), "name", m.Name)
	dst = appendJSONField(append(dst, ','), "uid", m.UID)
	dst = appendJSONField(append(dst, ','), "resourceVersion", m.ResourceVersion)
	return append(dst, '}')
}

// ParseWatchFrame splits one watch frame, {"type":"ADDED","object":{...}}
// with the keys in any order and other keys ignored, into its type string and
// the raw bytes of its object (aliasing frame). The whole frame is validated.
//
// Errors: "watch frame is empty", "watch frame is not a JSON object", "watch
// frame has no type", "watch frame has no object", "watch frame type is not a
// string", "watch frame object is not a JSON object", "watch frame has
// duplicate key type|object", or a [*SyntaxError].
func ParseWatchFrame(frame []byte) (typ string, object []byte, err error) {
	typ, start, end, _, err := scanWatchFrame(frame, false, nil)
	if err != nil {
		return "", nil, err
	}
	return typ, frame[start:end:end], nil
}

// ParseWatchEvent is ParseWatchFrame followed by ParseObject on the object,
// in a single pass over the frame. The Object aliases frame. It fails like
// ParseObject if the object has no metadata, so use ParseWatchFrame for
// frames that may carry something else (e.g. type "ERROR" with a Status).
// It is ParseWatchEventShaped(frame, nil).
func ParseWatchEvent(frame []byte) (typ string, obj Object, err error) {
	return ParseWatchEventShaped(frame, nil)
}

// ParseWatchEventShaped is ParseWatchEvent that also records the members
// selected by s, like ParseObjectShaped, in the same single pass.
func ParseWatchEventShaped(frame []byte, s *Shaping) (typ string, obj Object, err error) {
	typ, start, end, obj, err := scanWatchFrame(frame, true, s)
	if err != nil {
		return "", Object{}, err
	}
	obj.Raw = frame[start:end:end]
	obj.shift(-start)
	return typ, obj, nil
}

// scanWatchFrame scans a watch frame (see ParseWatchFrame) and returns its
// type and the span of its object in frame; with parse, the object is also
// parsed (with s) into obj, with offsets in frame.
func scanWatchFrame(frame []byte, parse bool, s *Shaping) (typ string, objStart, objEnd int, obj Object, err error) {
	i := skipWS(frame, 0)
	if i >= len(frame) {
		return "", 0, 0, obj, errors.New("watch frame is empty")
	}
	if frame[i] != '{' {
		return "", 0, 0, obj, errors.New("watch frame is not a JSON object")
	}
	var haveType, haveObject bool
	i = skipWS(frame, i+1)
	if i >= len(frame) {
		return "", 0, 0, obj, errTruncated(frame)
	}
	for last := frame[i] == '}'; !last; {
		var key string
		if i, key, err = frameMemberKey(frame, i); err != nil {
			return "", 0, 0, obj, err
		}
		switch key {
		case "type":
			if haveType {
				return "", 0, 0, obj, errors.New("watch frame has duplicate key type")
			}
			haveType = true
			if i, typ, err = frameType(frame, i); err != nil {
				return "", 0, 0, obj, err
			}
		case "object":
			if haveObject {
				return "", 0, 0, obj, errors.New("watch frame has duplicate key object")
			}
			haveObject = true
			if frame[i] != '{' {
				return "", 0, 0, obj, errors.New("watch frame object is not a JSON object")
			}
			objStart = i
			if parse {
				obj, i, err = parseObject(frame, i, 2, s)
			} else {
				i, err = skipObject(frame, i, 2)
			}
			if err != nil {
				return "", 0, 0, obj, err
			}
			objEnd = i
		default:
			if i, err = skipValue(frame, i, 1); err != nil {
				return "", 0, 0, obj, err
			}
		}
		if i, last, err = afterMember(frame, i); err != nil {
			return "", 0, 0, obj, err
		}
	}
	if err = frameEnd(frame, i, haveType, haveObject); err != nil {
		return "", 0, 0, obj, err
	}
	return typ, objStart, objEnd, obj, nil
}

// frameMemberKey scans the key of a watch frame member at frame[i] and the
// colon after it, and returns the offset of the value and the key as
// frameKey does.
func frameMemberKey(frame []byte, i int) (next int, key string, err error) {
	if frame[i] != '"' {
		return 0, "", errInvalid(frame, i, "looking for beginning of object key string")
	}
	kend, kflags, err := scanString(frame, i)
	if err != nil {
		return 0, "", err
	}
	key = frameKey(frame[i+1:kend-1], kflags)
	if next, err = skipColon(frame, kend); err != nil {
		return 0, "", err
	}
	return next, key, nil
}

// frameType reads the value of a watch frame's type member at frame[i],
// which must be a string, and returns the offset just past it and the
// decoded type.
func frameType(frame []byte, i int) (next int, typ string, err error) {
	if frame[i] != '"' {
		return 0, "", errors.New("watch frame type is not a string")
	}
	end, flags, err := scanString(frame, i)
	if err != nil {
		return 0, "", err
	}
	return end, watchTypeString(frame[i+1:end-1], flags), nil
}

// frameEnd checks a watch frame whose closing '}' is at frame[i]: only
// whitespace may follow, and it must have had a type and an object.
func frameEnd(frame []byte, i int, haveType, haveObject bool) error {
	if j := skipWS(frame, i+1); j < len(frame) {
		return errInvalid(frame, j, "after top-level value")
	}
	if !haveType {
		return errors.New("watch frame has no type")
	}
	if !haveObject {
		return errors.New("watch frame has no object")
	}
	return nil
}

// frameKey returns "type", "object" or "" for a watch frame key.
func frameKey(raw []byte, flags uint8) string {
	k := raw
	if !stringIsPlain(raw, flags) {
		if len(raw) > 6*6 {
			return ""
		}
		var buf [48]byte
		k = appendUnquoted(buf[:0], raw)
	}
	switch string(k) {
	case "type":
		return "type"
	case "object":
		return "object"
	}
	return ""
}

// watchTypeString decodes the type value, without allocating for the types
// the apiserver sends.
func watchTypeString(raw []byte, flags uint8) string {
	if !stringIsPlain(raw, flags) {
		return string(appendUnquoted(nil, raw))
	}
	switch string(raw) {
	case "ADDED":
		return "ADDED"
	case "MODIFIED":
		return "MODIFIED"
	case "DELETED":
		return "DELETED"
	case "BOOKMARK":
		return "BOOKMARK"
	case "ERROR":
		return "ERROR"
	}
	return string(raw)
}
