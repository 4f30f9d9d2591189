package nftables

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/kproxy/kproxy/internal/trace"
)

// listedV4 is baseV4 + svcA + svcB as `nft list table ip kube-proxy`
// prints it (nft 1.0 style: symbolic priorities, counters, "== 0x0",
// multi-line element lists, "# handle" comments from nft -a).
const listedV4 = `table ip kube-proxy { # handle 3
	comment "rules for kube-proxy"
	map service-ips {
		type ipv4_addr . inet_proto . inet_service : verdict
		comment "ClusterIP, ExternalIP and LoadBalancer IP traffic"
		elements = { 10.96.0.10 . tcp . 80 comment "ns/a:http" : goto service-AAAA-ns/a/tcp/http }
	}

	map service-nodeports {
		type inet_proto . inet_service : verdict
		comment "NodePort traffic"
		elements = { tcp . 30080 : goto external-AAAA-ns/a/tcp/http comment "ns/a:http" }
	}

	map no-endpoint-services {
		type ipv4_addr . inet_proto . inet_service : verdict
		elements = { 10.96.0.20 . tcp . 80 comment "ns/b:http has no endpoints" : goto reject-chain,
			     10.96.0.20 . udp . 53 comment "ns/b:dns has no endpoints" : drop }
	}

	map no-endpoint-nodeports {
		type inet_proto . inet_service : verdict
		elements = { tcp . 30020 : goto reject-chain }
	}

	chain filter-prerouting { # handle 1
		type filter hook prerouting priority dstnat - 10; policy accept;
	}

	chain filter-input {
		type filter hook input priority dstnat - 10; policy accept;
		ct state new jump nodeport-endpoints-check # handle 20
		ct state new jump service-endpoints-check
	}

	chain filter-forward {
		type filter hook forward priority dstnat - 10; policy accept;
		ct state new jump service-endpoints-check
	}

	chain filter-output {
		type filter hook output priority dstnat - 10; policy accept;
		ct state new jump service-endpoints-check
		ct state new jump nodeport-endpoints-check
	}

	chain filter-output-post-dnat {
		type filter hook output priority dstnat + 10; policy accept;
	}

	chain nat-prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		jump services
	}

	chain nat-output {
		type nat hook output priority dstnat; policy accept;
		jump services
	}

	chain nat-postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		jump masquerading
	}

	chain services {
		ip daddr . meta l4proto . th dport vmap @service-ips
		fib daddr type local meta l4proto . th dport vmap @service-nodeports
	}

	chain masquerading {
		meta mark & 0x00004000 == 0x00000000 return
		meta mark set meta mark ^ 0x00004000
		masquerade fully-random
	}

	chain mark-for-masquerade {
		meta mark set meta mark | 0x00004000
	}

	chain reject-chain {
		counter packets 3 bytes 180 reject
	}

	chain service-endpoints-check {
		ip daddr . meta l4proto . th dport vmap @no-endpoint-services
	}

	chain nodeport-endpoints-check {
		fib daddr type local meta l4proto . th dport vmap @no-endpoint-nodeports
	}

	chain service-AAAA-ns/a/tcp/http {
		ip daddr 10.96.0.10 tcp dport 80 ip saddr != 10.180.0.0/16 jump mark-for-masquerade
		numgen random mod 3 vmap { 0 : goto endpoint-A1-ns/a/tcp/http__10.180.1.1/8080, 1 : goto endpoint-A2-ns/a/tcp/http__10.180.2.1/8080, 2 : goto endpoint-A3-ns/a/tcp/http__10.180.3.1/8080 }
	}

	chain external-AAAA-ns/a/tcp/http {
		jump mark-for-masquerade comment "masquerade traffic from outside"
		goto service-AAAA-ns/a/tcp/http
	}

	chain endpoint-A1-ns/a/tcp/http__10.180.1.1/8080 {
		ip saddr 10.180.1.1 jump mark-for-masquerade
		meta l4proto tcp dnat to 10.180.1.1:8080
	}

	chain endpoint-A2-ns/a/tcp/http__10.180.2.1/8080 {
		ip saddr 10.180.2.1 jump mark-for-masquerade
		meta l4proto tcp dnat to 10.180.2.1:8080
	}

	chain endpoint-A3-ns/a/tcp/http__10.180.3.1/8080 {
		ip saddr 10.180.3.1 jump mark-for-masquerade
		meta l4proto tcp dnat ip to 10.180.3.1:8080
	}
}
`

