package nftables

import (
	"net/netip"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy/tally"
	"github.com/kproxy/kproxy/internal/proxy/udpflows"
)

// serviceRender collects one service port's desired objects.
//
// Elements, key values, rules and statements are carved out of a few
// chunks per service port (see take) instead of being allocated one by
// one: a full sync of 50k services has millions of them, and the
// allocations and the GC work they cause were most of its cost. They live
// as long as the service port's svcApplied anyway.
type serviceRender struct {
	name model.ServicePortName
	// table is the service port's shard table, main the main table.
	table, main string
	// comment is portComment(name), the comment of every element.
	comment string
	elems   []*ownedElem
	// chains in the order they are created (one to four of them).
	chains []chainRules
	sets   []*nft.Set

	elemBuf []ownedElement
	valBuf  []nft.Value
	ruleBuf []nft.Rule
	stmtBuf []nft.Stmt
	// elemChunk and valChunk are the sizes of new chunks of elemBuf and
	// valBuf (large when lent by a full sync's slabs).
	elemChunk, valChunk int
	// reuseKeys is the key text of the port as applied; keyString the
	// text finishKeys cut the keys from.
	reuseKeys, keyString string
	// keyText holds the elements' key texts, keyEnds where each ends,
	// until finishKeys (buffers lent by the renderer).
	keyText []byte
	keyEnds []int
	// prev is the service port as applied (see describe), eps the key
	// ranges its policy chains use.
	prev *svcApplied
	eps  []epRange
	// plain is the endpoints of a plain service port (see plainService).
	plain *plainSide
}

// newServiceRender sizes the chunks for what describe writes for sp: a
// close guess, since every item guessed but not used is memory allocated
// for nothing; take adds a chunk when short.
func (r *renderer) newServiceRender(sp *model.ServicePort, sel model.Selection) *serviceRender {
	ext := len(sp.ExternalIPs) + len(sp.LoadBalancerIngress)
	eps := len(sel.Cluster) + len(sel.Local)
	// Cluster IP (1 + 3 values), up to three map elements per external
	// address and two per NodePort.
	elems := 2 + 3*ext
	vals := 4 + 9*ext
	// One rule per endpoint and chain (numgen + DNAT) with session
	// affinity, else one per chain (the endpoint map rule); the
	// masquerade rule, the external chain's and the firewall's.
	dispatch := eps
	if !sp.SessionAffinity() {
		dispatch = min(eps, 2)
	}
	rules := 1 + dispatch
	stmts := 5 + 2*dispatch
	if sp.NodePort != 0 {
		elems, vals = elems+2, vals+4
	}
	if ext > 0 || sp.NodePort != 0 {
		rules, stmts = rules+5, stmts+14
	}
	if sp.SessionAffinity() {
		rules, stmts = rules+eps, stmts+4*eps
	}
	s := &serviceRender{
		name:      sp.Name,
		ruleBuf:   make([]nft.Rule, 0, rules),
		stmtBuf:   make([]nft.Stmt, 0, stmts),
		elemChunk: 4,
		valChunk:  8,
	}
	// The comment (the port's name) and key text of what was applied, to
	// use again where they are the same: a full sync then makes no new
	// strings for unchanged ports.
	if last := r.last.services[sp.Name]; last != nil && len(last.elems) > 0 {
		s.comment, s.reuseKeys = last.elems[0].elem.Comment, last.keyText
	} else {
		s.comment = portComment(sp.Name)
	}
	if r.slab != nil {
		// Lent by the slabs, given back by describe.
		s.elems = take(&r.slab.ptrs, elems, 4*r.slab.chunk)[:0]
		s.elemBuf, s.valBuf = r.slab.elems, r.slab.vals
		s.elemChunk, s.valChunk = r.slab.chunk, 4*r.slab.chunk
	} else {
		s.elems = make([]*ownedElem, 0, elems)
		s.elemBuf = make([]ownedElement, 0, elems)
		s.valBuf = make([]nft.Value, 0, vals)
	}
	return s
}

