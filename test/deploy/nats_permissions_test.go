package deploy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/conf"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.yaml.in/yaml/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/pkg/config"
	"github.com/relayd/relayd/pkg/stream"
)

// natsPermissions are the permissions of one user of an authorization
// block of docs/DEPLOY.md, as nats-server parses its config.
type natsPermissions struct {
	pub, sub []string
	// pubDeny is the publish deny list (consumers' block).
	pubDeny []string
	// createOnly are the publish subjects whose line is marked
	// "# create only": needed only with nats.stream.create or
	// nats.index.create.
	createOnly []string
}

// The markers of the blocks of docs/DEPLOY.md the tests read.
const (
	relaydPermsBlock   = "nats-permissions"
	nscPermsBlock      = "nats-permissions-nsc"
	consumerPermsBlock = "nats-consumer-permissions"
)

// docBlock is the fenced code block of docs/DEPLOY.md between
// "<!-- name:begin -->" and "<!-- name:end -->", without its fences.
func docBlock(t testing.TB, name string) string {
	t.Helper()
	doc := repoFile(t, "docs/DEPLOY.md")
	begin, end := "<!-- "+name+":begin -->", "<!-- "+name+":end -->"
	i, j := strings.Index(doc, begin), strings.Index(doc, end)
	if i < 0 || j < i {
		t.Fatalf("docs/DEPLOY.md: no %s … %s block", begin, end)
	}
	block := strings.TrimSpace(doc[i+len(begin) : j])
	first, rest, _ := strings.Cut(block, "\n")
	if !strings.HasPrefix(first, "```") || !strings.HasSuffix(rest, "```") {
		t.Fatalf("docs/DEPLOY.md: the %s block is not one fenced code block", name)
	}
	return strings.TrimSuffix(rest, "```")
}

// passwordVar matches a "password: $VARIABLE" line of an authorization block.
var passwordVar = regexp.MustCompile(`(?m)^\s*password:\s*\$([A-Za-z_][A-Za-z0-9_]*)\s*$`)

// createOnlyLine matches a subject line marked "# create only", and
// createOnlyWholeLine the whole line, its newline included.
var (
	createOnlyLine      = regexp.MustCompile(`(?m)^[ \t]*"([^"]+)"[ \t]*# create only\b`)
	createOnlyWholeLine = regexp.MustCompile(`(?m)^[ \t]*"[^"]+"[ \t]*# create only\b.*\n`)
)

// blockUserPermissions parses an authorization block of docs/DEPLOY.md as
// nats-server does and returns the permissions of its one user. The
// block's password variables are set to "test" for the parse (t.Setenv).
func blockUserPermissions(t *testing.T, name, block string) natsPermissions {
	t.Helper()
	for _, m := range passwordVar.FindAllStringSubmatch(block, -1) {
		t.Setenv(m[1], "test")
	}
	m, err := conf.Parse(block)
	if err != nil {
		t.Fatalf("docs/DEPLOY.md: the %s block is not nats-server config: %v", name, err)
	}
	get := func(v any, path ...string) any {
		for _, k := range path {
			mm, ok := v.(map[string]any)
			if !ok {
				t.Fatalf("docs/DEPLOY.md: %s: %s is not a map", name, strings.Join(path, "."))
			}
			v = mm[k]
		}
		return v
	}
	users, _ := get(m, "authorization", "users").([]any)
	if len(users) != 1 {
		t.Fatalf("docs/DEPLOY.md: %s: want one user, got %v", name, get(m, "authorization", "users"))
	}
	strs := func(v any) []string {
		var out []string
		if v == nil {
			return nil
		}
		for _, x := range v.([]any) {
			out = append(out, x.(string))
		}
		return out
	}
	p := natsPermissions{
		pub:     strs(get(users[0], "permissions", "publish", "allow")),
		sub:     strs(get(users[0], "permissions", "subscribe", "allow")),
		pubDeny: strs(get(users[0], "permissions", "publish", "deny")),
	}
	for _, m := range createOnlyLine.FindAllStringSubmatch(block, -1) {
		if !slices.Contains(p.pub, m[1]) {
			t.Fatalf("docs/DEPLOY.md: %s: %q is marked create only but is no publish subject", name, m[1])
		}
		p.createOnly = append(p.createOnly, m[1])
	}
	return p
}

