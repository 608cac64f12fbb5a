package watch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/relayd/relayd/internal/retry"
	"github.com/relayd/relayd/pkg/event"
	"github.com/relayd/relayd/pkg/index"
	"github.com/relayd/relayd/pkg/source"
)

// checkIndex compares the object index with a consistent LIST at exactly
// rv (the relist's resourceVersion): same uids, names and resourceVersions.
// Two indexes are compared: the bucket as read back from NATS, once every
// index write this watch submitted is acknowledged (what a restart would
// load: the one that matters), and the in-memory index. Each difference
// names the object, what the index has and what the list has, and is the
// only error returned (relayd stops on it). A check that cannot be made
// for now (the apiserver or NATS unreachable: the fault-injection suite
// kills them) is retried with backoff; one that can never be made (the
// list's resourceVersion compacted meanwhile, or relayd stopping) is
// logged as not made.
func (w *Watch) checkIndex(ctx context.Context, rv string) error {
	backoff := wait.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: 1 << 30, Cap: 5 * time.Second}
	failures := retry.NewFailures(w.log, "index consistency check could not read the list or the bucket; retrying", retry.AtLevel(zapcore.WarnLevel))
	var found error // a difference: the check's result
	checked := retry.Until(ctx, backoff, failures, func(ctx context.Context) error {
		err := w.checkIndexOnce(ctx, rv)
		var bad *indexMismatchError
		switch {
		case errors.As(err, &bad):
			found = err
			return nil
		case err != nil && (apierrors.IsResourceExpired(err) || apierrors.IsGone(err)):
			w.log.Warn("index consistency check not made: the list's resourceVersion was compacted", zap.String("resourceVersion", rv), zap.Error(err))
			return nil
		}
		return err
	}, zap.String("resourceVersion", rv))
	if !checked {
		w.log.Warn("index consistency check not made: the watch is stopping", zap.String("resourceVersion", rv))
	}
	return found
}

// indexMismatchError is a difference found by checkIndex (or a list it
// cannot read at all): retrying cannot help.
type indexMismatchError struct{ msg string }

func (e *indexMismatchError) Error() string { return e.msg }

func mismatch(format string, args ...any) error {
	return &indexMismatchError{msg: fmt.Sprintf(format, args...)}
}

func (w *Watch) checkIndexOnce(ctx context.Context, rv string) error {
	// The watch goroutine is the only submitter of w.pipe: Drain is safe
	// here, and afterwards the bucket holds every index write made so far.
	if err := w.o.Pipe.Drain(ctx); err != nil {
		return fmt.Errorf("waiting for the index writes to be acknowledged: %w", err)
	}
	b := w.o.Bucket()
	stored := index.New()
	if _, err := b.Load(ctx, w.ix.prefix, stored); err != nil {
		return fmt.Errorf("reading the index bucket %q back (keys %s.*): %w", b.Name(), w.ix.prefix, err)
	}
	listed, err := w.listAt(ctx, rv)
	if err != nil {
		return err
	}
	for _, ix := range []struct {
		name string
		x    *index.Index
	}{{fmt.Sprintf("the index bucket %q", b.Name()), stored}, {"the in-memory index", w.ix.idx}} {
		if err := compareIndex(ix.name, ix.x, listed, rv, w.fp != nil); err != nil {
			return err
		}
	}
	w.log.Info("index consistency check passed (bucket and memory)", zap.String("resourceVersion", rv), zap.String("objects", strconv.Itoa(len(listed))))
	return nil
}

// listedObject is one object of checkIndex's LIST.
type listedObject struct {
	meta        event.Meta
	fingerprint uint64 // with ignoreChanges
}

// listAt lists w's objects at exactly rv (relayd's own objects left out).
func (w *Watch) listAt(ctx context.Context, rv string) ([]listedObject, error) {
	client, err := w.o.RestClient(w.resource)
	if err != nil {
		return nil, err
	}
	var out []listedObject
	cont := ""
	for {
		req := client.Get().Resource(w.resource.Resource).
			Param("resourceVersion", rv).Param("resourceVersionMatch", string(metav1.ResourceVersionMatchExact)).
			Param("limit", "500")
		if w.o.Namespace != "" {
			req = req.Namespace(w.o.Namespace)
		}
		if w.o.Source.LabelSelector != "" {
			req = req.Param("labelSelector", w.o.Source.LabelSelector)
		}
		if w.o.Source.FieldSelector != "" {
			req = req.Param("fieldSelector", w.o.Source.FieldSelector)
		}
		if cont != "" {
			req = req.Param("continue", cont)
		}
		body, err := source.RawResult(req.Do(ctx))
		if err != nil {
			return nil, fmt.Errorf("list at resourceVersion %s: %w", rv, err)
		}
		var page struct {
			Metadata metav1.ListMeta   `json:"metadata"`
			Items    []json.RawMessage `json:"items"`
		}
		if err := json.Unmarshal(body, &page); err != nil {
			return nil, mismatch("list at resourceVersion %s: cannot decode it: %v", rv, err)
		}
		for _, raw := range page.Items {
			o, err := event.ParseObjectShaped(raw, w.o.Shaping)
			if err != nil {
				return nil, mismatch("list at resourceVersion %s: cannot parse an object: %v", rv, err)
			}
			if w.o.IsSelf(w.resource, &o.Meta) {
				continue
			}
			l := listedObject{meta: o.Meta}
			if w.fp != nil {
				l.fingerprint = w.fp.Fingerprint(&o)
			}
			out = append(out, l)
		}
		if cont = page.Metadata.Continue; cont == "" {
			return out, nil
		}
	}
}

// compareIndex checks index x (called name in errors) against listed.
func compareIndex(name string, x *index.Index, listed []listedObject, rv string, fingerprint bool) error {
	for _, l := range listed {
		m := &l.meta
		got, ok := x.Get(m.UID)
		if !ok {
			return mismatch("%s/%s (uid %s): %s does not have it; the list at %s has it at resourceVersion %s",
				m.Namespace, m.Name, m.UID, name, rv, m.ResourceVersion)
		}
		// With ignoreChanges the index keeps the published version of
		// an object that since changed only in ignored fields.
		sameContent := fingerprint && got.Fingerprint != 0 && got.Fingerprint == l.fingerprint
		if (got.ResourceVersion != m.ResourceVersion && !sameContent) || got.Name != m.Name || got.Namespace != m.Namespace {
			return mismatch("%s/%s (uid %s): %s has %s/%s at resourceVersion %s; the list at %s has %s/%s at resourceVersion %s",
				m.Namespace, m.Name, m.UID, name, got.Namespace, got.Name, got.ResourceVersion, rv, m.Namespace, m.Name, m.ResourceVersion)
		}
	}
	if n := x.Len(); n != len(listed) {
		in := make(map[string]bool, len(listed))
		for _, l := range listed {
			in[l.meta.UID] = true
		}
		var extra []string
		x.Range(func(o index.Object) bool {
			if !in[o.UID] {
				extra = append(extra, fmt.Sprintf("%s/%s (uid %s) at resourceVersion %s", o.Namespace, o.Name, o.UID, o.ResourceVersion))
			}
			return len(extra) < 10
		})
		return mismatch("%s has %d objects, the list at %s has %d: not in the list: %s", name, n, rv, len(listed), strings.Join(extra, ", "))
	}
	return nil
}