type chainRules struct {
	name, table string
	rules       []*nft.Rule
}

// ownedElement is an ownedElem and its element in one allocation.
type ownedElement struct {
	ownedElem
	e nft.Element
}

func (s *serviceRender) elem(set string, verdict *nft.Verdict, key ...nft.Value) {
	k := take(&s.valBuf, len(key), s.valChunk)
	copy(k, key)
	o := &take(&s.elemBuf, 1, s.elemChunk)[0]
	table := s.main
	if shardSet(set) {
		table = s.table
	}
	*o = ownedElement{
		ownedElem: ownedElem{owner: s.name, key: elemKey{set: set}, table: table},
		e:         nft.Element{Set: set, Key: k, Verdict: verdict, Comment: s.comment},
	}
	o.elem = &o.e
	s.elems = append(s.elems, &o.ownedElem)
	s.keyText = appendKey(s.keyText, key)
	s.keyEnds = append(s.keyEnds, len(s.keyText))
}

// finishKeys gives every element its key text: all of them are cut from
// one string, one allocation per service port instead of one per element.
func (s *serviceRender) finishKeys() {
	text := s.reuseKeys
	if text != string(s.keyText) {
		text = string(s.keyText)
	}
	s.keyString = text
	start := 0
	for i, e := range s.elems {
		e.key.key = text[start:s.keyEnds[i]]
		start = s.keyEnds[i]
	}
}

// chain returns the index of a chain in s.chains, adding it if new.
func (s *serviceRender) chain(name string) int {
	for i := range s.chains {
		if s.chains[i].name == name {
			return i
		}
	}
	// Firewall chains are reached from the main table's firewall-ips map;
	// all other per-service chains from the shard's maps.
	table := s.table
	if strings.HasPrefix(name, prefixFirewallChain) {
		table = s.main
	}
	s.chains = append(s.chains, chainRules{name: name, table: table})
	return len(s.chains) - 1
}

func (s *serviceRender) rule(chain string, comment string, stmts ...nft.Stmt) {
	st := take(&s.stmtBuf, len(stmts), 16)
	copy(st, stmts)
	s.addRule(chain, comment, st)
}

// addRule adds a rule whose statements are already the service's own.
func (s *serviceRender) addRule(chain string, comment string, stmts []nft.Stmt) {
	rule := &take(&s.ruleBuf, 1, 8)[0]
	*rule = nft.Rule{Chain: chain, Stmts: stmts, Comment: comment}
	c := &s.chains[s.chain(chain)]
	c.rules = append(c.rules, rule)
}

