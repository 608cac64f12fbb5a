package deploy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/pkg/config"
	"github.com/relayd/relayd/pkg/index"
)

// The tests below run nats-server with the authorization blocks of
// docs/DEPLOY.md as its configuration text, as an operator would paste
// them, and relayd with the base's config logging in as the block says.
// Each needs one relayd run from an empty checkpoint (a few seconds).

// usersOpen is how the authorization blocks of docs/DEPLOY.md open their
// list of users.
const usersOpen = "users = ["

// withUsers inserts entries (nats-server config text) at the top of the
// users list of block, textually: the block stays as written otherwise.
func withUsers(t testing.TB, block, entries string) string {
	t.Helper()
	if strings.Count(block, usersOpen) != 1 {
		t.Fatalf("the authorization block does not open its users list with exactly one %q", usersOpen)
	}
	return strings.Replace(block, usersOpen, usersOpen+"\n"+entries+"\n", 1)
}

// withAdmin is block with one more user, "admin" (password "admin", every
// permission), for the test's own checks: stream lookups, pre-creating
// the stream and bucket.
func withAdmin(t testing.TB, block string) string {
	t.Helper()
	return withUsers(t, block, "    {user: admin, password: admin}")
}

// usersOf is the text inside the users list of an authorization block.
func usersOf(t testing.TB, block string) string {
	t.Helper()
	i, j := strings.Index(block, usersOpen), strings.LastIndex(block, "]")
	if i < 0 || j < i {
		t.Fatalf("no %q … ] in the authorization block", usersOpen)
	}
	return block[i+len(usersOpen) : j]
}

// randomPassword is a password nats-server reads from the environment
// unchanged (it parses a variable's value as a config value: letters and
// digits, starting with a letter, stay a string).
func randomPassword(t testing.TB) string {
	t.Helper()
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "p" + hex.EncodeToString(b)
}

func writeFile(t testing.TB, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// userPasswordFiles writes a user name and a password into two files and
// returns a config edit that points nats.userFile and nats.passwordFile at
// them.
func userPasswordFiles(t *testing.T, user, password string) func(root *yaml.Node) {
	t.Helper()
	dir := t.TempDir()
	userFile, passwordFile := writeFile(t, dir, "user", user+"\n"), writeFile(t, dir, "password", password+"\n")
	return func(root *yaml.Node) {
		n := mapValue(t, root, "nats")
		setKey(t, n, "userFile", userFile)
		setKey(t, n, "passwordFile", passwordFile)
		plainOnLoopback(t, root)
	}
}

// plainOnLoopback sets nats.allowPlaintextCredentials: the test servers
// of the permission tests listen on 127.0.0.1 without TLS, and relayd
// refuses credentials without TLS otherwise. relayOnce checks that relayd
// warned about it.
func plainOnLoopback(t testing.TB, root *yaml.Node) {
	t.Helper()
	setBool(t, root, true, "nats", "allowPlaintextCredentials")
}

// setBool sets the boolean at the path of mapping keys below m, adding the
// mappings and the key that are missing.
func setBool(t testing.TB, m *yaml.Node, value bool, keys ...string) {
	t.Helper()
	for i, key := range keys {
		if m.Kind != yaml.MappingNode {
			t.Fatalf("cannot set %q: not a mapping", strings.Join(keys[:i+1], "."))
		}
		var v *yaml.Node
		for j := 0; j+1 < len(m.Content); j += 2 {
			if m.Content[j].Value == key {
				v = m.Content[j+1]
			}
		}
		if v == nil {
			v = &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
			m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: key}, v)
		}
		m = v
	}
	*m = yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: fmt.Sprint(value)}
}

