// Package event turns raw Kubernetes objects into relayd's wire format: the
// CloudEvents 1.0 envelope, the NATS subject and the Nats-Msg-Id header
// (DESIGN.md §4). It is shared by the source (which reads watch frames) and
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
// Nats-Msg-Id (<source>/<id>) so that JetStream drops replays. An event that
// would exceed the NATS server's max payload is re-encoded with the reference
// payload and relaydoversize=true instead of being dropped.
// [Encoder.Control] builds the sync.started / sync.completed control events.
// [DecodeStructured] and [DecodeMessage] read events back (tests, tail); they
// use encoding/json and are not on the hot path.
package event
