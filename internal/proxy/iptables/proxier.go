package iptables

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"runtime/debug"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/kernel/nfacct"
	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/metrics"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy"
	"github.com/kproxy/kproxy/internal/proxy/udpflows"
)

// fullSyncFreeBytes: above this much restore input a full sync hands its
// memory back to the OS at once rather than keeping the peak resident.
const fullSyncFreeBytes = 16 << 20

// Proxier is the iptables backend of one IP family.
type Proxier struct {
	opts Options
	ipt  xtables.Interface
	// host clears conntrack entries and reads the host's addresses.
	host    proxy.HostHandles
	applied *Applied
	// cfg is nil until the first successful full sync and after a
	// failure: then the next sync is full and reads the kernel first.
	cfg *Config
	// nfacct creates the counters the rules count in; nil: none.
	nfacct nfacct.Interface

	// mu serialises Sync and CheckDrift (drift.go), which runs on its own
	// schedule: a comparison in the middle of a sync would see half of it.
	// syncs counts the Sync calls: CheckDrift reads the kernel without
	// holding mu, and a reading that a sync overlapped is not compared.
	mu    sync.Mutex
	syncs uint64
	// written follows what the restores left in kproxy's chains;
	// driftReported: CheckDrift reported drift that the next full sync
	// repairs (it must not report it again).
	written       *written
	driftReported bool
	// addrs follows the node port addresses between full syncs.
	addrs *proxy.AddressWatch
}

var _ proxy.Backend = (*Proxier)(nil)

// Handles are the kernel interfaces one proxier works through.
type Handles struct {
	// IPTables is the family's iptables of the chosen backend.
	IPTables xtables.Interface
	// NFAcct creates upstream's nfacct counters the rules count in
	// (NFAcctInvalidDropped, NFAcctLocalhostNodePorts), which every full
	// sync creates when missing; a counter that cannot be created is
	// logged and its rule counts nothing, as upstream. Nil: no counters.
	NFAcct nfacct.Interface
	// HostHandles: Conntrack and LocalAddrs.
	proxy.HostHandles
}

// NewProxier returns one family's proxier. The family of h.IPTables must
// be opts.Family. The caller sets net.ipv4.conf.all.route_localnet=1 when
// opts.LocalhostNodePorts is on for IPv4 (upstream refuses to start when
// it cannot).
func NewProxier(opts Options, h Handles) (*Proxier, error) {
	if err := proxy.CheckNew("iptables", opts.Family, h.IPTables == nil, "iptables interface"); err != nil {
		return nil, err
	}
	// xtables.Family spells the families as v1.IPFamily does.
	if got, want := h.IPTables.Family(), xtables.Family(opts.Family); got != want {
		return nil, fmt.Errorf("iptables: %s proxier given %s iptables", opts.Family, got)
	}
	p := &Proxier{opts: opts, ipt: h.IPTables, nfacct: h.NFAcct,
		host: h.HostHandles, applied: NewApplied(), written: newWritten()}
	p.addrs = proxy.NewAddressWatch(h.LocalAddrs, func(node *model.Node, addrs []netip.Addr) []netip.Addr {
		return opts.RenderConfig(node, addrs).NodePortIPs
	})
	return p, nil
}

// WantsFullSync implements proxy.FullSyncWanter: the node port addresses
// the host has now are not those of the last full sync.
func (p *Proxier) WantsFullSync() bool { return p.addrs.Changed() }

// ensureCounter reports whether the nfacct counter name exists (after
// creating it if needed).
func (p *Proxier) ensureCounter(name string) bool {
	if p.nfacct == nil {
		return false
	}
	if err := p.nfacct.Ensure(name); err != nil {
		klog.ErrorS(err, "Failed to create nfacct counter; the corresponding metric will not be updated", "counter", name, "ipFamily", p.opts.Family)
		return false
	}
	return true
}

