package main

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/kernel/ipvs"
	"github.com/kproxy/kproxy/internal/kernel/xtables"
)

// leftoverOptions point the cleanup of other modes somewhere else than the
// process's own network namespace (tests).
type leftoverOptions struct {
	xtables []xtables.Option
	ipvs    []ipvs.Option
}

// cleanupOtherModes removes what kube-proxy's iptables and IPVS modes left
// on this node, as upstream does when it starts in another mode: kube-proxy
// rules still hooked into PREROUTING and OUTPUT would DNAT service traffic
// before kproxy's nftables rules see it. Both iptables backends are checked
// (a node may have switched between them). The iptables rules go first:
// IPVS mode's ipsets can only be destroyed once no rule matches them.
func cleanupOtherModes(ctx context.Context) error {
	return cleanupOtherModesWith(ctx, leftoverOptions{})
}

func cleanupOtherModesWith(ctx context.Context, o leftoverOptions) error {
	var errs []error
	for _, b := range xtables.Backends {
		errs = append(errs, cleanupBackend(ctx, b, o.xtables))
	}
	errs = append(errs, cleanupIPVS(ctx, o))
	return errors.Join(errs...)
}

// cleanupIPVS removes IPVS mode's kernel objects: its dummy interface,
// ipsets and virtual servers.
func cleanupIPVS(ctx context.Context, o leftoverOptions) error {
	l, err := ipvs.FindLeftovers(ctx, o.ipvs...)
	if err != nil {
		return err
	}
	if l.Empty() {
		return nil
	}
	klog.InfoS("Removing leftovers of kube-proxy's IPVS mode", "interface", l.Link, "ipsets", len(l.IPSets), "virtualServers", len(l.VirtualServers))
	return ipvs.CleanupLeftovers(ctx, o.ipvs...)
}

// cleanupBackend removes one iptables backend's leftovers in both
// families, with one log line for the backend.
func cleanupBackend(ctx context.Context, b xtables.Backend, opts []xtables.Option) error {
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
