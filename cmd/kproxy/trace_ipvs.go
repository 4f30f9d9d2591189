package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/kernel/execer"
	"github.com/kproxy/kproxy/internal/kernel/ipset"
	kipvs "github.com/kproxy/kproxy/internal/kernel/ipvs"
	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/kernel/nft/nfnetlink"
	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy"
	ipvsmode "github.com/kproxy/kproxy/internal/proxy/ipvs"
	"github.com/kproxy/kproxy/internal/proxy/nftables"
	"github.com/kproxy/kproxy/internal/trace"
	iptrace "github.com/kproxy/kproxy/internal/trace/iptables"
	"github.com/kproxy/kproxy/internal/trace/savedstate"
)

// traceIPVSMode tells whether trace walks ipvs mode's state: --proxy-mode
// ipvs says so; --rules files holding ipvsadm or ipset save lines too;
// with --live and no --proxy-mode, a node with kube-ipvs0 and without the
// nftables mode's table.
func traceIPVSMode(ctx context.Context, o *config.Options, tf traceFlags) (bool, error) {
	switch o.Config.Mode {
	case config.ModeIPVS:
		return true, nil
	case "":
	default:
		return false, nil
	}
	switch {
	case len(tf.rules) > 0:
		text, err := readRules(tf.rules)
		if err != nil {
			return false, err
		}
		p, err := savedstate.Split(text)
		if err != nil {
			return false, err
		}
		return p.IPVSAdm != "" || p.IPSet != "", nil
	case tf.live:
		if _, err := net.InterfaceByName(ipvsmode.DummyDevice); err != nil {
			return false, nil
		}
		if iface, err := nfnetlink.NewNetlink(); err == nil {
			defer iface.Close()
			if exists, err := iface.TableExists(ctx, nft.IPv4, nftables.DefaultTableName); err == nil && exists {
				return false, nil
			}
		}
		return true, nil
	}
	return false, nil
}

// readRules reads and joins the --rules files.
func readRules(paths []string) (string, error) {
	var b strings.Builder
	for _, p := range paths {
		t, err := readFile(p)
		if err != nil {
			return "", err
		}
		b.WriteString(t)
		if !strings.HasSuffix(t, "\n") {
			b.WriteString("\n")
		}
	}
	return b.String(), nil
}

// ipvsState is what a trace of ipvs mode walks: the iptables rules of one
// family, and the host with its ipsets and IPVS table.
type ipvsState struct {
	rules *iptrace.Ruleset
	host  trace.Host
	// nodeAddrs are the node's own addresses (not the service addresses
	// that are local too): a packet from the node leaves from one.
	nodeAddrs []netip.Addr
}

// runTraceIPVS traces a packet through ipvs mode: iptables rules with
// ipset matches, then the IPVS table to a real server.
func runTraceIPVS(ctx context.Context, out, errOut io.Writer, o *config.Options, tf traceFlags, p trace.Packet, local []netip.Addr) error {
	st, err := ipvsTraceState(ctx, errOut, o, tf, p.Dst, local)
	if err != nil {
		return err
	}
	src, err := traceSource(tf, p.Dst, st.nodeAddrs)
	if err != nil {
		return err
	}
	p.Src, p.SrcPort = src.Addr(), src.Port()
	res, err := st.rules.Trace(p, st.host)
	if err != nil {
		return err
	}
	_, err = io.WriteString(out, res.String())
	return err
}

