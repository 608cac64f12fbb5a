// Package shard spreads relayd's sources over its replicas with one
// coordination.k8s.io/v1 Lease per source (docs/DEPLOY.md, "High availability and sharding").
//
// A [Sharder] runs a source (Options.Run) only while its replica holds the
// source's Lease, hands sources over gracefully when the replica stops or
// holds more than its share, and takes over the sources of a replica that
// died. One replica holding all Leases is plain leader election.
//
// # Leases and RBAC
//
// Every source has its own Lease, "<prefix>-<source>" (prefix default
// "relayd", see [LeaseName]), in one namespace. relayd may only get and
// update these Leases by name: RBAC cannot restrict "create" to a name, so
// the Leases are pre-created by the deployment manifests (empty spec) and a
// missing one is an error naming it. [Sharder.Run] checks at start that
// every Lease exists and that relayd may get and update it (a dry-run
// update), and returns one error listing every problem. Leases are never
// listed or watched.
//
// The Lease spec is written exactly like client-go's leader election writes
// it (resourcelock.LeaderElectionRecord): holderIdentity, leaseDurationSeconds,
// acquireTime, renewTime, leaseTransitions, and on release an empty
// holderIdentity with leaseDurationSeconds 1. kubectl and any tool that
// understands leader-election Leases read them as usual.
//
// # Exclusivity
//
// Expiry is judged the way client-go judges it, by the observer's own clock:
// a replica may take a Lease held by another identity only once it has seen
// the same record (holder, renewTime, ...) unchanged for LeaseDuration (or the
// record's leaseDurationSeconds, whichever is longer) since it first saw
// that record. Every write is an optimistic-concurrency update (the
// resourceVersion of the object just read), so two replicas never both win
// one Lease; a 409 Conflict is normal (a renewal reads the Lease again and
// retries at once, anything else is retried a period later).
//
// The holder renews each held Lease every RetryPeriod. A per-source watchdog
// cancels the source's context when no renewal has succeeded for
// RenewDeadline, measured from the moment the last successful renewal
// request was sent. Any other replica saw that renewal no earlier than it was
// sent, so it cannot start the source before LeaseDuration has passed since
// then: the old holder's Run has LeaseDuration − RenewDeadline (5s with the
// defaults) to return after its context is cancelled. Run must honour its
// context promptly; a Run still running after that time is logged as an
// error, because another replica may already be running the source.
//
// Clock skew: replicas never compare their wall clocks with one another
// (renewTime and the heartbeat times are written for people, and a
// heartbeat time is only compared with earlier ones of the same replica), so
// an offset between the nodes' clocks does not matter. Durations are
// measured on each process's monotonic clock; the argument above needs those
// clocks to run at about the same rate, and the margin LeaseDuration −
// RenewDeadline absorbs any realistic difference (NTP-disciplined clocks
// differ by parts per million). A process that is frozen while it holds a
// Lease (a paused VM, SIGSTOP, a very long GC pause) cannot notice that it
// lost the Lease until it runs again, and may publish a few events of a
// source that another replica has taken over by then; as with any lease,
// JetStream's duplicate window (deterministic Nats-Msg-Id) absorbs those
// replays.
//
// # Graceful hand-over
//
// When a replica stops (its context is cancelled, e.g. on SIGTERM) or hands a
// source over while rebalancing, it cancels the source, keeps renewing the
// Lease while Run drains, and releases the Lease only after Run has
// returned. This is why the package does not use ReleaseOnCancel of
// client-go's leaderelection (see below). A released Lease is free: another
// replica takes it at its next poll, within about one RetryPeriod.
//
// # Membership and fair share
//
// A replica learns who else is alive from the Leases alone. Every write a
// replica makes to a Lease (acquire, renew, release) also records its
// heartbeat in the annotation [MembersAnnotation]:
//
//	relayd.io/shard-members: {"relayd-7c9f-2xkq":{"time":"2026-11-23T10:15:02.123456789Z"},
//	                          "relayd-7c9f-8bz4":{"time":"2026-11-23T10:15:01.9Z","left":true}}
//
// A replica that holds no Lease writes its heartbeat (annotation only) to one
// Lease, chosen by a hash of its identity, every max(RetryPeriod,
// LeaseDuration/3). A member is alive while the newest heartbeat seen for it
// on any Lease (newest by that member's own clock, which only it writes)
// advanced within the last LeaseDuration of the observer's clock, and it has
// not left: a replica that stops marks every write it makes from then on with
// "left", so the others stop counting it at once instead of after
// LeaseDuration. Entries of members dead for LeaseDuration are pruned by the
// next write to that Lease.
//
// The share is deterministic: the alive members (including itself) sorted by
// identity, with S sources and N members, each member gets S/N sources and
// the first S mod N members one more, so the shares add up to S and every
// replica holds floor(S/N) or ceil(S/N) once balanced. A replica over its
// share hands over the excess gracefully; a replica under its share acquires
// free, released or expired Leases. Which sources move is decided by a
// per-replica preference (a hash of identity and source, rendezvous style):
// a replica acquires the free Leases it prefers most and gives up the ones
// it prefers least, so that two replicas looking for work seldom race for
// the same Lease. Replicas whose views differ for a moment (a member just
// joined or died) may move a source once more than needed; they never run it
// twice, because exclusivity does not depend on the views.
//
// A starting replica writes its heartbeat and then waits two RetryPeriods
// before it acquires anything, so that replicas started together see each
// other first rather than one of them grabbing every Lease and handing most
// of them back. It counts every member it finds in the annotations as alive
// until it has seen that member's heartbeat stand still for LeaseDuration.
//
// # Load on the apiserver
//
// Every replica reads each Lease it does not hold once per RetryPeriod; the
// holder renews it (an UPDATE, whose response is also a read) once per
// RetryPeriod; a replica that holds nothing writes one heartbeat per
// max(RetryPeriod, LeaseDuration/3). With N replicas and S sources that is
// (N−1)·S GETs and S UPDATEs per RetryPeriod: with the defaults, 3 replicas
// and 10 sources, 10 GETs and 5 UPDATEs a second. Each request is bounded by
// RenewDeadline/2.
//
// # Why not client-go's LeaderElector
//
// The Lease record format is client-go's, but the acquire/renew/release loop
// is this package's own, because LeaderElector cannot give the guarantees
// above: with ReleaseOnCancel it releases the Lease in renew() before the
// OnStartedLeading goroutine has returned (two replicas could run a source
// at once during a hand-over); it cancels the leader's context only
// RetryPeriod + RenewDeadline after the last renewal, not RenewDeadline; it
// creates a missing Lease (relayd may not) and only logs failures, so a
// missing Lease or a Forbidden never reaches the caller; it cannot be told
// to stop competing for a Lease once this replica has its share, and an
// elector started later must first watch a Lease for a whole LeaseDuration,
// which would double the take-over time; and it cannot carry the membership
// heartbeat.
package shard
