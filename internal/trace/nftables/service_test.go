package nftables

// Addresses in testdata/example-listed.nft (kproxy's built-in example):
//
//	198.18.0.10, fd00:18::10    the node (node-a)
//	198.18.128.0/17             the pod network
//	198.19.0.0/24, fd00:19::/64 ClusterIPs; 198.19.200.0/24 external and
//	                            load-balancer IPs
//	203.0.113.0/24              a client outside the cluster the load
//	                            balancer's source ranges allow
//	198.51.100.1                a client they do not allow

import (
	"net/netip"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kproxy/kproxy/internal/trace"
)

// serviceStep is a step that names a service: its chain and the name.
var serviceStep = regexp.MustCompile(`^([^ :]+): .* \(service ([^)]+)\)$`)

// TestTraceNamesService: a trace through the rules as `nft list table`
// prints them (what `kproxy trace --live` reads) names the service port
// of every step taken on its behalf, from the lookup of the element that
// carries its comment to the end of the chains that element sent the
// packet to, and no other step.
func TestTraceNamesService(t *testing.T) {
	text, err := os.ReadFile("testdata/example-listed.nft")
	if err != nil {
		t.Fatal(err)
	}
	rs, err := ParseNFT(string(text))
	if err != nil {
		t.Fatal(err)
	}
	host := trace.Host{LocalAddrs: []netip.Addr{netip.MustParseAddr("198.18.0.10"), netip.MustParseAddr("fd00:18::10")}}
	const (
		nodePortExt = "external-VJGUNRM6-demo/web-nodeport/tcp/http"
		nodePortSvc = "service-VJGUNRM6-demo/web-nodeport/tcp/http"
		extIPExt    = "external-6VAV75ZX-demo/ext-ip/tcp/http"
		extIPSvc    = "service-6VAV75ZX-demo/ext-ip/tcp/http"
		lbFirewall  = "firewall-LSMVB2RZ-demo/lb-ranges/tcp/https"
		lbExt       = "external-LSMVB2RZ-demo/lb-ranges/tcp/https"
		lbSvc       = "service-LSMVB2RZ-demo/lb-ranges/tcp/https"
		sharedTCP2  = "cluster/tcp/2"
		sharedUDP2  = "cluster/udp/2"
		noEndpoints = "demo/no-endpoints:http/TCP"
		webCluster  = "demo/web-clusterip:http/TCP"
		webNodePort = "demo/web-nodeport:http/TCP"
		extIP       = "demo/ext-ip:http/TCP"
		lbRanges    = "demo/lb-ranges:https/TCP"
		dnsUDP      = "demo/dns-udp:dns/UDP"
		dnsTCP      = "demo/dns-udp:dns-tcp/TCP"
		dualStack   = "demo/dual-stack:http/TCP"
		// A pod's packet: the dispatch, then the three endpoint map
		// lookups of the shared chain; from the node the masquerade
		// mark comes first.
		podPlain    = "services," + sharedTCP2 + "," + sharedTCP2 + "," + sharedTCP2
		podPlainUDP = "services," + sharedUDP2 + "," + sharedUDP2 + "," + sharedUDP2
		nodePlain   = podPlain + "," + sharedTCP2
	)
	for _, tc := range []struct {
		name string
		pkt  trace.Packet
		// want is "chain service" of each step of the first outcome
		// that names a service, in order.
		want []string
	}{
		{
			name: "ClusterIP of a plain service, shared chain",
			pkt:  pkt(tcp, "198.18.129.99:40000", "198.19.0.10:80", "cni0"),
			want: steps(webCluster, podPlain),
		},
		{
			name: "same address and port, UDP: the other service port",
			pkt:  pkt(udp, "198.18.129.99:40000", "198.19.0.18:53", "cni0"),
			want: steps(dnsUDP, podPlainUDP),
		},
		{
			name: "same address and port, TCP",
			pkt:  pkt(tcp, "198.18.129.99:40000", "198.19.0.18:53", "cni0"),
			want: steps(dnsTCP, podPlain),
		},
		{
			name: "NodePort from outside",
			pkt:  pkt(tcp, "198.51.100.1:40000", "198.18.0.10:30080", "eth0"),
			want: steps(webNodePort, "services,"+nodePortExt+","+nodePortExt+","+nodePortSvc),
		},
		{
			name: "external IP from outside",
			pkt:  pkt(tcp, "198.51.100.1:40000", "198.19.200.10:8080", "eth0"),
			want: steps(extIP, "services,"+extIPExt+","+extIPExt+","+extIPSvc),
		},
		{
			name: "load balancer, source not allowed: dropped in its firewall chain",
			pkt:  pkt(tcp, "198.51.100.1:40000", "198.19.200.1:443", "eth0"),
			want: steps(lbRanges, "firewall-check,"+lbFirewall),
		},
		{
			// Leaving the firewall chain ends the service's steps; the
			// dispatch names it again.
			name: "load balancer, source allowed",
			pkt:  pkt(tcp, "203.0.113.9:40000", "198.19.200.1:443", "eth0"),
			want: steps(lbRanges, "firewall-check,services,"+lbExt+","+lbExt+","+lbSvc),
		},
		{
			name: "no endpoints: rejected",
			pkt:  pkt(tcp, "198.18.129.99:40000", "198.19.0.20:80", "cni0"),
			want: steps(noEndpoints, "service-endpoints-check,reject-chain"),
		},
		{
			// cluster-ips is keyed by address only: its comment names one
			// port of the service, not the packet's.
			name: "a port the ClusterIP does not serve: no service",
			pkt:  pkt(tcp, "198.18.129.99:40000", "198.19.0.10:81", "cni0"),
		},
		{
			name: "IPv6 ClusterIP from the node itself",
			pkt:  pkt(tcp, "[fd00:18::10]:40000", "[fd00:19::17]:80", ""),
			want: steps(dualStack, nodePlain),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := rs.Trace(tc.pkt, host)
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Outcomes) == 0 {
				t.Fatal("no outcome")
			}
			var got []string
			for _, s := range res.Outcomes[0].Path {
				if m := serviceStep.FindStringSubmatch(s); m != nil {
					got = append(got, m[1]+" "+m[2])
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("steps naming a service (-want +got):\n%s\n%s", diff, res)
			}
		})
	}
}

// steps is "chain svc" for each of the comma-separated chains.
func steps(svc, chains string) []string {
	var out []string
	for _, c := range strings.Split(chains, ",") {
		out = append(out, c+" "+svc)
	}
	return out
}
