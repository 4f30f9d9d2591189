package nftables

import "github.com/kproxy/kproxy/internal/kernel/nft/nftstate"

// Naming the service. The rules themselves carry no service name; the
// elements that send a packet to a service's chains do: kproxy's renderer
// (and upstream's) comments every element of service-ips,
// service-nodeports, cluster-services, firewall-ips and
// no-endpoint-services with the service port, "ns/name:port/PROTO", and
// `nft list table` prints those comments. A shared chain such as
// "cluster/tcp/2" serves many services, so its name cannot say whose
// packet it handles; the element that led there can. Only elements keyed
// by the destination port count: those of cluster-ips, keyed by address
// alone, name one port of the service, which need not be the packet's.
//
// So the walk keeps the comment of the element a rule matched (ruleSvc,
// for that rule's own steps) and, when that rule jumps or goes to a
// chain, carries it into the chain (svc) and every chain that one calls,
// until the walk leaves it: a return or the chain's end below svcDepth,
// or the end of the base chain (an accept, DNAT, masquerade). Every step
// in between ends in " (service COMMENT)", as each iptables mode step in
// a service's chains shows the rule's "--comment".

// Step records a step, naming the service the walk is in, if any.
func (s *state) Step(format string, args ...any) {
	s.Record.Step(format, args...)
	svc := s.svc
	if svc == "" {
		svc = s.ruleSvc
	}
	if svc != "" {
		s.Path[len(s.Path)-1] += " (service " + svc + ")"
	}
}

// ruleElement notes the element a rule's match or lookup found.
func (s *state) ruleElement(e *nftstate.Element) {
	if e != nil && e.Comment() != "" && s.ruleSvc == "" {
		s.ruleSvc = e.Comment()
	}
}

// enterService: the rule being evaluated jumped or went to the chain on
// top of the stack; the service its element named (if no outer one is
// in force) holds until that chain is left.
func (s *state) enterService() {
	if s.svc == "" && s.ruleSvc != "" {
		s.svc, s.svcDepth = s.ruleSvc, len(s.stack)-1
	}
}

// popService: a chain was left; the service ends with the chain it
// began in.
func (s *state) popService() {
	if s.svc != "" && len(s.stack) <= s.svcDepth {
		s.svc = ""
	}
}

// leaveService: the base chain ended.
func (s *state) leaveService() { s.svc, s.ruleSvc = "", "" }
