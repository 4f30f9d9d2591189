package nftables

import (
	"cmp"
	"fmt"
	"github.com/kproxy/kproxy/internal/proxy/udpflows"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/model"
)

// staleDelay is how long a flushed per-service chain or set waits before it
// is deleted. Upstream waits too: some kernels drop a map element's
// reference to a chain only after the transaction that removed the element
// has been fully committed, and a delete in the same batch fails with EBUSY.
const staleDelay = time.Second

// LocalDetector tells traffic from local pods apart from other traffic, per
// detectLocalMode. IfLocal/IfNotLocal are match statements; nil when the
// mode has nothing to match on for this family (then no masquerade rule
// for ClusterIP traffic is written, as upstream).
type LocalDetector struct {
	IfLocal    []nft.Stmt
	IfNotLocal []nft.Stmt
}

// Implemented reports whether local traffic can be recognised.
func (d LocalDetector) Implemented() bool { return len(d.IfNotLocal) > 0 }

// Config is what shapes the rules besides the services themselves. A
// change of Config needs a full sync.
type Config struct {
	Family        v1.IPFamily
	TableName     string
	MasqueradeBit int
	MasqueradeAll bool
	LocalDetector LocalDetector
	// NodePortIPs are the addresses NodePorts accept traffic on. When
	// NodePortAllLocal is set, every local address (except loopback)
	// does instead, matched with "fib daddr type local".
	NodePortIPs      []netip.Addr
	NodePortAllLocal bool
	// NodeIPs are this node's own addresses (to let the node reach an
	// LB with source ranges that include it).
	NodeIPs []netip.Addr
	// ServiceCIDRs, when known, let traffic to unallocated cluster IPs be
	// dropped instead of routed out.
	ServiceCIDRs []netip.Prefix
	// ServicesPerShard is the shard size the shard count is chosen for
	// (0: DefaultServicesPerShard). Tests make it small to spread a few
	// services over several shards.
	ServicesPerShard int
}

func (c *Config) family() nft.Family { return nft.FamilyFor(c.Family) }

func (c *Config) table() string {
	if c.TableName == "" {
		return DefaultTableName
	}
	return c.TableName
}

func (c *Config) markMask() uint32 { return 1 << uint(c.MasqueradeBit) }

func (c *Config) shardTable(i int) string { return ShardTable(c.table(), i) }

// Input is one sync's view of the world.
type Input struct {
	State    *model.State
	NodeName string
	Zone     string
	// Changed are the service ports to re-render in a partial sync.
	Changed sets.Set[model.ServicePortName]
	// Full re-renders everything; it ignores Applied except for stale
	// objects and shard count, and needs Existing read from the kernel.
	Full bool
	// Existing are the tables of ours (the main table and its shard
	// tables, see OurTables) that exist, with their chains and sets.
	Existing map[string]Objects
	// Takeover marks the first full sync over tables this process did
	// not write (left by an earlier run, or by upstream kube-proxy, whose
	// layout differs between versions): every chain in them is flushed,
	// and base chains and chains and sets kproxy does not know are
	// deleted, so that nothing of another layout keeps running. Base
	// chains are then re-added with kproxy's hooks and priorities (the
	// kernel cannot change the priority of an existing base chain). All in
	// the one transaction.
	Takeover bool
	Now      time.Time
}

// Objects are the names of the chains and sets of one table.
type Objects struct {
	Chains, Sets []string
}

// objRef names a chain or set of one of our tables.
type objRef struct{ table, name string }

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

type garbageElem struct {
	elem  *nft.Element
	table string
	since time.Time
}