// renderService renders one service port and emits what differs from old
// (nil: render everything). It returns what will be applied.
func (r *renderer) renderService(n model.ServicePortName, old *svcApplied) *svcApplied {
	sp := r.in.State.Services[n]
	eps := r.in.State.Endpoints[n]
	sel := model.SelectEndpoints(sp, eps, r.in.NodeName, r.in.Zone)
	var table string
	if old != nil && !r.in.Full {
		table = old.table
	} else {
		table = r.shardTable(ShardOf(n, r.shards))
	}
	prev := old
	if r.in.Full {
		prev = nil
	}
	s := r.describe(sp, sel, table, prev)

	applied := r.newApplied()
	*applied = svcApplied{sp: sp, table: table, chains: make([]objRef, 0, len(s.chains)), elems: s.elems, reachable: sel.AllReachable, eps: s.eps, keyText: s.keyString}
	if sp.Protocol == model.UDP {
		applied.flows = udpflows.Kept(sel.AllReachable, eps)
	}
	// Hairpin: a pod reaching itself through its service must be
	// masqueraded or it would answer itself directly. After DNAT such a
	// packet has equal source and destination; postrouting marks it
	// through the hairpin set of "ep . ep" pairs, one per reachable
	// endpoint address of any service port.
	var wasReachable []*model.Endpoint
	if prev != nil {
		wasReachable = prev.reachable
	}
	r.useHairpin(wasReachable, sel.AllReachable)
	applied.plain = r.renderPlain(n, sp, table, prev.plainOrNil(), s.plain)
	for i := range s.eps {
		r.declareMap(s.eps[i].m, sp.Protocol)
	}
	r.useMaps(n, prev.epsOrNil(), s.eps)
	// Key ranges: new ones are added, those of prev no longer drawn are
	// garbage (deleting them now would cost this sync an RCU grace
	// period).
	sameRange := func(a, b epRange) bool { return a.m == b.m && a.off == b.off }
	for _, e := range s.eps {
		if !slices.ContainsFunc(prev.epsOrNil(), func(p epRange) bool { return sameRange(p, e) }) {
			r.plan.epMaps.adds = append(r.plan.epMaps.adds, e)
		}
	}
	for _, p := range prev.epsOrNil() {
		if !slices.ContainsFunc(s.eps, func(e epRange) bool { return sameRange(p, e) }) {
			r.plan.epMaps.garbage = append(r.plan.epMaps.garbage, epGarbage{epRange: p, since: r.in.Now})
		}
	}
	applied.stats = tally.Of(sp, sel)

	// Sets before chains (rules reference them), chains before rules
	// (rules jump between them), rules, then elements (they goto chains).
	for _, set := range s.sets {
		ref := objRef{table, set.Name}
		applied.sets = append(applied.sets, ref)
		if old == nil || !slices.Contains(old.sets, ref) || r.isStale(ref) {
			r.tx.In(table).Add(set)
		}
		if r.isStale(ref) {
			r.plan.stale.objs[ref] = nil
		}
	}
	type pending struct {
		w      nft.TableOps
		name   string
		rules  []*nft.Rule
		insert bool
	}
	writes := make([]pending, 0, 4) // on the stack: one to four chains
	for _, cr := range s.chains {
		c := objRef{cr.table, cr.name}
		w := r.tx.In(cr.table)
		applied.chains = append(applied.chains, c)
		stale := r.isStale(c)
		if stale {
			r.plan.stale.objs[c] = nil
		}
		existed := old != nil && slices.Contains(old.chains, c)
		ch := &nft.Chain{Name: c.name}
		if existed && !stale && !r.in.Full && c.table != table && sameFirewall(old.sp, sp) {
			// The firewall chain (the only one in the main table) depends
			// on the source ranges and VIPs alone: an endpoint change leaves
			// it as it is, so that the commit does not touch (and the kernel
			// not validate) the main table's chains.
			continue
		}
		switch {
		case r.in.Full:
			w.Add(ch)
			if r.existing[c.table].Has(c.name) {
				w.Flush(ch)
			}
			writes = append(writes, pending{w, c.name, cr.rules, false})
		case existed || stale:
			// A live chain is rewritten without deleting anything: every
			// transaction that deletes a rule, element or chain waits for
			// an RCU grace period (~15 ms here, more under load). The new
			// rules go to the head of the chain, ending in "return" (the
			// same as falling off a chain reached by goto), and shadow the
			// old ones until the next full sync flushes them.
			writes = append(writes, pending{w, c.name, cr.rules, true})
			r.plan.rewrite[n] = r.in.Now
		default:
			w.Add(ch)
			writes = append(writes, pending{w, c.name, cr.rules, false})
		}
	}
	for _, w := range writes {
		if !w.insert {
			w.w.AddRules(w.rules...)
			continue
		}
		w.w.Insert(&nft.Rule{Chain: w.name, Stmts: []nft.Stmt{nft.Verdict{Kind: nft.Return}}})
		for i := len(w.rules) - 1; i >= 0; i-- {
			w.w.Insert(w.rules[i])
		}
	}
	if old != nil {
		for _, c := range old.chains {
			if !slices.Contains(applied.chains, c) {
				r.markStale(c, false, &n)
			}
		}
		for _, set := range old.sets {
			if !slices.Contains(applied.sets, set) {
				r.markStale(set, true, &n)
			}
		}
		wanted := sets.New[elemKey]()
		for _, e := range s.elems {
			wanted.Insert(e.key)
		}
		for _, e := range old.elems {
			if !wanted.Has(e.key) {
				r.releaseElem(e)
			}
		}
	}
	if n.Protocol == model.UDP {
		prev, known := old, true
		if r.in.Full {
			// A full sync renders every service from scratch, but the
			// changes it picks up (periodic sync, retry after a failure)
			// need the same cleanup as in a partial sync. Only after a
			// restart is there nothing to compare with.
			prev, known = r.last.services[n], len(r.last.services) > 0
		}
		if known {
			r.udpChanges(sp, prev, sel, r.in.State.Endpoints[n])
		}
	}
	for _, e := range s.elems {
		r.claimElem(e)
	}
	r.plan.services[n] = applied
	return applied
}

