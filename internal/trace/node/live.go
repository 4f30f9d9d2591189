package node

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/kernel/execer"
	"github.com/kproxy/kproxy/internal/kernel/ipset"
	kipvs "github.com/kproxy/kproxy/internal/kernel/ipvs"
	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/model"
	ipvsmode "github.com/kproxy/kproxy/internal/proxy/ipvs"
	"github.com/kproxy/kproxy/internal/proxy/nftables"
	"github.com/kproxy/kproxy/internal/trace"
)

// NFTRules lists kproxy's tables of both families ('nft list table' of the
// main table and of each of its shard tables): a service's dispatch is in
// its shard, the filter side and masquerading in the main table.
func NFTRules(ctx context.Context, ex execer.Interface, main string) (string, error) {
	var text strings.Builder
	for _, fam := range []string{"ip", "ip6"} {
		out, err := ex.Run(ctx, []string{"nft", "list", "tables", fam}, "")
		if err != nil {
			return "", fmt.Errorf("reading the live rules: %w", err)
		}
		var tables []string
		for _, l := range strings.Split(out, "\n") {
			if name, ok := strings.CutPrefix(strings.TrimSpace(l), "table "+fam+" "); ok {
				tables = append(tables, name)
			}
		}
		slices.Sort(tables)
		for _, t := range nftables.OurTables(main, tables) {
			out, err := ex.Run(ctx, []string{"nft", "list", "table", fam, t}, "")
			if err != nil {
				return "", fmt.Errorf("reading the live rules: %w", err)
			}
			text.WriteString(out)
		}
	}
	return text.String(), nil
}

// IPTablesSave reads the family's rules from the iptables backend kproxy
// would choose (mode is IPTABLES_MODE), saying which on log.
func IPTablesSave(ctx context.Context, log io.Writer, mode string, fam v1.IPFamily) (string, error) {
	b, reason, err := xtables.Select(ctx, mode)
	if err != nil {
		return "", fmt.Errorf("choosing the iptables backend to read: %w", err)
	}
	bin := "iptables-" + string(b) + "-save"
	if fam == model.IPv6 {
		bin = "ip6tables-" + string(b) + "-save"
	}
	_, _ = fmt.Fprintf(log, "Reading %s (%s)\n", bin, reason)
	out, err := execer.OS{}.Run(ctx, []string{bin}, "")
	if err != nil {
		return "", fmt.Errorf("reading the live rules: %w", err)
	}
	return out, nil
}

// IPVS reads this node's IPVS table over generic netlink (virtual servers
// by address; those by firewall mark are not modelled).
func IPVS() ([]trace.IPVSService, error) {
	h, err := kipvs.NewHandle("")
	if err != nil {
		return nil, fmt.Errorf("opening IPVS: %w", err)
	}
	defer h.Close()
	svcs, err := h.Services()
	if err != nil {
		return nil, fmt.Errorf("listing IPVS virtual servers: %w", err)
	}
	var out []trace.IPVSService
	for _, s := range svcs {
		if s.FWMark != 0 {
			continue
		}
		ds, err := h.Destinations(s.VirtualServer)
		if err != nil {
			return nil, fmt.Errorf("listing the real servers of %s: %w", s.VirtualServer, err)
		}
		out = append(out, trace.IPVSServiceOf(s, ds))
	}
	return out, nil
}

// IPSets reads kube-proxy's ipsets of both families over netlink; their
// types are upstream's (the handle lists members, not types).
func IPSets() (map[string]*trace.IPSet, error) {
	h, err := ipset.NewHandle("")
	if err != nil {
		return nil, fmt.Errorf("opening ipset (module ip_set): %w", err)
	}
	defer h.Close()
	have, err := h.Sets()
	if err != nil {
		return nil, fmt.Errorf("listing ipsets: %w", err)
	}
	out := map[string]*trace.IPSet{}
	for _, v6 := range []bool{false, true} {
		for _, def := range ipvsmode.SetDefinitions(v6) {
			if !slices.Contains(have, def.Name) {
				continue
			}
			es, err := h.Entries(def.Name)
			if err != nil {
				return nil, fmt.Errorf("listing ipset %s: %w", def.Name, err)
			}
			out[def.Name] = &trace.IPSet{Name: def.Name, Type: def.Type, IPv6: def.IPv6, Entries: es}
		}
	}
	return out, nil
}

// RouteLocalnet reports whether this host routes to localhost from outside
// (net.ipv4.conf.all.route_localnet), which kproxy sets on a node whose
// rules serve node ports on localhost.
func RouteLocalnet() bool {
	v, err := os.ReadFile("/proc/sys/net/ipv4/conf/all/route_localnet")
	return err == nil && strings.TrimSpace(string(v)) == "1"
}
