package ipvs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kproxy/kproxy/internal/kernel/ipset"
	"github.com/kproxy/kproxy/internal/kernel/ipvs"
	"github.com/kproxy/kproxy/internal/kernel/netdev"
	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/metrics"
)

// How the proxier changes the kernel: apply (a whole Plan against what
// the kernel holds: full syncs) and applyPartial (a PartialPlan), both
// through the same per-object steps.

// apply makes the kernel hold d, changing only the difference with what
// it holds. The order keeps traffic flowing: the interface, its addresses
// and the sets first, then the iptables rules that match the sets, then
// the virtual and real servers; only then what is gone is removed.
func (p *Proxier) apply(ctx context.Context, d *Plan) (stats, error) {
	var st stats
	entries, err := p.canonicalEntries(d.Sets)
	if err != nil {
		return st, err
	}
	services := make(map[ipvs.VirtualServer]*VirtualServer, len(d.Services))
	for vs, v := range d.Services {
		services[key(vs)] = v
	}
	if p.applied == nil {
		k, err := p.read(d, services)
		if err != nil {
			return st, err
		}
		p.applied = k
	}
	k := p.applied
	if err := p.prepare(); err != nil {
		return st, err
	}

	// Addresses on kube-ipvs0.
	want := map[netip.Addr]bool{}
	for _, a := range d.Addresses {
		want[a.Unmap()] = true
	}
	for _, a := range sortedAddrs(want) {
		if err := p.addAddr(a, &st); err != nil {
			return st, err
		}
	}

	// ipsets: create, then add members; members that go are deleted
	// after the iptables rules and servers are in place.
	names := sortedKeys(d.Sets)
	for _, name := range names {
		if _, ok := k.sets[name]; !ok {
			if err := p.h.IPSet.Create(d.Sets[name].Set); err != nil {
				return st, fmt.Errorf("creating ipset %s: %w", name, err)
			}
			k.sets[name] = map[string]bool{}
		}
		for _, e := range entries[name] {
			if err := p.addEntry(name, e, &st); err != nil {
				return st, err
			}
		}
	}

	if err := p.restoreIPTables(ctx, d.IPTables, &st); err != nil {
		return st, err
	}

	// Virtual servers and their real servers.
	// Map order: every wanted server is added whatever the order, and
	// sorting 10k virtual servers at each sync costs more than it says.
	for vs, dv := range services {
		if err := p.syncService(vs, dv, &st); err != nil {
			return st, err
		}
	}

	// What is gone: virtual servers, set members, addresses.
	for _, vs := range sortedServices(k.services) {
		if _, ok := services[vs]; ok {
			continue
		}
		if err := p.deleteService(vs, &st); err != nil {
			return st, err
		}
	}
	for _, name := range names {
		want := map[string]bool{}
		for _, e := range entries[name] {
			want[e] = true
		}
		for _, e := range sortedKeys(k.sets[name]) {
			if want[e] {
				continue
			}
			if err := p.delEntry(name, e, &st); err != nil {
				return st, err
			}
		}
	}
	for _, a := range sortedAddrs(k.addrs) {
		if want[a] {
			continue
		}
		if err := p.delAddr(a, &st); err != nil {
			return st, err
		}
	}
	return st, nil
}

