package ipvs

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/kernel/ipvs"
	"github.com/kproxy/kproxy/internal/kernel/xtables"
)

// CleanupLeftovers removes ipvs mode's kernel objects: its dummy
// interface, ipsets and virtual servers (ipvs.CleanupLeftovers: others'
// stay). The ipsets can only go once no rule matches them: remove the
// iptables chains first (iptables.CleanupLeftovers).
func CleanupLeftovers(ctx context.Context, opts ...ipvs.Option) error {
	l, err := ipvs.FindLeftovers(ctx, opts...)
	if err != nil {
		return err
	}
	if l.Empty() {
		return nil
	}
	klog.InfoS("Removing leftovers of kube-proxy's IPVS mode", "interface", l.Link, "ipsets", len(l.IPSets), "virtualServers", len(l.VirtualServers))
	return ipvs.CleanupLeftovers(ctx, opts...)
}

// CleanupIPTablesModeChains removes, in the iptables backend ipvs mode
// uses, the chains only iptables mode made. The chains both modes share
// are ipvs mode's own once its first sync rewrote them; filter
// KUBE-SERVICES and KUBE-EXTERNAL-SERVICES would otherwise keep
// rejecting, from INPUT, FORWARD and OUTPUT, services that had no
// endpoints when iptables mode last ran.
func CleanupIPTablesModeChains(ctx context.Context, chosen xtables.Backend, opts ...xtables.Option) error {
	var errs []error
	for _, f := range xtables.Families {
		n, err := xtables.CleanupIPTablesModeLeftovers(ctx, chosen, f, opts...)
		switch {
		case errors.Is(err, xtables.ErrNotInstalled):
		case err != nil:
			errs = append(errs, fmt.Errorf("removing iptables mode's %s %s chains: %w", chosen, f, err))
		case n > 0:
			klog.InfoS("Removed iptables mode's chains that ipvs mode does not use", "backend", chosen, "family", f, "chains", n)
		}
	}
	return errors.Join(errs...)
}
