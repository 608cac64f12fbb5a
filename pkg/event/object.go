package event

import (
	"errors"
	"strings"
)

// Object is one object's raw JSON plus what a single scan found in it.
//
// The zero Object (or one whose Raw was not produced by [ParseObject] or
// [ParseWatchEvent]) has no byte spans; [Object.AppendPayload] then builds the
// reference payload from Meta in every mode.
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
	mfStart, mfEnd     int  // bytes to cut to drop metadata.managedFields; equal when absent
	hasAPIVersion      bool // the object has an apiVersion member (possibly null)
	hasKind            bool // the object has a kind member (possibly null)
}

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
// of metadata.managedFields so that AppendPayload can drop it.
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
	i := skipWS(raw, 0)
	if i >= len(raw) {
		return Object{}, errors.New("object is empty")
	}
	if raw[i] != '{' {
		return Object{}, errors.New("object is not a JSON object")
	}
	o, end, err := parseObject(raw, i, 1)
	if err != nil {
		return Object{}, err
	}
	if j := skipWS(raw, end); j < len(raw) {
		return Object{}, errInvalid(raw, j, "after top-level value")
	}
	o.Raw = raw
	return o, nil
}

// parseObject parses the object starting at data[i] == '{', at nesting depth
// depth, and returns it with spans relative to data (Raw unset) and the offset
// just past it.
func parseObject(data []byte, i, depth int) (o Object, end int, err error) {
	var spans [numFields]strSpan
	var seen uint16 // bit per key (f*, keyManagedFields, keyMetadata)
	o.start = i
	i = skipWS(data, i+1)
	if i >= len(data) {
		return o, 0, errTruncated(data)
	}
	if data[i] != '}' {
		for {
			if data[i] != '"' {
				return o, 0, errInvalid(data, i, "looking for beginning of object key string")
			}
			kend, kflags, err := scanString(data, i)
			if err != nil {
				return o, 0, err
			}
			key := matchKey(data[i+1:kend-1], kflags, true)
			if i, err = skipColon(data, kend); err != nil {
				return o, 0, err
			}
			if key != keyOther {
				if seen&(1<<key) != 0 {
					if key == keyMetadata {
						return o, 0, errors.New("duplicate key metadata")
					}
					return o, 0, errors.New("duplicate key " + fieldNames[key])
				}
				seen |= 1 << key
			}
			switch key {
			case fAPIVersion, fKind:
				i, err = parseStringField(data, i, &spans[key], fieldNames[key])
			case keyMetadata:
				if data[i] != '{' {
					return o, 0, errors.New("metadata is not a JSON object")
				}
				i, err = parseMetadata(data, i, depth+1, &o, &spans, &seen)
			default:
				i, err = skipValue(data, i, depth)
			}
			if err != nil {
				return o, 0, err
			}
			i = skipWS(data, i)
			if i >= len(data) {
				return o, 0, errTruncated(data)
			}
			if data[i] == '}' {
				break
			}
			if data[i] != ',' {
				return o, 0, errInvalid(data, i, "after object key:value pair")
			}
			i = skipWS(data, i+1)
			if i >= len(data) {
				return o, 0, errTruncated(data)
			}
		}
	}
	if seen&(1<<keyMetadata) == 0 {
		return o, 0, errors.New("missing metadata")
	}
	o.end = i + 1
	o.hasAPIVersion = seen&(1<<fAPIVersion) != 0
	o.hasKind = seen&(1<<fKind) != 0
	o.Meta = buildMeta(data, &spans)
	return o, o.end, nil
}

