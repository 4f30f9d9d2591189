package iptables

import (
	"bytes"
	"github.com/kproxy/kproxy/internal/proxy/udpflows"
	"hash/maphash"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy/localdetect"
)

var newline = []byte{'\n'}

// largeClusterEndpointsThreshold: above this many endpoints in total the
// per-endpoint rules carry no comment ("large cluster mode", upstream's
// figure). Comments are 256 bytes each in the kernel's rule blob; dropping
// them makes a legacy table replace ~40% cheaper.
const largeClusterEndpointsThreshold = 1000

// LocalDetector tells traffic from local pods apart from other traffic, per
// detectLocalMode (see package localdetect).
type LocalDetector = localdetect.IPTables

// Config is what shapes the rules besides the services themselves. A
// change of Config needs a full sync.
type Config struct {
	Family         v1.IPFamily
	MasqueradeMark string // "0x00004000"
	MasqueradeAll  bool
	RandomFully    bool
	// ConntrackTCPBeLiberal leaves out the INVALID drop in KUBE-FORWARD.
	ConntrackTCPBeLiberal bool
	LocalDetector         LocalDetector
	// NodeIP is the node's primary IP of this family (LB source ranges).
	NodeIP netip.Addr
	// NodePortAllLocal: node ports answer on every local address
	// ("addrtype --dst-type LOCAL"); else on NodePortIPs only.
	NodePortAllLocal bool
	NodePortIPs      []netip.Addr
	// LocalhostNodePorts: IPv4 node ports answer on 127.0.0.0/8 too, and
	// KUBE-FIREWALL guards it.
	LocalhostNodePorts bool
	// CountInvalidDropped and CountLocalhostNodePorts: the nfacct counters
	// NFAcctInvalidDropped and NFAcctLocalhostNodePorts exist (the proxier
	// created them), so the INVALID drop and the localhost node port
	// rules count in them, as upstream's (the kernel refuses a rule that
	// names a missing counter).
	CountInvalidDropped     bool
	CountLocalhostNodePorts bool
	// MaxChainsPerRestore > 0 splits a sync into several restores of at
	// most about this many chains each (see DefaultMaxChainsPerRestore).
	MaxChainsPerRestore int
	// Compact: no KUBE-SEP chains (see Options.CompactLayout).
	Compact bool
}

func (c *Config) ipv6() bool { return c.Family == model.IPv6 }

// Input is one sync's view of the world.
type Input struct {
	State    *model.State
	NodeName string
	Zone     string
	// Changed are the service ports to re-render in a partial sync.
	Changed sets.Set[model.ServicePortName]
	// Full rewrites every chain. Existing, read from the kernel just
	// before, says which chains and jump rules are there; nil means the
	// kernel holds what Applied says (or nothing, before the first sync).
	Full     bool
	Existing *Existing
}

// Existing is what iptables-save showed of the kernel before a full sync.
type Existing struct {
	// NATChains are the chains of the nat table (per-service chains not
	// in use any more are deleted).
	NATChains []string
	// Rules are the rule lines of the built-in chains by table, as
	// iptables-save prints them ("-A INPUT ..."): jump rules already
	// there are not added again.
	Rules map[string]sets.Set[string]
}

// ServiceStats are per-service-port figures consumers need after a sync.
type ServiceStats struct {
	LocalEndpoints      int
	HealthCheckNodePort int32
	// NoLocalInternal/External: traffic policy Local with no local
	// endpoint (sync_proxy_rules_no_local_endpoints_total).
	NoLocalInternal, NoLocalExternal bool
}

// StaleUDP is a service port (as it was rendered) and endpoints it lost.
type StaleUDP = udpflows.Stale

// Applied is what the last successful sync left in the kernel. Render reads
// it; only Plan.Commit changes it, after the kernel accepted the plan.
type Applied struct {
	synced   bool
	services map[model.ServicePortName]*svcApplied
	// healthChecked holds the service ports with a health check node
	// port; noLocal counts Local policies without local endpoints.
	healthChecked map[model.ServicePortName]ServiceStats
	noLocalInt    int
	noLocalExt    int
	// Rules kproxy owns per table: the fixed ones of the last full sync
	// plus every service port's.
	fixedNAT, fixedFilter int
	natRules, filterRules int
}

// Rules returns how many rules kproxy owns in the nat and filter tables
// (sync_proxy_rules_iptables_total).
func (a *Applied) Rules() (nat, filter int) {
	return a.fixedNAT + a.natRules, a.fixedFilter + a.filterRules
}

// NewApplied returns the state of a kernel kproxy has not written yet.
func NewApplied() *Applied {
	return &Applied{services: map[model.ServicePortName]*svcApplied{}, healthChecked: map[model.ServicePortName]ServiceStats{}}
}

type svcApplied struct {
	sp *model.ServicePort
	// chains are the service port's own nat chains and a hash of their
	// rules: a partial sync rewrites only chains whose rules changed.
	chains []chainState
	// shared are its rules in the shared chains (KUBE-SERVICES...):
	// a partial sync deletes the ones that went by their exact text.
	shared []sharedRule
	// reachable are the endpoints traffic may be sent to (conntrack).
	reachable []*model.Endpoint
	stats     ServiceStats
	// natRules and filterRules count its rules in each table.
	natRules, filterRules int
}

type chainState struct {
	name string
	hash uint64
}

// sharedRule is a rule in one of the shared chains: spec is what follows
// "-A CHAIN ".
type sharedRule struct {
	table, chain, spec string
}

// Plan is a rendered sync: the iptables-restore inputs and how Applied
// changes once they are applied.
type Plan struct {
	// Restores are the inputs of iptables-restore --noflush, in order.
	// Usually one; a sync that touches more than MaxChainsPerRestore
	// chains is split: first the service ports' own chains (each chunk
	// holds whole service ports, so what the shared chains jump to is
	// always complete), then the shared chains, then the deletion of
	// stale chains. Applying a prefix leaves a working ruleset.
	Restores [][]byte
	Full     bool
	// StaleUDP are UDP endpoints no longer reachable through a service
	// port: conntrack entries that DNAT to them must go once applied.
	StaleUDP []StaleUDP
	// NewlyServedUDP are UDP service ports that had no endpoints and now
	// have some: conntrack entries for their IPs (cached rejects) must go.
	NewlyServedUDP []*model.ServicePort
	// Stats of this sync for logs and metrics.
	ServicePorts, Endpoints      int
	NATRules, FilterRules        int
	ChainsWritten, ChainsDeleted int

	services              map[model.ServicePortName]*svcApplied // nil value: gone
	fixedNAT, fixedFilter int
}

