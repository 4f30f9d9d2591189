package iptables

// Address plan (ipvs mode): node 198.18.0.10 (its own address, and a
// NodePort's virtual server), pods in 198.18.128.0/17, services in
// 198.19.0.0/16 bound to kube-ipvs0, an outside client 203.0.113.9. The
// rules are a cut of what ipvs mode's render writes (kproxy render
// --proxy-mode ipvs); the sets and the IPVS table stand for the kernel's.

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/trace"
)

const ipvsRules = `*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-NODE-PORT - [0:0]
:KUBE-LOAD-BALANCER - [0:0]
:KUBE-MARK-MASQ - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A KUBE-SERVICES -s 127.0.0.0/8 -j RETURN
-A KUBE-POSTROUTING -m set --match-set KUBE-LOOP-BACK dst,dst,src -j MASQUERADE
-A KUBE-SERVICES -m set --match-set KUBE-LOAD-BALANCER dst,dst -j KUBE-LOAD-BALANCER
-A KUBE-NODE-PORT -p tcp -m set --match-set KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ
-A KUBE-SERVICES ! -s 198.18.128.0/17 -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ
-A KUBE-SERVICES -m set --match-set KUBE-EXTERNAL-IP dst,dst -m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT
-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT
-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ
-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT
-A KUBE-SERVICES -m set --match-set KUBE-LOAD-BALANCER dst,dst -j ACCEPT
-A KUBE-POSTROUTING -m mark ! --mark 0x00004000/0x00004000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x00004000
-A KUBE-POSTROUTING -j MASQUERADE --random-fully
-A KUBE-MARK-MASQ -j MARK --or-mark 0x00004000
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-SOURCE-RANGES-FIREWALL - [0:0]
:KUBE-IPVS-FILTER - [0:0]
-A INPUT -j KUBE-IPVS-FILTER
-A INPUT -j KUBE-PROXY-FIREWALL
-A KUBE-PROXY-FIREWALL -m set --match-set KUBE-LOAD-BALANCER-FW dst,dst -j KUBE-SOURCE-RANGES-FIREWALL
-A KUBE-SOURCE-RANGES-FIREWALL -m set --match-set KUBE-LOAD-BALANCER-SOURCE-CIDR dst,dst,src -j RETURN
-A KUBE-SOURCE-RANGES-FIREWALL -j DROP
-A KUBE-IPVS-FILTER -m set --match-set KUBE-LOAD-BALANCER dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m set --match-set KUBE-CLUSTER-IP dst,dst -j RETURN
-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set KUBE-IPVS-IPS dst -j REJECT
COMMIT
`

