package iptables

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/metrics"
	"github.com/kproxy/kproxy/internal/proxy"
)

// What iptables mode leaves when another mode takes over, and its watch
// on the iptables backend it does not use.

// CleanupLeftovers removes what kube-proxy's iptables and IPVS modes left
// in one iptables backend, both families (xtables.CleanupLeftovers: the
// kubelet's chains stay), with one log line for the backend. A backend
// whose binaries are not installed has nothing to remove.
func CleanupLeftovers(ctx context.Context, b xtables.Backend, opts ...xtables.Option) error {
	var errs []error
	var families []xtables.Family
	total := 0
	for _, f := range xtables.Families {
		chains, err := xtables.FindLeftovers(ctx, b, f, opts...)
		if errors.Is(err, xtables.ErrNotInstalled) {
			// A host without these binaries cannot have rules of this
			// backend that kube-proxy made from it: nothing to do.
			klog.V(2).InfoS("Skipped the check for leftover iptables rules", "backend", b, "family", f, "reason", err)
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if len(chains) > 0 {
			families = append(families, f)
			total += len(chains)
		}
	}
	if total == 0 {
		return errors.Join(errs...)
	}
	klog.InfoS("Removing leftover iptables rules of kube-proxy's iptables and IPVS modes", "backend", b, "families", families, "chains", total)
	for _, f := range families {
		if _, err := xtables.CleanupLeftovers(ctx, b, f, opts...); err != nil {
			errs = append(errs, fmt.Errorf("removing kube-proxy's %s %s iptables rules: %w", b, f, err))
		}
	}
	return errors.Join(errs...)
}

// WatchOtherBackend wraps the primary family's backend so that it looks
// at the iptables backend kproxy does not use (chosen's other) after full
// syncs and with the drift checks, at most once per every, once done
// says the removal after the first sync is over (see otherBackendWatch).
func WatchOtherBackend(b proxy.Backend, chosen xtables.Backend, opts []xtables.Option, done func() bool, every time.Duration) proxy.Backend {
	return otherBackendWatch{Backend: b, chosen: chosen, opts: opts, done: done, every: every, last: &lastCheck{}}
}

// otherBackendWatch checks, after every full sync and with every drift
// check (at least every sync period: full syncs are hourly), whether the
// iptables backend kproxy does not use holds kube-proxy chains. Until the
// removal after the first sync is over it stays quiet: those chains are
// the previous run's, about to go.
type otherBackendWatch struct {
	proxy.Backend
	chosen xtables.Backend
	opts   []xtables.Option
	// done reports whether the removal after the first sync is over.
	done func() bool
	// every spaces the checks made with the drift checks (which may run
	// every second): each lists the other backend's tables and, while it
	// finds chains, logs a warning. last is when one last ran.
	every time.Duration
	last  *lastCheck
}

// lastCheck is when the other backend was last looked at.
type lastCheck struct {
	mu sync.Mutex
	at time.Time
}

// due reports whether every has passed since the last check, and if so
// counts now as the last check.
func (l *lastCheck) due(every time.Duration) bool {
	if l == nil {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if now := time.Now(); l.at.IsZero() || now.Sub(l.at) >= every {
		l.at = now
		return true
	}
	return false
}

// CheckDrift passes the wrapped backend's drift check on, then looks at
// the other backend if a sync period has passed since it last did.
func (w otherBackendWatch) CheckDrift(ctx context.Context) ([]proxy.Drift, error) {
	var ds []proxy.Drift
	var err error
	if c, ok := w.Backend.(proxy.DriftChecker); ok {
		ds, err = c.CheckDrift(ctx)
	}
	if w.done() && ctx.Err() == nil && w.last.due(w.every) {
		ReportOtherBackend(ctx, w.chosen, w.opts)
	}
	return ds, err
}

// WantsFullSync passes the wrapped backend's answer on.
func (w otherBackendWatch) WantsFullSync() bool {
	f, ok := w.Backend.(proxy.FullSyncWanter)
	return ok && f.WantsFullSync()
}

func (w otherBackendWatch) Sync(ctx context.Context, req *proxy.Request) (*proxy.Result, error) {
	res, err := w.Backend.Sync(ctx, req)
	if err == nil && req.Full && w.done() {
		w.last.due(0) // counts as a check
		ReportOtherBackend(ctx, w.chosen, w.opts)
	}
	return res, err
}

// maxNamedChains bounds how many chains the warning names.
const maxNamedChains = 8

// ReportOtherBackend warns when the backend kproxy does not use holds
// kube-proxy chains: rules of both backends run on every packet, so they
// can send service traffic to stale endpoints. It never changes them:
// kproxy removes the other backend's kube-proxy chains once, after its
// first sync (a switch of backends); chains that come back later were
// written by something else (another kube-proxy still running), which
// kproxy does not fight. `kproxy --cleanup` removes them.
func ReportOtherBackend(ctx context.Context, chosen xtables.Backend, opts []xtables.Option) int {
	other := chosen.Other()
	found, err := xtables.OtherBackendRules(ctx, chosen, opts...)
	if err != nil {
		klog.ErrorS(err, "Could not check the other iptables backend for kube-proxy rules", "backend", other)
	}
	metrics.IPTablesOtherBackendChains.WithLabelValues(string(other)).Set(float64(len(found)))
	if len(found) == 0 {
		return 0
	}
	var names []string
	for i, l := range found {
		if i == maxNamedChains {
			names = append(names, fmt.Sprintf("and %d more", len(found)-maxNamedChains))
			break
		}
		names = append(names, l.String())
	}
	klog.InfoS("WARNING: kube-proxy rules found in the iptables backend kproxy does not use; both backends' rules run on every packet, so they can misroute service traffic. Something else wrote them after kproxy started (another kube-proxy?); stop it, then remove them with `kproxy --cleanup` (stop kproxy first)",
		"using", chosen, "otherBackend", other, "chains", len(found), "names", strings.Join(names, ", "))
	return len(found)
}