type staleObj struct {
	since time.Time
	isSet bool
	// owner is the service port the object belonged to; nil for objects
	// found in the kernel at a full sync.
	owner *model.ServicePortName
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
// item 2). So there are plainTiers versions of the maps: the shard's
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

// ServiceStats are per-service-port figures consumers need after a sync.
type ServiceStats struct {
	LocalEndpoints      int
	HealthCheckNodePort int32
	// NoLocalInternal/External: traffic policy Local with no local
	// endpoint (counted in sync_proxy_rules_no_local_endpoints_total).
	NoLocalInternal, NoLocalExternal bool
}

type epGarbage struct {
	epRange
	since time.Time
}

// epRange is the keys off ... off+len(to)-1 of endpoint map m, which a
// policy chain's "dnat to numgen random mod N offset off map" rule uses.
type epRange struct {
	chain string
	m     objRef
	off   uint32
	to    []netip.AddrPort
}

type elemKey struct {
	set string
	key string
}

type ownedElem struct {
	owner model.ServicePortName
	key   elemKey
	elem  *nft.Element
	// table holds the element: the main table, or the owner's shard for
	// service-ips and service-nodeports.
	table string
}

func (o *ownedElem) sameValue(p *ownedElem) bool {
	if o.table != p.table {
		return false
	}
	if (o.elem.Verdict == nil) != (p.elem.Verdict == nil) {
		return false
	}
	return o.elem.Verdict == nil || *o.elem.Verdict == *p.elem.Verdict
}

// StaleUDP is a service port (as it was rendered) and endpoints it lost.
type StaleUDP = udpflows.Stale

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

// settledPlain is a plain service port a clean-up settles: from is its
// state before, chain the chain of its count, dropped the shared chains
// only its other tiers used.
type settledPlain struct {
	name    model.ServicePortName
	from    *plainApplied
	chain   string
	dropped []objRef
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

// renderer holds one Render call's work.
type renderer struct {
	cfg  *Config
	in   *Input
	last *Applied
	plan *Plan
	tx   *nft.Transaction
	// shards is the shard count of this render, shardNames their tables.
	shards     int
	shardNames []string
	// touched element keys and their kernel value before this plan.
	before map[elemKey]*ownedElem
	// existing chains in the kernel, per table (full syncs only).
	existing map[string]sets.Set[string]
	// numgen[m] is "numgen random mod m 0", boxed once per Render rather
	// than once per endpoint rule.
	numgen []nft.Stmt
	// keyText and keyEnds are describe's buffers for element keys,
	// reused from one service port to the next.
	keyText []byte
	keyEnds []int
	// declared are the endpoint maps this transaction has declared,
	// sharedDeclared the shared chains.
	declared       sets.Set[objRef]
	sharedDeclared sets.Set[objRef]
	// slab is where a full sync carves what it keeps per service port
	// (nil in partial syncs).
	slab *slabs
}

// slabs hand out, in a full sync, the parts of each service port's state
// that outlive the sync (its svcApplied, owned elements and their key
// values, a plain port's endpoints) from large chunks. A periodic full
// sync replaces all of them at once: allocated one by one, among the
// sync's short-lived objects, the new generation was scattered over
// spans the old one's death left part-used, and the heap in use grew by
// a third (20 MB at 10k) with the same live data. Partial syncs allocate
// per service port, so that a replaced port's memory goes with it.
type slabs struct {
	// chunk is how many items a chunk holds (values and endpoints four
	// times as many): up to 1024, fewer in a small cluster.
	chunk   int
	elems   []ownedElement
	vals    []nft.Value
	ptrs    []*ownedElem
	applied []svcApplied
	plains  []plainApplied
	sides   []plainSide
	addrs   []netip.AddrPort
}

// maxSlabChunk is the most items a slab chunk holds.
const maxSlabChunk = 1024

func (r *renderer) newApplied() *svcApplied {
	if r.slab == nil {
		return &svcApplied{}
	}
	return &take(&r.slab.applied, 1, r.slab.chunk)[0]
}

func (r *renderer) newPlainApplied() *plainApplied {
	if r.slab == nil {
		return &plainApplied{}
	}
	return &take(&r.slab.plains, 1, r.slab.chunk)[0]
}

func (r *renderer) newPlainSide(n int) *plainSide {
	if r.slab == nil {
		return &plainSide{to: make([]netip.AddrPort, n)}
	}
	p := &take(&r.slab.sides, 1, r.slab.chunk)[0]
	p.to = take(&r.slab.addrs, n, 4*r.slab.chunk)
	return p
}

// shardTable is the name of shard i, built once per render.
func (r *renderer) shardTable(i int) string {
	if r.shardNames == nil {
		r.shardNames = make([]string, r.shards)
	}
	if r.shardNames[i] == "" {
		r.shardNames[i] = r.cfg.shardTable(i)
	}
	return r.shardNames[i]
}

func (r *renderer) numgenStmt(mod uint32) nft.Stmt {
	for uint32(len(r.numgen)) <= mod {
		r.numgen = append(r.numgen, nft.MatchNumgen{Mod: uint32(len(r.numgen)), Value: 0})
	}
	return r.numgen[mod]
}

// Render turns a sync's input and what the kernel holds into a plan. It is
// pure: it reads no clock, runs nothing and changes neither argument.
func Render(cfg *Config, in *Input, last *Applied) *Plan {
	r := &renderer{
		cfg:  cfg,
		in:   in,
		last: last,
		tx:   nft.NewTransaction(cfg.family(), cfg.table()),
		plan: &Plan{
			full:        in.Full,
			services:    map[model.ServicePortName]*svcApplied{},
			owners:      map[elemKey][]*ownedElem{},
			hairpin:     map[netip.Addr]int32{},
			stale:       map[objRef]*staleObj{},
			rewrite:     map[model.ServicePortName]time.Time{},
			garbage:     map[elemKey]garbageElem{},
			epNext:      map[objRef]uint32{},
			epUsers:     map[objRef]int{},
			sharedUsers: map[objRef]int{},
			settle:      map[model.ServicePortName]time.Time{},
			now:         in.Now,
		},
		declared:       sets.New[objRef](),
		sharedDeclared: sets.New[objRef](),
		before:         map[elemKey]*ownedElem{},
		existing:       map[string]sets.Set[string]{},
		shards:         max(last.shards, 1),
	}
	for t, o := range in.Existing {
		r.existing[t] = sets.New(o.Chains...)
	}
	defer func() { r.shardNames = nil }()
	r.plan.Tx = r.tx
	if in.Full {
		r.shards = chooseShards(len(in.State.Services), last.shards, cfg.ServicesPerShard)
		r.plan.shards = r.shards
		// A full sync writes every service port: size the transaction
		// and the per-service map once instead of growing them through
		// dozens of copies (a 50k-service transaction has ~700k ops).
		r.tx.Ops = make([]nft.Op, 0, fullSyncOpsEstimate(in.State))
		r.plan.services = make(map[model.ServicePortName]*svcApplied, len(in.State.Services))
		r.slab = &slabs{chunk: min(maxSlabChunk, max(16, len(in.State.Services)))}
		r.renderFull()
		r.slab = nil
	} else {
		r.renderPartial()
	}
	r.renderStale()
	return r.plan
}

// fullSyncOpsEstimate guesses the operations of a full sync: per service
// port its chain, one rule and about one element per endpoint, and a few
// more chains, rules and elements (cluster IP, service map, policy
// chains). Endpoints shared between services share hairpin elements, so
// this errs on the high side; flushElements grows the slice if not.
func fullSyncOpsEstimate(st *model.State) int {
	n := 64 + 16*chooseShards(len(st.Services), 0, 0) // tables, fixed sets and chains and their rules
	for name := range st.Services {
		n += 6 + 2*len(st.Endpoints[name])
	}
	return n
}

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
		{Name: setHairpin, Key: []nft.DataType{a, a}, Comment: hairpinComment},
	}
}

