//go:build !race

package filter

// raceEnabled: see race_on_test.go.
const raceEnabled = false
