//go:build relaydtest

package version

// testBuild: built with the "relaydtest" tag (a test build).
const testBuild = true