// parseMetadata parses the metadata object starting at data[i] == '{'.
func parseMetadata(data []byte, i, depth int, o *Object, spans *[numFields]strSpan, seen *uint16) (int, error) {
	o.metaStart = i
	i = skipWS(data, i+1)
	if i >= len(data) {
		return 0, errTruncated(data)
	}
	prevEnd := -1 // end of the previous member's value
	if data[i] != '}' {
		for {
			if data[i] != '"' {
				return 0, errInvalid(data, i, "looking for beginning of object key string")
			}
			keyStart := i
			kend, kflags, err := scanString(data, i)
			if err != nil {
				return 0, err
			}
			key := matchKey(data[i+1:kend-1], kflags, false)
			if i, err = skipColon(data, kend); err != nil {
				return 0, err
			}
			if key != keyOther {
				if *seen&(1<<key) != 0 {
					if key == keyManagedFields {
						return 0, errors.New("duplicate key metadata.managedFields")
					}
					return 0, errors.New("duplicate key " + fieldNames[key])
				}
				*seen |= 1 << key
			}
			switch key {
			case fNamespace, fName, fUID, fResourceVersion:
				i, err = parseStringField(data, i, &spans[key], fieldNames[key])
			default:
				i, err = skipValue(data, i, depth)
			}
			if err != nil {
				return 0, err
			}
			valEnd := i
			i = skipWS(data, i)
			if i >= len(data) {
				return 0, errTruncated(data)
			}
			if data[i] == '}' {
				if key == keyManagedFields {
					// Last member: cut from the end of the previous value
					// (taking its comma), or the member alone if it is the
					// only one.
					o.mfStart, o.mfEnd = keyStart, valEnd
					if prevEnd >= 0 {
						o.mfStart = prevEnd
					}
				}
				break
			}
			if data[i] != ',' {
				return 0, errInvalid(data, i, "after object key:value pair")
			}
			i = skipWS(data, i+1)
			if i >= len(data) {
				return 0, errTruncated(data)
			}
			if key == keyManagedFields {
				// Not last: cut the member, its comma and the whitespace up
				// to the next key.
				o.mfStart, o.mfEnd = keyStart, i
			}
			prevEnd = valEnd
		}
	}
	o.metaEnd = i + 1
	return i + 1, nil
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

// matchKey classifies an object key (raw contents between the quotes, with
// its scanString flags) at the top level or inside metadata. Keys are
// compared after unescaping, so "\u006bind" is kind.
func matchKey(raw []byte, flags uint8, top bool) int {
	k := raw
	if !stringIsPlain(raw, flags) {
		// Every escape decodes to at least one byte per 6 input bytes, so a
		// longer key cannot decode to one of the (<= 15 byte) keys matched.
		if len(raw) > 6*15 {
			return keyOther
		}
		var buf [48]byte
		k = appendUnquoted(buf[:0], raw)
	}
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
func (o *Object) AppendPayload(dst []byte, mode PayloadMode, keepManagedFields bool) []byte {
	if mode == PayloadReference || !o.parsed() {
		return AppendReference(dst, o.Meta)
	}
	if mode == PayloadMetadata {
		dst = appendJSONField(append(dst, '{'), "apiVersion", o.Meta.APIVersion)
		dst = appendJSONField(append(dst, ','), "kind", o.Meta.Kind)
		dst = append(dst, `,"metadata":`...)
		dst = o.appendCut(dst, o.metaStart, o.metaEnd, keepManagedFields)
		return append(dst, '}')
	}
	start := o.start
	injectAPIVersion := !o.hasAPIVersion && o.Meta.APIVersion != ""
	injectKind := !o.hasKind && o.Meta.Kind != ""
	if injectAPIVersion || injectKind {
		// The object has at least its metadata member, so a comma follows.
		dst = append(dst, '{')
		if injectAPIVersion {
			dst = append(appendJSONField(dst, "apiVersion", o.Meta.APIVersion), ',')
		}
		if injectKind {
			dst = append(appendJSONField(dst, "kind", o.Meta.Kind), ',')
		}
		start++
	}
	return o.appendCut(dst, start, o.end, keepManagedFields)
}

// appendCut appends Raw[from:to] minus the managedFields cut (if inside).
func (o *Object) appendCut(dst []byte, from, to int, keep bool) []byte {
	if keep || o.mfEnd <= o.mfStart || o.mfStart < from || o.mfEnd > to {
		return append(dst, o.Raw[from:to]...)
	}
	dst = append(dst, o.Raw[from:o.mfStart]...)
	return append(dst, o.Raw[o.mfEnd:to]...)
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
	typ, start, end, _, err := scanWatchFrame(frame, false)
	if err != nil {
		return "", nil, err
	}
	return typ, frame[start:end:end], nil
}

// ParseWatchEvent is ParseWatchFrame followed by ParseObject on the object,
// in a single pass over the frame. The Object aliases frame. It fails like
// ParseObject if the object has no metadata, so use ParseWatchFrame for
// frames that may carry something else (e.g. type "ERROR" with a Status).
func ParseWatchEvent(frame []byte) (typ string, obj Object, err error) {
	typ, start, end, obj, err := scanWatchFrame(frame, true)
	if err != nil {
		return "", Object{}, err
	}
	obj.Raw = frame[start:end:end]
	obj.start -= start
	obj.end -= start
	obj.metaStart -= start
	obj.metaEnd -= start
	if obj.mfEnd > obj.mfStart {
		obj.mfStart -= start
		obj.mfEnd -= start
	}
	return typ, obj, nil
}

func scanWatchFrame(frame []byte, parse bool) (typ string, objStart, objEnd int, obj Object, err error) {
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
	if frame[i] != '}' {
		for {
			if frame[i] != '"' {
				return "", 0, 0, obj, errInvalid(frame, i, "looking for beginning of object key string")
			}
			kend, kflags, err := scanString(frame, i)
			if err != nil {
				return "", 0, 0, obj, err
			}
			key := frameKey(frame[i+1:kend-1], kflags)
			if i, err = skipColon(frame, kend); err != nil {
				return "", 0, 0, obj, err
			}
			switch key {
			case "type":
				if haveType {
					return "", 0, 0, obj, errors.New("watch frame has duplicate key type")
				}
				haveType = true
				if frame[i] != '"' {
					return "", 0, 0, obj, errors.New("watch frame type is not a string")
				}
				end, flags, err := scanString(frame, i)
				if err != nil {
					return "", 0, 0, obj, err
				}
				typ = watchTypeString(frame[i+1:end-1], flags)
				i = end
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
					obj, i, err = parseObject(frame, i, 2)
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
			i = skipWS(frame, i)
			if i >= len(frame) {
				return "", 0, 0, obj, errTruncated(frame)
			}
			if frame[i] == '}' {
				break
			}
			if frame[i] != ',' {
				return "", 0, 0, obj, errInvalid(frame, i, "after object key:value pair")
			}
			i = skipWS(frame, i+1)
			if i >= len(frame) {
				return "", 0, 0, obj, errTruncated(frame)
			}
		}
	}
	if j := skipWS(frame, i+1); j < len(frame) {
		return "", 0, 0, obj, errInvalid(frame, j, "after top-level value")
	}
	if !haveType {
		return "", 0, 0, obj, errors.New("watch frame has no type")
	}
	if !haveObject {
		return "", 0, 0, obj, errors.New("watch frame has no object")
	}
	return typ, objStart, objEnd, obj, nil
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
