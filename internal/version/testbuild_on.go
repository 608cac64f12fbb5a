//go:build testbuild

package version

// testBuild: built with the "testbuild" tag (a test build).
const testBuild = true
