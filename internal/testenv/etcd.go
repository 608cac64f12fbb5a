package testenv

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
)

// etcdPost calls etcd's JSON gateway (enabled by default on the client URL),
// which keeps relayd's module free of etcd's gRPC client.
func (e *Env) etcdPost(ctx context.Context, path string, body any, out any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.etcdURL+path, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("testenv: etcd %s: %w", path, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("testenv: etcd %s: HTTP %d: %s", path, resp.StatusCode, data)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("testenv: etcd %s: %w: %s", path, err, data)
		}
	}
	return nil
}

// EtcdRevision returns etcd's current revision.
func (e *Env) EtcdRevision(ctx context.Context) (int64, error) {
	var st struct {
		Header struct {
			Revision string `json:"revision"`
		} `json:"header"`
	}
	if err := e.etcdPost(ctx, "/v3/maintenance/status", struct{}{}, &st); err != nil {
		return 0, err
	}
	return strconv.ParseInt(st.Header.Revision, 10, 64)
}

// CompactNow compacts etcd at its current revision (physically) and returns
// that revision. With the watch cache off, a watch from any resourceVersion
// X with X+1 < revision then gets 410 Expired.
func (e *Env) CompactNow(ctx context.Context) (int64, error) {
	rev, err := e.EtcdRevision(ctx)
	if err != nil {
		return 0, err
	}
	req := map[string]any{"revision": strconv.FormatInt(rev, 10), "physical": true}
	if err := e.etcdPost(ctx, "/v3/kv/compaction", req, nil); err != nil {
		return 0, err
	}
	e.logf("testenv: etcd compacted at revision %d", rev)
	return rev, nil
}
