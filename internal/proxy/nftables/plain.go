package nftables

import (
	"net/netip"
	"slices"
	"time"

	"k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/model"
)

// plainSide is one version of a plain service port's endpoints: the
// chain cluster/PROTO/len(to) and the keys 0 … len(to)-1 of its address
// and port in an endpoint map. Never changed once made.
type plainSide struct {
	to []netip.AddrPort
}

func (p *plainSide) n() int {
	if p == nil {
		return 0
	}
	return len(p.to)
}

func (p *plainSide) equal(q *plainSide) bool {
	return p.n() == q.n() && (p == nil || slices.Equal(p.to, q.to))
}

// plainApplied is what the kernel holds for a plain service port, a
// ClusterIP-only port without per-service chain (see plainService).
//
// Changing an element's value means deleting it, and every transaction
// that deletes waits for an RCU grace period (~15 ms, docs/benchmarks.md
// "Where the time goes: nftables"). So there are plainTiers versions of the maps: the shard's
// services chain looks up cluster-services-newer, then -new, then
// cluster-services, and each shared chain the endpoint maps in the same
// order. A partial sync writes a changed plain port into the tier above
// the one in use (adds only), which overrides what the lower ones hold
// for it; a clean-up at least staleDelay after the first such change
// (settle) moves it back to tier 0, paying the deletions after the
// change is live, once for all ports due. With syncs at least a second
// apart a port changed at every sync never runs out of tiers; one
// changed again in the top tier is changed in place, which deletes.
type plainApplied struct {
	svc  netip.Addr
	port uint16
	// tiers are what each tier's maps hold for it (nil: nothing); tier
	// 0 is never nil, tiers above the one in use are.
	tiers [plainTiers]*plainSide
}

// top is the tier traffic to the service port uses.
func (p *plainApplied) top() int {
	t := 0
	for i, s := range p.tiers {
		if s != nil {
			t = i
		}
	}
	return t
}

// effective is what traffic to the service port uses.
func (p *plainApplied) effective() *plainSide { return p.tiers[p.top()] }

// settledPlain is a plain service port a clean-up settles: from is its
// state before, chain the chain of its count, dropped the shared chains
// only its other tiers used.
type settledPlain struct {
	name    model.ServicePortName
	from    *plainApplied
	chain   string
	dropped []objRef
}

// plainPortState is the shared chains and tiers of plain ports as applied.
type plainPortState struct {
	// sharedUsers counts, per shared chain (cluster/PROTO/N), the plain
	// service ports whose elements send packets to it: a chain nobody
	// uses any more is stale.
	sharedUsers map[objRef]int
	// settle lists the plain service ports with elements in tiers above
	// 0, since their first change: a clean-up at least staleDelay later
	// folds them into tier 0 (see plainApplied).
	settle map[model.ServicePortName]time.Time
}

func newPlainPortState() plainPortState {
	return plainPortState{sharedUsers: map[objRef]int{}, settle: map[model.ServicePortName]time.Time{}}
}

// plainPortPlan is how a plan changes plainPortState: sharedUsers and
// settle are changes to its maps (users 0 and a zero time remove);
// settled are the plain service ports the clean-up settles.
type plainPortPlan struct {
	sharedUsers map[objRef]int
	settle      map[model.ServicePortName]time.Time
	settled     []settledPlain
}

func (p *plainPortPlan) commit(a *plainPortState) {
	for c, n := range p.sharedUsers {
		if n == 0 {
			delete(a.sharedUsers, c)
		} else {
			a.sharedUsers[c] = n
		}
	}
	for n, t := range p.settle {
		if t.IsZero() {
			delete(a.settle, n)
		} else if _, ok := a.settle[n]; !ok {
			a.settle[n] = t
		}
	}
}

// commitCleanup records the settled ports: their state is what the tier
// in use held, in tier 0, and shared chains only their other tiers used
// lose a user (stale from now when nobody is left).
func (p *plainPortPlan) commitCleanup(a *Applied, now time.Time) {
	for _, st := range p.settled {
		s := a.services[st.name]
		if s == nil || s.plain != st.from {
			continue // cannot happen: Commit ran first, with the plan settle was rendered from
		}
		s.plain = &plainApplied{svc: st.from.svc, port: st.from.port}
		s.plain.tiers[0] = st.from.effective()
		// The service port's mapClusterServices element now has the
		// effective count's verdict: the bookkeeping must say so, or
		// the next render would see a change to make.
		for _, e := range s.elems {
			if e.key.set == mapClusterServices {
				ne := *e.elem
				ne.Verdict = &nft.Verdict{Kind: nft.Goto, Chain: st.chain}
				e.elem = &ne
			}
		}
		delete(a.plainPorts.settle, st.name)
		for _, c := range st.dropped {
			a.plainPorts.sharedUsers[c]--
			if a.plainPorts.sharedUsers[c] <= 0 {
				delete(a.plainPorts.sharedUsers, c)
				if _, ok := a.stale.objs[c]; !ok {
					a.stale.objs[c] = staleObj{since: now}
				}
			}
		}
	}
}