// shardSets are the sets and maps of every shard table: its services'
// verdict maps, and its own copy of the NodePort addresses (a rule can
// only use sets of its table).
func (r *renderer) shardSets() []*nft.Set {
	a := r.addrType()
	svcKey := []nft.DataType{a, nft.TypeInetProto, nft.TypeInetService}
	npKey := []nft.DataType{nft.TypeInetProto, nft.TypeInetService}
	out := []*nft.Set{
		{Name: setNodePortIPs, Key: []nft.DataType{a}, Comment: nodePortIPsComment},
		{Name: mapServiceIPs, Key: svcKey, Data: nft.TypeVerdict, Comment: serviceIPsComment},
		{Name: mapServiceNodePorts, Key: npKey, Data: nft.TypeVerdict, Comment: serviceNodePortsComment},
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
			// Hairpin traffic first: mark it like any other traffic to
			// masquerade (see setHairpin).
			r.rule(chainMasquerading, nft.MatchInSet{Fields: []nft.Field{nft.FieldSaddr, nft.FieldDaddr}, Set: setHairpin}, nft.SetMarkOr{Mask: mask}),
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
		r.plan.StaleUDP = append(r.plan.StaleUDP, StaleUDP{Service: old.sp, Endpoints: old.reachable})
	}
	active := make(sets.Set[objRef], len(names))
	for _, n := range names {
		s := r.renderService(n, nil)
		active.Insert(s.chains...)
		active.Insert(s.sets...)
	}
	for m := range r.plan.epNext {
		active.Insert(m)
	}
	for c, u := range r.plan.sharedUsers {
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
				if since, ok := r.last.settle[n]; ok && !inUse.Has(ref) && since.After(garbage[ref]) {
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
				r.plan.flushedInSync = append(r.plan.flushedInSync, ref)
				r.markStale(ref, false, nil)
				if since, ok := garbage[ref]; ok && r.plan.stale[ref] != nil {
					r.plan.stale[ref].since = since
				}
			}
		}
		for _, s := range r.in.Existing[t].Sets {
			if ref := (objRef{t, s}); isOurs(s) && !active.Has(ref) {
				r.markStale(ref, true, nil)
			}
		}
	}
	for ref, st := range r.last.stale {
		if active.Has(ref) {
			r.plan.stale[ref] = nil
		} else if _, marked := r.plan.stale[ref]; !marked {
			// Known stale from before but not listed (already gone), or in
			// a table this transaction deletes.
			o, ok := r.in.Existing[ref.table]
			if !kept(ref.table) || !ok || (!slices.Contains(o.Chains, ref.name) && !slices.Contains(o.Sets, ref.name)) {
				r.plan.stale[ref] = nil
			} else {
				s := st
				r.plan.stale[ref] = &s
			}
		}
	}
	r.flushElements()
	r.flushEndpointKeys()
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
	for k, g := range r.last.hairpinGarbage {
		// Not if this sync's own transaction wants the pair again.
		if r.in.Now.Sub(g.since) >= staleDelay && r.hairpinCount(g.elem.Key[0].Addr) <= 0 {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, func(a, b elemKey) int { return strings.Compare(a.key, b.key) })
	for _, k := range keys {
		g := r.last.hairpinGarbage[k]
		tx.In(g.table).Delete(g.elem)
		r.plan.collected = append(r.plan.collected, k)
	}
	// Endpoint map keys, before any stale map is deleted below.
	for _, g := range r.last.epGarbage {
		if r.in.Now.Sub(g.since) < staleDelay {
			break // the rest became garbage later
		}
		w := tx.In(g.m.table)
		for i, to := range g.to {
			w.Delete(&nft.Element{Set: g.m.name, Index: g.off + uint32(i), To: to})
		}
		r.plan.epCollected++
	}
	r.settlePlain(tx)
	r.renderStaleInto(tx)
	if tx.Len() > 0 || len(r.plan.rewritten) > 0 || len(r.plan.collected) > 0 || r.plan.epCollected > 0 || len(r.plan.settled) > 0 {
		r.plan.Cleanup = tx
	}
}

