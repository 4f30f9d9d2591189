package nftables

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/kproxy/kproxy/internal/trace"
	"github.com/kproxy/kproxy/internal/trace/tracetest"
	v1 "k8s.io/api/core/v1"
)

const (
	tcp  = v1.ProtocolTCP
	udp  = v1.ProtocolUDP
	sctp = v1.ProtocolSCTP
)

// out and summarize: the outcome's shape, as tracetest writes it.
var (
	out       = tracetest.Out
	summarize = tracetest.Summarize
)

type traceCase struct {
	name  string
	rules string
	host  trace.Host
	pkt   trace.Packet
	want  []string
	// pathHas are substrings that must appear in the first outcome's path.
	pathHas []string
}

func runTraceCases(t *testing.T, cases traceCases) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := ParseNFT(tc.rules)
			if err != nil {
				t.Fatalf("ParseNFT: %v", err)
			}
			res, err := r.Trace(tc.pkt, tc.host)
			if err != nil {
				t.Fatalf("Trace: %v", err)
			}
			tracetest.Check(t, res, tc.want, tc.pathHas)
		})
	}
}

var third = 1.0 / 3

func TestTraceServices(t *testing.T) {
	rules := join(baseV4, svcA, svcB)
	a1, a2, a3 := "10.180.1.1:8080", "10.180.2.1:8080", "10.180.3.1:8080"
	runTraceCases(t, traceCases{{
		name: "cluster IP from a pod: numgen gives three endpoints of 1/3, no masquerade",
		pkt:  pkt(tcp, "10.180.1.7:40000", "10.96.0.10:80", "cali1"),
		want: []string{out("accept", a1, false, third), out("accept", a2, false, third), out("accept", a3, false, third)},
		pathHas: []string{
			"services: ip daddr . meta l4proto . th dport vmap @service-ips -> goto service-AAAA-ns/a/tcp/http",
			"numgen random mod 3 -> 0: goto endpoint-A1",
			"route: 10.180.1.1 is not local -> forward",
			"masquerading: meta mark & 0x00004000 == 0 return, back to nat-postrouting",
		},
	}, {
		name: "cluster IP from outside the cluster: marked, then masqueraded",
		pkt:  pkt(tcp, "203.0.113.5:40000", "10.96.0.10:80", "eth0"),
		want: []string{out("accept", a1, true, third), out("accept", a2, true, third), out("accept", a3, true, third)},
		pathHas: []string{
			"service-AAAA-ns/a/tcp/http: ip daddr 10.96.0.10 tcp dport 80 ip saddr != 10.180.0.0/16 jump mark-for-masquerade",
			"masquerading: masquerade fully-random -> masquerade, accept",
		},
	}, {
		name: "hairpin: an endpoint reaching its own service is masqueraded only when it lands on itself",
		pkt:  pkt(tcp, "10.180.1.1:40000", "10.96.0.10:80", "cali1"),
		want: []string{out("accept", a1, true, third), out("accept", a2, false, third), out("accept", a3, false, third)},
	}, {
		name:    "node port on a local address: fib daddr type local matches",
		pkt:     pkt(tcp, "203.0.113.5:40000", "10.0.0.10:30080", "eth0"),
		want:    []string{out("accept", a1, true, third), out("accept", a2, true, third), out("accept", a3, true, third)},
		pathHas: []string{"services: fib daddr type local meta l4proto . th dport vmap @service-nodeports -> goto external-AAAA-ns/a/tcp/http"},
	}, {
		name:    "node port on another node's address: not a node port here, forwarded untouched",
		pkt:     pkt(tcp, "203.0.113.5:40000", "10.0.0.11:30080", "eth0"),
		want:    []string{out("accept", "", false, 1)},
		pathHas: []string{"route: 10.0.0.11 is not local -> forward"},
	}, {
		name: "node port without a host address list: nothing is local",
		host: trace.Host{LocalAddrs: []netip.Addr{}},
		pkt:  pkt(tcp, "203.0.113.5:40000", "10.0.0.10:30080", "eth0"),
		want: []string{out("accept", "", false, 1)},
	}, {
		name:    "node port from a process on the node: output hook, masqueraded",
		pkt:     pkt(tcp, "10.0.0.10:40000", "10.0.0.10:30080", ""),
		want:    []string{out("accept", a1, true, third), out("accept", a2, true, third), out("accept", a3, true, third)},
		pathHas: []string{"hook output", "ip kube-proxy filter-output (filter, priority -110)", "ip kube-proxy filter-output-post-dnat (filter, priority -90)", "route: to 10.180.1.1", "hook postrouting"},
	}, {
		name: "cluster IP from a process on the node: source outside the pod network is masqueraded",
		pkt:  pkt(tcp, "10.0.0.10:40000", "10.96.0.10:80", ""),
		want: []string{out("accept", a1, true, third), out("accept", a2, true, third), out("accept", a3, true, third)},
	}, {
		name:    "no endpoints, tcp: rejected in filter-forward",
		pkt:     pkt(tcp, "10.180.1.7:40000", "10.96.0.20:80", "cali1"),
		want:    []string{out("reject", "", false, 1)},
		pathHas: []string{"filter-forward: ct state new jump service-endpoints-check", "-> goto reject-chain", "reject-chain: reject -> reject"},
	}, {
		name:    "no endpoints, udp: dropped by the map verdict",
		pkt:     pkt(udp, "10.180.1.7:40000", "10.96.0.20:53", "cali1"),
		want:    []string{out("drop", "", false, 1)},
		pathHas: []string{"service-endpoints-check: ip daddr . meta l4proto . th dport vmap @no-endpoint-services -> drop"},
	}, {
		name:    "no endpoints, node port: local destination, rejected in filter-input",
		pkt:     pkt(tcp, "203.0.113.5:40000", "10.0.0.10:30020", "eth0"),
		want:    []string{out("reject", "", false, 1)},
		pathHas: []string{"route: 10.0.0.10 is local -> input", "filter-input: ct state new jump nodeport-endpoints-check"},
	}, {
		name:    "no endpoints, from a process on the node: rejected in filter-output",
		pkt:     pkt(tcp, "10.0.0.10:40000", "10.96.0.20:80", ""),
		want:    []string{out("reject", "", false, 1)},
		pathHas: []string{"filter-output: ct state new jump service-endpoints-check"},
	}, {
		name: "undefined port of a service IP: no map element, passes untouched",
		pkt:  pkt(tcp, "10.180.1.7:40000", "10.96.0.10:81", "cali1"),
		want: []string{out("accept", "", false, 1)},
	}, {
		name: "udp to a tcp service port: the protocol is part of the key",
		pkt:  pkt(udp, "10.180.1.7:40000", "10.96.0.10:80", "cali1"),
		want: []string{out("accept", "", false, 1)},
	}, {
		name: "sctp to a tcp node port: no match",
		pkt:  pkt(sctp, "203.0.113.5:40000", "10.0.0.10:30080", "eth0"),
		want: []string{out("accept", "", false, 1)},
	}, {
		name: "IPv6 packet against an IPv4-only ruleset: no chains, accepted",
		pkt:  pkt(tcp, "[2001:db8::1]:40000", "[fd00:96::a]:80", "eth0"),
		want: []string{out("accept", "", false, 1)},
	}}.withRulesAndHost(rules, node4))
}

