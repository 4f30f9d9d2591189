package nftables

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"runtime/debug"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/metrics"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy"
	"github.com/kproxy/kproxy/internal/proxy/udpflows"
)

// fullSyncFreeThreshold: below this many operations a full sync's batch is
// too small to be worth returning to the OS eagerly.
const fullSyncFreeThreshold = 50000

// Proxier is the nftables backend of one IP family.
type Proxier struct {
	opts Options
	nft  nft.Interface
	// host clears conntrack entries and reads the host's addresses.
	host    proxy.HostHandles
	applied *Applied
	cfg     *Config
	// wroteTable is set once a sync of this process has been applied.
	wroteTable bool
	// addrs follows the node port addresses between full syncs.
	addrs *proxy.AddressWatch

	// damaged are tables others changed, for the next sync to repair
	// (repair.go); set from the drift watch's goroutine.
	damagedMu sync.Mutex
	damaged   sets.Set[string]
}

var (
	_ proxy.Backend       = (*Proxier)(nil)
	_ proxy.TableRepairer = (*Proxier)(nil)
)

// Handles are the kernel interfaces one proxier works through.
type Handles struct {
	// NFT programs nf_tables.
	NFT nft.Interface
	// HostHandles: Conntrack and LocalAddrs.
	proxy.HostHandles
}

// NewProxier returns one family's proxier.
func NewProxier(opts Options, h Handles) (*Proxier, error) {
	if err := proxy.CheckNew("nftables", opts.Family, h.NFT == nil, "nf_tables interface"); err != nil {
		return nil, err
	}
	p := &Proxier{opts: opts, nft: h.NFT, host: h.HostHandles, applied: NewApplied()}
	p.addrs = proxy.NewAddressWatch(h.LocalAddrs, func(node *model.Node, addrs []netip.Addr) []netip.Addr {
		return opts.RenderConfig(node, addrs).NodePortIPs
	})
	return p, nil
}

// WantsFullSync implements proxy.FullSyncWanter: the node port addresses
// the host has now are not those of the last full sync (upstream's
// nftables mode reads them only at its hourly full sync).
func (p *Proxier) WantsFullSync() bool { return p.addrs.Changed() }

// RepairTables records tables of ours that another program changed: the
// next sync re-creates them as last applied (RenderRepair), or syncs in
// full when it cannot. Safe to call from any goroutine.
func (p *Proxier) RepairTables(tables []string) {
	p.damagedMu.Lock()
	defer p.damagedMu.Unlock()
	if p.damaged == nil {
		p.damaged = sets.New[string]()
	}
	p.damaged.Insert(tables...)
}

// WantsRepair implements proxy.RepairWanter: tables wait to be repaired.
func (p *Proxier) WantsRepair() bool {
	p.damagedMu.Lock()
	defer p.damagedMu.Unlock()
	return p.damaged.Len() > 0
}

func (p *Proxier) takeDamaged() []string {
	p.damagedMu.Lock()
	defer p.damagedMu.Unlock()
	t := sets.List(p.damaged)
	p.damaged = nil
	return t
}

// repair re-creates damaged tables from the applied state in a
// transaction of their own, before the sync's changes are rendered. It
// returns errRepairUncertain (wrapped) when a full sync must do it.
func (p *Proxier) repair(ctx context.Context, in *Input, damaged []string) error {
	start := time.Now()
	all, err := p.nft.ListTables(ctx, nft.FamilyFor(p.opts.Family))
	if err != nil {
		return err
	}
	exists := map[string]bool{}
	for _, t := range all {
		exists[t] = true
	}
	plan, err := RenderRepair(p.cfg, in, damaged, exists, p.applied)
	if err != nil {
		return err
	}
	if err := p.nft.Apply(ctx, plan.Tx); err != nil {
		metrics.NFTablesSyncFailuresTotal.WithLabelValues(string(p.opts.Family)).Inc()
		p.cfg = nil
		return fmt.Errorf("repairing nftables tables %v (%d operations): %w", damaged, plan.Tx.Len(), err)
	}
	plan.Commit(p.applied)
	klog.InfoS("Repaired nftables tables changed by others", "ipFamily", p.opts.Family, "tables", damaged, "operations", plan.Tx.Len(), "seconds", time.Since(start).Seconds())
	return nil
}

