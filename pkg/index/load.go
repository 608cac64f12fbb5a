package index

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// loadOf is one Load call: the prefix to load into x.
type loadOf struct {
	prefix string
	x      *Index
}

// loaded is one Load call's result.
type loaded struct {
	l   Loaded
	err error
}

// epochRead is an epoch a shared Load read for Epoch.
type epochRead struct {
	n   uint64
	ok  bool // the bucket has the key
	err error
}

// prefixFilters is how many prefixes of one source a shared Load reads
// key by key; with more, it reads all the source's keys (and drops the
// other prefixes' entries), so that the consumer's filter stays short.
const prefixFilters = 16

// Load adds every object stored under prefix to x. Values that cannot be
// decoded are skipped and reported by a *CorruptError once the others are
// loaded.
//
// The Loads made together (the watches of a relayd start together) share
// one read of the bucket, through one ordered consumer whatever their
// number (see coalescer): it reads the keys of all their prefixes, and the
// epoch keys of those prefixes (kept for Epoch).
func (b *Bucket) Load(ctx context.Context, prefix string, x *Index) (Loaded, error) {
	r, err := b.loads.do(ctx, loadOf{prefix: prefix, x: x})
	if err != nil {
		return Loaded{}, err
	}
	return r.l, r.err
}

// Epoch reads the epoch recorded by EpochMsg; recorded is false (and the
// epoch 0) if the bucket has none. Right after a Load of prefix it is what
// that Load read (no request of its own); else it is read from the bucket.
func (b *Bucket) Epoch(ctx context.Context, prefix string) (epoch uint64, recorded bool, err error) {
	b.epochMu.Lock()
	e, ok := b.epochs[prefix]
	delete(b.epochs, prefix)
	b.epochMu.Unlock()
	if ok {
		return e.n, e.ok, e.err
	}
	v, err := b.kv.Get(ctx, EpochKey(prefix))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("index bucket %q: read %s: %w", b.name, EpochKey(prefix), err)
	}
	n, err := b.parseEpoch(prefix, v.Value())
	return n, true, err
}

func (b *Bucket) parseEpoch(prefix string, v []byte) (uint64, error) {
	n, err := strconv.ParseUint(string(v), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("index bucket %q: %s: %w", b.name, EpochKey(prefix), err)
	}
	return n, nil
}

// loadFilters are the keys a shared Load of prefixes reads: per source,
// each prefix's keys and epoch key, or with more than prefixFilters of
// them, all the source's.
func loadFilters(prefixes map[string][]int) []string {
	bySource := map[string][]string{}
	for p := range prefixes {
		src, _, _ := strings.Cut(p, ".")
		bySource[src] = append(bySource[src], p)
	}
	var keys []string
	for src, ps := range bySource {
		if len(ps) > prefixFilters {
			keys = append(keys, src+".>", "_epoch."+src+".>")
			continue
		}
		for _, p := range ps {
			keys = append(keys, p+".>", EpochKey(p))
		}
	}
	sort.Strings(keys)
	return keys
}

// readEntries is the shared read of Load.
func (b *Bucket) readEntries(ctx context.Context, qs []loadOf) ([]loaded, error) {
	prefixes := map[string][]int{} // prefix -> its calls
	for i, q := range qs {
		prefixes[q.prefix] = append(prefixes[q.prefix], i)
	}
	out := make([]loaded, len(qs))
	corrupt := make([]*CorruptError, len(qs))
	epochs := map[string]epochRead{}
	w, err := b.kv.WatchFiltered(ctx, loadFilters(prefixes), jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("index bucket %q: read: %w", b.name, err)
	}
	defer func() { _ = w.Stop() }()
	for done := false; !done; {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("index bucket %q: read: %w", b.name, ctx.Err())
		case e, ok := <-w.Updates():
			if !ok {
				return nil, fmt.Errorf("index bucket %q: read: watcher closed", b.name)
			}
			if done = e == nil; done { // initial values done
				break
			}
			if p, ok := strings.CutPrefix(e.Key(), "_epoch."); ok {
				if _, want := prefixes[p]; want {
					n, err := b.parseEpoch(p, e.Value())
					epochs[p] = epochRead{n, true, err}
				}
				continue
			}
			for _, i := range prefixes[keyPrefix(e.Key())] {
				b.loadEntry(e, qs[i].x, &out[i].l, &corrupt[i])
			}
		}
	}
	for i := range out {
		if corrupt[i] != nil {
			out[i].err = corrupt[i]
		}
	}
	b.epochMu.Lock()
	defer b.epochMu.Unlock()
	if b.epochs == nil {
		b.epochs = map[string]epochRead{}
	}
	for p := range prefixes {
		b.epochs[p] = epochs[p] // not ok when the bucket has none
	}
	return out, nil
}

// keyPrefix is the prefix of an object's key: "<source>.<namespace|_>"
// (a key of fewer tokens: those, and "." after a single one).
func keyPrefix(k string) string {
	i := strings.IndexByte(k, '.')
	if i < 0 {
		return k + "."
	}
	if j := strings.IndexByte(k[i+1:], '.'); j >= 0 {
		return k[:i+1+j]
	}
	return k
}

// loadEntry adds the bucket entry e to x, or records it as corrupt.
func (b *Bucket) loadEntry(e jetstream.KeyValueEntry, x *Index, l *Loaded, corrupt **CorruptError) {
	if r, ok := parseCanonical(e.Value()); ok && r.v <= FormatVersion &&
		len(r.f.uid) > 0 && len(r.f.name) > 0 && len(r.f.rv) > 0 {
		var fp, mf uint64
		if ok = len(r.fingerprint) == 0; !ok {
			fp, ok = parseHex64(r.fingerprint)
		}
		if len(r.managers) > 0 && ok {
			mf, ok = parseHex64(r.managers)
		}
		var buf [8 * maxPaths]byte
		if len(r.paths) > 0 && ok {
			var set uint64
			set, r.f.paths, ok = parsePathsHex(r.paths, buf[:0])
			if set != x.pathSet {
				r.f.paths = nil // other paths or another key: not known
			}
		}
		if ok { // else decoded below, for its error
			if fp != 0 && string(r.kid) != b.keyID {
				fp = 0
				l.OtherKey = append(l.OtherKey, string(r.f.uid))
			}
			x.putLoaded(r.f, fp, mf)
			l.Objects++
			return
		}
	}
	var v value
	var o Object
	err := json.Unmarshal(e.Value(), &v)
	if err == nil {
		o, err = v.object()
	}
	if err != nil || v.UID == "" || v.Name == "" || v.ResourceVersion == "" {
		if err == nil {
			err = errors.New("uid, name or resourceVersion missing")
		}
		if *corrupt == nil {
			*corrupt = &CorruptError{Err: err}
		}
		(*corrupt).Keys = append((*corrupt).Keys, e.Key())
		return
	}
	if o.Fingerprint != 0 && v.FingerprintKeyID != b.keyID {
		o.Fingerprint = 0
		l.OtherKey = append(l.OtherKey, o.UID)
	}
	if o.PathSet != x.pathSet {
		o.Paths = ""
	}
	x.Put(o)
	l.Objects++
}