func (cs traceCases) withRulesAndHost(rules string, h trace.Host) []traceCase {
	for i := range cs {
		if cs[i].rules == "" {
			cs[i].rules = rules
		}
		if cs[i].host.LocalAddrs == nil {
			cs[i].host = h
		}
	}
	return cs
}

type traceCases []traceCase

func TestTraceIPv6(t *testing.T) {
	d1, d2 := "[fd00:180::1]:53", "[fd00:180::2]:53"
	runTraceCases(t, traceCases{{
		name:    "vmap on ip6 daddr . meta l4proto . th dport, numgen over two endpoints",
		pkt:     pkt(udp, "[fd00:180::5]:40000", "[fd00:96::a]:53", "cali1"),
		want:    []string{out("accept", d1, false, 0.5), out("accept", d2, false, 0.5)},
		pathHas: []string{"services: ip6 daddr . meta l4proto . th dport vmap @service-ips -> goto service-D-ns/d/udp/dns"},
	}, {
		name: "off-cluster IPv6 client: negated prefix match marks, then masquerade",
		pkt:  pkt(udp, "[2001:db8::1]:40000", "[fd00:96::a]:53", "eth0"),
		want: []string{out("accept", d1, true, 0.5), out("accept", d2, true, 0.5)},
	}, {
		name: "from a process on the node",
		pkt:  pkt(udp, "[fd00:10::10]:40000", "[fd00:96::a]:53", ""),
		want: []string{out("accept", d1, true, 0.5), out("accept", d2, true, 0.5)},
	}, {
		name: "tcp to the udp service: no element",
		pkt:  pkt(tcp, "[fd00:180::5]:40000", "[fd00:96::a]:53", "cali1"),
		want: []string{out("accept", "", false, 1)},
	}}.withRulesAndHost(baseV6, node6))
}

func TestTraceDualStack(t *testing.T) {
	r, err := ParseNFT(join(baseV4, svcA, baseV6))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		pkt  trace.Packet
		want []netip.AddrPort
	}{
		{pkt(tcp, "10.180.1.7:40000", "10.96.0.10:80", "cali1"), []netip.AddrPort{
			netip.MustParseAddrPort("10.180.1.1:8080"), netip.MustParseAddrPort("10.180.2.1:8080"), netip.MustParseAddrPort("10.180.3.1:8080")}},
		{pkt(udp, "[fd00:180::5]:40000", "[fd00:96::a]:53", "cali1"), []netip.AddrPort{
			netip.MustParseAddrPort("[fd00:180::1]:53"), netip.MustParseAddrPort("[fd00:180::2]:53")}},
	} {
		res, err := r.Trace(tc.pkt, trace.Host{})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(tc.want, res.Endpoints(), cmpopts.EquateComparable(netip.AddrPort{})); diff != "" {
			t.Errorf("%s: endpoints (-want +got):\n%s", tc.pkt, diff)
		}
	}
}

// Hand-made rulesets for one construct each. The table is "ip t".
const tHead = "add table ip t\n"

