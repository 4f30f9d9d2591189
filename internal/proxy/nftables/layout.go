package nftables

import (
	"net/netip"
	"slices"

	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/model"
)

func (r *renderer) addrType() nft.DataType { return nft.AddrType(r.cfg.family()) }

// mainSets are the sets and maps of the main table.
func (r *renderer) mainSets() []*nft.Set {
	a := r.addrType()
	svcKey := []nft.DataType{a, nft.TypeInetProto, nft.TypeInetService}
	npKey := []nft.DataType{nft.TypeInetProto, nft.TypeInetService}
	return []*nft.Set{
		{Name: setClusterIPs, Key: []nft.DataType{a}, Comment: clusterIPsComment},
		{Name: setNodePortIPs, Key: []nft.DataType{a}, Comment: nodePortIPsComment},
		{Name: mapNoEndpointServices, Key: svcKey, Data: nft.TypeVerdict, Comment: noEndpointServicesComent},
		{Name: mapNoEndpointNodePorts, Key: npKey, Data: nft.TypeVerdict, Comment: noEndpointNodePortsComnt},
		{Name: mapFirewallIPs, Key: svcKey, Data: nft.TypeVerdict, Comment: firewallIPsComment},
	}
}

// shardSets are the sets and maps of every shard table: its services'
// verdict maps, its share of the hairpin pairs, and its own copy of the
// NodePort addresses (a rule can only use sets of its table).
func (r *renderer) shardSets() []*nft.Set {
	a := r.addrType()
	svcKey := []nft.DataType{a, nft.TypeInetProto, nft.TypeInetService}
	npKey := []nft.DataType{nft.TypeInetProto, nft.TypeInetService}
	out := []*nft.Set{
		{Name: setNodePortIPs, Key: []nft.DataType{a}, Comment: nodePortIPsComment},
		{Name: mapServiceIPs, Key: svcKey, Data: nft.TypeVerdict, Comment: serviceIPsComment},
		{Name: mapServiceNodePorts, Key: npKey, Data: nft.TypeVerdict, Comment: serviceNodePortsComment},
		{Name: setHairpin, Key: []nft.DataType{a, a}, Comment: hairpinComment},
	}
	for t := range plainTiers {
		comment := clusterServicesComment
		if t > 0 {
			comment = "the same, changed since the last clean-up: looked up before " + clusterServicesMap(t-1)
		}
		out = append(out, &nft.Set{Name: clusterServicesMap(t), Key: svcKey, Data: nft.TypeVerdict, Comment: comment})
	}
	for t := range plainTiers {
		for _, p := range plainProtocols {
			out = append(out, &nft.Set{Name: clusterEndpointsMap(p, t), Endpoints: p, ByService: true})
		}
	}
	return out
}

// shardSet reports whether a per-service element belongs in the
// service's shard table rather than the main table.
func shardSet(set string) bool {
	return set == mapServiceIPs || set == mapServiceNodePorts || set == mapClusterServices
}

var (
	ctNew   = nft.MatchCtStateNew{}
	svcKeys = []nft.Field{nft.FieldDaddr, nft.FieldL4Proto, nft.FieldDport}
	npKeys  = []nft.Field{nft.FieldL4Proto, nft.FieldDport}
)

func jump(c string) nft.Verdict  { return nft.Verdict{Kind: nft.Jump, Chain: c} }
func gotoC(c string) nft.Verdict { return nft.Verdict{Kind: nft.Goto, Chain: c} }

func (r *renderer) rule(chain string, stmts ...nft.Stmt) *nft.Rule {
	return &nft.Rule{Chain: chain, Stmts: stmts}
}

// nodePortMatch selects packets addressed to a NodePort address.
func (r *renderer) nodePortMatch() []nft.Stmt {
	if r.cfg.NodePortAllLocal {
		// Never NodePorts on loopback in nftables mode (upstream excludes
		// 127.0.0.0/8 and ::1): a connection DNATed away from a loopback
		// source cannot be routed back.
		loopback := netip.MustParsePrefix("127.0.0.0/8")
		if r.cfg.Family == model.IPv6 {
			loopback = netip.MustParsePrefix("::1/128")
		}
		return []nft.Stmt{nft.MatchFibLocal{}, nft.MatchAddr{Negate: true, Prefixes: []netip.Prefix{loopback}}}
	}
	return []nft.Stmt{nft.MatchAddr{Set: setNodePortIPs}}
}

