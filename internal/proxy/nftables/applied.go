package nftables

import (
	"net/netip"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/model"
)

// Applied is what the last successful sync left in the kernel. Render reads
// it; only Plan.Commit changes it, after the kernel accepted the plan.
type Applied struct {
	services map[model.ServicePortName]*svcApplied
	// owners lists, per map/set element key, the service ports that want
	// it, in order; the first one's value is what the kernel holds. Two
	// services claiming the same external IP and port is bad input that
	// must not fail the whole transaction.
	owners map[elemKey][]*ownedElem
	// stale per-service chains and sets: flushed, to be deleted later.
	stale map[objRef]staleObj
	// shards is the number of shard tables (0 before the first sync).
	shards int
	// rewrite holds service ports whose chains carry rules shadowed by a
	// partial sync's inserted ones (see renderService), since when; and
	// hairpinGarbage the hairpin pairs no service wants any more. Both are
	// cleaned up by a later sync's clean-up transaction.
	rewrite        map[model.ServicePortName]time.Time
	hairpinGarbage map[elemKey]garbageElem
	// hairpin counts, per endpoint address, the reachable endpoints of
	// service ports with that address: the hairpin set holds "ep . ep"
	// while the count is above zero. Counts rather than owned elements:
	// most elements of a cluster are these pairs (one per endpoint), and
	// keeping each as an element with its owners was most of the
	// renderer's memory.
	hairpin map[netip.Addr]int32
	// epNext is, per endpoint map in the kernel, the first key no
	// service port has had: a partial sync gives a changed policy chain
	// fresh keys from there (its old keys become garbage, deleted by a
	// clean-up like hairpin pairs); a full sync numbers from 0 again.
	epNext map[objRef]uint32
	// epUsers counts, per endpoint map, the service ports whose policy
	// chains use it: a map no service port uses any more is stale.
	epUsers map[objRef]int
	// epGarbage are key ranges no rule draws any more (in the order
	// they became garbage), deleted by a later clean-up. Endpoint map
	// elements are not in owners: the allocator gives every key one
	// owner, and 100k more owned elements made a 10k full sync's render
	// 60 % slower.
	epGarbage []epGarbage
	// healthChecked holds the service ports with a health check node
	// port; noLocal counts Local policies without local endpoints. Both
	// are kept up to date by Commit so that reading them costs nothing
	// per unchanged service.
	healthChecked map[model.ServicePortName]ServiceStats
	noLocalInt    int
	noLocalExt    int
	// sharedUsers counts, per shared chain (cluster/PROTO/N), the plain
	// service ports whose elements send packets to it: a chain nobody
	// uses any more is stale.
	sharedUsers map[objRef]int
	// settle lists the plain service ports with elements in tiers above
	// 0, since their first change: a clean-up at least staleDelay later
	// folds them into tier 0 (see plainApplied).
	settle map[model.ServicePortName]time.Time
	// staleFlushed are stale chains a clean-up has flushed: a shared
	// chain used again before its deletion needs its rules back.
	staleFlushed sets.Set[objRef]
}

type svcApplied struct {
	sp *model.ServicePort
	// table is the service port's shard table.
	table string
	elems []*ownedElem
	// chains are the service port's chains; all are rewritten when the
	// service port changes (there are one to four, so a slice). All but
	// the firewall chain are in the shard table.
	chains []objRef
	sets   []objRef
	// Reachable are the endpoints traffic may be sent to (conntrack).
	reachable []*model.Endpoint
	// eps are the key ranges the policy chains use in endpoint maps.
	eps   []epRange
	stats ServiceStats
	// plain is what the shared maps hold for a plain service port (nil:
	// the service port has chains of its own).
	plain *plainApplied
	// keyText holds the keys of elems (each key is a part of it).
	keyText string
}

// ServiceStats are per-service-port figures consumers need after a sync.
type ServiceStats struct {
	LocalEndpoints      int
	HealthCheckNodePort int32
	// NoLocalInternal/External: traffic policy Local with no local
	// endpoint (counted in sync_proxy_rules_no_local_endpoints_total).
	NoLocalInternal, NoLocalExternal bool
}