// adminJetStream connects to srv as the test's admin.
func adminJetStream(t testing.TB, url string, opts ...nats.Option) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatalf("connect as the admin: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// relayOnce runs relayd from an empty checkpoint until it has relayed one
// ConfigMap change (and is ready), stops it, and fails the test if it did
// not, or if any NATS permission was refused to it. It returns the event.
func relayOnce(t *testing.T, in *install, js jetstream.JetStream) *jetstream.RawStreamMsg {
	t.Helper()
	resetCheckpoint(t, in.c, in.b.namespace(), in.b.checkpointCM.Name)
	p := newNATSProbe(t, in, js)
	r := in.run(t)
	msg, err := p.relayOne(t.Context(), r, 30*time.Second)
	stopErr := r.stop(t, in.grace)
	logs := r.output()
	if err != nil {
		t.Fatalf("relayd did not relay a change: %v\nrelayd log:\n%s", err, strings.Join(logs, "\n"))
	}
	if stopErr != nil {
		t.Fatalf("stop relayd: %v", stopErr)
	}
	if vs := violations(logs); len(vs) > 0 {
		t.Fatalf("NATS refused relayd:\n%s", strings.Join(vs, "\n"))
	}
	checkConfigWarnings(t, in, logs)
	return msg
}

// checkConfigWarnings fails the test unless relayd logged at start exactly
// the warnings of the config it ran with (config.Warnings: credentials
// accepted on a connection without TLS), each once.
func checkConfigWarnings(t *testing.T, in *install, logs []string) {
	t.Helper()
	doc, _, err := unstructured.NestedString(in.configObject(t).Object, "data", in.b.configKey)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse([]byte(doc), "config.yaml")
	if err != nil {
		t.Fatalf("the config relayd ran with: %v", err)
	}
	var logged []string
	for _, l := range logs {
		var e struct{ Msg, Warning string }
		if json.Unmarshal([]byte(l), &e) == nil && e.Msg == "config warning" {
			logged = append(logged, e.Warning)
		}
	}
	ws := cfg.Warnings()
	if len(logged) != len(ws) {
		t.Fatalf("relayd logged %d config warnings, want %d (%v):\n%s", len(logged), len(ws), ws, strings.Join(logged, "\n"))
	}
	for i, w := range ws {
		// The file is where the test put it; the line, key and message
		// are the config's.
		if _, after, _ := strings.Cut(w.Error(), "config.yaml"); !strings.HasSuffix(logged[i], after) {
			t.Errorf("relayd logged the warning %q, want …%s", logged[i], after)
		}
	}
	if len(ws) > 0 {
		t.Logf("relayd warned: %s", logged[0])
	}
}

// rawRefusal matches a refusal as nats.go hands it to the error handler.
var rawRefusal = regexp.MustCompile(`Permissions Violation for (Publish|Subscription) to "([^"]+)"`)

// asyncErrors collects the asynchronous errors of a NATS connection.
type asyncErrors struct {
	mu   sync.Mutex
	errs []error
}

func (a *asyncErrors) handler(_ *nats.Conn, _ *nats.Subscription, err error) {
	a.mu.Lock()
	a.errs = append(a.errs, err)
	a.mu.Unlock()
}

// refused waits up to 5 s for a refusal of kind ("Publish" or
// "Subscription") to a subject that pattern matches, and returns that
// subject ("" if none came).
func (a *asyncErrors) refused(kind, pattern string) string {
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		a.mu.Lock()
		errs := slices.Clone(a.errs)
		a.mu.Unlock()
		for _, err := range errs {
			if m := rawRefusal.FindStringSubmatch(err.Error()); m != nil && m[1] == kind && subjectMatches(pattern, m[2]) {
				return m[2]
			}
		}
		if time.Now().After(deadline) {
			return ""
		}
	}
}

func (a *asyncErrors) String() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return fmt.Sprint(a.errs)
}

