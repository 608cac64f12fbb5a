package record

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/relayd/relayd/internal/chaos/history"
)

// Prefix maps an etcd key prefix to the relayd source that watches the
// objects stored under it, e.g. "/registry/configmaps/<ns>/" -> "cms".
type Prefix struct {
	Key    string
	Source string
	// Ignore, if set, are the source's ignoreChanges paths: each version
	// (JSON-stored kinds only) then gets a Digest without them.
	Ignore []string
	// Labels: record each version's labels (Change.Labels; not deletes'),
	// for a source with a filter the checker evaluates on them.
	Labels bool
	// Checkpoint, if set, makes Key relayd's checkpoint ConfigMap (its
	// whole key): its writes are recorded as history.CheckpointWrite, one
	// per source, not as changes. It maps the ConfigMap's data keys to
	// sources.
	Checkpoint map[string]string
}

// Reference is the reference history: a watch of etcd itself (through its
// JSON gateway), started before the first write. It sees every revision of
// every object, and neither apiserver restarts nor 410s (an apiserver
// thing) interrupt it, so it stays fault-free while the apiserver is the
// victim. When etcd itself is restarted (scenario etcd-restart) the watch
// breaks; it is made again from the revision after the last event it saw,
// so nothing is missed as long as etcd keeps that history (no compaction
// past it: etcd then cancels the watch, and the reference fails).
// ConfigMaps are stored as protobuf ("k8s\x00" + runtime.Unknown), custom
// resources as JSON; only metadata.uid is decoded. A delete's
// resourceVersion is the deletion's revision, as the apiserver's watch
// reports it.
type Reference struct {
	endpoint string
	prefixes []Prefix
	cancel   context.CancelFunc
	done     chan struct{}

	mu          sync.Mutex
	changes     []history.Change
	checkpoints []history.CheckpointWrite
	next        int64 // revision to watch from when the watch is made again
	reconnects  int
	err         error
}

// ReconnectTimeout bounds how long the reference tries to watch etcd again
// after its watch broke (etcd restarted or unreachable).
const ReconnectTimeout = 2 * time.Minute

// StartReference watches etcd at endpoint from revision fromRev+1 on, for
// keys under "/registry/", keeping those under prefixes. It returns once
// etcd confirmed the watch.
func StartReference(ctx context.Context, endpoint string, fromRev int64, prefixes []Prefix) (*Reference, error) {
	wctx, cancel := context.WithCancel(context.Background())
	r := &Reference{endpoint: endpoint, prefixes: prefixes, cancel: cancel, done: make(chan struct{}), next: fromRev + 1}
	type opened struct {
		sc   *bufio.Scanner
		body io.Closer
		err  error
	}
	ch := make(chan opened, 1)
	go func() {
		sc, body, err := r.open(wctx)
		ch <- opened{sc, body, err}
	}()
	var o opened
	select {
	case o = <-ch:
	case <-ctx.Done():
		cancel()
		if o = <-ch; o.body != nil {
			o.body.Close()
		}
		return nil, ctx.Err()
	}
	if o.err != nil {
		cancel()
		return nil, o.err
	}
	go r.run(wctx, o.sc, o.body)
	return r, nil
}