// NFAcctReader reads one nfacct counter for a metrics.KernelPacketCounter
// without labels. A counter not created yet (no full sync, or its rule is
// not written: nf_conntrack_tcp_be_liberal on, localhost node ports off)
// gives no sample.
func NFAcctReader(n nfacct.Interface, name string) metrics.PacketCountReader {
	return func(context.Context) ([]metrics.PacketCount, error) {
		c, err := n.Get(name)
		if errors.Is(err, nfacct.ErrNotFound) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		return []metrics.PacketCount{{Packets: c.Packets}}, nil
	}
}

// Sync implements proxy.Backend.
func (p *Proxier) Sync(ctx context.Context, req *proxy.Request) (*proxy.Result, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.syncs++
	fam := string(p.opts.Family)
	in := &Input{RenderInput: proxy.RenderInput{State: req.State, Changed: req.Changed, NodeName: p.opts.Hostname}, Full: req.Full || p.cfg == nil}
	if req.Node != nil {
		in.NodeName, in.Zone = req.Node.Name, req.Node.Zone()
	}
	if in.Full {
		addrs, err := proxy.NodePortHostAddrs(p.host.LocalAddrs, req.Node)
		if err != nil {
			return nil, err
		}
		cfg := p.opts.RenderConfig(req.Node, addrs)
		cfg.CountInvalidDropped = !cfg.ConntrackTCPBeLiberal && p.ensureCounter(NFAcctInvalidDropped)
		cfg.CountLocalhostNodePorts = cfg.LocalhostNodePorts && p.ensureCounter(NFAcctLocalhostNodePorts)
		switch {
		case cfg.MaxChainsPerRestore < 0:
			cfg.MaxChainsPerRestore = 0
		case cfg.MaxChainsPerRestore == 0 && p.ipt.Backend() == xtables.NFT:
			cfg.MaxChainsPerRestore = DefaultMaxChainsPerRestore
		}
		// Read the kernel before rendering: chains left by an earlier run
		// or a failed sync, and which jump rules from the built-in chains
		// are there.
		nat, err := p.ipt.Save(ctx, tableNAT)
		if err != nil {
			return nil, err
		}
		filter, err := p.ipt.Save(ctx, tableFilter)
		if err != nil {
			return nil, err
		}
		in.Existing = ParseExisting(nat, filter)
		p.cfg = cfg
		// What changed since the last sync that kproxy did not write is
		// drift; this sync repairs it.
		if !p.driftReported {
			ds := p.written.diff(map[string][]byte{tableNAT: nat, tableFilter: filter})
			for i := range ds {
				ds[i].Family = p.opts.Family
			}
			proxy.ReportDrift("iptables", "full sync", ds)
		}
		p.driftReported = false
		p.written.reset()
	}
	start := time.Now()
	cfg := p.cfg
	if req.Trial && p.ipt.Backend() == xtables.Legacy && cfg.MaxChainsPerRestore > 0 {
		// See below: a legacy trial is rendered unsplit (legacy runs
		// cost the whole table each, so nothing is lost).
		c := *cfg
		c.MaxChainsPerRestore = 0
		cfg = &c
	}
	plan := Render(cfg, in, p.applied)
	renderTime := time.Since(start)
	size := 0
	var lockWait time.Duration
	if req.Trial {
		// A trial of failure isolation: checked, not committed, so the
		// services a trial leaves out keep their rules (iptables-restore
		// commits table by table, nat before filter, and a split plan
		// restore by restore: a committed trial whose filter table or
		// later restore fails would leave only a subset's DNAT rules in
		// place while the fault lasts). The isolation's last, real sync
		// programs what passed.
		//
		// A split plan (iptables-nft) is checked restore by restore,
		// each against the kernel as it is. That is the same check as one
		// --test of the whole plan: iptables-nft-restore --test parses
		// each line and checks its matches' and targets' options, but
		// resolves no chain and sends nothing to the kernel, so what a
		// later restore takes from an earlier one (the chains it jumps
		// to) is never looked up (TestNFTRestoreTestResolvesNoChain).
		// iptables-legacy-restore --test does resolve chains against the
		// kernel, so a legacy trial is never split (above).
		for i, data := range plan.Restores {
			if _, err := p.ipt.RestoreWithStats(ctx, data, xtables.RestoreOptions{NoFlush: true, Test: true}); err != nil {
				metrics.IPTablesRestoreFailuresTotal.WithLabelValues(fam).Inc()
				return nil, fmt.Errorf("iptables-restore --test of a trial, restore %d of %d (%d bytes): %w", i+1, len(plan.Restores), len(data), err)
			}
		}
		return &proxy.Result{}, nil
	}
	for i, data := range plan.Restores {
		opts := xtables.RestoreOptions{NoFlush: true}
		st, err := p.ipt.RestoreWithStats(ctx, data, opts)
		lockWait += st.LockWait
		size += len(data)
		metrics.IPTablesLockWait.WithLabelValues(fam).Observe(st.LockWait.Seconds())
		if err != nil {
			metrics.IPTablesRestoreFailuresTotal.WithLabelValues(fam).Inc()
			if errors.Is(err, xtables.ErrLockTimeout) {
				metrics.IPTablesLockTimeoutsTotal.WithLabelValues(fam).Inc()
			}
			if !in.Full {
				metrics.IPTablesPartialRestoreFailuresTotal.WithLabelValues(fam).Inc()
			}
			// Whatever we knew of the kernel may be wrong now.
			p.cfg = nil
			p.written.reset()
			var re *xtables.RestoreError
			if errors.As(err, &re) && re.Line > 0 {
				line := lineOf(data, re.Line)
				if line+"\n" == canaryLine {
					return nil, fmt.Errorf("the iptables rules were flushed by someone else (%s is gone); the next sync is full: %w", chainCanary, err)
				}
				klog.ErrorS(err, "iptables-restore refused a line", "ipFamily", p.opts.Family, "line", line)
			}
			return nil, fmt.Errorf("iptables-restore %d of %d (%d bytes, full=%v): %w", i+1, len(plan.Restores), len(data), in.Full, err)
		}
	}
	for _, data := range plan.Restores {
		p.written.follow(data)
	}
	if in.Full {
		p.written.valid = true
		// The kubelet's KUBE-FIREWALL jumps are the kubelet's to keep:
		// drift follows kproxy's own.
		p.written.jumps = jumpLines(jumpRules)
		p.addrs.Rendered(req.Node, p.cfg.NodePortIPs, p.cfg.NodePortAllLocal)
	}
	plan.Commit(p.applied)
	klog.V(2).InfoS("Applied iptables rules", "ipFamily", p.opts.Family, "full", in.Full, "servicePorts", plan.ServicePorts,
		"endpoints", plan.Endpoints, "restores", len(plan.Restores), "bytes", size, "chainsWritten", plan.ChainsWritten,
		"chainsDeleted", plan.ChainsDeleted, "renderSeconds", renderTime.Seconds(), "seconds", time.Since(start).Seconds(), "lockWaitSeconds", lockWait.Seconds())
	nat, filter := p.applied.Rules()
	metrics.IPTablesRulesTotal.WithLabelValues(fam, tableNAT).Set(float64(nat))
	metrics.IPTablesRulesTotal.WithLabelValues(fam, tableFilter).Set(float64(filter))
	metrics.IPTablesRulesLastSync.WithLabelValues(fam, tableNAT).Set(float64(plan.NATRules))
	metrics.IPTablesRulesLastSync.WithLabelValues(fam, tableFilter).Set(float64(plan.FilterRules))

	udpflows.Clear(p.host.Conntrack, p.opts.Family, plan.StaleUDP, plan.NewlyServedUDP)
	if in.Full {
		udpflows.Reconcile(p.host.Conntrack, p.opts.Family, req.State)
		if size > fullSyncFreeBytes {
			// A large full sync holds all its restore input at once.
			debug.FreeOSMemory()
		}
	}
	res := p.applied.tallies.Result()
	return &res, nil
}

// lineOf returns line n (1-based) of a restore input, for error messages.
func lineOf(data []byte, n int) string {
	for i := 1; len(data) > 0; i++ {
		end := len(data)
		for j, c := range data {
			if c == '\n' {
				end = j
				break
			}
		}
		if i == n {
			return string(data[:end])
		}
		if end == len(data) {
			break
		}
		data = data[end+1:]
	}
	return ""
}