// applyPartial makes the kernel follow one PartialPlan, in apply's
// order, touching only what the PartialPlan names.
func (p *Proxier) applyPartial(ctx context.Context, d *PartialPlan) (stats, error) {
	var st stats
	k := p.applied
	if err := p.prepare(); err != nil {
		return st, err
	}
	for _, a := range d.AddAddrs {
		if err := p.addAddr(a.Unmap(), &st); err != nil {
			return st, err
		}
	}
	for _, name := range sortedKeys(d.AddEntries) {
		if k.sets[name] == nil {
			return st, fmt.Errorf("ipset %s is not known to exist", name)
		}
		for _, e := range d.AddEntries[name] {
			c, err := p.canonicalEntry(name, e)
			if err != nil {
				return st, err
			}
			if err := p.addEntry(name, c, &st); err != nil {
				return st, err
			}
		}
	}
	if d.IPTables != nil {
		if err := p.restoreIPTables(ctx, d.IPTables, &st); err != nil {
			return st, err
		}
	}
	var gone []ipvs.VirtualServer
	for vs, dv := range d.Services {
		vs = key(vs)
		if dv == nil {
			if _, ok := k.services[vs]; ok {
				gone = append(gone, vs)
			}
			continue
		}
		if err := p.syncService(vs, dv, &st); err != nil {
			return st, err
		}
	}
	slices.SortFunc(gone, compareServices)
	for _, vs := range gone {
		if err := p.deleteService(vs, &st); err != nil {
			return st, err
		}
	}
	for _, name := range sortedKeys(d.DelEntries) {
		for _, e := range d.DelEntries[name] {
			c, err := p.canonicalEntry(name, e)
			if err != nil {
				return st, err
			}
			if err := p.delEntry(name, c, &st); err != nil {
				return st, err
			}
		}
	}
	for _, a := range d.DelAddrs {
		if err := p.delAddr(a.Unmap(), &st); err != nil {
			return st, err
		}
	}
	return st, nil
}

// prepare makes sure of kube-ipvs0 and, once, of IPVS's timeouts.
func (p *Proxier) prepare() error {
	if _, err := p.h.NetDev.EnsureDummy(DummyDevice); err != nil {
		return fmt.Errorf("creating %s: %w", DummyDevice, err)
	}
	if !p.timeoutsSet && p.opts.Timeouts != (ipvs.Timeouts{}) {
		if err := p.h.IPVS.SetTimeouts(p.opts.Timeouts); err != nil {
			return fmt.Errorf("setting IPVS timeouts: %w", err)
		}
		p.timeoutsSet = true
	}
	return nil
}

func (p *Proxier) addAddr(a netip.Addr, st *stats) error {
	if p.applied.addrs[a] {
		return nil
	}
	if err := p.h.NetDev.AddAddress(DummyDevice, a); err != nil && !errors.Is(err, netdev.ErrAddrExists) {
		return fmt.Errorf("adding %s to %s: %w", a, DummyDevice, err)
	}
	p.applied.addrs[a] = true
	st.addrAdded++
	return nil
}

func (p *Proxier) delAddr(a netip.Addr, st *stats) error {
	if !p.applied.addrs[a] {
		return nil
	}
	if err := p.h.NetDev.DelAddress(DummyDevice, a); err != nil {
		return fmt.Errorf("deleting %s from %s: %w", a, DummyDevice, err)
	}
	delete(p.applied.addrs, a)
	st.addrDeleted++
	return nil
}

// addEntry adds a member (in the kernel's text form) to a known set.
func (p *Proxier) addEntry(name, e string, st *stats) error {
	have := p.applied.sets[name]
	if have[e] {
		return nil
	}
	if err := p.h.IPSet.Add(name, e); err != nil && !errors.Is(err, ipset.ErrEntryExists) {
		return fmt.Errorf("adding %q to ipset %s: %w", e, name, err)
	}
	have[e] = true
	st.setChanged++
	return nil
}

func (p *Proxier) delEntry(name, e string, st *stats) error {
	have := p.applied.sets[name]
	if !have[e] {
		return nil
	}
	if err := p.h.IPSet.Del(name, e); err != nil && !isNotFound(err) {
		return fmt.Errorf("deleting %q from ipset %s: %w", e, name, err)
	}
	delete(have, e)
	st.setChanged++
	return nil
}