func ipvsHost() *trace.Host {
	ap := netip.MustParseAddrPort
	masq := func(s string, w int) trace.IPVSReal { return trace.IPVSReal{Addr: ap(s), Weight: w, Method: "masq"} }
	return &trace.Host{
		LocalAddrs: []netip.Addr{netip.MustParseAddr("198.18.0.10"), netip.MustParseAddr("198.19.0.10"),
			netip.MustParseAddr("198.19.0.11"), netip.MustParseAddr("198.19.0.12"), netip.MustParseAddr("198.19.200.1")},
		IPSets: map[string]*trace.IPSet{
			"KUBE-LOOP-BACK":        {Name: "KUBE-LOOP-BACK", Type: "hash:ip,port,ip", Entries: []string{"198.18.129.10,tcp:8080,198.18.129.10"}},
			"KUBE-CLUSTER-IP":       {Name: "KUBE-CLUSTER-IP", Type: "hash:ip,port", Entries: []string{"198.19.0.10,tcp:80", "198.19.0.11,tcp:80", "198.19.0.12,tcp:80"}},
			"KUBE-EXTERNAL-IP":      {Name: "KUBE-EXTERNAL-IP", Type: "hash:ip,port"},
			"KUBE-LOAD-BALANCER":    {Name: "KUBE-LOAD-BALANCER", Type: "hash:ip,port", Entries: []string{"198.19.200.1,tcp:443"}},
			"KUBE-LOAD-BALANCER-FW": {Name: "KUBE-LOAD-BALANCER-FW", Type: "hash:ip,port", Entries: []string{"198.19.200.1,tcp:443"}},
			"KUBE-LOAD-BALANCER-SOURCE-CIDR": {Name: "KUBE-LOAD-BALANCER-SOURCE-CIDR", Type: "hash:ip,port,net",
				Entries: []string{"198.19.200.1,tcp:443,203.0.113.0/24"}},
			"KUBE-NODE-PORT-TCP": {Name: "KUBE-NODE-PORT-TCP", Type: "bitmap:port", Entries: []string{"30080"}},
			"KUBE-IPVS-IPS":      {Name: "KUBE-IPVS-IPS", Type: "hash:ip", Entries: []string{"198.19.0.10", "198.19.0.11", "198.19.0.12", "198.19.200.1"}},
		},
		IPVS: []trace.IPVSService{
			{Proto: v1.ProtocolTCP, Addr: ap("198.19.0.10:80"), Scheduler: "rr",
				Reals: []trace.IPVSReal{masq("198.18.129.10:8080", 1), masq("198.18.130.10:8080", 1)}},
			// A terminating endpoint (weight 0) and weights 2:1.
			{Proto: v1.ProtocolTCP, Addr: ap("198.19.0.11:80"), Scheduler: "wrr", Persistent: true, Timeout: 600,
				Reals: []trace.IPVSReal{masq("198.18.129.20:8080", 0), masq("198.18.129.21:8080", 2), masq("198.18.130.21:8080", 1)}},
			// Only terminating endpoints.
			{Proto: v1.ProtocolTCP, Addr: ap("198.19.0.12:80"), Scheduler: "rr",
				Reals: []trace.IPVSReal{masq("198.18.129.30:8080", 0)}},
			{Proto: v1.ProtocolTCP, Addr: ap("198.18.0.10:30080"), Scheduler: "rr",
				Reals: []trace.IPVSReal{masq("198.18.129.10:8080", 1)}},
			{Proto: v1.ProtocolTCP, Addr: ap("198.19.200.1:443"), Scheduler: "rr",
				Reals: []trace.IPVSReal{masq("198.18.129.10:8080", 1)}},
		},
	}
}

