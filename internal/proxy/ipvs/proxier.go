package ipvs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/kernel/conntrack"
	"github.com/kproxy/kproxy/internal/kernel/ipset"
	"github.com/kproxy/kproxy/internal/kernel/ipvs"
	"github.com/kproxy/kproxy/internal/kernel/netdev"
	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy"
	"github.com/kproxy/kproxy/internal/proxy/udpflows"
)

// Protocol numbers of IPVS virtual servers.
const (
	protoTCP = 6
	protoUDP = 17
)

// RenderFunc turns one sync's request into what the kernel should hold
// (Render, with the proxier's configuration bound).
type RenderFunc func(req *proxy.Request, host Host) (*Plan, error)

// DefaultGracePeriod bounds graceful termination when not configured.
const DefaultGracePeriod = 15 * time.Minute

// Handles are the kernel interfaces one proxier works through.
type Handles struct {
	IPVS   ipvs.Handle
	IPSet  ipset.Handle
	NetDev netdev.Handle
	// IPTables is the family's iptables of the chosen backend.
	IPTables xtables.Interface
	// Conntrack clears stale UDP entries; nil: none are cleared.
	Conntrack conntrack.Interface
	// LocalAddrs lists the node's addresses on every interface but
	// kube-ipvs0 (Host.Addrs); nil: the Node's addresses stand in.
	LocalAddrs func() ([]netip.Addr, error)
}

// Proxier is the ipvs backend of one IP family. It keeps what it last
// applied (virtual and real servers, set members, addresses, iptables
// input) and reads the kernel again only on full syncs and after a
// failure, so that a partial sync costs what changed.
type Proxier struct {
	opts     Options
	renderer Renderer
	h        Handles

	mu sync.Mutex
	// applied is what the kernel holds of kproxy's, as of the end of the
	// last successful sync; nil: unknown, the next sync reads the kernel.
	applied *applied
	// iptables is the restore input last applied without its jump rule
	// insertions; nil: none or unknown.
	iptables []byte
	// host is what Render is told of the node, read at full syncs.
	host *Host
	// timeoutsSet: Options.Timeouts were applied.
	timeoutsSet bool
	graceful    *graceful
	now         func() time.Time
	// canonical caches set members in the kernel's text form, by type
	// and member as Render wrote it; setTypes are the sets of the last
	// full sync.
	canonical map[string]string
	setTypes  map[string]ipset.Set
}

var _ proxy.Backend = (*Proxier)(nil)

// NewProxier returns one family's proxier.
func NewProxier(opts Options, h Handles) (*Proxier, error) {
	rc := opts.Config
	if err := rc.Validate(); err != nil {
		return nil, err
	}
	return newProxier(opts, NewPartialRenderer(&rc), h), nil
}

// newProxier returns a proxier that asks renderer what the kernel should
// hold (tests give it others than NewProxier's).
func newProxier(opts Options, renderer Renderer, h Handles) *Proxier {
	if opts.GracePeriod <= 0 {
		opts.GracePeriod = DefaultGracePeriod
	}
	if opts.NodePortMin == 0 && opts.NodePortMax == 0 {
		opts.NodePortMin, opts.NodePortMax = 30000, 32767
	}
	p := &Proxier{opts: opts, renderer: renderer, h: h, now: time.Now}
	p.graceful = newGraceful(h.IPVS, h.Conntrack, opts.Family, opts.GracePeriod)
	return p
}

