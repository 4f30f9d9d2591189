package nftables

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"

	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/model"
)

// A repair re-creates tables of ours that another program changed (drift,
// see drift.go) from what Applied says the kernel held, in one
// transaction that touches those tables only. A full sync rewrites every
// shard; at 10k services that was 2-3 s for one deleted table, most of
// it the kernel's commit of objects nobody had touched.
//
// The unit is the table: whatever was changed in it (the table itself, a
// chain, a map, rules, elements), the transaction deletes it if it is
// still there and writes it again whole, so no object of another layout
// or of the other program stays, and nothing needs to be known of what
// exactly went. A table holds no reference to another, so the others
// stay as they are. What a repair loses is what only the kernel knew:
// the session affinity sets' entries of the repaired table's services
// (clients may land on another endpoint once) and the counters.
//
// The elements, endpoint map keys and plain ports' tiers are Applied's own
// data. Rules are not kept: the chains of a service port are described
// again from the state, which for a service port the sync has not seen
// change is the state they were written from; describe is checked to
// give the chains, sets and endpoint keys Applied has. Anything else
// (a changed service port with chains in a damaged table, a table that
// is not one of ours, nothing applied yet) is errRepairUncertain, and the
// caller syncs in full.

// errRepairUncertain: a repair cannot be sure to restore what the kernel
// held; the caller falls back to a full sync.
var errRepairUncertain = errors.New("cannot repair from the applied state")

// RenderRepair returns the plan that re-creates tables (ours, changed by
// another program) as last applied. exists says which of them are in
// the kernel now (they are deleted first). in supplies State, Changed,
// NodeName, Zone and Now; in.Full must be false. Like Render it is pure.
// The plan's Commit only drops stale objects that went with a table.
func RenderRepair(cfg *Config, in *Input, tables []string, exists map[string]bool, last *Applied) (*Plan, error) {
	if in.Full {
		return nil, fmt.Errorf("%w: a full sync repairs everything", errRepairUncertain)
	}
	if last.shards == 0 {
		return nil, fmt.Errorf("%w: nothing applied yet", errRepairUncertain)
	}
	r := &renderer{
		cfg:            cfg,
		in:             in,
		last:           last,
		tx:             nft.NewTransaction(cfg.family(), cfg.table()),
		plan:           newPlan(false, in.Now),
		declared:       sets.New[objRef](),
		sharedDeclared: sets.New[objRef](),
		before:         map[elemKey]*ownedElem{},
		existing:       map[string]sets.Set[string]{},
		shards:         last.shards,
	}
	defer func() { r.shardNames = nil }()
	r.plan.Tx = r.tx
	main := cfg.table()
	damaged := sets.New[string]()
	for _, t := range tables {
		if i, ok := ShardIndex(main, t); t != main && (!ok || i >= last.shards) {
			return nil, fmt.Errorf("%w: table %s is not one kproxy keeps", errRepairUncertain, t)
		}
		damaged.Insert(t)
	}
	if err := r.renderRepair(damaged, exists); err != nil {
		return nil, err
	}
	return r.plan, nil
}