// restoreIPTables writes ipvs mode's chains when they changed or a jump
// rule from a built-in chain is missing.
func (p *Proxier) restoreIPTables(ctx context.Context, data []byte, st *stats) error {
	base, inserts := splitInserts(data)
	if p.iptables != nil && !inserts && bytes.Equal(p.iptables, base) {
		return nil
	}
	if err := p.h.IPTables.Restore(ctx, data, xtables.RestoreOptions{NoFlush: true}); err != nil {
		metrics.IPTablesRestoreFailuresTotal.WithLabelValues(string(p.opts.Family)).Inc()
		return fmt.Errorf("iptables-restore of ipvs mode's chains (%d bytes): %w", len(data), err)
	}
	p.iptables = base
	st.iptables = true
	// The jump rules are in place now: later renders leave them out.
	for _, j := range JumpRules {
		if p.host.Rules[j.Table] == nil {
			p.host.Rules[j.Table] = sets.New[string]()
		}
		p.host.Rules[j.Table].Insert(j.Line)
	}
	return nil
}

// syncService makes one wanted virtual server (vs, a key) and its real
// servers what dv says; real servers no longer wanted terminate
// gracefully.
func (p *Proxier) syncService(vs ipvs.VirtualServer, dv *VirtualServer, st *stats) error {
	k := p.applied
	svc := dv.Service
	svc.VirtualServer = vs
	ks, ok := k.services[vs]
	switch {
	case !ok:
		if err := p.h.IPVS.AddService(svc); err != nil {
			return fmt.Errorf("adding virtual server %s: %w", vs, err)
		}
		ks = &appliedService{svc: svc, dests: map[destKey]ipvs.Destination{}}
		k.services[vs] = ks
		st.svcAdded++
	case !sameService(ks.svc, svc):
		if err := p.h.IPVS.UpdateService(svc); err != nil {
			return fmt.Errorf("updating virtual server %s: %w", vs, err)
		}
		ks.svc = svc
		st.svcUpdated++
	}
	for _, r := range dv.Reals {
		dk := destKey{r.Addr.Unmap(), r.Port}
		r := ipvs.Destination{Addr: dk.addr, Port: dk.port, Weight: r.Weight}
		have, ok := ks.dests[dk]
		switch {
		case !ok:
			if err := p.h.IPVS.AddDestination(vs, r); err != nil {
				return fmt.Errorf("adding real server %s to %s: %w", netip.AddrPortFrom(dk.addr, dk.port), vs, err)
			}
			st.destAdded++
		case have.Weight != r.Weight:
			// Also an endpoint back during its graceful termination.
			if err := p.h.IPVS.UpdateDestination(vs, r); err != nil {
				return fmt.Errorf("updating real server %s of %s: %w", netip.AddrPortFrom(dk.addr, dk.port), vs, err)
			}
			st.destUpdated++
		default:
			continue // as it is: nothing to write or to remember
		}
		p.graceful.cancel(vs, dk)
		ks.dests[dk] = r
	}
	if len(ks.dests) <= len(dv.Reals) {
		// Every known real server is wanted (the wanted ones were all
		// found or added above; duplicates in Reals aside).
		return nil
	}
	wantDests := make(map[destKey]bool, len(dv.Reals))
	for _, r := range dv.Reals {
		wantDests[destKey{r.Addr.Unmap(), r.Port}] = true
	}
	for _, dk := range sortedDestKeys(ks.dests) {
		if wantDests[dk] {
			continue
		}
		deleted, err := p.graceful.remove(vs, ks.dests[dk], p.now())
		if err != nil {
			return err
		}
		if deleted {
			delete(ks.dests, dk)
			st.destDeleted++
		} else {
			ks.dests[dk] = ipvs.Destination{Addr: dk.addr, Port: dk.port, Weight: 0}
		}
	}
	return nil
}

func (p *Proxier) deleteService(vs ipvs.VirtualServer, st *stats) error {
	if err := p.h.IPVS.DeleteService(vs); err != nil && !isNotFound(err) {
		return fmt.Errorf("deleting virtual server %s: %w", vs, err)
	}
	p.graceful.forget(vs)
	delete(p.applied.services, vs)
	st.svcDeleted++
	return nil
}