// settlePlain moves plain ports whose first change is at least
// staleDelay old back into tier 0 (see plainApplied), in the clean-up
// transaction: tier 0 becomes what the tier in use holds, the higher
// tiers lose the port. Ports this very sync changed are settled too: the
// clean-up runs after their change is live.
func (r *renderer) settlePlain(tx *nft.Transaction) {
	var names []model.ServicePortName
	for n, since := range r.last.settle {
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
			if _, ok := r.plan.settle[n]; !ok {
				r.plan.settle[n] = time.Time{} // nothing to settle (any more)
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
		r.plan.settled = append(r.plan.settled, st)
	}
}

// markStale records a per-service object no longer used, for deletion by
// a clean-up transaction at least staleDelay later.
func (r *renderer) markStale(ref objRef, isSet bool, owner *model.ServicePortName) {
	if _, already := r.last.stale[ref]; already {
		return
	}
	// No live rule or element uses a stale object, except rules of its
	// owner shadowed by a partial sync's inserted ones; it is flushed and
	// deleted by a later clean-up transaction, so that this sync pays for
	// no deletion.
	r.plan.stale[ref] = &staleObj{since: r.in.Now, isSet: isSet, owner: owner}
}

// renderStale writes the clean-up transaction of a full sync.
func (r *renderer) renderStale() {
	if !r.in.Full {
		return
	}
	tx := nft.NewTransaction(r.cfg.family(), r.cfg.table())
	r.renderStaleInto(tx)
	if tx.Len() > 0 {
		r.plan.Cleanup = tx
	}
}

// renderStaleInto adds to tx the deletion of per-service objects stale for
// at least staleDelay: flushed and deleted, chains first (a chain may
// reference a set, never the other way round).
func (r *renderer) renderStaleInto(tx *nft.Transaction) {
	rewritten := sets.New(r.plan.rewritten...)
	// shadowing reports whether a live chain of n may still hold shadowed
	// rules that use n's stale objects: then they must wait until that
	// chain has been rewritten (a full sync rewrites every chain first).
	shadowing := func(n *model.ServicePortName) bool {
		if r.in.Full || n == nil {
			return false
		}
		if _, live := r.in.State.Services[*n]; !live {
			return false
		}
		if _, ok := r.plan.rewrite[*n]; ok {
			return true
		}
		_, pending := r.last.rewrite[*n]
		return pending && !rewritten.Has(*n)
	}
	var names, flush []objRef
	for ref, st := range r.last.stale {
		if p, ok := r.plan.stale[ref]; ok && p == nil {
			continue // revived or gone
		}
		if !st.isSet {
			flush = append(flush, ref)
		}
		if r.in.Now.Sub(st.since) >= staleDelay && !shadowing(st.owner) {
			names = append(names, ref)
		}
	}
	if len(names) == 0 {
		return
	}
	// Objects this very sync made stale too (a service just removed).
	for ref, st := range r.plan.stale {
		if st != nil && !st.isSet {
			if _, old := r.last.stale[ref]; !old {
				flush = append(flush, ref)
			}
		}
	}
	slices.SortFunc(names, compareRefs)
	slices.SortFunc(flush, compareRefs)
	// Flush every stale chain, due or not, before deleting anything: a
	// stale chain may still jump to another one or use a stale set (one
	// service's external- to its service- and local- chains, a chain with
	// shadowed rules to an old affinity set). Nothing live uses them, so
	// emptying them early changes no traffic.
	for _, ref := range flush {
		tx.In(ref.table).Flush(&nft.Chain{Name: ref.name})
	}
	r.plan.flushed = flush
	for _, isSet := range []bool{false, true} {
		for _, ref := range names {
			if r.last.stale[ref].isSet != isSet {
				continue
			}
			if isSet {
				// Endpoint maps are deleted as maps (nft looks "delete
				// set" up among sets only).
				tx.In(ref.table).Delete(&nft.Set{Name: ref.name, Endpoints: endpointMapProto(ref.name)})
			} else {
				tx.In(ref.table).Delete(&nft.Chain{Name: ref.name})
			}
		}
	}
	r.plan.cleaned = names
}

func compareRefs(a, b objRef) int {
	return cmp.Or(strings.Compare(a.table, b.table), strings.Compare(a.name, b.name))
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
		r.plan.epGarbage = append(r.plan.epGarbage, epGarbage{epRange: e, since: r.in.Now})
	}
	if n.Protocol == model.UDP && len(old.reachable) > 0 {
		r.plan.StaleUDP = append(r.plan.StaleUDP, StaleUDP{Service: old.sp, Endpoints: old.reachable})
	}
}