// Sync implements proxy.Backend.
func (p *Proxier) Sync(ctx context.Context, req *proxy.Request) (*proxy.Result, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	start := time.Now()
	full := req.Full || p.applied == nil || p.host == nil
	if full {
		p.applied, p.host = nil, nil
		h, err := p.readHost(ctx, req)
		if err != nil {
			return nil, err
		}
		p.host = h
	}
	if req.Trial {
		// IPVS and ipsets cannot be checked without being changed, and a
		// failing trial must leave the kernel alone: its iptables input
		// is checked (--test), nothing is applied.
		d, err := p.renderer.Render(req, *p.host)
		if err != nil {
			return nil, fmt.Errorf("rendering ipvs state: %w", err)
		}
		if err := p.h.IPTables.Restore(ctx, d.IPTables, xtables.RestoreOptions{NoFlush: true, Test: true}); err != nil {
			return nil, fmt.Errorf("iptables-restore --test of a trial: %w", err)
		}
		return &proxy.Result{}, nil
	}
	var partial *PartialPlan
	renderStart := time.Now()
	if !full {
		var err error
		if partial, err = p.renderer.RenderPartial(req, *p.host); err != nil {
			return nil, fmt.Errorf("rendering ipvs state: %w", err)
		}
	}
	var st stats
	var err error
	var res proxy.Result
	what := []any{"ipFamily", p.opts.Family, "full", req.Full}
	if partial != nil {
		what = append(what, "renderSeconds", time.Since(renderStart).Seconds(), "virtualServersTouched", len(partial.Services))
		st, err = p.applyPartial(ctx, partial)
		res = partial.Health
	} else {
		var d *Plan
		if d, err = p.renderer.RenderFull(req, *p.host); err != nil {
			return nil, fmt.Errorf("rendering ipvs state: %w", err)
		}
		what = append(what, "renderSeconds", time.Since(renderStart).Seconds())
		st, err = p.apply(ctx, d)
		res = d.Health
		what = append(what, "virtualServers", len(d.Services), "addresses", len(d.Addresses), "sets", len(d.Sets))
	}
	if err != nil {
		// Whatever we knew of the kernel may be wrong now: the next sync
		// reads it again and diffs everything.
		p.applied, p.host, p.iptables = nil, nil, nil
		return nil, err
	}
	for _, k := range p.graceful.run(p.now()) {
		if ks := p.applied.services[k.vs]; ks != nil {
			delete(ks.dests, k.dest)
		}
	}
	if req.Full {
		udpflows.Reconcile(p.h.Conntrack, p.opts.Family, req.State)
	}
	klog.V(2).InfoS("Applied ipvs state", append(what,
		"changes", st.changes(), "servicesAdded", st.svcAdded, "servicesDeleted", st.svcDeleted,
		"realServersAdded", st.destAdded, "realServersDeleted", st.destDeleted, "realServersTerminating", p.graceful.len(),
		"setMembersChanged", st.setChanged, "iptablesWritten", st.iptables, "seconds", time.Since(start).Seconds())...)
	// Terminating real servers are checked again at the next sync (at
	// least every syncPeriod), as upstream's graceful termination
	// manager checks them on its own period; CleanupPending would make
	// the loop sync back to back while a long connection lasts.
	return &res, nil
}

// stats counts what one sync changed.
type stats struct {
	svcAdded, svcUpdated, svcDeleted    int
	destAdded, destUpdated, destDeleted int
	addrAdded, addrDeleted, setChanged  int
	iptables                            bool
}

func (s stats) changes() int {
	n := s.svcAdded + s.svcUpdated + s.svcDeleted + s.destAdded + s.destUpdated + s.destDeleted + s.addrAdded + s.addrDeleted + s.setChanged
	if s.iptables {
		n++
	}
	return n
}

// builtinChains are the chains whose rules Host.Rules holds.
var builtinChains = sets.New("PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING")

// readHost reads what Render needs of the node: its addresses and the
// rules of the built-in chains (which jump rules are there).
func (p *Proxier) readHost(ctx context.Context, req *proxy.Request) (*Host, error) {
	h := &Host{Rules: map[string]sets.Set[string]{}}
	if p.h.LocalAddrs != nil {
		addrs, err := p.h.LocalAddrs()
		if err != nil {
			return nil, fmt.Errorf("reading the node's addresses: %w", err)
		}
		h.Addrs = addrs
	} else if req.Node != nil {
		h.Addrs = req.Node.Addresses
	}
	for _, table := range []string{TableNAT, TableFilter} {
		out, err := p.h.IPTables.Save(ctx, table)
		if err != nil {
			return nil, fmt.Errorf("reading the %s table: %w", table, err)
		}
		rules := sets.New[string]()
		for _, line := range strings.Split(string(out), "\n") {
			if f := strings.Fields(line); len(f) > 1 && f[0] == "-A" && builtinChains.Has(f[1]) {
				rules.Insert(strings.TrimSpace(line))
			}
		}
		h.Rules[table] = rules
	}
	return h, nil
}

