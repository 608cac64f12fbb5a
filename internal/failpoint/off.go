//go:build !failpoints

package failpoint

// Enabled reports whether the binary was built with failpoints.
const Enabled = false

// Inject does nothing without the "failpoints" build tag.
func Inject(string) {}