// sameFirewall reports whether two versions of a service port have the
// same firewall chain rules (see describe).
func sameFirewall(a, b *model.ServicePort) bool {
	return slices.Equal(a.LoadBalancerSourceRanges, b.LoadBalancerSourceRanges) && a.LoadBalancerClosed == b.LoadBalancerClosed &&
		slices.Equal(a.LoadBalancerVIPs(), b.LoadBalancerVIPs())
}

// udpChanges notes the conntrack work of a UDP service port: endpoints
// it lost, or its first endpoints (prev nil: new to the kernel). As
// upstream's conntrack cleanup, flows to an endpoint that still serves
// (a terminating one included) are kept even when new traffic no longer
// goes there.
func (r *renderer) udpChanges(sp *model.ServicePort, prev *svcApplied, sel model.Selection, eps []*model.Endpoint) {
	if prev == nil {
		if len(sel.AllReachable) > 0 {
			r.plan.NewlyServedUDP = append(r.plan.NewlyServedUDP, sp)
		}
		return
	}
	if removed := udpflows.Removed(prev.flows, eps); len(removed) > 0 {
		r.plan.StaleUDP = append(r.plan.StaleUDP, udpflows.Stale{Service: prev.sp, Endpoints: removed})
	}
	if len(prev.reachable) == 0 && len(sel.AllReachable) > 0 {
		r.plan.NewlyServedUDP = append(r.plan.NewlyServedUDP, sp)
	}
}