// docNATSPermissions is relayd's permission block of docs/DEPLOY.md ("NATS
// permissions").
func docNATSPermissions(t *testing.T) natsPermissions {
	t.Helper()
	return blockUserPermissions(t, relaydPermsBlock, docBlock(t, relaydPermsBlock))
}

// tokenAuth authenticates NATS clients by token: "relayd" gets perms
// (changeable between connections), "admin" everything.
type tokenAuth struct {
	mu    sync.Mutex
	perms natsPermissions
}

func (a *tokenAuth) set(p natsPermissions) {
	a.mu.Lock()
	a.perms = p
	a.mu.Unlock()
}

func (a *tokenAuth) Check(c server.ClientAuthentication) bool {
	switch c.GetOpts().Token {
	case "admin":
		c.RegisterUser(&server.User{Username: "admin"})
		return true
	case "relayd":
		a.mu.Lock()
		p := a.perms
		a.mu.Unlock()
		c.RegisterUser(&server.User{Username: "relayd", Permissions: &server.Permissions{
			Publish: allowOnly(p.pub), Subscribe: allowOnly(p.sub),
		}})
		return true
	}
	return false
}

// allowOnly allows exactly subjects; an empty allow list would allow
// everything, so none is a deny-all.
func allowOnly(subjects []string) *server.SubjectPermission {
	if len(subjects) == 0 {
		return &server.SubjectPermission{Deny: []string{">"}}
	}
	return &server.SubjectPermission{Allow: slices.Clone(subjects)}
}

// natsProbe makes ConfigMap changes for relayd to relay and looks for
// their events on the stream, as the NATS admin.
type natsProbe struct {
	in *install
	js jetstream.JetStream // the admin's
	ns string
	n  int
}

func newNATSProbe(t *testing.T, in *install, js jetstream.JetStream) *natsProbe {
	t.Helper()
	p := &natsProbe{in: in, js: js, ns: fmt.Sprintf("nats-perm-probe-%d", time.Now().UnixNano())}
	in.c.ensureNamespace(t, p.ns)
	return p
}

