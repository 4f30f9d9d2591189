package main

import (
	"context"
	"errors"
	"fmt"

	kipvs "github.com/kproxy/kproxy/internal/kernel/ipvs"
	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/kernel/nft/nfnetlink"
	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/proxy/iptables"
	"github.com/kproxy/kproxy/internal/proxy/ipvs"
	"github.com/kproxy/kproxy/internal/proxy/nftables"
)

// Which modes' leftovers each mode removes, as upstream's
// cmd/kube-proxy/app calls each backend's CleanupLeftovers; running
// modes do it after their first sync (proxy.AfterFirstSync).

// leftoverOptions point the cleanup of other modes somewhere else than the
// process's own network namespace (tests).
type leftoverOptions struct {
	xtables []xtables.Option
	ipvs    []kipvs.Option
}

// cleanupOtherModes removes what kube-proxy's iptables and IPVS modes left
// on this node (nftables mode; --cleanup): kube-proxy rules still hooked
// into PREROUTING and OUTPUT would keep DNATing service traffic to
// whatever endpoints they knew when their proxy stopped. Both iptables
// backends are checked (a node may have switched between them). The
// iptables rules go first: IPVS mode's ipsets can only be destroyed once
// no rule matches them.
func cleanupOtherModes(ctx context.Context) error {
	return cleanupOtherModesWith(ctx, leftoverOptions{})
}

func cleanupOtherModesWith(ctx context.Context, o leftoverOptions) error {
	var errs []error
	for _, b := range xtables.Backends {
		errs = append(errs, iptables.CleanupLeftovers(ctx, b, o.xtables...))
	}
	errs = append(errs, ipvs.CleanupLeftovers(ctx, o.ipvs...))
	return errors.Join(errs...)
}

// cleanupForIPTablesMode removes what nftables and IPVS modes left, and
// kube-proxy's chains in the other iptables backend (a switch between
// backends; upstream leaves them): their rules would catch service traffic
// before or beside the iptables rules, with the endpoints of the day their
// proxy stopped. kproxy's own iptables chains in the chosen backend are
// left to the first full sync, which replaces them without a gap.
func cleanupForIPTablesMode(ctx context.Context, chosen xtables.Backend, opts []xtables.Option) error {
	err := errors.Join(cleanupNFTablesMode(ctx), iptables.CleanupLeftovers(ctx, chosen.Other(), opts...), ipvs.CleanupLeftovers(ctx))
	if err == nil {
		// The metric and the warning say what is left (nothing, unless
		// something writes there again).
		iptables.ReportOtherBackend(ctx, chosen, opts)
	}
	return err
}

// cleanupForIPVSMode removes what nftables mode left, kube-proxy's chains
// in the other iptables backend and, in the chosen one, the chains only
// iptables mode made.
func cleanupForIPVSMode(ctx context.Context, chosen xtables.Backend, opts []xtables.Option) error {
	return errors.Join(cleanupNFTablesMode(ctx), iptables.CleanupLeftovers(ctx, chosen.Other(), opts...),
		ipvs.CleanupIPTablesModeChains(ctx, chosen, opts...))
}

// cleanupNFTablesMode deletes the nftables mode's tables in both families.
func cleanupNFTablesMode(ctx context.Context) error {
	iface, err := nfnetlink.NewNetlink()
	if err != nil {
		if errors.Is(err, nft.ErrNotSupported) {
			return nil // no nf_tables: no nftables mode leftovers either
		}
		return fmt.Errorf("checking for nftables mode leftovers: %w", err)
	}
	defer iface.Close()
	return nftables.CleanupLeftovers(ctx, iface)
}

// cleanup is --cleanup: kproxy's nftables tables in both families, and
// what kube-proxy's iptables and IPVS modes left.
func cleanup(ctx context.Context) error {
	errs := []error{cleanupOtherModes(ctx)}
	iface, err := nfnetlink.NewNetlink()
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("cleanup: %w", err))...)
	}
	errs = append(errs, nftables.CleanupLeftovers(ctx, iface))
	return errors.Join(errs...)
}