// describe decides a service port's chains, rules and elements, following
// upstream's nftables proxier so that behaviour matches it exactly.
//
// prev is what was applied for the service port (nil in full syncs): a
// policy chain whose endpoints are the same keeps its endpoint map keys.
func (r *renderer) describe(sp *model.ServicePort, sel model.Selection, table string, prev *svcApplied) *serviceRender {
	n := sp.Name
	s := r.newServiceRender(sp, sel)
	s.prev = prev
	s.table, s.main = table, r.cfg.table()
	s.keyText, s.keyEnds = r.keyText[:0], r.keyEnds[:0]
	proto := sp.Protocol
	port := uint16(sp.Port)
	ipProto := nft.Value{Proto: proto}
	svcPort := nft.Value{Port: port}

	// Only the chains a service port can use are named (most are
	// ClusterIP-only with policy Cluster: one chain).
	names := newPortNames(n)
	externallyAccessible := sp.ExternallyAccessible()
	clusterChain := names.chain(prefixServiceChain)
	var localChain, externalChain, firewallChain string
	if sp.InternalPolicyLocal || sp.ExternalPolicyLocal {
		localChain = names.chain(prefixLocalChain)
	}
	if externallyAccessible {
		externalChain = names.chain(prefixExternalChain)
	}

	hasEndpoints := sel.HasAny
	usesCluster := len(sel.Cluster) > 0 && sp.UsesClusterEndpoints()
	usesLocal := len(sel.Local) > 0 && sp.UsesLocalEndpoints()

	internalChain, hasInternal := clusterChain, hasEndpoints
	if sp.InternalPolicyLocal {
		internalChain = localChain
		hasInternal = hasInternal && len(sel.Local) > 0
	}
	externalPolicyChain, hasExternal := clusterChain, hasEndpoints
	if sp.ExternalPolicyLocal {
		externalPolicyChain = localChain
		hasExternal = hasExternal && len(sel.Local) > 0
	}
	usesExternalChain := hasEndpoints && externallyAccessible
	plain := r.plainService(sp, sel)
	if plain {
		s.plain = r.newPlainSide(len(sel.Cluster))
		for i, e := range sel.Cluster {
			s.plain.to[i] = e.AddrPort()
		}
		usesCluster = false // no chain of its own
	}

	// Verdicts are shared by the elements of this service port: nothing
	// changes an element's verdict once rendered.
	rejectV := &nft.Verdict{Kind: nft.Goto, Chain: chainReject}
	dropV := &nft.Verdict{Kind: nft.Drop}
	var toExternal *nft.Verdict
	if externallyAccessible {
		toExternal = &nft.Verdict{Kind: nft.Goto, Chain: externalChain}
	}
	var internalFilter, externalFilter *nft.Verdict
	if !hasEndpoints {
		internalFilter, externalFilter = rejectV, rejectV
	} else {
		if !hasInternal {
			internalFilter = dropV
		}
		if !hasExternal {
			externalFilter = dropV
		}
	}

	// Endpoint chains exist first so that policy chains can goto them.
	if usesCluster {
		s.chain(clusterChain)
	}
	if usesLocal {
		s.chain(localChain)
	}
	if usesExternalChain {
		s.chain(externalChain)
	}

	s.elem(setClusterIPs, nil, nft.Value{Addr: sp.ClusterIP})
	if plain {
		// The count mapClusterServices holds for it: a partial sync
		// leaves that element alone (see plainApplied).
		n := len(s.plain.to)
		if pp := prev.plainOrNil(); pp != nil && pp.svc == sp.ClusterIP && pp.port == port {
			n = pp.tiers[0].n()
		}
		s.elem(mapClusterServices, &nft.Verdict{Kind: nft.Goto, Chain: sharedChainName(proto, n)}, nft.Value{Addr: sp.ClusterIP}, ipProto, svcPort)
	} else if hasInternal {
		s.elem(mapServiceIPs, &nft.Verdict{Kind: nft.Goto, Chain: internalChain}, nft.Value{Addr: sp.ClusterIP}, ipProto, svcPort)
	} else {
		s.elem(mapNoEndpointServices, internalFilter, nft.Value{Addr: sp.ClusterIP}, ipProto, svcPort)
	}
	for _, ip := range sp.ExternalIPs {
		if hasEndpoints {
			s.elem(mapServiceIPs, toExternal, nft.Value{Addr: ip}, ipProto, svcPort)
		}
		if !hasExternal {
			s.elem(mapNoEndpointServices, externalFilter, nft.Value{Addr: ip}, ipProto, svcPort)
		}
	}

	vips := sp.LoadBalancerVIPs()
	usesFirewall := sp.UsesLoadBalancerFirewall()
	if usesFirewall {
		firewallChain = names.chain(prefixFirewallChain)
		sources := slices.Clone(sp.LoadBalancerSourceRanges)
		// A node reaching its own LB VIP (often a local address) loops
		// back with the VIP as source: allow that when the node itself is
		// inside the ranges.
		allowNode := false
		for _, p := range sp.LoadBalancerSourceRanges {
			for _, ip := range r.cfg.NodeIPs {
				if p.Contains(ip) {
					allowNode = true
				}
			}
		}
		if allowNode {
			for _, ip := range vips {
				sources = append(sources, netip.PrefixFrom(ip, ip.BitLen()))
			}
		}
		if len(sources) == 0 {
			// Source ranges of the other family only: closed to every
			// client of this one (LoadBalancerClosed).
			s.rule(firewallChain, "", nft.Verdict{Kind: nft.Drop})
		} else {
			s.rule(firewallChain, "", nft.MatchAddr{Source: true, Negate: true, Prefixes: sources}, nft.Verdict{Kind: nft.Drop})
		}
	}
	for _, ip := range vips {
		if hasEndpoints {
			s.elem(mapServiceIPs, toExternal, nft.Value{Addr: ip}, ipProto, svcPort)
		}
		if usesFirewall {
			s.elem(mapFirewallIPs, &nft.Verdict{Kind: nft.Goto, Chain: firewallChain}, nft.Value{Addr: ip}, ipProto, svcPort)
		}
		if !hasExternal {
			s.elem(mapNoEndpointServices, externalFilter, nft.Value{Addr: ip}, ipProto, svcPort)
		}
	}
	if sp.NodePort != 0 {
		np := nft.Value{Port: uint16(sp.NodePort)}
		if hasEndpoints {
			// NodePorts are not subject to loadBalancerSourceRanges.
			s.elem(mapServiceNodePorts, toExternal, ipProto, np)
		}
		if !hasExternal {
			s.elem(mapNoEndpointNodePorts, externalFilter, ipProto, np)
		}
	}

	// Marked inline: the mark is set in the shard table and tested in
	// the main table's postrouting (a jump cannot cross tables).
	masq := nft.SetMarkOr{Mask: r.cfg.markMask()}
	if hasInternal && !plain {
		dst := []nft.Stmt{nft.MatchAddr{Prefixes: []netip.Prefix{netip.PrefixFrom(sp.ClusterIP, sp.ClusterIP.BitLen())}}, nft.MatchDport{Proto: proto, Port: port}}
		if r.cfg.MasqueradeAll {
			s.rule(internalChain, "", append(dst, masq)...)
		} else if r.cfg.LocalDetector.Implemented() {
			// Off-cluster traffic to a cluster IP (a static route to the
			// service range via some node) may leave the node again.
			stmts := append(slices.Clone(dst), r.cfg.LocalDetector.IfNotLocal...)
			s.rule(internalChain, "", append(stmts, masq)...)
		}
	}
	if usesExternalChain {
		if !sp.ExternalPolicyLocal {
			// Endpoints may be on other nodes: masquerade to get replies back.
			s.rule(externalChain, "", masq)
		} else {
			if r.cfg.LocalDetector.Implemented() {
				// Pod traffic to an external destination is treated as if
				// it went out to the LB and came back: policy Cluster.
				s.rule(externalChain, "short-circuit pod traffic", append(slices.Clone(r.cfg.LocalDetector.IfLocal), gotoC(clusterChain))...)
			}
			s.rule(externalChain, "masquerade local traffic", nft.MatchFibLocal{Source: true}, masq)
			s.rule(externalChain, "short-circuit local traffic", nft.MatchFibLocal{Source: true}, gotoC(clusterChain))
		}
		if hasExternal {
			s.rule(externalChain, "", gotoC(externalPolicyChain))
		}
	}
	// affinity names each reachable endpoint's affinity set (Cluster and
	// Local are subsets of AllReachable), hashed once per endpoint.
	var affinity map[*model.Endpoint]string
	if sp.SessionAffinity() {
		affinity = make(map[*model.Endpoint]string, len(sel.AllReachable))
		key := []nft.DataType{r.addrType()}
		for _, e := range sel.AllReachable {
			name := affinitySetName(n, e, sp.StickyMaxAgeSeconds)
			affinity[e] = name
			s.sets = append(s.sets, &nft.Set{
				Name:    name,
				Key:     key,
				Dynamic: true,
				Timeout: time.Duration(sp.StickyMaxAgeSeconds) * time.Second,
			})
		}
	}
	if usesCluster {
		r.endpointDispatch(s, sp, clusterChain, sel.Cluster, affinity)
	}
	if usesLocal {
		r.endpointDispatch(s, sp, localChain, sel.Local, affinity)
	}
	// Hairpin pairs (setHairpin) are counted per address by
	// renderService (useHairpin), not owned.
	s.finishKeys()
	// The buffers serve the next service port.
	r.keyText, r.keyEnds = s.keyText, s.keyEnds
	s.keyText, s.keyEnds = nil, nil
	if r.slab != nil {
		r.slab.elems, r.slab.vals = s.elemBuf, s.valBuf
	}
	return s
}
