package record

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"

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
}

// Reference is the reference history: a watch of etcd itself (through its
// JSON gateway), started before the first write. It sees every revision of
// every object, and neither apiserver restarts nor 410s (an apiserver
// thing) interrupt it, so it stays fault-free while the apiserver is the
// victim. ConfigMaps are stored as protobuf ("k8s\x00" + runtime.Unknown),
// custom resources as JSON; only metadata.uid is decoded. A delete's
// resourceVersion is the deletion's revision, as the apiserver's watch
// reports it.
type Reference struct {
	prefixes []Prefix
	cancel   context.CancelFunc
	done     chan struct{}

	mu      sync.Mutex
	changes []history.Change
	err     error
}

// StartReference watches etcd at endpoint from revision fromRev+1 on, for
// keys under "/registry/", keeping those under prefixes. It returns once
// etcd confirmed the watch.
func StartReference(ctx context.Context, endpoint string, fromRev int64, prefixes []Prefix) (*Reference, error) {
	wctx, cancel := context.WithCancel(context.Background())
	r := &Reference{prefixes: prefixes, cancel: cancel, done: make(chan struct{})}
	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	body, _ := json.Marshal(map[string]any{"create_request": map[string]any{
		"key": b64("/registry/"), "range_end": b64("/registry0"), "start_revision": strconv.FormatInt(fromRev+1, 10),
		"prev_kv": true,
	}})
	req, err := http.NewRequestWithContext(wctx, http.MethodPost, endpoint+"/v3/watch", bytes.NewReader(body))
	if err != nil {
		cancel()
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("reference: etcd watch: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		cancel()
		return nil, fmt.Errorf("reference: etcd watch: HTTP %d", resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 64<<20)
	created := make(chan error, 1)
	go func() {
		defer close(r.done)
		defer resp.Body.Close()
		first := true
		for sc.Scan() {
			err := r.line(sc.Bytes(), first)
			if first {
				created <- err
				first = false
			}
			if err != nil {
				r.setErr(err)
				return
			}
		}
		if first {
			created <- fmt.Errorf("reference: etcd watch ended before it was created: %v", sc.Err())
		}
		if wctx.Err() == nil {
			r.setErr(fmt.Errorf("reference: etcd watch ended: %v", sc.Err()))
		}
	}()
	select {
	case err := <-created:
		if err != nil {
			r.Close()
			return nil, err
		}
	case <-ctx.Done():
		r.Close()
		return nil, ctx.Err()
	}
	return r, nil
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
		uid, err := uidOf(value)
		if err != nil {
			return fmt.Errorf("reference: %s at %d: %w", key, rv, err)
		}
		ch.UID = uid
		r.mu.Lock()
		r.changes = append(r.changes, ch)
		r.mu.Unlock()
	}
	return nil
}

var (
	protoPrefix = []byte("k8s\x00")
	protoCodec  = protobuf.NewSerializer(scheme.Scheme, scheme.Scheme)
)

// uidOf reads metadata.uid of a stored object (protobuf or JSON).
func uidOf(value []byte) (string, error) {
	if bytes.HasPrefix(value, protoPrefix) {
		obj, _, err := protoCodec.Decode(value, nil, nil)
		if err != nil {
			return "", err
		}
		m, err := meta.Accessor(obj)
		if err != nil {
			return "", err
		}
		return string(m.GetUID()), nil
	}
	var o struct {
		Metadata struct {
			UID string `json:"uid"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(value, &o); err != nil {
		return "", err
	}
	if o.Metadata.UID == "" {
		return "", errors.New("no metadata.uid")
	}
	return o.Metadata.UID, nil
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
