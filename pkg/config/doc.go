// Package config loads, defaults and validates the relayd configuration
// file. This comment is the configuration reference; config.example.yaml at
// the repository root is a commented example of every key.
//
// # File format
//
// The file is one YAML document (a second document, even an empty one after
// a trailing "---", is an error; so is an empty file). Keys are
// lowerCamelCase and decoding is strict: an unknown key, a key given twice
// or a value of the wrong type is an error, never silently ignored.
// Anchors, aliases and merge keys ("<<") work as in YAML 1.1.
//
// Durations are strings in Go syntax: "500ms", "30s", "5m", "1h30m". A bare
// number has no unit and is rejected (except 0). Integers must be written
// as integers (1.5 is not truncated to 1). Sizes (the keys ending in Bytes)
// are an integer number of bytes or a Kubernetes quantity string: "64Mi",
// "1Gi", "1.5Ki", "500M" (Size); a quantity must be a whole number of bytes.
// Size and Duration describe themselves to a JSON Schema (JSONSchema).
//
// Keys ending in File are paths; a relative one is read from relayd's
// working directory (in a pod, the image's), so Warnings reports it.
//
// A key that is left out, set to null, or set to its zero value (0, "",
// 0s, an empty list) takes its default. The one exception is
// watch.relistBackoff.jitter, where an explicit 0 means no jitter.
//
// # Keys
//
// Top level:
//
//   - cluster (required): names the cluster in subjects and in the
//     CloudEvents source "/relayd/<cluster>/<source>". A NATS subject token:
//     letters, digits, '_' and '-'.
//   - prefix (default "k8s"): first subject token(s) and CloudEvents type
//     prefix. Tokens of letters, digits, '_' and '-', joined by dots
//     ("k8s", "acme.k8s").
//
// nats:
//
//   - url (required): server URL, or a comma-separated list of them. Each
//     must be nats://, tls://, ws:// or wss:// with a host and an optional
//     port, and must not carry credentials (use a file below): a URL with
//     an '@' anywhere is refused, and shown redacted (see Errors).
//   - Authentication, at most one of (none: no authentication), each the
//     path of a file, never the secret itself: credentialsFile (a .creds
//     file: user JWT + NKey seed, operator mode), nkeySeedFile (a user NKey
//     seed), tokenFile (a token), userFile + passwordFile (a user name and
//     its password, both or neither). Combining two is an error naming both
//     keys. The files are read when relayd connects and again at every
//     reconnect (a rotated Secret needs no restart; an NKey seed of another
//     user does once connected), so their existence is not checked here; at
//     run time a missing or unparsable file keeps relayd unready with an
//     error naming the key and the path.
//   - allowPlaintextCredentials (default false): credentials (any of the
//     files above) go over TLS only: every URL must be tls:// or wss://, or
//     a tls key must be set (TLS is then required whatever the scheme).
//     Otherwise the config is refused with a problem at nats.url naming the
//     URLs and the key, 127.0.0.1 and localhost included (an NKey or JWT
//     user sends no secret, but its session, JWT and messages can be read
//     and taken over all the same). true accepts credentials on a plain
//     connection; Warnings then reports it (relayd logs it at start,
//     check-config prints it).
//   - tls.caFile (default: the system roots): PEM bundle of the CAs of the
//     server certificate. tls.certFile + tls.keyFile (both or neither): the
//     PEM client certificate and key, for mTLS. tls.serverName (default: the
//     URL host): the name the server certificate is checked against. Any
//     tls key makes TLS required. The files are read at every TLS handshake.
//   - jsDomain (default "": the local JetStream): the JetStream domain of
//     the stream and bucket; letters, digits, '_', '-'.
//   - inboxPrefix (default "_INBOX"): prefix of the reply subjects relayd
//     subscribes to, so that permissions can grant "<inboxPrefix>.>"; tokens
//     of letters, digits, '_', '-' joined by dots, no wildcards.
//   - name (default "relayd"): client connection name.
//   - publishTimeout (default 10s, > 0): wait for one PubAck.
//   - maxInFlight (default 256, 1..65536): unacknowledged publishes per watch.
//   - maxInFlightBytes (default 50331648 = 48Mi, 1Mi..1Ti, a size): bytes of
//     unacknowledged publishes of the whole process; also sizes the NATS
//     client's reconnect buffer.
//   - maxInFlightBytesPerWatch (default 16777216 = 16Mi, a size, 1Mi..
//     maxInFlightBytes): the same per watch, so that one busy source cannot
//     take the whole process's share. A message larger than a bound is
//     published alone.
//   - stream.name (required): JetStream stream; letters, digits, '_', '-'.
//   - stream.create (default false): create the stream when it is missing,
//     with subjects "<prefix>.<cluster>.>", discard policy "new" and the keys
//     below; on an existing stream, add "<prefix>.<cluster>.>" to its subjects
//     when none captures it, and change nothing else (differences from the
//     keys below are logged as warnings). With false the stream must exist
//     and capture "<prefix>.<cluster>.>", or relayd stays unready saying why.
//     An existing stream with a duplicate window under 1m keeps relayd
//     unready either way. The keys below are validated either way.
//   - stream.duplicateWindow (default 10m, >= 1m, <= maxAge): must cover a
//     restart or a leader hand-over.
//   - stream.replicas (default 1, 1..5).
//   - stream.storage (default file): file or memory.
//   - stream.maxAge (default 168h, >= 0; 0 takes the default): a consumer
//     down longer misses the messages that expired meanwhile (the stream's
//     first sequence tells it so). For no age limit, create the stream
//     yourself: relayd leaves an existing stream's limits alone.
//   - stream.maxBytes (a size; default -1 = unlimited; -1, 0 or positive, where 0
//     means the default).
//   - index.bucket (default "relayd-index-<cluster>"): the JetStream
//     key-value bucket that persists the object index (uid →
//     resourceVersion, namespace/name of every published object, one key per
//     object), so that a restart followed by a 410 still yields exact deletes
//     and no flood. Letters, digits, '_', '-'.
//   - index.create (default true): create the bucket when missing (history 1,
//     expiring delete markers). With false a missing bucket keeps relayd
//     unready.
//   - index.replicas (default 1, 1..5) and index.storage (default file: file
//     or memory): of a bucket relayd creates.
//   - index.fingerprintKeyFile (default none): the path of a file (a mounted
//     Secret) holding the key of the fingerprints of ignoreChanges (at
//     least 16 bytes once surrounding whitespace is trimmed, e.g. the output
//     of `openssl rand -hex 32`). A fingerprint hashes the whole object but
//     the ignored paths, including what the payload leaves out, and is
//     stored in the bucket: without a key it is an xxhash64 that whoever
//     reads the bucket can recompute to test guesses of those fields; with
//     one it is an HMAC-SHA256 under the key (truncated to 64 bits).
//     Required when a source of Secrets has ignoreChanges. Read once, at
//     start; the key's identifier (not the key) is stored with each
//     fingerprint, and a fingerprint made under another key (or none) is
//     removed at start, so a new key costs at most one extra modified
//     event per object.
//
// cloudevents:
//
//   - mode (default structured): structured (one
//     application/cloudevents+json document) or binary (ce-* headers, the
//     object as body).
//
// checkpoint:
//
//   - namespace (default: $POD_NAMESPACE, else the service account
//     namespace file, else "default"; a DNS-1123 label): namespace of the
//     checkpoint ConfigMap. Resolved by Load through ResolveDefaults; Parse
//     and `relayd check-config` leave it empty.
//   - name (default "relayd-checkpoint", a DNS-1123 subdomain): the
//     ConfigMap, which must exist (relayd is not granted "create").
//   - flushInterval (default 5s, >= 100ms): how often checkpoints are
//     written.
//   - watchesPerConfigMap (default 500, 1..3000): the checkpoint keys (one
//     per watch) are spread over ceil(watches / watchesPerConfigMap)
//     ConfigMaps: name, name-1, name-2, …, which must all exist and be
//     granted (the chart renders them; docs/OPERATIONS.md, "Checkpoint
//     ConfigMap").
//
// watch (applies to every source):
//
//   - timeout (default 5m, 30s..1h, whole seconds): server-side
//     timeoutSeconds of each watch request.
//   - idleTimeout (default timeout + 30s, > timeout): a watch that
//     delivered no frame for this long is aborted and resumed, so a silent
//     network partition cannot hang it.
//   - relistBackoff.initial (default 1s, > 0), relistBackoff.max (default
//     5m, >= initial), relistBackoff.factor (default 2, >= 1),
//     relistBackoff.jitter (default 0.5, 0..1): exponential backoff with
//     jitter between failed watches and relists.
//   - pageSize (default 500, 1..10000): page size of the paginated LIST
//     used when the server does not support streaming lists.
//   - maxObjectBytes (default 67108864 = 64Mi, 1Mi..1Ti, a size): the most
//     relayd reads of one watch frame or LIST item. One over it (a broken
//     apiserver or proxy, or an object larger than the bound) fails that
//     watch with an error naming the source, the resource and the bytes
//     read, counted as relayd_watch_restarts_total{reason="oversized"};
//     the watch is retried with relistBackoff from its position, and the
//     other sources go on. A LIST page is read up to maxObjectBytes plus
//     64 KiB; a larger one is asked for again with half as many items.
//
// shutdown:
//
//   - drainTimeout (default 20s, > 0): wait for in-flight publishes and the
//     final checkpoint on SIGTERM.
//
// sharding:
//
//   - enabled (default false): spread the sources over several replicas.
//     Every source then runs on the replica holding its coordination.k8s.io
//     Lease "<leasePrefix>-<source>" in checkpoint.namespace, which must be
//     pre-created (relayd only gets and updates it). Off, the replica runs
//     every source and uses no Lease: deploy one replica.
//   - leasePrefix (default "relayd", a DNS-1123 label).
//   - leaseDuration (default 15s, > renewDeadline): how long the others wait
//     after the last renewal they saw before taking a source over.
//   - renewDeadline (default 10s, > retryPeriod): how long a replica keeps a
//     source running without a successful renewal. leaseDuration −
//     renewDeadline is the time a source has to stop after losing its Lease.
//   - retryPeriod (default 2s, > 0): how often each Lease is renewed or
//     tried; about the hand-over time after a graceful stop.
//
// heartbeatInterval (default 1m; 0 = off, else at least 1s): every running
// watch publishes a heartbeat control event this often on
// <prefix>.<cluster>._relayd.<source>.heartbeat (docs/CONSUMING.md,
// "Heartbeats"): a consumer that sees none for 2 intervals knows relayd is
// absent or the watch down or stalled. One message per watch per
// interval; no checkpoint write. A source's heartbeatInterval overrides it.
//
// resync: resync on request (`relayd resync`, docs/OPERATIONS.md "Resync on
// request"):
//
//   - requesterInboxPrefixes (default ["_INBOX"]): the inbox prefixes of the
//     clients that send resync requests (their nats.inboxPrefix). relayd
//     answers a request only on a reply subject under one of them, never on
//     a subject under prefix, <prefix>-ctl or starting with "$" or one the
//     event stream captures, and
//     neither answers nor acts on a request with another reply subject
//     (counted, logged at most once a minute). Tokens as in prefix, outside
//     prefix and <prefix>-ctl. relayd's NATS user needs publish on
//     "<each>.>" (docs/DEPLOY.md, "NATS permissions").
//   - minFullInterval (default 5m, at least 1s): the least time between
//     two full resyncs of a source, from the start and from the
//     completion of the last (kept in memory per replica); a sooner --full
//     is refused, saying when the next is allowed. One resync of a source
//     runs at a time either way.
//
// sources (required, at least one), each:
//
//   - name (required, unique, a DNS-1123 label: lowercase letters, digits
//     and '-', at most 63): names the source in subjects, CloudEvents,
//     metrics and checkpoint keys.
//   - apiVersion + kind, or resource (exactly one of the two forms):
//     apiVersion is "v1" (core) or "group/version" ("apps/v1",
//     "example.com/v1"), kind is CamelCase ("Pod"); they are resolved
//     through discovery at start. resource is {group, version, resource}
//     with group "" (or left out) for the core group, version a DNS-1035
//     label ("v1", "v1beta1") and resource the lowercase plural
//     ("deployments"; subresources cannot be watched).
//   - namespaces (default: all namespaces, or the cluster for a
//     cluster-scoped kind): one watch (and checkpoint) per namespace; each a
//     DNS-1123 label, no duplicates.
//   - labelSelector, fieldSelector (default none): server-side selectors in
//     kubectl syntax ("app=web,tier!=db", "status.phase=Running").
//   - eventTypes (default all): a subset of added, modified, deleted, no
//     duplicates. Other events are dropped but still advance the checkpoint.
//   - payload (default full): full (the object; metadata.managedFields and
//     the last-applied annotation removed), metadata (apiVersion, kind and
//     the object's metadata, cut the same way) or reference (apiVersion,
//     kind, namespace, name, uid, resourceVersion).
//   - keepManagedFields (default false): keep metadata.managedFields.
//   - keepLastAppliedConfiguration (default false): keep the annotation
//     kubectl.kubernetes.io/last-applied-configuration, the whole object as
//     last applied with kubectl (a Secret's data, a ConfigMap's contents).
//     By default it is removed from full and metadata payloads; an object
//     left with no annotation shows "annotations":{}.
//   - allowSecretData (default false): allow, for a source of Secrets
//     (apiVersion v1 + kind Secret, or resource {group: "", resource:
//     secrets}), what publishes, fingerprints or evaluates their data:
//     payload full, keepLastAppliedConfiguration (the annotation holds the
//     whole Secret), keepManagedFields (managedFields names every data
//     key), ignoreChanges and changedPaths (relayd then reads whole Secrets
//     and stores fingerprints of them, data included, in the index bucket)
//     and filter (relayd then reads whole Secrets, and whether one is
//     published, enters or leaves scope tells something about its
//     values). Without it each is an error naming its key
//     (sources[i].payload, sources[i].keepLastAppliedConfiguration,
//     sources[i].keepManagedFields, sources[i].ignoreChanges,
//     sources[i].changedPaths, sources[i].filter); the schema states the
//     same rule. ignoreChanges and changedPaths on Secrets also need
//     nats.index.fingerprintKeyFile.
//   - drop (default none): field paths removed from every payload (full and
//     metadata), e.g. "spec.template.spec.containers[*].env" or
//     'metadata.annotations["example.com/token"]'. The syntax (package
//     event, ParsePath): member names joined by dots; [*] after a list for
//     every element; ["..."] for a name other than letters, digits, '_' and
//     '-' (annotation and label keys), with JSON escapes inside the quotes;
//     [N] is not supported (list positions are not stable identities). A
//     path through a value of another type, or to an absent member, removes
//     nothing. Paths selecting apiVersion, kind, metadata or
//     metadata.name, namespace, uid or resourceVersion are refused (they
//     identify the object); so are paths ending in [*] and duplicates. The
//     paths that removed something from an event are listed in its
//     relayddropped extension. A change in a dropped field still counts as a
//     change (list it in ignoreChanges too to suppress it): dropped fields
//     are fingerprinted (see index.fingerprintKeyFile).
//   - ignoreChanges (default none): field paths, same syntax, whose changes
//     do not count as a change of the object: they are left out of the
//     object's fingerprint (as are metadata.resourceVersion,
//     metadata.generation and metadata.managedFields), so a modification
//     confined to them publishes nothing (it is counted in
//     relayd_events_suppressed_total and moves the checkpoint on; added and
//     deleted are never suppressed). The fingerprint of the last published
//     version is kept in the object index and its bucket, so restarts and
//     relists after a 410 use it too (keyed with nats.index.fingerprintKeyFile,
//     required for Secrets). A metadata or reference source with
//     ignoreChanges reads whole objects (not PartialObjectMetadata): a
//     change outside the ignored paths, its data included, is still
//     published. Fine with any eventTypes.
//   - changedPaths (default none): up to 64 field paths, same syntax but
//     without [*], whose content relayd fingerprints one by one (64 bits
//     each, in the object index and its bucket): each modified event
//     carries relaydchanged, the paths whose content differs from the
//     version published before, and relaydchangedunknown, those for which
//     no earlier fingerprint is known (docs/CONSUMING.md, "What changed").
//     A metadata or reference source with changedPaths reads whole
//     objects. On Secrets it needs allowSecretData and
//     nats.index.fingerprintKeyFile.
//   - initial (default snapshot): without a checkpoint, snapshot publishes
//     every existing object first (origin "initial"); none starts from now.
//   - filter, filterOnError: filter is a CEL expression over object
//     (package filter), compiled and checked here (problems at
//     file:line:column inside the expression, an estimated cost over the
//     limit refused); only matching objects are relayed, and objects
//     entering or leaving it are published as such (docs/CONSUMING.md,
//     "Filters: entering and leaving scope"). filterOnError is include
//     (default: an evaluation error keeps the object in scope) or exclude,
//     and an error without filter. See docs/CONFIGURATION.md, "Filters".
//   - heartbeatInterval (default: the top-level heartbeatInterval; 0 = off,
//     else at least 1s): the heartbeat interval of this source's watches.
//
// # Errors
//
// Parse, Load and Validate report every problem at once, as a
// *ValidationError whose Problems each carry a file name, a line, a key
// path and a message. Each prints on its own line as
//
//	config.yaml:12: sources[2].namespaces[0]: "Web" is not a valid namespace name (must be a DNS-1123 label)
//
// The line is that of the offending key (for list items, of the item). For
// a missing key it is the line of the nearest enclosing key that is
// present, and there is none for a missing top-level key:
//
//	config.yaml:8: nats.stream.name: required
//	config.yaml: sources: at least one source is required
//
// Paths use the YAML key names, dots between keys and [i] for list items.
// Unknown keys are reported at their own path, with a suggestion when a
// known key is close ("sources[1].namespace: unknown key (did you mean
// "namespaces"?)"), otherwise with the list of valid keys. Problems with
// the file as a whole have no path ("config.yaml:3: invalid YAML: ...",
// "config.yaml: empty configuration file"). A Config built in Go has no
// file or lines: its problems print as "path: message".
//
// A URL is never printed with what may be credentials in it: RedactURL
// replaces everything between its scheme and the last '@' with "xxxxx",
// whatever the URL's shape ("nats://xxxxx@host:4222"; for a list with an
// '@', the servers before it are hidden too, since a password may hold a
// comma). RedactError does the same for connection errors.
//
// Config.Warnings lists what is accepted but worth a warning, in the same
// format ("config.yaml:9: nats.allowPlaintextCredentials: ...").
//
// Decoding problems (syntax, unknown or duplicate keys, wrong types) come
// first, in file order, followed by validation problems in key order.
// Validation problems that merely follow from a value that could not be
// decoded (e.g. "required" for a key whose value was a list) are left out.
//
// # How decoding works
//
// The document is first parsed into a yaml.Node tree and walked against
// the Config type, which yields the key paths, the line of every key and
// one problem per unknown key or bad value, instead of the yaml package's
// single flat error. When the walk finds nothing wrong, the document is
// decoded again with yaml.Decoder.KnownFields(true), the authority on what
// it means; defaults are then applied and the result is validated.
//
// # JSON Schema
//
// Schema derives a JSON Schema of the file from the Config structs (their
// yaml keys, `schema` tags and the SchemaDescriber method of custom
// scalars). `make schema` writes it to docs/config.schema.json, for
// editors, and into the Helm chart's values.schema.json as config; a test
// fails when either is stale. It checks less than Parse: what it cannot
// check is listed in docs/CONFIGURATION.md ("Editor and chart schema").
package config