// TestNATSPermissionsBlockAsWritten: the authorization block of
// docs/DEPLOY.md, pasted into nats-server's configuration as it is (plus
// one admin user for the test's own checks), with RELAYD_NATS_PASSWORD in
// the server's environment, is enough for the base's config (its inbox
// prefix, stream and bucket) to log in with userFile/passwordFile, create
// its stream and bucket and relay a change, without any refusal; and it is
// in force (a wrong password, and a publish outside the block, are
// refused).
func TestNATSPermissionsBlockAsWritten(t *testing.T) {
	perms := docNATSPermissions(t)
	block := docBlock(t, relaydPermsBlock)
	// The block verbatim, with an extra {user: admin, password: admin}
	// inserted textually into its users list for the test's own checks.
	confText := withAdmin(t, block)
	password := randomPassword(t)
	t.Setenv("RELAYD_NATS_PASSWORD", password) // the block's $variable
	srv := testenv.NATST(t, testenv.NATSOptions{ConfigText: confText})

	in := newInstallOf(t, env, srv.URL(), baseDir, userPasswordFiles(t, "relayd", password))
	// The inbox, and the resync requests (pkg/resync.Subject).
	resyncReqs := in.b.cfg.Prefix + "-ctl." + in.b.cfg.Cluster + ".resync.*"
	if inbox := in.b.cfg.NATS.InboxPrefix + ".>"; in.b.cfg.NATS.InboxPrefix == "" || !slices.Equal(perms.sub, []string{inbox, resyncReqs}) {
		t.Fatalf("the base sets nats.inboxPrefix %q; docs/DEPLOY.md grants subscribe on %v, want exactly %q", in.b.cfg.NATS.InboxPrefix, perms.sub, []string{inbox, resyncReqs})
	}
	js := adminJetStream(t, srv.URL(), nats.UserInfo("admin", "admin"))
	msg := relayOnce(t, in, js)
	t.Logf("relayd logged in as the block's user relayd and relayed %s (stream sequence %d)", msg.Subject, msg.Sequence)

	if nc, err := nats.Connect(srv.URL(), nats.UserInfo("relayd", password+"x")); err == nil {
		nc.Close()
		t.Fatal("a wrong password was accepted: the block is not in force")
	}
	errs := &asyncErrors{}
	nc, err := nats.Connect(srv.URL(), nats.UserInfo("relayd", password), nats.ErrorHandler(errs.handler))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	other := "k8s.other-cluster.core.v1.configmaps.x.y.added"
	if err := nc.Publish(other, nil); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	if errs.refused("Publish", other) == "" {
		t.Fatalf("relayd's user may publish on %s, outside the block: %v", other, errs)
	}
}

// nscFlags are the --allow-pub and --allow-sub values of the nsc command
// in docs/DEPLOY.md, and its user name.
func nscFlags(t *testing.T) (user string, pub, sub []string) {
	t.Helper()
	text := strings.ReplaceAll(docBlock(t, nscPermsBlock), "\\\n", " ")
	for _, line := range strings.Split(text, "\n") {
		words := shellWords(t, line, nil)
		if len(words) < 3 || words[0] != "nsc" || !slices.Contains([]string{"add", "edit"}, words[1]) || words[2] != "user" {
			continue
		}
		if user != "" {
			t.Fatal("docs/DEPLOY.md: the nsc block has more than one nsc add/edit user command")
		}
		for i := 3; i < len(words); i++ {
			flag, value, hasValue := strings.Cut(words[i], "=")
			if !hasValue && i+1 < len(words) {
				value = words[i+1]
			}
			var list *[]string
			switch flag {
			case "--allow-pub":
				list = &pub
			case "--allow-sub":
				list = &sub
			case "--name", "-n":
				user = value
			case "--allow-pubsub", "--deny-pub", "--deny-sub", "--deny-pubsub":
				t.Fatalf("docs/DEPLOY.md: the nsc command uses %s; the test compares only --allow-pub and --allow-sub with the block", flag)
			default:
				continue
			}
			if !hasValue {
				i++
			}
			if list != nil {
				*list = append(*list, strings.Split(value, ",")...)
			}
		}
	}
	if user == "" {
		t.Fatal("docs/DEPLOY.md: no `nsc add user --name …` command in the nsc block")
	}
	return user, pub, sub
}

// TestNATSPermissionsOperatorMode: the nsc command of docs/DEPLOY.md
// grants exactly the subjects of the authorization block, and a user JWT
// with those lists, on a server in operator mode, is enough for the base's
// config (credentialsFile) to create its stream and bucket and relay a
// change, without any refusal.
func TestNATSPermissionsOperatorMode(t *testing.T) {
	perms := docNATSPermissions(t)
	user, pub, sub := nscFlags(t)
	sameSet := func(a, b []string) bool {
		a, b = slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b))
		return slices.Equal(a, b) && len(slices.Compact(a)) == len(b)
	}
	if !sameSet(pub, perms.pub) || !sameSet(sub, perms.sub) {
		t.Fatalf("docs/DEPLOY.md: the nsc command grants publish %q, subscribe %q; the authorization block publish %q, subscribe %q: they must list the same subjects",
			pub, sub, perms.pub, perms.sub)
	}
	op, err := testenv.NewOperator()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	creds, err := op.UserCreds(dir, user, pub, sub)
	if err != nil {
		t.Fatal(err)
	}
	adminCreds, err := op.UserCreds(dir, "admin", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := testenv.NATST(t, testenv.NATSOptions{Operator: op})
	in := newInstallOf(t, env, srv.URL(), baseDir, func(root *yaml.Node) {
		setKey(t, mapValue(t, root, "nats"), "credentialsFile", creds)
		plainOnLoopback(t, root)
	})
	js := adminJetStream(t, srv.URL(), nats.UserCredentials(adminCreds))
	msg := relayOnce(t, in, js)
	t.Logf("relayd logged in with the user JWT (%d publish, %d subscribe subjects) and relayed %s", len(pub), len(sub), msg.Subject)
}