// splitInserts returns the restore input without its "-I" lines (jump
// rules inserted into built-in chains) and whether it had any.
func splitInserts(data []byte) ([]byte, bool) {
	var out bytes.Buffer
	found := false
	for _, line := range bytes.SplitAfter(data, []byte("\n")) {
		if bytes.HasPrefix(line, []byte("-I ")) {
			found = true
			continue
		}
		out.Write(line)
	}
	return out.Bytes(), found
}

// read lists what the kernel holds of kproxy's for this family: the
// addresses on kube-ipvs0, the virtual servers kproxy owns with their
// real servers, and the members of the sets d names.
func (p *Proxier) read(d *Plan, services map[ipvs.VirtualServer]*VirtualServer) (*applied, error) {
	k := &applied{addrs: map[netip.Addr]bool{}, services: map[ipvs.VirtualServer]*appliedService{}, sets: map[string]map[string]bool{}}
	addrs, err := p.h.NetDev.Addresses(DummyDevice)
	if err != nil && !isNotFound(err) {
		return nil, fmt.Errorf("listing the addresses of %s: %w", DummyDevice, err)
	}
	for _, a := range addrs {
		if a = a.Unmap(); model.FamilyOf(a) == p.opts.Family {
			k.addrs[a] = true
		}
	}
	o := p.ownership(d.Addresses, services, k.addrs)
	svcs, err := p.h.IPVS.Services()
	if err != nil {
		return nil, fmt.Errorf("listing IPVS virtual servers: %w", err)
	}
	for _, s := range svcs {
		vs := key(s.VirtualServer)
		if !o.owns(vs) {
			continue
		}
		s.VirtualServer = vs
		ds, err := p.h.IPVS.Destinations(vs)
		if err != nil {
			return nil, fmt.Errorf("listing the real servers of %s: %w", vs, err)
		}
		ks := &appliedService{svc: s, dests: map[destKey]ipvs.Destination{}}
		for _, dst := range ds {
			ks.dests[destKey{dst.Addr.Unmap(), dst.Port}] = dst
		}
		k.services[vs] = ks
	}
	have, err := p.h.IPSet.Sets()
	if err != nil {
		return nil, fmt.Errorf("listing ipsets: %w", err)
	}
	for _, name := range have {
		if _, ok := d.Sets[name]; !ok {
			continue
		}
		es, err := p.h.IPSet.Entries(name)
		if err != nil {
			return nil, fmt.Errorf("listing ipset %s: %w", name, err)
		}
		m := map[string]bool{}
		s := d.Sets[name]
		for _, e := range es {
			if c, err := ipset.Canonical(s.Type, s.IPv6, e); err == nil {
				e = c
			}
			m[e] = true
		}
		k.sets[name] = m
	}
	return k, nil
}

// ownership decides, as upstream does by its addresses, which virtual
// servers are kproxy's: those on an address of kube-ipvs0 (now or
// wanted), and NodePort ones (a port in the node port range) on the node
// addresses kproxy puts NodePort virtual servers on. Others (another
// load balancer's on the host) and those in excludeCIDRs are left alone.
type ownership struct {
	p         *Proxier
	bound     map[netip.Addr]bool
	nodeAddrs map[netip.Addr]bool
}

func (p *Proxier) ownership(addrs []netip.Addr, services map[ipvs.VirtualServer]*VirtualServer, bound map[netip.Addr]bool) ownership {
	o := ownership{p: p, bound: map[netip.Addr]bool{}, nodeAddrs: map[netip.Addr]bool{}}
	for a := range bound {
		o.bound[a] = true
	}
	for _, a := range addrs {
		o.bound[a.Unmap()] = true
	}
	for vs := range services {
		if a := vs.Addr.Unmap(); !o.bound[a] {
			o.nodeAddrs[a] = true
		}
	}
	return o
}

func (o ownership) owns(vs ipvs.VirtualServer) bool {
	if vs.FWMark != 0 || !vs.Addr.IsValid() {
		return false
	}
	a := vs.Addr.Unmap()
	if model.FamilyOf(a) != o.p.opts.Family {
		return false
	}
	for _, c := range o.p.opts.ExcludeCIDRs {
		if c.Contains(a) {
			return false
		}
	}
	if o.bound[a] {
		return true
	}
	return o.nodeAddrs[a] && vs.Port >= o.p.opts.NodePortMin && vs.Port <= o.p.opts.NodePortMax
}

