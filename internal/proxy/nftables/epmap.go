package nftables

import (
	"cmp"
	"net/netip"
	"slices"
	"time"

	"k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/model"
)

type epGarbage struct {
	epRange
	since time.Time
}

// endpointMapState is the endpoint maps as applied.
type endpointMapState struct {
	// next is, per endpoint map in the kernel, the first key no
	// service port has had: a partial sync gives a changed policy chain
	// fresh keys from there (its old keys become garbage, deleted by a
	// clean-up like hairpin pairs); a full sync numbers from 0 again.
	next map[objRef]uint32
	// users counts, per endpoint map, the service ports whose policy
	// chains use it: a map no service port uses any more is stale.
	users map[objRef]int
	// garbage are key ranges no rule draws any more (in the order
	// they became garbage), deleted by a later clean-up. Endpoint map
	// elements are not in Applied.owners: the allocator gives every key
	// one owner, and 100k more owned elements made a 10k full sync's
	// render 60 % slower.
	garbage []epGarbage
}

func newEndpointMapState() endpointMapState {
	return endpointMapState{next: map[objRef]uint32{}, users: map[objRef]int{}}
}

// endpointMapPlan is how a plan changes endpointMapState: next and users
// are the new values of the maps it changed (users 0 removes), adds the
// key ranges its Tx adds, garbage the ranges it leaves to a clean-up,
// collected how many of endpointMapState.garbage its clean-up deletes.
type endpointMapPlan struct {
	next      map[objRef]uint32
	users     map[objRef]int
	adds      []epRange
	garbage   []epGarbage
	collected int
}

func (p *endpointMapPlan) commit(a *endpointMapState) {
	for m, next := range p.next {
		a.next[m] = next
	}
	a.garbage = append(a.garbage, p.garbage...)
	for m, n := range p.users {
		if n == 0 {
			delete(a.users, m)
		} else {
			a.users[m] = n
		}
	}
}

func (p *endpointMapPlan) commitCleanup(a *endpointMapState) {
	a.garbage = a.garbage[p.collected:]
}

// epRange is the keys off ... off+len(to)-1 of endpoint map m, which a
// policy chain's "dnat to numgen random mod N offset off map" rule uses.
type epRange struct {
	chain string
	m     objRef
	off   uint32
	to    []netip.AddrPort
}

// endpointDispatch writes the endpoint choice of a policy chain. Unlike
// upstream there are no per-endpoint chains: each rule DNATs directly. The
// kernel validates every chain of the table on each commit that adds a
// jump or a NAT rule, so ten chains per service made partial syncs cost
// the size of the cluster ~3x over; the hairpin check moved to postrouting
// (see setHairpin) and the affinity update into the DNAT rule.
func (r *renderer) endpointDispatch(s *serviceRender, sp *model.ServicePort, chain string, eps []*model.Endpoint, affinity map[*model.Endpoint]string) {
	// dnat ends a rule: each rule's statements get one slice of the exact
	// size (match, affinity update, DNAT).
	dnat := func(e *model.Endpoint, match nft.Stmt) {
		k := 1
		if match != nil {
			k++
		}
		if sp.SessionAffinity() {
			k++
		}
		stmts := take(&s.stmtBuf, k, 16)[:0]
		if match != nil {
			stmts = append(stmts, match)
		}
		if sp.SessionAffinity() {
			stmts = append(stmts, nft.UpdateSaddr{Set: affinity[e]})
		}
		s.addRule(chain, "", append(stmts, nft.DNAT{Proto: sp.Protocol, To: e.AddrPort()}))
	}
	if sp.SessionAffinity() {
		for _, e := range eps {
			dnat(e, nft.MatchAddr{Source: true, Set: affinity[e]})
		}
	}
	n := len(eps)
	if !sp.SessionAffinity() && n > 1 {
		r.endpointMapDispatch(s, sp, chain, eps)
		return
	}
	// With session affinity (whose rules are per endpoint anyway): one
	// rule per endpoint, each taking 1/(remaining) of what reaches it:
	// endpoint i is chosen with probability 1/N. Not upstream's inline
	// numgen vmap: each of those is an anonymous set, which makes the
	// kernel's validation of a large table quadratic (see nft.MatchNumgen).
	for i, e := range eps {
		if i == n-1 {
			dnat(e, nil)
			continue
		}
		dnat(e, r.numgenStmt(uint32(n-i)))
	}
}