// owners returns the current owner list of a key, as changed by this plan.
func (r *renderer) ownersOf(k elemKey) []*ownedElem {
	if o, ok := r.plan.owners[k]; ok {
		return o
	}
	if r.in.Full {
		return nil
	}
	return r.last.owners[k]
}

func (r *renderer) noteBefore(k elemKey) {
	if r.in.Full {
		// A full sync flushed every set: nothing is there before it, and
		// the keys it touches are those of plan.owners (flushElements).
		return
	}
	if _, ok := r.before[k]; ok {
		return
	}
	var cur *ownedElem
	if o := r.ownersOf(k); len(o) > 0 {
		cur = o[0]
	}
	r.before[k] = cur
}

func (r *renderer) releaseElem(e *ownedElem) {
	r.noteBefore(e.key)
	owners := r.ownersOf(e.key)
	out := make([]*ownedElem, 0, len(owners))
	for _, o := range owners {
		if o.owner != e.owner {
			out = append(out, o)
		}
	}
	r.plan.owners[e.key] = out
}

// claimElem records that e's owner wants e. An owner that already held the
// key keeps its place in the queue, so an unrelated change of the first
// owner never hands the key to another service.
func (r *renderer) claimElem(e *ownedElem) {
	if r.in.Full {
		r.claimElemFull(e)
		return
	}
	r.noteBefore(e.key)
	// A list this plan made is its own to change; one from Applied is not.
	owners, mine := r.plan.owners[e.key]
	if !mine {
		owners = slices.Clone(r.ownersOf(e.key))
	}
	if i := slices.IndexFunc(owners, func(o *ownedElem) bool { return o.owner == e.owner }); i >= 0 {
		owners[i] = e
		r.plan.owners[e.key] = owners
		return
	}
	owners = append(owners, e)
	r.plan.owners[e.key] = owners
	r.noteConflict(owners, e)
}