// NewApplied returns the state of a kernel kproxy has not written yet.
func NewApplied() *Applied {
	return &Applied{
		services:       map[model.ServicePortName]*svcApplied{},
		owners:         map[elemKey][]*ownedElem{},
		stale:          map[objRef]staleObj{},
		healthChecked:  map[model.ServicePortName]ServiceStats{},
		rewrite:        map[model.ServicePortName]time.Time{},
		hairpinGarbage: map[elemKey]garbageElem{},
		hairpin:        map[netip.Addr]int32{},
		epNext:         map[objRef]uint32{},
		epUsers:        map[objRef]int{},
		sharedUsers:    map[objRef]int{},
		settle:         map[model.ServicePortName]time.Time{},
		staleFlushed:   sets.New[objRef](),
	}
}

// Plan is a rendered sync: the transaction to apply and how Applied changes
// once it is applied.
type Plan struct {
	Tx *nft.Transaction
	// Conflicts lists elements a service wanted but another service held.
	// The model resolves contested addresses first, so this is a safety
	// net: it stays empty for any State built by State.Apply.
	Conflicts []string
	// StaleUDP are UDP endpoints no longer reachable through a service
	// port: conntrack entries that DNAT to them must go once applied.
	StaleUDP []StaleUDP
	// NewlyServedUDP are UDP service ports that had no endpoints and now
	// have some: conntrack entries for their IPs (cached rejects) must go.
	NewlyServedUDP []*model.ServicePort
	// Cleanup deletes per-service objects that have been stale for at
	// least staleDelay, in a transaction of its own applied after Tx
	// (full syncs only). When it fails nothing else is affected: the
	// objects stay stale and the next full sync tries again.
	Cleanup *nft.Transaction

	cleaned []objRef
	// rewritten / collected: entries the clean-up resolves; rewrite and
	// garbage: new entries this plan's Tx creates.
	rewritten []model.ServicePortName
	collected []elemKey
	rewrite   map[model.ServicePortName]time.Time
	garbage   map[elemKey]garbageElem
	epNext    map[objRef]uint32
	epUsers   map[objRef]int
	epAdds    []epRange
	epGarbage []epGarbage
	// epCollected is how many of Applied.epGarbage the clean-up deletes.
	epCollected int
	// sharedUsers and settle: changes to Applied's (settle: a zero time
	// removes); settled: plain service ports the clean-up settles.
	sharedUsers map[objRef]int
	settle      map[model.ServicePortName]time.Time
	settled     []settledPlain
	now         time.Time
	// flushed are the stale chains the clean-up flushes; flushedInSync
	// those the sync's own transaction flushes (leftovers of a full sync).
	flushed       []objRef
	flushedInSync []objRef
	full          bool
	shards        int
	services      map[model.ServicePortName]*svcApplied // nil value: gone
	owners        map[elemKey][]*ownedElem
	// hairpin are the new counts of the addresses whose count this plan
	// changed (a full sync: all of them); zero removes.
	hairpin map[netip.Addr]int32
	stale   map[objRef]*staleObj // nil value: no longer stale
}

// CommitCleanup records that Cleanup was applied.
func (p *Plan) CommitCleanup(a *Applied) {
	for _, n := range p.flushed {
		if _, ok := a.stale[n]; ok {
			a.staleFlushed.Insert(n)
		}
	}
	for _, n := range p.cleaned {
		delete(a.stale, n)
		a.staleFlushed.Delete(n)
		// A deleted endpoint map must be declared again before use.
		delete(a.epNext, n)
	}
	for _, n := range p.rewritten {
		delete(a.rewrite, n)
	}
	for _, k := range p.collected {
		delete(a.hairpinGarbage, k)
	}
	a.epGarbage = a.epGarbage[p.epCollected:]
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
		delete(a.settle, st.name)
		for _, c := range st.dropped {
			a.sharedUsers[c]--
			if a.sharedUsers[c] <= 0 {
				delete(a.sharedUsers, c)
				if _, ok := a.stale[c]; !ok {
					a.stale[c] = staleObj{since: p.now}
				}
			}
		}
	}
}