// settlePlain moves plain ports whose first change is at least
// staleDelay old back into tier 0 (see plainApplied), in the clean-up
// transaction: tier 0 becomes what the tier in use holds, the higher
// tiers lose the port. Ports this very sync changed are settled too: the
// clean-up runs after their change is live.
func (r *renderer) settlePlain(tx *nft.Transaction) {
	var names []model.ServicePortName
	for n, since := range r.last.plainPorts.settle {
		if r.in.Now.Sub(since) >= staleDelay {
			names = append(names, n)
		}
	}
	slices.SortFunc(names, model.ServicePortName.Compare)
	for _, n := range names {
		s, changed := r.plan.services[n]
		if !changed {
			s = r.last.services[n]
		}
		if s == nil || s.plain == nil || s.plain.top() == 0 {
			if _, ok := r.plan.plainPorts.settle[n]; !ok {
				r.plan.plainPorts.settle[n] = time.Time{} // nothing to settle (any more)
			}
			continue
		}
		p, proto := s.plain, n.Protocol
		w := tx.In(s.table)
		eff := p.effective()
		chain := sharedChainName(proto, eff.n())
		st := settledPlain{name: n, from: p, chain: chain}
		if p.tiers[0].n() != eff.n() {
			key := []nft.Value{{Addr: p.svc}, {Proto: proto}, {Port: p.port}}
			w.Delete(&nft.Element{Set: mapClusterServices, Key: key})
			w.Add(&nft.Element{Set: mapClusterServices, Key: key, Verdict: &nft.Verdict{Kind: nft.Goto, Chain: chain}, Comment: portComment(n)})
		}
		writePlainKeys(w, proto, 0, p, p.tiers[0], eff)
		for t := 1; t < plainTiers; t++ {
			if p.tiers[t] != nil {
				w.Delete(tierElem(n, p, t, nil))
				writePlainKeys(w, proto, t, p, p.tiers[t], nil)
			}
		}
		keep := objRef{s.table, chain}
		for _, c := range sharedRefs(s.table, proto, p) {
			if c != keep {
				st.dropped = append(st.dropped, c)
			}
		}
		r.plan.plainPorts.settled = append(r.plan.plainPorts.settled, st)
	}
}

func (s *svcApplied) plainOrNil() *plainApplied {
	if s == nil {
		return nil
	}
	return s.plain
}

// plainService reports whether a service port is "plain": ClusterIP only
// (no node port, external IP or load balancer address), no session
// affinity, internal traffic policy Cluster, with endpoints to send
// ClusterIP traffic to. Such a port has no chain of its own: an element
// of mapClusterServices sends its packets to the chain its protocol and
// endpoint count share with other ports (cluster/PROTO/N, see
// sharedRules), which picks among N keys of the port's address and port
// in the protocol's endpoint map. Every nf_tables commit walks every
// chain of the netns, so chains are what a small change costs at 50k
// services; an endpoint change of a plain port is element operations
// only.
//
// A port whose cluster IP another service claims too (bad input), or
// whose address and port another port holds in the plain maps, keeps the
// chain layout, so that no two ports ever want one key of the plain maps.
func (r *renderer) plainService(sp *model.ServicePort, sel model.Selection) bool {
	if sp.ExternallyAccessible() || sp.SessionAffinity() || sp.InternalPolicyLocal || !sel.HasAny || len(sel.Cluster) == 0 {
		return false
	}
	for _, o := range r.ownersOf(elemKey{set: setClusterIPs, key: sp.ClusterIP.String()}) {
		if o.owner.NamespacedName != sp.Name.NamespacedName {
			return false
		}
	}
	// Nor may another port of the same service hold the address, protocol
	// and port (a port renamed, or two swapping their numbers, in one
	// sync): their keys in the plain maps would be the same.
	key := appendKey(nil, []nft.Value{{Addr: sp.ClusterIP}, {Proto: sp.Protocol}, {Port: uint16(sp.Port)}})
	for _, o := range r.ownersOf(elemKey{set: mapClusterServices, key: string(key)}) {
		if o.owner != sp.Name {
			return false
		}
	}
	return true
}

