package checkpoint

import (
	"hash/fnv"
	"strconv"
)

// DefaultWatchesPerConfigMap is how many watch keys relayd plans per
// checkpoint ConfigMap (config checkpoint.watchesPerConfigMap): about
// 181 KB at the measured 181 bytes per key, a sixth of the apiserver's
// 1 MiB object limit, so that long keys, an uneven hash and a few
// older-layout keys still fit (docs/OPERATIONS.md, "Checkpoint ConfigMap").
const DefaultWatchesPerConfigMap = 1000

// MaxConfigMapBytes is the apiserver's limit on the data of one ConfigMap.
const MaxConfigMapBytes = 1 << 20

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