func TestTraceSemantics(t *testing.T) {
	pre := func(name string, prio int) string {
		return fmt.Sprintf("add chain ip t %s { type filter hook prerouting priority %d ; }\n", name, prio)
	}
	runTraceCases(t, traceCases{{
		name: "accept ends its base chain only: the next base chain on the hook still runs",
		rules: tHead + pre("first", -200) + pre("second", 0) +
			"add rule ip t first accept\nadd rule ip t first drop\nadd rule ip t second tcp dport 22 drop\n",
		pkt:     pkt(tcp, "203.0.113.5:1000", "10.0.0.10:22", "eth0"),
		want:    []string{out("drop", "", false, 1)},
		pathHas: []string{"first: accept", "second: tcp dport 22 drop"},
	}, {
		name: "accept in a jumped chain ends the whole base chain",
		rules: tHead + pre("first", -200) + "add chain ip t sub\n" +
			"add rule ip t first jump sub\nadd rule ip t first drop\nadd rule ip t sub accept\n",
		pkt:  pkt(tcp, "203.0.113.5:1000", "10.0.0.10:22", "eth0"),
		want: []string{out("accept", "", false, 1)},
	}, {
		name: "base chains run by priority, not by creation order",
		rules: tHead + pre("late", 10) + pre("early", -10) +
			"add rule ip t late meta mark & 0x1 == 0 drop\nadd rule ip t early meta mark set meta mark | 0x1\n",
		pkt:  pkt(tcp, "203.0.113.5:1000", "10.0.0.10:22", "eth0"),
		want: []string{out("accept", "", false, 1)},
	}, {
		name: "return from a base chain applies its policy",
		rules: tHead + "add chain ip t in { type filter hook input priority 0 ; policy drop ; }\n" +
			"add rule ip t in tcp dport 22 accept\nadd rule ip t in return\n",
		pkt:     pkt(tcp, "203.0.113.5:1000", "10.0.0.10:80", "eth0"),
		want:    []string{out("drop", "", false, 1)},
		pathHas: []string{"in: return, policy drop"},
	}, {
		name: "policy drop: accepted port",
		rules: tHead + "add chain ip t in { type filter hook input priority 0 ; policy drop ; }\n" +
			"add rule ip t in tcp dport 22 accept\n",
		pkt:  pkt(tcp, "203.0.113.5:1000", "10.0.0.10:22", "eth0"),
		want: []string{out("accept", "", false, 1)},
	}, {
		name: "jump returns to the caller's next rule",
		rules: tHead + pre("base", 0) + "add chain ip t a\nadd chain ip t b\n" +
			"add rule ip t base jump a\nadd rule ip t base drop\nadd rule ip t a goto b\n",
		pkt:     pkt(tcp, "203.0.113.5:1000", "10.0.0.10:22", "eth0"),
		want:    []string{out("drop", "", false, 1)},
		pathHas: []string{"b: end, back to base"},
	}, {
		name: "goto from a base chain: the goto'd chain's end is the base chain's end",
		rules: tHead + pre("base", 0) + "add chain ip t b\n" +
			"add rule ip t base goto b\nadd rule ip t base drop\n",
		pkt:     pkt(tcp, "203.0.113.5:1000", "10.0.0.10:22", "eth0"),
		want:    []string{out("accept", "", false, 1)},
		pathHas: []string{"b: end, policy accept"},
	}, {
		name:    "reject is final",
		rules:   tHead + pre("a", 0) + pre("b", 10) + "add rule ip t a tcp dport 22 reject\nadd rule ip t b accept\n",
		pkt:     pkt(tcp, "203.0.113.5:1000", "10.0.0.10:22", "eth0"),
		want:    []string{out("reject", "", false, 1)},
		pathHas: []string{"a: tcp dport 22 reject -> reject"},
	}, {
		name:  "drop is final",
		rules: tHead + pre("a", 0) + pre("b", 10) + "add rule ip t a tcp dport 22 drop\nadd rule ip t b accept\n",
		pkt:   pkt(tcp, "203.0.113.5:1000", "10.0.0.10:22", "eth0"),
		want:  []string{out("drop", "", false, 1)},
	}, {
		name:  "meta l4proto match",
		rules: tHead + pre("a", 0) + "add rule ip t a meta l4proto udp drop\n",
		pkt:   pkt(udp, "203.0.113.5:1000", "10.0.0.10:53", "eth0"),
		want:  []string{out("drop", "", false, 1)},
	}, {
		name:  "iifname wildcard matches the prefix",
		rules: tHead + pre("a", 0) + "add rule ip t a iifname \"cali*\" drop\nadd rule ip t a iifname != \"eth0\" reject\n",
		pkt:   pkt(tcp, "10.180.1.5:1000", "10.0.0.10:22", "cali12ab"),
		want:  []string{out("drop", "", false, 1)},
	}, {
		name:  "negated iifname: eth0 passes",
		rules: tHead + pre("a", 0) + "add rule ip t a iifname \"cali*\" drop\nadd rule ip t a iifname != \"eth0\" reject\n",
		pkt:   pkt(tcp, "203.0.113.5:1000", "10.0.0.10:22", "eth0"),
		want:  []string{out("accept", "", false, 1)},
	}, {
		name:  "negated iifname: another interface is rejected",
		rules: tHead + pre("a", 0) + "add rule ip t a iifname \"cali*\" drop\nadd rule ip t a iifname != \"eth0\" reject\n",
		pkt:   pkt(tcp, "203.0.113.5:1000", "10.0.0.10:22", "wlan0"),
		want:  []string{out("reject", "", false, 1)},
	}, {
		name:  "a wildcard is a prefix, not a substring",
		rules: tHead + pre("a", 0) + "add rule ip t a iifname \"cali*\" drop\n",
		pkt:   pkt(tcp, "203.0.113.5:1000", "10.0.0.10:22", "xcali1"),
		want:  []string{out("accept", "", false, 1)},
	}, {
		name: "locally generated packets have an empty input interface",
		rules: tHead + "add chain ip t out { type filter hook output priority 0 ; }\n" +
			"add rule ip t out iifname != \"eth0\" reject\n",
		pkt:  pkt(tcp, "10.0.0.10:1000", "203.0.113.5:22", ""),
		want: []string{out("reject", "", false, 1)},
	}, {
		name: "fib saddr type local",
		rules: tHead + "add chain ip t out { type filter hook output priority 0 ; }\n" +
			"add rule ip t out fib saddr type local drop\n",
		pkt:  pkt(tcp, "10.0.0.10:1000", "203.0.113.5:22", ""),
		want: []string{out("drop", "", false, 1)},
	}, {
		name: "fib saddr type local: loopback is always local",
		rules: tHead + "add chain ip t out { type filter hook output priority 0 ; }\n" +
			"add rule ip t out fib saddr type local drop\n",
		pkt:  pkt(tcp, "127.0.0.1:1000", "127.0.0.1:22", ""),
		want: []string{out("drop", "", false, 1)},
	}, {
		name:  "address list: inside",
		rules: tHead + pre("a", 0) + "add rule ip t a ip saddr { 10.180.0.0/16, 10.0.0.0/24 } drop\n",
		pkt:   pkt(tcp, "10.0.0.11:1000", "10.0.0.10:22", "eth0"),
		want:  []string{out("drop", "", false, 1)},
	}, {
		name:  "negated address list: inside does not match",
		rules: tHead + pre("a", 0) + "add rule ip t a ip saddr != { 10.180.0.0/16, 10.0.0.0/24 } drop\n",
		pkt:   pkt(tcp, "10.180.7.7:1000", "10.0.0.10:22", "eth0"),
		want:  []string{out("accept", "", false, 1)},
	}, {
		name:  "negated address list: outside matches",
		rules: tHead + pre("a", 0) + "add rule ip t a ip saddr != { 10.180.0.0/16, 10.0.0.0/24 } drop\n",
		pkt:   pkt(tcp, "203.0.113.5:1000", "10.0.0.10:22", "eth0"),
		want:  []string{out("drop", "", false, 1)},
	}, {
		name: "negated named interval set: outside matches",
		rules: tHead + pre("a", 0) + "add set ip t cluster { type ipv4_addr ; flags interval ; }\n" +
			"add element ip t cluster { 10.180.0.0/16, 10.0.0.7 }\n" +
			"add rule ip t a ip saddr != @cluster drop\n",
		pkt:  pkt(tcp, "203.0.113.5:1000", "10.0.0.10:22", "eth0"),
		want: []string{out("drop", "", false, 1)},
	}, {
		name: "negated named interval set: a prefix member does not match",
		rules: tHead + pre("a", 0) + "add set ip t cluster { type ipv4_addr ; flags interval ; }\n" +
			"add element ip t cluster { 10.180.0.0/16, 10.0.0.7 }\n" +
			"add rule ip t a ip saddr != @cluster drop\n",
		pkt:  pkt(tcp, "10.180.9.9:1000", "10.0.0.10:22", "eth0"),
		want: []string{out("accept", "", false, 1)},
	}, {
		name: "negated named interval set: a single address member does not match",
		rules: tHead + pre("a", 0) + "add set ip t cluster { type ipv4_addr ; flags interval ; }\n" +
			"add element ip t cluster { 10.180.0.0/16, 10.0.0.7 }\n" +
			"add rule ip t a ip saddr != @cluster drop\n",
		pkt:  pkt(tcp, "10.0.0.7:1000", "10.0.0.10:22", "eth0"),
		want: []string{out("accept", "", false, 1)},
	}, {
		name: "vmap miss goes on with the next rule; a hit's verdict applies",
		rules: tHead + pre("a", 0) + "add map ip t ports { type inet_proto . inet_service : verdict ; }\n" +
			"add element ip t ports { tcp . 22 : accept, udp . 53 : drop }\n" +
			"add rule ip t a meta l4proto . th dport vmap @ports\nadd rule ip t a reject\n",
		pkt:  pkt(tcp, "203.0.113.5:1000", "10.0.0.10:80", "eth0"),
		want: []string{out("reject", "", false, 1)},
	}, {
		name: "vmap hit with accept",
		rules: tHead + pre("a", 0) + "add map ip t ports { type inet_proto . inet_service : verdict ; }\n" +
			"add element ip t ports { tcp . 22 : accept, udp . 53 : drop }\n" +
			"add rule ip t a meta l4proto . th dport vmap @ports\nadd rule ip t a reject\n",
		pkt:  pkt(tcp, "203.0.113.5:1000", "10.0.0.10:22", "eth0"),
		want: []string{out("accept", "", false, 1)},
	}, {
		name: "vmap on an interval map with a prefix key",
		rules: tHead + pre("a", 0) + "add map ip t fw { type ipv4_addr . inet_proto . inet_service : verdict ; flags interval ; }\n" +
			"add element ip t fw { 192.0.2.0/24 . tcp . 443 : drop }\n" +
			"add rule ip t a ip saddr . meta l4proto . th dport vmap @fw\n",
		pkt:  pkt(tcp, "192.0.2.77:1000", "10.0.0.10:443", "eth0"),
		want: []string{out("drop", "", false, 1)},
	}, {
		name: "a NAT binding stops the later nat chains of the hook",
		rules: tHead + "add chain ip t n1 { type nat hook prerouting priority -100 ; }\n" +
			"add chain ip t n2 { type nat hook prerouting priority -50 ; }\n" +
			"add rule ip t n1 tcp dport 80 meta l4proto tcp dnat to 10.1.0.1:8080\n" +
			"add rule ip t n2 meta l4proto tcp dnat to 10.2.0.2:9090\n",
		pkt:     pkt(tcp, "203.0.113.5:1000", "10.0.0.10:80", "eth0"),
		want:    []string{out("accept", "10.1.0.1:8080", false, 1)},
		pathHas: []string{"n2: skipped, NAT already set up for this connection"},
	}, {
		name: "without a binding the next nat chain runs",
		rules: tHead + "add chain ip t n1 { type nat hook prerouting priority -100 ; }\n" +
			"add chain ip t n2 { type nat hook prerouting priority -50 ; }\n" +
			"add rule ip t n1 tcp dport 80 meta l4proto tcp dnat to 10.1.0.1:8080\n" +
			"add rule ip t n2 meta l4proto tcp dnat to 10.2.0.2:9090\n",
		pkt:  pkt(tcp, "203.0.113.5:1000", "10.0.0.10:81", "eth0"),
		want: []string{out("accept", "10.2.0.2:9090", false, 1)},
	}, {
		name: "dnat ends its base chain: rules after it do not run",
		rules: tHead + "add chain ip t n { type nat hook prerouting priority -100 ; }\nadd chain ip t ep\n" +
			"add rule ip t n jump ep\nadd rule ip t n drop\n" +
			"add rule ip t ep meta l4proto tcp dnat to 10.1.0.1:8080\n",
		pkt:  pkt(tcp, "203.0.113.5:1000", "10.0.0.10:80", "eth0"),
		want: []string{out("accept", "10.1.0.1:8080", false, 1)},
	}, {
		name: "dnat with another protocol does not apply",
		rules: tHead + "add chain ip t n { type nat hook prerouting priority -100 ; }\n" +
			"add rule ip t n meta l4proto udp dnat to 10.1.0.1:8080\n",
		pkt:  pkt(tcp, "203.0.113.5:1000", "10.0.0.10:80", "eth0"),
		want: []string{out("accept", "", false, 1)},
	}, {
		name: "filter chains before DNAT see the original destination, after it the new one",
		rules: tHead + "add chain ip t fo { type filter hook output priority -110 ; }\n" +
			"add chain ip t no { type nat hook output priority -100 ; }\n" +
			"add chain ip t fpost { type filter hook output priority -90 ; }\n" +
			"add rule ip t fo ip daddr 10.180.9.9 drop\n" +
			"add rule ip t no ip daddr 10.96.0.1 meta l4proto tcp dnat to 10.180.9.9:80\n" +
			"add rule ip t fpost ip daddr 10.180.9.9 tcp dport 80 reject\n",
		pkt:  pkt(tcp, "10.0.0.10:1000", "10.96.0.1:443", ""),
		want: []string{out("reject", "10.180.9.9:80", false, 1)},
	}, {
		name: "a mark set on the packet before the ruleset counts",
		rules: tHead + "add chain ip t post { type nat hook postrouting priority 100 ; }\n" +
			"add rule ip t post meta mark & 0x00004000 == 0 return\nadd rule ip t post masquerade\n",
		pkt:  func() trace.Packet { p := pkt(tcp, "10.0.0.10:1000", "203.0.113.5:80", ""); p.Mark = 0x4000; return p }(),
		want: []string{out("accept", "", true, 1)},
	}, {
		name: "masquerade only when marked: unmarked packets return first",
		rules: tHead + "add chain ip t post { type nat hook postrouting priority 100 ; }\n" +
			"add rule ip t post meta mark & 0x00004000 == 0 return\nadd rule ip t post masquerade\n",
		pkt:     pkt(tcp, "10.0.0.10:1000", "203.0.113.5:80", ""),
		want:    []string{out("accept", "", false, 1)},
		pathHas: []string{"post: meta mark & 0x00004000 == 0 return, policy accept"},
	}, {
		name: "counter and comments do not change the path",
		rules: tHead + pre("a", 0) + "add rule ip t a counter comment \"count all\"\n" +
			"add rule ip t a tcp dport 22 counter drop comment \"no ssh\"\n",
		pkt:     pkt(tcp, "203.0.113.5:1000", "10.0.0.10:22", "eth0"),
		want:    []string{out("drop", "", false, 1)},
		pathHas: []string{`a: counter comment "count all"`, `a: tcp dport 22 counter drop comment "no ssh"`},
	}, {
		name: "numgen with a repeated branch: two outcomes, one endpoint",
		rules: tHead + "add chain ip t n { type nat hook prerouting priority -100 ; }\nadd chain ip t ep\n" +
			"add rule ip t n numgen random mod 2 vmap { 0 : goto ep, 1 : goto ep }\n" +
			"add rule ip t ep meta l4proto tcp dnat to 10.1.0.1:8080\n",
		pkt:  pkt(tcp, "203.0.113.5:1000", "10.0.0.10:80", "eth0"),
		want: []string{out("accept", "10.1.0.1:8080", false, 0.5), out("accept", "10.1.0.1:8080", false, 0.5)},
	}, {
		name: "dnat to numgen offset map: one outcome of 1/N per key of the service, other services' keys unused",
		rules: tHead + "add chain ip t n { type nat hook prerouting priority -100 ; }\n" +
			"add map ip t eps { typeof numgen random mod 1 : ip daddr . tcp dport ; }\n" +
			"add element ip t eps { 0 : 10.1.0.9 . 9, 1 : 10.1.0.1 . 8080, 2 : 10.1.0.2 . 8081, 3 : 10.1.0.3 . 8082 }\n" +
			"add element ip t eps { 4 : 10.1.0.9 . 9 }\n" +
			"add map ip t ueps { typeof numgen random mod 1 : ip daddr . udp dport ; }\n" +
			"add element ip t ueps { 0 : 10.1.0.9 . 9 }\n" +
			"add rule ip t n meta l4proto udp dnat ip to numgen random mod 1 map @ueps\n" +
			"add rule ip t n meta l4proto tcp dnat ip to numgen random mod 3 offset 1 map @eps\n",
		pkt: pkt(tcp, "203.0.113.5:1000", "10.0.0.10:80", "eth0"),
		want: []string{out("accept", "10.1.0.1:8080", false, 1.0/3), out("accept", "10.1.0.2:8081", false, 1.0/3),
			out("accept", "10.1.0.3:8082", false, 1.0/3)},
		pathHas: []string{"n: meta l4proto tcp dnat ip to numgen random mod 3 offset 1 map @eps -> 1 (p=1/3): dnat to 10.1.0.1:8080, accept"},
	}, {
		name: "dnat to numgen offset map: a key the map lacks fails the rule, the next rule decides",
		rules: tHead + "add chain ip t n { type nat hook prerouting priority -100 ; }\n" +
			"add map ip t eps { typeof numgen random mod 1 : ip daddr . tcp dport ; }\n" +
			"add element ip t eps { 7 : 10.1.0.1 . 8080 }\n" +
			"add element ip t eps { 8 : 10.1.0.2 . 8080 }\n" +
			"delete element ip t eps { 8 : 10.1.0.2 . 8080 }\n" +
			"add rule ip t n meta l4proto tcp dnat ip to numgen random mod 2 offset 7 map @eps\n" +
			"add rule ip t n drop\n",
		pkt:  pkt(tcp, "203.0.113.5:1000", "10.0.0.10:80", "eth0"),
		want: []string{out("accept", "10.1.0.1:8080", false, 0.5), out("drop", "", false, 0.5)},
	}, {
		name: "dnat to a map keyed by service: the packet's address and port pick the service's keys, 1/N each",
		rules: tHead + "add chain ip t n { type nat hook prerouting priority -100 ; }\n" +
			"add map ip t ceps { typeof ip daddr . tcp dport . numgen random mod 1 : ip daddr . tcp dport ; }\n" +
			"add element ip t ceps { 10.0.0.10 . 80 . 0 : 10.1.0.1 . 8080, 10.0.0.10 . 80 . 1 : 10.1.0.2 . 8081 }\n" +
			// Same index, other service or other port: not used.
			"add element ip t ceps { 10.0.0.11 . 80 . 0 : 10.1.0.9 . 9, 10.0.0.10 . 81 . 0 : 10.1.0.9 . 9, 10.0.0.10 . 80 . 2 : 10.1.0.9 . 9 }\n" +
			"add map ip t uceps { typeof ip daddr . udp dport . numgen random mod 1 : ip daddr . udp dport ; }\n" +
			"add element ip t uceps { 10.0.0.10 . 80 . 0 : 10.1.0.9 . 9 }\n" +
			"add rule ip t n meta l4proto udp dnat ip to ip daddr . th dport . numgen random mod 1 map @uceps\n" +
			"add rule ip t n meta l4proto tcp dnat ip to ip daddr . th dport . numgen random mod 2 map @ceps\n",
		pkt:     pkt(tcp, "203.0.113.5:1000", "10.0.0.10:80", "eth0"),
		want:    []string{out("accept", "10.1.0.1:8080", false, 0.5), out("accept", "10.1.0.2:8081", false, 0.5)},
		pathHas: []string{"n: meta l4proto tcp dnat ip to ip daddr . th dport . numgen random mod 2 map @ceps -> 10.0.0.10 . 80 . 0 (p=1/2): dnat to 10.1.0.1:8080, accept"},
	}, {
		name: "dnat to a map keyed by service: a missing key fails the rule, deleted keys are gone",
		rules: tHead + "add chain ip t n { type nat hook prerouting priority -100 ; }\n" +
			"add map ip t ceps { typeof ip daddr . tcp dport . numgen random mod 1 : ip daddr . tcp dport ; }\n" +
			"add element ip t ceps { 10.0.0.10 . 80 . 0 : 10.1.0.1 . 8080 }\n" +
			"add element ip t ceps { 10.0.0.10 . 80 . 1 : 10.1.0.2 . 8080 }\n" +
			"delete element ip t ceps { 10.0.0.10 . 80 . 1 : 10.1.0.2 . 8080 }\n" +
			"add rule ip t n meta l4proto tcp dnat ip to ip daddr . th dport . numgen random mod 2 map @ceps\n" +
			"add rule ip t n drop\n",
		pkt:  pkt(tcp, "203.0.113.5:1000", "10.0.0.10:80", "eth0"),
		want: []string{out("accept", "10.1.0.1:8080", false, 0.5), out("drop", "", false, 0.5)},
	}}.withRulesAndHost("", node4))
}