// mainRules are the rules of the main table's fixed chains.
func (r *renderer) mainRules() map[string][]*nft.Rule {
	mask := r.cfg.markMask()
	rules := map[string][]*nft.Rule{
		chainFilterPreroutingPreDNAT: {r.rule(chainFilterPreroutingPreDNAT, ctNew, jump(chainFirewallCheck))},
		chainFilterOutputPreDNAT:     {r.rule(chainFilterOutputPreDNAT, ctNew, jump(chainFirewallCheck))},
		chainFilterInput: {
			r.rule(chainFilterInput, ctNew, jump(chainNodePortEndpointsCheck)),
			r.rule(chainFilterInput, ctNew, jump(chainServiceEndpointsCheck)),
		},
		chainFilterForward: {
			r.rule(chainFilterForward, ctNew, jump(chainServiceEndpointsCheck)),
			r.rule(chainFilterForward, ctNew, jump(chainClusterIPsCheck)),
		},
		chainFilterOutput: {
			r.rule(chainFilterOutput, ctNew, jump(chainServiceEndpointsCheck)),
			r.rule(chainFilterOutput, ctNew, jump(chainClusterIPsCheck)),
		},
		chainNATPostrouting: {r.rule(chainNATPostrouting, jump(chainMasquerading))},
		chainMasquerading: {
			// Hairpin traffic has been marked by the shards'
			// nat-postrouting chains (see setHairpin).
			r.rule(chainMasquerading, nft.MatchMarkZero{Mask: mask}, nft.Verdict{Kind: nft.Return}),
			// Clear the mark so that a packet re-entering the stack (e.g.
			// through a tunnel) is not masqueraded twice.
			r.rule(chainMasquerading, nft.SetMarkXor{Mask: mask}),
			r.rule(chainMasquerading, nft.Masquerade{}),
		},
		chainFirewallCheck: {r.rule(chainFirewallCheck, nft.VmapLookup{Fields: svcKeys, Map: mapFirewallIPs})},
		chainServiceEndpointsCheck: {
			r.rule(chainServiceEndpointsCheck, nft.VmapLookup{Fields: svcKeys, Map: mapNoEndpointServices}),
		},
		chainNodePortEndpointsCheck: {
			r.rule(chainNodePortEndpointsCheck, append(r.nodePortMatch(), nft.VmapLookup{Fields: npKeys, Map: mapNoEndpointNodePorts})...),
		},
		chainReject: {r.rule(chainReject, nft.Reject{})},
	}
	cip := []*nft.Rule{{Chain: chainClusterIPsCheck, Stmts: []nft.Stmt{nft.MatchAddr{Set: setClusterIPs}, nft.Reject{}},
		Comment: "Reject traffic to invalid ports of ClusterIPs"}}
	if len(r.cfg.ServiceCIDRs) > 0 {
		cip = append(cip, &nft.Rule{Chain: chainClusterIPsCheck, Stmts: []nft.Stmt{nft.MatchAddr{Prefixes: r.cfg.ServiceCIDRs}, nft.Verdict{Kind: nft.Drop}},
			Comment: "Drop traffic to unallocated ClusterIPs"})
	}
	rules[chainClusterIPsCheck] = cip
	return rules
}

// shardRules are the rules of a shard table's fixed chains.
func (r *renderer) shardRules() map[string][]*nft.Rule {
	// Plain service ports first, the tiers of changed ones before the
	// others (see plainApplied).
	var services []*nft.Rule
	for t := plainTiers - 1; t >= 0; t-- {
		services = append(services, r.rule(chainServices, nft.VmapLookup{Fields: svcKeys, Map: clusterServicesMap(t)}))
	}
	return map[string][]*nft.Rule{
		chainNATPrerouting: {r.rule(chainNATPrerouting, jump(chainServices))},
		chainNATOutput:     {r.rule(chainNATOutput, jump(chainServices))},
		// Hairpin traffic: mark it like any other traffic to masquerade,
		// before the main table's nat-postrouting reads the mark.
		chainNATPostrouting: {r.rule(chainNATPostrouting,
			nft.MatchInSet{Fields: []nft.Field{nft.FieldSaddr, nft.FieldDaddr}, Set: setHairpin}, nft.SetMarkOr{Mask: r.cfg.markMask()})},
		chainServices: append(services,
			r.rule(chainServices, nft.VmapLookup{Fields: svcKeys, Map: mapServiceIPs}),
			r.rule(chainServices, append(r.nodePortMatch(), nft.VmapLookup{Fields: npKeys, Map: mapServiceNodePorts})...),
		),
	}
}

