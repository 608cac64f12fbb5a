package health

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestReasonIsTheFirstUnmetInOrder(t *testing.T) {
	c := NewConditions(
		Condition{Name: "a", Reason: ""},
		Condition{Name: "b", Reason: "b not yet"},
		Condition{Name: "c", Reason: "c not yet"},
	)
	steps := []struct {
		name, reason string
		want         string
	}{
		{"", "", "b not yet"},
		{"c", "c broken", "b not yet"},
		{"b", "", "c broken"},
		{"a", "a lost", "a lost"},
		{"a", "", "c broken"},
		{"c", "", ""},
		{"d", "d added later", "d added later"},
		{"d", "", ""},
	}
	for i, s := range steps {
		if s.name != "" {
			c.Set(s.name, s.reason)
		}
		if got := c.Reason(); got != s.want {
			t.Errorf("step %d (set %s=%q): Reason() = %q, want %q", i, s.name, s.reason, got, s.want)
		}
	}
	if !c.Met("a") || !c.Met("unknown") {
		t.Error("Met of a met or unknown condition is false")
	}
	c.Set("b", "b again")
	if c.Met("b") {
		t.Error("Met(b) after an unmet reason is true")
	}
}

func TestWaitIsWokenBySet(t *testing.T) {
	c := NewConditions(Condition{Name: "x", Reason: "x no"}, Condition{Name: "y", Reason: "y no"}, Condition{Name: "z", Reason: "z no"})
	done := make(chan error, 1)
	go func() { done <- c.Wait(t.Context(), "x", "y") }()
	c.Set("x", "")
	c.Set("x", "x no again")
	c.Set("y", "")
	select {
	case err := <-done:
		t.Fatalf("Wait returned (%v) while x is unmet", err)
	case <-time.After(50 * time.Millisecond):
	}
	c.Set("x", "") // z stays unmet: Wait does not ask for it
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Wait: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait not woken once x and y are met")
	}
	if err := c.Wait(t.Context(), "x", "y"); err != nil {
		t.Fatalf("Wait of met conditions: %v", err)
	}
}

func TestWaitEndsWithItsContext(t *testing.T) {
	c := NewConditions(Condition{Name: "x", Reason: "never"})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- c.Wait(ctx, "x") }()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Wait = %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not end with its context")
	}
}
