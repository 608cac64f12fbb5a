package version

import (
	"regexp"
	"runtime"
	"testing"
)

// Without -tags failpoints (go test's default) the build has no failpoints,
// and the version line says so; cmd/relayd's tests check the shipped binary
// and a failpoints build the same way.
func TestStringNamesFailpoints(t *testing.T) {
	if Failpoints() {
		t.Fatal("Failpoints() is true in a build without -tags failpoints")
	}
	test := "" // a test build (-tags testbuild) says so after failpoints
	if TestBuild() {
		test = ", testbuild=true"
	}
	want := "relayd " + Version + " (commit " + Commit + ", built " + BuildDate + ", " + runtime.Version() + ", failpoints=false" + test + ")"
	if got := String(); got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	if !regexp.MustCompile(`^relayd \S+ \(commit \S+, built \S+, go\S+, failpoints=(true|false)(, testbuild=true)?\)$`).MatchString(String()) {
		t.Errorf("String() = %q does not have the documented form", String())
	}
}
