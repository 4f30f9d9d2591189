package nftables

import (
	"maps"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy/udpflows"
)

func (r *renderer) renderFull() {
	main := r.cfg.table()
	existing := func(t string) *Objects {
		if o, ok := r.in.Existing[t]; ok {
			return &o
		}
		return nil
	}
	r.writeFixed(r.tx.In(main), r.mainLayout(), existing(main))
	// Shard tables beyond the shard count go, in this same transaction:
	// their services are added to their new shards below, so no
	// connection sees a moment without its service.
	for _, t := range slices.Sorted(maps.Keys(r.in.Existing)) {
		if i, ok := ShardIndex(main, t); ok && i >= r.shards {
			r.tx.In(t).Delete(&nft.Table{})
		}
	}
	shard := r.shardLayout()
	for i := range r.shards {
		t := r.cfg.shardTable(i)
		r.writeFixed(r.tx.In(t), shard, existing(t))
		// Every endpoint map is emptied, used or not: keys are numbered
		// afresh, and a map unused now (stale) may be used again by a
		// partial sync before it is deleted.
		if o := existing(t); o != nil {
			for _, name := range slices.Sorted(slices.Values(o.Sets)) {
				if p := endpointMapProto(name); p != "" {
					m := &nft.Set{Name: name, Endpoints: p}
					r.tx.In(t).Add(m)
					r.tx.In(t).Flush(m)
					r.declared.Insert(objRef{t, name})
				}
			}
		}
	}

	names := r.in.State.SortedNames()
	// UDP services gone since the last sync lose their flows as in a
	// partial sync.
	var gone []model.ServicePortName
	for n, old := range r.last.services {
		if _, ok := r.in.State.Services[n]; !ok && n.Protocol == model.UDP && len(old.reachable) > 0 {
			gone = append(gone, n)
		}
	}
	slices.SortFunc(gone, model.ServicePortName.Compare)
	for _, n := range gone {
		old := r.last.services[n]
		r.plan.StaleUDP = append(r.plan.StaleUDP, udpflows.Stale{Service: old.sp, Endpoints: old.flows})
	}
	active := make(sets.Set[objRef], len(names))
	for _, n := range names {
		s := r.renderService(n, nil)
		active.Insert(s.chains...)
		active.Insert(s.sets...)
	}
	for m := range r.plan.epMaps.next {
		active.Insert(m)
	}
	for c, u := range r.plan.plainPorts.sharedUsers {
		if u > 0 {
			active.Insert(c)
		}
	}
	// Shared chains only the superseded side of changed plain ports
	// still used (see plainApplied) have been garbage since the change:
	// their stale delay counts from then. (Referenced by the elements
	// this transaction flushes; deleted by a later transaction.)
	garbage := map[objRef]time.Time{}
	if !r.in.Takeover {
		inUse := sets.New[objRef]()
		for n, s := range r.last.services {
			if p := s.plain; p != nil {
				inUse.Insert(objRef{s.table, sharedChainName(n.Protocol, p.effective().n())})
			}
		}
		for n, s := range r.last.services {
			if s.plain == nil || s.plain.top() == 0 {
				continue
			}
			for _, ref := range sharedRefs(s.table, n.Protocol, s.plain) {
				if since, ok := r.last.plainPorts.settle[n]; ok && !inUse.Has(ref) && since.After(garbage[ref]) {
					garbage[ref] = since
				}
			}
		}
	}
	// kept reports whether a table is there after this transaction.
	kept := func(t string) bool {
		if t == main {
			return true
		}
		i, ok := ShardIndex(main, t)
		return ok && i < r.shards
	}
	// Anything of ours in the kernel that no service uses any more (left by
	// a previous run, by a failed sync, or moved to another shard) becomes
	// stale.
	for _, t := range slices.Sorted(maps.Keys(r.in.Existing)) {
		if !kept(t) {
			continue
		}
		for _, c := range r.in.Existing[t].Chains {
			if ref := (objRef{t, c}); isOurs(c) && !active.Has(ref) {
				// Emptied now, in a transaction that deletes anyway: nothing
				// live refers to it after this full sync. A service that
				// uses it again before the clean-up must not find old rules
				// under its own (they would keep using sets marked stale
				// here with no owner to wait for: randomized IPv6 seed
				// 372), and a shared chain used again gets its rules back
				// (staleFlushed), also after a restart (seed 347).
				r.tx.In(t).Flush(&nft.Chain{Name: c})
				r.plan.stale.flushedInSync = append(r.plan.stale.flushedInSync, ref)
				r.markStale(ref, false, nil)
				if since, ok := garbage[ref]; ok && r.plan.stale.objs[ref] != nil {
					r.plan.stale.objs[ref].since = since
				}
			}
		}
		for _, s := range r.in.Existing[t].Sets {
			if ref := (objRef{t, s}); isOurs(s) && !active.Has(ref) {
				r.markStale(ref, true, nil)
			}
		}
	}
	for ref, st := range r.last.stale.objs {
		if active.Has(ref) {
			r.plan.stale.objs[ref] = nil
		} else if _, marked := r.plan.stale.objs[ref]; !marked {
			// Known stale from before but not listed (already gone), or in
			// a table this transaction deletes.
			o, ok := r.in.Existing[ref.table]
			if !kept(ref.table) || !ok || (!slices.Contains(o.Chains, ref.name) && !slices.Contains(o.Sets, ref.name)) {
				r.plan.stale.objs[ref] = nil
			} else {
				s := st
				r.plan.stale.objs[ref] = &s
			}
		}
	}
	r.flushElements()
	r.flushEndpointKeys()
}

