package nftables

import (
	"net/netip"
	"time"

	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/kernel/conntrack"
	"github.com/kproxy/kproxy/internal/metrics"
	"github.com/kproxy/kproxy/internal/model"
)

// reconcileConntrack compares the kernel's UDP conntrack table with the
// state and deletes the entries that send a service's traffic somewhere
// that is not a serving endpoint. The per-sync deletions (clearConntrack)
// only see changes this process observed; entries to endpoints that died
// while kproxy was down, or whose deletion failed, are found only here.
// Upstream runs the same reconciliation (pkg/proxy/conntrack, 1.32+).
// Failures are logged: a sync whose rules are in place has succeeded.
func (p *Proxier) reconcileConntrack(state *model.State) {
	if p.conntrack == nil || state == nil {
		return
	}
	ipv6 := p.opts.Family == model.IPv6
	start := time.Now()
	defer func() {
		metrics.ReconcileConntrackFlowsLatency.WithLabelValues(string(p.opts.Family)).Observe(time.Since(start).Seconds())
	}()
	flows, err := p.conntrack.ListUDP(ipv6)
	if err != nil {
		klog.ErrorS(err, "Failed to list UDP conntrack entries for reconciliation", "ipFamily", p.opts.Family)
		return
	}
	filters := staleFlows(state, flows)
	if len(filters) == 0 {
		klog.V(4).InfoS("No stale UDP conntrack entries", "ipFamily", p.opts.Family, "entries", len(flows))
		return
	}
	n, err := p.conntrack.DeleteUDP(ipv6, filters)
	metrics.ReconcileConntrackFlowsDeletedEntriesTotal.WithLabelValues(string(p.opts.Family)).Add(float64(n))
	if err != nil {
		klog.ErrorS(err, "Failed to delete stale UDP conntrack entries found by reconciliation", "ipFamily", p.opts.Family, "stale", len(filters), "deleted", n)
		return
	}
	klog.V(2).InfoS("Deleted stale UDP conntrack entries found by reconciliation", "ipFamily", p.opts.Family, "entries", n, "listed", len(flows))
}

type ipPort struct {
	ip   netip.Addr
	port uint16
}

// staleFlows returns one filter per listed flow that is stale: its original
// destination is a UDP service port's cluster IP, external IP or load
// balancer VIP and port, or a UDP node port, and the reply comes from an
// address that is not a serving endpoint of that service port.
//
// Serving is all that counts, as upstream: traffic policies, topology and
// terminating status change which endpoints new flows get, and existing
// flows are kept as they would be for TCP. A service port without a serving
// endpoint loses all its flows (upstream skips it): its traffic is rejected
// anyway, and a client still sending to a dead endpoint gets the rejection
// instead of silence.
//
// Flows to a node port must have been DNATed: node ports are matched on any
// destination address, and an un-NATed flow to that port number is not
// ours (a pod talking to a remote server's port 30053, say).
func staleFlows(state *model.State, flows []conntrack.Flow) []conntrack.Filter {
	// Service ports sharing a frontend (a conflict the renderer reports)
	// pool their endpoints: a flow to any of them is kept.
	frontends := map[ipPort]sets.Set[netip.Addr]{}
	nodePorts := map[uint16]sets.Set[netip.Addr]{}
	pool := func(m map[ipPort]sets.Set[netip.Addr], k ipPort, eps sets.Set[netip.Addr]) {
		if m[k] == nil {
			m[k] = sets.New[netip.Addr]()
		}
		m[k].Insert(eps.UnsortedList()...)
	}
	for name, sp := range state.Services {
		if sp.Protocol != model.UDP {
			continue
		}
		serving := sets.New[netip.Addr]()
		for _, e := range state.Endpoints[name] {
			if e.Serving {
				serving.Insert(e.IP)
			}
		}
		for _, ip := range serviceIPs(sp) {
			if ip.IsValid() {
				pool(frontends, ipPort{ip, uint16(sp.Port)}, serving)
			}
		}
		if sp.NodePort != 0 {
			np := uint16(sp.NodePort)
			if nodePorts[np] == nil {
				nodePorts[np] = sets.New[netip.Addr]()
			}
			nodePorts[np].Insert(serving.UnsortedList()...)
		}
	}
	var out []conntrack.Filter
	for _, fl := range flows {
		if eps, ok := frontends[ipPort{fl.OrigDst, fl.OrigDstPort}]; ok {
			if !eps.Has(fl.ReplySrc) {
				out = append(out, fl.Filter())
			}
			continue
		}
		if eps, ok := nodePorts[fl.OrigDstPort]; ok && fl.DNATed() && !eps.Has(fl.ReplySrc) {
			out = append(out, fl.Filter())
		}
	}
	return out
}
