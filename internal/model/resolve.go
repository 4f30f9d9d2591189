package model

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
)

// Contested addresses.
//
// Two services can claim the same frontend: the API server does not stop a
// Service from listing another one's cluster IP as an external IP (upstream's
// CVE-2020-8554), a file snapshot can hold anything, and node ports or
// cluster IPs collide when objects of two clusters are mixed. A frontend can
// reach one service port only, so the State decides who keeps it, the same
// way whatever order the objects came in and after a restart:
//
//   - a claim as cluster IP beats a claim as external IP or load balancer
//     VIP: the address belongs to the Service it was allocated to;
//   - among equal claims, the earliest creationTimestamp wins (an unknown
//     one counts as newest), then namespace/name, then port name.
//
// The loser is skipped for that address only: a lost external IP or VIP is
// left out of its port, a lost node port is dropped, and a port that loses
// its cluster IP frontend is not programmed at all in that family (its other
// claims then count for nothing). Every mode reads the resolved ports in
// State.Services, so they all program the same thing.

// ClaimKind is how a service port claims a frontend.
type ClaimKind uint8

// Claim kinds, in the order they win a tie.
const (
	ClaimClusterIP ClaimKind = iota
	ClaimExternalIP
	ClaimLoadBalancerIP
	ClaimNodePort
)

// ClaimKinds lists every kind (for metrics).
var ClaimKinds = []ClaimKind{ClaimClusterIP, ClaimExternalIP, ClaimLoadBalancerIP, ClaimNodePort}

func (k ClaimKind) String() string {
	switch k {
	case ClaimClusterIP:
		return "clusterIP"
	case ClaimExternalIP:
		return "externalIP"
	case ClaimLoadBalancerIP:
		return "loadBalancerIP"
	case ClaimNodePort:
		return "nodePort"
	}
	return fmt.Sprintf("ClaimKind(%d)", uint8(k))
}

// frontend is one way traffic reaches a service port in the State's family:
// an IP, protocol and port, or (ip invalid) a node port and protocol.
type frontend struct {
	ip    netip.Addr
	port  int32
	proto v1.Protocol
}

func (f frontend) String() string {
	if !f.ip.IsValid() {
		return fmt.Sprintf("node port %d/%s", f.port, f.proto)
	}
	return netip.AddrPortFrom(f.ip, uint16(f.port)).String() + "/" + string(f.proto)
}

// claim is one service port's claim on a frontend; sp is the port as
// converted (unresolved).
type claim struct {
	sp   *ServicePort
	kind ClaimKind
}

// LostClaim is a claim a service port lost to another one.
type LostClaim struct {
	Loser     ServicePortName
	LoserKind ClaimKind
	// Address is the frontend: "198.19.0.10:80/TCP" or "node port 30080/TCP".
	Address    string
	Winner     ServicePortName
	WinnerKind ClaimKind
}

func (l LostClaim) String() string {
	return fmt.Sprintf("%s loses %s %s to %s (%s)", l.Loser, l.LoserKind, l.Address, l.Winner, l.WinnerKind)
}

func compareLost(a, b LostClaim) int {
	if c := a.Loser.Compare(b.Loser); c != 0 {
		return c
	}
	if c := int(a.LoserKind) - int(b.LoserKind); c != 0 {
		return c
	}
	if c := strings.Compare(a.Address, b.Address); c != 0 {
		return c
	}
	if c := a.Winner.Compare(b.Winner); c != 0 {
		return c
	}
	return int(a.WinnerKind) - int(b.WinnerKind)
}

// claimsOf calls fn for every frontend sp claims, once per frontend and kind.
func claimsOf(sp *ServicePort, fn func(frontend, ClaimKind)) {
	if sp == nil {
		return
	}
	if sp.ClusterIP.IsValid() {
		fn(frontend{ip: sp.ClusterIP, port: sp.Port, proto: sp.Protocol}, ClaimClusterIP)
	}
	for i, ip := range sp.ExternalIPs {
		if !slices.Contains(sp.ExternalIPs[:i], ip) {
			fn(frontend{ip: ip, port: sp.Port, proto: sp.Protocol}, ClaimExternalIP)
		}
	}
	for i, in := range sp.LoadBalancerIngress {
		if in.Proxy || slices.ContainsFunc(sp.LoadBalancerIngress[:i], func(o LoadBalancerIngress) bool { return !o.Proxy && o.IP == in.IP }) {
			continue
		}
		fn(frontend{ip: in.IP, port: sp.Port, proto: sp.Protocol}, ClaimLoadBalancerIP)
	}
	if sp.NodePort != 0 {
		fn(frontend{port: sp.NodePort, proto: sp.Protocol}, ClaimNodePort)
	}
}