func TestAffinity(t *testing.T) {
	r, err := ParseNFT(join(baseV4, svcC))
	if err != nil {
		t.Fatal(err)
	}
	client := pkt(tcp, "203.0.113.9:40000", "10.96.0.30:443", "eth0")
	c1, c2 := "10.180.2.5:443", "10.180.3.5:443"
	upd1 := "add element ip kube-proxy affinity-C1-ns/c/tcp/https__10.180.2.5/443 { 203.0.113.9 }"
	upd2 := "add element ip kube-proxy affinity-C2-ns/c/tcp/https__10.180.3.5/443 { 203.0.113.9 }"

	first, err := r.Trace(client, node4)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{out("accept", c1, false, 0.5), out("accept", c2, false, 0.5)}, summarize(first)); diff != "" {
		t.Fatalf("first connection (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([][]string{{upd1}, {upd2}}, [][]string{first.Outcomes[0].AffinityUpdates, first.Outcomes[1].AffinityUpdates}); diff != "" {
		t.Errorf("affinity updates (-want +got):\n%s", diff)
	}

	// The kernel picked endpoint 2: the next connection sticks to it.
	if err := r.Remember(first.Outcomes[1]); err != nil {
		t.Fatal(err)
	}
	second, err := r.Trace(client, node4)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{out("accept", c2, false, 1)}, summarize(second)); diff != "" {
		t.Errorf("second connection (-want +got):\n%s", diff)
	}
	if !strings.Contains(strings.Join(second.Outcomes[0].Path, "\n"),
		"service-CCCC-ns/c/tcp/https: ip saddr @affinity-C2-ns/c/tcp/https__10.180.3.5/443 goto endpoint-C2") {
		t.Errorf("second connection did not stick through the affinity set:\n%s", second)
	}

	// Another client is not affected.
	other := client
	other.Src = netip.MustParseAddr("203.0.113.10")
	res, err := r.Trace(other, node4)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Outcomes) != 2 {
		t.Errorf("other client: got %d outcomes, want 2", len(res.Outcomes))
	}

	// Pre-populating a set by hand works the same way.
	if err := r.Apply("add element ip kube-proxy affinity-C1-ns/c/tcp/https__10.180.2.5/443 { 203.0.113.10 }"); err != nil {
		t.Fatal(err)
	}
	res, err = r.Trace(other, node4)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{out("accept", c1, false, 1)}, summarize(res)); diff != "" {
		t.Errorf("pre-populated client (-want +got):\n%s", diff)
	}
}

