package shard

import (
	"encoding/json"
	"hash/fnv"
	"sort"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
)

// MembersAnnotation is the Lease annotation that carries the replicas'
// heartbeats: a JSON object from identity to {"time": RFC 3339 timestamp,
// "left": true when the replica has stopped}.
const MembersAnnotation = "relayd.io/shard-members"

// heartbeat is one replica's entry in [MembersAnnotation].
type heartbeat struct {
	// Time is when the replica wrote the entry, by its own clock. Only the
	// replica itself writes its entry, and it keeps Time strictly
	// increasing, so observers compare it only with earlier values of the
	// same entry, never with their own clock.
	Time time.Time `json:"time"`
	// Left is set by a replica that is stopping: it no longer counts as a
	// member.
	Left bool `json:"left,omitempty"`
}

// decodeMembers reads the annotation of l; a missing annotation is empty.
func decodeMembers(l *coordinationv1.Lease) (map[string]heartbeat, error) {
	v, ok := l.Annotations[MembersAnnotation]
	if !ok || v == "" {
		return map[string]heartbeat{}, nil
	}
	m := map[string]heartbeat{}
	if err := json.Unmarshal([]byte(v), &m); err != nil {
		return map[string]heartbeat{}, err
	}
	return m, nil
}

// encodeMembers is the annotation value for m (keys sorted by encoding/json).
func encodeMembers(m map[string]heartbeat) string {
	b, err := json.Marshal(m)
	if err != nil { // cannot happen: strings and times only
		panic(err)
	}
	return string(b)
}

// member is what one replica knows about another.
type member struct {
	last   heartbeat // newest heartbeat seen on any Lease
	seenAt time.Time // local time when last advanced (or was first seen)
}

func (m *member) alive(now time.Time, ttl time.Duration) bool {
	return !m.last.Left && now.Sub(m.seenAt) < ttl
}

// observeHeartbeat records hb of member id, seen at now.
func observeHeartbeat(members map[string]*member, id string, hb heartbeat, now time.Time) {
	m := members[id]
	if m == nil {
		members[id] = &member{last: hb, seenAt: now}
		return
	}
	if hb.Time.After(m.last.Time) {
		m.last = hb
		m.seenAt = now
	}
}

// quota is the number of sources that me should hold when members (which
// includes me) are alive: members sorted by identity, each gets
// sources/len(members), the first sources%len(members) one more.
func quota(members []string, me string, sources int) int {
	ids := append([]string(nil), members...)
	sort.Strings(ids)
	n := len(ids)
	if n == 0 {
		return 0
	}
	i := sort.SearchStrings(ids, me)
	if i == n || ids[i] != me {
		return 0
	}
	q := sources / n
	if i < sources%n {
		q++
	}
	return q
}

// preference orders sources for one identity (rendezvous hashing): a
// replica acquires the free source it prefers most and hands over the one it
// prefers least, so replicas looking for work spread over different Leases.
func preference(identity, source string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(identity))
	h.Write([]byte{0})
	h.Write([]byte(source))
	return h.Sum64()
}

// hashIndex picks the Lease (index into n) on which a replica that holds no
// Lease writes its heartbeat.
func hashIndex(identity string, n int) int {
	h := fnv.New32a()
	h.Write([]byte(identity))
	return int(h.Sum32() % uint32(n))
}