// better reports whether claim a beats claim b.
func better(a, b claim) bool {
	if ac, bc := a.kind == ClaimClusterIP, b.kind == ClaimClusterIP; ac != bc {
		return ac
	}
	if a.sp.Created != b.sp.Created {
		switch {
		case a.sp.Created == 0:
			return false
		case b.sp.Created == 0:
			return true
		}
		return a.sp.Created < b.sp.Created
	}
	if c := a.sp.Name.Compare(b.sp.Name); c != 0 {
		return c < 0
	}
	return a.kind < b.kind
}

// resolver answers, within one Apply, who holds a frontend; answers are
// memoized, since every claimant of a frontend asks.
type resolver struct {
	s       *State
	winners map[frontend]claim
	cipWins map[frontend]claim
}

// clusterIPWinner is the best cluster IP claim on f (sp nil: none). It
// decides whether a port is programmed at all and depends on nothing else.
func (r *resolver) clusterIPWinner(f frontend) claim {
	if w, ok := r.cipWins[f]; ok {
		return w
	}
	var w claim
	for _, c := range r.s.claims[f] {
		if c.kind == ClaimClusterIP && (w.sp == nil || better(c, w)) {
			w = c
		}
	}
	r.cipWins[f] = w
	return w
}

// alive reports whether sp keeps its cluster IP frontend.
func (r *resolver) alive(sp *ServicePort) bool {
	if !sp.ClusterIP.IsValid() {
		return true
	}
	w := r.clusterIPWinner(frontend{ip: sp.ClusterIP, port: sp.Port, proto: sp.Protocol})
	return w.sp == nil || w.sp.Name == sp.Name
}

// winner is the claim that holds f: the best cluster IP claim, else the
// best claim of a port that is programmed at all.
func (r *resolver) winner(f frontend) claim {
	if w, ok := r.winners[f]; ok {
		return w
	}
	w := r.clusterIPWinner(f)
	if w.sp == nil {
		for _, c := range r.s.claims[f] {
			if (w.sp == nil || better(c, w)) && r.alive(c.sp) {
				w = c
			}
		}
	}
	r.winners[f] = w
	return w
}

// resolve returns sp as it is programmed (nil: not at all; sp itself when
// it lost nothing) and the claims it lost, sorted.
func (r *resolver) resolve(sp *ServicePort) (*ServicePort, []LostClaim) {
	var lost []LostClaim
	lose := func(f frontend, k ClaimKind) {
		w := r.winner(f)
		if w.sp == nil || (w.sp.Name == sp.Name && w.kind == k) {
			return
		}
		lost = append(lost, LostClaim{Loser: sp.Name, LoserKind: k, Address: f.String(), Winner: w.sp.Name, WinnerKind: w.kind})
	}
	if !r.alive(sp) {
		lose(frontend{ip: sp.ClusterIP, port: sp.Port, proto: sp.Protocol}, ClaimClusterIP)
		return nil, lost
	}
	claimsOf(sp, lose)
	if len(lost) == 0 {
		return sp, nil
	}
	slices.SortFunc(lost, compareLost)
	out := *sp
	holds := func(ip netip.Addr, k ClaimKind) bool {
		w := r.winner(frontend{ip: ip, port: sp.Port, proto: sp.Protocol})
		return w.sp == nil || (w.sp.Name == sp.Name && w.kind == k)
	}
	out.ExternalIPs = nil
	for _, ip := range sp.ExternalIPs {
		if holds(ip, ClaimExternalIP) {
			out.ExternalIPs = append(out.ExternalIPs, ip)
		}
	}
	out.LoadBalancerIngress = nil
	for _, in := range sp.LoadBalancerIngress {
		if in.Proxy || holds(in.IP, ClaimLoadBalancerIP) {
			out.LoadBalancerIngress = append(out.LoadBalancerIngress, in)
		}
	}
	if sp.NodePort != 0 {
		w := r.winner(frontend{port: sp.NodePort, proto: sp.Protocol})
		if w.sp != nil && w.sp.Name != sp.Name {
			out.NodePort = 0
		}
	}
	return &out, lost
}

func (s *State) addClaims(sp *ServicePort, touched map[frontend]struct{}) {
	claimsOf(sp, func(f frontend, k ClaimKind) {
		// Clipped: a Clone of the State may share the backing array.
		s.claims[f] = append(slices.Clip(s.claims[f]), claim{sp: sp, kind: k})
		touched[f] = struct{}{}
	})
}

