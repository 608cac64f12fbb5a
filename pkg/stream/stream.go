// Package stream makes sure the JetStream stream relayd publishes to exists
// and captures relayd's subjects, without ever changing what relayd did not
// set: a stream is often shared (several clusters, other publishers) or
// managed elsewhere (GitOps), and its limits are its administrator's.
//
// With nats.stream.create a missing stream is created with the configured
// settings; an existing one only gets "<prefix>.<cluster>.>" added to its
// subjects, and only when none of them captures it. That update rewrites
// "subjects" and nothing else: relayd takes the stream's configuration as
// the server's own JSON (STREAM.INFO, under the configured domain's API
// prefix) and sends it back with only "subjects" changed (STREAM.UPDATE), so
// that settings nats.go does not model (a server newer than relayd's client
// library) are kept as they are, byte for byte. Settings of an existing
// stream that differ from the configuration are reported as warnings; the
// few that break relayd's guarantees (a duplicate window under a minute, a
// sealed stream or a mirror, which relayd does not update either, or
// subjects that do not capture relayd's when it may not add them) are a
// Blocker: relayd stays unready with that reason. So does a
// replicated stream without a leader (its JetStream cluster lost quorum):
// nothing can be stored, and relayd waits, holding its checkpoints. See
// docs/GUARANTEES.md, "The stream: relayd never clobbers it".
package stream

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/internal/retry"
	"github.com/relayd/relayd/pkg/config"
)

// MinDuplicateWindow is the shortest duplicate window relayd accepts: below
// it, the republish after a restart or a leader change is stored twice.
const MinDuplicateWindow = time.Minute

// Want is what relayd needs of the stream, and the settings of a stream it
// creates.
type Want struct {
	Name    string
	Subject string // "<prefix>.<cluster>.>"
	// Create allows creating the stream and adding Subject to it.
	Create          bool
	DuplicateWindow time.Duration
	Replicas        int
	Storage         jetstream.StorageType
	MaxAge          time.Duration
	MaxBytes        int64 // -1: unlimited
}

// Config is the configuration of a stream relayd creates: discard "new",
// so that a full stream stalls relayd instead of dropping events.
func (w Want) Config() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        w.Name,
		Description: "relayd: Kubernetes object changes as CloudEvents",
		Subjects:    []string{w.Subject},
		Storage:     w.Storage,
		Replicas:    max(w.Replicas, 1),
		Duplicates:  w.DuplicateWindow,
		MaxAge:      w.MaxAge,
		MaxBytes:    w.MaxBytes,
		Discard:     jetstream.DiscardNew,
	}
}

// Plan is what relayd makes of a stream that exists.
type Plan struct {
	// AddSubject: update the stream with Want.Subject added to its subjects
	// (nothing else changes).
	AddSubject bool
	// Warnings name each setting that differs from the configuration: the
	// field, the value found and the value configured.
	Warnings []string
	// Blocker, when set, is why relayd must not be ready with this stream.
	Blocker string
}

// Check plans what to do with the stream found (pure: no I/O).
func Check(found jetstream.StreamConfig, w Want) Plan {
	var p Plan
	if !slices.ContainsFunc(found.Subjects, func(s string) bool { return Captures(s, w.Subject) }) {
		if w.Create {
			p.AddSubject = true
		} else {
			p.Blocker = fmt.Sprintf("stream %s has subjects %q, none of which captures relayd's %q (nats.stream.create is false: add it to the stream, or let relayd add it with create: true)",
				w.Name, found.Subjects, w.Subject)
		}
	}
	// Neither a sealed stream nor a mirror can store relayd's messages:
	// relayd does not add its subject to them either.
	if found.Sealed {
		p.AddSubject = false
		p.Blocker = fmt.Sprintf("stream %s is sealed: it takes no messages (point nats.stream.name at another stream)", w.Name)
	}
	if found.Mirror != nil {
		p.AddSubject = false
		p.Blocker = fmt.Sprintf("stream %s is a mirror of %s: it cannot be published to (point nats.stream.name at the origin stream)", w.Name, found.Mirror.Name)
	}
	switch {
	case found.Duplicates < MinDuplicateWindow:
		p.Blocker = join(p.Blocker, fmt.Sprintf("stream %s has a duplicate window of %s, under %s: events republished after a restart or a leader change would be stored twice (raise it to at least nats.stream.duplicateWindow, %s)",
			w.Name, dur(found.Duplicates), dur(MinDuplicateWindow), dur(w.DuplicateWindow)))
	case found.Duplicates < w.DuplicateWindow:
		p.Warnings = append(p.Warnings, differs("duplicateWindow", dur(found.Duplicates), dur(w.DuplicateWindow),
			"a restart longer than the window may store a republished event twice"))
	}
	if found.Discard == jetstream.DiscardOld {
		p.Warnings = append(p.Warnings, differs("discard", "old", "new",
			"a full stream drops its oldest events to make room, so consumers that are behind lose them; with new, relayd stalls instead"))
	}
	if found.MaxAge <= 0 && found.MaxBytes <= 0 && found.MaxMsgs <= 0 {
		p.Warnings = append(p.Warnings, fmt.Sprintf("stream %s has no limits (maxAge, maxBytes and maxMsgs unlimited): it grows until the server refuses writes, then relayd stalls (relayd creates streams with maxAge %s)", w.Name, dur(w.MaxAge)))
	} else if found.MaxAge != w.MaxAge {
		p.Warnings = append(p.Warnings, differs("maxAge", dur(found.MaxAge), dur(w.MaxAge),
			"a consumer down longer than the stream's maxAge misses the messages that expired"))
	}
	if found.MaxBytes != w.MaxBytes {
		p.Warnings = append(p.Warnings, differs("maxBytes", fmt.Sprint(found.MaxBytes), fmt.Sprint(w.MaxBytes), ""))
	}
	if found.Replicas != max(w.Replicas, 1) {
		p.Warnings = append(p.Warnings, differs("replicas", fmt.Sprint(found.Replicas), fmt.Sprint(w.Replicas), ""))
	}
	if found.Storage != w.Storage {
		p.Warnings = append(p.Warnings, differs("storage", found.Storage.String(), w.Storage.String(), ""))
	}
	for i := range p.Warnings {
		if !strings.HasPrefix(p.Warnings[i], "stream ") {
			p.Warnings[i] = "stream " + w.Name + ": " + p.Warnings[i]
		}
	}
	return p
}

