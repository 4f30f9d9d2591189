package iptables

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/trace"
	"github.com/kproxy/kproxy/internal/trace/tracetest"
)

const (
	tcp  = v1.ProtocolTCP
	udp  = v1.ProtocolUDP
	sctp = v1.ProtocolSCTP
)

var out, summarize = tracetest.Out, tracetest.Summarize

// pkt builds a packet: iif "" means a local process.
func pkt(proto v1.Protocol, src, dst string, dport uint16, iif string) trace.Packet {
	return trace.Packet{
		Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr(dst),
		Proto: proto, SrcPort: 40000, DstPort: dport, IIF: iif,
	}
}

type traceCase struct {
	name  string
	rules string // default allServices
	host  *trace.Host
	// routeLocalnet sets Ruleset.RouteLocalnet.
	routeLocalnet bool
	pkt           trace.Packet
	want          []string
	// pathHas are substrings that must appear in the first outcome's path.
	pathHas []string
}

func runTraceCases(t *testing.T, cases []traceCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rules := tc.rules
			if rules == "" {
				rules = allServices
			}
			r, err := Parse([]byte(rules))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			r.RouteLocalnet = tc.routeLocalnet
			h := node4
			if tc.host != nil {
				h = *tc.host
			}
			res, err := r.Trace(tc.pkt, h)
			if err != nil {
				t.Fatalf("Trace: %v", err)
			}
			tracetest.Check(t, res, tc.want, tc.pathHas)
		})
	}
}

const third = 1.0 / 3

func TestTraceClusterIP(t *testing.T) {
	runTraceCases(t, []traceCase{{
		name: "pod to ClusterIP: three endpoints, a third each, no masquerade",
		pkt:  pkt(tcp, "10.180.1.5", "10.96.0.1", 80, "cali1"),
		want: []string{
			out("accept", "10.180.1.1:8080", false, third),
			out("accept", "10.180.2.1:8080", false, third),
			out("accept", "10.180.3.1:8080", false, third),
		},
		pathHas: []string{"hook PREROUTING", "nat KUBE-SERVICES:", "statistic matched", "route: 10.180.1.1 is not local -> forward", "hook POSTROUTING"},
	}, {
		name: "hairpin: an endpoint reaching itself through the service is masqueraded",
		pkt:  pkt(tcp, "10.180.1.1", "10.96.0.1", 80, "cali1"),
		want: []string{
			out("accept", "10.180.1.1:8080", true, third),
			out("accept", "10.180.2.1:8080", false, third),
			out("accept", "10.180.3.1:8080", false, third),
		},
		pathHas: []string{"-s 10.180.1.1/32 -m comment --comment \"ns1/svc1:p80\" -j KUBE-MARK-MASQ", "-j MASQUERADE"},
	}, {
		name: "off-cluster client to ClusterIP is masqueraded",
		pkt:  pkt(tcp, "203.0.113.5", "10.96.0.1", 80, "eth0"),
		want: []string{
			out("accept", "10.180.1.1:8080", true, third),
			out("accept", "10.180.2.1:8080", true, third),
			out("accept", "10.180.3.1:8080", true, third),
		},
	}, {
		name: "host process to ClusterIP: nat OUTPUT, masqueraded (node IP is not a pod IP)",
		pkt:  pkt(tcp, "10.0.0.10", "10.96.0.1", 80, ""),
		want: []string{
			out("accept", "10.180.1.1:8080", true, third),
			out("accept", "10.180.2.1:8080", true, third),
			out("accept", "10.180.3.1:8080", true, third),
		},
		pathHas: []string{"hook OUTPUT", "nat OUTPUT (priority -100)", "filter OUTPUT (priority 0)", "route: to 10.180.1.1"},
	}, {
		name: "wrong port of a ClusterIP: no DNAT, forwarded as is",
		pkt:  pkt(tcp, "10.180.1.5", "10.96.0.1", 81, "cali1"),
		want: []string{out("accept", "", false, 1)},
	}, {
		name: "wrong protocol of a ClusterIP: no DNAT",
		pkt:  pkt(udp, "10.180.1.5", "10.96.0.1", 80, "cali1"),
		want: []string{out("accept", "", false, 1)},
	}, {
		name: "SCTP to a TCP ClusterIP: no DNAT",
		pkt:  pkt(sctp, "10.180.1.5", "10.96.0.1", 80, "cali1"),
		want: []string{out("accept", "", false, 1)},
	}})
}