// TestNATSPermissionsWithoutCreate: with the stream and bucket created
// beforehand (as relayd would create them) and nats.stream.create and
// nats.index.create false, the block of docs/DEPLOY.md without its lines
// marked "# create only" is enough to relay a change, relayd leaves the
// stream as it is, and relayd's credentials cannot change the stream
// (STREAM.UPDATE, e.g. shrinking maxAge, is refused).
func TestNATSPermissionsWithoutCreate(t *testing.T) {
	perms := docNATSPermissions(t)
	block := docBlock(t, relaydPermsBlock)
	reduced := createOnlyWholeLine.ReplaceAllString(block, "")
	rp := blockUserPermissions(t, relaydPermsBlock, reduced)
	want := slices.DeleteFunc(slices.Clone(perms.pub), func(s string) bool { return slices.Contains(perms.createOnly, s) })
	if len(perms.createOnly) == 0 || !slices.Equal(rp.pub, want) {
		t.Fatalf("dropping the lines marked # create only (%q) leaves %q, want %q", perms.createOnly, rp.pub, want)
	}
	password := randomPassword(t)
	t.Setenv("RELAYD_NATS_PASSWORD", password)
	srv := testenv.NATST(t, testenv.NATSOptions{ConfigText: withAdmin(t, reduced)})

	userPass := userPasswordFiles(t, "relayd", password)
	in := newInstallOf(t, env, srv.URL(), baseDir, func(root *yaml.Node) {
		userPass(root)
		setBool(t, root, false, "nats", "stream", "create")
		setBool(t, root, false, "nats", "index", "create")
	})
	b, ctx := in.b, t.Context()
	js := adminJetStream(t, srv.URL(), nats.UserInfo("admin", "admin"))
	// The stream and bucket as relayd would create them.
	name := b.cfg.NATS.Stream.Name
	if _, err := js.CreateStream(ctx, wantStream(b).Config()); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: b.cfg.NATS.Index.Bucket, History: 1, Storage: jetstream.FileStorage, LimitMarkerTTL: index.DefaultMarkerTTL,
	}); err != nil {
		t.Fatal(err)
	}
	streamConfig := func() jetstream.StreamConfig {
		t.Helper()
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		return s.CachedInfo().Config
	}
	before, rawBefore := streamConfig(), rawStreamConfig(t, js, name)

	msg := relayOnce(t, in, js)
	requireStreamUnchanged(t, js, name, rawBefore, "relayd changed the stream it may not create")
	t.Logf("without %q relayd relayed %s and left the stream as it was", perms.createOnly, msg.Subject)

	// relayd's credentials, with its inbox prefix: only the update itself
	// can be refused.
	errs := &asyncErrors{}
	nc, err := nats.Connect(srv.URL(), nats.UserInfo("relayd", password),
		nats.CustomInboxPrefix(b.cfg.NATS.InboxPrefix), nats.ErrorHandler(errs.handler))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	shrunk := before
	shrunk.MaxAge = time.Minute
	req, err := json.Marshal(shrunk)
	if err != nil {
		t.Fatal(err)
	}
	subject := "$JS.API.STREAM.UPDATE." + name
	reply, err := nc.Request(subject, req, 3*time.Second)
	if err == nil {
		t.Fatalf("%s with relayd's credentials was answered: %s", subject, reply.Data)
	}
	if errs.refused("Publish", subject) == "" {
		t.Fatalf("%s failed (%v), but the server reported no permissions violation for it: %v", subject, err, errs)
	}
	requireStreamUnchanged(t, js, name, rawBefore, "the refused update changed the stream")
	t.Logf("%s (maxAge %v -> %v) with relayd's credentials: refused (%v), the stream unchanged", subject, before.MaxAge, shrunk.MaxAge, err)
}

// consumerBlock is the consumers' block of docs/DEPLOY.md: its user, the
// password variable, the durable consumer's name (from its MSG.NEXT
// subject) and its inbox prefix (from its subscribe list).
type consumerBlock struct {
	text, user, passwordVar, durable, inbox string
	perms                                   natsPermissions
}

