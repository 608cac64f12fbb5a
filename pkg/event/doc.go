// Package event turns raw Kubernetes objects into relayd's wire format: the
// CloudEvents 1.0 envelope, the NATS subject and the Nats-Msg-Id header
// (docs/CONSUMING.md, "The event on the wire"). It is shared by the source (which reads watch frames) and
// the sink (which publishes), so that neither imports the other.
//
// # Reading objects without decoding them
//
// [ParseObject] scans one object's JSON once, validating it completely, and
// extracts apiVersion, kind and metadata.{namespace,name,uid,resourceVersion}
// ([Meta]) plus the byte span of metadata.managedFields. The object stays raw
// bytes: [Object.AppendPayload] produces the full, metadata or reference
// payload by copying byte ranges, never by re-encoding a decoded tree.
// [ParseWatchFrame] splits a watch frame ({"type":..,"object":{..}}) and
// [ParseWatchEvent] does both in one pass.
//
// # Field paths
//
// [ParsePath] compiles a field path, which selects object members by name:
//
//	spec.replicas                                 member replicas of member spec
//	spec.template.spec.containers[*].env          env of every element of containers
//	spec.containers[*].env[*].valueFrom           valueFrom of every element of each env
//	metadata.annotations["example.com/token"]     a member name with other characters
//	data["tls.key"]                               (a '.' inside a name must be quoted too)
//	metadata.labels["say \"hi\""]                 escapes inside the quotes
//
// The rules:
//
//   - A path is a member name followed by steps: ".name", ["name"] or [*].
//   - A plain name is one or more ASCII letters, digits, '_' and '-'
//     (Kubernetes field names are lowerCamelCase: "spec", "podIP"). Every
//     other name, such as an annotation or label key ("example.com/token",
//     "app.kubernetes.io/name"), a data key with a dot, a non-ASCII or an
//     empty name, is written quoted: ["..."], with JSON string escapes
//     inside the quotes (\" and \\, also \/ \b \f \n \r \t \uXXXX; raw control
//     characters are not allowed). A quoted name may also come first, and
//     follows the step before it directly: metadata.annotations["a"], not
//     metadata.annotations.["a"].
//   - [*] (after a name, or after another [*]) steps into every element of
//     an array.
//   - [N] (one element by position) is not supported: positions are not
//     stable identities. The apiserver reorders, inserts and removes list
//     elements, so "the third container" is not the same container from one
//     event to the next.
//   - Names are compared with the object's keys after JSON unescaping, so
//     "\u0073pec" in the object is member spec.
//   - A path selects object members: a member is removed together with its
//     key (and one comma, so the JSON stays valid). A path through a value
//     of another type (a name on an array or a string, [*] on an object)
//     selects nothing; so does a path whose members are absent.
//
// [Path.String] is the canonical form: plain names where possible, other
// names quoted with '"', '\\', ',' and control characters escaped. It
// round-trips through ParsePath.
//
// # Shaping: what a source publishes
//
// A [Shaping] ([NewShaping], from [ShapingOptions]) holds a source's Drop
// paths (removed from every payload), IgnoreChanges paths (left out of the
// fingerprint), ChangedPaths (fingerprinted one by one for the
// relaydchanged extension: [Fingerprinter.PathFingerprints],
// [CompareChanged]) and whether to keep metadata.managedFields and the
// last-applied annotation ([LastAppliedAnnotation], which holds the whole
// object as last applied by kubectl, a Secret's data included).
// [ParseObjectShaped] and [ParseWatchEventShaped] record the byte span of
// every selected member in the same single scan that validates the object;
// [Object.AppendShaped] builds the payload by copying the bytes between the
// cuts, and [Object.Fingerprint] hashes them, neither decoding the object.
// Safe by default: with a nil Shaping, or KeepLastApplied false, the
// last-applied annotation is removed from the full and the metadata payload
// (leaving "annotations":{} when it was the only annotation: a member is
// removed, never its parent), and managedFields too unless
// KeepManagedFields. [Object.AppendPayload] keeps its narrower contract and
// removes managedFields only.
//
// A Drop path may not select apiVersion, kind, metadata or
// metadata.{name,namespace,uid,resourceVersion}: they identify the object.
// Overlapping selections are fine (a member inside a removed member goes
// with it). The metadata payload applies the cuts inside metadata and
// never contains anything else (no data, stringData, spec or status);
// the reference payload is built from Meta alone.
//
// The fingerprint is an xxhash64 of the object's bytes minus the
// IgnoreChanges members and minus apiVersion, kind,
// metadata.{resourceVersion,generation,managedFields}. It relies on the
// apiserver writing an unchanged object with the same bytes (member order
// and formatting are deterministic for a given object), so equal
// fingerprints mean "nothing changed outside the ignored paths". Drop
// paths and the last-applied annotation are not left out: the fingerprint
// covers what the payload does not carry. A [Fingerprinter] with a
// [FingerprintKey] hashes the same bytes with HMAC-SHA256 under the key
// instead, so that a stored fingerprint cannot be used to test guesses of
// those members (docs/GUARANTEES.md, "Fingerprints").
//
// # Subjects
//
// An object change is published on
//
//	<prefix>.<cluster>.<group>.<version>.<resource>.<namespace>.<name>.<added|modified|deleted>
//
// and the control events that bracket a (re)list on
//
//	<prefix>.<cluster>._relayd.<source>.sync.started
//	<prefix>.<cluster>._relayd.<source>.sync.completed
//
// prefix (default "k8s", may contain dots, e.g. "acme.k8s"), cluster and
// source are validated by [NewEncoder] to consist of A-Z a-z 0-9 _ - only
// (plus dots between prefix tokens), so they are used verbatim. Every other
// token is a variable token: it is encoded by [EncodeToken], which writes
// '%' first, then '.', '*', '>', space, the control bytes (0x00-0x1f, 0x7f)
// and every byte >= 0x80 as %HH (two upper-case hex digits) and leaves every
// other byte as is. The result is never empty for a non-empty value, never
// contains a subject separator, a wildcard, whitespace or a non-ASCII byte, and
// [DecodeToken] inverts it exactly, so two different values never share a
// token. Examples: "a.b" -> "a%2Eb", "50%" -> "50%25", "ü" -> "%C3%BC".
//
// Two placeholders stand for empty values:
//
//   - group: the core group ("") is written "core". A group that really is
//     named "core" is written "%63ore" (its first byte escaped).
//   - namespace: a cluster-scoped object (namespace "") is written "_". A
//     namespace really named "_" is written "%5F". The same rule applies to the
//     version, resource and name tokens, which are never empty for a real
//     object but must still produce a valid subject.
//
// If the subject would be longer than [MaxSubjectLen] bytes, the name token is
// replaced by a hash token: "%H" followed by the lower-case hex of the first 16
// bytes of sha256(name). "%H" is not a valid escape, so a hash token can never
// be confused with an encoded name; the full name is still carried in the
// k8sname extension. [ParseSubject] inverts an object subject.
//
// # Events
//
// [Encoder.Encode] builds the NATS message for one [Change] in structured
// (application/cloudevents+json) or binary (ce-* headers) content mode, with a
// deterministic id (<uid>/<resourceVersion>, plus /deleted for deletes) and
// Nats-Msg-Id (<prefix>.<cluster>/<source>/<id>) so that JetStream drops
// replays, and never another cluster's relayd's messages. An event that
// would exceed the NATS server's max payload is re-encoded with the reference
// payload and relaydoversize=true instead of being dropped; if even that is
// too large, without data (relaydpayload "none", relaydunencodable=true,
// [Message.Unencodable]), so that the change still reaches the stream,
// named by its attributes (docs/CONSUMING.md). When a Shaping's
// Drop paths removed something from the data, [Change.Dropped] lists them
// and the event carries the extension relayddropped: the canonical paths
// joined by "," (header ce-relayddropped in binary mode).
// [Encoder.Control] builds the sync.started / sync.completed control events.
// [DecodeStructured] and [DecodeMessage] read events back (tests, tail); they
// use encoding/json and are not on the hot path.
package event