func TestTraceNodePort(t *testing.T) {
	runTraceCases(t, []traceCase{{
		name: "external to NodePort: DNAT to any endpoint, masqueraded",
		pkt:  pkt(tcp, "203.0.113.5", "10.0.0.10", 30080, "eth0"),
		want: []string{
			out("accept", "10.180.1.1:8080", true, third),
			out("accept", "10.180.2.1:8080", true, third),
			out("accept", "10.180.3.1:8080", true, third),
		},
		pathHas: []string{"-m addrtype --dst-type LOCAL -j KUBE-NODEPORTS", "KUBE-MARK-MASQ", "mark 0x4000",
			"filter KUBE-FORWARD: -m comment --comment \"kubernetes forwarding rules\" -m mark --mark 0x4000/0x4000 -j ACCEPT",
			"-j MARK --set-xmark 0x4000/0x0 (mark 0x0)", "MASQUERADE --random-fully"},
	}, {
		name: "NodePort on an address that is not the node's: nothing happens",
		pkt:  pkt(tcp, "203.0.113.5", "10.0.0.11", 30080, "eth0"),
		want: []string{out("accept", "", false, 1)},
	}, {
		name: "a port that is no NodePort reaches the node itself",
		pkt:  pkt(tcp, "203.0.113.5", "10.0.0.10", 22, "eth0"),
		want: []string{out("accept", "", false, 1)},
		pathHas: []string{"route: 10.0.0.10 is local -> input", "filter INPUT (priority 0)",
			"nat INPUT (priority 100)"},
	}, {
		name:    "health check node port is accepted in filter INPUT",
		pkt:     pkt(tcp, "203.0.113.5", "10.0.0.10", 30500, "eth0"),
		want:    []string{out("accept", "", false, 1)},
		pathHas: []string{`filter KUBE-NODEPORTS: -p tcp -m comment --comment "ns2/svc2:p80 health check node port" -m tcp --dport 30500 -j ACCEPT`},
	}})
}

func TestTraceExternalTrafficPolicyLocal(t *testing.T) {
	runTraceCases(t, []traceCase{{
		name:    "external to NodePort: only the local endpoint, client IP kept",
		pkt:     pkt(tcp, "203.0.113.5", "10.0.0.10", 30081, "eth0"),
		want:    []string{out("accept", "10.180.1.2:80", false, 1)},
		pathHas: []string{"nat KUBE-EXT-BBBBBBBBBBBBBBBB: -j KUBE-SVL-BBBBBBBBBBBBBBBB"},
	}, {
		name: "external to the LoadBalancer IP: only the local endpoint",
		pkt:  pkt(tcp, "203.0.113.5", "192.0.2.2", 80, "eth0"),
		want: []string{out("accept", "10.180.1.2:80", false, 1)},
	}, {
		name: "pod to the LoadBalancer IP: short-circuited to all endpoints",
		pkt:  pkt(tcp, "10.180.1.5", "192.0.2.2", 80, "cali1"),
		want: []string{
			out("accept", "10.180.1.2:80", false, 0.5),
			out("accept", "10.180.2.2:80", false, 0.5),
		},
		pathHas: []string{`"pod traffic for ns2/svc2:p80 external destinations" -j KUBE-SVC-BBBBBBBBBBBBBBBB`},
	}, {
		name: "host process to NodePort: all endpoints, masqueraded",
		pkt:  pkt(tcp, "10.0.0.10", "10.0.0.10", 30081, ""),
		want: []string{
			out("accept", "10.180.1.2:80", true, 0.5),
			out("accept", "10.180.2.2:80", true, 0.5),
		},
		pathHas: []string{"masquerade LOCAL traffic", "route LOCAL traffic"},
	}, {
		name:    "no local endpoint: external traffic dropped in filter INPUT",
		pkt:     pkt(tcp, "203.0.113.5", "10.0.0.10", 30086, "eth0"),
		want:    []string{out("drop", "", false, 1)},
		pathHas: []string{"end of KUBE-EXT-FFFFFFFFFFFFFFFF, back to KUBE-NODEPORTS", "filter KUBE-EXTERNAL-SERVICES:", "has no local endpoints", "-j DROP"},
	}, {
		name: "no local endpoint: pod traffic still reaches the remote endpoint",
		pkt:  pkt(tcp, "10.180.1.5", "10.0.0.10", 30086, "cali1"),
		want: []string{out("accept", "10.180.2.6:80", false, 1)},
	}})
}

