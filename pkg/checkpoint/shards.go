package checkpoint

import (
	"fmt"
	"hash/fnv"
	"net/http"
	"strconv"
	"time"

	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
)

// DefaultWatchesPerConfigMap is how many watch keys relayd plans per
// checkpoint ConfigMap (config checkpoint.watchesPerConfigMap): about 92 KB
// at the measured 185 bytes per key, under a tenth of the apiserver's 1 MiB
// object limit, so that the longest keys and an uneven hash still fit, and
// a flush that changed one key rewrites 92 KB, not the whole checkpoint
// (docs/OPERATIONS.md, "Checkpoint ConfigMap").
const DefaultWatchesPerConfigMap = 500

// ShardCount is the number of checkpoint ConfigMaps for a configuration of
// watches keys at perConfigMap keys each: at least one.
func ShardCount(watches, perConfigMap int) int {
	if perConfigMap <= 0 {
		perConfigMap = DefaultWatchesPerConfigMap
	}
	return max(1, (watches+perConfigMap-1)/perConfigMap)
}

// ShardNames are the names of the checkpoint ConfigMaps: name itself, then
// "<name>-1" … "<name>-<shards-1>". One shard is the layout of every relayd
// before sharding, so a small configuration keeps its one ConfigMap.
func ShardNames(name string, shards int) []string {
	out := make([]string, max(1, shards))
	for i := range out {
		out[i] = ShardName(name, i)
	}
	return out
}

// ShardName is the name of checkpoint ConfigMap number i (see [ShardNames]).
func ShardName(name string, i int) string {
	if i == 0 {
		return name
	}
	return name + "-" + strconv.Itoa(i)
}

// ShardOf is the ConfigMap (0 … shards-1) that holds key: FNV-1a of the key
// modulo the shard count, so it depends on nothing but the key and the count,
// and every replica (and every relayd version with sharding) agrees.
func ShardOf(key string, shards int) int {
	if shards <= 1 {
		return 0
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	return int(h.Sum32() % uint32(shards))
}

// NewClient is the checkpoint's own client for [Options.Client]: cfg and
// httpc with a client-side rate limiter of its own, [QPS] (burst twice
// that).
func NewClient(cfg *rest.Config, httpc *http.Client, shards int, flushInterval time.Duration) (corev1client.ConfigMapsGetter, error) {
	c := rest.CopyConfig(cfg)
	qps := QPS(shards, flushInterval)
	c.QPS, c.Burst, c.RateLimiter = float32(qps), int(2*qps), nil
	cs, err := corev1client.NewForConfigAndClient(c, httpc)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: kubernetes client: %w", err)
	}
	return cs, nil
}

// QPS is the client-side rate limit of the checkpoint's own client
// ([NewClient]): a Flush gets and updates each of the shards
// ConfigMaps, a conflict retries, and Load adds a dry-run update each; four
// requests per ConfigMap per flushInterval, and never less than 10/s. The
// checkpoint must not share a limiter with lists and watches: at 10,000
// watches their start holds a shared one for minutes, and every checkpoint
// write of that time would fail (docs/OPERATIONS.md, "Client-side rate limits").
func QPS(shards int, flushInterval time.Duration) float64 {
	return max(10, 4*float64(max(1, shards))/flushInterval.Seconds())
}