// The listing creates sets before chains, the flat text the other way
// round: the dumps are compared as sorted lines, then packets are traced
// through both.
func TestNestedListingMatchesFlatText(t *testing.T) {
	flat, err := ParseNFT(join(baseV4, svcA, svcB))
	if err != nil {
		t.Fatal(err)
	}
	listed, err := ParseNFT(listedV4)
	if err != nil {
		t.Fatal(err)
	}
	// Same objects; the listing only differs in the reject-chain counter.
	want := strings.Replace(flat.String(), "add rule ip kube-proxy reject-chain reject", "add rule ip kube-proxy reject-chain counter reject", 1)
	if diff := cmp.Diff(sortedLines(want), sortedLines(listed.String())); diff != "" {
		t.Errorf("listing vs flat text (-flat +listing):\n%s", diff)
	}
	for _, p := range []trace.Packet{
		pkt(tcp, "203.0.113.5:40000", "10.0.0.10:30080", "eth0"),
		pkt(tcp, "10.180.1.7:40000", "10.96.0.20:80", "cali1"),
		pkt(tcp, "10.180.1.1:40000", "10.96.0.10:80", "cali1"),
	} {
		a, err := flat.Trace(p, node4)
		if err != nil {
			t.Fatal(err)
		}
		b, err := listed.Trace(p, node4)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(summarize(a), summarize(b)); diff != "" {
			t.Errorf("%s (-flat +listing):\n%s", p, diff)
		}
	}
}

func sortedLines(s string) []string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	slices.Sort(l)
	return l
}

func TestNestedDynamicSetAndRuleset(t *testing.T) {
	// Two tables (as `nft list ruleset` prints them), a dynamic set with
	// live elements carrying timeouts, and a flat partial sync after them.
	text := listedV4 + `table ip6 kube-proxy {
	chain nat-prerouting {
		type nat hook prerouting priority dstnat; policy accept;
	}
}
table ip aff {
	set affinity-1 {
		type ipv4_addr
		size 65535
		flags dynamic,timeout
		timeout 3h
		elements = { 203.0.113.9 timeout 3h expires 2h59m58s500ms,
			     203.0.113.10 timeout 3h expires 1h }
	}

	chain pre {
		type nat hook prerouting priority dstnat - 1; policy accept;
		ip saddr @affinity-1 meta l4proto tcp dnat to 10.180.9.9:80
	}
}
delete element ip aff affinity-1 { 203.0.113.10 }
`
	r, err := ParseNFT(text)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		src  string
		want []string
	}{
		{"203.0.113.9:1000", []string{out("accept", "10.180.9.9:80", false, 1)}},
		{"203.0.113.10:1000", []string{out("accept", "", false, 1)}},
	} {
		res, err := r.Trace(pkt(tcp, tc.src, "10.0.0.10:80", "eth0"), node4)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(tc.want, summarize(res)); diff != "" {
			t.Errorf("from %s (-want +got):\n%s", tc.src, diff)
		}
	}
}

