package iptables

import (
	"bytes"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy/masquerade"
	"github.com/kproxy/kproxy/internal/proxy/udpflows"
)

func (r *renderer) renderFull() {
	o := &out{}
	cfg := r.cfg
	mark := cfg.MasqueradeMark

	// Upstream's canary in mangle, nat and filter (utiliptables.Monitor).
	// KUBE-IPTABLES-HINT is the kubelet's alone: upstream kube-proxy
	// never creates it, and tools that read it (iptables-wrapper,
	// `kproxy doctor`, xtables.Select) credit it to the kubelet.
	o.mangle = []byte("*mangle\n:" + chainCanary + " - [0:0]\nCOMMIT\n")

	o.filterChains = []string{chainServices, chainExternalServices, chainForward, chainNodePorts, chainProxyFirewall}
	o.natChains = []string{chainServices, chainNodePorts, chainPostrouting, chainMarkMasq}
	// The kubelet's KUBE-FIREWALL, hooked from INPUT and OUTPUT in both
	// families whatever localhostNodePorts says, as upstream's
	// iptablesKubeletJumpChains. Only IPv4 with localhost node ports
	// writes its rule (a chain line flushes the chain); otherwise the
	// chain is declared only where it is missing, so that the kubelet's
	// own rule in it stays.
	if cfg.LocalhostNodePorts || !r.kubeletFirewallExists() {
		o.filterChains = append(o.filterChains, chainKubeletFirewall)
	}
	o.filterChains = append(o.filterChains, chainCanary)
	o.natChains = append(o.natChains, chainCanary)

	for _, j := range allJumpRules {
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
	// Rules in kproxy's fixed chains (the jump inserts above are in
	// built-in chains): counted as they are written, for
	// sync_proxy_rules_iptables_total.
	fixedFilter := 0
	if cfg.LocalhostNodePorts {
		// Upstream's copy of the kubelet's rule (CVE-2020-8558): with
		// route_localnet=1 the node would accept packets to 127.0.0.0/8
		// from other hosts; only DNATed (node port) ones may pass.
		o.filterHead = append(o.filterHead, `-A KUBE-FIREWALL -m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP`+"\n"...)
		o.filterN++
		fixedFilter++
	}
	masq := masquerade.NewRules(mark, cfg.RandomFully)
	for _, rule := range masq.Postrouting {
		o.natHead = append(o.natHead, rule+"\n"...)
	}
	markRule := masq.MarkMasq + "\n"
	o.natHead = append(o.natHead, markRule...)
	o.natN += len(masq.Postrouting) + 1
	fixedNAT := len(masq.Postrouting) + 1
	o.prelude = []byte("*nat\n:" + chainMarkMasq + " - [0:0]\n" + markRule + "COMMIT\n")

	names := r.in.State.SortedNames()
	o.setSplit(cfg, 2*len(names)+r.plan.Endpoints)
	if !o.split {
		// About 330 bytes of rules per endpoint, 400 per service port.
		o.own.rules = make([]byte, 0, 330*r.plan.Endpoints+400*len(names))
		o.ownBlocks = make([]ownBlock, 0, 2*len(names)+r.plan.Endpoints)
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
	slices.SortFunc(r.plan.StaleUDP, func(a, b udpflows.Stale) int { return a.Service.Name.Compare(b.Service.Name) })

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
	// The tails hold only fixed rules (KUBE-FORWARD's, the node port
	// jumps at the end of KUBE-SERVICES).
	r.plan.fixedNAT = fixedNAT + bytes.Count(o.natTail, newline)
	r.plan.fixedFilter = fixedFilter + bytes.Count(o.filterTail, newline)
	r.assemble(o)
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
	slices.SortFunc(r.plan.StaleUDP, func(a, b udpflows.Stale) int { return a.Service.Name.Compare(b.Service.Name) })
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
	if removed := udpflows.Removed(prev.flows, eps); len(removed) > 0 {
		r.plan.StaleUDP = append(r.plan.StaleUDP, udpflows.Stale{Service: prev.sp, Endpoints: removed})
	}
	if len(prev.reachable) == 0 && len(s.reachable) > 0 {
		r.plan.NewlyServedUDP = append(r.plan.NewlyServedUDP, s.sp)
	}
}

func (r *renderer) udpGone(old *svcApplied) {
	if old.sp.Protocol == model.UDP && len(old.flows) > 0 {
		r.plan.StaleUDP = append(r.plan.StaleUDP, udpflows.Stale{Service: old.sp, Endpoints: old.flows})
	}
}
