package nftables

import (
	"net/netip"
	"time"

	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy/tally"
	"github.com/kproxy/kproxy/internal/proxy/udpflows"
)

// Applied is what the last successful sync left in the kernel. Render reads
// it; only Plan.Commit changes it, after the kernel accepted the plan.
//
// Besides the service ports and their elements, its bookkeeping is in
// groups, each next to the code that renders it and each with its own
// commit: stale objects (stale.go), hairpin counts and garbage
// (elements.go), endpoint maps (epmap.go), plain-port tiers and shared
// chains (plain.go), and the per-sync tallies.
type Applied struct {
	services map[model.ServicePortName]*svcApplied
	// owners lists, per map/set element key, the service ports that want
	// it, in order; the first one's value is what the kernel holds. Two
	// services claiming the same external IP and port is bad input that
	// must not fail the whole transaction.
	owners map[elemKey][]*ownedElem
	// shards is the number of shard tables (0 before the first sync).
	shards int
	// rewrite holds service ports whose chains carry rules shadowed by a
	// partial sync's inserted ones (see renderService), since when; a
	// later sync's clean-up transaction rewrites them.
	rewrite map[model.ServicePortName]time.Time

	stale      staleObjects
	hairpin    hairpinState
	epMaps     endpointMapState
	plainPorts plainPortState
	// tallies are the per-sync figures, kept up to date by Commit so
	// that reading them costs nothing per unchanged service.
	tallies tally.Tally
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
	// flows are the endpoints whose UDP flows were kept (udpflows.Kept):
	// what a later sync compares with to find stale flows. UDP only.
	flows []*model.Endpoint
	// eps are the key ranges the policy chains use in endpoint maps.
	eps   []epRange
	stats tally.Port
	// plain is what the shared maps hold for a plain service port (nil:
	// the service port has chains of its own).
	plain *plainApplied
	// keyText holds the keys of elems (each key is a part of it).
	keyText string
}

// NewApplied returns the state of a kernel kproxy has not written yet.
func NewApplied() *Applied {
	return &Applied{
		services:   map[model.ServicePortName]*svcApplied{},
		owners:     map[elemKey][]*ownedElem{},
		rewrite:    map[model.ServicePortName]time.Time{},
		stale:      staleObjects{objs: map[objRef]staleObj{}, flushed: sets.New[objRef]()},
		hairpin:    newHairpinState(0),
		epMaps:     newEndpointMapState(),
		plainPorts: newPlainPortState(),
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
	StaleUDP []udpflows.Stale
	// NewlyServedUDP are UDP service ports that had no endpoints and now
	// have some: conntrack entries for their IPs (cached rejects) must go.
	NewlyServedUDP []*model.ServicePort
	// Cleanup deletes per-service objects that have been stale for at
	// least staleDelay, in a transaction of its own applied after Tx
	// (full syncs only). When it fails nothing else is affected: the
	// objects stay stale and the next full sync tries again.
	Cleanup *nft.Transaction

	full     bool
	shards   int
	now      time.Time
	services map[model.ServicePortName]*svcApplied // nil value: gone
	owners   map[elemKey][]*ownedElem
	// rewrite: new entries this plan's Tx creates; rewritten: entries
	// the clean-up resolves.
	rewrite   map[model.ServicePortName]time.Time
	rewritten []model.ServicePortName

	// The changes to Applied's groups of the same names.
	stale      stalePlan
	hairpin    hairpinPlan
	epMaps     endpointMapPlan
	plainPorts plainPortPlan
}

// newPlan returns an empty plan for a sync at now.
func newPlan(full bool, now time.Time) *Plan {
	return &Plan{
		full:       full,
		now:        now,
		services:   map[model.ServicePortName]*svcApplied{},
		owners:     map[elemKey][]*ownedElem{},
		rewrite:    map[model.ServicePortName]time.Time{},
		stale:      stalePlan{objs: map[objRef]*staleObj{}},
		hairpin:    hairpinPlan{counts: map[netip.Addr]int32{}, garbage: map[elemKey]garbageElem{}},
		epMaps:     endpointMapPlan{next: map[objRef]uint32{}, users: map[objRef]int{}},
		plainPorts: plainPortPlan{sharedUsers: map[objRef]int{}, settle: map[model.ServicePortName]time.Time{}},
	}
}

// CommitCleanup records that Cleanup was applied.
func (p *Plan) CommitCleanup(a *Applied) {
	p.stale.commitCleanup(&a.stale)
	for _, n := range p.stale.cleaned {
		// A deleted endpoint map must be declared again before use.
		delete(a.epMaps.next, n)
	}
	for _, n := range p.rewritten {
		delete(a.rewrite, n)
	}
	p.hairpin.commitCleanup(&a.hairpin)
	p.epMaps.commitCleanup(&a.epMaps)
	p.plainPorts.commitCleanup(a, p.now)
}

// CleanupPending reports whether, once the plan is committed, something is
// left for a later clean-up transaction: the caller should sync again
// after staleDelay even when nothing changes.
func (p *Plan) CleanupPending(a *Applied) bool {
	return len(a.stale.objs) > 0 || len(a.rewrite) > 0 || len(a.hairpin.garbage) > 0 || len(a.epMaps.garbage) > 0 || len(a.plainPorts.settle) > 0
}

// Commit records the plan (Tx) as applied.
func (p *Plan) Commit(a *Applied) {
	if p.full {
		// A full sync rewrites every chain and refills every set; stale
		// objects stay stale (the plan says which are no longer).
		a.shards = p.shards
		a.rewrite = map[model.ServicePortName]time.Time{}
		a.services = map[model.ServicePortName]*svcApplied{}
		a.owners = map[elemKey][]*ownedElem{}
		a.hairpin = newHairpinState(len(p.hairpin.counts))
		a.epMaps = newEndpointMapState()
		a.plainPorts = newPlainPortState()
		a.tallies = tally.Tally{}
	}
	for n, s := range p.services {
		if old, ok := a.services[n]; ok {
			a.tallies.Remove(n, old.stats)
		}
		if s == nil {
			delete(a.services, n)
		} else {
			a.services[n] = s
			a.tallies.Add(n, s.stats)
		}
	}
	for k, o := range p.owners {
		if len(o) == 0 {
			delete(a.owners, k)
		} else {
			a.owners[k] = o
		}
	}
	for n, t := range p.rewrite {
		if _, ok := a.rewrite[n]; !ok {
			a.rewrite[n] = t
		}
	}
	p.hairpin.commit(&a.hairpin)
	p.epMaps.commit(&a.epMaps)
	p.plainPorts.commit(&a.plainPorts)
	p.stale.commit(&a.stale)
}

// NoLocal returns how many service ports with internal / external traffic
// policy Local have no local endpoint.
func (a *Applied) NoLocal() (internal, external int) { return a.tallies.NoLocal() }