// claimElemFull is claimElem in a full sync, which renders one service
// port after another on an empty plan: an owner already in a key's list
// can only be the last one, and every list is the plan's own.
func (r *renderer) claimElemFull(e *ownedElem) {
	owners := r.plan.owners[e.key]
	if n := len(owners); n > 0 && owners[n-1].owner == e.owner {
		owners[n-1] = e
		return
	}
	owners = append(owners, e)
	r.plan.owners[e.key] = owners
	r.noteConflict(owners, e)
}

// hairpinCount is an address's hairpin count as this plan leaves it.
func (r *renderer) hairpinCount(ip netip.Addr) int32 {
	if c, ok := r.plan.hairpin[ip]; ok {
		return c
	}
	if r.in.Full {
		return 0
	}
	return r.last.hairpin[ip]
}

// useHairpin moves one service port's references from the endpoints of
// was to those of is. Every reachable endpoint counts (an address with two
// ports twice): was is always the list counted before (svcApplied's
// reachable), so counts stay balanced without deduplicating.
func (r *renderer) useHairpin(was, is []*model.Endpoint) {
	for _, e := range is {
		r.plan.hairpin[e.IP] = r.hairpinCount(e.IP) + 1
	}
	for _, e := range was {
		r.plan.hairpin[e.IP] = r.hairpinCount(e.IP) - 1
	}
}

// hairpinChanges gives, for every address whose count this plan took to or
// from zero, the pair as counted before (nil: none; a garbage pair still in
// the kernel is not counted) and as wanted after (nil: none).
func (r *renderer) hairpinChanges() map[elemKey][2]*ownedElem {
	out := make(map[elemKey][2]*ownedElem, len(r.plan.hairpin))
	table := r.cfg.table()
	var buf []byte
	for ip, c := range r.plan.hairpin {
		before := !r.in.Full && r.last.hairpin[ip] > 0
		after := c > 0
		if before == after {
			continue
		}
		key := []nft.Value{{Addr: ip}, {Addr: ip}}
		buf = appendKey(buf[:0], key)
		e := &ownedElem{key: elemKey{set: setHairpin, key: string(buf)}, table: table,
			elem: &nft.Element{Set: setHairpin, Key: key}}
		if before {
			out[e.key] = [2]*ownedElem{e, nil}
		} else {
			out[e.key] = [2]*ownedElem{nil, e}
		}
	}
	return out
}

// noteConflict records a verdict map key wanted by two services; set
// elements may be shared (ports of a service share their cluster IP,
// services share endpoints in the hairpin set).
func (r *renderer) noteConflict(owners []*ownedElem, e *ownedElem) {
	if len(owners) > 1 && e.elem.Verdict != nil && owners[0].owner.NamespacedName != e.owner.NamespacedName {
		r.plan.Conflicts = append(r.plan.Conflicts, fmt.Sprintf("%s wants %s { %s } which %s already has", e.owner, e.key.set, e.key.key, owners[0].owner))
	}
}

