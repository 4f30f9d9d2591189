package iptables

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
// that is not a serving endpoint, as upstream's reconciler does (1.32+).
// The per-sync deletions only see changes this process observed; entries
// to endpoints that died while kproxy was down are found only here. It
// runs on full syncs; failures are logged, the rules are in place anyway.
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

type frontend struct {
	ip   netip.Addr
	port uint16
}

// staleFlows returns one filter per listed flow whose original destination
// is a UDP service port's cluster IP, external IP or load balancer VIP and
// port, or a UDP node port (DNATed flows only: a node port number is
// matched on any address), and whose reply comes from an address that is
// not a serving endpoint of that service port. Service ports sharing a
// frontend pool their endpoints.
func staleFlows(state *model.State, flows []conntrack.Flow) []conntrack.Filter {
	frontends := map[frontend]sets.Set[netip.Addr]{}
	nodePorts := map[uint16]sets.Set[netip.Addr]{}
	for name, sp := range state.Services {
		if sp.Protocol != model.UDP {
			continue
		}
		var serving []netip.Addr
		for _, e := range state.Endpoints[name] {
			if e.Serving {
				serving = append(serving, e.IP)
			}
		}
		for _, ip := range serviceIPs(sp) {
			if !ip.IsValid() {
				continue
			}
			k := frontend{ip, uint16(sp.Port)}
			if frontends[k] == nil {
				frontends[k] = sets.New[netip.Addr]()
			}
			frontends[k].Insert(serving...)
		}
		if sp.NodePort != 0 {
			np := uint16(sp.NodePort)
			if nodePorts[np] == nil {
				nodePorts[np] = sets.New[netip.Addr]()
			}
			nodePorts[np].Insert(serving...)
		}
	}
	var out []conntrack.Filter
	for _, fl := range flows {
		if eps, ok := frontends[frontend{fl.OrigDst, fl.OrigDstPort}]; ok {
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
