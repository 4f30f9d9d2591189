package faultplan

import (
	"errors"
	"testing"
)

func TestPlan(t *testing.T) {
	var p Plan[string]
	a, b, c := errors.New("a"), errors.New("b"), errors.New("c")
	if err := p.Enter("add"); err != nil {
		t.Fatalf("zero plan: %v", err)
	}
	p.FailNext("add", a, nil, b)
	p.FailAlways("del", c)
	for i, want := range []error{a, nil, b, nil} {
		if err := p.Enter("add"); err != want {
			t.Errorf("add call %d: %v, want %v", i, err, want)
		}
	}
	for range 2 {
		if err := p.Enter("del"); err != c {
			t.Errorf("del: %v, want %v", err, c)
		}
	}
	p.FailAlways("del", nil)
	if err := p.Enter("del"); err != nil {
		t.Errorf("del after clearing: %v", err)
	}
	if p.Calls("add") != 5 || p.Calls("del") != 3 || p.Calls("list") != 0 {
		t.Errorf("calls add=%d del=%d list=%d, want 5 3 0", p.Calls("add"), p.Calls("del"), p.Calls("list"))
	}
	p.ResetCalls()
	if p.Calls("add") != 0 {
		t.Errorf("after ResetCalls: %d", p.Calls("add"))
	}
}
