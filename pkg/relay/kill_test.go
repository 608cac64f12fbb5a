package relay_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/relayd/relayd/internal/testenv"
)

// relaydBinary is the test build of relayd, bin/relayd-test as built by
// `make build` (testenv.RelaydTestBin): the binary tests run it with the
// index consistency check on (RELAYD_INDEX_CHECK=1), which only a test
// build honours.
func relaydBinary(t *testing.T) string {
	t.Helper()
	return testenv.RelaydTestBin(t)
}

func TestKill9BetweenWritesLosesNothingAndStoresEachChangeOnce(t *testing.T) {
	forEachVersion(t, kill9BetweenWrites)
}

func kill9BetweenWrites(t *testing.T, e *testenv.Env) {
	bin := relaydBinary(t)
	f := newFixture(t, e, natsSrv, `
  - name: cms
    apiVersion: v1
    kind: ConfigMap
    namespaces: [$NS]`)
	dir := t.TempDir()
	kc, cfgFile := filepath.Join(dir, "kubeconfig"), filepath.Join(dir, "config.yaml")
	if err := f.env.WriteKubeconfig(kc, false); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfgFile, []byte(f.cfgYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()

	// Reference history: an independent watch from before the first write.
	ref := f.reference("")

	start := func() *exec.Cmd {
		cmd := exec.Command(bin, "run", "-c", cfgFile, "--kubeconfig", kc,
			"--metrics-bind-address", "127.0.0.1:0", "--health-probe-bind-address", "127.0.0.1:0", "--log-level", "warn")
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		logf, _ := os.OpenFile(filepath.Join(dir, "relayd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	// The guarantee covers changes after a checkpoint: let the first run
	// write one (the initial snapshot is state, not history).
	cmd := start()
	f.eventually(30*time.Second, "first checkpoint", func() error {
		cm, err := f.cs.CoreV1().ConfigMaps(f.ns).Get(ctx, "cp", metav1.GetOptions{})
		if err != nil || cm.Data["cms."+f.ns] == "" {
			return fmt.Errorf("no checkpoint yet (%v)", err)
		}
		return nil
	})

	// Writer: creates, updates and deletes at a steady pace.
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		w := &churn{cs: f.cs, ns: f.ns, rng: rand.New(rand.NewPCG(1, 2)), names: 12, deleteOneIn: 4}
		for i := 0; i < 120; i++ {
			if err := w.write(ctx, i); err != nil {
				t.Error(err)
				return
			}
			time.Sleep(25 * time.Millisecond)
		}
	}()

	// kill -9 at random moments while the writer runs.
	kills := 0
	for ; ; cmd = start() {
		select {
		case <-writerDone:
		case <-time.After(time.Duration(300+rand.IntN(700)) * time.Millisecond):
		}
		select {
		case <-writerDone:
			// Final run: let it catch up, then stop it gracefully.
			f.waitEveryChange(ref, 60*time.Second)
			_ = cmd.Process.Signal(syscall.SIGTERM)
			if err := cmd.Wait(); err != nil {
				t.Errorf("graceful stop: %v", err)
			}
		default:
			_ = cmd.Process.Kill() // SIGKILL
			_ = cmd.Wait()
			kills++
			continue
		}
		break
	}
	ref.close()

	// Exactly once: each (uid, rv, type) is stored once; JetStream dropped
	// the replays by Nats-Msg-Id.
	count := storedChanges(f.stored(), false)
	objects := 0
	for _, n := range count {
		objects += n
	}
	for c, n := range count {
		if n != 1 {
			t.Errorf("%+v stored %d times", c, n)
		}
	}
	history := ref.changes()
	for _, c := range history {
		if count[c] != 1 {
			t.Errorf("reference change %+v stored %d times", c, count[c])
		}
	}
	if objects != len(history) {
		t.Errorf("stream holds %d object events, the reference watch saw %d changes", objects, len(history))
	}
	if kills < 2 {
		t.Errorf("only %d kills happened; the test did not exercise restarts", kills)
	}
	// Every restart resumed from the checkpoint (docs/GUARANTEES.md,
	// "Delivery guarantees"): one list in all, the first run's snapshot; the other
	// runs watched from a resourceVersion.
	l := relaydRequests(t, e, "configmaps", f.ns)
	t.Logf("Kubernetes %s, relayd's requests: %v", e.Version(), l)
	if l.streamed != 1 || len(l.refused) > 0 || l.pages > 0 || l.resumes < 1 {
		t.Errorf("Kubernetes %s: %v; want 1 streaming list and watches from the checkpoint after it", e.Version(), l)
	}
	t.Logf("%d changes, %d kill -9 restarts, %d object events stored", len(history), kills, objects)
	if t.Failed() {
		b, _ := os.ReadFile(filepath.Join(dir, "relayd.log"))
		t.Logf("relayd log:\n%s", b)
	}
}