var blockUser = regexp.MustCompile(`(?m)^\s*user:\s*(\S+)\s*$`)

func docConsumerBlock(t *testing.T, stream string) consumerBlock {
	t.Helper()
	c := consumerBlock{text: docBlock(t, consumerPermsBlock)}
	c.perms = blockUserPermissions(t, consumerPermsBlock, c.text)
	if m := blockUser.FindStringSubmatch(c.text); m != nil {
		c.user = m[1]
	}
	if m := passwordVar.FindStringSubmatch(c.text); m != nil {
		c.passwordVar = m[1]
	}
	next := "$JS.API.CONSUMER.MSG.NEXT." + stream + "."
	for _, s := range c.perms.pub {
		if strings.HasPrefix(s, next) {
			c.durable = strings.TrimPrefix(s, next)
		}
	}
	if len(c.perms.sub) == 1 {
		c.inbox = strings.TrimSuffix(c.perms.sub[0], ".>")
	}
	if c.user == "" || c.passwordVar == "" || c.durable == "" || strings.ContainsAny(c.durable, "*>") || c.inbox == "" || c.inbox == c.perms.sub[0] {
		t.Fatalf("docs/DEPLOY.md: the consumers' block needs a user, a password: $VARIABLE, publish on %s<name> and subscribe on <inbox prefix>.> only; parsed %+v", next, c)
	}
	return c
}