// TestPartialSyncs applies later transactions over a full sync.
func TestPartialSyncs(t *testing.T) {
	full := join(baseV4, svcA, svcB)
	a1, a2, a3 := "10.180.1.1:8080", "10.180.2.1:8080", "10.180.3.1:8080"
	runTraceCases(t, traceCases{{
		name: "an endpoint goes away: chains flushed and rewritten, its chain deleted",
		rules: full + `flush chain ip kube-proxy service-AAAA-ns/a/tcp/http
add rule ip kube-proxy service-AAAA-ns/a/tcp/http ip daddr 10.96.0.10 tcp dport 80 ip saddr != 10.180.0.0/16 jump mark-for-masquerade
add rule ip kube-proxy service-AAAA-ns/a/tcp/http numgen random mod 2 vmap { 0 : goto endpoint-A1-ns/a/tcp/http__10.180.1.1/8080, 1 : goto endpoint-A2-ns/a/tcp/http__10.180.2.1/8080 }
flush chain ip kube-proxy endpoint-A3-ns/a/tcp/http__10.180.3.1/8080
delete chain ip kube-proxy endpoint-A3-ns/a/tcp/http__10.180.3.1/8080
`,
		pkt:  pkt(tcp, "10.180.1.7:40000", "10.96.0.10:80", "cali1"),
		want: []string{out("accept", a1, false, 0.5), out("accept", a2, false, 0.5)},
	}, {
		name: "the service goes away: map elements deleted, chains flushed then deleted",
		rules: full + `delete element ip kube-proxy service-ips { 10.96.0.10 . tcp . 80 }
delete element ip kube-proxy service-nodeports { tcp . 30080 }
flush chain ip kube-proxy external-AAAA-ns/a/tcp/http
flush chain ip kube-proxy service-AAAA-ns/a/tcp/http
delete chain ip kube-proxy external-AAAA-ns/a/tcp/http
delete chain ip kube-proxy service-AAAA-ns/a/tcp/http
`,
		pkt:  pkt(tcp, "10.180.1.7:40000", "10.96.0.10:80", "cali1"),
		want: []string{out("accept", "", false, 1)},
	}, {
		name:  "a no-endpoints element is deleted: no more reject",
		rules: full + "delete element ip kube-proxy no-endpoint-services { 10.96.0.20 . tcp . 80 }\n",
		pkt:   pkt(tcp, "10.180.1.7:40000", "10.96.0.20:80", "cali1"),
		want:  []string{out("accept", "", false, 1)},
	}, {
		name:  "the other no-endpoints element stays",
		rules: full + "delete element ip kube-proxy no-endpoint-services { 10.96.0.20 . tcp . 80 }\n",
		pkt:   pkt(udp, "10.180.1.7:40000", "10.96.0.20:53", "cali1"),
		want:  []string{out("drop", "", false, 1)},
	}, {
		name:  "a rule deleted by its text",
		rules: full + "delete rule ip kube-proxy masquerading masquerade fully-random\n",
		pkt:   pkt(tcp, "203.0.113.5:40000", "10.96.0.20:81", "eth0"),
		want:  []string{out("accept", "", false, 1)},
	}, {
		name:  "a rule deleted by its text: marked traffic is no longer masqueraded",
		rules: full + "delete rule ip kube-proxy masquerading masquerade fully-random\n",
		pkt:   pkt(tcp, "203.0.113.5:40000", "10.0.0.10:30080", "eth0"),
		want:  []string{out("accept", a1, false, third), out("accept", a2, false, third), out("accept", a3, false, third)},
	}, {
		name: "an element deleted and re-added with another verdict",
		rules: full + "add chain ip kube-proxy service-B-ns/b/tcp/http\n" +
			"add rule ip kube-proxy service-B-ns/b/tcp/http meta l4proto tcp dnat to 10.180.4.4:80\n" +
			"delete element ip kube-proxy no-endpoint-services { 10.96.0.20 . tcp . 80 }\n" +
			"add element ip kube-proxy service-ips { 10.96.0.20 . tcp . 80 : goto service-B-ns/b/tcp/http }\n",
		pkt:  pkt(tcp, "10.180.1.7:40000", "10.96.0.20:80", "cali1"),
		want: []string{out("accept", "10.180.4.4:80", false, 1)},
	}, {
		name:  "flush map: cluster IPs stop, node ports still work",
		rules: full + "flush map ip kube-proxy service-ips\n",
		pkt:   pkt(tcp, "203.0.113.5:40000", "10.0.0.10:30080", "eth0"),
		want:  []string{out("accept", a1, true, third), out("accept", a2, true, third), out("accept", a3, true, third)},
	}, {
		name: "flush table removes the rules, elements stay",
		rules: full + "flush table ip kube-proxy\nadd rule ip kube-proxy filter-forward ip daddr . meta l4proto . th dport vmap @no-endpoint-services\n" +
			"add rule ip kube-proxy reject-chain reject\n",
		pkt:  pkt(tcp, "10.180.1.7:40000", "10.96.0.20:80", "cali1"),
		want: []string{out("reject", "", false, 1)},
	}, {
		name:  "flush table empties every chain: the reject chain too",
		rules: full + "flush table ip kube-proxy\nadd rule ip kube-proxy filter-forward ip daddr . meta l4proto . th dport vmap @no-endpoint-services\n",
		pkt:   pkt(tcp, "10.180.1.7:40000", "10.96.0.20:80", "cali1"),
		want:  []string{out("accept", "", false, 1)},
	}, {
		name:  "delete table",
		rules: full + "delete table ip kube-proxy\n",
		pkt:   pkt(tcp, "10.180.1.7:40000", "10.96.0.20:80", "cali1"),
		want:  []string{out("accept", "", false, 1)},
	}, {
		name:  "full sync again on top: add is idempotent for tables, chains, sets and elements",
		rules: full + full,
		pkt:   pkt(tcp, "10.180.1.7:40000", "10.96.0.10:80", "cali1"),
		// Rules are appended twice; the first copy decides.
		want: []string{out("accept", a1, false, third), out("accept", a2, false, third), out("accept", a3, false, third)},
	}}.withRulesAndHost("", node4))
}