func TestTraceNoEndpoints(t *testing.T) {
	runTraceCases(t, []traceCase{{
		name:    "pod to ClusterIP: rejected in filter FORWARD",
		pkt:     pkt(tcp, "10.180.1.5", "10.96.0.3", 80, "cali1"),
		want:    []string{out("reject", "", false, 1)},
		pathHas: []string{"hook FORWARD", `filter KUBE-SERVICES: -d 10.96.0.3/32 -p tcp -m comment --comment "ns3/svc3:p80 has no endpoints" -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable`},
	}, {
		name:    "host process to ClusterIP: rejected in filter OUTPUT",
		pkt:     pkt(tcp, "10.0.0.10", "10.96.0.3", 80, ""),
		want:    []string{out("reject", "", false, 1)},
		pathHas: []string{"hook OUTPUT", "filter KUBE-SERVICES:"},
	}, {
		name:    "external to external IP: rejected in KUBE-EXTERNAL-SERVICES",
		pkt:     pkt(tcp, "203.0.113.5", "192.0.2.3", 80, "eth0"),
		want:    []string{out("reject", "", false, 1)},
		pathHas: []string{"filter KUBE-EXTERNAL-SERVICES:"},
	}, {
		name:    "external to NodePort: rejected in filter INPUT",
		pkt:     pkt(tcp, "203.0.113.5", "10.0.0.10", 30082, "eth0"),
		want:    []string{out("reject", "", false, 1)},
		pathHas: []string{"hook INPUT", "filter KUBE-EXTERNAL-SERVICES:"},
	}, {
		name: "host process to its own NodePort: rejected on the loopback pass",
		pkt:  pkt(tcp, "10.0.0.10", "10.0.0.10", 30082, ""),
		want: []string{out("reject", "", false, 1)},
		pathHas: []string{"route: 10.0.0.10 is local, the packet loops back through lo",
			"nat PREROUTING: not run, NAT is already set up", "hook INPUT", "filter KUBE-EXTERNAL-SERVICES:"},
	}, {
		name: "another port of that ClusterIP is not rejected",
		pkt:  pkt(tcp, "10.180.1.5", "10.96.0.3", 81, "cali1"),
		want: []string{out("accept", "", false, 1)},
	}})
}

func TestTraceLoadBalancerSourceRanges(t *testing.T) {
	runTraceCases(t, []traceCase{{
		name:    "allowed source reaches the endpoint",
		pkt:     pkt(tcp, "203.0.113.5", "192.0.2.4", 80, "eth0"),
		want:    []string{out("accept", "10.180.2.4:80", true, 1)},
		pathHas: []string{"nat KUBE-FW-DDDDDDDDDDDDDDDD: -s 203.0.113.0/25"},
	}, {
		name: "other source: not DNATed, dropped by KUBE-PROXY-FIREWALL",
		pkt:  pkt(tcp, "203.0.113.200", "192.0.2.4", 80, "eth0"),
		want: []string{out("drop", "", false, 1)},
		pathHas: []string{`nat KUBE-FW-DDDDDDDDDDDDDDDD: -m comment --comment "other traffic to ns4/svc4:p80 will be dropped by KUBE-PROXY-FIREWALL"`,
			"filter KUBE-PROXY-FIREWALL:", "-j DROP"},
	}, {
		name: "pods are filtered too",
		pkt:  pkt(tcp, "10.180.1.5", "192.0.2.4", 80, "cali1"),
		want: []string{out("drop", "", false, 1)},
	}, {
		name: "the ClusterIP is not filtered",
		pkt:  pkt(tcp, "203.0.113.200", "10.96.0.4", 80, "eth0"),
		want: []string{out("accept", "10.180.2.4:80", true, 1)},
	}})
}