func (r *renderer) renderRepair(damaged sets.Set[string], exists map[string]bool) error {
	main := r.cfg.table()
	order := sets.List(damaged)
	// The fixed layout first, then the endpoint maps: per-service rules
	// refer to both.
	for _, t := range order {
		w := r.tx.In(t)
		if exists[t] {
			w.Delete(&nft.Table{})
		}
		if t == main {
			r.writeFixed(w, r.mainLayout(), nil)
		} else {
			r.writeFixed(w, r.shardLayout(), nil)
		}
	}
	for _, m := range slices.SortedFunc(maps.Keys(r.last.epMaps.next), compareRefs) {
		if damaged.Has(m.table) {
			r.tx.In(m.table).Add(&nft.Set{Name: m.name, Endpoints: endpointMapProto(m.name)})
		}
	}
	// Stale objects went with their table, except endpoint maps, written
	// again above (their garbage keys are restored below, for the
	// clean-up to delete).
	for ref := range r.last.stale.objs {
		if _, isMap := r.last.epMaps.next[ref]; damaged.Has(ref.table) && !isMap {
			r.plan.stale.objs[ref] = nil
		}
	}

	names := slices.SortedFunc(maps.Keys(r.last.services), model.ServicePortName.Compare)
	// Chains and their rules, then the shared chains of plain ports,
	// then every element (verdicts go to those chains).
	for _, n := range names {
		if err := r.repairChains(n, r.last.services[n], damaged); err != nil {
			return err
		}
	}
	type sharedChain struct {
		proto v1.Protocol
		n     int
	}
	shared := map[objRef]sharedChain{}
	for _, n := range names {
		s := r.last.services[n]
		if s.plain == nil || !damaged.Has(s.table) {
			continue
		}
		for _, side := range s.plain.tiers {
			if side.n() > 0 {
				shared[objRef{s.table, sharedChainName(n.Protocol, side.n())}] = sharedChain{n.Protocol, side.n()}
			}
		}
		for _, ref := range sharedRefs(s.table, n.Protocol, s.plain) {
			if _, ok := r.last.plainPorts.sharedUsers[ref]; !ok {
				return fmt.Errorf("%w: shared chain %s/%s has no users", errRepairUncertain, ref.table, ref.name)
			}
		}
	}
	for _, ref := range slices.SortedFunc(maps.Keys(shared), compareRefs) {
		w := r.tx.In(ref.table)
		w.Add(&nft.Chain{Name: ref.name})
		w.AddRules(r.sharedRules(ref.name, shared[ref].proto, shared[ref].n)...)
	}
	for ref, u := range r.last.plainPorts.sharedUsers {
		if _, ok := shared[ref]; u > 0 && !ok && damaged.Has(ref.table) {
			return fmt.Errorf("%w: shared chain %s/%s is used by no plain port", errRepairUncertain, ref.table, ref.name)
		}
	}

	byKey := func(a, b elemKey) int { return cmp.Or(strings.Compare(a.set, b.set), strings.Compare(a.key, b.key)) }
	for _, k := range slices.SortedFunc(maps.Keys(r.last.owners), byKey) {
		// The first owner's value is what the kernel held.
		if o := r.last.owners[k]; len(o) > 0 && damaged.Has(o[0].table) {
			r.tx.In(o[0].table).Add(o[0].elem)
		}
	}
	for _, n := range names {
		s := r.last.services[n]
		for _, e := range s.eps {
			if damaged.Has(e.m.table) {
				r.plan.epMaps.adds = append(r.plan.epMaps.adds, e)
			}
		}
		if p := s.plain; p != nil && damaged.Has(s.table) {
			w := r.tx.In(s.table)
			for t, side := range p.tiers {
				if side == nil {
					continue
				}
				if t > 0 {
					w.Add(tierElem(n, p, t, side))
				}
				writePlainKeys(w, n.Protocol, t, p, nil, side)
			}
		}
	}
	for _, g := range r.last.epMaps.garbage {
		if damaged.Has(g.m.table) {
			r.plan.epMaps.adds = append(r.plan.epMaps.adds, g.epRange)
		}
	}
	r.flushEndpointKeys()
	r.plan.epMaps.adds = nil // restored, not new: Commit changes no key range
	// Hairpin pairs: those of the damaged shards (hairpinShard), and the
	// garbage pairs still there for the clean-up to delete.
	var pairs []netip.Addr
	for ip, c := range r.last.hairpin.counts {
		if c > 0 && damaged.Has(r.hairpinTable(ip)) {
			pairs = append(pairs, ip)
		}
	}
	// By table, so that each table's pairs go in one message.
	slices.SortFunc(pairs, func(a, b netip.Addr) int {
		return cmp.Or(cmp.Compare(hairpinShard(a, r.shards), hairpinShard(b, r.shards)), a.Compare(b))
	})
	for _, ip := range pairs {
		r.tx.In(r.hairpinTable(ip)).Add(&nft.Element{Set: setHairpin, Key: []nft.Value{{Addr: ip}, {Addr: ip}}})
	}
	for _, k := range slices.SortedFunc(maps.Keys(r.last.hairpin.garbage), byKey) {
		// A pair counted again is written above.
		if g := r.last.hairpin.garbage[k]; damaged.Has(g.table) && r.last.hairpin.counts[g.elem.Key[0].Addr] <= 0 {
			r.tx.In(g.table).Add(g.elem)
		}
	}
	if len(r.plan.epMaps.next) > 0 {
		return fmt.Errorf("%w: endpoint keys of the applied state were not found again", errRepairUncertain)
	}
	return nil
}

// repairChains writes the chains and sets service port n has in a
// damaged table, with their rules, described from the state.
func (r *renderer) repairChains(n model.ServicePortName, s *svcApplied, damaged sets.Set[string]) error {
	needs := slices.ContainsFunc(s.chains, func(c objRef) bool { return damaged.Has(c.table) }) ||
		slices.ContainsFunc(s.sets, func(c objRef) bool { return damaged.Has(c.table) })
	if !needs {
		return nil
	}
	sp := r.in.State.Services[n]
	if sp == nil || r.in.Changed.Has(n) {
		return fmt.Errorf("%w: %s changed since its chains were written", errRepairUncertain, n)
	}
	sel := model.SelectEndpoints(sp, r.in.State.Endpoints[n], r.in.NodeName, r.in.Zone)
	d := r.describe(sp, sel, s.table, s)
	same := len(d.chains) == len(s.chains) && len(d.sets) == len(s.sets) && len(d.eps) == len(s.eps)
	for i := 0; same && i < len(d.chains); i++ {
		same = s.chains[i] == objRef{d.chains[i].table, d.chains[i].name}
	}
	for i := 0; same && i < len(d.sets); i++ {
		same = s.sets[i] == objRef{s.table, d.sets[i].Name}
	}
	for i := 0; same && i < len(d.eps); i++ {
		same = d.eps[i].m == s.eps[i].m && d.eps[i].off == s.eps[i].off && slices.Equal(d.eps[i].to, s.eps[i].to)
	}
	if !same {
		return fmt.Errorf("%w: %s is not described as applied", errRepairUncertain, n)
	}
	for _, set := range d.sets {
		if damaged.Has(s.table) {
			r.tx.In(s.table).Add(set)
		}
	}
	for _, c := range d.chains {
		if damaged.Has(c.table) {
			r.tx.In(c.table).Add(&nft.Chain{Name: c.name})
		}
	}
	for _, c := range d.chains {
		if damaged.Has(c.table) {
			r.tx.In(c.table).AddRules(c.rules...)
		}
	}
	return nil
}