// sharedRules are the rules of the chain shared by plain service ports
// of a protocol with n endpoints: the masquerade mark of a per-service
// chain without its address and port match (only the port's ClusterIP
// traffic comes here), and the endpoint choice, in the endpoint map of
// the highest tier first (see plainApplied): a tier that lacks the port's
// keys fails its rule and the next one decides. A key missing from every
// tier (never written) leaves the packet undiverted.
func (r *renderer) sharedRules(chain string, proto v1.Protocol, n int) []*nft.Rule {
	masq := nft.SetMarkOr{Mask: r.cfg.markMask()}
	var rules []*nft.Rule
	if r.cfg.MasqueradeAll {
		rules = append(rules, r.rule(chain, masq))
	} else if r.cfg.LocalDetector.Implemented() {
		rules = append(rules, r.rule(chain, append(slices.Clone(r.cfg.LocalDetector.IfNotLocal), masq)...))
	}
	for t := plainTiers - 1; t >= 0; t-- {
		rules = append(rules, r.rule(chain, nft.DNATByService{Proto: proto, Mod: uint32(n), Map: clusterEndpointsMap(proto, t)}))
	}
	return rules
}

// declareShared makes sure the shared chain of a count exists with its
// rules: created when no plain port used it, rewritten in a full sync,
// revived when stale (its rules written again if a clean-up or a full
// sync flushed it).
func (r *renderer) declareShared(table string, proto v1.Protocol, n int) objRef {
	ref := objRef{table, sharedChainName(proto, n)}
	if r.sharedDeclared.Has(ref) {
		return ref
	}
	r.sharedDeclared.Insert(ref)
	w := r.tx.In(table)
	ch := &nft.Chain{Name: ref.name}
	stale := r.isStale(ref)
	if stale {
		r.plan.stale.objs[ref] = nil
	}
	switch {
	case r.in.Full:
		w.Add(ch)
		if r.existing[table].Has(ref.name) {
			w.Flush(ch)
		}
		w.AddRules(r.sharedRules(ref.name, proto, n)...)
	case stale:
		// Its rules depend on the configuration alone (a change of
		// which means a full sync): intact unless a clean-up emptied it.
		if r.last.stale.flushed.Has(ref) {
			w.AddRules(r.sharedRules(ref.name, proto, n)...)
		}
	case r.sharedUsersOf(ref) == 0:
		w.Add(ch)
		w.AddRules(r.sharedRules(ref.name, proto, n)...)
	}
	return ref
}

func (r *renderer) sharedUsersOf(ref objRef) int {
	if u, ok := r.plan.plainPorts.sharedUsers[ref]; ok {
		return u
	}
	if r.in.Full {
		return 0
	}
	return r.last.plainPorts.sharedUsers[ref]
}

// sharedRefs are the shared chains a plain port's elements send to.
func sharedRefs(table string, proto v1.Protocol, p *plainApplied) []objRef {
	var out []objRef
	if p == nil {
		return nil
	}
	for _, side := range p.tiers {
		if side.n() == 0 {
			continue
		}
		ref := objRef{table, sharedChainName(proto, side.n())}
		if !slices.Contains(out, ref) {
			out = append(out, ref)
		}
	}
	return out
}

// useShared counts a plain port's change of shared chains; a chain nobody
// uses any more becomes stale.
func (r *renderer) useShared(old, cur []objRef) {
	for _, c := range cur {
		if !slices.Contains(old, c) {
			r.plan.plainPorts.sharedUsers[c] = r.sharedUsersOf(c) + 1
			// Made stale earlier in this render by another port's
			// change: used again.
			if r.isStale(c) {
				r.plan.stale.objs[c] = nil
			}
		}
	}
	for _, c := range old {
		if !slices.Contains(cur, c) {
			u := r.sharedUsersOf(c) - 1
			r.plan.plainPorts.sharedUsers[c] = u
			if u <= 0 {
				r.plan.plainPorts.sharedUsers[c] = 0
				r.markStale(c, false, nil)
			}
		}
	}
}

