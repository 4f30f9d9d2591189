package nftables

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/model"
)

type garbageElem struct {
	elem  *nft.Element
	table string
	since time.Time
}

// hairpinState is the hairpin set as applied. counts are, per endpoint
// address, the reachable endpoints of service ports with that address:
// the hairpin set holds "ep . ep" while the count is above zero. Counts
// rather than owned elements: most elements of a cluster are these pairs
// (one per endpoint), and keeping each as an element with its owners was
// most of the renderer's memory. garbage are the pairs no service wants
// any more, deleted by a later sync's clean-up transaction.
type hairpinState struct {
	counts  map[netip.Addr]int32
	garbage map[elemKey]garbageElem
}

func newHairpinState(size int) hairpinState {
	return hairpinState{counts: make(map[netip.Addr]int32, size), garbage: map[elemKey]garbageElem{}}
}

// hairpinPlan is how a plan changes hairpinState: counts are the new
// counts of the addresses whose count the plan changed (a full sync: all
// of them; zero removes); garbage the new garbage pairs (a nil elem: no
// longer garbage); collected the pairs the clean-up deletes.
type hairpinPlan struct {
	counts    map[netip.Addr]int32
	garbage   map[elemKey]garbageElem
	collected []elemKey
}

func (p *hairpinPlan) commit(a *hairpinState) {
	for ip, c := range p.counts {
		if c <= 0 {
			delete(a.counts, ip)
		} else {
			a.counts[ip] = c
		}
	}
	for k, g := range p.garbage {
		if g.elem == nil {
			delete(a.garbage, k)
		} else if _, ok := a.garbage[k]; !ok {
			a.garbage[k] = g
		}
	}
}

func (p *hairpinPlan) commitCleanup(a *hairpinState) {
	for _, k := range p.collected {
		delete(a.garbage, k)
	}
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
	if c, ok := r.plan.hairpin.counts[ip]; ok {
		return c
	}
	if r.in.Full {
		return 0
	}
	return r.last.hairpin.counts[ip]
}

// useHairpin moves one service port's references from the endpoints of
// was to those of is. Every reachable endpoint counts (an address with two
// ports twice): was is always the list counted before (svcApplied's
// reachable), so counts stay balanced without deduplicating.
func (r *renderer) useHairpin(was, is []*model.Endpoint) {
	for _, e := range is {
		r.plan.hairpin.counts[e.IP] = r.hairpinCount(e.IP) + 1
	}
	for _, e := range was {
		r.plan.hairpin.counts[e.IP] = r.hairpinCount(e.IP) - 1
	}
}

// hairpinTable is the table that holds ip's hairpin pair.
func (r *renderer) hairpinTable(ip netip.Addr) string {
	return r.shardTable(hairpinShard(ip, r.shards))
}

// hairpinChanges gives, for every address whose count this plan took to or
// from zero, the pair as counted before (nil: none; a garbage pair still in
// the kernel is not counted) and as wanted after (nil: none).
func (r *renderer) hairpinChanges() map[elemKey][2]*ownedElem {
	out := make(map[elemKey][2]*ownedElem, len(r.plan.hairpin.counts))
	var buf []byte
	for ip, c := range r.plan.hairpin.counts {
		before := !r.in.Full && r.last.hairpin.counts[ip] > 0
		after := c > 0
		if before == after {
			continue
		}
		key := []nft.Value{{Addr: ip}, {Addr: ip}}
		buf = appendKey(buf[:0], key)
		e := &ownedElem{key: elemKey{set: setHairpin, key: string(buf)}, table: r.hairpinTable(ip),
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
			if _, ok := r.last.hairpin.garbage[k]; ok {
				r.plan.hairpin.garbage[k] = garbageElem{}
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
				r.plan.hairpin.garbage[k] = garbageElem{elem: before.elem, table: before.table, since: r.in.Now}
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