// sameService compares what kproxy sets (FlagHashed is the kernel's).
func sameService(a, b ipvs.Service) bool {
	return a.Scheduler == b.Scheduler && a.Flags&^ipvs.FlagHashed == b.Flags&^ipvs.FlagHashed && a.Timeout == b.Timeout
}

// isNotFound: the object is gone already, which is what was wanted
// (IPVS answers ESRCH for a virtual server, ENOENT for a real server).
func isNotFound(err error) bool {
	return errors.Is(err, syscall.ESRCH) || errors.Is(err, syscall.ENOENT) ||
		errors.Is(err, netdev.ErrNoLink) || errors.Is(err, netdev.ErrNoAddr) || errors.Is(err, ipset.ErrNoEntry)
}

// key is a virtual server as the proxier compares them: the family
// follows the address (the kernel reports it, Render may not set it).
func key(vs ipvs.VirtualServer) ipvs.VirtualServer {
	if !vs.Addr.IsValid() {
		return vs // a firewall mark service: never kproxy's
	}
	vs.Addr = vs.Addr.Unmap()
	if vs.Addr.Is4() {
		vs.Family = syscall.AF_INET
	} else {
		vs.Family = syscall.AF_INET6
	}
	return vs
}

func sortedAddrs(m map[netip.Addr]bool) []netip.Addr {
	out := make([]netip.Addr, 0, len(m))
	for a := range m {
		out = append(out, a)
	}
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func sortedServices[V any](m map[ipvs.VirtualServer]V) []ipvs.VirtualServer {
	out := make([]ipvs.VirtualServer, 0, len(m))
	for vs := range m {
		out = append(out, vs)
	}
	slices.SortFunc(out, compareServices)
	return out
}

func compareServices(a, b ipvs.VirtualServer) int {
	if c := a.Addr.Compare(b.Addr); c != 0 {
		return c
	}
	if a.Protocol != b.Protocol {
		return int(a.Protocol) - int(b.Protocol)
	}
	return int(a.Port) - int(b.Port)
}

func sortedDestKeys(m map[destKey]ipvs.Destination) []destKey {
	out := make([]destKey, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b destKey) int {
		if c := a.addr.Compare(b.addr); c != 0 {
			return c
		}
		return int(a.port) - int(b.port)
	})
	return out
}

// canonicalEntries writes every wanted member as the kernel lists it, so
// that they compare as text. Members seen at the last sync are not parsed
// again.
func (p *Proxier) canonicalEntries(sets map[string]*Set) (map[string][]string, error) {
	out := make(map[string][]string, len(sets))
	seen := make(map[string]string, len(p.canonical))
	p.setTypes = make(map[string]ipset.Set, len(sets))
	for name, s := range sets {
		p.setTypes[name] = s.Set
		if s.Name != name {
			return nil, fmt.Errorf("ipset %q is listed under the name %q", s.Name, name)
		}
		es := make([]string, 0, len(s.Entries))
		for _, e := range s.Entries {
			k := s.Type + " " + e
			c, ok := p.canonical[k]
			if !ok {
				var err error
				if c, err = ipset.Canonical(s.Type, s.IPv6, e); err != nil {
					return nil, fmt.Errorf("ipset %s: %w", name, err)
				}
			}
			seen[k] = c
			es = append(es, c)
		}
		out[name] = es
	}
	p.canonical = seen
	return out, nil
}

// canonicalEntry writes one member of a known set as the kernel lists
// it (partial syncs).
func (p *Proxier) canonicalEntry(name, e string) (string, error) {
	t, ok := p.setTypes[name]
	if !ok {
		return "", fmt.Errorf("ipset %s: type unknown", name)
	}
	ck := t.Type + " " + e
	if c, ok := p.canonical[ck]; ok {
		return c, nil
	}
	if p.canonical == nil {
		p.canonical = map[string]string{}
	}
	c, err := ipset.Canonical(t.Type, t.IPv6, e)
	if err != nil {
		return "", fmt.Errorf("ipset %s: %w", name, err)
	}
	p.canonical[ck] = c
	return c, nil
}
