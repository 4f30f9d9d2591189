package ipvs

import (
	"fmt"
	"net/netip"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/kernel/ipvs"
	"github.com/kproxy/kproxy/internal/trace"
)

// TraceServices converts the rendered virtual servers for the iptables
// tracer (trace.Host.IPVS), in Sorted order.
func (d *Plan) TraceServices() []trace.IPVSService {
	var out []trace.IPVSService
	for _, vs := range d.Sorted() {
		out = append(out, TraceService(vs.Service, vs.Reals))
	}
	return out
}

// TraceSets converts the rendered ipsets for the iptables tracer
// (trace.Host.IPSets), by name.
func (d *Plan) TraceSets() map[string]*trace.IPSet {
	out := map[string]*trace.IPSet{}
	for _, s := range d.SortedSets() {
		out[s.Name] = &trace.IPSet{Name: s.Name, Type: s.Type, IPv6: s.IPv6, Entries: s.Entries}
	}
	return out
}

// TraceService converts one virtual server with its real servers, as
// rendered or as read from the kernel, for the tracer.
func TraceService(s ipvs.Service, reals []ipvs.Destination) trace.IPVSService {
	ts := trace.IPVSService{
		Proto:      protocolName(s.Protocol),
		Addr:       netip.AddrPortFrom(s.Addr.Unmap(), s.Port),
		Scheduler:  s.Scheduler,
		Persistent: s.Flags&ipvs.FlagPersistent != 0,
		Timeout:    s.Timeout,
	}
	if s.Flags&FlagSourceHash != 0 {
		ts.Flags = append(ts.Flags, "sh-port")
	}
	for _, r := range reals {
		ts.Reals = append(ts.Reals, trace.IPVSReal{Addr: netip.AddrPortFrom(r.Addr.Unmap(), r.Port), Weight: r.Weight, Method: "masq"})
	}
	return ts
}

// protocolName is the virtual server's protocol, its number when not one
// of Kubernetes' (a foreign virtual server's).
func protocolName(p uint16) v1.Protocol {
	if name := trace.ProtocolOf(p); name != "" {
		return name
	}
	return v1.Protocol(fmt.Sprint(p))
}
