package iptables

// IPVS, for ipvs mode: the kernel's IPVS table (trace.Host.IPVS) takes a
// new connection to one of its virtual servers at two points of the
// netfilter hooks, and the walk models both:
//
//   - LOCAL_IN at priority NF_IP_PRI_NAT_SRC-2 (98): a packet from an
//     interface to a local address (a ClusterIP bound to kube-ipvs0, a
//     node address for a NodePort) after the filter table's INPUT chains,
//     before nat INPUT (ip_vs_remote_request4/6);
//   - LOCAL_OUT at NF_IP_PRI_NAT_DST+1 (-99): a local process's packet,
//     after nat OUTPUT, before filter OUTPUT (ip_vs_local_request4/6).
//
// The scheduler picks a real server of weight above 0 (weight 0 takes no
// new connections: a terminating endpoint draining); with none, IPVS
// answers ICMP port unreachable and drops the packet (ip_vs_leave), a
// reject here. The tracer does not run the scheduler: each real server is
// an outcome with probability weight/sum of weights, which is what rr
// and wrr give over many connections; the others pick by connection
// counts or by a hash, the outcome says so. In masq (NAT) forwarding
// IPVS rewrites the destination and sends the packet out through
// LOCAL_OUT from its start (ip_vs_nat_send_or_cont), so filter OUTPUT and
// then nat POSTROUTING see the real server as destination: that is where
// kube-proxy's KUBE-POSTROUTING masquerades. IPVS has marked the packet
// (ipvs_property) and does not take it a second time. Direct routing,
// tunnelling and firewall-mark virtual servers are not modelled.

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/trace"
)

// tableIPVS is IPVS's place on the hooks, among the tables.
const (
	tableIPVS  = "ipvs"
	priIPVSIn  = 98
	priIPVSOut = -99
)

// schedulerNote says how a scheduler picks, for the trace's report.
func schedulerNote(name string) string {
	switch name {
	case "rr", "wrr":
		return "in turn by weight"
	case "lc", "wlc", "sed", "nq", "fo", "ovf", "twos":
		return "by active connections and weight; the share shown is by weight"
	case "sh", "dh", "mh":
		return "by a hash of the address; the share shown is by weight"
	case "lblc", "lblcr":
		return "by destination locality; the share shown is by weight"
	}
	return "the share shown is by weight"
}

// ipvs is IPVS's turn on the hook; done when the path ended.
func (w *walker) ipvs(s *state, prio int) (bool, error) {
	s.ti++
	if len(w.h.IPVS) == 0 || s.ipvs != nil || trace.ProtocolOf(uint16(s.proto)) == "" {
		return false, nil
	}
	vs := w.h.FindIPVS(trace.ProtocolOf(uint16(s.proto)), netip.AddrPortFrom(s.dst, s.dport))
	if vs == nil {
		s.Step("ipvs %s (priority %d): no virtual server for %s %s", s.hook, prio, trace.ProtocolOf(uint16(s.proto)), netip.AddrPortFrom(s.dst, s.dport))
		return false, nil
	}
	s.ipvs = vs
	s.Step("ipvs %s (priority %d): virtual server %s", s.hook, prio, vs)
	if vs.Persistent {
		s.Step("ipvs: persistent %ds: this client's connections in that time go to the real server its first one went to", vs.Timeout)
	}
	var live []trace.IPVSReal
	total := 0
	for _, r := range vs.Reals {
		if r.Weight <= 0 {
			s.Step("ipvs: real server %s has weight 0 (terminating): no new connections", r.Addr)
			continue
		}
		if r.Method != "" && r.Method != "masq" {
			return true, unsupported("IPVS forwarding method %q of %s (only masq is modelled)", r.Method, r.Addr)
		}
		live = append(live, r)
		total += r.Weight
	}
	if len(live) == 0 {
		s.Step("ipvs: no real server takes new connections: ICMP port unreachable, dropped")
		return true, w.finish(s, trace.VerdictReject)
	}
	if vs.Persistent {
		if to, ok := w.r.persist[persistKey{vs.Proto, vs.Addr, s.src}]; ok {
			if i := slices.IndexFunc(live, func(r trace.IPVSReal) bool { return r.Addr == to }); i >= 0 {
				s.Step("ipvs: persistence template of client %s: real server %s", s.src, to)
				live, total = live[i:i+1], live[i].Weight
			}
		}
	}
	if len(w.pending)+len(w.res.Outcomes)+len(live) > w.lim.MaxOutcomes {
		return true, fmt.Errorf("%w: more than %d outcomes", trace.ErrLimit, w.lim.MaxOutcomes)
	}
	// The first real server continues this path; the others are pushed
	// last first, so outcomes come in the real servers' order.
	branches := make([]*state, len(live))
	branches[0] = s
	for i := 1; i < len(live); i++ {
		branches[i] = s.clone()
	}
	for i := len(live) - 1; i >= 1; i-- {
		w.pending = append(w.pending, branches[i])
	}
	for i, r := range live {
		b := branches[i]
		p := float64(r.Weight) / float64(total)
		b.prob *= p
		b.Step("ipvs: scheduler %s picks real server %s (weight %d, p=%s; %s)", vs.Scheduler, r.Addr, r.Weight, fmtProb(p), schedulerNote(vs.Scheduler))
		to := r.Addr
		if vs.Persistent {
			b.Updates = append(b.Updates, persistUpdate(vs, b.src, to))
		}
		b.dnat = &to
		b.dst, b.dport = to.Addr(), to.Port()
		// ip_vs_nat_send_or_cont: out through LOCAL_OUT from its start.
		b.stack = b.stack[:0]
		b.hook, b.tables, b.ti = hookOutput, slices.Clone(hookTables[hookOutput]), 0
		b.Step("ipvs: masq to %s, sent out: hook %s", to, hookOutput)
	}
	return false, nil
}

// persistKey is an IPVS persistence template: a client of a persistent
// virtual server (netmask /32 or /128, as kube-proxy sets it).
type persistKey struct {
	proto  v1.Protocol
	vs     netip.AddrPort
	client netip.Addr
}

// persistPrefix starts the affinity update of a persistent virtual server:
// the template the kernel creates with the connection.
const persistPrefix = "ipvs persistence template: "

// persistUpdate is how an outcome reports the persistence template its
// connection creates; Remember reads it back.
func persistUpdate(vs *trace.IPVSService, client netip.Addr, to netip.AddrPort) string {
	return fmt.Sprintf("%s%s %s client %s -> %s", persistPrefix, vs.Proto, vs.Addr, client, to)
}

// parsePersistUpdate reads persistUpdate's text.
func parsePersistUpdate(u string) (persistKey, netip.AddrPort, error) {
	f := strings.Fields(strings.TrimPrefix(u, persistPrefix))
	bad := fmt.Errorf("not an IPVS persistence update: %q", u)
	if len(f) != 6 || f[2] != "client" || f[4] != "->" {
		return persistKey{}, netip.AddrPort{}, bad
	}
	vs, err1 := netip.ParseAddrPort(f[1])
	client, err2 := netip.ParseAddr(f[3])
	to, err3 := netip.ParseAddrPort(f[5])
	if err1 != nil || err2 != nil || err3 != nil {
		return persistKey{}, netip.AddrPort{}, bad
	}
	return persistKey{v1.Protocol(f[0]), vs, client}, to, nil
}