func TestNestedErrors(t *testing.T) {
	for _, tc := range []struct {
		name     string
		text     string
		wantLine int
		wantErr  string
	}{
		{"unknown statement in a chain", "table ip t {\n\tchain c {\n\t\tlog prefix \"x\"\n\t}\n}\n", 3, `unsupported statement "log"`},
		{"bad priority", "table ip t {\n\tchain c {\n\t\ttype filter hook input priority nonsense; policy accept;\n\t}\n}\n", 3, `invalid priority "nonsense"`},
		{"unknown object", "table ip t {\n\tflowtable f {\n\t}\n}\n", 2, `unexpected "flowtable"`},
		{"unclosed table", "table ip t {\n\tchain c {\n\t}\n", 1, "table block is not closed"},
		{"unclosed chain", "table ip t {\n\tchain c {\n", 2, "chain block is not closed"},
		{"bad element", "table ip t {\n\tset s {\n\t\ttype ipv4_addr\n\t\telements = { 10.0.0.1,\n\t\t\t10.0.0.999 }\n\t}\n}\n", 2, `set s (lines 2-6): element of "s": invalid address "10.0.0.999"`},
		{"inet family", "table inet t {\n}\n", 1, `unsupported family "inet"`},
		{"jump to a chain no block declares", "table ip t {\n\tchain c {\n\t\tjump nope\n\t}\n}\n", 3, `jump to chain "nope", which does not exist`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseNFT(tc.text)
			var pe *trace.ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("got %v, want a *trace.ParseError", err)
			}
			if pe.Line != tc.wantLine || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("got line %d %q, want line %d containing %q", pe.Line, err, tc.wantLine, tc.wantErr)
			}
		})
	}
}

// TestNestedEndpointMapKeyedByService reads an endpoint map keyed by
// service and its rule as nft 1.0.6 lists them (captured from a kernel):
// typeof with the numgen key, elements ADDR . PORT . INDEX, and the rule
// listed without "meta l4proto" and with "tcp dport".
func TestNestedEndpointMapKeyedByService(t *testing.T) {
	text := `table ip kp {
	map service-ips {
		type ipv4_addr . inet_proto . inet_service : verdict
		elements = { 198.19.0.10 . tcp . 80 : goto cluster-tcp-2,
			     198.19.0.11 . tcp . 81 : goto cluster-tcp-1 }
	}

	map cluster-endpoints-tcp {
		typeof ip daddr . tcp dport . numgen random mod 1 : ip daddr . tcp dport
		elements = { 198.19.0.10 . 80 . 0 : 198.18.129.10 . 8080,
			     198.19.0.11 . 81 . 0 : 198.18.130.11 . 8081,
			     198.19.0.10 . 80 . 1 : 198.18.130.10 . 8080 }
	}

	chain services {
		ip daddr . meta l4proto . th dport vmap @service-ips
	}

	chain nat-prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		jump services
	}

	chain cluster-tcp-2 {
		ip saddr != 198.18.128.0/17 meta mark set meta mark | 0x00004000
		dnat ip to ip daddr . tcp dport . numgen random mod 2 map @cluster-endpoints-tcp
	}

	chain cluster-tcp-1 {
		dnat ip to ip daddr . tcp dport . numgen random mod 1 map @cluster-endpoints-tcp
	}
}
`
	r, err := ParseNFT(text)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		dst  string
		want []string
	}{
		{"198.19.0.10:80", []string{out("accept", "198.18.129.10:8080", false, 0.5), out("accept", "198.18.130.10:8080", false, 0.5)}},
		{"198.19.0.11:81", []string{out("accept", "198.18.130.11:8081", false, 1)}},
	} {
		res, err := r.Trace(pkt(tcp, "203.0.113.9:1000", tc.dst, "eth0"), node4)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(tc.want, summarize(res)); diff != "" {
			t.Errorf("to %s (-want +got):\n%s", tc.dst, diff)
		}
	}
	// A UDP packet to the same address and port does not match the rule
	// of a TCP port.
	res, err := r.Trace(pkt(udp, "203.0.113.9:1000", "198.19.0.11:81", "eth0"), node4)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{out("accept", "", false, 1)}, summarize(res)); diff != "" {
		t.Errorf("udp (-want +got):\n%s", diff)
	}
}
