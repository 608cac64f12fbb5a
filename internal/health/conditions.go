package health

import (
	"context"
	"sync"
)

// Conditions is the readiness of a process, fed by its components: each
// condition is met ("") or not, with the reason an operator reads on
// /readyz, and the component that owns it sets it as its state changes.
// Reason reports the first unmet condition, in the order given to
// NewConditions; Wait blocks until the conditions it names are met, woken
// by Set rather than by polling. Safe for concurrent use.
type Conditions struct {
	mu      sync.Mutex
	order   []string
	reason  map[string]string
	changed chan struct{} // closed, and replaced, by every Set that changes a reason
}

// Condition is one condition and its initial reason ("" = met).
type Condition struct {
	Name   string
	Reason string
}

// NewConditions returns the conditions cs, in that order.
func NewConditions(cs ...Condition) *Conditions {
	c := &Conditions{reason: make(map[string]string, len(cs)), changed: make(chan struct{})}
	for _, x := range cs {
		c.order = append(c.order, x.Name)
		c.reason[x.Name] = x.Reason
	}
	return c
}

// Set records why the condition name is not met ("" = it is). A name not
// given to NewConditions is added last.
func (c *Conditions) Set(name, reason string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	old, known := c.reason[name]
	if !known {
		c.order = append(c.order, name)
	}
	if known && old == reason {
		return
	}
	c.reason[name] = reason
	close(c.changed)
	c.changed = make(chan struct{})
}

// Met reports whether the condition name is met.
func (c *Conditions) Met(name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reason[name] == ""
}

// Reason is the reason of the first unmet condition, "" when all are met.
func (c *Conditions) Reason() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, name := range c.order {
		if r := c.reason[name]; r != "" {
			return r
		}
	}
	return ""
}

// Wait blocks until every condition of names is met at once, or ctx ends
// (its error).
func (c *Conditions) Wait(ctx context.Context, names ...string) error {
	for {
		c.mu.Lock()
		met := true
		for _, name := range names {
			if c.reason[name] != "" {
				met = false
				break
			}
		}
		changed := c.changed
		c.mu.Unlock()
		if met {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Waiter waits until the conditions it names are met (Conditions.Wait).
type Waiter struct {
	c     *Conditions
	names []string
}

// Waiter returns the Waiter of names.
func (c *Conditions) Waiter(names ...string) Waiter { return Waiter{c: c, names: names} }

// Wait blocks until every condition of the Waiter is met at once, or ctx
// ends (its error).
func (w Waiter) Wait(ctx context.Context) error { return w.c.Wait(ctx, w.names...) }