func (r *renderer) renderPartial() {
	names := r.in.Changed.UnsortedList()
	slices.SortFunc(names, model.ServicePortName.Compare)
	for _, n := range names {
		old := r.last.services[n]
		if _, ok := r.in.State.Services[n]; !ok {
			r.removeService(n, old)
			continue
		}
		r.renderService(n, old)
	}
	r.flushElements()
	r.flushEndpointKeys()
	r.renderPartialCleanup()
}

// renderPartialCleanup writes a partial sync's clean-up transaction for
// what earlier partial syncs left behind at least staleDelay ago: chains
// with shadowed rules are flushed and written again, hairpin pairs nobody
// wants are deleted. Stale chains and sets wait for the same delay (see
// renderStale). It costs one RCU grace period, off the path of the change
// that caused it.
func (r *renderer) renderPartialCleanup() {
	tx := nft.NewTransaction(r.cfg.family(), r.cfg.table())
	var names []model.ServicePortName
	for n, since := range r.last.rewrite {
		if r.in.Now.Sub(since) >= staleDelay && !r.in.Changed.Has(n) {
			names = append(names, n)
		}
	}
	slices.SortFunc(names, model.ServicePortName.Compare)
	for _, n := range names {
		sp, ok := r.in.State.Services[n]
		applied := r.last.services[n]
		if ok && applied != nil {
			sel := model.SelectEndpoints(sp, r.in.State.Endpoints[n], r.in.NodeName, r.in.Zone)
			s := r.describe(sp, sel, applied.table, applied)
			for _, c := range s.chains {
				w := tx.In(c.table)
				ch := &nft.Chain{Name: c.name}
				w.Add(ch)
				w.Flush(ch)
				w.AddRules(c.rules...)
			}
		}
		r.plan.rewritten = append(r.plan.rewritten, n)
	}
	var keys []elemKey
	for k, g := range r.last.hairpin.garbage {
		// Not if this sync's own transaction wants the pair again.
		if r.in.Now.Sub(g.since) >= staleDelay && r.hairpinCount(g.elem.Key[0].Addr) <= 0 {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, func(a, b elemKey) int { return strings.Compare(a.key, b.key) })
	for _, k := range keys {
		g := r.last.hairpin.garbage[k]
		tx.In(g.table).Delete(g.elem)
		r.plan.hairpin.collected = append(r.plan.hairpin.collected, k)
	}
	// Endpoint map keys, before any stale map is deleted below.
	for _, g := range r.last.epMaps.garbage {
		if r.in.Now.Sub(g.since) < staleDelay {
			break // the rest became garbage later
		}
		w := tx.In(g.m.table)
		for i, to := range g.to {
			w.Delete(&nft.Element{Set: g.m.name, Index: g.off + uint32(i), To: to})
		}
		r.plan.epMaps.collected++
	}
	r.settlePlain(tx)
	r.renderStaleInto(tx)
	if tx.Len() > 0 || len(r.plan.rewritten) > 0 || len(r.plan.hairpin.collected) > 0 || r.plan.epMaps.collected > 0 || len(r.plan.plainPorts.settled) > 0 {
		r.plan.Cleanup = tx
	}
}

func (r *renderer) removeService(n model.ServicePortName, old *svcApplied) {
	r.plan.services[n] = nil
	if old == nil {
		return
	}
	for _, e := range old.elems {
		r.releaseElem(e)
	}
	r.useHairpin(old.reachable, nil)
	for _, c := range old.chains {
		r.markStale(c, false, &n)
	}
	for _, s := range old.sets {
		r.markStale(s, true, &n)
	}
	if old.plain != nil {
		r.dropPlain(n, old.table, old.sp.Protocol, old.plain)
	}
	r.useMaps(n, old.eps, nil)
	for _, e := range old.eps {
		r.plan.epMaps.garbage = append(r.plan.epMaps.garbage, epGarbage{epRange: e, since: r.in.Now})
	}
	if n.Protocol == model.UDP && len(old.flows) > 0 {
		r.plan.StaleUDP = append(r.plan.StaleUDP, udpflows.Stale{Service: old.sp, Endpoints: old.flows})
	}
}
