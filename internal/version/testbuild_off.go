//go:build !relaydtest

package version

// testBuild: built without the "relaydtest" tag (the shipped binary).
const testBuild = false
