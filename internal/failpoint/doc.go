// Package failpoint marks the dangerous points of relayd's data path so that
// the reliability suite can crash, panic or stall relayd exactly there.
//
// Without the build tag "failpoints" Inject is an empty function that the
// compiler inlines away: the shipped binary has no failpoints. A binary built
// with -tags failpoints reads RELAYD_FAILPOINTS at start, a ';'-separated
// list of
//
//	<name>=<action>[,n=<hit>][,p=<probability>]
//
// where action is "kill" (SIGKILL the own process: a crash with no cleanup),
// "panic", or "sleep:<duration>"; n=<hit> fires once, on the hit-th time the
// point is reached (1-based); p=<probability> fires on each hit with that
// probability. Without n or p it fires on every hit. Example:
//
//	RELAYD_FAILPOINTS='sink-after-ack=kill,n=30;relay-handle=panic,n=5'
//
// The points (see Points) are named after where they sit.
package failpoint

// Points are the failpoint names relayd's code injects.
var Points = []string{
	SinkAfterPublish, SinkAfterAck, CheckpointBeforeWrite, CheckpointAfterWrite, RelayHandle,
}

// Failpoint names.
const (
	// SinkAfterPublish: a message was handed to NATS, its ack not yet seen.
	SinkAfterPublish = "sink-after-publish"
	// SinkAfterAck: an entry is fully acked, the watermark not yet advanced
	// (so the checkpoint cannot have it).
	SinkAfterAck = "sink-after-ack"
	// CheckpointBeforeWrite: the checkpoint ConfigMap update is about to be
	// sent.
	CheckpointBeforeWrite = "checkpoint-before-write"
	// CheckpointAfterWrite: the update was accepted by the apiserver, the
	// store has not yet recorded it as persisted.
	CheckpointAfterWrite = "checkpoint-after-write"
	// RelayHandle: a watch item is about to be handled (a panic here tests
	// the supervisor's recovery).
	RelayHandle = "relay-handle"
)
