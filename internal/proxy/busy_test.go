package proxy

import (
	"context"
	"testing"
)

// countingBusy records Begin and End, and whether a check ran between.
type countingBusy struct {
	begins, ends int
}

func (c *countingBusy) Begin() { c.begins++ }
func (c *countingBusy) End()   { c.ends++ }

type checkFunc func(context.Context) ([]Drift, error)

func (f checkFunc) CheckDrift(ctx context.Context) ([]Drift, error) { return f(ctx) }

// TestBusyChecker: a drift check counts as busy from before it runs
// until after it returned, and its result is passed on.
func TestBusyChecker(t *testing.T) {
	b := &countingBusy{}
	inside := false
	c := BusyChecker(checkFunc(func(context.Context) ([]Drift, error) {
		inside = b.begins == 1 && b.ends == 0
		return []Drift{{Kind: "chain"}}, nil
	}), b)
	ds, err := c.CheckDrift(context.Background())
	if err != nil || len(ds) != 1 {
		t.Errorf("CheckDrift gave %v, %v, want the wrapped check's one drift", ds, err)
	}
	if !inside || b.begins != 1 || b.ends != 1 {
		t.Errorf("busy while checking: %v; Begin %d, End %d times, want once each", inside, b.begins, b.ends)
	}
}
