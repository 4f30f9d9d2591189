package iptables

import (
	"bytes"
	"hash/maphash"
	"strconv"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy/tally"
	"github.com/kproxy/kproxy/internal/proxy/udpflows"
)

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

	s := &svcApplied{sp: sp, reachable: sel.AllReachable, endpoints: len(r.in.State.Endpoints[n])}
	if sp.Protocol == model.UDP {
		s.flows = udpflows.Kept(sel.AllReachable, r.in.State.Endpoints[n])
	}
	s.stats = tally.Of(sp, sel)

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
		}
		if !hasExternal {
			externalTarget = "DROP"
			externalComment = commentArg(name + " has no local endpoints")
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
	epComment := commentArg(name)
	for _, ec := range epChains {
		e := ec.e
		w.begin(ec.chain)
		// One argument list for both rules (chainWriter.add copies the
		// text), reused endpoint after endpoint.
		a := r.args[:0]
		if !r.large {
			a = append(a, "-m", "comment", "--comment", epComment)
		}
		n := len(a)
		ip := e.IP.String()
		// Hairpin: a pod reaching itself through the service must be
		// masqueraded or it would answer itself directly.
		a = append(a, "-s", ip, "-j", chainMarkMasq)
		w.add(a...)
		a = a[:n]
		if sp.SessionAffinity() {
			a = append(a, "-m", "recent", "--name", ec.chain, "--set")
		}
		a = append(a, pm[0], pm[1], pm[2], pm[3], "-j", "DNAT", "--to-destination", e.String())
		w.add(a...)
		r.args = a[:0]
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
	// One argument list, reused rule after rule (chainWriter.add copies
	// the text): a service port's rules cost no slice each.
	args := r.args[:0]
	defer func() { r.args = args[:0] }()
	comment := func(e *model.Endpoint) []string {
		args = args[:0]
		if r.large {
			return args
		}
		return append(args, "-m", "comment", "--comment", commentArg(name+" -> "+e.String()))
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
			args = target(append(comment(e), "-m", "recent", "--name", ch, "--rcheck", "--seconds", secs, "--reap"), e)
			c.add(args...)
		}
	}
	for i, e := range eps {
		args = comment(e)
		if i < len(eps)-1 {
			args = append(args, "-m", "statistic", "--mode", "random", "--probability", probability(len(eps)-i))
		}
		args = target(args, e)
		c.add(args...)
	}
}