func TestTraceIPVS(t *testing.T) {
	h := ipvsHost()
	const pod = "veth1"
	runTraceCases(t, []traceCase{
		{name: "pod to a ClusterIP: IPVS on LOCAL_IN, not masqueraded", rules: ipvsRules, host: h,
			pkt:  pkt(tcp, "198.18.129.5", "198.19.0.10", 80, pod),
			want: []string{out("accept", "198.18.129.10:8080", false, 0.5), out("accept", "198.18.130.10:8080", false, 0.5)},
			pathHas: []string{"-m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT", "ipvs INPUT (priority 98): virtual server TCP 198.19.0.10:80 rr",
				"ipvs: masq to 198.18.129.10:8080, sent out: hook OUTPUT", "hook POSTROUTING"}},
		{name: "node to a ClusterIP: IPVS on LOCAL_OUT, masqueraded", rules: ipvsRules, host: h,
			pkt:     pkt(tcp, "198.18.0.10", "198.19.0.10", 80, ""),
			want:    []string{out("accept", "198.18.129.10:8080", true, 0.5), out("accept", "198.18.130.10:8080", true, 0.5)},
			pathHas: []string{"ipvs OUTPUT (priority -99)", "-j MASQUERADE"}},
		{name: "weights and a terminating real server", rules: ipvsRules, host: h,
			pkt:     pkt(tcp, "198.18.129.5", "198.19.0.11", 80, pod),
			want:    []string{out("accept", "198.18.129.21:8080", false, 2.0/3), out("accept", "198.18.130.21:8080", false, 1.0/3)},
			pathHas: []string{"persistent 600s", "198.18.129.20:8080 has weight 0 (terminating)", "scheduler wrr picks real server 198.18.129.21:8080 (weight 2, p=0.6667"}},
		{name: "only terminating real servers: port unreachable", rules: ipvsRules, host: h,
			pkt:     pkt(tcp, "198.18.129.5", "198.19.0.12", 80, pod),
			want:    []string{out("reject", "", false, 1)},
			pathHas: []string{"no real server takes new connections"}},
		{name: "NodePort from outside", rules: ipvsRules, host: h,
			pkt:     pkt(tcp, "203.0.113.9", "198.18.0.10", 30080, "eth0"),
			want:    []string{out("accept", "198.18.129.10:8080", true, 1)},
			pathHas: []string{"-m set --match-set KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ", "virtual server TCP 198.18.0.10:30080"}},
		{name: "UDP to the NodePort: no set member, no virtual server", rules: ipvsRules, host: h,
			pkt:     pkt(udp, "203.0.113.9", "198.18.0.10", 30080, "eth0"),
			want:    []string{out("accept", "", false, 1)},
			pathHas: []string{"ipvs INPUT (priority 98): no virtual server for UDP 198.18.0.10:30080"}},
		{name: "hairpin: a pod reaching itself is masqueraded", rules: ipvsRules, host: h,
			pkt:  pkt(tcp, "198.18.129.10", "198.18.0.10", 30080, pod),
			want: []string{out("accept", "198.18.129.10:8080", true, 1)}},
		{name: "load balancer from an allowed source", rules: ipvsRules, host: h,
			pkt:  pkt(tcp, "203.0.113.9", "198.19.200.1", 443, "eth0"),
			want: []string{out("accept", "198.18.129.10:8080", true, 1)}},
		{name: "load balancer from another source is dropped", rules: ipvsRules, host: h,
			pkt:     pkt(tcp, "192.0.2.7", "198.19.200.1", 443, "eth0"),
			want:    []string{out("drop", "", false, 1)},
			pathHas: []string{"KUBE-SOURCE-RANGES-FIREWALL: -j DROP"}},
		{name: "a service address on a port of no service is rejected", rules: ipvsRules, host: h,
			pkt:     pkt(tcp, "198.18.129.5", "198.19.0.10", 22, pod),
			want:    []string{out("reject", "", false, 1)},
			pathHas: []string{"--match-set KUBE-IPVS-IPS dst -j REJECT"}},
		{name: "without IPVS the iptables walk is unchanged", rules: ipvsRules,
			host: &trace.Host{LocalAddrs: h.LocalAddrs, IPSets: h.IPSets},
			pkt:  pkt(tcp, "198.18.129.5", "198.19.0.10", 80, pod),
			want: []string{out("accept", "", false, 1)}},
	})
}