// TestNATSConsumerPermissions: a consumer with exactly the consumers' block
// of docs/DEPLOY.md (merged with relayd's into one server configuration)
// creates its durable pull consumer, reads the event relayd relayed and
// acknowledges it; without any one of its allow subjects it cannot. It
// cannot publish on relayd's subjects (a JetStream publish fails, and the
// stream does not get the message), nor create a stream over them, nor
// shrink or purge relayd's stream.
func TestNATSConsumerPermissions(t *testing.T) {
	docNATSPermissions(t)
	relaydBlock := docBlock(t, relaydPermsBlock)
	// Needs the stream's name before the install; the base's is checked below.
	const stream = "K8S"
	cb := docConsumerBlock(t, stream)
	confText := withAdmin(t, withUsers(t, relaydBlock, usersOf(t, cb.text)))
	relaydPassword, consumerPassword := randomPassword(t), randomPassword(t)
	t.Setenv("RELAYD_NATS_PASSWORD", relaydPassword)
	t.Setenv(cb.passwordVar, consumerPassword)
	srv := testenv.NATST(t, testenv.NATSOptions{ConfigText: confText})

	in := newInstallOf(t, env, srv.URL(), baseDir, userPasswordFiles(t, "relayd", relaydPassword))
	b, ctx := in.b, t.Context()
	if b.cfg.NATS.Stream.Name != stream {
		t.Fatalf("the base's stream is %q; docs/DEPLOY.md's blocks use %q", b.cfg.NATS.Stream.Name, stream)
	}
	admin := adminJetStream(t, srv.URL(), nats.UserInfo("admin", "admin"))
	msg := relayOnce(t, in, admin)

	connect := func(t *testing.T) (jetstream.JetStream, *asyncErrors) {
		t.Helper()
		errs := &asyncErrors{}
		nc, err := nats.Connect(srv.URL(), nats.UserInfo(cb.user, consumerPassword),
			nats.CustomInboxPrefix(cb.inbox), nats.ErrorHandler(errs.handler))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		return js, errs
	}
	// consume is what a consumer does: look the stream up, create its
	// durable consumer (filtered on relayd's subjects, from the probe's
	// event on), pull the event and acknowledge it (waiting for the
	// server's confirmation), and look its consumer up again.
	consume := func(ctx context.Context, js jetstream.JetStream) error {
		s, err := js.Stream(ctx, stream)
		if err != nil {
			return fmt.Errorf("look the stream up: %w", err)
		}
		if _, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
			Durable: cb.durable, FilterSubject: b.cfg.StreamSubject(), AckPolicy: jetstream.AckExplicitPolicy,
			DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: msg.Sequence,
		}); err != nil {
			return fmt.Errorf("create the durable consumer: %w", err)
		}
		c, err := js.Consumer(ctx, stream, cb.durable)
		if err != nil {
			return fmt.Errorf("look the consumer up: %w", err)
		}
		batch, err := c.Fetch(1, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return fmt.Errorf("fetch: %w", err)
		}
		var got jetstream.Msg
		for m := range batch.Messages() {
			got = m
		}
		if got == nil {
			return fmt.Errorf("fetch: no message (%v)", batch.Error())
		}
		if got.Subject() != msg.Subject {
			return fmt.Errorf("fetched %s, want relayd's %s", got.Subject(), msg.Subject)
		}
		if err := got.DoubleAck(ctx); err != nil {
			return fmt.Errorf("ack: %w", err)
		}
		return nil
	}
	resetConsumer := func(t *testing.T) {
		t.Helper()
		if err := admin.DeleteConsumer(ctx, stream, cb.durable); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			t.Fatal(err)
		}
	}

	js, errs := connect(t)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err := consume(cctx, js)
	cancel()
	if err != nil {
		t.Fatalf("with exactly the documented permissions the consumer cannot read relayd's event: %v (async: %v)", err, errs)
	}
	c, err := admin.Consumer(ctx, stream, cb.durable)
	if err != nil {
		t.Fatal(err)
	}
	if ack := c.CachedInfo().AckFloor.Stream; ack != msg.Sequence {
		t.Fatalf("the consumer's ack floor is %d, want the event's %d", ack, msg.Sequence)
	}
	if vs := errs.String(); vs != "[]" {
		t.Fatalf("with exactly the documented permissions the consumer was refused: %s", vs)
	}
	t.Logf("consumer %s (publish %v, subscribe %v): read and acknowledged %s", cb.user, cb.perms.pub, cb.perms.sub, msg.Subject)

	// Each allow subject is needed: the server's users are reloaded with
	// one taken away (the deny list stays).
	setConsumerPerms := func(t *testing.T, pub, sub []string) {
		t.Helper()
		err := srv.Reload(func(o *server.Options) {
			for _, u := range o.Users {
				if u.Username == cb.user {
					u.Permissions = &server.Permissions{
						Publish:   &server.SubjectPermission{Allow: slices.Clone(pub), Deny: slices.Clone(cb.perms.pubDeny)},
						Subscribe: allowOnly(sub),
					}
				}
			}
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, kind := range []string{"Publish", "Subscription"} {
		list := cb.perms.pub
		if kind == "Subscription" {
			list = cb.perms.sub
		}
		for i, subj := range list {
			t.Run("without "+subj, func(t *testing.T) {
				pub, sub := cb.perms.pub, cb.perms.sub
				if kind == "Publish" {
					pub = slices.Delete(slices.Clone(pub), i, i+1)
				} else {
					sub = slices.Delete(slices.Clone(sub), i, i+1)
				}
				setConsumerPerms(t, pub, sub)
				defer setConsumerPerms(t, cb.perms.pub, cb.perms.sub)
				resetConsumer(t)
				js, errs := connect(t)
				cctx, cancel := context.WithTimeout(ctx, 4*time.Second)
				err := consume(cctx, js)
				cancel()
				named := errs.refused(kind, subj)
				if err == nil || named == "" {
					t.Fatalf("without %q: consume error %v, refusal of it %q (async: %v): not needed? (then remove it from docs/DEPLOY.md)", subj, err, named, errs)
				}
				t.Logf("without %q: %v; refused %q", subj, err, named)
			})
		}
	}

	// What a consumer must not do.
	js, errs = connect(t)
	try := func(what, subject string, do func(ctx context.Context) error) {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		err := do(cctx)
		cancel()
		if err == nil {
			t.Errorf("the consumer could %s", what)
			return
		}
		if errs.refused("Publish", subject) == "" {
			t.Errorf("the consumer could not %s (%v), but the server reported no permissions violation for %s: %v", what, err, subject, errs)
			return
		}
		t.Logf("%s: refused (%s; %v)", what, subject, err)
	}
	// A future event's subject and a predictable Nats-Msg-Id: published
	// first, it would make JetStream drop relayd's real event.
	fake := strings.TrimSuffix(b.cfg.StreamSubject(), ">") + "core.v1.configmaps.default.fake.added"
	try("publish on relayd's subjects", fake, func(ctx context.Context) error {
		_, err := js.Publish(ctx, fake, []byte("{}"), jetstream.WithMsgID(strings.TrimSuffix(b.cfg.StreamSubject(), ".>")+"/configmaps/0000/1"))
		return err
	})
	s, err := admin.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	if m, err := s.GetLastMsgForSubject(ctx, fake); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("the stream holds the consumer's message on %s (%v, %v)", fake, m, err)
	}
	try("create a stream over k8s.>", "$JS.API.STREAM.CREATE.EVIL", func(ctx context.Context) error {
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVIL", Subjects: []string{"k8s.>"}})
		return err
	})
	if _, err := admin.Stream(ctx, "EVIL"); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("stream EVIL: %v, want not found", err)
	}
	before, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	try("shrink relayd's stream's maxAge", "$JS.API.STREAM.UPDATE."+stream, func(ctx context.Context) error {
		cfg := before.Config
		cfg.MaxAge = time.Minute
		_, err := js.UpdateStream(ctx, cfg)
		return err
	})
	try("purge relayd's stream", "$JS.API.STREAM.PURGE."+stream, func(ctx context.Context) error {
		// Look the stream up (allowed), then purge it.
		cs, err := js.Stream(ctx, stream)
		if err != nil {
			return err
		}
		return cs.Purge(ctx)
	})
	after, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(after.Config, before.Config) || after.State.Msgs != before.State.Msgs {
		t.Errorf("relayd's stream changed: maxAge %v -> %v, %d -> %d messages", before.Config.MaxAge, after.Config.MaxAge, before.State.Msgs, after.State.Msgs)
	}
}