func TestDeleteByHandleAndInsert(t *testing.T) {
	r, err := ParseNFT(tHead + "add chain ip t a { type filter hook prerouting priority 0 ; }\n" +
		"add rule ip t a tcp dport 22 drop\nadd rule ip t a tcp dport 23 drop\n")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Apply("delete rule ip t a handle 1\ninsert rule ip t a tcp dport 24 reject"); err != nil {
		t.Fatal(err)
	}
	want := tHead + "add chain ip t a { type filter hook prerouting priority 0 ; }\n" +
		"add rule ip t a tcp dport 24 reject\nadd rule ip t a tcp dport 23 drop\n"
	if diff := cmp.Diff(want, r.String()); diff != "" {
		t.Errorf("ruleset (-want +got):\n%s", diff)
	}
}

func TestTraceErrors(t *testing.T) {
	for _, tc := range []struct {
		name    string
		rules   string
		pkt     trace.Packet
		limit   bool
		wantErr string
	}{{
		name: "numgen inside numgen beyond the outcome bound",
		rules: tHead + "add chain ip t base { type filter hook prerouting priority 0 ; }\nadd chain ip t x\nadd chain ip t y\n" +
			"add rule ip t base numgen random mod 101 vmap { " + branches(101, "x") + " }\n" +
			"add rule ip t x numgen random mod 101 vmap { " + branches(101, "y") + " }\n",
		limit:   true,
		wantErr: "more than 10000 outcomes",
	}, {
		name:    "packet with an unsupported protocol",
		rules:   tHead,
		pkt:     trace.Packet{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), Proto: "ICMP"},
		wantErr: "not TCP, UDP or SCTP",
	}, {
		name:    "packet family that does not match its addresses",
		rules:   tHead,
		pkt:     trace.Packet{Family: 6, Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), Proto: tcp},
		wantErr: "does not match",
	}, {
		name:    "packet with mixed families",
		rules:   tHead,
		pkt:     trace.Packet{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("fd00::2"), Proto: tcp},
		wantErr: "different families",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := ParseNFT(tc.rules)
			if err != nil {
				t.Fatal(err)
			}
			p := tc.pkt
			if !p.Dst.IsValid() {
				p = pkt(tcp, "203.0.113.5:1000", "10.0.0.10:80", "eth0")
			}
			_, err = r.Trace(p, node4)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("got error %v, want one containing %q", err, tc.wantErr)
			}
			if errors.Is(err, trace.ErrLimit) != tc.limit {
				t.Errorf("errors.Is(err, trace.ErrLimit) = %v, want %v", !tc.limit, tc.limit)
			}
		})
	}
}