// mainChainOrder and shardChainOrder list the regular fixed chains of
// each kind of table, chains that others jump to first.
var (
	mainChainOrder = []string{
		chainReject, chainMasquerading, chainFirewallCheck, chainServiceEndpointsCheck,
		chainNodePortEndpointsCheck, chainClusterIPsCheck,
	}
	shardChainOrder = []string{chainServices}
)

// tableLayout is what a full sync writes into one table besides services.
type tableLayout struct {
	comment string
	sets    []*nft.Set
	chains  []string
	base    []baseChain
	rules   map[string][]*nft.Rule
}

// writeFixed adds (and flushes) a table's fixed sets and chains and writes
// their rules and the NodePort addresses. existing is nil for a table
// that does not exist yet.
func (r *renderer) writeFixed(w nft.TableOps, l tableLayout, existing *Objects) {
	w.Add(&nft.Table{Family: r.cfg.family(), Name: w.Name(), Comment: l.comment})
	if r.in.Takeover && existing != nil {
		r.takeOver(w, l, existing)
	}
	// Sets and maps are flushed and refilled: after a failure or at start
	// we cannot trust that what we think is there is there.
	for _, s := range l.sets {
		w.Add(s)
		w.Flush(s)
	}
	for _, name := range l.chains {
		c := &nft.Chain{Name: name}
		w.Add(c)
		w.Flush(c)
	}
	for _, b := range l.base {
		c := &nft.Chain{Name: b.name, Type: b.typ, Hook: b.hook, Priority: b.priority}
		w.Add(c)
		w.Flush(c)
	}
	// Rules after all chains exist: the kernel refuses a jump to a chain
	// that is not there yet.
	for _, name := range l.chains {
		w.AddRules(l.rules[name]...)
	}
	for _, b := range l.base {
		w.AddRules(l.rules[b.name]...)
	}
	for _, ip := range r.cfg.NodePortIPs {
		w.Add(&nft.Element{Set: setNodePortIPs, Key: []nft.Value{{Addr: ip}}})
	}
}

func (r *renderer) mainLayout() tableLayout {
	return tableLayout{comment: tableComment, sets: r.mainSets(), chains: mainChainOrder, base: mainBaseChains, rules: r.mainRules()}
}

func (r *renderer) shardLayout() tableLayout {
	return tableLayout{comment: shardComment, sets: r.shardSets(), chains: shardChainOrder, base: shardBaseChains, rules: r.shardRules()}
}

// takeOver clears what another layout may have left in a table: flush
// every chain (so no rule references anything), then delete base chains
// and unknown chains and sets. Known regular chains stay: per-service
// chains of the old table may still reference them until they are
// rewritten or made stale.
func (r *renderer) takeOver(w nft.TableOps, l tableLayout, existing *Objects) {
	known := sets.New(l.chains...)
	base := sets.New[string]()
	for _, b := range l.base {
		base.Insert(b.name)
	}
	for _, b := range mainBaseChains {
		base.Insert(b.name)
	}
	for _, b := range shardBaseChains {
		base.Insert(b.name)
	}
	knownSets := sets.New[string]()
	for _, s := range l.sets {
		knownSets.Insert(s.Name)
	}
	chains := slices.Sorted(slices.Values(existing.Chains))
	for _, c := range chains {
		w.Flush(&nft.Chain{Name: c})
	}
	for _, c := range chains {
		if base.Has(c) || (!known.Has(c) && !isOurs(c)) {
			w.Delete(&nft.Chain{Name: c})
			if e := r.existing[w.Name()]; e != nil {
				e.Delete(c)
			}
		}
	}
	for _, s := range slices.Sorted(slices.Values(existing.Sets)) {
		if !knownSets.Has(s) && !isOurs(s) {
			w.Delete(&nft.Set{Name: s})
		}
	}
}
