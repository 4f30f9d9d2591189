// Package hostile lists service port names that the API server accepts
// (the longest ones) or refuses (quotes, newlines with restore commands,
// control characters, non-ASCII, 1,000 characters), for tests that check
// every renderer stays safe whatever names reach it. The file
// source and a future API may hand any of them to the proxy.
package hostile

import (
	"fmt"
	"net/netip"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/model"
)

// Name is a namespace, name and port name of one service port.
type Name struct {
	Case                  string // what the case tries
	Namespace, Name, Port string
}

// Long are the longest names the API server accepts: a 63-character
// namespace and name (DNS labels) and a 15-character port name (IANA
// service name).
var Long = Name{
	Case:      "63/63/15",
	Namespace: "ns-" + strings.Repeat("n", 56) + "-end",
	Name:      "svc-" + strings.Repeat("s", 55) + "-end",
	Port:      "port-" + strings.Repeat("p", 6) + "-end",
}

// Injection is what a port name may try in iptables-restore input: end the
// comment, start a line and DNAT a healthy service (198.19.0.10:80, the
// example's demo/web-clusterip) to an intruder.
const Injection = "a\"\n-I KUBE-SERVICES 1 -d 198.19.0.10/32 -p tcp --dport 80 -j DNAT --to-destination 198.18.1.99:8080\n#"

// Commit ends the nat table early and opens the filter table to accept
// everything from the outside range.
const Commit = "x\"\nCOMMIT\n*filter\n-I INPUT 1 -s 203.0.113.0/24 -j ACCEPT\nCOMMIT\n*nat\n#"

// NFTInjection tries the same in `nft -f` text: end the quoted comment and
// the line, then add a rule of its own.
const NFTInjection = "b\" ; }\nadd rule ip kube-proxy services accept\n#"

// Names are the hostile cases, each distinct from the others.
func Names() []Name {
	thousand := strings.Repeat("x", 999)
	return []Name{
		Long,
		{"1000 characters", "ns", thousand + "1", "http"},
		// Differs from the previous only past every cut.
		{"1000 characters, other end", "ns", thousand + "2", "http"},
		{"quotes and spaces", "ns", `we"b s`, `"p" q`},
		{"iptables injection", "ns", "web", Injection},
		{"COMMIT and *filter", "ns", "web", Commit},
		{"nft injection", "ns", "nft", NFTInjection},
		{"non-ASCII", "café", "日本語", "ポート"},
		{"control characters", "ns\x00", "a\x1b[31mb\x7f", "p\tq\r"},
		{"slash and backslash", "ns/x", `a\b`, `c\"d`},
		{"invalid UTF-8", "ns", "a\xff\xfeb", "p"},
	}
}

// Addresses of the services Add puts in a State (per family; N is the
// case's index from 1):
//
//	198.19.50.N,  fd00:19::50:N (hex)  cluster IPs, port 80
//	198.19.210.N, fd00:19::d2:N        external IP and load balancer IP
//	198.18.129.100+N, fd00:18:1:a::(100+N in hex)  a local endpoint (node-a's pods), port 8080
//	198.18.130.100+N, fd00:18:1:b::(100+N) a remote one (node-b's pods)
//	node port 31000+N, health check node port 32000+N
//	source range 203.0.113.0/24, 2001:db8::/32

// Service is one hostile case as a state holds it.
type Service struct {
	Name
	Port      *model.ServicePort
	Endpoints []*model.Endpoint
}

// Services builds every case of Names as a LoadBalancer service port of
// family f with externalTrafficPolicy Local, session affinity, an
// external IP and source ranges (so that every kind of comment and chain
// is written for it), with one local and one remote endpoint. local and
// remote are the nodes the endpoints are on.
func Services(f v1.IPFamily, local, remote string) []Service {
	var out []Service
	for i, n := range Names() {
		k := i + 1
		addr := func(v4, v6 string, n int) netip.Addr {
			if f == v1.IPv6Protocol {
				return netip.MustParseAddr(fmt.Sprintf(v6, n))
			}
			return netip.MustParseAddr(fmt.Sprintf(v4, n))
		}
		src := netip.MustParsePrefix("203.0.113.0/24")
		if f == v1.IPv6Protocol {
			src = netip.MustParsePrefix("2001:db8::/32")
		}
		name := model.ServicePortName{Port: n.Port, Protocol: v1.ProtocolTCP}
		name.Namespace, name.Name = n.Namespace, n.Name
		vip := addr("198.19.210.%d", "fd00:19::d2:%x", k)
		sp := &model.ServicePort{
			Name: name, Family: f, Type: v1.ServiceTypeLoadBalancer,
			ClusterIP: addr("198.19.50.%d", "fd00:19::50:%x", k), Port: 80, Protocol: v1.ProtocolTCP,
			TargetPort: "8080", NodePort: int32(31000 + k),
			ExternalIPs:              []netip.Addr{vip},
			LoadBalancerIngress:      []model.LoadBalancerIngress{{IP: vip}},
			LoadBalancerSourceRanges: []netip.Prefix{src},
			StickyMaxAgeSeconds:      600,
			ExternalPolicyLocal:      true,
			HealthCheckNodePort:      int32(32000 + k),
		}
		eps := []*model.Endpoint{
			{IP: addr("198.18.129.%d", "fd00:18:1:a::%x", 100+k), Port: 8080, Ready: true, Serving: true, Local: true, NodeName: local},
			{IP: addr("198.18.130.%d", "fd00:18:1:b::%x", 100+k), Port: 8080, Ready: true, Serving: true, NodeName: remote},
		}
		out = append(out, Service{Name: n, Port: sp, Endpoints: eps})
	}
	return out
}

// Add puts Services into st and returns them.
func Add(st *model.State, local, remote string) []Service {
	svcs := Services(st.Family, local, remote)
	for _, s := range svcs {
		st.Services[s.Port.Name] = s.Port
		st.Endpoints[s.Port.Name] = s.Endpoints
	}
	return svcs
}
