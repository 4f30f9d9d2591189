package proxy

import "context"

// Busy is told when work that leaves garbage on the heap begins and ends
// (idlemem.Releaser returns it to the system once kproxy is idle).
type Busy interface {
	Begin()
	End()
}

// BusyChecker tells b that a drift check runs: like a sync, it leaves
// garbage (iptables-save's whole output, parsed) worth returning once
// kproxy is idle again.
func BusyChecker(c DriftChecker, b Busy) DriftChecker { return busyChecker{DriftChecker: c, busy: b} }

type busyChecker struct {
	DriftChecker
	busy Busy
}

func (b busyChecker) CheckDrift(ctx context.Context) ([]Drift, error) {
	b.busy.Begin()
	defer b.busy.End()
	return b.DriftChecker.CheckDrift(ctx)
}
