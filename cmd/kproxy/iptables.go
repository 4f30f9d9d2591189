package main

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/kernel/conntrack"
	"github.com/kproxy/kproxy/internal/kernel/nfacct"
	"github.com/kproxy/kproxy/internal/kernel/sysctl"
	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/metrics"
	"github.com/kproxy/kproxy/internal/proxy"
	"github.com/kproxy/kproxy/internal/proxy/iptables"
)

// iptablesSetup is what starting iptables mode decided.
type iptablesSetup struct {
	backend xtables.Backend
	reason  string
	// families that are proxied: IPv6 is dropped (with an error in the
	// log) when ip6tables of the backend cannot be used, as upstream
	// falls back to single-stack.
	families []v1.IPFamily
	backends map[v1.IPFamily]proxy.Backend
	// after removes the nftables mode's tables, IPVS leftovers and
	// kube-proxy's chains in the other backend once every family synced.
	after *proxy.AfterFirstSync
}

// iptablesEnv points the iptables mode set-up somewhere else than this
// process's network namespace and /proc (tests).
type iptablesEnv struct {
	xtables []xtables.Option
	// sys reads and writes sysctls; nil is /proc/sys.
	sys sysctl.Interface
	// compact is --iptables-compact-layout.
	compact bool
}

// setUpIPTablesMode prepares --proxy-mode iptables before any rule is
// written: it picks the iptables backend on purpose and says which and
// why, checks that backend's binaries and version, warns about kube-proxy
// rules in the other backend, and returns one proxier per family.
// Everything that can make the mode unusable is an error here, so a bad
// IPTABLES_MODE, a missing binary or a too old iptables stop kproxy
// before it touches the kernel.
func setUpIPTablesMode(ctx context.Context, o *config.Options, fams []v1.IPFamily, node string, env iptablesEnv) (*iptablesSetup, error) {
	c := o.Config
	b, reason, err := xtables.Select(ctx, o.IPTablesMode, env.xtables...)
	if err != nil {
		return nil, fmt.Errorf("choosing the iptables backend: %w", err)
	}
	s := &iptablesSetup{backend: b, reason: reason, backends: map[v1.IPFamily]proxy.Backend{}}
	sys := env.sys
	if sys == nil {
		sys = sysctl.Files{}
	}
	liberal := false
	if v, err := sys.Get("/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal"); err == nil {
		liberal = v != 0
	}
	acct := nfacct.Netlink{}
	for i, f := range fams {
		ipt, err := familyIPTables(ctx, b, f, i == 0, "iptables mode", env.xtables)
		if err != nil {
			return nil, err
		}
		if ipt == nil {
			continue
		}
		opts := iptables.NewOptions(c, f, node)
		opts.ConntrackTCPBeLiberal = liberal
		opts.CompactLayout = env.compact
		if opts.NeedsRouteLocalnet() {
			// Node ports on 127.0.0.1 need the kernel to route packets
			// to loopback addresses that DNAT sends elsewhere; the
			// renderer adds the guard that drops such packets arriving
			// from other hosts (CVE-2020-8558).
			if err := ensureRouteLocalnet(sys); err != nil {
				return nil, err
			}
		}
		s.families = append(s.families, f)
		p, err := iptables.NewProxier(opts, iptables.Handles{IPTables: wrapXtables(ipt), NFAcct: acct,
			HostHandles: proxy.HostHandles{Conntrack: conntrack.Netlink{}, LocalAddrs: proxy.LocalAddrs}})
		if err != nil {
			return nil, err
		}
		s.backends[f] = p
	}
	// Upstream's nfacct counters, created by the proxiers' full syncs.
	metrics.IPTablesCTStateInvalidDroppedPackets.SetReader(iptables.NFAcctReader(acct, iptables.NFAcctInvalidDropped))
	metrics.IPTablesLocalhostNodePortsAcceptedPackets.SetReader(iptables.NFAcctReader(acct, iptables.NFAcctLocalhostNodePorts))
	s.after = proxy.NewAfterFirstSync("nftables mode's tables, IPVS leftovers and kube-proxy's chains in the "+string(b.Other())+" iptables backend", s.backends,
		func(ctx context.Context) error { return cleanupForIPTablesMode(ctx, b, env.xtables) })
	// The primary family watches the other backend (at full syncs, and
	// once a sync period with the drift checks) once the switch's removal
	// is over; until then the gauge says 0 (the chains there are the
	// previous run's, about to go), so that it is exported from the start,
	// as before the removal moved after the first sync.
	metrics.IPTablesOtherBackendChains.WithLabelValues(string(b.Other())).Set(0)
	primary := s.families[0]
	syncPeriod, _ := config.SyncPeriods(c)
	s.backends[primary] = iptables.WatchOtherBackend(s.backends[primary], b, env.xtables, s.after.Done, syncPeriod)
	return s, nil
}

// logLine is the start-up line that says which iptables backend is used
// and why, in upstream's words ("Using iptables Proxier") with the backend.
func (s *iptablesSetup) logLine() string {
	line := fmt.Sprintf("Using iptables Proxier in %s mode (%s)", s.backend, s.reason)
	if s.backend == xtables.NFT {
		// iptables-nft stores xtables rules in nf_tables; keep it apart
		// from kproxy's nftables mode in every log.
		line += "; iptables-nft writes xtables rules into nf_tables, this is not nftables mode"
	}
	return line
}

// familyIPTables opens iptables of backend b for family f and checks that
// it runs. The secondary family is optional, as upstream runs single-stack
// when ip6tables does not work: then it logs why and returns nil, nil.
func familyIPTables(ctx context.Context, b xtables.Backend, f v1.IPFamily, primary bool, mode string, opts []xtables.Option) (xtables.Interface, error) {
	ipt, err := xtables.New(b, xtables.Family(f), opts...) // spelled as v1.IPFamily
	if err == nil {
		_, err = ipt.Version(ctx)
	}
	switch {
	case err == nil:
		return ipt, nil
	case primary:
		return nil, fmt.Errorf("%s (%s iptables backend): %w", mode, b, err)
	}
	klog.ErrorS(err, "Cannot use iptables for this IP family; proxying the primary family only", "ipFamily", f, "backend", b)
	return nil, nil
}
