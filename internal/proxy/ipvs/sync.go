package ipvs

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kproxy/kproxy/internal/kernel/ipvs"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy"
	"github.com/kproxy/kproxy/internal/proxy/tally"
)

// composer counts every service port's share into what the family
// wants: each virtual server with the service ports claiming it, each
// set member, kube-ipvs0 address and LB triple with the number of shares
// holding it. Replacing one share (partialPlan) then says exactly which
// objects appear or go, in time that follows the share, not the cluster.
type composer struct {
	r      *renderer
	shares map[model.ServicePortName]*share
	// services are the virtual servers by key, the first claimant's in
	// name order (the model resolves such conflicts; one that slips
	// through is decided as a whole render would); claims are the
	// service ports claiming each, in name order.
	services map[ipvs.VirtualServer]*VirtualServer
	claims   map[ipvs.VirtualServer][]model.ServicePortName
	// entries counts set members by upstream's (IPv4) set name.
	entries map[string]map[string]int
	bind    map[netip.Addr]int
	lb      map[lbEntry]int
	// health sums the shares' figures: the sync's report to the loop.
	health tally.Tally
}

// newComposer renders every service port of state.
func newComposer(cfg *Config, state *model.State, node *model.Node, host Host) (*composer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if state.Family != "" && state.Family != cfg.Family {
		return nil, fmt.Errorf("ipvs: state of family %s rendered for %s", state.Family, cfg.Family)
	}
	r, err := newRenderer(cfg, node, host)
	if err != nil {
		return nil, err
	}
	c := &composer{
		r:        r,
		shares:   make(map[model.ServicePortName]*share, len(state.Services)),
		services: make(map[ipvs.VirtualServer]*VirtualServer, len(state.Services)),
		claims:   make(map[ipvs.VirtualServer][]model.ServicePortName, len(state.Services)),
		entries:  make(map[string]map[string]int, len(setInfo)),
		bind:     make(map[netip.Addr]int, len(state.Services)),
		lb:       map[lbEntry]int{},
	}
	for _, s := range setInfo {
		c.entries[s.name] = map[string]int{}
	}
	// Name order: the first claimant of a virtual server keeps it.
	for _, n := range state.SortedNames() {
		if sh := r.servicePort(state, state.Services[n]); sh != nil {
			c.shares[n] = sh
			c.count(n, sh, 1, nil)
		}
	}
	return c, nil
}

// touched collects what one update may have changed: virtual server
// keys, and set members, addresses and LB triples with whether each was
// wanted before the update.
type touched struct {
	services map[ipvs.VirtualServer]bool
	entries  map[setEntry]bool
	bind     map[netip.Addr]bool
	lb       bool
}

// count adds (n = 1) or removes (n = -1) the share of service port
// name; t, when not nil, records what it touched.
func (c *composer) count(name model.ServicePortName, sh *share, n int, t *touched) {
	if n > 0 {
		c.health.Add(name, sh.health)
	} else {
		c.health.Remove(name, sh.health)
	}
	for _, vs := range sh.services {
		k := vs.VirtualServer
		if t != nil {
			t.services[k] = true
		}
		claims := c.claims[k]
		i, found := slices.BinarySearchFunc(claims, name, model.ServicePortName.Compare)
		switch {
		case n > 0 && !found:
			claims = slices.Insert(claims, i, name)
		case n < 0 && found:
			claims = slices.Delete(claims, i, i+1)
		}
		switch {
		case len(claims) == 0:
			delete(c.claims, k)
			delete(c.services, k)
			continue
		case claims[0] == name && n > 0:
			c.services[k] = vs
		case i == 0 && n < 0:
			// The winner went: the next claimant's virtual server.
			c.services[k] = c.shares[claims[0]].service(k)
		}
		c.claims[k] = claims
	}
	for _, e := range sh.entries {
		m := c.entries[e.set]
		if t != nil {
			if _, ok := t.entries[e]; !ok {
				t.entries[e] = m[e.member] > 0
			}
		}
		if m[e.member] += n; m[e.member] <= 0 {
			delete(m, e.member)
		}
	}
	for _, a := range sh.bind {
		if t != nil {
			if _, ok := t.bind[a]; !ok {
				t.bind[a] = c.bind[a] > 0
			}
		}
		if c.bind[a] += n; c.bind[a] <= 0 {
			delete(c.bind, a)
		}
	}
	for _, e := range sh.lbNoNodeAccess {
		before := c.lb[e] > 0
		if c.lb[e] += n; c.lb[e] <= 0 {
			delete(c.lb, e)
		}
		if t != nil && before != (c.lb[e] > 0) {
			t.lb = true
		}
	}
}