// writePlainKeys turns the keys a plain port has in an endpoint map from
// from to to: only keys whose endpoint changes are deleted and added.
func writePlainKeys(w nft.TableOps, proto v1.Protocol, tier int, p *plainApplied, from, to *plainSide) {
	m := clusterEndpointsMap(proto, tier)
	key := []nft.Value{{Addr: p.svc}, {Port: p.port}}
	for i := range max(from.n(), to.n()) {
		var a, b netip.AddrPort
		if i < from.n() {
			a = from.to[i]
		}
		if i < to.n() {
			b = to.to[i]
		}
		if a == b {
			continue
		}
		if a.IsValid() {
			w.Delete(&nft.Element{Set: m, Key: key, Index: uint32(i), To: a})
		}
		if b.IsValid() {
			w.Add(&nft.Element{Set: m, Key: key, Index: uint32(i), To: b})
		}
	}
}

// tierElem is a plain port's element in the verdict map of a tier above
// 0 (tier 0's is an owned element, see describe); side nil: the key only.
func tierElem(n model.ServicePortName, p *plainApplied, tier int, side *plainSide) *nft.Element {
	e := &nft.Element{Set: clusterServicesMap(tier), Key: []nft.Value{{Addr: p.svc}, {Proto: n.Protocol}, {Port: p.port}}, Comment: portComment(n)}
	if side != nil {
		e.Verdict = &nft.Verdict{Kind: nft.Goto, Chain: sharedChainName(n.Protocol, side.n())}
	}
	return e
}

// renderPlain writes what changes of a port's plain elements: old as
// applied (nil: none, or a full sync), want as rendered (nil: not plain).
// The port's mapClusterServices element is an owned element (describe).
func (r *renderer) renderPlain(n model.ServicePortName, sp *model.ServicePort, table string, old *plainApplied, want *plainSide) *plainApplied {
	if old == nil && want == nil {
		return nil
	}
	w := r.tx.In(table)
	proto := sp.Protocol
	var pa *plainApplied
	if want != nil {
		pa = r.newPlainApplied()
		*pa = plainApplied{svc: sp.ClusterIP, port: uint16(sp.Port)}
	}
	if old != nil && (pa == nil || old.svc != pa.svc || old.port != pa.port) {
		// No longer plain, or another key: its elements go now (the
		// service's other elements change too; this sync deletes anyway).
		r.dropPlain(n, table, proto, old)
		old = nil
	}
	if pa == nil {
		return nil
	}
	var refsOld []objRef
	switch top := 0; {
	case old == nil:
		r.declareShared(table, proto, want.n())
		writePlainKeys(w, proto, 0, pa, nil, want)
		pa.tiers[0] = want
	case old.effective().equal(want):
		pa.tiers = old.tiers
		return pa
	case old.top() < plainTiers-1:
		// Adds only: the tier above overrides the others.
		top = old.top() + 1
		refsOld = sharedRefs(table, proto, old)
		r.declareShared(table, proto, want.n())
		pa.tiers = old.tiers
		pa.tiers[top] = want
		w.Add(tierElem(n, pa, top, want))
		writePlainKeys(w, proto, top, pa, nil, want)
		r.plan.plainPorts.settle[n] = r.in.Now // kept only if the port has no earlier change to settle
	default:
		// Out of tiers before the clean-up: in place, which deletes.
		top = old.top()
		refsOld = sharedRefs(table, proto, old)
		r.declareShared(table, proto, want.n())
		pa.tiers = old.tiers
		pa.tiers[top] = want
		if old.tiers[top].n() != want.n() {
			w.Delete(tierElem(n, pa, top, nil))
			w.Add(tierElem(n, pa, top, want))
		}
		writePlainKeys(w, proto, top, pa, old.tiers[top], want)
	}
	r.useShared(refsOld, sharedRefs(table, proto, pa))
	return pa
}

// dropPlain deletes a plain port's keys and its elements of tiers above 0 (its
// mapClusterServices element is released as an owned element).
func (r *renderer) dropPlain(n model.ServicePortName, table string, proto v1.Protocol, old *plainApplied) {
	w := r.tx.In(table)
	for t, side := range old.tiers {
		if side == nil {
			continue
		}
		if t > 0 {
			w.Delete(tierElem(n, old, t, nil))
		}
		writePlainKeys(w, proto, t, old, side, nil)
	}
	if old.top() > 0 {
		r.plan.plainPorts.settle[n] = time.Time{}
	}
	r.useShared(sharedRefs(table, proto, old), nil)
}