// flushElements emits, for every element key touched, the difference
// between what the kernel held and what the first owner now wants.
func (r *renderer) flushElements() {
	touched := len(r.before)
	if r.in.Full {
		touched = len(r.plan.owners)
	}
	hairpin := r.hairpinChanges()
	keys := make([]elemKey, 0, touched+len(hairpin))
	if r.in.Full {
		for k := range r.plan.owners {
			keys = append(keys, k)
		}
	} else {
		for k := range r.before {
			keys = append(keys, k)
		}
	}
	for k := range hairpin {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b elemKey) int {
		if c := strings.Compare(a.set, b.set); c != 0 {
			return c
		}
		return strings.Compare(a.key, b.key)
	})
	// Deletes first, then adds: a key whose value changes is deleted and
	// re-added in the same transaction.
	var adds []*ownedElem
	if r.in.Full {
		adds = make([]*ownedElem, 0, len(keys))
	}
	for _, k := range keys {
		before := r.before[k]
		var after *ownedElem
		if o := r.ownersOf(k); len(o) > 0 {
			after = o[0]
		}
		if h, ok := hairpin[k]; ok {
			before, after = h[0], h[1]
		}
		if after != nil && k.set == setHairpin {
			// Wanted again: no longer garbage.
			if _, ok := r.last.hairpinGarbage[k]; ok {
				r.plan.garbage[k] = garbageElem{}
				if before == nil && !r.in.Full {
					continue // still in the kernel (a full sync has just flushed the set)
				}
			}
		}
		switch {
		case before == nil && after == nil:
		case before == nil:
			adds = append(adds, after)
		case after == nil:
			if (k.set == setHairpin || before.elem.IsEndpoint()) && !r.in.Full {
				// A stale "ep . ep" pair is harmless (it says what is true
				// of any address), and so are endpoint map keys no rule
				// draws any more; a later clean-up deletes them rather
				// than this sync paying for a deletion.
				r.plan.garbage[k] = garbageElem{elem: before.elem, table: before.table, since: r.in.Now}
				continue
			}
			r.tx.In(before.table).Delete(before.elem)
		case !before.sameValue(after):
			r.tx.In(before.table).Delete(before.elem)
			adds = append(adds, after)
		case before.elem.Comment != after.elem.Comment:
			// Same value, other owner: nothing the kernel cares about.
		}
	}
	// Grouped by table, in order of first appearance (keys are sorted by
	// set and key): consecutive elements of one set of one table go to
	// the kernel in one message.
	var order []string
	byTable := map[string][]*ownedElem{}
	for _, e := range adds {
		if _, ok := byTable[e.table]; !ok {
			order = append(order, e.table)
		}
		byTable[e.table] = append(byTable[e.table], e)
	}
	r.tx.Ops = slices.Grow(r.tx.Ops, len(adds))
	for _, t := range order {
		in := t
		if t == r.tx.Table {
			in = ""
		}
		for _, e := range byTable[t] {
			r.tx.Ops = append(r.tx.Ops, nft.Op{Kind: nft.OpAdd, In: in, Element: e.elem})
		}
	}
}

// appendKey appends the element key as the text form writes it
// (nft.Value's String joined with " . "): the bookkeeping's map key and
// sort order. appendValue must stay in step with nft.Value.String.
func appendKey(b []byte, vals []nft.Value) []byte {
	for i, v := range vals {
		if i > 0 {
			b = append(b, " . "...)
		}
		b = appendValue(b, v)
	}
	return b
}

func appendValue(b []byte, v nft.Value) []byte {
	switch {
	case v.Addr.IsValid():
		return v.Addr.AppendTo(b)
	case v.Prefix.IsValid():
		if v.Prefix.IsSingleIP() {
			return v.Prefix.Addr().AppendTo(b)
		}
		return v.Prefix.AppendTo(b)
	case v.Proto != "":
		return append(b, nft.ProtoName(v.Proto)...)
	default:
		return strconv.AppendInt(b, int64(v.Port), 10)
	}
}

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

