package ipvs

// Packet-flow tests: the shared table of package flowtest (the address
// plan is at the top of its snapshot.go), rendered by this package and
// followed through the iptables tracer, which walks ipvs mode: the
// iptables rules with their ipset matches, then the IPVS table.

import (
	"errors"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy/flowtest"
	"github.com/kproxy/kproxy/internal/trace"
	iptrace "github.com/kproxy/kproxy/internal/trace/iptables"
)

// flowFamily is one family's rendered state loaded for the tracer: the
// iptables rules, and what ipvs mode adds to the host (ipsets, virtual
// servers, kube-ipvs0's addresses).
type flowFamily struct {
	rules *iptrace.Ruleset
	host  trace.Host
}

// flowTracer is ipvs mode's flowtest.Tracer: one family each.
type flowTracer map[v1.IPFamily]*flowFamily

// Trace adds the family's ipsets, IPVS table and kube-ipvs0 addresses to
// the node flowtest describes.
func (ft flowTracer) Trace(p trace.Packet, h trace.Host) (*trace.Result, error) {
	f := ft[model.FamilyOf(p.Dst)]
	h.LocalAddrs = append(slices.Clone(h.LocalAddrs), f.host.LocalAddrs...)
	h.IPSets = f.host.IPSets
	h.IPVS = f.host.IPVS
	return f.rules.Trace(p, h)
}

func (ft flowTracer) Remember(o trace.Outcome) error {
	if o.DNAT == nil {
		return errors.New("an outcome without DNAT records no affinity")
	}
	return ft[model.FamilyOf(o.DNAT.Addr())].rules.Remember(o)
}

// flowAdapter is ipvs mode's flowtest.Adapter: Render of both families
// for a fresh node with the snapshot's configuration, the iptables part
// restored into a fresh tracer ruleset (--noflush, as the proxier loads
// it), the ipsets and virtual servers handed to the tracer as the host's.
func flowAdapter(t testing.TB, s *flowtest.Snapshot) flowtest.Tracer {
	t.Helper()
	out := flowTracer{}
	for _, f := range flowtest.Families {
		d, err := Render(flowConfig(f, s), s.States[f], s.Node, Host{Addrs: s.LocalAddrs})
		if err != nil {
			t.Fatalf("%s render: %v", f, err)
		}
		rs := &iptrace.Ruleset{}
		if err := rs.Apply(d.IPTables, true); err != nil {
			t.Fatalf("%s rules do not load: %v\n%s", f, err, d.IPTables)
		}
		ff := &flowFamily{rules: rs, host: traceHost(d)}
		// kube-ipvs0's addresses are local; so is every virtual server's
		// (a node address for a NodePort, already in the snapshot's).
		ff.host.LocalAddrs = append(ff.host.LocalAddrs, d.Addresses...)
		for _, vs := range ff.host.IPVS {
			ff.host.LocalAddrs = append(ff.host.LocalAddrs, vs.Addr.Addr())
		}
		out[f] = ff
	}
	return out
}

// flowConfig is the configuration cmd/kproxy builds (ipvsRenderConfig)
// from upstream's defaults changed by a flowtest configuration.
func flowConfig(f v1.IPFamily, s *flowtest.Snapshot) *Config {
	c := s.Config
	rc := &Config{
		Family:            f,
		NodeName:          s.Node.Name,
		MasqueradeBit:     14,
		MasqueradeAll:     c.MasqueradeAll,
		LocalDetect:       c.LocalDetect(f),
		NodePortAddresses: c.NodePortAddresses,
	}
	rc.LocalDetect.Family = f
	// c.ServiceCIDRs: ipvs mode does not use them, as upstream.
	// c.NoLocalhostNodePorts: ipvs mode never serves node ports on
	// loopback, as upstream.
	return rc
}

func TestPacketFlow(t *testing.T) {
	flowtest.Run(t, flowtest.IPVS, flowAdapter)
}

// traceHost is the rendered ipsets and virtual servers as the tracer's
// host holds them.
func traceHost(d *Plan) trace.Host {
	h := trace.Host{IPSets: map[string]*trace.IPSet{}}
	for _, s := range d.SortedSets() {
		h.IPSets[s.Name] = &trace.IPSet{Name: s.Name, Type: s.Type, IPv6: s.IPv6, Entries: s.Entries}
	}
	for _, vs := range d.Sorted() {
		h.IPVS = append(h.IPVS, trace.IPVSServiceOf(vs.Service, vs.Reals))
	}
	return h
}
