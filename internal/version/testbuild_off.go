//go:build !testbuild

package version

// testBuild: built without the "testbuild" tag (the shipped binary).
const testBuild = false
