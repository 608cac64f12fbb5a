// Package checkpoint stores relayd's position in each watch — a
// resourceVersion per (source, namespace) — in one or more ConfigMaps, so
// that a restart or a fail-over resumes where relayd stopped
// (docs/GUARANTEES.md, "Delivery guarantees").
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
// # The ConfigMaps
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
// A key with its value takes about 185 bytes, and the apiserver refuses a
// ConfigMap over 1 MiB: one ConfigMap holds at most about 5,600 watches.
// The keys are therefore spread over Options.Shards ConfigMaps, named
// "<name>", "<name>-1", … ([ShardNames]); a key lives in the one [ShardOf]
// picks, FNV-1a of the key modulo the count, which depends on nothing but
// the key and the count. relayd derives the count from its config (one
// ConfigMap per checkpoint.watchesPerConfigMap watches, default
// [DefaultWatchesPerConfigMap]: about 92 KB each), so RBAC and deploy/ can
// name every ConfigMap in advance (the chart computes the same list). 10,000
// watches take 20 ConfigMaps; the layout's limit is the RBAC list and the
// number of writes per flush, not the size of one object. With one
// ConfigMap ("<name>" alone: up to 500 watches by default) the layout is
// exactly that of every relayd before sharding. Load also reads a key from a
// ConfigMap other than its own (the older one-ConfigMap layout, or another
// shard count) when its own lacks it; the next write of that key moves it
// (written to its own ConfigMap, then removed from the other one).
//
// A flush writes only the ConfigMaps that hold a changed key: one changed
// key rewrites one ConfigMap (92 KB), not the whole checkpoint
// (BenchmarkFlushBytes measures it).
//
// relayd's production RBAC grants only "get" and "update" on these
// ConfigMaps, by name (RBAC cannot restrict "create" to a name), so deploy/
// ships them empty; [Store.Load] creates one only where relayd may
// (development, tests) and otherwise says exactly what to do. Several
// replicas share the ConfigMaps, each owning the keys of the sources it
// leads: [Store.Flush] re-reads each ConfigMap it writes and sets only this
// store's changed keys, retrying on a resourceVersion conflict, so replicas
// never clobber each other's keys.
//
// The store's writes must not wait behind relayd's other requests: at
// 10,000 watches their discovery, lists and watches hold a shared
// client-side rate limiter for minutes, and every checkpoint write of that
// time would time out. [NewClient] gives the store a client with a limiter
// of its own ([QPS]).
// A value that is not a valid position stops [Store.Load] with an error
// naming the key: treating it as empty would silently re-snapshot a whole
// source, so the operator must fix or delete the key.
//
// # Write rate
//
// Advance only updates memory. [Store.Run] writes the changed keys at most
// once per FlushInterval (default 5s), all of them in one update per
// ConfigMap that holds one.
// Progress that comes only from watch bookmarks is written at most once per
// BookmarkPersistInterval (default 2m) per key: relayd's own write bumps the
// cluster's resourceVersion, which the next bookmark reports, so an idle
// cluster would otherwise be written to forever. Events of relayd's own
// checkpoint writes (when it watches ConfigMaps) do not move the position at
// all: the caller skips them, and the next bookmark moves past them.
// [Store.Flush] writes every changed key at once,
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
