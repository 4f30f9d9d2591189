package main

import (
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/kube-proxy/config/v1alpha1"

	"github.com/kproxy/kproxy/internal/kernel/conntrack"
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
	// gens counts the adapters' commits, so that the drift monitor can
	// subscribe after the first sync (nftables.DriftWatch.Gap).
	gens *nfnetlink.Generations
	// after removes kube-proxy's iptables chains (both backends) and
	// IPVS leftovers once every family synced.
	after *proxy.AfterFirstSync
	// tables names the tables, for the start-up line.
	tables string
}

// setUpNFTablesMode prepares --proxy-mode nftables: one proxier per
// family over its own nf_tables netlink socket.
func setUpNFTablesMode(c *v1alpha1.KubeProxyConfiguration, fams []v1.IPFamily) (*nftablesSetup, error) {
	s := &nftablesSetup{backends: map[v1.IPFamily]proxy.Backend{},
		tables: "ip/ip6 " + nftables.DefaultTableName + " and " + nftables.ShardTable(nftables.DefaultTableName, 0) + "...",
		gens:   &nfnetlink.Generations{}}
	for _, f := range fams {
		iface, err := nfnetlink.NewNetlink(nfnetlink.WithGenerations(s.gens))
		if err != nil {
			return nil, fmt.Errorf("nftables mode needs nf_tables over netlink: %w", err)
		}
		s.nls = append(s.nls, iface)
		p, err := nftables.NewProxier(nftables.NewOptions(c, f), nftables.Handles{NFT: wrapNFT(iface),
			HostHandles: proxy.HostHandles{Conntrack: conntrack.Netlink{}, LocalAddrs: proxy.LocalAddrs}})
		if err != nil {
			return nil, err
		}
		s.backends[f] = p
	}
	s.after = proxy.NewAfterFirstSync("kube-proxy's iptables (both backends) and IPVS rules", s.backends, cleanupOtherModes)
	return s, nil
}

func (s *nftablesSetup) logLine() string {
	return "Using nftables Proxier (native nf_tables tables, not iptables-nft)"
}