func (s *State) removeClaims(sp *ServicePort, touched map[frontend]struct{}) {
	claimsOf(sp, func(f frontend, _ ClaimKind) {
		touched[f] = struct{}{}
		list, ok := s.claims[f]
		if !ok {
			return
		}
		// A new slice: a Clone of the State may share the old one.
		list = slices.DeleteFunc(slices.Clone(list), func(c claim) bool { return c.sp.Name == sp.Name })
		if len(list) == 0 {
			delete(s.claims, f)
		} else {
			s.claims[f] = list
		}
	})
}

// rawOf is a service port as converted, before resolution (nil: none).
func (s *State) rawOf(n ServicePortName) *ServicePort {
	if sp, ok := s.shadowed[n]; ok {
		return sp
	}
	return s.Services[n]
}

// applyServices folds service changes in: the claims of every changed port
// are updated, then every port that claims a frontend whose holder may have
// changed is resolved again. The work follows the number of claims on the
// frontends touched, not the number of services.
func (s *State) applyServices(upd map[ServicePortName]*ServicePort, changed sets.Set[ServicePortName]) {
	touched := map[frontend]struct{}{}
	raw := map[ServicePortName]*ServicePort{}
	for name, sp := range upd {
		old := s.rawOf(name)
		if sp == nil && old == nil {
			continue
		}
		if old != nil && sp != nil && old.Equal(sp) {
			continue
		}
		s.removeClaims(old, touched)
		s.addClaims(sp, touched)
		raw[name] = sp
		changed.Insert(name)
	}
	if len(touched) == 0 && len(raw) == 0 {
		return
	}
	// A port whose cluster IP frontend was touched may be programmed or
	// not now, which changes who holds its other frontends.
	// One level is enough: whether a port is programmed depends on
	// cluster IP claims only.
	first := make([]frontend, 0, len(touched))
	for f := range touched {
		first = append(first, f)
	}
	for _, f := range first {
		for _, c := range s.claims[f] {
			if c.kind == ClaimClusterIP {
				claimsOf(c.sp, func(g frontend, _ ClaimKind) { touched[g] = struct{}{} })
			}
		}
	}
	redo := map[ServicePortName]struct{}{}
	for name := range raw {
		redo[name] = struct{}{}
	}
	for f := range touched {
		for _, c := range s.claims[f] {
			redo[c.sp.Name] = struct{}{}
		}
	}
	r := &resolver{s: s, winners: map[frontend]claim{}, cipWins: map[frontend]claim{}}
	for name := range redo {
		sp, ok := raw[name]
		if !ok {
			sp = s.rawOf(name)
		}
		old := s.Services[name]
		var res *ServicePort
		var lost []LostClaim
		if sp != nil {
			res, lost = r.resolve(sp)
		}
		switch {
		case sp == nil || res == sp:
			delete(s.shadowed, name)
		default:
			s.shadowed[name] = sp
		}
		if res == nil {
			delete(s.Services, name)
		} else {
			s.Services[name] = res
		}
		if (old == nil) != (res == nil) || (old != nil && !old.Equal(res)) {
			changed.Insert(name)
		}
		s.setLost(name, lost)
	}
}

// setLost records the claims a port lost now, logging each new one once.
func (s *State) setLost(name ServicePortName, lost []LostClaim) {
	old := s.lost[name]
	if slices.Equal(old, lost) {
		return
	}
	for _, l := range old {
		s.contested[l.LoserKind]--
		if !slices.Contains(lost, l) {
			klog.InfoS("Service port holds a contested address again", "ipFamily", s.Family, "servicePort", l.Loser.String(), "claim", l.LoserKind.String(), "address", l.Address)
		}
	}
	for _, l := range lost {
		s.contested[l.LoserKind]++
		if !slices.Contains(old, l) {
			klog.ErrorS(nil, "Service port loses a contested address to another service; skipped for that address",
				"ipFamily", s.Family, "servicePort", l.Loser.String(), "claim", l.LoserKind.String(), "address", l.Address,
				"keptBy", l.Winner.String(), "keptAs", l.WinnerKind.String())
			s.newLost = append(s.newLost, l)
		}
	}
	if len(lost) == 0 {
		delete(s.lost, name)
	} else {
		s.lost[name] = lost
	}
}

// Lost returns every claim currently lost, sorted.
func (s *State) Lost() []LostClaim {
	var out []LostClaim
	for _, l := range s.lost {
		out = append(out, l...)
	}
	slices.SortFunc(out, compareLost)
	return out
}

// Contested counts the claims currently lost, by the kind of the lost claim.
func (s *State) Contested() map[ClaimKind]int {
	out := make(map[ClaimKind]int, len(ClaimKinds))
	for _, k := range ClaimKinds {
		out[k] = s.contested[k]
	}
	return out
}

// NewlyLost returns the claims lost by the last Apply that were not lost
// before it (each was logged once).
func (s *State) NewlyLost() []LostClaim { return s.newLost }