// Sync implements proxy.Backend.
func (p *Proxier) Sync(ctx context.Context, req *proxy.Request) (*proxy.Result, error) {
	fam, table := nft.FamilyFor(p.opts.Family), p.table()
	in := &Input{RenderInput: proxy.RenderInput{State: req.State, Changed: req.Changed}, Full: req.Full, Now: req.Now}
	if req.Node != nil {
		in.NodeName, in.Zone = req.Node.Name, req.Node.Zone()
	}
	full := req.Full || p.cfg == nil
	if !req.Trial {
		// A full sync rewrites damaged tables with the rest.
		if damaged := p.takeDamaged(); len(damaged) > 0 && !full {
			if err := p.repair(ctx, in, damaged); errors.Is(err, errRepairUncertain) {
				klog.InfoS("Repairing with a full sync", "ipFamily", p.opts.Family, "reason", err)
				full = true
			} else if err != nil {
				return nil, err
			}
		}
	}
	if full {
		in.Full = true
		addrs, err := proxy.NodePortHostAddrs(p.host.LocalAddrs, req.Node)
		if err != nil {
			return nil, err
		}
		p.cfg = p.opts.RenderConfig(req.Node, addrs)
		if len(req.ServiceCIDRs) > 0 {
			// The ServiceCIDR objects' (the loop syncs in full when
			// they change); Options' only stand in when there are none.
			p.cfg.ServiceCIDRs = req.ServiceCIDRs
		}
		// Read the kernel before rendering: which of our tables exist
		// (the main one and its shards), with which chains and sets (left
		// by a previous run or a failed sync).
		all, err := p.nft.ListTables(ctx, fam)
		if err != nil {
			return nil, err
		}
		ours := OurTables(table, all)
		in.Existing = make(map[string]Objects, len(ours))
		for _, t := range ours {
			var o Objects
			if o.Chains, err = p.nft.ListChains(ctx, fam, t); err != nil {
				return nil, err
			}
			if o.Sets, err = p.nft.ListSets(ctx, fam, t); err != nil {
				return nil, err
			}
			in.Existing[t] = o
		}
		in.Takeover = len(ours) > 0 && !p.wroteTable
	}
	renderStart := time.Now()
	plan := Render(p.cfg, in, p.applied)
	renderSeconds := time.Since(renderStart).Seconds()
	// The model resolves contested addresses before rendering (model/
	// resolve.go), so a conflict here is a bug in that resolution; the
	// renderer still keeps the first owner rather than fail the sync.
	for _, c := range plan.Conflicts {
		klog.ErrorS(nil, "Conflicting verdict map elements the model did not resolve (a bug); the first one keeps the address", "conflict", c)
	}
	if c, ok := p.nft.(nft.Checker); ok && req.Trial {
		// A trial of failure isolation: the kernel checks the
		// transaction and aborts it, so the services a trial leaves out
		// keep their rules. The applied state stays what the kernel
		// holds; the isolation's last, real sync programs what passed.
		if err := c.Check(ctx, plan.Tx); err != nil {
			return nil, fmt.Errorf("checking nftables transaction (%d operations) on %s: %w", plan.Tx.Len(), plan.Tx.Where(), err)
		}
		return &proxy.Result{}, nil
	}
	if plan.Tx.Len() > 0 {
		start := time.Now()
		if err := p.nft.Apply(ctx, plan.Tx); err != nil {
			metrics.NFTablesSyncFailuresTotal.WithLabelValues(string(p.opts.Family)).Inc()
			// Whatever we knew of the kernel may be wrong now.
			p.cfg = nil
			return nil, fmt.Errorf("applying nftables transaction (%d operations) to %s: %w", plan.Tx.Len(), plan.Tx.Where(), err)
		}
		klog.V(3).InfoS("Applied nftables transaction", "ipFamily", p.opts.Family, "operations", plan.Tx.Len(), "full", in.Full, "renderSeconds", renderSeconds, "seconds", time.Since(start).Seconds())
	}
	plan.Commit(p.applied)
	p.wroteTable = true
	udpflows.Clear(p.host.Conntrack, p.opts.Family, plan.StaleUDP, plan.NewlyServedUDP)
	if in.Full {
		p.addrs.Rendered(req.Node, p.cfg.NodePortIPs, p.cfg.NodePortAllLocal)
		udpflows.Reconcile(p.host.Conntrack, p.opts.Family, req.State)
	}
	if plan.Cleanup != nil {
		if err := p.nft.Apply(ctx, plan.Cleanup); err != nil {
			// Stale objects stay stale; the next full sync tries again.
			metrics.NFTablesCleanupFailuresTotal.WithLabelValues(string(p.opts.Family)).Inc()
			klog.ErrorS(err, "Failed to delete stale nftables chains and sets", "ipFamily", p.opts.Family, "operations", plan.Cleanup.Len())
		} else {
			plan.CommitCleanup(p.applied)
		}
	}
	large := in.Full && plan.Tx.Len() > fullSyncFreeThreshold
	res := p.result()
	res.CleanupPending = plan.CleanupPending(p.applied)
	if res.CleanupPending {
		// What is pending was stamped at or before now and falls due
		// staleDelay after its stamp.
		res.CleanupAfter = staleDelay
	}
	if large {
		// A large full sync builds the whole batch in memory at once;
		// hand that memory back to the OS rather than keeping the peak
		// as resident size until the runtime's scavenger gets to it. In
		// the background: the forced collection took 0.15-0.2 s of a
		// 10k-service full sync on 2 cores, and nothing that waits for
		// the sync needs it done (the plan is garbage once we return).
		go debug.FreeOSMemory()
	}
	return res, nil
}

func (p *Proxier) table() string {
	if p.opts.TableName == "" {
		return DefaultTableName
	}
	return p.opts.TableName
}

func (p *Proxier) result() *proxy.Result {
	res := p.applied.tallies.Result()
	return &res
}

// HealthCheckKeys lists services with health check ports (for tests).
func (p *Proxier) HealthCheckKeys() []types.NamespacedName {
	ports, _ := p.applied.tallies.HealthChecks()
	var out []types.NamespacedName
	for k := range ports {
		out = append(out, k)
	}
	return out
}
