package main

import (
	"context"
	"errors"
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"k8s.io/kube-proxy/config/v1alpha1"

	"github.com/kproxy/kproxy/internal/kernel/conntrack"
	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/kernel/nft/nfnetlink"
	"github.com/kproxy/kproxy/internal/proxy"
	"github.com/kproxy/kproxy/internal/proxy/nftables"
)

// nftablesSetup is what starting nftables mode decided.
type nftablesSetup struct {
	backends map[v1.IPFamily]proxy.Backend
	// nls are the netlink adapters, whose sockets are kproxy's own
	// (drift notifications).
	nls []*nfnetlink.Netlink
	// after removes kube-proxy's iptables chains (both backends) and
	// IPVS leftovers once every family synced.
	after *afterFirstSync
	// tables names the tables, for the start-up line.
	tables string
}

// setUpNFTablesMode prepares --proxy-mode nftables: one proxier per
// family over its own nf_tables netlink socket.
func setUpNFTablesMode(c *v1alpha1.KubeProxyConfiguration, fams []v1.IPFamily) (*nftablesSetup, error) {
	s := &nftablesSetup{backends: map[v1.IPFamily]proxy.Backend{},
		tables: "ip/ip6 " + nftables.DefaultTableName + " and " + nftables.ShardTable(nftables.DefaultTableName, 0) + "..."}
	for _, f := range fams {
		iface, err := nfnetlink.NewNetlink()
		if err != nil {
			return nil, fmt.Errorf("nftables mode needs nf_tables over netlink: %w", err)
		}
		s.nls = append(s.nls, iface)
		p, err := nftables.NewProxier(nftables.NewOptions(c, f), nftables.Handles{NFT: wrapNFT(iface), Conntrack: conntrack.Netlink{}, LocalAddrs: localAddrs})
		if err != nil {
			return nil, err
		}
		s.backends[f] = p
	}
	s.after = newAfterFirstSync("kube-proxy's iptables (both backends) and IPVS rules", s.backends, cleanupOtherModes)
	return s, nil
}

func (s *nftablesSetup) logLine() string {
	return "Using nftables Proxier (native nf_tables tables, not iptables-nft)"
}

// cleanupTables deletes the main table and every shard table of it (those
// of the current shard count and any left by a larger one) in both
// families; other tables stay.
func cleanupTables(ctx context.Context, iface nft.Interface, main string) error {
	var errs []error
	for _, f := range []nft.Family{nft.IPv4, nft.IPv6} {
		tables, err := iface.ListTables(ctx, f)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, t := range nftables.OurTables(main, tables) {
			if err := iface.DeleteTable(ctx, f, t); err != nil {
				errs = append(errs, err)
				continue
			}
			klog.InfoS("Deleted nftables table", "family", f, "table", t)
		}
	}
	return errors.Join(errs...)
}