// TestSetMatch: the ipset match's dimensions, protocols and negation.
func TestSetMatch(t *testing.T) {
	sets := map[string]*trace.IPSet{
		"P":  {Name: "P", Type: "hash:ip,port", Entries: []string{"198.19.0.10,udp:53"}},
		"B":  {Name: "B", Type: "bitmap:port", Entries: []string{"53"}},
		"N":  {Name: "N", Type: "hash:net", Entries: []string{"198.18.128.0/17"}},
		"I":  {Name: "I", Type: "hash:ip,port,ip", Entries: []string{"198.19.0.10,udp:53,198.18.129.5"}},
		"V6": {Name: "V6", Type: "hash:ip", IPv6: true, Entries: []string{"fd00::1"}},
	}
	h := trace.Host{LocalAddrs: []netip.Addr{netip.MustParseAddr("198.18.0.10")}, IPSets: sets}
	p := pkt(udp, "198.18.129.5", "198.19.0.10", 53, "veth1")
	for _, tc := range []struct {
		match string
		pkt   trace.Packet
		hit   bool
	}{
		{"-m set --match-set P dst,dst", p, true},
		{"-m set --match-set P dst,dst", pkt(tcp, "198.18.129.5", "198.19.0.10", 53, "veth1"), false}, // the protocol counts
		{"-m set --match-set P dst,src", p, false},                                                    // the source port is 40000
		{"-m set ! --match-set P dst,dst", p, false},
		{"-m set --match-set B dst", pkt(tcp, "198.18.129.5", "198.19.0.99", 53, "veth1"), true}, // bitmap:port has no protocol
		{"-m set --match-set N src", p, true},
		{"-m set --match-set N dst", p, false},
		{"-m set --match-set I dst,dst,src", p, true},
		{"-m set --match-set I dst,dst,dst", p, false},
	} {
		rules := "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n-A FORWARD " + tc.match + " -j DROP\nCOMMIT\n"
		r, err := Parse([]byte(rules))
		if err != nil {
			t.Fatalf("%s: %v", tc.match, err)
		}
		res, err := r.Trace(tc.pkt, h)
		if err != nil {
			t.Fatalf("%s: %v", tc.match, err)
		}
		if got := res.Outcomes[0].Verdict == trace.VerdictDrop; got != tc.hit {
			t.Errorf("%s on %s: matched %v, want %v", tc.match, tc.pkt, got, tc.hit)
		}
		if tc.hit && !strings.Contains(res.String(), tc.match) {
			t.Errorf("the path does not show the rule as iptables-save writes it (%q):\n%s", tc.match, res)
		}
	}
	for _, tc := range []struct {
		match, err  string
		unsupported bool
	}{
		{"-m set --match-set MISSING dst", "does not exist", false},
		{"-m set --match-set V6 dst", "other family", false},
		{"-m set --match-set P dst", "matched with 1 flags", true},
	} {
		rules := "*filter\n:FORWARD ACCEPT [0:0]\n-A FORWARD " + tc.match + " -j DROP\nCOMMIT\n"
		r, err := Parse([]byte(rules))
		if err != nil {
			t.Fatalf("%s: %v", tc.match, err)
		}
		_, err = r.Trace(p, h)
		if err == nil || !strings.Contains(err.Error(), tc.err) || errors.Is(err, ErrUnsupported) != tc.unsupported {
			t.Errorf("%s: want an error with %q (unsupported %v), got %v", tc.match, tc.err, tc.unsupported, err)
		}
	}
	for _, bad := range []string{
		"-m set -j DROP",                        // no --match-set
		"-m set --match-set P dst,both -j DROP", // bad flag
		"-m set --match-set P dst --return-nomatch -j DROP",
		"-m physdev --physdev-in eth0 -j DROP",
		"-m set --set P dst -j DROP", // the old alias: "--set" is recent's here
	} {
		if _, err := Parse([]byte("*filter\n:FORWARD ACCEPT [0:0]\n-A FORWARD " + bad + "\nCOMMIT\n")); err == nil {
			t.Errorf("Parse(%q): want an error", bad)
		}
	}
}

// TestIPVSMatch: "-m ipvs" matches packets IPVS handled, by their virtual
// server: ipvs mode drops the node's own connections to a load balancer
// IP whose source ranges leave the node out.
func TestIPVSMatch(t *testing.T) {
	rules := `*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-IPVS-OUT-FILTER - [0:0]
-A OUTPUT -j KUBE-IPVS-OUT-FILTER
-A KUBE-IPVS-OUT-FILTER -s 198.19.200.1/32 -m ipvs --vproto tcp --vaddr 198.19.200.1 --vport 443 -j DROP
COMMIT
`
	h := ipvsHost()
	runTraceCases(t, []traceCase{
		{name: "the node to the LB IP from the LB IP: handled by IPVS, dropped", rules: rules, host: h,
			pkt:     pkt(tcp, "198.19.200.1", "198.19.200.1", 443, ""),
			want:    []string{out("drop", "198.18.129.10:8080", false, 1)},
			pathHas: []string{"ipvs OUTPUT (priority -99): virtual server TCP 198.19.200.1:443", "-m ipvs --vproto tcp --vaddr 198.19.200.1 --vport 443 -j DROP"}},
		{name: "another virtual server: not matched", rules: rules, host: h,
			pkt:  pkt(tcp, "198.19.200.1", "198.19.0.10", 80, ""),
			want: []string{out("accept", "198.18.129.10:8080", false, 0.5), out("accept", "198.18.130.10:8080", false, 0.5)}},
	})
	for _, tc := range []struct {
		match string
		want  bool
	}{
		{"-m ipvs --ipvs", true},
		{"-m ipvs ! --ipvs", false},
		{"-m ipvs ! --vaddr 198.19.0.10", false},
		{"-m ipvs --vaddr 198.19.0.0/16 --vport 80", true},
		{"-m ipvs --vproto udp", false},
	} {
		r, err := Parse([]byte("*filter\n:OUTPUT ACCEPT [0:0]\n-A OUTPUT " + tc.match + " -j DROP\nCOMMIT\n"))
		if err != nil {
			t.Fatalf("%s: %v", tc.match, err)
		}
		res, err := r.Trace(pkt(tcp, "198.18.0.10", "198.19.0.10", 80, ""), *h)
		if err != nil {
			t.Fatal(err)
		}
		if got := res.Outcomes[0].Verdict == trace.VerdictDrop; got != tc.want {
			t.Errorf("%s after IPVS took the packet to 198.19.0.10:80: matched %v, want %v", tc.match, got, tc.want)
		}
		// Before IPVS (no virtual server), only "! --ipvs" can match.
		res, err = r.Trace(pkt(tcp, "198.18.0.10", "192.0.2.1", 80, ""), *h)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := res.Outcomes[0].Verdict == trace.VerdictDrop, tc.match == "-m ipvs ! --ipvs"; got != want {
			t.Errorf("%s on a packet IPVS did not handle: matched %v, want %v", tc.match, got, want)
		}
	}
	if _, err := Parse([]byte("*filter\n:OUTPUT ACCEPT [0:0]\n-A OUTPUT -m ipvs --vdir ORIGINAL -j DROP\nCOMMIT\n")); !errors.Is(err, ErrUnsupported) {
		t.Errorf("--vdir: want ErrUnsupported, got %v", err)
	}
}

