// Package udpflows removes UDP conntrack entries that would keep sending a
// service's packets somewhere they should no longer go. Both proxy modes use
// it the same way: after every applied sync, Clear deletes the flows of the
// endpoints the sync removed and the cached rejects of service ports that
// got endpoints; on full syncs, Reconcile compares the whole UDP conntrack
// table with the state, as upstream's reconciler does (1.32+), which also
// finds what changed while kproxy was not running. Failures are logged and
// counted: a sync whose rules are in place has succeeded.
package udpflows

import (
	"net/netip"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/kernel/conntrack"
	"github.com/kproxy/kproxy/internal/metrics"
	"github.com/kproxy/kproxy/internal/model"
)

// Stale is a UDP service port and endpoints that no longer serve it.
type Stale struct {
	Service   *model.ServicePort
	Endpoints []*model.Endpoint
}

// ServiceIPs are the addresses a service port is reached at besides node
// ports: its cluster IP, external IPs and load balancer VIPs.
func ServiceIPs(sp *model.ServicePort) []netip.Addr {
	ips := []netip.Addr{sp.ClusterIP}
	ips = append(ips, sp.ExternalIPs...)
	return append(ips, sp.LoadBalancerVIPs()...)
}

// Clear deletes the UDP entries that would keep sending packets to
// endpoints that are gone (stale), or keep rejecting a service port that
// now has endpoints (newlyServed). ct nil does nothing.
func Clear(ct conntrack.Interface, family v1.IPFamily, stale []Stale, newlyServed []*model.ServicePort) {
	if ct == nil {
		return
	}
	var filters []conntrack.Filter
	for _, st := range stale {
		sp := st.Service
		for _, e := range st.Endpoints {
			for _, ip := range ServiceIPs(sp) {
				filters = append(filters, conntrack.Filter{OrigDst: ip, OrigDstPort: uint16(sp.Port), ReplySrc: e.IP})
			}
			if sp.NodePort != 0 {
				filters = append(filters, conntrack.Filter{OrigDstPort: uint16(sp.NodePort), ReplySrc: e.IP})
			}
		}
	}
	for _, sp := range newlyServed {
		for _, ip := range ServiceIPs(sp) {
			filters = append(filters, conntrack.Filter{OrigDst: ip, OrigDstPort: uint16(sp.Port)})
		}
		if sp.NodePort != 0 {
			filters = append(filters, conntrack.Filter{OrigDstPort: uint16(sp.NodePort)})
		}
	}
	if len(filters) == 0 {
		return
	}
	start := time.Now()
	n, err := ct.DeleteUDP(family == model.IPv6, filters)
	metrics.ReconcileConntrackFlowsLatency.WithLabelValues(string(family)).Observe(time.Since(start).Seconds())
	metrics.ReconcileConntrackFlowsDeletedEntriesTotal.WithLabelValues(string(family)).Add(float64(n))
	if err != nil {
		klog.ErrorS(err, "Failed to delete stale UDP conntrack entries", "ipFamily", family, "filters", len(filters))
		return
	}
	klog.V(2).InfoS("Deleted stale UDP conntrack entries", "ipFamily", family, "entries", n, "filters", len(filters))
}

// Reconcile compares the kernel's UDP conntrack table with the state and
// deletes the entries that send a service's traffic somewhere that is not
// a serving endpoint. Clear only sees changes this process observed;
// entries to endpoints that died while kproxy was down, or whose deletion
// failed, are found only here. ct or state nil does nothing.
//
// A state without UDP service ports has nothing to reconcile (StaleFlows
// would find nothing), so the table is not listed. As upstream's
// reconciler, which runs only when a UDP service port's endpoints changed,
// a run that completes is timed and counted (also when it deletes
// nothing), a run whose listing fails is not: the duration histogram
// appears with the first run that had something to check.
func Reconcile(ct conntrack.Interface, family v1.IPFamily, state *model.State) {
	if ct == nil || state == nil || !hasUDP(state) {
		return
	}
	ipv6 := family == model.IPv6
	start := time.Now()
	flows, err := ct.ListUDP(ipv6)
	if err != nil {
		klog.ErrorS(err, "Failed to list UDP conntrack entries for reconciliation", "ipFamily", family)
		return
	}
	n := 0
	if filters := StaleFlows(state, flows); len(filters) == 0 {
		klog.V(4).InfoS("No stale UDP conntrack entries", "ipFamily", family, "entries", len(flows))
	} else if n, err = ct.DeleteUDP(ipv6, filters); err != nil {
		klog.ErrorS(err, "Failed to delete stale UDP conntrack entries found by reconciliation", "ipFamily", family, "stale", len(filters), "deleted", n)
	} else {
		klog.V(2).InfoS("Deleted stale UDP conntrack entries found by reconciliation", "ipFamily", family, "entries", n, "listed", len(flows))
	}
	metrics.ReconcileConntrackFlowsLatency.WithLabelValues(string(family)).Observe(time.Since(start).Seconds())
	metrics.ReconcileConntrackFlowsDeletedEntriesTotal.WithLabelValues(string(family)).Add(float64(n))
}

// hasUDP reports whether the state holds a UDP service port.
func hasUDP(state *model.State) bool {
	for _, sp := range state.Services {
		if sp.Protocol == model.UDP {
			return true
		}
	}
	return false
}

type ipPort struct {
	ip   netip.Addr
	port uint16
}

// StaleFlows returns one filter per listed flow that is stale: its original
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
func StaleFlows(state *model.State, flows []conntrack.Flow) []conntrack.Filter {
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
		for _, ip := range ServiceIPs(sp) {
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

// Removed returns the endpoints of was that are no longer serving in now
// (gone, or no longer serving): their UDP flows must be cleared.
func Removed(was, now []*model.Endpoint) []*model.Endpoint {
	var removed []*model.Endpoint
	for _, e := range was {
		serving := slices.ContainsFunc(now, func(x *model.Endpoint) bool { return x.Serving && x.AddrPort() == e.AddrPort() })
		if !serving {
			removed = append(removed, e)
		}
	}
	return removed
}

// Kept are the endpoints whose UDP flows a sync leaves in place: those new
// traffic goes to (reachable) and those that still serve (terminating
// ones). A proxier remembers them, not only the reachable ones, for the
// next sync's Removed: an endpoint that turned terminating and then went
// away must be named stale when it goes.
func Kept(reachable, eps []*model.Endpoint) []*model.Endpoint {
	kept := reachable
	for _, e := range eps {
		if e.Serving && !slices.ContainsFunc(kept, func(x *model.Endpoint) bool { return x.AddrPort() == e.AddrPort() }) {
			if len(kept) == len(reachable) {
				kept = slices.Clone(reachable)
			}
			kept = append(kept, e)
		}
	}
	return kept
}
