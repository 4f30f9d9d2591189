package nftables

import (
	"net/netip"
	"time"

	"k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy"
	"github.com/kproxy/kproxy/internal/proxy/masquerade"
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

func (c *Config) markMask() uint32 { return masquerade.Value(c.MasqueradeBit) }

func (c *Config) shardTable(i int) string { return ShardTable(c.table(), i) }

// Input is one sync's view of the world.
type Input struct {
	proxy.RenderInput
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
		cfg:            cfg,
		in:             in,
		last:           last,
		tx:             nft.NewTransaction(cfg.family(), cfg.table()),
		plan:           newPlan(in.Full, in.Now),
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
