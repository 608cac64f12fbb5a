package relay_test

import (
	"bufio"
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/relayd/relayd/internal/testenv"
)

// The core tests (every event type, kill -9, the 410 gap, the streaming
// list and its fallback, RBAC) run once per Kubernetes version of the test
// env (testenv.Versions: the default and the oldest minor still in upstream
// support), as subtests named after the version. A version whose binaries
// are missing fails them (`make testenv-bins`), it never skips.

// forEachVersion runs body once per Kubernetes version, on the package's
// shared env of that version (env, or its sibling started at first use and
// stopped with it).
func forEachVersion(t *testing.T, body func(t *testing.T, e *testenv.Env)) {
	t.Helper()
	for _, v := range testenv.VersionsT(t) {
		t.Run(v, func(t *testing.T) { body(t, env.SiblingT(t, v)) })
	}
}

// forEachVersionStarted runs body once per Kubernetes version, on an env of
// that version started with opts for the version's subtest alone.
func forEachVersionStarted(t *testing.T, opts testenv.Options, body func(t *testing.T, e *testenv.Env)) {
	t.Helper()
	for _, v := range testenv.VersionsT(t) {
		t.Run(v, func(t *testing.T) {
			o := opts
			o.Version = v
			body(t, testenv.StartT(t, o))
		})
	}
}

// versionTraits is what each version's apiserver does by default where
// relayd's protocol depends on it (docs/OPERATIONS.md, "Watches": the streaming list,
// or a paginated LIST where it is refused). A new version gets a row after
// checking its feature defaults: TestVersionTraits fails until then.
var versionTraits = map[string]struct {
	// watchList: the WatchList feature gate (streaming lists,
	// sendInitialEvents=true) is on by default, and its stage.
	watchList      bool
	watchListStage string
}{
	// WatchList: beta since 1.32, off again in 1.33, on by default since
	// 1.34; both versions serve streaming lists out of the box.
	testenv.K8sVersion:     {watchList: true, watchListStage: "BETA"},
	testenv.K8sVersionPrev: {watchList: true, watchListStage: "BETA"},
}

// TestVersionTraits pins, per version, the server version and the default
// of the feature the list path depends on, read from the apiserver itself
// (discovery and its kubernetes_feature_enabled metric).
func TestVersionTraits(t *testing.T) {
	forEachVersion(t, func(t *testing.T, e *testenv.Env) {
		want, ok := versionTraits[e.Version()]
		if !ok {
			t.Fatalf("no versionTraits row for Kubernetes %s", e.Version())
		}
		cs := e.Clientset(t, false)
		v, err := cs.Discovery().ServerVersion()
		if err != nil {
			t.Fatal(err)
		}
		if v.GitVersion != e.Version() {
			t.Fatalf("server version %s, want %s", v.GitVersion, e.Version())
		}
		body, err := cs.RESTClient().Get().AbsPath("/metrics").DoRaw(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		got, found := featureEnabled(body, "WatchList")
		if !found {
			t.Fatalf("kube-apiserver %s exports no kubernetes_feature_enabled{name=\"WatchList\"}", e.Version())
		}
		wantLine := fmt.Sprintf(`stage="%s"} %d`, want.watchListStage, map[bool]int{false: 0, true: 1}[want.watchList])
		if !strings.HasSuffix(got, wantLine) {
			t.Errorf("kube-apiserver %s: %s, want …%s", e.Version(), got, wantLine)
		}
	})
}

// featureEnabled returns the kubernetes_feature_enabled line of gate name.
func featureEnabled(metrics []byte, name string) (string, bool) {
	sc := bufio.NewScanner(bytes.NewReader(metrics))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "kubernetes_feature_enabled{") && strings.Contains(l, `name="`+name+`"`) {
			return l, true
		}
	}
	return "", false
}

// listRequests are relayd's list and watch requests of one collection, as
// the apiserver's audit log (testenv.Options.AuditLog) recorded them.
type listRequests struct {
	streamed  int   // streaming lists (watch, sendInitialEvents=true) answered 200
	refused   []int // status codes of streaming lists the apiserver refused
	pages     int   // pages of paginated LISTs at a consistent resourceVersion, answered 200
	continued int   // of which with a continue token
	resumes   int   // watches from a resourceVersion, answered 200
}

func (l listRequests) String() string {
	return fmt.Sprintf("streaming lists %d, refused %v, LIST pages %d (continued %d), watches from a resourceVersion %d",
		l.streamed, l.refused, l.pages, l.continued, l.resumes)
}

// relaydRequests classifies relayd's requests (user agent "relayd…") for
// resource in ns. The index check's LIST (resourceVersionMatch=Exact) and
// the one-item LIST of `initial: none` are not list paths and not counted.
func relaydRequests(t *testing.T, e *testenv.Env, resource, ns string) listRequests {
	t.Helper()
	evs, err := e.AuditEvents()
	if err != nil {
		t.Fatal(err)
	}
	var l listRequests
	for _, a := range evs {
		if res, n := a.Resource(); res != resource || n != ns || !strings.HasPrefix(a.UserAgent, "relayd") {
			continue
		}
		q := a.Query()
		switch {
		case a.Verb == "watch" && q.Get("sendInitialEvents") == "true":
			// A watch answered 200 is logged when its response starts; a
			// refused one when it completes.
			if a.Stage == "ResponseStarted" && a.Code() == 200 {
				l.streamed++
			} else if a.Stage == "ResponseComplete" && a.Code() >= 400 {
				l.refused = append(l.refused, a.Code())
			}
		case a.Verb == "watch":
			if a.Stage == "ResponseStarted" && a.Code() == 200 && q.Get("resourceVersion") != "" {
				l.resumes++
			}
		case a.Verb == "list" && a.Stage == "ResponseComplete" && a.Code() == 200 &&
			q.Get("resourceVersionMatch") == "" && q.Get("limit") != "1":
			l.pages++
			if q.Get("continue") != "" {
				l.continued++
			}
		}
	}
	return l
}

// requireStreamingLists fails t unless relayd listed resource in ns with
// streaming lists only, at least min of them, none refused and no LIST pages.
func requireStreamingLists(t *testing.T, e *testenv.Env, resource, ns string, min int) {
	t.Helper()
	l := relaydRequests(t, e, resource, ns)
	t.Logf("Kubernetes %s, relayd's requests for %s in %s: %v", e.Version(), resource, ns, l)
	if l.streamed < min || len(l.refused) > 0 || l.pages > 0 {
		t.Errorf("Kubernetes %s, %s in %s: %v; want at least %d streaming lists, none refused, no LIST pages",
			e.Version(), resource, ns, l, min)
	}
}