func TestTraceLocalhostNodePort(t *testing.T) {
	noGuard := strings.Replace(allServices,
		`-A KUBE-FIREWALL -m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
`, "", 1)
	runTraceCases(t, []traceCase{{
		name: "host process to 127.0.0.1:NodePort: DNAT and masquerade",
		pkt:  pkt(tcp, "127.0.0.1", "127.0.0.1", 30080, ""),
		want: []string{
			out("accept", "10.180.1.1:8080", true, third),
			out("accept", "10.180.2.1:8080", true, third),
			out("accept", "10.180.3.1:8080", true, third),
		},
		pathHas: []string{"-m nfacct --nfacct-name localhost_nps_accepted_pkts -j KUBE-EXT-AAAAAAAAAAAAAAAA"},
	}, {
		name:          "martian to 127.0.0.1 from eth0 with route_localnet: dropped by the KUBE-FIREWALL guard",
		routeLocalnet: true,
		pkt:           pkt(tcp, "203.0.113.5", "127.0.0.1", 10249, "eth0"),
		want:          []string{out("drop", "", false, 1)},
		pathHas: []string{"route: 127.0.0.1 is local -> input",
			`filter KUBE-FIREWALL: ! -s 127.0.0.0/8 -d 127.0.0.0/8`, "-j DROP"},
	}, {
		name:          "without the guard the same packet is delivered (CVE-2020-8558)",
		rules:         noGuard,
		routeLocalnet: true,
		pkt:           pkt(tcp, "203.0.113.5", "127.0.0.1", 10249, "eth0"),
		want:          []string{out("accept", "", false, 1)},
	}, {
		name:    "without route_localnet the kernel drops it as martian before INPUT",
		rules:   noGuard,
		pkt:     pkt(tcp, "203.0.113.5", "127.0.0.1", 10249, "eth0"),
		want:    []string{out("drop", "", false, 1)},
		pathHas: []string{"route: martian destination 127.0.0.1 on eth0 (route_localnet=0), dropped"},
	}, {
		name:          "a DNATed martian is not dropped by the guard (it is forwarded)",
		routeLocalnet: true,
		pkt:           pkt(tcp, "203.0.113.5", "127.0.0.1", 30080, "eth0"),
		want: []string{
			out("accept", "10.180.1.1:8080", true, third),
			out("accept", "10.180.2.1:8080", true, third),
			out("accept", "10.180.3.1:8080", true, third),
		},
	}, {
		// The guard exempts ctstate DNAT: a martian DNATed to another
		// loopback port still goes to INPUT with a 127/8 destination.
		name: "a martian DNATed to a loopback port passes the guard (ctstate DNAT)",
		rules: strings.Replace(allServices, `-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
`, `-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A PREROUTING -d 127.0.0.1 -p tcp -m tcp --dport 9000 -j DNAT --to-destination 127.0.0.1:9001
`, 1),
		routeLocalnet: true,
		pkt:           pkt(tcp, "203.0.113.5", "127.0.0.1", 9000, "eth0"),
		want:          []string{out("accept", "127.0.0.1:9001", false, 1)},
		pathHas:       []string{"route: 127.0.0.1 is local -> input", "filter INPUT: -j KUBE-FIREWALL", "end of KUBE-FIREWALL, back to INPUT"},
	}, {
		name: "host process to 127.0.0.1 on another port: loops back, the guard lets it pass",
		pkt:  pkt(tcp, "127.0.0.1", "127.0.0.1", 10249, ""),
		want: []string{out("accept", "", false, 1)},
		pathHas: []string{"route: 127.0.0.1 is local, the packet loops back through lo",
			"hook INPUT"},
	}, {
		name: "IPv6 ::1 from eth0 never reaches the hooks",
		rules: `*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
COMMIT
`,
		pkt:     pkt(tcp, "2001:db8::5", "::1", 30080, "eth0"),
		want:    []string{out("drop", "", false, 1)},
		pathHas: []string{"ipv6: loopback address on eth0, dropped before prerouting"},
	}})
}

func TestTraceAffinity(t *testing.T) {
	r, err := Parse([]byte(allServices))
	if err != nil {
		t.Fatal(err)
	}
	client := pkt(tcp, "10.180.1.5", "10.96.0.5", 80, "cali1")
	res, err := r.Trace(client, node4)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{out("accept", "10.180.2.5:80", false, 0.5), out("accept", "10.180.3.5:80", false, 0.5)}
	if diff := cmp.Diff(want, summarize(res)); diff != "" {
		t.Fatalf("first trace (-want +got):\n%s\n%s", diff, res)
	}
	wantUpdates := [][]string{
		{"echo +10.180.1.5 > /proc/net/xt_recent/KUBE-SEP-EEEEEEEEEEEEEEE1"},
		{"echo +10.180.1.5 > /proc/net/xt_recent/KUBE-SEP-EEEEEEEEEEEEEEE2"},
	}
	for i, o := range res.Outcomes {
		if diff := cmp.Diff(wantUpdates[i], o.AffinityUpdates); diff != "" {
			t.Errorf("outcome %d affinity updates (-want +got):\n%s", i, diff)
		}
	}
	// Trace must not have changed the ruleset.
	again, err := r.Trace(client, node4)
	if err != nil {
		t.Fatal(err)
	}
	if len(again.Outcomes) != 2 {
		t.Fatalf("trace changed the ruleset: %s", again)
	}

	if err := r.Remember(res.Outcomes[1]); err != nil {
		t.Fatal(err)
	}
	stuck, err := r.Trace(client, node4)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{out("accept", "10.180.3.5:80", false, 1)}, summarize(stuck)); diff != "" {
		t.Errorf("after Remember (-want +got):\n%s\n%s", diff, stuck)
	}
	path := strings.Join(stuck.Outcomes[0].Path, "\n")
	if !strings.Contains(path, "--rcheck --seconds 10800 --reap --name KUBE-SEP-EEEEEEEEEEEEEEE2") {
		t.Errorf("sticky path does not show the rcheck rule:\n%s", path)
	}

	other, err := r.Trace(pkt(tcp, "10.180.1.6", "10.96.0.5", 80, "cali1"), node4)
	if err != nil {
		t.Fatal(err)
	}
	if len(other.Outcomes) != 2 {
		t.Errorf("another client should not stick:\n%s", other)
	}

	if err := r.Remember(trace.Outcome{AffinityUpdates: []string{"add element ip kube-proxy affinity-x { 10.0.0.1 }"}}); err == nil {
		t.Error("Remember accepted an nft update")
	}
}

