package nftables

import (
	"cmp"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/model"
)

type staleObj struct {
	since time.Time
	isSet bool
	// owner is the service port the object belonged to; nil for objects
	// found in the kernel at a full sync.
	owner *model.ServicePortName
}

// staleObjects are the per-service chains and sets no longer used:
// flushed, to be deleted by a clean-up at least staleDelay later.
type staleObjects struct {
	objs map[objRef]staleObj
	// flushed are stale chains a clean-up has flushed: a shared chain
	// used again before its deletion needs its rules back.
	flushed sets.Set[objRef]
}

// stalePlan is how a plan changes staleObjects.
type stalePlan struct {
	objs map[objRef]*staleObj // nil value: no longer stale
	// flushedInSync are the stale chains the sync's own transaction
	// flushes (leftovers of a full sync); flushed those the clean-up
	// flushes, cleaned the objects it deletes.
	flushedInSync []objRef
	flushed       []objRef
	cleaned       []objRef
}

func (p *stalePlan) commit(a *staleObjects) {
	for n, s := range p.objs {
		if s == nil {
			delete(a.objs, n)
			a.flushed.Delete(n)
		} else {
			a.objs[n] = *s
		}
	}
	for _, n := range p.flushedInSync {
		if _, ok := a.objs[n]; ok {
			a.flushed.Insert(n)
		}
	}
}

func (p *stalePlan) commitCleanup(a *staleObjects) {
	for _, n := range p.flushed {
		if _, ok := a.objs[n]; ok {
			a.flushed.Insert(n)
		}
	}
	for _, n := range p.cleaned {
		delete(a.objs, n)
		a.flushed.Delete(n)
	}
}

// markStale records a per-service object no longer used, for deletion by
// a clean-up transaction at least staleDelay later.
func (r *renderer) markStale(ref objRef, isSet bool, owner *model.ServicePortName) {
	if _, already := r.last.stale.objs[ref]; already {
		return
	}
	// No live rule or element uses a stale object, except rules of its
	// owner shadowed by a partial sync's inserted ones; it is flushed and
	// deleted by a later clean-up transaction, so that this sync pays for
	// no deletion.
	r.plan.stale.objs[ref] = &staleObj{since: r.in.Now, isSet: isSet, owner: owner}
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
	for ref, st := range r.last.stale.objs {
		if p, ok := r.plan.stale.objs[ref]; ok && p == nil {
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
	for ref, st := range r.plan.stale.objs {
		if st != nil && !st.isSet {
			if _, old := r.last.stale.objs[ref]; !old {
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
	r.plan.stale.flushed = flush
	for _, isSet := range []bool{false, true} {
		for _, ref := range names {
			if r.last.stale.objs[ref].isSet != isSet {
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
	r.plan.stale.cleaned = names
}

func compareRefs(a, b objRef) int {
	return cmp.Or(strings.Compare(a.table, b.table), strings.Compare(a.name, b.name))
}

func (r *renderer) isStale(ref objRef) bool {
	if p, ok := r.plan.stale.objs[ref]; ok {
		return p != nil
	}
	_, ok := r.last.stale.objs[ref]
	return ok
}