// TestTraceIPVSPersistence: a persistent virtual server's outcomes report
// the persistence template their connection creates; once remembered, the
// client's next connections go to that real server only, other clients
// still to every one, and a template of a real server that no longer takes
// connections is not followed.
func TestTraceIPVSPersistence(t *testing.T) {
	rs, err := Parse([]byte(ipvsRules))
	if err != nil {
		t.Fatal(err)
	}
	h := *ipvsHost()
	p := pkt(tcp, "198.18.129.5", "198.19.0.11", 80, "veth1")
	res, err := rs.Trace(p, h)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Outcomes) != 2 {
		t.Fatalf("want 2 outcomes:\n%s", res)
	}
	chosen := res.Outcomes[1]
	want := "ipvs persistence template: TCP 198.19.0.11:80 client 198.18.129.5 -> 198.18.130.21:8080"
	if len(chosen.AffinityUpdates) != 1 || chosen.AffinityUpdates[0] != want {
		t.Fatalf("affinity updates %q, want [%q]", chosen.AffinityUpdates, want)
	}
	if err := rs.Remember(chosen); err != nil {
		t.Fatal(err)
	}
	p.SrcPort++
	res, err = rs.Trace(p, h)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Outcomes) != 1 || res.Outcomes[0].DNAT == nil || *res.Outcomes[0].DNAT != *chosen.DNAT || res.Outcomes[0].Probability != 1 {
		t.Errorf("the same client's next connection: want only %s, got:\n%s", chosen.DNAT, res)
	}
	other := pkt(tcp, "198.18.129.6", "198.19.0.11", 80, "veth1")
	if res, err := rs.Trace(other, h); err != nil || len(res.Outcomes) != 2 {
		t.Errorf("another client: want 2 outcomes, got %v:\n%s", err, res)
	}
	// The remembered real server drains (weight 0): scheduled anew.
	h.IPVS = append([]trace.IPVSService(nil), h.IPVS...)
	h.IPVS[1].Reals = append([]trace.IPVSReal(nil), h.IPVS[1].Reals...)
	h.IPVS[1].Reals[2].Weight = 0
	if res, err := rs.Trace(p, h); err != nil || len(res.Outcomes) != 1 || res.Outcomes[0].DNAT.String() != "198.18.129.21:8080" {
		t.Errorf("remembered real server draining: want 198.18.129.21:8080, got %v:\n%s", err, res)
	}
	for _, bad := range []string{"ipvs persistence template: TCP 198.19.0.11:80", "ipvs persistence template: TCP x client 1.2.3.4 -> 1.2.3.5:80"} {
		if err := rs.Remember(trace.Outcome{AffinityUpdates: []string{bad}}); err == nil {
			t.Errorf("Remember(%q) took it", bad)
		}
	}
}
