package main

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/kernel/conntrack"
	kipvs "github.com/kproxy/kproxy/internal/kernel/ipvs"
	"github.com/kproxy/kproxy/internal/kernel/sysctl"
	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/proxy"
	"github.com/kproxy/kproxy/internal/proxy/ipvs"
)

// ipvsDeprecation is upstream's start-up message for ipvs mode, verbatim
// (logged as an error and recorded as a Warning event IPVSDeprecation).
const ipvsDeprecation = "The ipvs proxier has been deprecated and will be disabled by default in Kubernetes 1.40 and removed in Kubernetes 1.43. Migrate to the 'nftables' proxier instead."

// ipvsSetup is what starting ipvs mode decided.
type ipvsSetup struct {
	backend  xtables.Backend
	reason   string
	families []v1.IPFamily
	backends map[v1.IPFamily]proxy.Backend
	after    *proxy.AfterFirstSync
	// close releases the kernel handles.
	close func()
}

// ipvsEnv points the ipvs mode set-up elsewhere than this process's
// network namespace and /proc/sys (tests).
type ipvsEnv struct {
	xtables []xtables.Option
	// netns is the network namespace path of the handles ("" this one).
	netns  string
	sysctl sysctl.Interface
	// kernelRelease is uname's release ("" reads it).
	kernelRelease string
}

// setUpIPVSMode prepares --proxy-mode ipvs before any rule is written: it
// picks the iptables backend as iptables mode does, opens IPVS, ipset and
// the interfaces over netlink, checks that the scheduler can be used (its
// module loads), sets upstream's sysctls and returns one proxier per
// family. Everything that can make the mode unusable is an error here.
func setUpIPVSMode(ctx context.Context, o *config.Options, fams []v1.IPFamily, node string, env ipvsEnv) (_ *ipvsSetup, err error) {
	c := o.Config
	b, reason, err := xtables.Select(ctx, o.IPTablesMode, env.xtables...)
	if err != nil {
		return nil, fmt.Errorf("choosing the iptables backend: %w", err)
	}
	s := &ipvsSetup{backend: b, reason: reason, backends: map[v1.IPFamily]proxy.Backend{}}
	var closers []func()
	s.close = func() {
		for _, c := range closers {
			c()
		}
	}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	if env.netns == "" {
		if err := ipvs.LoadIPVS(ctx); err != nil {
			return nil, err
		}
	}
	probe, err := kipvs.NewHandle(env.netns)
	if err != nil {
		return nil, fmt.Errorf("ipvs mode needs IPVS in the kernel (module ip_vs): %w", err)
	}
	closers = append(closers, probe.Close)
	if err := kipvs.CheckScheduler(probe, c.IPVS.Scheduler); err != nil {
		return nil, fmt.Errorf("can't use the IPVS proxier: ipvs.scheduler %q cannot be used (is its kernel module ip_vs_%s available?): %w", ipvs.Scheduler(c), ipvs.Scheduler(c), err)
	}
	sys := env.sysctl
	if sys == nil {
		sys = sysctl.Files{}
	}
	if err := kipvs.EnsureSysctls(sys, c.IPVS.StrictARP, env.kernelRelease); err != nil {
		return nil, err
	}
	for i, f := range fams {
		ipt, err := familyIPTables(ctx, b, f, i == 0, "ipvs mode", env.xtables)
		if err != nil {
			return nil, err
		}
		if ipt == nil {
			continue
		}
		h, closeHandles, err := ipvs.OpenHandles(env.netns)
		if err != nil {
			return nil, err
		}
		closers = append(closers, closeHandles)
		h.IPTables, h.Conntrack, h.LocalAddrs = wrapXtables(ipt), conntrack.Netlink{}, ipvs.NodeAddrs
		opts, err := ipvs.NewOptions(c, f, node)
		if err != nil {
			return nil, err
		}
		p, err := ipvs.NewProxier(opts, h)
		if err != nil {
			return nil, err
		}
		s.families = append(s.families, f)
		s.backends[f] = p
	}
	s.after = proxy.NewAfterFirstSync("nftables mode's tables and kube-proxy's chains in the "+string(b.Other())+" iptables backend", s.backends,
		func(ctx context.Context) error { return cleanupForIPVSMode(ctx, b, env.xtables) })
	return s, nil
}

// logLine is the start-up line: upstream's "Using ipvs Proxier", with the
// iptables backend of its chains and why.
func (s *ipvsSetup) logLine() string {
	line := fmt.Sprintf("Using ipvs Proxier; its iptables chains in %s mode (%s)", s.backend, s.reason)
	if s.backend == xtables.NFT {
		line += "; iptables-nft writes xtables rules into nf_tables, this is not nftables mode"
	}
	return line
}