func branches(n int, chain string) string {
	var b []string
	for i := range n {
		b = append(b, fmt.Sprintf("%d : goto %s", i, chain))
	}
	return strings.Join(b, ", ")
}

func TestResultHelpers(t *testing.T) {
	r, err := ParseNFT(join(baseV4, svcA, svcB))
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.Trace(pkt(tcp, "203.0.113.5:40000", "10.96.0.10:80", "eth0"), node4)
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.AddrPort{
		netip.MustParseAddrPort("10.180.1.1:8080"), netip.MustParseAddrPort("10.180.2.1:8080"), netip.MustParseAddrPort("10.180.3.1:8080"),
	}
	if diff := cmp.Diff(want, res.Endpoints(), cmpopts.EquateComparable(netip.AddrPort{})); diff != "" {
		t.Errorf("Endpoints (-want +got):\n%s", diff)
	}
	s := res.String()
	for _, line := range []string{
		"packet: tcp 203.0.113.5:40000 -> 10.96.0.10:80 in eth0\n",
		"outcome 1/3 (p=0.3333): accept, dnat to 10.180.1.1:8080, masquerade\n",
		"    hook prerouting\n",
		"    route: 10.180.3.1 is not local -> forward\n",
	} {
		if !strings.Contains(s, line) {
			t.Errorf("String() lacks %q:\n%s", line, s)
		}
	}

	// Rejected and dropped outcomes are not endpoints.
	res, err = r.Trace(pkt(tcp, "10.180.1.7:40000", "10.96.0.20:80", "cali1"), node4)
	if err != nil {
		t.Fatal(err)
	}
	if eps := res.Endpoints(); len(eps) != 0 {
		t.Errorf("Endpoints of a rejected packet = %v, want none", eps)
	}
	if !strings.Contains(res.String(), "outcome 1/1 (p=1): reject\n") {
		t.Errorf("String() of a rejected packet:\n%s", res)
	}
}