// service is the share's virtual server of key k.
func (sh *share) service(k ipvs.VirtualServer) *VirtualServer {
	for _, vs := range sh.services {
		if vs.VirtualServer == k {
			return vs
		}
	}
	return nil
}

func (c *composer) empty(set string) bool {
	if set == SetIPVSIPs {
		return len(c.bind) == 0
	}
	return len(c.entries[set]) == 0
}

func (c *composer) noNodeAccess() []lbEntry {
	out := make([]lbEntry, 0, len(c.lb))
	for e := range c.lb {
		out = append(out, e)
	}
	return out
}

func compareLB(a, b lbEntry) int {
	return cmp.Or(a.ip.Compare(b.ip), cmp.Compare(a.proto, b.proto), cmp.Compare(a.port, b.port))
}

// plan writes out everything the family wants.
func (c *composer) plan(present map[string]sets.Set[string]) *Plan {
	d := &Plan{
		Services: make(map[ipvs.VirtualServer]*VirtualServer, len(c.services)),
		Sets:     map[string]*Set{},
	}
	for k, vs := range c.services {
		d.Services[k] = vs
	}
	d.Addresses = make([]netip.Addr, 0, len(c.bind))
	for a := range c.bind {
		d.Addresses = append(d.Addresses, a)
	}
	slices.SortFunc(d.Addresses, netip.Addr.Compare)
	for _, def := range SetDefinitions(c.r.ipv6) {
		d.Sets[def.Name] = &Set{Set: def}
	}
	for _, s := range setInfo {
		var e []string
		if s.name == SetIPVSIPs {
			e = make([]string, 0, len(d.Addresses))
			for _, a := range d.Addresses {
				e = append(e, a.String())
			}
			slices.Sort(e)
		} else {
			e = make([]string, 0, len(c.entries[s.name]))
			for m := range c.entries[s.name] {
				e = append(e, m)
			}
			slices.Sort(e)
		}
		d.Sets[SetName(s.name, c.r.ipv6)].Entries = e
	}
	d.IPTables = c.r.iptables(c.empty, c.noNodeAccess(), present)
	d.Health = c.health.Result()
	return d
}

