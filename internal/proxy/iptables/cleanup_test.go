package iptables

import (
	"context"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/proxy"
)

// TestLastCheckDue: the other backend is looked at once per period from
// the drift checks; a full sync's look counts as one.
func TestLastCheckDue(t *testing.T) {
	l := &lastCheck{}
	if !l.due(time.Hour) {
		t.Fatal("first check not due")
	}
	if l.due(time.Hour) {
		t.Fatal("second check within the period was due")
	}
	if !l.due(0) {
		t.Fatal("a check with no period (a full sync's) was not due")
	}
	l.at = time.Now().Add(-2 * time.Hour)
	if !l.due(time.Hour) {
		t.Fatal("a check after the period was not due")
	}
	var none *lastCheck
	if !none.due(time.Hour) {
		t.Fatal("without a clock every check is due")
	}
}

// driftingBackend is a backend with iptables mode's drift check.
type driftingBackend struct{}

func (driftingBackend) Sync(context.Context, *proxy.Request) (*proxy.Result, error) {
	return &proxy.Result{}, nil
}

func (driftingBackend) CheckDrift(context.Context) ([]proxy.Drift, error) {
	return []proxy.Drift{{Kind: "chain"}}, nil
}

// TestWatchOtherBackendKeepsDriftCheck: the other-backend wrapper keeps
// the backend's drift check reachable (hiding it switched iptables mode's
// drift repair off), and while the removal after the first sync is not
// over it does not look at the other backend.
func TestWatchOtherBackendKeepsDriftCheck(t *testing.T) {
	w := WatchOtherBackend(driftingBackend{}, xtables.NFT, nil, func() bool { return false }, time.Hour)
	c, ok := w.(proxy.DriftChecker)
	if !ok {
		t.Fatalf("the wrapped backend %T hides CheckDrift", w)
	}
	if ds, err := c.CheckDrift(context.Background()); err != nil || len(ds) != 1 {
		t.Errorf("CheckDrift through the wrapper gave %v, %v, want the backend's one drift", ds, err)
	}
	if !w.(otherBackendWatch).last.at.IsZero() {
		t.Error("the other backend was looked at before the removal after the first sync was over")
	}
}
