package deploy

import (
	"bytes"
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

	// relayd's allow_responses is needed: without it relayd cannot answer.
	t.Run("relayd without allow_responses", func(t *testing.T) {
		setResponses := func(p *server.ResponsePermission) {
			t.Helper()
			if err := srv.Reload(func(o *server.Options) {
				for _, u := range o.Users {
					if u.Username == "relayd" {
						u.Permissions.Response = p
					}
				}
			}); err != nil {
				t.Fatal(err)
			}
		}
		var kept *server.ResponsePermission
		if err := srv.Reload(func(o *server.Options) { // reads the block's
			for _, u := range o.Users {
				if u.Username == "relayd" && u.Permissions != nil && u.Permissions.Response != nil {
					r := *u.Permissions.Response
					kept = &r
				}
			}
		}); err != nil {
			t.Fatal(err)
		}
		if kept == nil {
			t.Fatal("relayd's block of docs/DEPLOY.md does not allow responses")
		}
		setResponses(nil)
		defer setResponses(kept)
		code, out, stderr := resync(opConf)
		if want := "relayd resync: relayd did not answer within 3s on k8s-ctl."; code != 1 || !strings.HasPrefix(stderr, want) {
			t.Fatalf("relayd without allow_responses: exit %d, stdout %q, stderr %q; want exit 1, %s…", code, out, stderr, want)
		}
		t.Logf("relayd without allow_responses: %s", strings.TrimSpace(stderr))
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
