// Package checkpoint stores relayd's position in each watch — a
// resourceVersion per (source, namespace) — in one ConfigMap, so that a
// restart or a fail-over resumes where relayd stopped (docs/GUARANTEES.md, "Delivery guarantees").
//
// # The invariant
//
// The stored resourceVersion of a watch is never ahead of the newest event of
// that watch whose publish, and every earlier publish in the same watch, was
// acknowledged by JetStream. This package keeps the invariant by construction
// and relies on one rule for its caller:
//
//   - The caller only calls [Store.Advance] with a position whose event and
//     all earlier events of that watch are acked (the contiguous acked
//     watermark), or with a bookmark's resourceVersion while nothing of that
//     watch is in flight.
//   - The store never invents a position: it writes exactly the positions it
//     was given (or leaves the stored one in place), never derives, guesses,
//     increments or orders resourceVersions, and never writes a position for
//     a key nobody advanced. resourceVersions are opaque strings compared only
//     for equality.
//
// Writes lag behind Advance (they are coalesced, see below), which only makes
// the stored position older, never newer; an older position means replays
// that JetStream drops as duplicates, not loss.
//
// # The ConfigMap
//
// One data key per watch ([Key]): "<source>" for an all-namespaces or
// cluster-scoped watch, "<source>.<namespace>" for a per-namespace watch. The
// value is the [Position] as compact JSON followed by the format version
// "v" ([FormatVersion]), for example
//
//	{"resourceVersion":"48213","epoch":2,"updated":"2026-11-23T10:15:02.123Z","index":{"generation":"2026-11-23T09:00:00.5Z","seq":812},"streamSeq":4410,"v":1}
//
// A value without "v" was written by an older relayd in the same layout; one
// with a higher "v" stops [Store.Load] with an error naming the key and the
// version. testdata/golden holds every form this version reads and the
// bytes it writes (docs/DEPLOY.md, "Upgrade and rollback: formats").
//
// relayd's production RBAC grants only "get" and "update" on this one
// ConfigMap (RBAC cannot restrict "create" to a name), so deploy/ ships it
// empty; [Store.Load] creates it only where relayd may (development,
// tests) and otherwise says exactly what to do. Several replicas share the
// ConfigMap, each owning the keys of the sources it leads: [Store.Flush]
// re-reads the ConfigMap and sets only this store's changed keys, retrying on
// a resourceVersion conflict, so replicas never clobber each other's keys.
// A value that is not a valid position stops [Store.Load] with an error
// naming the key: treating it as empty would silently re-snapshot a whole
// source, so the operator must fix or delete the key.
//
// # Write rate
//
// Advance only updates memory. [Store.Run] writes the changed keys at most
// once per FlushInterval (default 5s), all of them in one ConfigMap update.
// Progress that comes only from watch bookmarks is written at most once per
// BookmarkPersistInterval (default 2m) per key: relayd's own write bumps the
// cluster's resourceVersion, which the next bookmark reports, so an idle
// cluster would otherwise be written to forever. The same applies to events
// relayd filters out because they are its own checkpoint writes (when it
// watches ConfigMaps): the caller should advance past them with
// bookmarkOnly=true. [Store.Flush] writes every changed key at once,
// bookmark-only progress included; the owner calls it once more on shutdown,
// after draining in-flight publishes.
//
// # Ownership hand-over
//
// A store writes every key it has advanced and not yet written. The caller
// must therefore stop advancing a key and Flush before it gives up the
// source's Lease, and should call Load again after acquiring one, so that it
// resumes from the previous owner's position rather than from the one this
// store read at start.
package checkpoint
