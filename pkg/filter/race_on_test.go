//go:build race

package filter

// raceEnabled: the race detector's sync.Pool drops what is put back at
// random, so regexp and others allocate far more than they do in a plain
// build; FuzzWorstCase's allocation bound holds for plain builds only.
const raceEnabled = true