// CleanupPending reports whether, once the plan is committed, something is
// left for a later clean-up transaction: the caller should sync again
// after staleDelay even when nothing changes.
func (p *Plan) CleanupPending(a *Applied) bool {
	return len(a.stale) > 0 || len(a.rewrite) > 0 || len(a.hairpinGarbage) > 0 || len(a.epGarbage) > 0 || len(a.settle) > 0
}

// Commit records the plan (Tx) as applied.
func (p *Plan) Commit(a *Applied) {
	if p.full {
		// A full sync rewrites every chain and refills every set.
		a.shards = p.shards
		a.rewrite = map[model.ServicePortName]time.Time{}
		a.hairpinGarbage = map[elemKey]garbageElem{}
		a.epNext = map[objRef]uint32{}
		a.epUsers = map[objRef]int{}
		a.epGarbage = nil
		a.sharedUsers = map[objRef]int{}
		a.settle = map[model.ServicePortName]time.Time{}
		a.services = map[model.ServicePortName]*svcApplied{}
		a.owners = map[elemKey][]*ownedElem{}
		a.hairpin = make(map[netip.Addr]int32, len(p.hairpin))
		a.healthChecked = map[model.ServicePortName]ServiceStats{}
		a.noLocalInt, a.noLocalExt = 0, 0
	}
	for n, s := range p.services {
		if old, ok := a.services[n]; ok {
			a.count(n, old.stats, -1)
		}
		if s == nil {
			delete(a.services, n)
		} else {
			a.services[n] = s
			a.count(n, s.stats, 1)
		}
	}
	for k, o := range p.owners {
		if len(o) == 0 {
			delete(a.owners, k)
		} else {
			a.owners[k] = o
		}
	}
	for ip, c := range p.hairpin {
		if c <= 0 {
			delete(a.hairpin, ip)
		} else {
			a.hairpin[ip] = c
		}
	}
	for n, t := range p.rewrite {
		if _, ok := a.rewrite[n]; !ok {
			a.rewrite[n] = t
		}
	}
	for m, next := range p.epNext {
		a.epNext[m] = next
	}
	a.epGarbage = append(a.epGarbage, p.epGarbage...)
	for m, n := range p.epUsers {
		if n == 0 {
			delete(a.epUsers, m)
		} else {
			a.epUsers[m] = n
		}
	}
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
	for k, g := range p.garbage {
		if g.elem == nil {
			delete(a.hairpinGarbage, k)
		} else if _, ok := a.hairpinGarbage[k]; !ok {
			a.hairpinGarbage[k] = g
		}
	}
	for n, s := range p.stale {
		if s == nil {
			delete(a.stale, n)
			a.staleFlushed.Delete(n)
		} else {
			a.stale[n] = *s
		}
	}
	for _, n := range p.flushedInSync {
		if _, ok := a.stale[n]; ok {
			a.staleFlushed.Insert(n)
		}
	}
}

func (a *Applied) count(n model.ServicePortName, st ServiceStats, sign int) {
	if st.NoLocalInternal {
		a.noLocalInt += sign
	}
	if st.NoLocalExternal {
		a.noLocalExt += sign
	}
	if st.HealthCheckNodePort != 0 {
		if sign > 0 {
			a.healthChecked[n] = st
		} else {
			delete(a.healthChecked, n)
		}
	}
}

// NoLocal returns how many service ports with internal / external traffic
// policy Local have no local endpoint.
func (a *Applied) NoLocal() (internal, external int) { return a.noLocalInt, a.noLocalExt }

// Stats returns the figures of one service port as last applied.
func (a *Applied) Stats(n model.ServicePortName) (ServiceStats, bool) {
	s, ok := a.services[n]
	if !ok {
		return ServiceStats{}, false
	}
	return s.stats, true
}

// HealthChecks returns, per service with a health check node port, the port
// and the number of local endpoints (summed over the service's ports).
func (a *Applied) HealthChecks() (ports map[types.NamespacedName]uint16, local map[types.NamespacedName]int) {
	ports, local = map[types.NamespacedName]uint16{}, map[types.NamespacedName]int{}
	for n, st := range a.healthChecked {
		ports[n.NamespacedName] = uint16(st.HealthCheckNodePort)
		local[n.NamespacedName] += st.LocalEndpoints
	}
	return ports, local
}