// open makes the etcd watch from r.next and reads its creation line.
func (r *Reference) open(ctx context.Context) (*bufio.Scanner, io.Closer, error) {
	r.mu.Lock()
	next := r.next
	r.mu.Unlock()
	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	body, _ := json.Marshal(map[string]any{"create_request": map[string]any{
		"key": b64("/registry/"), "range_end": b64("/registry0"), "start_revision": strconv.FormatInt(next, 10),
		"prev_kv": true,
	}})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.endpoint+"/v3/watch", bytes.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, fmt.Errorf("reference: etcd watch from revision %d: %w", next, err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, nil, fmt.Errorf("reference: etcd watch from revision %d: HTTP %d", next, resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 64<<20)
	if !sc.Scan() {
		resp.Body.Close()
		return nil, nil, fmt.Errorf("reference: etcd watch from revision %d ended before it was created: %v", next, sc.Err())
	}
	if err := r.line(sc.Bytes(), true); err != nil {
		resp.Body.Close()
		return nil, nil, err
	}
	return sc, resp.Body, nil
}

// run reads the watch until ctx ends, making it again when it breaks.
func (r *Reference) run(ctx context.Context, sc *bufio.Scanner, body io.Closer) {
	defer close(r.done)
	for {
		for sc.Scan() {
			if err := r.line(sc.Bytes(), false); err != nil {
				body.Close()
				r.setErr(err)
				return
			}
		}
		body.Close()
		if ctx.Err() != nil {
			return
		}
		broke := sc.Err()
		deadline := time.Now().Add(ReconnectTimeout)
		var err error
		for {
			if sc, body, err = r.open(ctx); err == nil || ctx.Err() != nil || time.Now().After(deadline) ||
				strings.Contains(err.Error(), "canceled") {
				break
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
		if ctx.Err() != nil {
			if err == nil {
				body.Close()
			}
			return
		}
		if err != nil {
			r.setErr(fmt.Errorf("reference: etcd watch ended (%v) and could not be made again: %w", broke, err))
			return
		}
		r.mu.Lock()
		r.reconnects++
		r.mu.Unlock()
	}
}

// Reconnects is how many times the watch was made again.
func (r *Reference) Reconnects() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reconnects
}

type watchLine struct {
	Result *struct {
		Created  bool   `json:"created"`
		Canceled bool   `json:"canceled"`
		Reason   string `json:"cancel_reason"`
		Events   []struct {
			Type string `json:"type"` // "" (PUT) or "DELETE"
			KV   struct {
				Key       []byte `json:"key"`
				CreateRev string `json:"create_revision"`
				ModRev    string `json:"mod_revision"`
				Value     []byte `json:"value"`
			} `json:"kv"`
			PrevKV *struct {
				Value []byte `json:"value"`
			} `json:"prev_kv"`
		} `json:"events"`
	} `json:"result"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

func (r *Reference) line(b []byte, first bool) error {
	var l watchLine
	if err := json.Unmarshal(b, &l); err != nil {
		return fmt.Errorf("reference: etcd watch line: %w: %.200s", err, b)
	}
	if l.Error != nil {
		return fmt.Errorf("reference: etcd watch: %s", l.Error.Message)
	}
	if l.Result == nil {
		return fmt.Errorf("reference: etcd watch line without result: %.200s", b)
	}
	if l.Result.Canceled {
		return fmt.Errorf("reference: etcd watch canceled: %s", l.Result.Reason)
	}
	if first && !l.Result.Created {
		return fmt.Errorf("reference: first etcd watch line is not the creation: %.200s", b)
	}
	for _, ev := range l.Result.Events {
		if rev, err := strconv.ParseInt(ev.KV.ModRev, 10, 64); err == nil {
			r.mu.Lock()
			r.next = max(r.next, rev+1)
			r.mu.Unlock()
		}
		key := string(ev.KV.Key)
		var p *Prefix
		for i := range r.prefixes {
			if strings.HasPrefix(key, r.prefixes[i].Key) {
				p = &r.prefixes[i]
			}
		}
		if p == nil {
			continue
		}
		if p.Checkpoint != nil {
			if key == p.Key && ev.Type != "DELETE" {
				if err := r.checkpoint(p, ev.KV.ModRev, ev.KV.Value); err != nil {
					return err
				}
			}
			continue
		}
		// /registry/<resource path>/<namespace>/<name> (namespaced kinds only)
		parts := strings.Split(key, "/")
		ns, name := parts[len(parts)-2], parts[len(parts)-1]
		rv, err := strconv.ParseInt(ev.KV.ModRev, 10, 64)
		if err != nil {
			return fmt.Errorf("reference: %s: mod_revision %q", key, ev.KV.ModRev)
		}
		ch := history.Change{Source: p.Source, Namespace: ns, Name: name, RV: rv}
		value := ev.KV.Value
		switch {
		case ev.Type == "DELETE":
			ch.Type = history.Deleted
			if ev.PrevKV == nil {
				return fmt.Errorf("reference: delete of %s without the previous value", key)
			}
			value = ev.PrevKV.Value
		case ev.KV.CreateRev == ev.KV.ModRev:
			ch.Type = history.Added
		default:
			ch.Type = history.Modified
		}
		uid, labels, err := metaOf(value)
		if err != nil {
			return fmt.Errorf("reference: %s at %d: %w", key, rv, err)
		}
		ch.UID = uid
		if p.Labels && ch.Type != history.Deleted {
			ch.Labels = labels
		}
		if p.Ignore != nil && ch.Type != history.Deleted {
			if ch.Digest, err = Digest(value, p.Ignore); err != nil {
				return fmt.Errorf("reference: %s at %d: %w", key, rv, err)
			}
		}
		r.mu.Lock()
		r.changes = append(r.changes, ch)
		r.mu.Unlock()
	}
	return nil
}

// checkpoint records a write of the checkpoint ConfigMap: for every
// source, the resourceVersion its key holds (0: the key is missing or
// holds none), as of the write's revision, seen now.
func (r *Reference) checkpoint(p *Prefix, modRev string, value []byte) error {
	seen := time.Now()
	rev, err := strconv.ParseInt(modRev, 10, 64)
	if err != nil {
		return fmt.Errorf("reference: checkpoint %s: mod_revision %q", p.Key, modRev)
	}
	obj, _, err := protoCodec.Decode(value, nil, nil)
	if err != nil {
		return fmt.Errorf("reference: checkpoint %s at %d: %w", p.Key, rev, err)
	}
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok {
		return fmt.Errorf("reference: checkpoint %s at %d is a %T, not a ConfigMap", p.Key, rev, obj)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, k := range slices.Sorted(maps.Keys(p.Checkpoint)) {
		w := history.CheckpointWrite{Rev: rev, Seen: seen, Source: p.Checkpoint[k]}
		var c struct {
			ResourceVersion string `json:"resourceVersion"`
		}
		if v, ok := cm.Data[k]; ok && json.Unmarshal([]byte(v), &c) == nil {
			w.CheckpointRV, _ = history.ParseRV(c.ResourceVersion)
		}
		r.checkpoints = append(r.checkpoints, w)
	}
	return nil
}

// Checkpoints returns the checkpoint writes seen so far (Prefix.Checkpoint).
func (r *Reference) Checkpoints() []history.CheckpointWrite {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]history.CheckpointWrite(nil), r.checkpoints...)
}

var (
	protoPrefix = []byte("k8s\x00")
	protoCodec  = protobuf.NewSerializer(scheme.Scheme, scheme.Scheme)
)

// metaOf reads metadata.uid and metadata.labels of a stored object
// (protobuf or JSON).
func metaOf(value []byte) (string, map[string]string, error) {
	if bytes.HasPrefix(value, protoPrefix) {
		obj, _, err := protoCodec.Decode(value, nil, nil)
		if err != nil {
			return "", nil, err
		}
		m, err := meta.Accessor(obj)
		if err != nil {
			return "", nil, err
		}
		return string(m.GetUID()), m.GetLabels(), nil
	}
	var o struct {
		Metadata struct {
			UID    string            `json:"uid"`
			Labels map[string]string `json:"labels"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(value, &o); err != nil {
		return "", nil, err
	}
	if o.Metadata.UID == "" {
		return "", nil, errors.New("no metadata.uid")
	}
	return o.Metadata.UID, o.Metadata.Labels, nil
}

func (r *Reference) setErr(err error) {
	r.mu.Lock()
	if r.err == nil {
		r.err = err
	}
	r.mu.Unlock()
}

// Changes returns the history so far, and the error that ended the watch
// if it ended (then the history is incomplete).
func (r *Reference) Changes() ([]history.Change, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]history.Change(nil), r.changes...), r.err
}

// Close stops the watch.
func (r *Reference) Close() {
	r.cancel()
	<-r.done
}