// ipvsTraceState builds the state of the destination's family: from this
// node's kernel, saved files, or a snapshot rendered as a fresh node's
// first sync.
func ipvsTraceState(ctx context.Context, errOut io.Writer, o *config.Options, tf traceFlags, dst netip.Addr, local []netip.Addr) (*ipvsState, error) {
	fam := model.FamilyOf(dst)
	var iptText string
	var services []trace.IPVSService
	var sets map[string]*trace.IPSet
	var hostLocal, node []netip.Addr
	switch {
	case tf.live:
		var err error
		if iptText, err = liveIPTablesSave(ctx, errOut, o, fam); err != nil {
			return nil, err
		}
		if services, err = liveIPVS(); err != nil {
			return nil, err
		}
		if sets, err = liveIPSets(); err != nil {
			return nil, err
		}
		if len(local) == 0 {
			if hostLocal, err = proxy.LocalAddrs(); err != nil {
				return nil, err
			}
			if node, err = ipvsmode.NodeAddrs(); err != nil {
				return nil, err
			}
		}
	case len(tf.rules) > 0:
		text, err := readRules(tf.rules)
		if err != nil {
			return nil, err
		}
		parts, err := savedstate.Split(text)
		if err != nil {
			return nil, err
		}
		iptText = familySection(parts.IPTables, fam)
		if services, err = savedstate.ParseIPVSAdm(parts.IPVSAdm); err != nil {
			return nil, err
		}
		if sets, err = savedstate.ParseIPSetSave(parts.IPSet); err != nil {
			return nil, err
		}
		hostLocal = parts.DummyAddrs
	default:
		snap, err := loadSnapshot(errOut, o, tf.file)
		if err != nil {
			return nil, err
		}
		var st *model.State
		for _, s := range snap.States {
			if s.Family == fam {
				st = s
			}
		}
		if st == nil {
			return nil, fmt.Errorf("the snapshot has no %s services", fam)
		}
		if len(local) == 0 {
			hostLocal = snap.LocalAddrs()
			node = hostLocal
		}
		opts, err := ipvsmode.NewOptions(o.Config, fam, snap.NodeName)
		if err != nil {
			return nil, err
		}
		d, err := ipvsmode.Render(&opts.RenderConfig, st, snap.Node, ipvsmode.Host{Addrs: snap.LocalAddrs()})
		if err != nil {
			return nil, err
		}
		iptText = string(d.IPTables)
		services = d.TraceServices()
		sets = d.TraceSets()
		hostLocal = append(hostLocal, d.Addresses...)
	}
	rs, err := iptrace.Parse([]byte(iptText))
	if err != nil {
		return nil, fmt.Errorf("parsing the iptables rules: %w", err)
	}
	if f := rs.Family(); f != 0 && (f == 4) != (fam == model.IPv4) {
		return nil, errors.New("the iptables rules are of the other IP family than --dst")
	}
	rs.RouteLocalnet = !tf.live || sysctlIs("net/ipv4/conf/all/route_localnet", "1")
	// Every virtual server address is local on an ipvs mode node: a
	// service address on kube-ipvs0 or a node address (NodePorts); so
	// are the members of KUBE-IPVS-IPS, which mirrors kube-ipvs0.
	h := trace.Host{LocalAddrs: append(slices.Clone(local), hostLocal...), IPSets: sets}
	for _, s := range services {
		if model.FamilyOf(s.Addr.Addr()) == fam {
			h.IPVS = append(h.IPVS, s)
			h.LocalAddrs = append(h.LocalAddrs, s.Addr.Addr())
		}
	}
	if s := sets[ipvsmode.SetName(ipvsmode.SetIPVSIPs, fam == model.IPv6)]; s != nil {
		for _, e := range s.Entries {
			if a, err := netip.ParseAddr(e); err == nil {
				h.LocalAddrs = append(h.LocalAddrs, a)
			}
		}
	}
	return &ipvsState{rules: rs, host: h, nodeAddrs: append(slices.Clone(local), node...)}, nil
}

// familySection keeps the section of one family from kproxy render's
// output ("# IPv4: ..." / "# IPv6: ..." headers); other text is whole.
func familySection(text string, fam v1.IPFamily) string {
	if !strings.Contains(text, "\n# IPv6:") && !strings.HasPrefix(text, "# IPv6:") {
		return text
	}
	var b strings.Builder
	keep := true
	for _, line := range strings.SplitAfter(text, "\n") {
		if strings.HasPrefix(line, "# IPv4:") || strings.HasPrefix(line, "# IPv6:") {
			keep = strings.HasPrefix(line, "# "+string(fam)+":")
		}
		if keep {
			b.WriteString(line)
		}
	}
	return b.String()
}

// liveIPTablesSave reads the family's rules from the iptables backend
// kproxy would choose.
func liveIPTablesSave(ctx context.Context, errOut io.Writer, o *config.Options, fam v1.IPFamily) (string, error) {
	b, reason, err := xtables.Select(ctx, o.IPTablesMode)
	if err != nil {
		return "", fmt.Errorf("choosing the iptables backend to read: %w", err)
	}
	bin := "iptables-" + string(b) + "-save"
	if fam == model.IPv6 {
		bin = "ip6tables-" + string(b) + "-save"
	}
	_, _ = fmt.Fprintf(errOut, "Reading %s (%s)\n", bin, reason)
	out, err := execer.OS{}.Run(ctx, []string{bin}, "")
	if err != nil {
		return "", fmt.Errorf("reading the live rules: %w", err)
	}
	return out, nil
}

// liveIPVS reads this node's IPVS table over generic netlink.
func liveIPVS() ([]trace.IPVSService, error) {
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
		out = append(out, ipvsmode.TraceService(s, ds))
	}
	return out, nil
}

// liveIPSets reads kube-proxy's ipsets of both families over netlink;
// their types are upstream's (the handle lists members, not types).
func liveIPSets() (map[string]*trace.IPSet, error) {
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