// TestTraceRecentMaskAndDest checks the recent match's --mask and --rdest:
// the kernel stores and compares the masked address.
func TestTraceRecentMaskAndDest(t *testing.T) {
	rules := `*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:SEP - [0:0]
-A PREROUTING -m recent --rcheck --name subnet --mask 255.255.255.0 -j DNAT --to-destination 10.180.9.9
-A PREROUTING -m recent --rcheck --name bydst --rdest -j SEP
-A PREROUTING -p tcp -j SEP
-A SEP -m recent --set --name subnet --mask 255.255.255.0 -m recent --set --name bydst --rdest -p tcp -j DNAT --to-destination 10.180.1.1:80
COMMIT
`
	r, err := Parse([]byte(rules))
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.Trace(pkt(tcp, "203.0.113.77", "10.96.0.1", 80, "eth0"), node4)
	if err != nil {
		t.Fatal(err)
	}
	wantUpdates := []string{
		"echo +203.0.113.0 > /proc/net/xt_recent/subnet",
		"echo +10.96.0.1 > /proc/net/xt_recent/bydst",
	}
	if diff := cmp.Diff(wantUpdates, res.Outcomes[0].AffinityUpdates); diff != "" {
		t.Fatalf("updates (-want +got):\n%s", diff)
	}
	if err := r.Remember(res.Outcomes[0]); err != nil {
		t.Fatal(err)
	}
	// Another host of the same /24 matches the masked entry.
	res, err = r.Trace(pkt(tcp, "203.0.113.5", "10.96.0.1", 80, "eth0"), node4)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{out("accept", "10.180.9.9:80", false, 1)}, summarize(res)); diff != "" {
		t.Errorf("masked rcheck (-want +got):\n%s\n%s", diff, res)
	}
	// A client of another /24 to the remembered destination matches --rdest.
	res, err = r.Trace(pkt(udp, "198.51.100.1", "10.96.0.1", 80, "eth0"), node4)
	if err != nil {
		t.Fatal(err)
	}
	path := strings.Join(res.Outcomes[0].Path, "\n")
	if !strings.Contains(path, "--rcheck --name bydst --rdest -j SEP") {
		t.Errorf("rdest rcheck did not match:\n%s", res)
	}
}

