package deploy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.yaml.in/yaml/v3"

	"github.com/relayd/relayd/internal/testenv"
)

// resyncPermsBlock is the operators' block of docs/DEPLOY.md ("Resync on
// request (operators)").
const resyncPermsBlock = "nats-resync-permissions"

// TestNATSResyncPermissions: nats-server runs relayd's block, the
// consumers' and the operators' of docs/DEPLOY.md merged (plus the test's
// admin), relayd the base's config. `relayd resync` with the operator's
// credentials (a copy of the base's config logging in as the operator,
// with its inbox prefix) completes; without any one of the operator's
// subjects it exits 1 naming the refused permission; with the consumer's
// credentials it is refused, and relayd relists nothing.
func TestNATSResyncPermissions(t *testing.T) {
	docNATSPermissions(t)
	const stream = "K8S"
	cb := docConsumerBlock(t, stream)
	ob := docBlock(t, resyncPermsBlock)
	op := blockUserPermissions(t, resyncPermsBlock, ob)
	opUser, opVar, opInbox := "", "", ""
	if m := blockUser.FindStringSubmatch(ob); m != nil {
		opUser = m[1]
	}
	if m := passwordVar.FindStringSubmatch(ob); m != nil {
		opVar = m[1]
	}
	for _, s := range op.sub {
		if strings.HasPrefix(s, "_INBOX") {
			opInbox = strings.TrimSuffix(s, ".>")
		}
	}
	if opUser == "" || opVar == "" || opInbox == "" {
		t.Fatalf("docs/DEPLOY.md: the operators' block needs a user, a password: $VARIABLE and subscribe on <inbox prefix>.>; parsed %q %q %v", opUser, opVar, op.sub)
	}
	confText := withAdmin(t, withUsers(t, withUsers(t, docBlock(t, relaydPermsBlock), usersOf(t, cb.text)), usersOf(t, ob)))
	relaydPassword, consumerPassword, opPassword := randomPassword(t), randomPassword(t), randomPassword(t)
	t.Setenv("RELAYD_NATS_PASSWORD", relaydPassword)
	t.Setenv(cb.passwordVar, consumerPassword)
	t.Setenv(opVar, opPassword)
	srv := testenv.NATST(t, testenv.NATSOptions{ConfigText: confText})

	in := newInstallOf(t, env, srv.URL(), baseDir, userPasswordFiles(t, "relayd", relaydPassword))
	admin := adminJetStream(t, srv.URL(), nats.UserInfo("admin", "admin"))
	resetCheckpoint(t, in.c, in.b.namespace(), in.b.checkpointCM.Name)
	r := in.run(t)
	defer func() { _ = r.stop(t, in.grace) }()
	if _, err := newNATSProbe(t, in, admin).relayOne(t.Context(), r, 30*time.Second); err != nil {
		t.Fatalf("relayd did not relay a change: %v\n%s", err, strings.Join(r.output(), "\n"))
	}
	source := in.b.cfg.Sources[0].Name

	// configAs is the base's config logging in as user, with inbox.
	configAs := func(user, password, inbox string) string {
		b, err := os.ReadFile(filepath.Join(in.mount, "config.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		var root yaml.Node
		if err := yaml.Unmarshal(b, &root); err != nil {
			t.Fatal(err)
		}
		userPasswordFiles(t, user, password)(root.Content[0])
		setKey(t, mapValue(t, root.Content[0], "nats"), "inboxPrefix", inbox)
		out, err := yaml.Marshal(&root)
		if err != nil {
			t.Fatal(err)
		}
		return writeFile(t, t.TempDir(), "config.yaml", string(out))
	}
	resync := func(conf string) (int, string, string) {
		cmd := exec.Command(in.bin, "resync", "-c", conf, "--source", source, "--timeout", "3s", "--wait", "30s")
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return exit.ExitCode(), out.String(), errb.String()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0, out.String(), errb.String()
	}
	opConf := configAs(opUser, opPassword, opInbox)
	code, out, stderr := resync(opConf)
	if code != 0 || !strings.Contains(out, "of source "+source+" completed") {
		t.Fatalf("with exactly the operators' documented permissions: exit %d\n%s%s", code, out, stderr)
	}
	t.Logf("operator %s (publish %v, subscribe %v): %s", opUser, op.pub, op.sub, strings.SplitN(out, "\n", 2)[0])

	setOperatorPerms := func(t *testing.T, pub, sub []string) {
		t.Helper()
		err := srv.Reload(func(o *server.Options) {
			for _, u := range o.Users {
				if u.Username == opUser {
					u.Permissions = &server.Permissions{Publish: allowOnly(pub), Subscribe: allowOnly(sub)}
				}
			}
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, kind := range []string{"Publish", "Subscription"} {
		list := op.pub
		if kind == "Subscription" {
			list = op.sub
		}
		for i, subj := range list {
			t.Run("without "+subj, func(t *testing.T) {
				pub, sub := op.pub, op.sub
				if kind == "Publish" {
					pub = slices.Delete(slices.Clone(pub), i, i+1)
				} else {
					sub = slices.Delete(slices.Clone(sub), i, i+1)
				}
				setOperatorPerms(t, pub, sub)
				defer setOperatorPerms(t, op.pub, op.sub)
				code, out, stderr := resync(opConf)
				m := rawRefusal.FindStringSubmatch(stderr)
				if code != 1 || !strings.Contains(stderr, "relayd resync: NATS refused a permission: ") || m == nil || m[1] != kind || !subjectMatches(subj, m[2]) {
					t.Fatalf("without %s %q: exit %d, stdout %q, stderr %q; want exit 1 and the refusal named", kind, subj, code, out, stderr)
				}
				t.Logf("without %s %q: %s", kind, subj, strings.TrimSpace(stderr))
			})
		}
	}

	// relayd answers on the operators' inboxes (resync.requesterInboxPrefixes)
	// and its block grants publish there, not allow_responses: without the
	// grant the server refuses relayd's answer.
	opReplies := opInbox + ".>"
	if !slices.Contains(in.b.cfg.Resync.RequesterInboxPrefixes, opInbox) {
		t.Fatalf("the base's resync.requesterInboxPrefixes %v do not list the operators' inbox prefix %q", in.b.cfg.Resync.RequesterInboxPrefixes, opInbox)
	}
	relaydPerms := docNATSPermissions(t)
	if !slices.Contains(relaydPerms.pub, opReplies) {
		t.Fatalf("relayd's block of docs/DEPLOY.md does not grant publish on the operators' inboxes %q: %v", opReplies, relaydPerms.pub)
	}
	// The block parsed as nats-server does: no allow_responses (a reply to
	// any subject a requester names).
	if err := srv.Reload(func(o *server.Options) {
		for _, u := range o.Users {
			if u.Username == "relayd" && u.Permissions != nil && u.Permissions.Response != nil {
				t.Errorf("relayd's block of docs/DEPLOY.md allows responses (%+v): a requester would choose the subject relayd publishes on", *u.Permissions.Response)
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	t.Run("relayd without publish "+opReplies, func(t *testing.T) {
		setRelaydPub := func(pub []string) {
			t.Helper()
			if err := srv.Reload(func(o *server.Options) {
				for _, u := range o.Users {
					if u.Username == "relayd" {
						u.Permissions.Publish = allowOnly(pub)
					}
				}
			}); err != nil {
				t.Fatal(err)
			}
		}
		setRelaydPub(slices.DeleteFunc(slices.Clone(relaydPerms.pub), func(s string) bool { return s == opReplies }))
		defer setRelaydPub(relaydPerms.pub)
		logged := len(r.output())
		code, out, stderr := resync(opConf)
		if want := "relayd resync: relayd did not answer within 3s on k8s-ctl."; code != 1 || !strings.HasPrefix(stderr, want) {
			t.Fatalf("relayd without publish %s: exit %d, stdout %q, stderr %q; want exit 1, %s…", opReplies, code, out, stderr, want)
		}
		var named []string
		for _, v := range violations(r.output()[logged:]) {
			if m := refusedSubject.FindStringSubmatch(v); m != nil && m[1] == "Publish" && subjectMatches(opReplies, m[2]) {
				named = append(named, m[2])
			}
		}
		if len(named) == 0 {
			t.Fatalf("relayd without publish %s: relayd's log names no refused answer:\n%s", opReplies, strings.Join(r.output()[logged:], "\n"))
		}
		t.Logf("relayd without publish %s: %s; relayd's answer on %s refused", opReplies, strings.TrimSpace(stderr), named[0])
	})

	t.Run("forged reply subjects", func(t *testing.T) {
		forgedReplies(t, in, r, srv.URL(), opUser, opPassword, opInbox, source)
	})

	// A consumer cannot make relayd relist.
	before, err := metricOf(r, "relayd_relists_total", map[string]string{"source": source, "reason": "requested"})
	if err != nil {
		t.Fatal(err)
	}
	code, out, stderr = resync(configAs(cb.user, consumerPassword, cb.inbox))
	if code != 1 || !strings.Contains(stderr, "relayd resync: NATS refused a permission: ") {
		t.Fatalf("with the consumer's credentials: exit %d, stdout %q, stderr %q; want exit 1, a permission refused", code, out, stderr)
	}
	t.Logf("consumer %s, relayd resync: %s", cb.user, strings.TrimSpace(stderr))
	// The request itself, as the consumer: refused.
	errs := &asyncErrors{}
	nc, err := nats.Connect(srv.URL(), nats.UserInfo(cb.user, consumerPassword), nats.CustomInboxPrefix(cb.inbox), nats.ErrorHandler(errs.handler))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	subj := "k8s-ctl." + in.b.cfg.Cluster + ".resync." + source
	if _, err := nc.Request(subj, []byte(`{"id":"consumer-1"}`), 2*time.Second); err == nil {
		t.Fatalf("the consumer's resync request on %s was answered", subj)
	}
	if got := errs.refused("Publish", subj); got != subj {
		t.Fatalf("the consumer's request on %s: no publish refusal (%s)", subj, errs)
	}
	t.Logf("consumer %s, request on %s: refused", cb.user, subj)
	if after, err := metricOf(r, "relayd_relists_total", map[string]string{"source": source, "reason": "requested"}); err != nil || after != before {
		t.Errorf("relayd_relists_total{reason=requested} went from %v to %v (%v) on the consumer's request", before, after, err)
	}
}

// metricOf is the value of a sample of relayd's /metrics whose labels
// include labels.
func metricOf(r *relayd, name string, labels map[string]string) (float64, error) {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + r.metricsAddr + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		ok := strings.HasPrefix(l, name+"{")
		for k, v := range labels {
			ok = ok && strings.Contains(l, fmt.Sprintf("%s=%q", k, v))
		}
		if ok {
			f := strings.Fields(l)
			return strconv.ParseFloat(f[len(f)-1], 64)
		}
	}
	return 0, fmt.Errorf("no sample %s%v", name, labels)
}

// forgedReplies: an operator (who may send resync requests) names as
// reply subject an event subject of this cluster and of another, an index
// epoch key and the JetStream API. relayd answers none of them and acts on
// none (no relist): nothing is published on them (the admin, subscribed to
// each, gets nothing before the answer to a later request on the
// operator's inbox, which relayd publishes after them), the event streams
// store nothing, the epoch key keeps its revision, and
// relayd_resync_requests_total{result="bad_reply"} counts them.
func forgedReplies(t *testing.T, in *install, r *relayd, url, opUser, opPassword, opInbox, source string) {
	ctx := t.Context()
	cluster, bucket := in.b.cfg.Cluster, in.b.cfg.NATS.Index.Bucket
	admin, err := nats.Connect(url, nats.UserInfo("admin", "admin"), nats.CustomInboxPrefix("_INBOX_admin"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	js, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	// Another cluster's stream on the shared NATS.
	west, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "WEST", Subjects: []string{in.b.cfg.Prefix + ".west.>"}, Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = js.DeleteStream(context.Background(), "WEST") }()
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		t.Fatal(err)
	}
	epochKey := "_epoch." + source + "._"
	epoch, err := kv.Get(ctx, epochKey)
	if err != nil {
		t.Fatalf("index epoch key %s of %s: %v", epochKey, bucket, err)
	}
	forged := []string{
		in.b.cfg.Prefix + "." + cluster + ".configmaps.default.forged",
		in.b.cfg.Prefix + ".west.configmaps.default.forged",
		"$KV." + bucket + "." + epochKey,
		"$JS.API.STREAM.PURGE." + in.b.cfg.NATS.Stream.Name,
	}
	// The admin sees what is published on each, and on the barrier's inbox.
	seen := make(chan *nats.Msg, 64)
	barrier := opInbox + ".barrier." + strconv.FormatInt(time.Now().UnixNano(), 36)
	for _, subj := range append(slices.Clone(forged), barrier) {
		sub, err := admin.ChanSubscribe(subj, seen)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = sub.Unsubscribe() }()
	}
	if err := admin.Flush(); err != nil {
		t.Fatal(err)
	}
	events, err := js.Stream(ctx, in.b.cfg.NATS.Stream.Name)
	if err != nil {
		t.Fatal(err)
	}
	relists0, err := metricOf(r, "relayd_relists_total", map[string]string{"source": source, "reason": "requested"})
	if err != nil {
		t.Fatal(err)
	}
	bad0, err := metricOf(r, "relayd_resync_requests_total", map[string]string{"source": source, "result": "bad_reply"})
	if err != nil {
		t.Fatal(err)
	}

	errs := &asyncErrors{}
	op, err := nats.Connect(url, nats.UserInfo(opUser, opPassword), nats.CustomInboxPrefix(opInbox), nats.ErrorHandler(errs.handler))
	if err != nil {
		t.Fatal(err)
	}
	defer op.Close()
	subj := "k8s-ctl." + cluster + ".resync." + source
	for i, reply := range forged {
		body := fmt.Sprintf(`{"id":"forged-%d","full":true}`, i)
		if err := op.PublishMsg(&nats.Msg{Subject: subj, Reply: reply, Data: []byte(body)}); err != nil {
			t.Fatal(err)
		}
	}
	// The barrier: a request on the operator's inbox, answered after the
	// forged ones (one subscription, in order). Its id is not valid: the
	// answer is a refusal, nothing is relisted.
	sub, err := op.SubscribeSync(barrier)
	if err != nil {
		t.Fatal(err)
	}
	if err := op.PublishMsg(&nats.Msg{Subject: subj, Reply: barrier, Data: []byte(`{"id":"barrier !"}`)}); err != nil {
		t.Fatal(err)
	}
	answer, err := sub.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatalf("no answer on the operator's inbox %s: %v (%s)\n%s", barrier, err, errs, strings.Join(r.output(), "\n"))
	}
	if !strings.Contains(string(answer.Data), `"error":"request id \"barrier !\": want 1 to 64 characters`) {
		t.Fatalf("answer on the operator's inbox %s: %s; want the refusal of its id", barrier, answer.Data)
	}
	t.Logf("answer on the operator's inbox %s: %s", barrier, answer.Data)
	// What the admin saw until relayd's answer on the barrier.
	for done := false; !done; {
		select {
		case m := <-seen:
			if done = m.Subject == barrier; !done {
				t.Errorf("relayd published on the forged reply subject %s: %s", m.Subject, m.Data)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("the admin did not see relayd's answer on %s", barrier)
		}
	}
	for _, reply := range forged[:2] {
		if _, err := events.GetLastMsgForSubject(ctx, reply); !errors.Is(err, jetstream.ErrMsgNotFound) {
			t.Errorf("%s stored a message on %s (%v)", in.b.cfg.NATS.Stream.Name, reply, err)
		}
	}
	if info, err := west.Info(ctx); err != nil || info.State.Msgs != 0 {
		t.Errorf("another cluster's stream WEST: %+v (%v); want no message", info, err)
	}
	if now, err := kv.Get(ctx, epochKey); err != nil || now.Revision() != epoch.Revision() || string(now.Value()) != string(epoch.Value()) {
		var rev uint64
		var val []byte
		if err == nil {
			rev, val = now.Revision(), now.Value()
		}
		t.Errorf("index epoch key %s: revision %d %q before, now %d %q (%v)", epochKey, epoch.Revision(), epoch.Value(), rev, val, err)
	}
	if relists, err := metricOf(r, "relayd_relists_total", map[string]string{"source": source, "reason": "requested"}); err != nil || relists != relists0 {
		t.Errorf("relayd_relists_total{reason=requested} went from %v to %v (%v) on the forged requests", relists0, relists, err)
	}
	if bad, err := metricOf(r, "relayd_resync_requests_total", map[string]string{"source": source, "result": "bad_reply"}); err != nil || bad-bad0 != float64(len(forged)) {
		t.Errorf("relayd_resync_requests_total{result=bad_reply} went from %v to %v (%v), want +%d", bad0, bad, err, len(forged))
	}
	var logged []string
	for _, l := range r.output() {
		if strings.Contains(l, "not answered and not acted on") {
			logged = append(logged, l)
		}
	}
	if len(logged) != 1 || !strings.Contains(logged[0], forged[0]) {
		t.Errorf("relayd logged %d lines on the %d forged requests, want one naming %s:\n%s", len(logged), len(forged), forged[0], strings.Join(logged, "\n"))
	}
	if !t.Failed() {
		t.Logf("forged reply subjects %v: nothing published, stored or changed; relayd logged: %s", forged, strings.Join(logged, "\n"))
	}
}