// Text joins the restores, each preceded by a comment line when there
// are several (iptables-restore ignores lines starting with '#').
func (p *Plan) Text() string {
	if len(p.Restores) == 1 {
		return string(p.Restores[0])
	}
	var b strings.Builder
	for i, r := range p.Restores {
		b.WriteString("# iptables-restore --noflush, run " + strconv.Itoa(i+1) + " of " + strconv.Itoa(len(p.Restores)) + "\n")
		b.Write(r)
	}
	return b.String()
}

// Commit records the plan as applied.
func (p *Plan) Commit(a *Applied) {
	if p.Full {
		a.services = make(map[model.ServicePortName]*svcApplied, len(p.services))
		a.healthChecked = map[model.ServicePortName]ServiceStats{}
		a.noLocalInt, a.noLocalExt = 0, 0
		a.natRules, a.filterRules = 0, 0
		a.fixedNAT, a.fixedFilter = p.fixedNAT, p.fixedFilter
	}
	a.synced = true
	for n, s := range p.services {
		if old, ok := a.services[n]; ok {
			a.count(n, old, -1)
		}
		if s == nil {
			delete(a.services, n)
			continue
		}
		a.services[n] = s
		a.count(n, s, 1)
	}
}

func (a *Applied) count(n model.ServicePortName, s *svcApplied, sign int) {
	st := s.stats
	a.natRules += sign * s.natRules
	a.filterRules += sign * s.filterRules
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

// chains returns the names of every own chain of every service port.
func (a *Applied) chains() sets.Set[string] {
	out := sets.New[string]()
	for _, s := range a.services {
		for _, c := range s.chains {
			out.Insert(c.name)
		}
	}
	return out
}

// jumpRule hooks a kproxy chain into a built-in chain. line is written
// exactly as iptables-save prints the rule, so that the rules already in
// the kernel are recognised by text.
type jumpRule struct {
	table, chain, line string
}

// jumpRules are upstream's iptablesJumpChains, in its order: each missing
// one is inserted at the head of its built-in chain, so a fresh node ends
// up with upstream's order.
var jumpRules = []jumpRule{
	{tableFilter, "INPUT", `-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES`},
	{tableFilter, "FORWARD", `-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES`},
	{tableFilter, "INPUT", `-A INPUT -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS`},
	{tableFilter, "FORWARD", `-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`},
	{tableFilter, "OUTPUT", `-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`},
	{tableFilter, "FORWARD", `-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD`},
	{tableFilter, "INPUT", `-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL`},
	{tableFilter, "OUTPUT", `-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL`},
	{tableFilter, "FORWARD", `-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL`},
	{tableNAT, "OUTPUT", `-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`},
	{tableNAT, "PREROUTING", `-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`},
	{tableNAT, "POSTROUTING", `-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING`},
}

// kubeletJumpRules hook the anti-martian chain, written only with
// localhost node ports (the kubelet keeps its own copy either way).
var kubeletJumpRules = []jumpRule{
	{tableFilter, "INPUT", `-A INPUT -j KUBE-FIREWALL`},
	{tableFilter, "OUTPUT", `-A OUTPUT -j KUBE-FIREWALL`},
}

// JumpRuleLines lists the jump rules from built-in chains by table as
// iptables-save prints them (for tests and the kernel test).
func JumpRuleLines(localhostNodePorts bool) map[string][]string {
	out := map[string][]string{}
	rules := jumpRules
	if localhostNodePorts {
		rules = append(slices.Clone(rules), kubeletJumpRules...)
	}
	for _, j := range rules {
		out[j.table] = append(out[j.table], j.line)
	}
	return out
}

// renderer holds one Render call's work.
type renderer struct {
	cfg  *Config
	in   *Input
	last *Applied
	plan *Plan
	// large is large cluster mode: no comments on per-endpoint rules.
	large bool
	// buf is scratch space for one shared rule's text.
	buf []byte
	// cw holds the own chains of the service port being rendered;
	// epChains its endpoints' chain names.
	cw       chainWriter
	epChains []epChain
}

// Render turns a sync's input and what the kernel holds into a plan. It is
// pure: it reads no clock, runs nothing and changes neither argument.
func Render(cfg *Config, in *Input, last *Applied) *Plan {
	r := &renderer{
		cfg:  cfg,
		in:   in,
		last: last,
		plan: &Plan{Full: in.Full, services: map[model.ServicePortName]*svcApplied{}},
	}
	total := 0
	for n := range in.State.Services {
		total += len(in.State.Endpoints[n])
	}
	r.large = total > largeClusterEndpointsThreshold
	r.plan.ServicePorts, r.plan.Endpoints = len(in.State.Services), total
	if in.Full {
		r.renderFull()
	} else {
		r.renderPartial()
	}
	return r.plan
}

// out collects the pieces of a sync before they are put into restores.
type out struct {
	// own are the service ports' own chains to (re)write: all of them for
	// the main restore, or (split) the chunk being filled; chunks are
	// the finished chunk restores. A chunk never splits a service port.
	own       chunk
	chunks    [][]byte
	split     bool
	max       int
	ownChains int
	// stale are per-service chains to flush and delete.
	stale []string
	// Shared chain edits and the fixed parts (full syncs).
	filterChains, natChains []string // chain lines of fixed chains (full)
	filterHead, natHead     []byte   // jump inserts and fixed rules, before the services' rules
	natPre                  []byte   // services' rules in KUBE-POSTROUTING (compact layout), before natHead
	filterRules, natRules   []byte   // services' shared rules (full: "-A"; partial: "-D" then "-I"/"-A")
	filterTail, natTail     []byte   // fixed rules after the services' rules
	mangle                  []byte
	filterN, natN           int // rule lines written
	// prelude opens a split full sync: the fixed chains that service
	// ports' own chains jump to, which a fresh node does not have yet.
	// Only KUBE-MARK-MASQ: declaring KUBE-SERVICES this early would
	// flush it while the old per-service chains are still in use.
	prelude []byte
}

type chunk struct {
	lines, rules []byte
	chains       int
}

// addOwn takes the chains of the service port just rendered that pick
// selects (all when nil).
func (o *out) addOwn(w *chainWriter, pick func(i int) bool) {
	n := 0
	for i := range w.chains {
		if pick == nil || pick(i) {
			n++
		}
	}
	if n == 0 {
		return
	}
	if o.split && o.own.chains > 0 && o.own.chains+n > o.max {
		o.flushChunk()
	}
	for i, c := range w.chains {
		if pick == nil || pick(i) {
			o.own.lines = appendChainLine(o.own.lines, c.name)
			o.own.rules = append(o.own.rules, w.rules(i)...)
		}
	}
	o.own.chains += n
	o.ownChains += n
}

// flushChunk turns the chunk being filled into a restore of its own.
func (o *out) flushChunk() {
	if o.own.chains == 0 {
		return
	}
	b := make([]byte, 0, len(o.own.lines)+len(o.own.rules)+len("*nat\nCOMMIT\n"))
	b = append(b, "*nat\n"...)
	b = append(b, o.own.lines...)
	b = append(b, o.own.rules...)
	b = append(b, "COMMIT\n"...)
	o.chunks = append(o.chunks, b)
	o.own.lines, o.own.rules, o.own.chains = o.own.lines[:0], o.own.rules[:0], 0
}

// setSplit decides, from an estimate of the chains a sync writes (one or
// two per service port, one per endpoint), whether it is split.
func (o *out) setSplit(cfg *Config, chains int) {
	o.max = cfg.MaxChainsPerRestore
	o.split = o.max > 0 && chains > o.max
}

func (r *renderer) renderFull() {
	o := &out{}
	cfg := r.cfg
	mark := cfg.MasqueradeMark

	o.mangle = []byte("*mangle\n:" + chainIPTablesHint + " - [0:0]\n:" + chainCanary + " - [0:0]\nCOMMIT\n")

	o.filterChains = []string{chainServices, chainExternalServices, chainForward, chainNodePorts, chainProxyFirewall}
	o.natChains = []string{chainServices, chainNodePorts, chainPostrouting, chainMarkMasq}
	jumps := jumpRules
	if cfg.LocalhostNodePorts {
		o.filterChains = append(o.filterChains, chainKubeletFirewall)
		jumps = append(slices.Clone(jumps), kubeletJumpRules...)
	}
	o.filterChains = append(o.filterChains, chainCanary)
	o.natChains = append(o.natChains, chainCanary)

	for _, j := range jumps {
		if r.jumpExists(j) {
			continue
		}
		line := "-I " + j.chain + " 1" + strings.TrimPrefix(j.line, "-A "+j.chain) + "\n"
		if j.table == tableFilter {
			o.filterHead = append(o.filterHead, line...)
			o.filterN++
		} else {
			o.natHead = append(o.natHead, line...)
			o.natN++
		}
	}
	if cfg.LocalhostNodePorts {
		// Upstream's copy of the kubelet's rule (CVE-2020-8558): with
		// route_localnet=1 the node would accept packets to 127.0.0.0/8
		// from other hosts; only DNATed (node port) ones may pass.
		o.filterHead = append(o.filterHead, `-A KUBE-FIREWALL -m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP`+"\n"...)
		o.filterN++
	}
	o.natHead = append(o.natHead, "-A KUBE-POSTROUTING -m mark ! --mark "+mark+"/"+mark+" -j RETURN\n"...)
	// Clear the mark so that a packet re-entering the stack (a tunnel)
	// is not masqueraded twice.
	o.natHead = append(o.natHead, "-A KUBE-POSTROUTING -j MARK --xor-mark "+mark+"\n"...)
	masq := `-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE`
	if cfg.RandomFully {
		masq += " --random-fully"
	}
	o.natHead = append(o.natHead, masq+"\n"...)
	markRule := "-A KUBE-MARK-MASQ -j MARK --or-mark " + mark + "\n"
	o.natHead = append(o.natHead, markRule...)
	o.natN += 4
	o.prelude = []byte("*nat\n:" + chainMarkMasq + " - [0:0]\n" + markRule + "COMMIT\n")

	// Fixed rules (jump inserts are in built-in chains, not ours).
	r.plan.fixedNAT, r.plan.fixedFilter = 4+1, 3
	if cfg.ConntrackTCPBeLiberal {
		r.plan.fixedFilter--
	}
	if cfg.LocalhostNodePorts {
		r.plan.fixedFilter++
	}
	if !cfg.NodePortAllLocal {
		r.plan.fixedNAT += len(cfg.NodePortIPs) - 1
	}
	names := r.in.State.SortedNames()
	o.setSplit(cfg, 2*len(names)+r.plan.Endpoints)
	if !o.split {
		// About 330 bytes of rules per endpoint, 400 per service port.
		o.own.rules = make([]byte, 0, 330*r.plan.Endpoints+400*len(names))
		o.own.lines = make([]byte, 0, 26*(2*len(names)+r.plan.Endpoints))
	}
	active := make(sets.Set[string], 2*len(names)+r.plan.Endpoints)
	r.plan.services = make(map[model.ServicePortName]*svcApplied, len(names))
	for _, n := range names {
		s := r.describe(n)
		for _, sr := range s.shared {
			if sr.table == tableFilter {
				o.filterRules = appendRuleLine(o.filterRules, "-A", sr)
				o.filterN++
			} else if sr.chain == chainPostrouting {
				// Before the "not marked: RETURN" rule.
				o.natPre = appendRuleLine(o.natPre, "-A", sr)
				o.natN++
			} else {
				o.natRules = appendRuleLine(o.natRules, "-A", sr)
				o.natN++
			}
		}
		for _, c := range r.cw.chains {
			active.Insert(c.name)
		}
		o.addOwn(&r.cw, nil)
		r.plan.services[n] = s
		r.udpChanges(n, s, r.last.services[n], true)
	}
	// UDP service ports gone since the last sync lose their flows too.
	for n, old := range r.last.services {
		if _, ok := r.in.State.Services[n]; !ok {
			r.udpGone(old)
		}
	}
	slices.SortFunc(r.plan.StaleUDP, func(a, b StaleUDP) int { return a.Service.Name.Compare(b.Service.Name) })

	// Chains of ours that no service uses any more: found in the kernel,
	// or known from the last sync when the kernel was not read.
	var existing []string
	if r.in.Existing != nil {
		existing = r.in.Existing.NATChains
	} else {
		existing = sets.List(r.last.chains())
	}
	for _, c := range existing {
		if isServiceChain(c) && !active.Has(c) {
			o.stale = append(o.stale, c)
		}
	}

	if !cfg.ConntrackTCPBeLiberal {
		// Packets conntrack considers INVALID (out of window) would reach
		// a pod un-DNATed and get reset (kubernetes#74839).
		if cfg.CountInvalidDropped {
			o.filterTail = append(o.filterTail, "-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name "+NFAcctInvalidDropped+" -j DROP\n"...)
		} else {
			o.filterTail = append(o.filterTail, "-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP\n"...)
		}
		o.filterN++
	}
	// Forward what was marked for masquerade, whatever FORWARD's policy.
	o.filterTail = append(o.filterTail, `-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark `+mark+"/"+mark+" -j ACCEPT\n"...)
	o.filterTail = append(o.filterTail, `-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT`+"\n"...)
	o.filterN += 2
	o.natTail = r.nodePortsJump(o.natTail)
	o.natN += bytes.Count(o.natTail, newline)
	r.assemble(o)
}

// jumpExists reports whether a jump rule is in its built-in chain. A rule
// of that chain with the same target and comment counts, whatever else it
// matches: iptables versions print rules a little differently, and an old
// kube-proxy's variant (without the conntrack match) does the same job.
// Adding ours beside it on every full sync would pile up copies.
func (r *renderer) jumpExists(j jumpRule) bool {
	if r.in.Existing == nil {
		// Trust the last sync: it added every missing jump rule.
		return r.last.synced
	}
	rules := r.in.Existing.Rules[j.table]
	if rules.Has(j.line) {
		return true
	}
	want := jumpKeyOf(j.line)
	for l := range rules {
		if jumpKeyOf(l) == want {
			return true
		}
	}
	return false
}

type jumpKey struct{ chain, target, comment string }

// jumpKeyOf reads chain, jump target and comment of a rule line as
// iptables-save prints it ("-A CHAIN ... --comment "text" ... -j TARGET").
func jumpKeyOf(line string) jumpKey {
	var k jumpKey
	f := strings.Fields(line)
	if len(f) >= 2 {
		k.chain = f[1]
	}
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "-j" || f[i] == "--jump" {
			k.target = f[i+1]
		}
	}
	if _, rest, ok := strings.Cut(line, "--comment "); ok {
		if strings.HasPrefix(rest, `"`) {
			k.comment, _, _ = strings.Cut(rest[1:], `"`)
		} else {
			k.comment, _, _ = strings.Cut(rest, " ")
		}
	}
	return k
}

