package event

// OverrideTypeMeta sets Meta.APIVersion and Meta.Kind to apiVersion and kind
// (typically Resource.APIVersion() and Resource.Kind), whatever the object
// says. It is for objects fetched as metadata only (Accept:
// application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1 and its List
// form): the apiserver sends them with "apiVersion":"meta.k8s.io/v1" and
// "kind":"PartialObjectMetadata", which [Object.DefaultTypeMeta] keeps,
// while events must name the real resource. The metadata and reference
// payloads and the encoder (k8sapiversion, k8skind) read Meta, so they then
// carry the given type.
//
// The full payload copies the object's bytes, which still carry the
// apiserver's type members. Such an object is never published in full
// (relayd fetches metadata only for payload metadata and reference), but so
// that it could not be published under the wrong type by mistake, an object
// whose own type differs from the given one and that has no members besides
// apiVersion, kind and metadata (a PartialObjectMetadata) is narrowed to its
// metadata member: its full payload is then its metadata payload,
// {"apiVersion":apiVersion,"kind":kind,"metadata":{...}}. An object with
// other members (a whole object) keeps its bytes; when it has no type
// members of its own (a LIST item), the full payload gets the given ones
// inserted, as with DefaultTypeMeta. Raw is never modified.
func (o *Object) OverrideTypeMeta(apiVersion, kind string) {
	if o.Meta.APIVersion == apiVersion && o.Meta.Kind == kind {
		return
	}
	o.Meta.APIVersion, o.Meta.Kind = apiVersion, kind
	if !o.parsed() || !(o.hasAPIVersion || o.hasKind) {
		return
	}
	if k, ok := o.metadataKeyIfOnlyMember(); ok {
		// AppendPayload's full mode writes '{', then the type members it
		// does not find in the object (Meta's), then Raw[start+1:end]: here
		// `"metadata":{...}}`. The metadata payload reads metaStart/metaEnd,
		// the reference payload Meta: both unchanged.
		o.start = k - 1
		o.hasAPIVersion, o.hasKind = false, false
	}
}

// metadataKeyIfOnlyMember reports the offset in Raw of the "metadata" key
// when the object's members are apiVersion and kind (strings or null, each
// at most once, in any order) followed by metadata as the last member. The
// object was validated by ParseObject: this only checks its shape, and
// gives up (false) on anything else, including escaped keys.
func (o *Object) metadataKeyIfOnlyMember() (int, bool) {
	b := o.Raw[:o.end]
	i := o.start + 1
	for {
		i = tmSkipSpace(b, i)
		if i >= len(b) || b[i] != '"' {
			return 0, false
		}
		keyStart := i
		keyEnd, ok := tmStringEnd(b, i)
		if !ok {
			return 0, false
		}
		key := string(b[keyStart+1 : keyEnd-1])
		i = tmSkipSpace(b, keyEnd)
		if i >= len(b) || b[i] != ':' {
			return 0, false
		}
		i = tmSkipSpace(b, i+1)
		switch key {
		case "metadata":
			if i != o.metaStart {
				return 0, false
			}
			// metadata must be the last member.
			if j := tmSkipSpace(b, o.metaEnd); j != o.end-1 || b[j] != '}' {
				return 0, false
			}
			return keyStart, true
		case "apiVersion", "kind":
			switch {
			case i < len(b) && b[i] == '"':
				if i, ok = tmStringEnd(b, i); !ok {
					return 0, false
				}
			case len(b)-i >= 4 && string(b[i:i+4]) == "null":
				i += 4
			default:
				return 0, false
			}
		default:
			return 0, false
		}
		i = tmSkipSpace(b, i)
		if i >= len(b) || b[i] != ',' {
			return 0, false
		}
		i++
	}
}

// tmStringEnd returns the offset just past the string starting at
// b[i] == '"', if it has no escapes.
func tmStringEnd(b []byte, i int) (int, bool) {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '"':
			return j + 1, true
		case '\\':
			return 0, false
		}
	}
	return 0, false
}

func tmSkipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}