// relayOne changes a ConfigMap and waits (up to timeout) for its event on
// the stream and for /readyz to be 200, and returns the event. The
// ConfigMap shows only its own source relaying; readiness (every watch
// established) shows the others are too: a refused request stops the
// source that made it.
func (p *natsProbe) relayOne(ctx context.Context, r *relayd, timeout time.Duration) (*jetstream.RawStreamMsg, error) {
	b := p.in.b
	p.n++
	name := fmt.Sprintf("probe-%d", p.n)
	if _, err := p.in.c.cs.CoreV1().ConfigMaps(p.ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create ConfigMap %s/%s: %w", p.ns, name, err)
	}
	streamName := b.cfg.NATS.Stream.Name
	subject := strings.TrimSuffix(b.cfg.StreamSubject(), ">") + "core.v1.configmaps." + p.ns + "." + name + ".added"
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		s, err := p.js.Stream(ctx, streamName)
		var msg *jetstream.RawStreamMsg
		if err == nil {
			msg, err = s.GetLastMsgForSubject(ctx, subject)
		}
		cancel()
		if err != nil {
			err = fmt.Errorf("%s not on stream %s: %w", subject, streamName, err)
		} else if code, body, perr := r.probe("/readyz"); perr != nil || code != http.StatusOK {
			err = fmt.Errorf("%s relayed but /readyz %d %q (%v)", subject, code, strings.TrimSpace(body), perr)
		} else {
			return msg, nil
		}
		if time.Now().After(deadline) || r.exited() {
			return nil, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// sharedStream creates the stream as an administrator would for several
// publishers: relayd's settings, but subjects that do not capture relayd's,
// so relayd (nats.stream.create) must add its subject with STREAM.UPDATE.
func sharedStream(ctx context.Context, js jetstream.JetStream, b *bundle) error {
	cfg := wantStream(b).Config()
	cfg.Subjects = []string{"other.>"}
	// Settings of its own, which relayd must leave as they are.
	cfg.Description, cfg.Metadata = "relayd and other publishers", map[string]string{"owner": "platform"}
	cfg.MaxMsgsPerSubject, cfg.AllowDirect = 1000, true
	_, err := js.CreateStream(ctx, cfg)
	return err
}

// wantStream is the stream relayd creates with b's config.
func wantStream(b *bundle) stream.Want {
	s := b.cfg.NATS.Stream
	storage := jetstream.FileStorage
	if s.Storage == config.StorageMemory {
		storage = jetstream.MemoryStorage
	}
	return stream.Want{
		Name: s.Name, Subject: b.cfg.StreamSubject(), Create: s.Create,
		DuplicateWindow: s.DuplicateWindow.Duration(), Replicas: s.Replicas, Storage: storage,
		MaxAge: s.MaxAge.Duration(), MaxBytes: int64(s.MaxBytes),
	}
}

// TestNATSPermissionsAreEnoughAndEachIsNeeded runs the base's config as
// shipped (its stream, bucket, subjects and inbox prefix) with a NATS user
// that has exactly the permissions docs/DEPLOY.md lists: relayd creates its
// stream and index bucket, relays a change, and after a restart (object
// index loaded from the bucket and caught up from the stream) relays
// another; the same again on a stream that exists with other subjects
// (relayd adds its own). Then, for each subject of the list, the same from
// scratch without it (on the existing stream for STREAM.UPDATE, the only
// case that uses it): relayd's log must name the refused subject, and
// relayd must fail to relay (sources wait) — except without the bucket's
// CONSUMER.DELETE subject, which only cleans up consumers the server would
// expire anyway.
func TestNATSPermissionsAreEnoughAndEachIsNeeded(t *testing.T) {
	perms := docNATSPermissions(t)
	auth := &tokenAuth{}
	srv, err := testenv.StartNATS(testenv.NATSOptions{Auth: auth})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("relayd\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	in := newInstallOf(t, env, srv.URL(), baseDir, func(root *yaml.Node) {
		setKey(t, mapValue(t, root, "nats"), "tokenFile", tokenFile)
		plainOnLoopback(t, root)
	})
	b, ctx := in.b, t.Context()
	if inbox := b.cfg.NATS.InboxPrefix + ".>"; b.cfg.NATS.InboxPrefix == "" || !slices.Contains(perms.sub, inbox) {
		t.Fatalf("the base sets nats.inboxPrefix %q; docs/DEPLOY.md grants subscribe on %v, not on %q", b.cfg.NATS.InboxPrefix, perms.sub, inbox)
	}
	admin, err := nats.Connect(srv.URL(), nats.Token("admin"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	js, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	streamName, bucket := b.cfg.NATS.Stream.Name, b.cfg.NATS.Index.Bucket
	// sharedBefore is the shared stream's configuration as the server
	// reported it right after fresh created it.
	var sharedBefore map[string]json.RawMessage
	// fresh deletes the stream and bucket (and, with shared, creates the
	// stream with other subjects) and empties the checkpoint.
	fresh := func(t *testing.T, shared bool) {
		t.Helper()
		for _, s := range []string{streamName, "KV_" + bucket} {
			if err := js.DeleteStream(ctx, s); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
				t.Fatal(err)
			}
		}
		if shared {
			// Right after the delete, under load, the server may still be
			// removing the old stream's files: "error creating store for
			// stream" (10049). It goes away; retry for a while.
			var err error
			for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
				var apiErr *jetstream.APIError
				if err = sharedStream(ctx, js, b); err == nil || !errors.As(err, &apiErr) || apiErr.ErrorCode != 10049 || time.Now().After(deadline) {
					break
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			if sharedBefore, err = testenv.JSRequest(ctx, admin, "$JS.API.STREAM.INFO."+streamName, nil); err != nil {
				t.Fatal(err)
			}
		}
		resetCheckpoint(t, in.c, b.namespace(), b.checkpointCM.Name)
	}
	probe := newNATSProbe(t, in, js)
	// scenario: from scratch, relayd relays a change, checkpoints, stops,
	// restarts and relays another.
	scenario := func(t *testing.T, shared bool, timeout time.Duration) (logs []string, err error) {
		fresh(t, shared)
		for run := 1; run <= 2; run++ {
			r := in.run(t)
			_, err = probe.relayOne(ctx, r, timeout)
			if err == nil && run == 1 {
				err = waitCheckpointed(ctx, in, timeout)
			}
			stopErr := r.stop(t, in.grace)
			logs = append(logs, r.output()...)
			if err != nil {
				return logs, fmt.Errorf("run %d: %w", run, err)
			}
			if stopErr != nil {
				return logs, fmt.Errorf("run %d: stop: %w", run, stopErr)
			}
			if run == 1 {
				// A message after everything relayd published puts every
				// source's checkpoint behind the stream's end, so each
				// one reads the stream at the restart (which source
				// would otherwise depends on the order of their last
				// messages and bookmarks). The catch-up skips it: not
				// an event of any watch.
				if _, err := js.Publish(ctx, strings.TrimSuffix(b.cfg.StreamSubject(), ">")+"_test.restart", nil); err != nil {
					return logs, fmt.Errorf("publish a message before the restart: %w", err)
				}
			}
		}
		return logs, nil
	}

	auth.set(perms)
	for _, shared := range []bool{false, true} {
		what := map[bool]string{false: "from nothing", true: "on an existing stream with other subjects"}[shared]
		logs, err := scenario(t, shared, 30*time.Second)
		if err != nil {
			t.Fatalf("with exactly the documented permissions, %s: %v\nrelayd log:\n%s", what, err, strings.Join(logs, "\n"))
		}
		if vs := violations(logs); len(vs) > 0 {
			t.Fatalf("with exactly the documented permissions, %s, relayd was refused:\n%s", what, strings.Join(vs, "\n"))
		}
		t.Logf("with exactly the documented permissions (publish %v, subscribe %v), %s: relayed, restarted, relayed", perms.pub, perms.sub, what)
	}
	// The shared stream after relayd's two runs: its subject added, nothing
	// else changed, key by key in the server's JSON (docs/GUARANTEES.md, "A
	// shared stream").
	after, err := testenv.JSRequest(ctx, admin, "$JS.API.STREAM.INFO."+streamName, nil)
	if err != nil {
		t.Fatal(err)
	}
	var subjects []string
	if err := json.Unmarshal(after["subjects"], &subjects); err != nil || !slices.Equal(subjects, []string{"other.>", b.cfg.StreamSubject()}) {
		t.Errorf("relayd should have added %q to the shared stream's subjects, and only that: %q (%v)", b.cfg.StreamSubject(), subjects, err)
	}
	if diff := testenv.DiffConfigs(sharedBefore, after, "subjects"); len(diff) > 0 {
		t.Errorf("relayd changed more than the subjects of the shared stream:\n%s", strings.Join(diff, "\n"))
	}
	if t.Failed() {
		t.FailNow()
	}

	for _, kind := range []string{"publish", "subscribe"} {
		list := perms.pub
		if kind == "subscribe" {
			list = perms.sub
		}
		for i, subj := range list {
			// The answers to resync requests on the requesters' inboxes:
			// published only when asked, shown needed by
			// TestNATSResyncPermissions.
			if kind == "publish" && slices.ContainsFunc(b.cfg.Resync.RequesterInboxPrefixes, func(p string) bool { return subj == p+".>" }) {
				t.Logf("without publish %q: the resync answers; needed, see TestNATSResyncPermissions", subj)
				continue
			}
			t.Run("without "+kind+" "+subj, func(t *testing.T) {
				p := natsPermissions{pub: perms.pub, sub: perms.sub}
				if kind == "publish" {
					p.pub = slices.Delete(slices.Clone(perms.pub), i, i+1)
				} else {
					p.sub = slices.Delete(slices.Clone(perms.sub), i, i+1)
				}
				auth.set(p)
				defer auth.set(perms)
				// Only deleting a finished consumer is optional (the server
				// expires it); without anything else relayd must not
				// relay — in particular it must not skip the index
				// catch-up or the epoch read when they are refused.
				// Nor is the resync requests' subscription: without it
				// relayd relays, and only `relayd resync` finds no
				// responder (TestNATSResyncPermissions).
				optional := strings.Contains(subj, ".CONSUMER.DELETE.") || strings.Contains(subj, "-ctl.")
				// relayd relays within a second or two when it can (30 s
				// where it must, for a loaded machine); 10 s where it must
				// not also covers a retry after a refused request timed out
				// (5 s) and backed off, which must not succeed either.
				timeout := 10 * time.Second
				if optional {
					timeout = 30 * time.Second
				}
				// Only an existing stream that does not capture relayd's
				// subjects is updated.
				shared := strings.Contains(subj, ".STREAM.UPDATE.")
				logs, err := scenario(t, shared, timeout)
				var named []string
				for _, v := range violations(logs) {
					if m := refusedSubject.FindStringSubmatch(v); m != nil && m[1] == map[string]string{"publish": "Publish", "subscribe": "Subscription"}[kind] && subjectMatches(subj, m[2]) {
						named = append(named, m[2])
					}
				}
				if len(named) == 0 {
					t.Fatalf("without %s permission %q relayd's log names no refusal of it (relay error: %v): not needed? (then remove it from docs/DEPLOY.md)\n%s",
						kind, subj, err, strings.Join(logs, "\n"))
				}
				outcome := "relayd still relays"
				if err != nil {
					outcome = "relaying fails: " + err.Error()
				}
				if optional != (err == nil) {
					t.Errorf("without %s %q: %s; want relaying to %s", kind, subj, outcome, map[bool]string{true: "go on", false: "fail"}[optional])
				}
				t.Logf("without %s %q: %s; relayd logged %d refusals, e.g. of %q", kind, subj, outcome, len(named), named[0])
			})
		}
	}
}

// refusedSubject matches the server's message for a refused publish or
// subscription, as relayd logs it (JSON-escaped quotes).
var refusedSubject = regexp.MustCompile(`Permissions Violation for (Publish|Subscription) to \\"([^\\"]+)\\"`)

// subjectMatches reports whether subject matches the NATS pattern (with *
// for one token and > for the rest).
func subjectMatches(pattern, subject string) bool {
	p, s := strings.Split(pattern, "."), strings.Split(subject, ".")
	for i, tok := range p {
		if tok == ">" {
			return len(s) > i
		}
		if i >= len(s) || (tok != "*" && tok != s[i]) {
			return false
		}
	}
	return len(p) == len(s)
}

// violations returns the log lines that report a NATS permissions
// violation.
func violations(logs []string) []string {
	var out []string
	for _, l := range logs {
		if strings.Contains(strings.ToLower(l), "permissions violation") {
			out = append(out, l)
		}
	}
	return out
}

// waitCheckpointed waits until relayd wrote a position for every source.
func waitCheckpointed(ctx context.Context, in *install, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		cm, err := in.c.cs.CoreV1().ConfigMaps(in.b.namespace()).Get(ctx, in.b.checkpointCM.Name, metav1.GetOptions{})
		if err == nil && len(cm.Data) == len(in.b.cfg.Sources) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("checkpoint not written for every source: %v (%v)", cm.Data, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
