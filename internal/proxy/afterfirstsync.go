package proxy

import (
	"context"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
)

// AfterFirstSync removes the rules of the mode a node ran before (another
// proxy mode, or kube-proxy's chains in the other iptables backend) once
// kproxy's own rules are in place: after the first successful sync of
// every IP family kproxy proxies, never before. Removing them first (as
// upstream does, at start) leaves service traffic without any rule from
// then until the first sync: new connections fail, and a dropped SYN costs
// a client at least a second.
//
// While both are installed, running them side by side is harmless; they
// were built from the same cluster state:
//   - NAT: for a new connection the kernel runs the nat-type base chains
//     of a hook in priority order and stops at the first that sets up a
//     DNAT (nf_nat_inet_fn). iptables' nat PREROUTING/OUTPUT (legacy and
//     iptables-nft) and kproxy's nat-prerouting/nat-output chains all sit
//     at dstnat (-100), so exactly one of them DNATs each new connection,
//     to an endpoint of the same service. Established connections are not
//     looked at again: conntrack keeps their translation whichever mode
//     made it, also after that mode's rules are gone.
//   - Masquerade: both mark with the same bit (masqueradeBit, 14 unless
//     configured) and masquerade marked packets in nat postrouting at
//     srcnat (100), where the same first-binding rule holds: whichever
//     mode's DNAT marked a connection, the first masquerade chain binds it
//     (and clears the mark), once.
//   - Filter: both reject traffic to services without endpoints, drop
//     conntrack-invalid packets and apply loadBalancerSourceRanges from the
//     same objects, so neither refuses what the other lets through. IPVS
//     mode's virtual servers sit behind LOCAL_IN and after the DNAT at
//     LOCAL_OUT: a packet the new rules DNATed no longer matches them.
//
// A removal that fails is retried after the next syncs (maxSwitchCleanups
// attempts in all); the old rules stay meanwhile, which is the safe side.
type AfterFirstSync struct {
	// what names the old rules in the log.
	what   string
	remove func(context.Context) error
	// families are those whose first sync must have succeeded.
	families []v1.IPFamily

	mu     sync.Mutex
	synced map[v1.IPFamily]bool
	// all is closed once every family has synced (Synced).
	all      chan struct{}
	attempts int
	finished bool
	started  time.Time
}

// maxSwitchCleanups bounds how often a failing removal is tried.
const maxSwitchCleanups = 5

// NewAfterFirstSync wraps every family's backend so that it notices that
// family's first successful sync, and returns the hook to call after each
// sync of the loop (Run).
func NewAfterFirstSync(what string, backends map[v1.IPFamily]Backend, remove func(context.Context) error) *AfterFirstSync {
	a := &AfterFirstSync{what: what, remove: remove, synced: map[v1.IPFamily]bool{}, all: make(chan struct{}), started: time.Now()}
	for f, b := range backends {
		a.families = append(a.families, f)
		backends[f] = firstSyncWatch{Backend: b, family: f, after: a}
	}
	if len(a.families) == 0 {
		close(a.all)
	}
	return a
}

// firstSyncWatch tells AfterFirstSync when its family synced.
type firstSyncWatch struct {
	Backend
	family v1.IPFamily
	after  *AfterFirstSync
}

func (w firstSyncWatch) Sync(ctx context.Context, req *Request) (*Result, error) {
	res, err := w.Backend.Sync(ctx, req)
	// A trial of failure isolation may only have been checked: it puts
	// no rules in place.
	if err == nil && !req.Trial {
		w.after.mu.Lock()
		if !w.after.synced[w.family] {
			w.after.synced[w.family] = true
			if w.after.allSynced() {
				close(w.after.all)
			}
		}
		w.after.mu.Unlock()
	}
	return res, err
}

// WantsFullSync passes the wrapped backend's answer on.
func (w firstSyncWatch) WantsFullSync() bool {
	f, ok := w.Backend.(FullSyncWanter)
	return ok && f.WantsFullSync()
}

// CheckDrift passes the wrapped backend's drift check on (iptables mode's
// comparison with what kproxy wrote).
func (w firstSyncWatch) CheckDrift(ctx context.Context) ([]Drift, error) {
	if c, ok := w.Backend.(DriftChecker); ok {
		return c.CheckDrift(ctx)
	}
	return nil, nil
}

// WantsRepair and RepairTables pass nftables mode's targeted drift
// repair on (hidden, every repair was a full sync).
func (w firstSyncWatch) WantsRepair() bool {
	r, ok := w.Backend.(RepairWanter)
	return ok && r.WantsRepair()
}

func (w firstSyncWatch) RepairTables(tables []string) {
	if r, ok := w.Backend.(TableRepairer); ok {
		r.RepairTables(tables)
	}
}

// Run removes the old rules if every family has synced and they are not
// removed yet. Call it after each sync of the loop, from the sync runner
// (so that no sync runs meanwhile).
func (a *AfterFirstSync) Run(ctx context.Context) {
	if a == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.finished || ctx.Err() != nil {
		return
	}
	if !a.allSynced() {
		return
	}
	a.attempts++
	klog.V(2).InfoS("kproxy's rules are in place in every IP family; removing the other modes' rules", "what", a.what, "sinceStart", time.Since(a.started))
	err := a.remove(ctx)
	switch {
	case err == nil:
		a.finished = true
		klog.InfoS("Removed the rules of the mode this node ran before, after kproxy's first sync", "what", a.what, "sinceStart", time.Since(a.started))
	case a.attempts >= maxSwitchCleanups:
		a.finished = true
		klog.ErrorS(err, "Could not remove all rules of the mode this node ran before; giving up (`kproxy doctor` shows them, `kproxy --cleanup` with kproxy stopped removes them)", "what", a.what, "attempts", a.attempts)
	default:
		klog.ErrorS(err, "Could not remove all rules of the mode this node ran before; trying again after the next sync", "what", a.what, "attempt", a.attempts)
	}
}

// allSynced reports whether every family has synced. a.mu is held.
func (a *AfterFirstSync) allSynced() bool {
	for _, f := range a.families {
		if !a.synced[f] {
			return false
		}
	}
	return true
}

// Synced is closed once the first sync of every family has succeeded
// (nftables mode's drift monitor subscribes then).
func (a *AfterFirstSync) Synced() <-chan struct{} { return a.all }

// Done reports whether the removal is over (done or given up).
func (a *AfterFirstSync) Done() bool {
	if a == nil {
		return true
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.finished
}
