package testenv_test

import (
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/relayd/relayd/internal/testenv"
)

func TestVersionsAreTheDefaultAndThePrevious(t *testing.T) {
	got := testenv.VersionsT(t)
	if len(got) != 2 || got[0] != testenv.K8sVersion || got[1] != testenv.K8sVersionPrev {
		t.Fatalf("Versions() = %v, want [%s %s]", got, testenv.K8sVersion, testenv.K8sVersionPrev)
	}
}

// A configured version whose binaries are missing is a failure naming the
// variable and the make target, in CheckVersions (so VersionsT fails the
// tests that run per version) and in Start.
func TestMissingBinariesOfTheSecondVersionFail(t *testing.T) {
	empty := t.TempDir()
	t.Setenv("RELAYD_TESTENV_BIN_PREV", empty)
	err := testenv.CheckVersions()
	if err == nil {
		t.Fatal("CheckVersions succeeded without the second version's binaries")
	}
	for _, want := range []string{"make testenv-bins", "RELAYD_TESTENV_BIN_PREV", testenv.K8sVersionPrev, filepath.Join(empty, "etcd")} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("CheckVersions: %q does not name %q", err, want)
		}
	}
	if _, err := testenv.Start(t.Context(), testenv.Options{Version: testenv.K8sVersionPrev}); err == nil || !strings.Contains(err.Error(), "make testenv-bins") {
		t.Errorf("Start(%s) without binaries: %v, want an error naming make testenv-bins", testenv.K8sVersionPrev, err)
	}
}

// A folder holding another version's kube-apiserver is refused before
// anything starts: the tests of one version would run against the other.
func TestBinariesOfAnotherVersionAreRefused(t *testing.T) {
	cur, err := testenv.BinDirOf(testenv.K8sVersion)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("RELAYD_TESTENV_BIN_PREV", cur)
	_, err = testenv.Start(t.Context(), testenv.Options{Version: testenv.K8sVersionPrev})
	if err == nil {
		t.Fatalf("Start(%s) with the binaries of %s succeeded", testenv.K8sVersionPrev, testenv.K8sVersion)
	}
	want := `says "Kubernetes ` + testenv.K8sVersion + `"`
	if !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "RELAYD_TESTENV_BIN_PREV") {
		t.Errorf("error %q, want it to contain %q and name RELAYD_TESTENV_BIN_PREV", err, want)
	}
}

func TestUnknownVersionIsRefused(t *testing.T) {
	_, err := testenv.Start(t.Context(), testenv.Options{Version: "v1.20.0"})
	if err == nil || !strings.Contains(err.Error(), `"v1.20.0" is not provided`) {
		t.Fatalf("Start(v1.20.0): %v, want an error saying it is not provided", err)
	}
}

// Sibling starts the other version once, returns it again, returns the env
// itself for its own version, and is stopped with it (testenv.Main's Stop,
// followed by its goroutine leak check).
func TestSiblingRunsTheOtherVersion(t *testing.T) {
	if s := env.SiblingT(t, testenv.K8sVersion); s != env {
		t.Fatalf("Sibling(%s) of the %s env is another env", testenv.K8sVersion, env.Version())
	}
	prev := env.SiblingT(t, testenv.K8sVersionPrev)
	if again := env.SiblingT(t, testenv.K8sVersionPrev); again != prev {
		t.Fatal("a second Sibling call started another env")
	}
	if prev.Version() != testenv.K8sVersionPrev || prev.Host() == env.Host() || prev.EtcdEndpoint() == env.EtcdEndpoint() {
		t.Fatalf("sibling: version %s, host %s, etcd %s; env: host %s, etcd %s",
			prev.Version(), prev.Host(), prev.EtcdEndpoint(), env.Host(), env.EtcdEndpoint())
	}
	v, err := prev.Clientset(t, false).Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if v.GitVersion != testenv.K8sVersionPrev {
		t.Fatalf("sibling's server version %s, want %s", v.GitVersion, testenv.K8sVersionPrev)
	}
	if _, err := prev.AuditEvents(); err == nil {
		t.Error("AuditEvents of an env started without Options.AuditLog succeeded")
	}
}

// With Options.AuditLog, a test sees each list and watch request and the
// server's answer: here a LIST page, a streaming list (answered 200) and a
// LIST the server refuses (sendInitialEvents is only for watches).
func TestAuditLogRecordsListsAndWatches(t *testing.T) {
	e := testenv.StartT(t, testenv.Options{AuditLog: true})
	cs := e.Clientset(t, false)
	ctx := t.Context()
	makeNamespace(t, cs, "audit")
	if _, err := cs.CoreV1().ConfigMaps("audit").List(ctx, metav1.ListOptions{Limit: 7}); err != nil {
		t.Fatal(err)
	}
	yes := true
	w, err := cs.CoreV1().ConfigMaps("audit").Watch(ctx, metav1.ListOptions{SendInitialEvents: &yes,
		ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan, AllowWatchBookmarks: true})
	if err != nil {
		t.Fatal(err)
	}
	w.Stop()
	if _, err := cs.CoreV1().ConfigMaps("audit").List(ctx, metav1.ListOptions{SendInitialEvents: &yes,
		ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan}); err == nil {
		t.Fatal("a LIST with sendInitialEvents was accepted")
	}
	evs, err := e.AuditEvents()
	if err != nil {
		t.Fatal(err)
	}
	var page, stream, refused bool
	for _, a := range evs {
		res, ns := a.Resource()
		if res != "configmaps" || ns != "audit" || a.User.Username != testenv.AdminUser {
			continue
		}
		q := a.Query()
		switch {
		case a.Verb == "list" && a.Stage == "ResponseComplete" && q.Get("limit") == "7" && a.Code() == 200:
			page = true
		case a.Verb == "watch" && a.Stage == "ResponseStarted" && q.Get("sendInitialEvents") == "true" && a.Code() == 200:
			stream = true
		case a.Verb == "list" && a.Stage == "ResponseComplete" && q.Get("sendInitialEvents") == "true" && a.Code() == 422:
			refused = true
		}
	}
	if !page || !stream || !refused {
		t.Errorf("audit log of %d entries: LIST page %v, streaming list %v, refused LIST %v; want all three", len(evs), page, stream, refused)
	}
}