// partialPlan renders the service ports of names again against state
// and returns the difference.
func (c *composer) partialPlan(state *model.State, names sets.Set[model.ServicePortName], present map[string]sets.Set[string]) *PartialPlan {
	t := &touched{services: map[ipvs.VirtualServer]bool{}, entries: map[setEntry]bool{}, bind: map[netip.Addr]bool{}}
	wasEmpty := map[string]bool{}
	for _, s := range setInfo {
		wasEmpty[s.name] = c.empty(s.name)
	}
	for n := range names {
		if old := c.shares[n]; old != nil {
			delete(c.shares, n)
			c.count(n, old, -1, t)
		}
		sp := state.Services[n]
		if sp == nil {
			continue
		}
		if sh := c.r.servicePort(state, sp); sh != nil {
			c.shares[n] = sh
			c.count(n, sh, 1, t)
		}
	}
	d := &PartialPlan{Services: make(map[ipvs.VirtualServer]*VirtualServer, len(t.services)),
		AddEntries: map[string][]string{}, DelEntries: map[string][]string{}}
	for k := range t.services {
		d.Services[k] = c.services[k] // nil when gone
	}
	for e, before := range t.entries {
		now := c.entries[e.set][e.member] > 0
		name := SetName(e.set, c.r.ipv6)
		switch {
		case now && !before:
			d.AddEntries[name] = append(d.AddEntries[name], e.member)
		case before && !now:
			d.DelEntries[name] = append(d.DelEntries[name], e.member)
		}
	}
	ipvsIPs := SetName(SetIPVSIPs, c.r.ipv6)
	for a, before := range t.bind {
		switch now := c.bind[a] > 0; {
		case now && !before:
			d.AddAddrs = append(d.AddAddrs, a)
			d.AddEntries[ipvsIPs] = append(d.AddEntries[ipvsIPs], a.String())
		case before && !now:
			d.DelAddrs = append(d.DelAddrs, a)
			d.DelEntries[ipvsIPs] = append(d.DelEntries[ipvsIPs], a.String())
		}
	}
	for _, m := range []map[string][]string{d.AddEntries, d.DelEntries} {
		for _, e := range m {
			slices.Sort(e)
		}
	}
	slices.SortFunc(d.AddAddrs, netip.Addr.Compare)
	slices.SortFunc(d.DelAddrs, netip.Addr.Compare)
	flipped := t.lb
	for _, s := range setInfo {
		flipped = flipped || wasEmpty[s.name] != c.empty(s.name)
	}
	if flipped {
		d.IPTables = c.r.iptables(c.empty, c.noNodeAccess(), present)
	}
	d.Health = c.health.Result()
	return d
}

// Renderer turns sync requests into the plans the proxier applies.
type Renderer interface {
	// Render renders everything the kernel should hold for req and
	// changes nothing of the renderer's (trials).
	Render(req *proxy.Request, host Host) (*Plan, error)
	// RenderFull renders everything, and is what the next RenderPartial
	// diffs against (full syncs).
	RenderFull(req *proxy.Request, host Host) (*Plan, error)
	// RenderPartial renders req.Changed again and returns what differs
	// since the last RenderFull or RenderPartial; nil, nil: it cannot
	// (no RenderFull yet), render in full.
	RenderPartial(req *proxy.Request, host Host) (*PartialPlan, error)
}

// PartialRenderer is the Renderer of kproxy's ipvs mode: a full render
// at full syncs, and only the changed service ports at partial ones.
type PartialRenderer struct {
	cfg *Config
	c   *composer
}

// NewPartialRenderer returns the Renderer for one family's configuration.
func NewPartialRenderer(cfg *Config) *PartialRenderer { return &PartialRenderer{cfg: cfg} }

// Render implements Renderer.
func (p *PartialRenderer) Render(req *proxy.Request, host Host) (*Plan, error) {
	return Render(p.cfg, req.State, req.Node, host)
}

// RenderFull implements Renderer.
func (p *PartialRenderer) RenderFull(req *proxy.Request, host Host) (*Plan, error) {
	p.c = nil
	c, err := newComposer(p.cfg, req.State, req.Node, host)
	if err != nil {
		return nil, err
	}
	p.c = c
	return c.plan(host.Rules), nil
}

// RenderPartial implements Renderer.
func (p *PartialRenderer) RenderPartial(req *proxy.Request, host Host) (*PartialPlan, error) {
	if p.c == nil {
		return nil, nil
	}
	return p.c.partialPlan(req.State, req.Changed, host.Rules), nil
}

// FullRenderer is a Renderer that renders everything at every sync with
// the function (tests, and any render that cannot say what changed).
type FullRenderer RenderFunc

// Render implements Renderer.
func (w FullRenderer) Render(req *proxy.Request, host Host) (*Plan, error) { return w(req, host) }

// RenderFull implements Renderer.
func (w FullRenderer) RenderFull(req *proxy.Request, host Host) (*Plan, error) { return w(req, host) }

// RenderPartial implements Renderer: never.
func (w FullRenderer) RenderPartial(*proxy.Request, Host) (*PartialPlan, error) { return nil, nil }