func TestTraceMatches(t *testing.T) {
	// Each chain tests one match; "-j ACCEPT" in nat PREROUTING does not
	// change the packet, so the DNAT to 10.180.0.N tells which rule won.
	base := func(rules string) string {
		return `*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
` + rules + `COMMIT
`
	}
	runTraceCases(t, []traceCase{{
		name: "negated source and destination",
		rules: base(`-A PREROUTING ! -s 10.180.0.0/16 -p tcp -j DNAT --to-destination 10.180.0.1
-A PREROUTING ! -d 10.96.0.1 -p tcp -j DNAT --to-destination 10.180.0.2
-A PREROUTING -p tcp -j DNAT --to-destination 10.180.0.3
`),
		pkt:  pkt(tcp, "10.180.1.5", "10.96.0.1", 80, "cali1"),
		want: []string{out("accept", "10.180.0.3:80", false, 1)},
	}, {
		name: "interface wildcard and negation",
		rules: base(`-A PREROUTING -i eth+ -p tcp -j DNAT --to-destination 10.180.0.1
-A PREROUTING ! -i cali+ -p tcp -j DNAT --to-destination 10.180.0.2
-A PREROUTING -i cali12 -p tcp -j DNAT --to-destination 10.180.0.3
-A PREROUTING -i cali123 -p tcp -j DNAT --to-destination 10.180.0.4
`),
		pkt:  pkt(tcp, "10.180.1.5", "10.96.0.1", 80, "cali123"),
		want: []string{out("accept", "10.180.0.4:80", false, 1)},
	}, {
		name: "port ranges, negated ports, source port",
		rules: base(`-A PREROUTING -p udp -m udp --dport 1:79 -j DNAT --to-destination 10.180.0.1
-A PREROUTING -p udp -m udp ! --dport 80 -j DNAT --to-destination 10.180.0.2
-A PREROUTING -p udp -m udp --sport 40001: -j DNAT --to-destination 10.180.0.3
-A PREROUTING -p udp --sport 40000 --dport 70:90 -j DNAT --to-destination 10.180.0.4
`),
		pkt:  pkt(udp, "10.180.1.5", "10.96.0.1", 80, "cali1"),
		want: []string{out("accept", "10.180.0.4:80", false, 1)},
	}, {
		name: "protocol numbers, all, and --syn",
		rules: base(`-A PREROUTING -p 17 -j DNAT --to-destination 10.180.0.1
-A PREROUTING -p tcp -m tcp ! --syn -j DNAT --to-destination 10.180.0.2
-A PREROUTING -p 132 -j ACCEPT
-A PREROUTING -p all -m mark --mark 0x1/0x1 -j ACCEPT
-A PREROUTING -p tcp --syn -j DNAT --to-destination 10.180.0.3:8080
`),
		pkt:  pkt(tcp, "10.180.1.5", "10.96.0.1", 80, "cali1"),
		want: []string{out("accept", "10.180.0.3:8080", false, 1)},
	}, {
		name: "mark set, or, xor and matched with masks",
		rules: base(`:A - [0:0]
-A PREROUTING -j MARK --set-xmark 0xf0/0xff
-A PREROUTING -j MARK --or-mark 0x1
-A PREROUTING -j MARK --xor-mark 0x10
-A PREROUTING -j MARK --and-mark 0xfff1
-A PREROUTING -j MARK --set-mark 0x100/0x100
-A PREROUTING -m mark --mark 0x1e1 -j A
-A PREROUTING -p tcp -j DNAT --to-destination 10.180.0.9
-A A -m mark ! --mark 0x1/0x1 -p tcp -j DNAT --to-destination 10.180.0.1
-A A -m mark --mark 0xe0/0xf0 -p tcp -j DNAT --to-destination 10.180.0.2
`),
		pkt:     pkt(tcp, "10.180.1.5", "10.96.0.1", 80, "cali1"),
		want:    []string{out("accept", "10.180.0.2:80", false, 1)},
		pathHas: []string{"(mark 0xf0)", "(mark 0xf1)", "(mark 0xe1)", "(mark 0x1e1)"},
	}, {
		name: "addrtype source and destination, negated",
		rules: base(`-A PREROUTING -m addrtype --src-type LOCAL -p tcp -j DNAT --to-destination 10.180.0.1
-A PREROUTING -m addrtype ! --dst-type UNICAST -p tcp -j DNAT --to-destination 10.180.0.2
-A PREROUTING -m addrtype --src-type UNICAST --dst-type UNICAST,MULTICAST -p tcp -j DNAT --to-destination 10.180.0.3
`),
		pkt:  pkt(tcp, "10.180.1.5", "10.96.0.1", 80, "cali1"),
		want: []string{out("accept", "10.180.0.3:80", false, 1)},
	}, {
		name: "addrtype multicast",
		rules: base(`-A PREROUTING -m addrtype --dst-type UNICAST -p udp -j DNAT --to-destination 10.180.0.1
-A PREROUTING -m addrtype --dst-type BROADCAST -p udp -j DNAT --to-destination 10.180.0.2
-A PREROUTING -m addrtype --dst-type MULTICAST -p udp -j DNAT --to-destination 10.180.0.3
`),
		pkt:  pkt(udp, "10.180.1.5", "239.1.2.3", 5000, "cali1"),
		want: []string{out("accept", "10.180.0.3:5000", false, 1)},
	}, {
		// The kernel classifies 0.0.0.0 as broadcast, like 255.255.255.255.
		name: "addrtype broadcast",
		rules: base(`-A PREROUTING -m addrtype --dst-type UNICAST,MULTICAST -p udp -j DNAT --to-destination 10.180.0.1
-A PREROUTING -m addrtype --src-type UNSPEC -p udp -j DNAT --to-destination 10.180.0.2
-A PREROUTING -m addrtype --src-type BROADCAST --dst-type BROADCAST -p udp -j DNAT --to-destination 10.180.0.3
`),
		pkt:  pkt(udp, "0.0.0.0", "255.255.255.255", 67, "eth0"),
		want: []string{out("accept", "10.180.0.3:67", false, 1)},
	}, {
		name: "the old state match",
		rules: base(`-A PREROUTING -m state --state ESTABLISHED,RELATED -p tcp -j DNAT --to-destination 10.180.0.1
-A PREROUTING -m state ! --state INVALID -p tcp -j DNAT --to-destination 10.180.0.2
`),
		pkt:  pkt(tcp, "10.180.1.5", "10.96.0.1", 80, "cali1"),
		want: []string{out("accept", "10.180.0.2:80", false, 1)},
	}, {
		name: "DNAT without a port keeps the destination port",
		rules: base(`-A OUTPUT -p udp -j DNAT --to-destination 10.180.0.7
`),
		pkt:  pkt(udp, "10.0.0.10", "10.96.0.1", 53, ""),
		want: []string{out("accept", "10.180.0.7:53", false, 1)},
	}, {
		name: "goto returns to the caller's caller",
		rules: base(`:A - [0:0]
:B - [0:0]
-A PREROUTING -j A
-A PREROUTING -p tcp -j DNAT --to-destination 10.180.0.2
-A A -g B
-A A -p tcp -j DNAT --to-destination 10.180.0.1
-A B -j RETURN
`),
		pkt:     pkt(tcp, "10.180.1.5", "10.96.0.1", 80, "cali1"),
		want:    []string{out("accept", "10.180.0.2:80", false, 1)},
		pathHas: []string{"nat B: -j RETURN, back to PREROUTING"},
	}, {
		name: "RETURN in a built-in chain applies its policy",
		rules: `*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
-A FORWARD -j RETURN
-A FORWARD -j ACCEPT
COMMIT
`,
		pkt:     pkt(tcp, "10.180.1.5", "10.96.0.1", 80, "cali1"),
		want:    []string{out("drop", "", false, 1)},
		pathHas: []string{"filter FORWARD: -j RETURN, policy DROP"},
	}, {
		name: "negated statistic and probabilities 0 and 1 do not fork",
		rules: base(`-A PREROUTING -m statistic --mode random --probability 0 -p tcp -j DNAT --to-destination 10.180.0.1
-A PREROUTING -m statistic --mode random ! --probability 0.25 -p tcp -j DNAT --to-destination 10.180.0.2
-A PREROUTING -m statistic --mode random --probability 1 -p tcp -j DNAT --to-destination 10.180.0.3
`),
		pkt:  pkt(tcp, "10.180.1.5", "10.96.0.1", 80, "cali1"),
		want: []string{out("accept", "10.180.0.2:80", false, 0.75), out("accept", "10.180.0.3:80", false, 0.25)},
	}, {
		name: "raw runs before conntrack: ctstate is INVALID there",
		rules: `*raw
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A PREROUTING -m conntrack --ctstate NEW -j DROP
-A PREROUTING -m conntrack ! --ctstate INVALID -j DROP
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A FORWARD -m conntrack --ctstate INVALID -j DROP
-A FORWARD -m conntrack --ctstate NEW -j REJECT
COMMIT
`,
		pkt:     pkt(tcp, "10.180.1.5", "10.96.0.1", 80, "cali1"),
		want:    []string{out("reject", "", false, 1)},
		pathHas: []string{"raw PREROUTING (priority -300)", "conntrack: new connection"},
	}, {
		name: "mangle runs before nat, security after filter",
		rules: `*mangle
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
-A PREROUTING -j MARK --set-xmark 0x4000/0x4000
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
-A PREROUTING -m mark --mark 0x4000/0x4000 -p tcp -j DNAT --to-destination 10.180.0.1
-A POSTROUTING -m conntrack --ctstate DNAT -j MASQUERADE
COMMIT
*security
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A FORWARD -m conntrack --ctstate DNAT -j ACCEPT
COMMIT
`,
		pkt:     pkt(tcp, "10.180.1.5", "10.96.0.1", 80, "cali1"),
		want:    []string{out("accept", "10.180.0.1:80", true, 1)},
		pathHas: []string{"mangle PREROUTING (priority -150)", "nat PREROUTING (priority -100)", "security FORWARD (priority 50)", "mangle POSTROUTING (priority -150)"},
	}, {
		name: "-o lo is known for a local process's packet to a local address",
		rules: `*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A OUTPUT -o lo -j DROP
COMMIT
`,
		pkt:  pkt(tcp, "10.0.0.10", "10.0.0.10", 80, ""),
		want: []string{out("drop", "", false, 1)},
	}, {
		name: "IPv6 ClusterIP",
		rules: `*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SVC-X - [0:0]
-A PREROUTING -d fd00:96::1/128 -p tcp -m tcp --dport 80 -j KUBE-SVC-X
-A KUBE-SVC-X -m statistic --mode random --probability 0.50000000000 -p tcp -j DNAT --to-destination [fd00:180::1]:8080
-A KUBE-SVC-X -p tcp -j DNAT --to-destination [fd00:180::2]:8080
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A FORWARD -p tcp -d fd00:96::2 -j REJECT --reject-with icmp6-port-unreachable
COMMIT
`,
		host: &trace.Host{LocalAddrs: []netip.Addr{netip.MustParseAddr("fd00:10::10")}},
		pkt:  pkt(tcp, "fd00:180::5", "fd00:96::1", 80, "cali1"),
		want: []string{out("accept", "[fd00:180::1]:8080", false, 0.5), out("accept", "[fd00:180::2]:8080", false, 0.5)},
	}})
}

