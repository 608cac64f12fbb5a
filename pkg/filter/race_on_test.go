//go:build race

package filter

// raceEnabled: the race detector's sync.Pool drops what is put back at
// random, so regexp and others allocate far more than they do in a plain
// build (regexp's matchers: 79 MB for extractAll on 12 KB, 87 bytes per
// unit of work); FuzzWorstCase does not bound the allocations of regular
// expressions there.
const raceEnabled = true
