package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/relayd/relayd/internal/testenv"
)

const indexCheckPkg = "github.com/relayd/relayd/internal/indexcheck"

// goListDeps is `go list -deps` of cmd/relayd as `make build` builds it
// (CGO off) with the build tags tags.
func goListDeps(t *testing.T, tags string) []string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "list", "-deps", "-tags", tags, "./cmd/relayd")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps -tags %q ./cmd/relayd: %v", tags, err)
	}
	return strings.Fields(string(out))
}

// The shipped binary does not contain the index consistency check of the
// tests: cmd/relayd built without tags (the Makefile's and the
// Dockerfile's build) does not depend on internal/indexcheck, whatever
// RELAYD_INDEX_CHECK says; the test build (-tags testbuild) does.
// `relayd version` tells the two apart.
func TestShippedBuildHasNoIndexCheck(t *testing.T) {
	if deps := goListDeps(t, ""); slices.Contains(deps, indexCheckPkg) {
		t.Errorf("cmd/relayd without tags depends on %s: the shipped binary would contain the tests' index check", indexCheckPkg)
	}
	if deps := goListDeps(t, "testbuild"); !slices.Contains(deps, indexCheckPkg) {
		t.Errorf("cmd/relayd with -tags testbuild does not depend on %s: the test build has no index check", indexCheckPkg)
	}
	out, err := exec.Command(testenv.RelaydBin(t), "version").Output()
	if err != nil || strings.Contains(string(out), "testbuild") {
		t.Errorf("$RELAYD_BIN version: %q (%v); want no testbuild", out, err)
	}
	testenv.RelaydTestBin(t) // fails unless it says testbuild=true
}

// Against a real apiserver and NATS, with RELAYD_INDEX_CHECK=1 in both
// environments: the test build (bin/relayd-test) says the check is on and
// runs it after its first list ("index consistency check passed"); the
// shipped binary (bin/relayd) does neither. The barrier: a ConfigMap
// created after the list's sync.completed is relayed, and relayd handles
// it only after the check of that list returned (pkg/watch calls the
// check from the watch's handler, after sync.completed).
func TestIndexCheckRunsOnlyInTheTestBuild(t *testing.T) {
	env := testenv.StartT(t, testenv.Options{})
	ns := testenv.NATST(t, testenv.NATSOptions{})
	nc, err := nats.Connect(ns.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	namespace := env.Namespace(t)
	cms := env.Clientset(t, false).CoreV1().ConfigMaps(namespace)

	for _, tc := range []struct {
		name, bin string
		checked   bool
	}{
		{"shipped", testenv.RelaydBin(t), false},
		{"testbuild", testenv.RelaydTestBin(t), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefix := "k8s-" + tc.name
			sub, err := nc.SubscribeSync(prefix + ".>")
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = sub.Unsubscribe() }()
			p := env.Relayd(t, fmt.Sprintf(`cluster: %s
prefix: %s
nats: {url: %q, stream: {name: %s, create: true}}
checkpoint: {namespace: %s, name: relayd-%s}
sources:
  - {name: cms, apiVersion: v1, kind: ConfigMap, namespaces: [%s], payload: metadata}
`, tc.name, prefix, ns.URL(), strings.ToUpper(tc.name), namespace, tc.name, namespace))
			p.Bin = tc.bin
			if tc.checked {
				p.Env = append(p.Env, testenv.IndexCheckEnv+"=1") // Start checks that p.Bin is a test build
			} else {
				// Start refuses IndexCheckEnv in p.Env for a binary that
				// ignores it; here it is asked for on purpose (as a values
				// file or a pod spec could), through the inherited
				// environment.
				t.Setenv(testenv.IndexCheckEnv, "1")
			}
			p.Start()
			wait := func(what string, match func(subject string) bool) {
				t.Helper()
				deadline := time.Now().Add(time.Minute) // a guard against a hang, not a timed assertion
				for {
					m, err := sub.NextMsg(time.Until(deadline))
					if err != nil {
						t.Fatalf("waiting for %s: %v\nrelayd log:\n%s", what, err, p.Log())
					}
					if match(m.Subject) {
						return
					}
				}
			}
			wait("sync.completed", func(s string) bool { return strings.HasSuffix(s, "._relayd.cms.sync.completed") })
			name := "after-list-" + tc.name
			if _, err := cms.Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			wait("the ConfigMap "+name, func(s string) bool { return strings.Contains(s, "."+name+".added") })

			log := p.Log()
			on := strings.Contains(log, "index consistency check on")
			passed := strings.Contains(log, "index consistency check passed")
			if on != tc.checked || passed != tc.checked || (!tc.checked && strings.Contains(log, "index consistency check")) {
				t.Errorf("%s with %s=1: says the check is on %v, ran it %v; want %v:\n%s", tc.bin, testenv.IndexCheckEnv, on, passed, tc.checked, log)
			}
		})
	}
}