// createOnlyFor matches a subject line of relayd's block marked
// "# create only: <key>".
var createOnlyFor = regexp.MustCompile(`(?m)^[ \t]*"([^"]+)"[ \t]*# create only: (\S+)`)

// createOnlyBy lists the subjects of relayd's block of docs/DEPLOY.md
// marked "# create only: key".
func createOnlyBy(t *testing.T, key string) []string {
	t.Helper()
	var out []string
	for _, m := range createOnlyFor.FindAllStringSubmatch(docBlock(t, relaydPermsBlock), -1) {
		if m[2] == key {
			out = append(out, m[1])
		}
	}
	return out
}

// TestNATSSecureOverlayConnects runs deploy/overlays/nats-secure's config
// as rendered, its Secret's files standing in a folder, against a server
// that requires TLS with client certificates (the overlay's caFile,
// certFile and keyFile) and knows relayd as an NKey user (nkeySeedFile)
// with the permissions of docs/DEPLOY.md minus the lines marked "# create
// only: nats.stream.create" (the overlay sets it false; the stream is
// created beforehand, as an administrator would): relayd connects and
// relays a change, without any refusal and without a config warning, and
// leaves the stream as it was; relayd's credentials cannot change it
// (STREAM.UPDATE is not granted, and refused).
func TestNATSSecureOverlayConnects(t *testing.T) {
	perms := docNATSPermissions(t)
	sb := loadBundle(t, natsSecureDir)
	mount := natsSecretMount(t, sb)
	name := sb.cfg.NATS.Stream.Name
	if sb.cfg.NATS.Stream.Create {
		t.Fatal("the overlay sets nats.stream.create: relayd's user would need STREAM.CREATE and STREAM.UPDATE on its stream")
	}
	streamOnly := createOnlyBy(t, "nats.stream.create")
	grant := slices.DeleteFunc(slices.Clone(perms.pub), func(s string) bool { return slices.Contains(streamOnly, s) })
	for _, s := range grant {
		if s == "$JS.API.STREAM.UPDATE."+name || s == "$JS.API.STREAM.CREATE."+name {
			t.Fatalf("docs/DEPLOY.md grants %s without marking it \"# create only: nats.stream.create\"", s)
		}
	}
	if len(streamOnly) == 0 {
		t.Fatal(`docs/DEPLOY.md marks no subject "# create only: nats.stream.create"`)
	}
	tmp := t.TempDir()
	pki, err := testenv.NewPKI(mkdir(t, filepath.Join(tmp, "pki")))
	if err != nil {
		t.Fatal(err)
	}
	seedFile, pub, err := testenv.NewNkeyUser(tmp, "relayd")
	if err != nil {
		t.Fatal(err)
	}
	// The Secret's files, under the names the overlay's config uses.
	secret := mkdir(t, filepath.Join(tmp, "secret"))
	n := sb.cfg.NATS
	for configured, src := range map[string]string{
		n.TLS.CAFile: pki.CAFile, n.TLS.CertFile: pki.ClientCertFile, n.TLS.KeyFile: pki.ClientKeyFile, n.NkeySeedFile: seedFile,
	} {
		if !strings.HasPrefix(configured, mount.MountPath+"/") {
			t.Fatalf("the overlay's config reads %q, outside the Secret's mount %s", configured, mount.MountPath)
		}
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, secret, path.Base(configured), string(data))
	}
	srv := testenv.NATST(t, testenv.NATSOptions{
		TLS:   &testenv.NATSTLS{CertFile: pki.ServerCertFile, KeyFile: pki.ServerKeyFile, CAFile: pki.CAFile, Verify: true},
		Nkeys: []*server.NkeyUser{{Nkey: pub, Permissions: &server.Permissions{Publish: allowOnly(grant), Subscribe: allowOnly(perms.sub)}}},
		Users: []*server.User{{Username: "admin", Password: "admin"}},
	})
	in := newInstallOf(t, env, srv.URL(), natsSecureDir, func(root *yaml.Node) {
		// The mount path becomes the folder; nothing else changes.
		var walk func(*yaml.Node)
		walk = func(n *yaml.Node) {
			if n.Kind == yaml.ScalarNode && strings.HasPrefix(n.Value, mount.MountPath+"/") {
				n.Value = filepath.Join(secret, strings.TrimPrefix(n.Value, mount.MountPath+"/"))
			}
			for _, c := range n.Content {
				walk(c)
			}
		}
		walk(mapValue(t, root, "nats"))
	})
	tlsOpts := []nats.Option{nats.RootCAs(pki.CAFile), nats.ClientCert(pki.ClientCertFile, pki.ClientKeyFile)}
	js := adminJetStream(t, srv.URL(), append(tlsOpts, nats.UserInfo("admin", "admin"))...)
	ctx := t.Context()
	// The stream as an administrator creates it (as relayd would).
	if _, err := js.CreateStream(ctx, wantStream(in.b).Config()); err != nil {
		t.Fatal(err)
	}
	streamConfig := func() jetstream.StreamConfig {
		t.Helper()
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		return s.CachedInfo().Config
	}
	before, rawBefore := streamConfig(), rawStreamConfig(t, js, name)
	msg := relayOnce(t, in, js)
	requireStreamUnchanged(t, js, name, rawBefore, "relayd changed the stream")
	t.Logf("the nats-secure overlay's config (mTLS, NKey user, inbox prefix %s, without %q) relayed %s", in.b.cfg.NATS.InboxPrefix, streamOnly, msg.Subject)

	// relayd's credentials: an update of the stream is refused.
	nkey, err := nats.NkeyOptionFromSeed(seedFile)
	if err != nil {
		t.Fatal(err)
	}
	errs := &asyncErrors{}
	nc, err := nats.Connect(srv.URL(), append(tlsOpts, nkey, nats.CustomInboxPrefix(n.InboxPrefix), nats.ErrorHandler(errs.handler))...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	shrunk := before
	shrunk.MaxAge = time.Minute
	req, err := json.Marshal(shrunk)
	if err != nil {
		t.Fatal(err)
	}
	subject := "$JS.API.STREAM.UPDATE." + name
	if reply, err := nc.Request(subject, req, 3*time.Second); err == nil {
		t.Fatalf("%s with relayd's credentials was answered: %s", subject, reply.Data)
	}
	if errs.refused("Publish", subject) == "" {
		t.Fatalf("%s: no permissions violation reported: %v", subject, errs)
	}
	requireStreamUnchanged(t, js, name, rawBefore, "the refused update changed the stream")
}

// rawStreamConfig is the configuration of stream name as the server
// reports it (STREAM.INFO's JSON, key by key), through js's connection.
func rawStreamConfig(t *testing.T, js jetstream.JetStream, name string) map[string]json.RawMessage {
	t.Helper()
	c, err := testenv.JSRequest(t.Context(), js.Conn(), "$JS.API.STREAM.INFO."+name, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// requireStreamUnchanged fails, with what, naming each key of stream
// name's configuration that differs from before (rawStreamConfig), in
// full: settings nats.go does not model included.
func requireStreamUnchanged(t *testing.T, js jetstream.JetStream, name string, before map[string]json.RawMessage, what string) {
	t.Helper()
	if diff := testenv.DiffConfigs(before, rawStreamConfig(t, js, name)); len(diff) > 0 {
		t.Fatalf("%s:\n%s", what, strings.Join(diff, "\n"))
	}
}
