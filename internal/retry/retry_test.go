package retry

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"k8s.io/apimachinery/pkg/util/wait"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A failure every second for three minutes: one line when it starts, one
// summary a minute (with the count, the first and the last error), one
// line when it recovers; a new run starts over.
func TestFailuresLogsStartSummariesAndEnd(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	now := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)
	f := NewFailures(zap.New(core), "checkpoint write failed", WithClock(func() time.Time { return now }))
	f.OK() // nothing failed: nothing logged
	for i := range 180 {
		f.Fail(errors.New("connection refused"), zap.String("configMap", "relayd/cp"))
		if i == 179 {
			break
		}
		now = now.Add(time.Second)
	}
	if n := f.Failing(); n != 180 {
		t.Errorf("Failing() = %d, want 180", n)
	}
	f.Fail(errors.New("timeout"))
	now = now.Add(500 * time.Millisecond)
	f.OK()
	var got []string
	for _, e := range logs.All() {
		got = append(got, e.Level.String()+" "+e.Message)
	}
	want := []string{
		"error checkpoint write failed",
		"error checkpoint write failed (still failing)",
		"error checkpoint write failed (still failing)",
		"info checkpoint write failed: recovered",
	}
	if len(got) != len(want) {
		t.Fatalf("logged %d lines, want %d:\n%v", len(got), len(want), got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("line %d: %q, want %q", i, got[i], want[i])
		}
	}
	all := logs.All()
	if all[0].ContextMap()["configMap"] != "relayd/cp" || all[0].ContextMap()["error"] != "connection refused" {
		t.Errorf("first line fields %v", all[0].ContextMap())
	}
	sum := all[2].ContextMap()
	if sum["failures"] != int64(121) || sum["sinceLastLine"] != int64(60) || sum["firstError"] != "connection refused" || sum["lastError"] != "connection refused" {
		t.Errorf("second summary fields %v", sum)
	}
	end := all[3].ContextMap()
	if end["failures"] != int64(181) || end["lastError"] != "timeout" || end["for"] != 179500*time.Millisecond {
		t.Errorf("recovered fields %v", end)
	}
	f.Fail(errors.New("again"))
	if last := logs.All()[logs.Len()-1]; last.Message != "checkpoint write failed" || f.Failing() != 1 {
		t.Errorf("a new run does not start over: %q, %d", last.Message, f.Failing())
	}
}

func TestAtLevelAndSleep(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	f := NewFailures(zap.New(core), "watch failed; retrying", AtLevel(zapcore.WarnLevel), Every(time.Nanosecond))
	f.Fail(errors.New("a"))
	f.Fail(errors.New("b"))
	if logs.Len() != 2 || logs.All()[0].Level != zapcore.WarnLevel || logs.All()[1].Level != zapcore.WarnLevel {
		t.Errorf("lines %v", logs.All())
	}
	if !Sleep(context.Background(), time.Millisecond) {
		t.Error("Sleep did not wait")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Sleep(ctx, time.Hour) {
		t.Error("Sleep waited past a cancelled context")
	}
}

// With LogChanges a failure whose error differs from the previous one is
// logged in full at once; repeats of it are still only summarised.
func TestLogChanges(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	now := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)
	f := NewFailures(zap.New(core), "source stopped; restarting", LogChanges(), WithClock(func() time.Time { return now }))
	for _, e := range []string{"not found", "not found", "apiVersion not served", "apiVersion not served", "apiVersion not served"} {
		f.Fail(errors.New(e))
		now = now.Add(time.Second)
	}
	var got []string
	for _, e := range logs.All() {
		got = append(got, e.Message+": "+e.ContextMap()["error"].(string))
	}
	want := []string{"source stopped; restarting: not found", "source stopped; restarting: apiVersion not served"}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("logged %q, want %q", got, want)
	}
}

// Until retries with the backoff's waits until the attempt succeeds,
// reports the failures and the recovery through Failures, and stops with
// its context without reporting the failure the stop caused.
func TestUntilRetriesUntilSuccessOrStop(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	f := NewFailures(zap.New(core), "cannot open it")
	b := wait.Backoff{Duration: time.Millisecond, Factor: 2, Steps: 1 << 30, Cap: 4 * time.Millisecond}
	calls := 0
	ok := Until(t.Context(), b, f, func(context.Context) error {
		if calls++; calls < 4 {
			return errors.New("refused")
		}
		return nil
	}, zap.String("bucket", "b"))
	if !ok || calls != 4 {
		t.Fatalf("Until = %v after %d calls, want true after 4", ok, calls)
	}
	var got []string
	for _, e := range logs.All() {
		got = append(got, e.Message)
	}
	if len(got) != 2 || got[0] != "cannot open it" || got[1] != "cannot open it: recovered" {
		t.Fatalf("logged %q, want the first failure and the recovery", got)
	}
	first := logs.All()[0].ContextMap()
	if first["bucket"] != "b" || first["in"] != time.Millisecond || first["error"] != "refused" {
		t.Errorf("first failure's fields %v", first)
	}
	if end := logs.All()[1].ContextMap(); end["failures"] != int64(3) || end["bucket"] != "b" {
		t.Errorf("recovery's fields %v", end)
	}

	// Stopped: the attempt that fails because ctx ended is not reported.
	ctx, cancel := context.WithCancel(t.Context())
	before := logs.Len()
	calls = 0
	ok = Until(ctx, b, f, func(ctx context.Context) error {
		calls++
		cancel()
		return ctx.Err()
	})
	if ok || calls != 1 || logs.Len() != before {
		t.Errorf("Until after stop = %v, %d calls, %d new lines; want false, 1, 0", ok, calls, logs.Len()-before)
	}
	// Stopped while waiting: false, the failure was reported.
	ctx, cancel = context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	ok = Until(ctx, wait.Backoff{Duration: time.Hour, Steps: 1}, NewFailures(zap.New(core), "never"), func(context.Context) error {
		return errors.New("down")
	})
	if ok || logs.FilterMessage("never").Len() != 1 {
		t.Errorf("Until stopped while waiting = %v, %d failure lines; want false, 1", ok, logs.FilterMessage("never").Len())
	}
}
