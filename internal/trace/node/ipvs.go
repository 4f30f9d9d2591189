package node

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy"
	ipvsmode "github.com/kproxy/kproxy/internal/proxy/ipvs"
	"github.com/kproxy/kproxy/internal/trace"
	"github.com/kproxy/kproxy/internal/trace/savedstate"
)

// traceIPVS traces a packet through ipvs mode: iptables rules with ipset
// matches, then the IPVS table to a real server.
func traceIPVS(ctx context.Context, req Request) (*trace.Result, error) {
	fam := model.FamilyOf(req.Packet.Dst)
	var text string
	var services []trace.IPVSService
	var sets map[string]*trace.IPSet
	// hostLocal are addresses local to the host besides req.Local; node
	// the node's own (not the service addresses on kube-ipvs0): a packet
	// from the node leaves from one.
	var hostLocal, node []netip.Addr
	switch {
	case req.Live:
		var err error
		if text, err = IPTablesSave(ctx, req.Log, req.IPTablesMode, fam); err != nil {
			return nil, err
		}
		if services, err = IPVS(); err != nil {
			return nil, err
		}
		if sets, err = IPSets(); err != nil {
			return nil, err
		}
		if len(req.Local) == 0 {
			if hostLocal, err = proxy.LocalAddrs(); err != nil {
				return nil, err
			}
			if node, err = proxy.LocalAddrsExcept(ipvsmode.DummyDevice); err != nil {
				return nil, err
			}
		}
	case len(req.Rules) > 0:
		all, err := ReadRules(req.Rules)
		if err != nil {
			return nil, err
		}
		parts, err := savedstate.Split(all)
		if err != nil {
			return nil, err
		}
		text = FamilySection(parts.IPTables, fam)
		if services, err = savedstate.ParseIPVSAdm(parts.IPVSAdm); err != nil {
			return nil, err
		}
		if sets, err = savedstate.ParseIPSetSave(parts.IPSet); err != nil {
			return nil, err
		}
		hostLocal = parts.DummyAddrs
	default:
		r, err := req.Render(config.ModeIPVS, fam, req.Local)
		if err != nil {
			return nil, err
		}
		if r.IPVS == nil {
			return nil, fmt.Errorf("no ipvs mode rendering")
		}
		if len(req.Local) == 0 {
			hostLocal = r.NodeAddrs
			node = hostLocal
		}
		text = string(r.IPVS.IPTables)
		h := DesiredHost(r.IPVS)
		services, sets = h.IPVS, h.IPSets
		hostLocal = append(hostLocal, r.IPVS.Addresses...)
	}
	rs, err := iptablesRuleset(text, fam, req.Live)
	if err != nil {
		return nil, err
	}
	h := ipvsHost(fam, append(slices.Clone(req.Local), hostLocal...), services, sets)
	return rs.Trace(Source(req.Packet, append(slices.Clone(req.Local), node...)), h)
}

// ipvsHost is the host of a trace of ipvs mode. Every virtual server
// address of the family is local on an ipvs mode node: a service address
// on kube-ipvs0 or a node address (NodePorts); so are the members of
// KUBE-IPVS-IPS, which mirrors kube-ipvs0.
func ipvsHost(fam v1.IPFamily, local []netip.Addr, services []trace.IPVSService, sets map[string]*trace.IPSet) trace.Host {
	h := trace.Host{LocalAddrs: local, IPSets: sets}
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
	return h
}

// DesiredHost is ipvs mode's rendered ipsets and virtual servers as the
// tracer's host holds them.
func DesiredHost(d *ipvsmode.Plan) trace.Host {
	h := trace.Host{IPSets: map[string]*trace.IPSet{}}
	for _, s := range d.SortedSets() {
		h.IPSets[s.Name] = &trace.IPSet{Name: s.Name, Type: s.Type, IPv6: s.IPv6, Entries: s.Entries}
	}
	for _, vs := range d.Sorted() {
		h.IPVS = append(h.IPVS, trace.IPVSServiceOf(vs.Service, vs.Reals))
	}
	return h
}