func TestTraceErrors(t *testing.T) {
	r, err := Parse([]byte(allServices))
	if err != nil {
		t.Fatal(err)
	}
	outIface, err := Parse([]byte(`*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
-A POSTROUTING -o eth0 -j MASQUERADE
COMMIT
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		r    *Ruleset
		p    trace.Packet
		want string
		is   error
	}{
		{"no addresses", r, trace.Packet{Proto: tcp}, "valid source and destination", nil},
		{"mixed families", r, pkt(tcp, "10.0.0.1", "fd00::1", 80, "eth0"), "different families", nil},
		{"bad family", r, trace.Packet{Family: 5, Src: nodeIP, Dst: nodeIP, Proto: tcp}, "not 4 or 6", nil},
		{"family mismatch", r, trace.Packet{Family: 6, Src: nodeIP, Dst: nodeIP, Proto: tcp}, "does not match", nil},
		{"ICMP", r, pkt("ICMP", "10.0.0.1", "10.0.0.2", 0, "eth0"), "not TCP, UDP or SCTP", nil},
		{"IPv6 packet, IPv4 ruleset", r, pkt(tcp, "fd00::1", "fd00::2", 80, "eth0"), "holds IPv4 rules", nil},
		{"-o on a routed packet", outIface, pkt(tcp, "10.180.1.5", "203.0.113.5", 80, "cali1"), "output interface", ErrUnsupported},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.r.Trace(tc.p, node4)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("error %v does not wrap %v", err, tc.is)
			}
		})
	}
}

func TestTraceLimits(t *testing.T) {
	for _, tc := range []struct {
		name   string
		limits Limits
		want   string
	}{
		{"rule evaluations", Limits{MaxRuleEvaluations: 5}, "more than 5 rule evaluations"},
		{"jump depth", Limits{MaxJumpDepth: 3}, "jump depth above 3"},
		{"outcomes", Limits{MaxOutcomes: 2}, "more than 2 outcomes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Parse([]byte(allServices))
			if err != nil {
				t.Fatal(err)
			}
			r.Limits = tc.limits
			// PREROUTING -> KUBE-SERVICES -> KUBE-NODEPORTS -> KUBE-EXT ->
			// KUBE-MARK-MASQ: four jumps, three statistic branches.
			_, err = r.Trace(pkt(tcp, "203.0.113.5", "10.0.0.10", 30080, "eth0"), node4)
			if !errors.Is(err, trace.ErrLimit) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want ErrLimit with %q", err, tc.want)
			}
			r.Limits = Limits{}
			if _, err := r.Trace(pkt(tcp, "203.0.113.5", "10.0.0.10", 30080, "eth0"), node4); err != nil {
				t.Errorf("default limits: %v", err)
			}
		})
	}
}

func TestResultString(t *testing.T) {
	r, err := Parse([]byte(allServices))
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.Trace(pkt(tcp, "10.180.1.5", "10.96.0.5", 80, "cali1"), node4)
	if err != nil {
		t.Fatal(err)
	}
	s := res.String()
	for _, want := range []string{
		"packet: tcp 10.180.1.5:40000 -> 10.96.0.5:80 in cali1",
		"outcome 1/2 (p=0.5): accept, dnat to 10.180.2.5:80",
		"affinity: echo +10.180.1.5 > /proc/net/xt_recent/KUBE-SEP-EEEEEEEEEEEEEEE1",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("report lacks %q:\n%s", want, s)
		}
	}
}