// endpointMapDispatch writes a policy chain's endpoint choice as one rule,
// "dnat to numgen random mod N offset O map @endpoints-…", over the keys
// O … O+N-1 of its group's endpoint map. Measured at 10k services × 10
// endpoints: the kernel's share of a full sync is per expression parsed
// (~7 per endpoint rule, 5 per map rule) and the map elements cost less.
func (r *renderer) endpointMapDispatch(s *serviceRender, sp *model.ServicePort, chain string, eps []*model.Endpoint) {
	m := objRef{s.table, endpointMapName(sp.Name)}
	to := make([]netip.AddrPort, len(eps))
	for i, e := range eps {
		to[i] = e.AddrPort()
	}
	off := r.endpointKeys(s.prev, chain, m, to)
	s.eps = append(s.eps, epRange{chain: chain, m: m, off: off, to: to})
	stmts := take(&s.stmtBuf, 1, 16)
	stmts[0] = nft.DNATMap{Proto: sp.Protocol, Mod: uint32(len(to)), Offset: off, Map: m.name}
	s.addRule(chain, "", stmts)
}

// flushEndpointKeys adds the elements of the new key ranges, map by map
// (one netlink message per map).
func (r *renderer) flushEndpointKeys() {
	adds := r.plan.epMaps.adds
	slices.SortFunc(adds, func(a, b epRange) int {
		return cmp.Or(compareRefs(a.m, b.m), cmp.Compare(a.off, b.off))
	})
	n := 0
	for _, e := range adds {
		n += len(e.to)
	}
	r.tx.Ops = slices.Grow(r.tx.Ops, n)
	elems := make([]nft.Element, n)
	for _, e := range adds {
		in := e.m.table
		if in == r.tx.Table {
			in = ""
		}
		for i, to := range e.to {
			el := &elems[0]
			elems = elems[1:]
			*el = nft.Element{Set: e.m.name, Index: e.off + uint32(i), To: to}
			r.tx.Ops = append(r.tx.Ops, nft.Op{Kind: nft.OpAdd, In: in, Element: el})
		}
	}
}

// endpointKeys returns the first key of a policy chain's endpoints in m:
// the keys it had if its endpoints are the same as applied, else fresh
// ones after every key m has had since the last full sync.
func (r *renderer) endpointKeys(prev *svcApplied, chain string, m objRef, to []netip.AddrPort) uint32 {
	if prev != nil {
		for _, e := range prev.eps {
			if e.chain == chain && e.m == m && slices.Equal(e.to, to) {
				return e.off
			}
		}
	}
	next, ok := r.plan.epMaps.next[m]
	if !ok && !r.in.Full {
		next = r.last.epMaps.next[m]
	}
	r.plan.epMaps.next[m] = next + uint32(len(to))
	return next
}

// declareMap adds an endpoint map the transaction uses unless it exists:
// known to the applied state, or declared already by this transaction.
func (r *renderer) declareMap(m objRef, proto v1.Protocol) {
	if r.declared.Has(m) {
		return
	}
	r.declared.Insert(m)
	_, known := r.last.epMaps.next[m]
	stale := r.isStale(m)
	if stale {
		r.plan.stale.objs[m] = nil
	}
	if r.in.Full || !known || stale {
		r.tx.In(m.table).Add(&nft.Set{Name: m.name, Endpoints: proto})
	}
	if _, ok := r.plan.epMaps.next[m]; !ok {
		// A map is known from now on even if it has no keys.
		next := uint32(0)
		if !r.in.Full {
			next = r.last.epMaps.next[m]
		}
		r.plan.epMaps.next[m] = next
	}
}

func (s *svcApplied) epsOrNil() []epRange {
	if s == nil {
		return nil
	}
	return s.eps
}

// useMaps counts a service port's change of endpoint maps, from the maps
// of old to those of cur: a map nobody uses any more becomes stale (n's
// shadowed rules may still use it: it waits for n's rewrite).
func (r *renderer) useMaps(n model.ServicePortName, old, cur []epRange) {
	has := func(rs []epRange, m objRef) bool {
		return slices.ContainsFunc(rs, func(e epRange) bool { return e.m == m })
	}
	users := func(m objRef) int {
		if u, ok := r.plan.epMaps.users[m]; ok {
			return u
		}
		if r.in.Full {
			return 0
		}
		return r.last.epMaps.users[m]
	}
	for i, e := range cur {
		if !has(cur[:i], e.m) && !has(old, e.m) {
			r.plan.epMaps.users[e.m] = users(e.m) + 1
		}
	}
	for i, e := range old {
		if !has(old[:i], e.m) && !has(cur, e.m) {
			u := users(e.m) - 1
			r.plan.epMaps.users[e.m] = u
			if u == 0 {
				r.markStale(e.m, true, &n)
			}
		}
	}
}
