// Package indexcheck is the index consistency check of the tests
// (relay.Options.IndexCheck; RELAYD_INDEX_CHECK=1 in a test build of
// relayd): a watch.RelistHook that, after every relist, compares the
// watch's object index with a consistent LIST at the relist's
// resourceVersion, and stops relayd on any difference. pkg/relay calls it
// only when given NewHook; the production engine (pkg/watch) knows it only
// as a hook. The shipped binary does not contain this package: cmd/relayd
// passes NewHook only when built with -tags testbuild (bin/relayd-test),
// and ignores EnvVar otherwise.
package indexcheck

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/relayd/relayd/internal/retry"
	"github.com/relayd/relayd/pkg/event"
	"github.com/relayd/relayd/pkg/index"
	"github.com/relayd/relayd/pkg/source"
	"github.com/relayd/relayd/pkg/watch"
)

// Bucket reads the object index's bucket back (an *index.Bucket).
type Bucket interface {
	Name() string
	Load(ctx context.Context, prefix string, x *index.Index) (index.Loaded, error)
}

// RESTClients gives the REST client of a resource's group/version.
type RESTClients interface {
	RESTClient(res event.Resource) (rest.Interface, error)
}

// Options are the check's dependencies, all required.
type Options struct {
	Bucket  Bucket
	Clients RESTClients
	// Self are relayd's own objects, left out of the list as the watches
	// leave them out of the index.
	Self watch.SelfFilter
	// Fail is told a difference; it stops relayd.
	Fail func(error)
}

// EnvVar turns the check on in a test build of relayd (-tags testbuild)
// when set to "1"; the shipped binary ignores it.
const EnvVar = "RELAYD_INDEX_CHECK"

// NewHook returns the check of the watches over the index bucket b, for
// relay.Options.IndexCheck (whose type, relay.IndexCheckFunc, it has).
func NewHook(b *index.Bucket, kube source.Clients, self watch.SelfFilter, fail func(error)) watch.RelistHook {
	return New(Options{Bucket: b, Clients: kube, Self: self, Fail: fail})
}

// Checker is the check, one for all watches.
type Checker struct{ o Options }

// New returns the check of o.
func New(o Options) *Checker { return &Checker{o: o} }

// AfterRelist checks the relist r (watch.RelistHook): a difference is
// passed to Options.Fail and returned (the watch stops).
func (c *Checker) AfterRelist(ctx context.Context, r watch.Relisted) error {
	if err := c.check(ctx, r); err != nil {
		err = fmt.Errorf("index consistency check failed for %s: %w", r.Watch, err)
		c.o.Fail(err)
		return err
	}
	return nil
}

// check compares the object index with a consistent LIST at exactly the
// relist's resourceVersion (the relist's resourceVersion): same uids, names and resourceVersions.
// Two indexes are compared: the bucket as read back from NATS, once every
// index write this watch submitted is acknowledged (what a restart would
// load: the one that matters), and the in-memory index. Each difference
// names the object, what the index has and what the list has, and is the
// only error returned (relayd stops on it). A check that cannot be made
// for now (the apiserver or NATS unreachable: the fault-injection suite
// kills them) is retried with backoff; one that can never be made (the
// list's resourceVersion compacted meanwhile, or relayd stopping) is
// logged as not made.
func (c *Checker) check(ctx context.Context, r watch.Relisted) error {
	rv := r.ResourceVersion
	backoff := retry.Check()
	failures := retry.NewFailures(r.Log, "index consistency check could not read the list or the bucket; retrying", retry.AtLevel(zapcore.WarnLevel))
	var found error // a difference: the check's result
	checked := retry.Until(ctx, backoff, failures, func(ctx context.Context) error {
		err := c.checkOnce(ctx, r)
		var bad *indexMismatchError
		switch {
		case errors.As(err, &bad):
			found = err
			return nil
		case err != nil && (apierrors.IsResourceExpired(err) || apierrors.IsGone(err)):
			r.Log.Warn("index consistency check not made: the list's resourceVersion was compacted", zap.String("resourceVersion", rv), zap.Error(err))
			return nil
		}
		return err
	}, zap.String("resourceVersion", rv))
	if !checked {
		r.Log.Warn("index consistency check not made: the watch is stopping", zap.String("resourceVersion", rv))
	}
	return found
}

// indexMismatchError is a difference found by check (or a list it
// cannot read at all): retrying cannot help.
type indexMismatchError struct{ msg string }

func (e *indexMismatchError) Error() string { return e.msg }

func mismatch(format string, args ...any) error {
	return &indexMismatchError{msg: fmt.Sprintf(format, args...)}
}

func (c *Checker) checkOnce(ctx context.Context, r watch.Relisted) error {
	rv := r.ResourceVersion
	// The hook runs on the watch goroutine, the only submitter of r.Pipe:
	// Drain is safe here, and afterwards the bucket holds every index
	// write made so far.
	if err := r.Pipe.Drain(ctx); err != nil {
		return fmt.Errorf("waiting for the index writes to be acknowledged: %w", err)
	}
	b := c.o.Bucket
	stored := index.New()
	if _, err := b.Load(ctx, r.IndexPrefix, stored); err != nil {
		return fmt.Errorf("reading the index bucket %q back (keys %s.*): %w", b.Name(), r.IndexPrefix, err)
	}
	listed, err := c.listAt(ctx, r)
	if err != nil {
		return err
	}
	for _, ix := range []struct {
		name string
		x    *index.Index
	}{{fmt.Sprintf("the index bucket %q", b.Name()), stored}, {"the in-memory index", r.Index}} {
		if err := compareIndex(ix.name, ix.x, listed, rv, r.Fingerprinter != nil); err != nil {
			return err
		}
	}
	r.Log.Info("index consistency check passed (bucket and memory)", zap.String("resourceVersion", rv), zap.String("objects", strconv.Itoa(len(listed))))
	return nil
}

// listedObject is one object of check's LIST.
type listedObject struct {
	meta        event.Meta
	fingerprint uint64 // with ignoreChanges
}

// listAt lists the relist's objects at exactly its resourceVersion
// (relayd's own objects left out).
func (c *Checker) listAt(ctx context.Context, r watch.Relisted) ([]listedObject, error) {
	rv := r.ResourceVersion
	client, err := c.o.Clients.RESTClient(r.Resource)
	if err != nil {
		return nil, err
	}
	var out []listedObject
	cont := ""
	for {
		req := client.Get().Resource(r.Resource.Resource).
			Param("resourceVersion", rv).Param("resourceVersionMatch", string(metav1.ResourceVersionMatchExact)).
			Param("limit", "500")
		if r.Namespace != "" {
			req = req.Namespace(r.Namespace)
		}
		if r.Source.LabelSelector != "" {
			req = req.Param("labelSelector", r.Source.LabelSelector)
		}
		if r.Source.FieldSelector != "" {
			req = req.Param("fieldSelector", r.Source.FieldSelector)
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
			o, err := event.ParseObjectShaped(raw, r.Shaping)
			if err != nil {
				return nil, mismatch("list at resourceVersion %s: cannot parse an object: %v", rv, err)
			}
			if c.o.Self.IsSelf(r.Resource, &o.Meta) {
				continue
			}
			if in, _ := r.Scope.In(raw); !in {
				continue // the index holds the filter's scope only
			}
			l := listedObject{meta: o.Meta}
			if r.Fingerprinter != nil {
				l.fingerprint = r.Fingerprinter.Fingerprint(&o)
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
