package main

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/kernel/conntrack"
	"github.com/kproxy/kproxy/internal/kernel/ipset"
	kipvs "github.com/kproxy/kproxy/internal/kernel/ipvs"
	"github.com/kproxy/kproxy/internal/kernel/netdev"
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
		// moby/ipvs opens without complaint on a kernel without IPVS.
		if _, err := os.Stat("/proc/sys/net/ipv4/vs"); err != nil {
			_ = exec.CommandContext(ctx, "modprobe", "ip_vs").Run()
			if _, err := os.Stat("/proc/sys/net/ipv4/vs"); err != nil {
				return nil, fmt.Errorf("can't use the IPVS proxier: this kernel has no IPVS (module ip_vs not loaded and cannot be loaded): %w", err)
			}
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
		h, err := openIPVSHandles(env.netns)
		if err != nil {
			return nil, err
		}
		closers = append(closers, h.close)
		h.Handles.IPTables = wrapXtables(ipt)
		h.Handles.Conntrack = conntrack.Netlink{}
		h.Handles.LocalAddrs = nodeAddrsWithoutDummy
		opts, err := ipvs.NewOptions(c, f, node)
		if err != nil {
			return nil, err
		}
		p, err := ipvs.NewProxier(opts, h.Handles)
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

// ipvsHandles are one proxier's netlink handles.
type ipvsHandles struct {
	ipvs.Handles
	close func()
}

func openIPVSHandles(netns string) (*ipvsHandles, error) {
	vs, err := kipvs.NewHandle(netns)
	if err != nil {
		return nil, fmt.Errorf("opening IPVS: %w", err)
	}
	sets, err := ipset.NewHandle(netns)
	if err != nil {
		vs.Close()
		return nil, fmt.Errorf("opening ipset (module ip_set): %w", err)
	}
	dev, err := netdev.NewHandle(netns)
	if err != nil {
		vs.Close()
		sets.Close()
		return nil, fmt.Errorf("opening rtnetlink: %w", err)
	}
	return &ipvsHandles{
		Handles: ipvs.Handles{IPVS: vs, IPSet: sets, NetDev: dev},
		close:   func() { vs.Close(); sets.Close(); dev.Close() },
	}, nil
}

// nodeAddrsWithoutDummy lists the node's addresses on every interface but
// kube-ipvs0 (whose service addresses are no node addresses).
func nodeAddrsWithoutDummy() ([]netip.Addr, error) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, ifc := range ifaces {
		if ifc.Name == ipvs.DummyDevice {
			continue
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			return nil, err
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(n.IP); ok {
					out = append(out, ip.Unmap())
				}
			}
		}
	}
	return out, nil
}
