package proxy

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/metrics"
)

// This file is what every mode shares about drift: rules changed behind
// kproxy's back (another program, an operator's `nft flush ruleset` or
// `iptables -F`). A mode finds drift its own way (nftables: change
// notifications; iptables: comparing iptables-save with what it wrote);
// here it is reported, one log line and kproxy_rules_drift_total, and
// repaired by asking the loop for a full sync of the family. The render
// stays pure: nothing here touches rules.

// Drift is one difference between kproxy's rules and the kernel's.
type Drift struct {
	Family v1.IPFamily
	// Kind is the kind of object: table, chain, rule, set, map, element,
	// or unknown (notifications lost).
	Kind string
	// Name names the object: "ip kube-proxy", "ip kube-proxy/services"
	// in nftables mode, "nat/KUBE-SERVICES" in iptables mode.
	Name string
	// Change says what happened: "deleted", "added", "3 deleted",
	// "flushed (had 12 rules, now 0)"...
	Change string
}

func (d Drift) String() string {
	if d.Name == "" {
		return d.Kind + " " + d.Change
	}
	return d.Kind + " " + d.Name + " " + d.Change
}

// maxLoggedDrift bounds the differences named in one log line; the rest
// are counted.
const maxLoggedDrift = 8

// ReportDrift logs what differed in one line and counts each difference
// in kproxy_rules_drift_total{mode,kind}.
func ReportDrift(mode, source string, ds []Drift) {
	if len(ds) == 0 {
		return
	}
	var fams []string
	var names []string
	for i, d := range ds {
		metrics.RulesDriftTotal.WithLabelValues(mode, d.Kind).Inc()
		if !slices.Contains(fams, string(d.Family)) {
			fams = append(fams, string(d.Family))
		}
		if i < maxLoggedDrift {
			names = append(names, d.String())
		}
	}
	if len(ds) > maxLoggedDrift {
		names = append(names, fmt.Sprintf("(+%d more)", len(ds)-maxLoggedDrift))
	}
	slices.Sort(fams)
	klog.InfoS("Rules changed behind kproxy's back; repairing",
		"mode", mode, "foundBy", source, "ipFamilies", strings.Join(fams, ","), "changes", strings.Join(names, "; "))
}

// Repair asks for a full sync of a family soon (through the runner, so at
// most minSyncPeriod after the previous sync): the next Sync rewrites its
// rules whatever changed. Safe to call from any goroutine, also while a
// sync runs (then the one after it is full).
func (l *Loop) Repair(f v1.IPFamily) {
	l.repairMu.Lock()
	if _, ok := l.opts.Backends[f]; ok {
		l.repair[f] = true
	}
	l.repairMu.Unlock()
	switch {
	case l.opts.RequestUrgent != nil:
		// Services may be broken until the repair: it does not wait
		// out min-sync-period (the runner keeps two repairs in a row
		// from syncing back to back).
		l.opts.RequestUrgent()
	case l.opts.Request != nil:
		l.opts.Request()
	}
}

// RepairWanter is a backend that was told what drift damaged and repairs
// just that at its next sync, full or not (nftables mode's tables).
type RepairWanter interface {
	WantsRepair() bool
}

// TableRepairer is a RepairWanter told by name which of its tables
// others changed (nftables mode); the drift watch tells it, then calls
// RepairSoon.
type TableRepairer interface {
	RepairWanter
	RepairTables(tables []string)
}

// RepairSoon asks for a sync soon, as Repair does, that need not be full:
// a RepairWanter backend repairs what it was told (and falls back to a
// full sync itself when it cannot).
func (l *Loop) RepairSoon() {
	switch {
	case l.opts.RequestUrgent != nil:
		l.opts.RequestUrgent()
	case l.opts.Request != nil:
		l.opts.Request()
	}
}

// RepairTables is the nftables drift watch's report that others changed
// tables of family f: a backend that takes them (TableRepairer, through
// the wrappers Options.Backends holds) and then wants a repair gets a
// sync soon (RepairSoon); any other, or one that did not take them, a
// full sync (Repair). Safe to call from any goroutine.
func (l *Loop) RepairTables(f v1.IPFamily, tables []string) {
	if p, ok := l.opts.Backends[f].(TableRepairer); ok {
		if p.RepairTables(tables); p.WantsRepair() {
			l.RepairSoon()
			return
		}
	}
	l.Repair(f)
}

// takeRepairs marks the families Repair asked for as needing a full sync.
// l.mu is held.
func (l *Loop) takeRepairs() {
	l.repairMu.Lock()
	defer l.repairMu.Unlock()
	for f := range l.repair {
		klog.V(2).InfoS("Repair requested; this sync is full", "ipFamily", f)
		l.needFull[f] = true
	}
	clear(l.repair)
}

// DriftChecker is a backend that can compare the kernel's rules with what
// it last wrote (iptables mode). It returns ErrNothingToCompare when it
// has not written yet or its next sync is full anyway.
type DriftChecker interface {
	CheckDrift(ctx context.Context) ([]Drift, error)
}

// ErrNothingToCompare is a DriftChecker's answer when it read nothing: it
// has not written yet, or its next sync is full anyway. CheckDrifts does
// not time such a round as a check.
var ErrNothingToCompare = errors.New("no rules written to compare with")

// DriftCheckOptions bound how often CheckDrifts runs the checks.
type DriftCheckOptions struct {
	// Min and Max bound the pause between checks; within them it is
	// CostFactor times what a check takes (the cheaper of the last two,
	// so that one check slowed by a busy host does not stretch the next
	// pause), so that checking costs about 1/CostFactor of a core (an
	// iptables-save of 10k services through iptables-nft takes over a
	// second).
	Min, Max   time.Duration
	CostFactor int
}

// CheckBackendDrifts runs CheckDrifts over the backends that are
// DriftCheckers (iptables mode), each telling busy while it checks.
func (l *Loop) CheckBackendDrifts(ctx context.Context, mode string, busy Busy, o DriftCheckOptions) {
	checkers := map[v1.IPFamily]DriftChecker{}
	for f, b := range l.opts.Backends {
		if c, ok := b.(DriftChecker); ok {
			checkers[f] = BusyChecker(c, busy)
		}
	}
	l.CheckDrifts(ctx, mode, checkers, o)
}

// CheckDrifts runs the checkers on a bounded schedule until ctx ends;
// drift is reported (mode, "comparison") and repaired through l.Repair.
func (l *Loop) CheckDrifts(ctx context.Context, mode string, checkers map[v1.IPFamily]DriftChecker, o DriftCheckOptions) {
	if o.CostFactor <= 0 {
		o.CostFactor = 10
	}
	wait := o.Min
	var prevCost time.Duration
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		start := time.Now()
		compared := false
		for f, c := range checkers {
			ds, err := c.CheckDrift(ctx)
			if errors.Is(err, ErrNothingToCompare) {
				continue
			}
			compared = true
			if err != nil {
				if ctx.Err() == nil {
					klog.V(2).InfoS("Could not compare the rules with what kproxy wrote", "ipFamily", f, "err", err)
				}
				continue
			}
			if len(ds) > 0 {
				ReportDrift(mode, "comparison", ds)
				l.Repair(f)
			}
		}
		if !compared {
			// Before the first sync: the rounds that read nothing say
			// nothing of what a check costs (taken as one, they made
			// the first two checks after it run a Min apart).
			wait = o.Min
			continue
		}
		last := time.Since(start)
		cost := last
		if prevCost > 0 {
			cost = min(cost, prevCost)
		}
		prevCost = last
		wait = min(max(time.Duration(o.CostFactor)*cost, o.Min), o.Max)
	}
}