func differs(field, found, configured, why string) string {
	s := fmt.Sprintf("%s is %s, nats.stream.%s is %s (left as found)", field, found, field, configured)
	if why != "" {
		s += ": " + why
	}
	return s
}

// dur formats d as the config does: "72h", not "72h0m0s".
func dur(d time.Duration) string { return config.Duration(d).String() }

func join(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// Leaderless says why a replicated stream cannot store anything when its
// info (which a member answers even without a leader) shows no leader: the
// JetStream cluster lost quorum or is electing one. "" otherwise.
func Leaderless(info *jetstream.StreamInfo) string {
	if info == nil || info.Cluster == nil || info.Config.Replicas <= 1 || info.Cluster.Leader != "" {
		return ""
	}
	return fmt.Sprintf("stream %s (%d replicas) has no leader: its JetStream cluster %q lost quorum or is electing one; publishes wait, nothing is lost",
		info.Config.Name, info.Config.Replicas, info.Cluster.Name)
}

// Captures reports whether every subject that matches pattern also matches
// streamSubject, i.e. a stream with streamSubject stores every message
// published on pattern. Both may hold the wildcards "*" and ">".
func Captures(streamSubject, pattern string) bool {
	s, p := strings.Split(streamSubject, "."), strings.Split(pattern, ".")
	for i, pt := range p {
		if i >= len(s) {
			return false
		}
		switch st := s[i]; {
		case st == ">":
			return true
		case pt == ">":
			return false // p matches any number of tokens here; s only a fixed number
		case st == "*":
		case st != pt:
			return false
		}
	}
	return len(s) == len(p)
}

// Result is what Ensure did and found.
type Result struct {
	Created, Updated bool
	Plan
	// Found is the stream's configuration after Ensure.
	Found jetstream.StreamConfig
}

// ErrNotFound is returned by Ensure when the stream does not exist and
// Want.Create is false.
var ErrNotFound = errors.New("stream not found")

// Ensure looks the stream up; creates it when missing (Want.Create); adds
// Want.Subject to an existing stream that does not capture it
// (Want.Create), changing nothing else of it (the server's JSON with only
// "subjects" changed, see the package doc); and returns the plan of the
// stream as it then is.
//
// Two relayd instances adding their subjects to one stream at the same
// moment may overwrite each other's update (JetStream has no conditional
// update): Ensure reads the stream again after its update, and callers call
// it periodically, so a lost subject is added back.
func Ensure(ctx context.Context, js jetstream.JetStream, w Want) (Result, error) {
	var res Result
	s, err := js.Stream(ctx, w.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		if !w.Create {
			return res, fmt.Errorf("%w: %s (nats.stream.create is false: create it with subjects %q, or set create: true)", ErrNotFound, w.Name, w.Subject)
		}
		s, err = js.CreateStream(ctx, w.Config())
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			s, err = js.Stream(ctx, w.Name) // created meanwhile by another instance
		} else if err == nil {
			res.Created = true
		}
	}
	if err != nil {
		return res, fmt.Errorf("stream %s: %w", w.Name, err)
	}
	for attempt := 0; ; attempt++ {
		info := s.CachedInfo()
		found := info.Config
		res.Found, res.Plan = found, Check(found, w)
		if !res.AddSubject {
			res.Blocker = join(res.Blocker, Leaderless(info))
			return res, nil
		}
		if attempt == 3 {
			res.Blocker = join(res.Blocker, fmt.Sprintf("stream %s: relayd's subject %q was added but is gone again (another client keeps replacing the stream's subjects)", w.Name, w.Subject))
			return res, nil
		}
		updated, err := addSubject(ctx, js, w.Name, w.Subject)
		if err != nil {
			return res, fmt.Errorf("stream %s: add subject %q: %w", w.Name, w.Subject, err)
		}
		res.Updated = res.Updated || updated
		// Read it back: another instance's concurrent update may have
		// replaced ours.
		if !retry.Sleep(ctx, time.Duration(100+attempt*200)*time.Millisecond) {
			return res, ctx.Err()
		}
		if s, err = js.Stream(ctx, w.Name); err != nil {
			return res, fmt.Errorf("stream %s: %w", w.Name, err)
		}
	}
}