// take hands out the next n zero items of *buf, capacity-limited so that
// an append to them cannot reach their neighbours. When the chunk is full
// a new one of at least chunk items starts; items already handed out
// stay where they are.
func take[T any](buf *[]T, n, chunk int) []T {
	if cap(*buf)-len(*buf) < n {
		*buf = make([]T, 0, max(n, chunk))
	}
	l := len(*buf)
	*buf = (*buf)[:l+n]
	return (*buf)[l : l+n : l+n]
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
			r.plan.epAdds = append(r.plan.epAdds, e)
		}
	}
	for _, p := range prev.epsOrNil() {
		if !slices.ContainsFunc(s.eps, func(e epRange) bool { return sameRange(p, e) }) {
			r.plan.epGarbage = append(r.plan.epGarbage, epGarbage{epRange: p, since: r.in.Now})
		}
	}
	applied.stats = ServiceStats{LocalEndpoints: len(sel.Local), HealthCheckNodePort: sp.HealthCheckNodePort}
	if sp.InternalPolicyLocal && sel.HasAny && len(sel.Local) == 0 {
		applied.stats.NoLocalInternal = true
	}
	if sp.ExternalPolicyLocal && sp.ExternallyAccessible() && sel.HasAny && len(sel.Local) == 0 {
		applied.stats.NoLocalExternal = true
	}

	// Sets before chains (rules reference them), chains before rules
	// (rules jump between them), rules, then elements (they goto chains).
	for _, set := range s.sets {
		ref := objRef{table, set.Name}
		applied.sets = append(applied.sets, ref)
		if old == nil || !slices.Contains(old.sets, ref) || r.isStale(ref) {
			r.tx.In(table).Add(set)
		}
		if r.isStale(ref) {
			r.plan.stale[ref] = nil
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
			r.plan.stale[c] = nil
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
	var removed []*model.Endpoint
	for _, e := range prev.reachable {
		serving := slices.ContainsFunc(eps, func(x *model.Endpoint) bool { return x.Serving && x.AddrPort() == e.AddrPort() })
		if !serving {
			removed = append(removed, e)
		}
	}
	if len(removed) > 0 {
		r.plan.StaleUDP = append(r.plan.StaleUDP, StaleUDP{Service: prev.sp, Endpoints: removed})
	}
	if len(prev.reachable) == 0 && len(sel.AllReachable) > 0 {
		r.plan.NewlyServedUDP = append(r.plan.NewlyServedUDP, sp)
	}
}

func (r *renderer) isStale(ref objRef) bool {
	if p, ok := r.plan.stale[ref]; ok {
		return p != nil
	}
	_, ok := r.last.stale[ref]
	return ok
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
	adds := r.plan.epAdds
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
	next, ok := r.plan.epNext[m]
	if !ok && !r.in.Full {
		next = r.last.epNext[m]
	}
	r.plan.epNext[m] = next + uint32(len(to))
	return next
}

// declareMap adds an endpoint map the transaction uses unless it exists:
// known to the applied state, or declared already by this transaction.
func (r *renderer) declareMap(m objRef, proto v1.Protocol) {
	if r.declared.Has(m) {
		return
	}
	r.declared.Insert(m)
	_, known := r.last.epNext[m]
	stale := r.isStale(m)
	if stale {
		r.plan.stale[m] = nil
	}
	if r.in.Full || !known || stale {
		r.tx.In(m.table).Add(&nft.Set{Name: m.name, Endpoints: proto})
	}
	if _, ok := r.plan.epNext[m]; !ok {
		// A map is known from now on even if it has no keys.
		next := uint32(0)
		if !r.in.Full {
			next = r.last.epNext[m]
		}
		r.plan.epNext[m] = next
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
		r.plan.stale[ref] = nil
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
		if r.last.staleFlushed.Has(ref) {
			w.AddRules(r.sharedRules(ref.name, proto, n)...)
		}
	case r.sharedUsersOf(ref) == 0:
		w.Add(ch)
		w.AddRules(r.sharedRules(ref.name, proto, n)...)
	}
	return ref
}

func (r *renderer) sharedUsersOf(ref objRef) int {
	if u, ok := r.plan.sharedUsers[ref]; ok {
		return u
	}
	if r.in.Full {
		return 0
	}
	return r.last.sharedUsers[ref]
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
			r.plan.sharedUsers[c] = r.sharedUsersOf(c) + 1
			// Made stale earlier in this render by another port's
			// change: used again.
			if r.isStale(c) {
				r.plan.stale[c] = nil
			}
		}
	}
	for _, c := range old {
		if !slices.Contains(cur, c) {
			u := r.sharedUsersOf(c) - 1
			r.plan.sharedUsers[c] = u
			if u <= 0 {
				r.plan.sharedUsers[c] = 0
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
		r.plan.settle[n] = r.in.Now // kept only if the port has no earlier change to settle
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
		r.plan.settle[n] = time.Time{}
	}
	r.useShared(sharedRefs(table, proto, old), nil)
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
		if u, ok := r.plan.epUsers[m]; ok {
			return u
		}
		if r.in.Full {
			return 0
		}
		return r.last.epUsers[m]
	}
	for i, e := range cur {
		if !has(cur[:i], e.m) && !has(old, e.m) {
			r.plan.epUsers[e.m] = users(e.m) + 1
		}
	}
	for i, e := range old {
		if !has(old[:i], e.m) && !has(cur, e.m) {
			u := users(e.m) - 1
			r.plan.epUsers[e.m] = u
			if u == 0 {
				r.markStale(e.m, true, &n)
			}
		}
	}
}