// nodePortsJump writes the last rule of nat KUBE-SERVICES: what is left,
// addressed to a node port address, goes to KUBE-NODEPORTS.
func (r *renderer) nodePortsJump(b []byte) []byte {
	const comment = `-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain"`
	cfg := r.cfg
	if cfg.NodePortAllLocal {
		b = append(b, comment+" -m addrtype --dst-type LOCAL"...)
		switch {
		case cfg.ipv6():
			// Localhost node ports never work on IPv6.
			b = append(b, " ! -d ::1/128"...)
		case !cfg.LocalhostNodePorts:
			b = append(b, " ! -d 127.0.0.0/8"...)
		}
		return append(b, " -j KUBE-NODEPORTS\n"...)
	}
	for _, ip := range cfg.NodePortIPs {
		b = append(b, comment+" -d "...)
		b = ip.AppendTo(b)
		b = append(b, " -j KUBE-NODEPORTS\n"...)
	}
	return b
}

func (r *renderer) renderPartial() {
	o := &out{}
	names := r.in.Changed.UnsortedList()
	slices.SortFunc(names, model.ServicePortName.Compare)
	est := 0
	for _, n := range names {
		est += 2 + len(r.in.State.Endpoints[n])
		if old := r.last.services[n]; old != nil {
			est += len(old.chains)
		}
	}
	o.setSplit(r.cfg, est)
	var inserts []sharedRule
	for _, n := range names {
		old := r.last.services[n]
		if _, ok := r.in.State.Services[n]; !ok {
			r.plan.services[n] = nil
			if old == nil {
				continue
			}
			for _, sr := range old.shared {
				r.deleteShared(o, sr)
			}
			for _, c := range old.chains {
				o.stale = append(o.stale, c.name)
			}
			r.udpGone(old)
			continue
		}
		s := r.describe(n)
		w := &r.cw
		r.plan.services[n] = s
		r.udpChanges(n, s, old, false)
		var oldShared []sharedRule
		var oldChains []chainState
		if old != nil {
			oldShared, oldChains = old.shared, old.chains
		}
		// Shared rules: delete what went, add what came. A rule that is
		// in both stays where it is: the shared chains are not rewritten,
		// so a change costs the same with 10 or 10k services.
		for _, sr := range oldShared {
			if !slices.Contains(s.shared, sr) {
				r.deleteShared(o, sr)
			}
		}
		for _, sr := range s.shared {
			if !slices.Contains(oldShared, sr) {
				inserts = append(inserts, sr)
			}
		}
		// Own chains: write the ones whose rules changed.
		o.addOwn(w, func(i int) bool {
			c := w.chains[i]
			j := slices.IndexFunc(oldChains, func(x chainState) bool { return x.name == c.name })
			return j < 0 || oldChains[j].hash != c.hash
		})
		for _, c := range oldChains {
			if !slices.ContainsFunc(w.chains, func(x chainRef) bool { return x.name == c.name }) {
				o.stale = append(o.stale, c.name)
			}
		}
	}
	for _, sr := range inserts {
		op := "-A"
		if sr.table == tableNAT && (sr.chain == chainServices || sr.chain == chainPostrouting) {
			// Above the node port jump, which must stay last in
			// KUBE-SERVICES; above the "not marked: RETURN" rule in
			// KUBE-POSTROUTING.
			op = "-I"
		}
		if sr.table == tableFilter {
			o.filterRules = appendRuleLine(o.filterRules, op, sr)
			o.filterN++
		} else {
			o.natRules = appendRuleLine(o.natRules, op, sr)
			o.natN++
		}
	}
	slices.SortFunc(r.plan.StaleUDP, func(a, b StaleUDP) int { return a.Service.Name.Compare(b.Service.Name) })
	r.assemble(o)
}

// deleteShared deletes a shared rule by its exact text. Deletions come
// before insertions in the restore.
func (r *renderer) deleteShared(o *out, sr sharedRule) {
	if sr.table == tableFilter {
		o.filterRules = appendRuleLine(o.filterRules, "-D", sr)
		o.filterN++
	} else {
		o.natRules = appendRuleLine(o.natRules, "-D", sr)
		o.natN++
	}
}

func appendRuleLine(b []byte, op string, sr sharedRule) []byte {
	b = append(b, op...)
	b = append(b, ' ')
	b = append(b, sr.chain...)
	if op == "-I" {
		b = append(b, " 1"...)
	}
	b = append(b, ' ')
	b = append(b, sr.spec...)
	return append(b, '\n')
}

// assemble puts the pieces into restores: one, or (split) the prelude,
// the chunks of own chains, the shared part, then chunks of deletions.
func (r *renderer) assemble(o *out) {
	max := o.max
	// Referrers before referents: deleting in this order never leaves a
	// stale chain that another one still jumps to.
	slices.SortStableFunc(o.stale, func(a, b string) int {
		if c := chainRank(a) - chainRank(b); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	o.stale = slices.Compact(o.stale)
	r.plan.ChainsWritten, r.plan.ChainsDeleted = o.ownChains, len(o.stale)

	var restores [][]byte
	if o.split {
		o.flushChunk()
		if o.prelude != nil {
			restores = append(restores, o.prelude)
		}
		for _, c := range o.chunks {
			r.plan.NATRules += bytes.Count(c, newline) - 2 - bytes.Count(c, []byte(" - [0:0]\n"))
		}
		restores = append(restores, o.chunks...)
	} else {
		r.plan.NATRules += bytes.Count(o.own.rules, newline)
	}

	// The main restore: shared chains (and, unsplit, everything), sized
	// once: at 10k services it is 30 MB.
	staleHere := !o.split
	hasFilter := len(o.filterChains) > 0 || o.filterN > 0
	hasNAT := len(o.natChains) > 0 || o.natN > 0 || (!o.split && o.own.chains > 0) || (staleHere && len(o.stale) > 0)
	size := len(o.natPre) + len(o.mangle) + len(o.filterHead) + len(o.filterRules) + len(o.filterTail) + len(o.natHead) + len(o.natRules) + len(o.natTail) + 64
	for _, c := range append(slices.Clip(o.filterChains), o.natChains...) {
		size += len(c) + 9
	}
	if !o.split {
		size += len(o.own.lines) + len(o.own.rules)
		if staleHere {
			for _, c := range o.stale {
				size += 2*len(c) + 13
			}
		}
	}
	b := make([]byte, 0, size)
	b = append(b, o.mangle...)
	// nat before filter: iptables-restore commits table by table, and a
	// service that gets its first endpoint must have its DNAT in place
	// before the filter table's reject for "no endpoints" goes, or a
	// packet between the two commits meets neither and is routed on
	// (a lost SYN costs the client a second). The other way round (the
	// last endpoint goes) only turns a reject into a drop for that moment.
	if hasNAT {
		b = append(b, "*nat\n"...)
		for _, c := range o.natChains {
			b = appendChainLine(b, c)
		}
		if !o.split {
			b = append(b, o.own.lines...)
		}
		if staleHere {
			for _, c := range o.stale {
				b = appendChainLine(b, c)
			}
		}
		// Jump inserts first (natHead starts with them), so that the
		// services' KUBE-POSTROUTING rules land before its fixed ones.
		b = append(b, o.natPre...)
		b = append(b, o.natHead...)
		b = append(b, o.natRules...)
		if !o.split {
			b = append(b, o.own.rules...)
		}
		if staleHere {
			for _, c := range o.stale {
				b = append(b, "-X "+c+"\n"...)
			}
		}
		b = append(b, o.natTail...)
		b = append(b, "COMMIT\n"...)
	}
	if hasFilter {
		b = append(b, "*filter\n"...)
		for _, c := range o.filterChains {
			b = appendChainLine(b, c)
		}
		b = append(b, o.filterHead...)
		b = append(b, o.filterRules...)
		b = append(b, o.filterTail...)
		b = append(b, "COMMIT\n"...)
	}
	if len(b) > 0 {
		restores = append(restores, b)
	}
	if o.split {
		// Deletions last, once nothing live jumps to the stale chains;
		// each chunk flushes its chains (a chain line flushes) and
		// deletes them.
		for i := 0; i < len(o.stale); i += max {
			part := o.stale[i:min(i+max, len(o.stale))]
			d := []byte("*nat\n")
			for _, c := range part {
				d = appendChainLine(d, c)
			}
			for _, c := range part {
				d = append(d, "-X "+c+"\n"...)
			}
			d = append(d, "COMMIT\n"...)
			restores = append(restores, d)
		}
	}
	r.plan.Restores = restores
	r.plan.NATRules += o.natN
	r.plan.FilterRules = o.filterN
	r.canaryCheck()
}

// canaryLine opens every partial sync. KUBE-PROXY-CANARY is an empty chain
// in each table that only a full sync creates; someone flushing the tables
// (firewalld's reload, iptables -X) deletes it with kproxy's other chains.
// Flushing it then fails, the restore fails before it changes anything in
// that table, and the next sync is full and puts everything back. It costs
// nothing, where asking first would cost a run of iptables-save (which
// iptables-nft makes read every table: 1.3 s at 10k services).
const canaryLine = "-F " + chainCanary + "\n"

func (r *renderer) canaryCheck() {
	if r.in.Full || len(r.plan.Restores) == 0 {
		return
	}
	first := r.plan.Restores[0]
	i := bytes.IndexByte(first, '\n') + 1 // after "*table"
	b := make([]byte, 0, len(first)+len(canaryLine))
	b = append(b, first[:i]...)
	b = append(b, canaryLine...)
	r.plan.Restores[0] = append(b, first[i:]...)
}

func appendChainLine(b []byte, name string) []byte {
	b = append(b, ':')
	b = append(b, name...)
	return append(b, " - [0:0]\n"...)
}

// udpChanges notes the conntrack work of a UDP service port: endpoints
// it lost, or its first endpoints. As upstream, flows to an endpoint that
// still serves (a terminating one included) are kept.
func (r *renderer) udpChanges(n model.ServicePortName, s *svcApplied, prev *svcApplied, full bool) {
	if n.Protocol != model.UDP {
		return
	}
	if full && !r.last.synced {
		// After a restart there is nothing to compare with; the full
		// sync's conntrack reconciliation covers it.
		return
	}
	if prev == nil {
		if len(s.reachable) > 0 {
			r.plan.NewlyServedUDP = append(r.plan.NewlyServedUDP, s.sp)
		}
		return
	}
	eps := r.in.State.Endpoints[n]
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
	if len(prev.reachable) == 0 && len(s.reachable) > 0 {
		r.plan.NewlyServedUDP = append(r.plan.NewlyServedUDP, s.sp)
	}
}

func (r *renderer) udpGone(old *svcApplied) {
	if old.sp.Protocol == model.UDP && len(old.reachable) > 0 {
		r.plan.StaleUDP = append(r.plan.StaleUDP, StaleUDP{Service: old.sp, Endpoints: old.reachable})
	}
}

// rule builds one rule's text from arguments; quoting is the caller's
// (comments are passed with their quotes, as upstream writes them).
func (r *renderer) spec(args ...string) string {
	b := r.buf[:0]
	for i, a := range args {
		if i > 0 {
			b = append(b, ' ')
		}
		b = append(b, a...)
	}
	r.buf = b
	return string(b)
}

// describe decides a service port's rules, following upstream's iptables
// proxier so that behaviour and layout match it.
func (r *renderer) describe(n model.ServicePortName) *svcApplied {
	cfg := r.cfg
	sp := r.in.State.Services[n]
	sel := model.SelectEndpoints(sp, r.in.State.Endpoints[n], r.in.NodeName, r.in.Zone)
	names := newServiceChains(n)
	name, proto := names.name, names.proto
	port := strconv.Itoa(int(sp.Port))

	s := &svcApplied{sp: sp, reachable: sel.AllReachable}
	s.stats = ServiceStats{LocalEndpoints: len(sel.Local), HealthCheckNodePort: sp.HealthCheckNodePort}

	hasEndpoints := sel.HasAny
	usesCluster := len(sel.Cluster) > 0 && sp.UsesClusterEndpoints()
	usesLocal := len(sel.Local) > 0 && sp.UsesLocalEndpoints()

	internalChain, hasInternal := names.svc, hasEndpoints
	if sp.InternalPolicyLocal {
		internalChain = names.svl
		hasInternal = hasInternal && len(sel.Local) > 0
	}
	externalPolicyChain, hasExternal := names.svc, hasEndpoints
	if sp.ExternalPolicyLocal {
		externalPolicyChain = names.svl
		hasExternal = hasExternal && len(sel.Local) > 0
	}
	// The EXT chain exists whenever there are endpoints at all: pod and
	// node traffic is short-circuited to the cluster chain even without
	// local endpoints.
	usesExternalChain := hasEndpoints && sp.ExternallyAccessible()
	vips := sp.LoadBalancerVIPs()
	lbChain := names.ext
	// A port closed to this family (LoadBalancerClosed) gets a FW chain
	// without source rules: nothing is DNATed, KUBE-PROXY-FIREWALL drops.
	usesFW := hasEndpoints && sp.UsesLoadBalancerFirewall()
	if usesFW {
		lbChain = names.fw
	}

	var internalTarget, internalComment, externalTarget, externalComment string
	if !hasEndpoints {
		internalTarget, externalTarget = "REJECT", "REJECT"
		internalComment = commentArg(name + " has no endpoints")
		externalComment = internalComment
	} else {
		if !hasInternal {
			internalTarget = "DROP"
			internalComment = commentArg(name + " has no local endpoints")
			s.stats.NoLocalInternal = true
		}
		if !hasExternal {
			externalTarget = "DROP"
			externalComment = commentArg(name + " has no local endpoints")
			s.stats.NoLocalExternal = sp.ExternallyAccessible()
		}
	}

	add := func(table, chain string, args ...string) {
		s.shared = append(s.shared, sharedRule{table: table, chain: chain, spec: r.spec(args...)})
	}
	pm := []string{"-m", proto, "-p", proto}
	clusterIP := sp.ClusterIP.String()
	clusterComment := commentArg(name + " cluster IP")

	if hasInternal {
		add(tableNAT, chainServices, "-m", "comment", "--comment", clusterComment, pm[0], pm[1], pm[2], pm[3], "-d", clusterIP, "--dport", port, "-j", internalChain)
	} else {
		add(tableFilter, chainServices, "-m", "comment", "--comment", internalComment, pm[0], pm[1], pm[2], pm[3], "-d", clusterIP, "--dport", port, "-j", internalTarget)
	}
	for _, ip := range sp.ExternalIPs {
		if hasEndpoints {
			add(tableNAT, chainServices, "-m", "comment", "--comment", commentArg(name+" external IP"), pm[0], pm[1], pm[2], pm[3], "-d", ip.String(), "--dport", port, "-j", names.ext)
		}
		if !hasExternal {
			add(tableFilter, chainExternalServices, "-m", "comment", "--comment", externalComment, pm[0], pm[1], pm[2], pm[3], "-d", ip.String(), "--dport", port, "-j", externalTarget)
		}
	}
	for _, ip := range vips {
		if hasEndpoints {
			add(tableNAT, chainServices, "-m", "comment", "--comment", commentArg(name+" loadbalancer IP"), pm[0], pm[1], pm[2], pm[3], "-d", ip.String(), "--dport", port, "-j", lbChain)
		}
		if usesFW {
			// What the FW chain let through was DNATed; the rest meets this.
			add(tableFilter, chainProxyFirewall, "-m", "comment", "--comment", commentArg(name+" traffic not accepted by "+names.fw), pm[0], pm[1], pm[2], pm[3], "-d", ip.String(), "--dport", port, "-j", "DROP")
		}
	}
	if !hasExternal {
		for _, ip := range vips {
			add(tableFilter, chainExternalServices, "-m", "comment", "--comment", externalComment, pm[0], pm[1], pm[2], pm[3], "-d", ip.String(), "--dport", port, "-j", externalTarget)
		}
	}
	if sp.NodePort != 0 {
		np := strconv.Itoa(int(sp.NodePort))
		if hasEndpoints {
			if r.cfg.LocalhostNodePorts && r.cfg.CountLocalhostNodePorts {
				// Counted, as upstream, by a rule of its own before
				// the one for every address.
				add(tableNAT, chainNodePorts, "-m", "comment", "--comment", commentArg(name), pm[0], pm[1], pm[2], pm[3], "-d", "127.0.0.0/8", "--dport", np,
					"-m", "nfacct", "--nfacct-name", NFAcctLocalhostNodePorts, "-j", names.ext)
			}
			// Node ports are not subject to loadBalancerSourceRanges.
			add(tableNAT, chainNodePorts, "-m", "comment", "--comment", commentArg(name), pm[0], pm[1], pm[2], pm[3], "--dport", np, "-j", names.ext)
		}
		if !hasExternal {
			add(tableFilter, chainExternalServices, "-m", "comment", "--comment", externalComment, "-m", "addrtype", "--dst-type", "LOCAL", pm[0], pm[1], pm[2], pm[3], "--dport", np, "-j", externalTarget)
		}
	}
	if sp.HealthCheckNodePort != 0 {
		// Accepted whether or not there are local endpoints: the health
		// check server answers 503 then.
		add(tableFilter, chainNodePorts, "-m", "comment", "--comment", commentArg(name+" health check node port"), "-m", "tcp", "-p", "tcp", "--dport", strconv.Itoa(int(sp.HealthCheckNodePort)), "-j", "ACCEPT")
	}

	// Own chains, in upstream's order of creation, each written whole
	// before the next (see chainWriter).
	var masqArgs []string
	if hasInternal {
		dst := []string{"-m", "comment", "--comment", clusterComment, pm[0], pm[1], pm[2], pm[3], "-d", clusterIP, "--dport", port}
		if cfg.MasqueradeAll {
			masqArgs = append(dst, "-j", chainMarkMasq)
		} else if cfg.LocalDetector.Implemented() {
			// Off-cluster traffic to a cluster IP (a static route to the
			// service range via some node) may leave the node again.
			masqArgs = append(append(dst, cfg.LocalDetector.IfNotLocal...), "-j", chainMarkMasq)
		}
	}
	w := &r.cw
	w.reset()
	if usesExternalChain {
		w.begin(names.ext)
		if !sp.ExternalPolicyLocal {
			// Endpoints may be on other nodes: masquerade to get replies back.
			w.add("-m", "comment", "--comment", commentArg("masquerade traffic for "+name+" external destinations"), "-j", chainMarkMasq)
		} else {
			if cfg.LocalDetector.Implemented() {
				// Pod traffic to an external destination is treated as if
				// it went out to the LB and came back: policy Cluster.
				a := append([]string{"-m", "comment", "--comment", commentArg("pod traffic for " + name + " external destinations")}, cfg.LocalDetector.IfLocal...)
				w.add(append(a, "-j", names.svc)...)
			}
			// The node's own traffic: its source is a local address
			// (often the LB IP itself), masquerade it and use all endpoints.
			w.add("-m", "comment", "--comment", commentArg("masquerade LOCAL traffic for "+name+" external destinations"), "-m", "addrtype", "--src-type", "LOCAL", "-j", chainMarkMasq)
			w.add("-m", "comment", "--comment", commentArg("route LOCAL traffic for "+name+" external destinations"), "-m", "addrtype", "--src-type", "LOCAL", "-j", names.svc)
		}
		if hasExternal {
			w.add("-j", externalPolicyChain)
		}
	}
	if usesFW {
		w.begin(names.fw)
		lbComment := commentArg(name + " loadbalancer IP")
		allowFromNode := false
		for _, p := range sp.LoadBalancerSourceRanges {
			w.add("-m", "comment", "--comment", lbComment, "-s", p.String(), "-j", names.ext)
			if cfg.NodeIP.IsValid() && p.Contains(cfg.NodeIP) {
				allowFromNode = true
			}
		}
		if allowFromNode {
			// A VIP that is a local address loops a node's request back
			// with the VIP as source: let the node in.
			for _, ip := range vips {
				w.add("-m", "comment", "--comment", lbComment, "-s", ip.String(), "-j", names.ext)
			}
		}
		// No target: what gets here is not DNATed, and KUBE-PROXY-FIREWALL
		// drops it in filter.
		w.add("-m", "comment", "--comment", commentArg("other traffic to "+name+" will be dropped by KUBE-PROXY-FIREWALL"))
	}
	epChains := r.epChains[:0]
	// Endpoint chain names: the chains, or in the compact layout only the
	// names of the affinity lists.
	if (usesCluster || usesLocal) && (!cfg.Compact || sp.SessionAffinity()) {
		for _, e := range sel.AllReachable {
			epChains = append(epChains, epChain{e, names.endpointChain(e)})
		}
	}
	r.epChains = epChains
	for _, pc := range []struct {
		chain string
		uses  bool
		eps   []*model.Endpoint
	}{{names.svc, usesCluster, sel.Cluster}, {names.svl, usesLocal, sel.Local}} {
		masq := masqArgs != nil && internalChain == pc.chain
		if !pc.uses && !masq {
			continue
		}
		w.begin(pc.chain)
		if masq {
			w.add(masqArgs...)
		}
		if pc.uses {
			r.dispatch(w, name, sp, pc.eps, epChains)
		}
	}
	if cfg.Compact {
		// Hairpin without endpoint chains: after DNAT, a packet a local
		// pod sent to its own service and that came back to it has the
		// same source and destination in postrouting. Only local
		// endpoints send from this node; a remote pod's packet routed
		// here and sent back to it is not caught (upstream's KUBE-SEP
		// rule catches it).
		for _, e := range sel.AllReachable {
			if e.Local {
				ip := e.IP.String()
				add(tableNAT, chainPostrouting, "-m", "comment", "--comment", commentArg(name+" hairpin"), "-s", ip, "-d", ip, "-j", chainMarkMasq)
			}
		}
		epChains = epChains[:0] // no chains to write
	}
	for _, ec := range epChains {
		e := ec.e
		w.begin(ec.chain)
		var comment []string
		if !r.large {
			comment = []string{"-m", "comment", "--comment", commentArg(name)}
		}
		ip := e.IP.String()
		// Hairpin: a pod reaching itself through the service must be
		// masqueraded or it would answer itself directly.
		w.add(append(slices.Clip(comment), "-s", ip, "-j", chainMarkMasq)...)
		a := slices.Clip(comment)
		if sp.SessionAffinity() {
			a = append(a, "-m", "recent", "--name", ec.chain, "--set")
		}
		w.add(append(a, pm[0], pm[1], pm[2], pm[3], "-j", "DNAT", "--to-destination", e.String())...)
	}
	w.finish()

	for _, sr := range s.shared {
		if sr.table == tableFilter {
			s.filterRules++
		} else {
			s.natRules++
		}
	}
	s.natRules += bytes.Count(w.buf, newline)
	s.chains = make([]chainState, len(w.chains))
	for i, c := range w.chains {
		s.chains[i] = chainState{name: c.name, hash: c.hash}
	}
	return s
}

type epChain struct {
	e     *model.Endpoint
	chain string
}

// chainWriter holds one service port's own chains while they are
// rendered: their rules one chain after the other in one buffer, reused
// from one service port to the next (a full sync at 10k services writes
// 110k chains; a buffer and its growth per chain were most of the
// renderer's cost).
type chainWriter struct {
	buf    []byte
	chains []chainRef
}

type chainRef struct {
	name       string
	start, end int
	hash       uint64
}

// hashSeed seeds the chain content hashes; they are compared only within
// this process.
var hashSeed = maphash.MakeSeed()

func (w *chainWriter) reset() { w.buf, w.chains = w.buf[:0], w.chains[:0] }

func (w *chainWriter) begin(name string) {
	w.chains = append(w.chains, chainRef{name: name, start: len(w.buf)})
}

func (w *chainWriter) add(args ...string) {
	w.buf = append(w.buf, "-A "...)
	w.buf = append(w.buf, w.chains[len(w.chains)-1].name...)
	for _, a := range args {
		w.buf = append(w.buf, ' ')
		w.buf = append(w.buf, a...)
	}
	w.buf = append(w.buf, '\n')
}

func (w *chainWriter) finish() {
	for i := range w.chains {
		w.chains[i].end = len(w.buf)
		if i+1 < len(w.chains) {
			w.chains[i].end = w.chains[i+1].start
		}
		w.chains[i].hash = maphash.Bytes(hashSeed, w.rules(i))
	}
}

func (w *chainWriter) rules(i int) []byte { return w.buf[w.chains[i].start:w.chains[i].end] }

// dispatch writes the endpoint choice of a policy chain: affinity first
// (a client seen within the timeout goes back to its endpoint), then one
// rule per endpoint; rule i of n matches with probability 1/(n-i), so that
// each endpoint gets 1/n of the new connections, and the last always.
func (r *renderer) dispatch(c *chainWriter, name string, sp *model.ServicePort, eps []*model.Endpoint, epChains []epChain) {
	// Services have a few endpoints, searched in a slice; a large one
	// gets a map rather than a quadratic search.
	var byEP map[*model.Endpoint]string
	if len(epChains) > 16 {
		byEP = make(map[*model.Endpoint]string, len(epChains))
		for _, ec := range epChains {
			byEP[ec.e] = ec.chain
		}
	}
	chainOf := func(e *model.Endpoint) string {
		if byEP != nil {
			return byEP[e]
		}
		for _, ec := range epChains {
			if ec.e == e {
				return ec.chain
			}
		}
		return ""
	}
	comment := func(e *model.Endpoint) []string {
		if r.large {
			return nil
		}
		return []string{"-m", "comment", "--comment", commentArg(name + " -> " + e.String())}
	}
	// target ends an endpoint's rule: a jump to its KUBE-SEP chain, or in
	// the compact layout what that chain would do, in the same rule (the
	// recent match with --set always matches and records the client).
	pm := []string{"-m", protoLower(string(sp.Protocol)), "-p", protoLower(string(sp.Protocol))}
	target := func(a []string, e *model.Endpoint) []string {
		if !r.cfg.Compact {
			return append(a, "-j", chainOf(e))
		}
		if sp.SessionAffinity() {
			a = append(a, "-m", "recent", "--name", chainOf(e), "--set")
		}
		return append(append(a, pm...), "-j", "DNAT", "--to-destination", e.String())
	}
	if sp.SessionAffinity() {
		secs := strconv.Itoa(int(sp.StickyMaxAgeSeconds))
		for _, e := range eps {
			ch := chainOf(e)
			c.add(target(append(comment(e), "-m", "recent", "--name", ch, "--rcheck", "--seconds", secs, "--reap"), e)...)
		}
	}
	for i, e := range eps {
		a := comment(e)
		if i < len(eps)-1 {
			a = append(a, "-m", "statistic", "--mode", "random", "--probability", probability(len(eps)-i))
		}
		c.add(target(a, e)...)
	}
}
