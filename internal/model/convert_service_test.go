package model

// Addresses: 198.18.0.0/16 nodes and pods, 198.19.0.0/16 service IPs
// (198.19.0.x cluster, 198.19.1.x external, 198.19.2.x load balancer),
// fd00::/8 ULAs for IPv6 (fd00:18:: nodes and pods, fd00:19:: service IPs).

import (
	"net/netip"
	"reflect"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

var (
	v4Only    = []v1.IPFamily{IPv4}
	v6Only    = []v1.IPFamily{IPv6}
	dualNode  = []v1.IPFamily{IPv4, IPv6}
	httpName  = spn("svc", "http", TCP)
	clusterV4 = addr("198.19.0.1")
	clusterV6 = addr("fd00:19::1")
)

// wantPort is the ServicePort that makeService's default port converts to
// in family f, edited by tweak.
func wantPort(f v1.IPFamily, name ServicePortName, tweak func(*ServicePort)) *ServicePort {
	p := &ServicePort{
		Name: name, Family: f, Type: v1.ServiceTypeClusterIP,
		ClusterIP: clusterV4, Port: 80, Protocol: TCP, TargetPort: "8080",
	}
	if f == IPv6 {
		p.ClusterIP = clusterV6
	}
	if tweak != nil {
		tweak(p)
	}
	return p
}

type portsByFamily = map[v1.IPFamily]map[ServicePortName]*ServicePort

// oneHTTP is the usual result: port http in the given families, each edited by tweak.
func oneHTTP(tweak func(*ServicePort), fams ...v1.IPFamily) portsByFamily {
	out := portsByFamily{}
	for _, f := range fams {
		out[f] = map[ServicePortName]*ServicePort{httpName: wantPort(f, httpName, tweak)}
	}
	return out
}

func TestConvertService(t *testing.T) {
	lbIngress := func(ips ...v1.LoadBalancerIngress) func(*v1.Service) {
		return func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeLoadBalancer
			s.Spec.Ports[0].NodePort = 30080
			s.Status.LoadBalancer.Ingress = ips
		}
	}
	vip, proxy := v1.LoadBalancerIPModeVIP, v1.LoadBalancerIPModeProxy

	tests := []struct {
		name     string
		svc      *v1.Service
		families []v1.IPFamily
		want     portsByFamily
		// wantErrs are the field paths of the reported problems, in order.
		wantErrs []string
	}{{
		name:     "single-stack IPv4 ClusterIP",
		svc:      makeService(testNS, "svc", nil),
		families: v4Only,
		want:     oneHTTP(nil, IPv4),
	}, {
		name:     "dual-stack service on a dual-stack node",
		svc:      makeService(testNS, "svc", dualStack),
		families: dualNode,
		want:     oneHTTP(nil, IPv4, IPv6),
	}, {
		name: "dual-stack service, IPv6 primary",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			s.Spec.ClusterIP = "fd00:19::1"
			s.Spec.ClusterIPs = []string{"fd00:19::1", "198.19.0.1"}
			s.Spec.IPFamilies = []v1.IPFamily{IPv6, IPv4}
		}),
		families: dualNode,
		want:     oneHTTP(nil, IPv4, IPv6),
	}, {
		name:     "dual-stack service on an IPv6 single-stack node",
		svc:      makeService(testNS, "svc", dualStack),
		families: v6Only,
		want:     oneHTTP(nil, IPv6),
	}, {
		name:     "IPv4 single-stack service on a dual-stack node has no IPv6 ports",
		svc:      makeService(testNS, "svc", nil),
		families: dualNode,
		want:     oneHTTP(nil, IPv4),
	}, {
		name:     "IPv4 single-stack service on an IPv6 node yields nothing",
		svc:      makeService(testNS, "svc", nil),
		families: v6Only,
		want:     portsByFamily{},
	}, {
		name: "legacy object with only spec.clusterIP",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			s.Spec.ClusterIPs, s.Spec.IPFamilies = nil, nil
		}),
		families: v4Only,
		want:     oneHTTP(nil, IPv4),
	}, {
		name: "IPv4 written with leading zeros is read like upstream (sloppy parse)",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			s.Spec.ClusterIP = "198.019.000.001"
			s.Spec.ClusterIPs = []string{"198.019.000.001"}
		}),
		families: v4Only,
		want:     oneHTTP(nil, IPv4),
	}, {
		name: "ports: protocols, target ports, node ports",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeNodePort
			s.Spec.Ports = []v1.ServicePort{
				{Name: "http", Port: 80, Protocol: TCP, TargetPort: intstr.FromString("web"), NodePort: 30080},
				{Name: "dns", Port: 53, Protocol: UDP, TargetPort: intstr.FromInt32(5353), NodePort: 30053},
				{Name: "sig", Port: 2905, Protocol: SCTP, TargetPort: intstr.FromInt32(2905), NodePort: 32905},
				{Name: "dns-tcp", Port: 53, Protocol: TCP, TargetPort: intstr.FromInt32(5353), NodePort: 30054},
				{Name: "legacy", Port: 8443, TargetPort: intstr.FromInt32(8443), NodePort: 30443}, // protocol defaults to TCP
			}
		}),
		families: v4Only,
		want: portsByFamily{IPv4: {
			httpName: wantPort(IPv4, httpName, func(p *ServicePort) {
				p.Type, p.TargetPort, p.NodePort = v1.ServiceTypeNodePort, "web", 30080
			}),
			spn("svc", "dns", UDP): wantPort(IPv4, spn("svc", "dns", UDP), func(p *ServicePort) {
				p.Type, p.Port, p.Protocol, p.TargetPort, p.NodePort = v1.ServiceTypeNodePort, 53, UDP, "5353", 30053
			}),
			spn("svc", "sig", SCTP): wantPort(IPv4, spn("svc", "sig", SCTP), func(p *ServicePort) {
				p.Type, p.Port, p.Protocol, p.TargetPort, p.NodePort = v1.ServiceTypeNodePort, 2905, SCTP, "2905", 32905
			}),
			spn("svc", "dns-tcp", TCP): wantPort(IPv4, spn("svc", "dns-tcp", TCP), func(p *ServicePort) {
				p.Type, p.Port, p.TargetPort, p.NodePort = v1.ServiceTypeNodePort, 53, "5353", 30054
			}),
			spn("svc", "legacy", TCP): wantPort(IPv4, spn("svc", "legacy", TCP), func(p *ServicePort) {
				p.Type, p.Port, p.TargetPort, p.NodePort = v1.ServiceTypeNodePort, 8443, "8443", 30443
			}),
		}},
	}, {
		name: "node port of a ClusterIP service is ignored",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			s.Spec.Ports[0].NodePort = 30080
		}),
		families: v4Only,
		want:     oneHTTP(nil, IPv4),
	}, {
		name: "external IPs split by family",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			dualStack(s)
			s.Spec.ExternalIPs = []string{"198.19.1.1", "fd00:19:1::1", "198.19.1.2"}
		}),
		families: dualNode,
		want: portsByFamily{
			IPv4: {httpName: wantPort(IPv4, httpName, func(p *ServicePort) { p.ExternalIPs = addrs("198.19.1.1", "198.19.1.2") })},
			IPv6: {httpName: wantPort(IPv6, httpName, func(p *ServicePort) { p.ExternalIPs = addrs("fd00:19:1::1") })},
		},
	}, {
		name: "empty external IP strings are ignored silently, as upstream",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			s.Spec.ExternalIPs = []string{"", " ", "198.19.1.1"}
		}),
		families: v4Only,
		want:     oneHTTP(func(p *ServicePort) { p.ExternalIPs = addrs("198.19.1.1") }, IPv4),
	}, {
		name: "invalid external IP is skipped, the rest kept",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			s.Spec.ExternalIPs = []string{"198.19.1.1", "198.19.1.300", "198.19.1.2"}
		}),
		families: v4Only,
		want:     oneHTTP(func(p *ServicePort) { p.ExternalIPs = addrs("198.19.1.1", "198.19.1.2") }, IPv4),
		wantErrs: []string{"spec.externalIPs[1]"},
	}, {
		name: "load balancer ingress: ipMode VIP, Proxy and unset, per family",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			dualStack(s)
			lbIngress(
				v1.LoadBalancerIngress{IP: "198.19.2.1", IPMode: &vip},
				v1.LoadBalancerIngress{IP: "198.19.2.2", IPMode: &proxy},
				v1.LoadBalancerIngress{IP: "198.19.2.3"},
				v1.LoadBalancerIngress{IP: "fd00:19:2::1", IPMode: &proxy},
			)(s)
		}),
		families: dualNode,
		want: portsByFamily{
			IPv4: {httpName: wantPort(IPv4, httpName, func(p *ServicePort) {
				p.Type, p.NodePort = v1.ServiceTypeLoadBalancer, 30080
				p.LoadBalancerIngress = []LoadBalancerIngress{
					{IP: addr("198.19.2.1")}, {IP: addr("198.19.2.2"), Proxy: true}, {IP: addr("198.19.2.3")},
				}
			})},
			IPv6: {httpName: wantPort(IPv6, httpName, func(p *ServicePort) {
				p.Type, p.NodePort = v1.ServiceTypeLoadBalancer, 30080
				p.LoadBalancerIngress = []LoadBalancerIngress{{IP: addr("fd00:19:2::1"), Proxy: true}}
			})},
		},
	}, {
		name: "load balancer ingress with an unknown ipMode is not a VIP, as upstream",
		svc: makeService(testNS, "svc", lbIngress(
			v1.LoadBalancerIngress{IP: "198.19.2.1", IPMode: ptr(v1.LoadBalancerIPMode("Tunnel"))},
		)),
		families: v4Only,
		want: oneHTTP(func(p *ServicePort) {
			p.Type, p.NodePort = v1.ServiceTypeLoadBalancer, 30080
			p.LoadBalancerIngress = []LoadBalancerIngress{{IP: addr("198.19.2.1"), Proxy: true}}
		}, IPv4),
	}, {
		name: "hostname-only load balancer ingress has nothing to program",
		svc: makeService(testNS, "svc", lbIngress(
			v1.LoadBalancerIngress{Hostname: "lb.example.com"},
		)),
		families: v4Only,
		want: oneHTTP(func(p *ServicePort) {
			p.Type, p.NodePort = v1.ServiceTypeLoadBalancer, 30080
		}, IPv4),
	}, {
		name: "invalid load balancer ingress IP is skipped",
		svc: makeService(testNS, "svc", lbIngress(
			v1.LoadBalancerIngress{IP: "lb.example.com"},
			v1.LoadBalancerIngress{IP: "198.19.2.1"},
		)),
		families: v4Only,
		want: oneHTTP(func(p *ServicePort) {
			p.Type, p.NodePort = v1.ServiceTypeLoadBalancer, 30080
			p.LoadBalancerIngress = []LoadBalancerIngress{{IP: addr("198.19.2.1")}}
		}, IPv4),
		wantErrs: []string{"status.loadBalancer.ingress[0].ip"},
	}, {
		// Upstream reads the status whatever the type, e.g. while a service
		// changes from LoadBalancer to NodePort and the status is not yet cleared.
		name: "load balancer ingress is read whatever the service type, as upstream",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeNodePort
			s.Spec.Ports[0].NodePort = 30080
			s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "198.19.2.1"}}
		}),
		families: v4Only,
		want: oneHTTP(func(p *ServicePort) {
			p.Type, p.NodePort = v1.ServiceTypeNodePort, 30080
			p.LoadBalancerIngress = []LoadBalancerIngress{{IP: addr("198.19.2.1")}}
		}, IPv4),
	}, {
		name: "load balancer source ranges: per family, trimmed, masked, invalid skipped",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			dualStack(s)
			lbIngress(v1.LoadBalancerIngress{IP: "198.19.2.1"})(s)
			s.Spec.LoadBalancerSourceRanges = []string{" 198.18.5.7/16 ", "fd00:18::1/64", "198.18.300.0/24", "", "203.0.113.0/24"}
		}),
		families: dualNode,
		want: portsByFamily{
			IPv4: {httpName: wantPort(IPv4, httpName, func(p *ServicePort) {
				p.Type, p.NodePort = v1.ServiceTypeLoadBalancer, 30080
				p.LoadBalancerIngress = []LoadBalancerIngress{{IP: addr("198.19.2.1")}}
				p.LoadBalancerSourceRanges = []netip.Prefix{prefix("198.18.0.0/16"), prefix("203.0.113.0/24")}
			})},
			IPv6: {httpName: wantPort(IPv6, httpName, func(p *ServicePort) {
				p.Type, p.NodePort = v1.ServiceTypeLoadBalancer, 30080
				p.LoadBalancerSourceRanges = []netip.Prefix{prefix("fd00:18::/64")}
			})},
		},
		wantErrs: []string{"spec.loadBalancerSourceRanges[2]"},
	}, {
		// A deliberate difference from upstream (which leaves IPv4 open).
		name: "load balancer source ranges of IPv6 only close IPv4",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			dualStack(s)
			lbIngress(v1.LoadBalancerIngress{IP: "198.19.2.1"})(s)
			s.Spec.LoadBalancerSourceRanges = []string{"fd00:18::/64"}
		}),
		families: dualNode,
		want: portsByFamily{
			IPv4: {httpName: wantPort(IPv4, httpName, func(p *ServicePort) {
				p.Type, p.NodePort = v1.ServiceTypeLoadBalancer, 30080
				p.LoadBalancerIngress = []LoadBalancerIngress{{IP: addr("198.19.2.1")}}
				p.LoadBalancerClosed = true
			})},
			IPv6: {httpName: wantPort(IPv6, httpName, func(p *ServicePort) {
				p.Type, p.NodePort = v1.ServiceTypeLoadBalancer, 30080
				p.LoadBalancerSourceRanges = []netip.Prefix{prefix("fd00:18::/64")}
			})},
		},
	}, {
		// Only invalid ranges: none is read, so nothing is closed (as
		// upstream, which ignores them).
		name: "load balancer source ranges all invalid leave the service open",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			lbIngress(v1.LoadBalancerIngress{IP: "198.19.2.1"})(s)
			s.Spec.LoadBalancerSourceRanges = []string{"198.18.300.0/24"}
		}),
		families: v4Only,
		want: oneHTTP(func(p *ServicePort) {
			p.Type, p.NodePort = v1.ServiceTypeLoadBalancer, 30080
			p.LoadBalancerIngress = []LoadBalancerIngress{{IP: addr("198.19.2.1")}}
		}, IPv4),
		wantErrs: []string{"spec.loadBalancerSourceRanges[0]"},
	}, {
		name: "session affinity ClientIP without config uses the API default",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		}),
		families: v4Only,
		want:     oneHTTP(func(p *ServicePort) { p.StickyMaxAgeSeconds = DefaultStickyMaxAgeSeconds }, IPv4),
	}, {
		name: "session affinity ClientIP with an explicit timeout",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
			s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr[int32](60)}}
		}),
		families: v4Only,
		want:     oneHTTP(func(p *ServicePort) { p.StickyMaxAgeSeconds = 60 }, IPv4),
	}, {
		name: "session affinity timeout above a day falls back to the default",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
			s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr[int32](86401)}}
		}),
		families: v4Only,
		want:     oneHTTP(func(p *ServicePort) { p.StickyMaxAgeSeconds = DefaultStickyMaxAgeSeconds }, IPv4),
		wantErrs: []string{"spec.sessionAffinityConfig.clientIP.timeoutSeconds"},
	}, {
		name: "session affinity timeout 0 falls back to the default",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
			s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr[int32](0)}}
		}),
		families: v4Only,
		want:     oneHTTP(func(p *ServicePort) { p.StickyMaxAgeSeconds = DefaultStickyMaxAgeSeconds }, IPv4),
		wantErrs: []string{"spec.sessionAffinityConfig.clientIP.timeoutSeconds"},
	}, {
		name: "session affinity None ignores the config",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			s.Spec.SessionAffinity = v1.ServiceAffinityNone
			s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr[int32](60)}}
		}),
		families: v4Only,
		want:     oneHTTP(nil, IPv4),
	}, {
		name: "externalTrafficPolicy Local on a NodePort service",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeNodePort
			s.Spec.Ports[0].NodePort = 30080
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			s.Spec.HealthCheckNodePort = 31000 // only LoadBalancer services get one
		}),
		families: v4Only,
		want: oneHTTP(func(p *ServicePort) {
			p.Type, p.NodePort, p.ExternalPolicyLocal = v1.ServiceTypeNodePort, 30080, true
		}, IPv4),
	}, {
		name: "externalTrafficPolicy Local on a ClusterIP service with external IPs",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			s.Spec.ExternalIPs = []string{"198.19.1.1"}
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		}),
		families: v4Only,
		want: oneHTTP(func(p *ServicePort) {
			p.ExternalIPs, p.ExternalPolicyLocal = addrs("198.19.1.1"), true
		}, IPv4),
	}, {
		name: "externalTrafficPolicy Local is ignored when not externally accessible",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		}),
		families: v4Only,
		want:     oneHTTP(nil, IPv4),
	}, {
		name: "LoadBalancer with externalTrafficPolicy Local gets its health check node port",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			lbIngress(v1.LoadBalancerIngress{IP: "198.19.2.1"})(s)
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			s.Spec.HealthCheckNodePort = 31000
		}),
		families: v4Only,
		want: oneHTTP(func(p *ServicePort) {
			p.Type, p.NodePort = v1.ServiceTypeLoadBalancer, 30080
			p.LoadBalancerIngress = []LoadBalancerIngress{{IP: addr("198.19.2.1")}}
			p.ExternalPolicyLocal, p.HealthCheckNodePort = true, 31000
		}, IPv4),
	}, {
		name: "LoadBalancer with externalTrafficPolicy Cluster has no health check node port",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			lbIngress(v1.LoadBalancerIngress{IP: "198.19.2.1"})(s)
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyCluster
			s.Spec.HealthCheckNodePort = 31000
		}),
		families: v4Only,
		want: oneHTTP(func(p *ServicePort) {
			p.Type, p.NodePort = v1.ServiceTypeLoadBalancer, 30080
			p.LoadBalancerIngress = []LoadBalancerIngress{{IP: addr("198.19.2.1")}}
		}, IPv4),
	}, {
		name: "health check node port out of range is dropped",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			lbIngress()(s)
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			s.Spec.HealthCheckNodePort = 70000
		}),
		families: v4Only,
		want: oneHTTP(func(p *ServicePort) {
			p.Type, p.NodePort, p.ExternalPolicyLocal = v1.ServiceTypeLoadBalancer, 30080, true
		}, IPv4),
		wantErrs: []string{"spec.healthCheckNodePort"},
	}, {
		name: "internalTrafficPolicy Local",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			s.Spec.InternalTrafficPolicy = ptr(v1.ServiceInternalTrafficPolicyLocal)
		}),
		families: v4Only,
		want:     oneHTTP(func(p *ServicePort) { p.InternalPolicyLocal = true }, IPv4),
	}, {
		name: "internalTrafficPolicy Cluster",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			s.Spec.InternalTrafficPolicy = ptr(v1.ServiceInternalTrafficPolicyCluster)
		}),
		families: v4Only,
		want:     oneHTTP(nil, IPv4),
	}, {
		name: "invalid cluster IP: whole service skipped",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			dualStack(s)
			s.Spec.ClusterIPs[1] = "fd00:19::zz"
		}),
		families: dualNode,
		want:     nil,
		wantErrs: []string{"spec.clusterIPs[1]"},
	}, {
		name: "invalid legacy spec.clusterIP: whole service skipped",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			s.Spec.ClusterIP, s.Spec.ClusterIPs = "198.19.0.256", nil
		}),
		families: v4Only,
		want:     nil,
		wantErrs: []string{"spec.clusterIP"},
	}, {
		name: "IPv6 cluster IP with a zone: whole service skipped",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			s.Spec.ClusterIP = "fe80::1%eth0"
			s.Spec.ClusterIPs = []string{"fe80::1%eth0"}
			s.Spec.IPFamilies = []v1.IPFamily{IPv6}
		}),
		families: v6Only,
		want:     nil,
		wantErrs: []string{"spec.clusterIPs[0]"},
	}, {
		name: "two cluster IPs of one family: whole service skipped",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			s.Spec.ClusterIPs = []string{"198.19.0.1", "198.19.0.2"}
		}),
		families: v4Only,
		want:     nil,
		wantErrs: []string{"spec.clusterIPs"},
	}, {
		name: "missing name: whole service skipped",
		svc:  makeService(testNS, "", nil),
		want: nil, families: v4Only,
		wantErrs: []string{"metadata.name"},
	}, {
		name: "ports out of range are skipped, the others kept",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			s.Spec.Ports = append(s.Spec.Ports,
				v1.ServicePort{Name: "zero", Port: 0, Protocol: TCP},
				v1.ServicePort{Name: "big", Port: 65536, Protocol: TCP},
			)
		}),
		families: v4Only,
		want:     oneHTTP(nil, IPv4),
		wantErrs: []string{"spec.ports[1].port", "spec.ports[2].port"},
	}, {
		name: "node port out of range is dropped, the port kept",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeNodePort
			s.Spec.Ports[0].NodePort = 70000
		}),
		families: v4Only,
		want:     oneHTTP(func(p *ServicePort) { p.Type = v1.ServiceTypeNodePort }, IPv4),
		wantErrs: []string{"spec.ports[0].nodePort"},
	}, {
		name: "unknown protocol: port skipped",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: "ping", Port: 7, Protocol: "ICMP"})
		}),
		families: v4Only,
		want:     oneHTTP(nil, IPv4),
		wantErrs: []string{"spec.ports[1].protocol"},
	}, {
		// The API server refuses a duplicate port name whatever the
		// protocols (validateServicePort): the service is skipped whole.
		name: "duplicate port name: the service is skipped",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: "http", Port: 8000, Protocol: UDP})
		}),
		families: v4Only,
		want:     nil,
		wantErrs: []string{"spec.ports[1].name"},
	}, {
		name: "every problem of one service is reported, in field order",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			s.Spec.ExternalIPs = []string{"bad"}
			s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: "x", Port: -1})
		}),
		families: v4Only,
		want:     oneHTTP(nil, IPv4),
		wantErrs: []string{"spec.externalIPs[0]", "spec.ports[1].port"},
	}, {
		name: "skipped service yields nothing and no error",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			s.Spec.ClusterIP, s.Spec.ClusterIPs = v1.ClusterIPNone, []string{v1.ClusterIPNone}
		}),
		families: v4Only,
		want:     nil,
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, errs := ConvertService(tc.svc, tc.families)
			if diff := cmp.Diff(portValues(tc.want), portValues(got), netipComparers); diff != "" {
				t.Errorf("ports (-want +got):\n%s", diff)
			}
			checkErrs(t, errs, "Service", tc.svc.Namespace+"/"+tc.svc.Name, tc.wantErrs)
		})
	}
}

// TestConvertServiceDerived checks the methods derived from the converted
// fields, on converted services rather than hand-built ports.
func TestConvertServiceDerived(t *testing.T) {
	vip, proxy := v1.LoadBalancerIPModeVIP, v1.LoadBalancerIPModeProxy
	tests := []struct {
		name            string
		svc             *v1.Service
		wantVIPs        []netip.Addr
		wantAffinity    bool
		wantExternal    bool
		wantUsesCluster bool
		wantUsesLocal   bool
	}{{
		name:            "plain ClusterIP",
		svc:             makeService(testNS, "svc", nil),
		wantUsesCluster: true,
	}, {
		name: "ClusterIP with ClientIP affinity",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		}),
		wantAffinity: true, wantUsesCluster: true,
	}, {
		name: "ClusterIP with internalTrafficPolicy Local uses only local endpoints",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			s.Spec.InternalTrafficPolicy = ptr(v1.ServiceInternalTrafficPolicyLocal)
		}),
		wantUsesLocal: true,
	}, {
		name: "LoadBalancer: VIP and unset modes are VIPs, Proxy is not",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeLoadBalancer
			s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{
				{IP: "198.19.2.1", IPMode: &vip}, {IP: "198.19.2.2", IPMode: &proxy}, {IP: "198.19.2.3"},
			}
		}),
		wantVIPs:     addrs("198.19.2.1", "198.19.2.3"),
		wantExternal: true, wantUsesCluster: true,
	}, {
		name: "only ipMode Proxy ingress: not externally accessible through it",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeLoadBalancer
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			s.Spec.InternalTrafficPolicy = ptr(v1.ServiceInternalTrafficPolicyLocal)
			s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "198.19.2.2", IPMode: &proxy}}
		}),
		wantUsesLocal: true,
	}, {
		name: "NodePort with externalTrafficPolicy Local needs both endpoint sets",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeNodePort
			s.Spec.Ports[0].NodePort = 30080
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		}),
		wantExternal: true, wantUsesCluster: true, wantUsesLocal: true,
	}, {
		name: "NodePort with both policies Local still uses cluster endpoints (short circuit)",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeNodePort
			s.Spec.Ports[0].NodePort = 30080
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			s.Spec.InternalTrafficPolicy = ptr(v1.ServiceInternalTrafficPolicyLocal)
		}),
		wantExternal: true, wantUsesCluster: true, wantUsesLocal: true,
	}, {
		name: "external IPs make it externally accessible",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			s.Spec.ExternalIPs = []string{"198.19.1.1"}
			s.Spec.InternalTrafficPolicy = ptr(v1.ServiceInternalTrafficPolicyLocal)
		}),
		wantExternal: true, wantUsesCluster: true, wantUsesLocal: true,
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ports, errs := ConvertService(tc.svc, v4Only)
			if len(errs) != 0 {
				t.Fatalf("unexpected errors: %v", errs)
			}
			p := ports[IPv4][httpName]
			if p == nil {
				t.Fatalf("no port %s in %v", httpName, ports)
			}
			if diff := cmp.Diff(tc.wantVIPs, p.LoadBalancerVIPs(), netipComparers); diff != "" {
				t.Errorf("LoadBalancerVIPs (-want +got):\n%s", diff)
			}
			for _, c := range []struct {
				what      string
				got, want bool
			}{
				{"SessionAffinity", p.SessionAffinity(), tc.wantAffinity},
				{"ExternallyAccessible", p.ExternallyAccessible(), tc.wantExternal},
				{"UsesClusterEndpoints", p.UsesClusterEndpoints(), tc.wantUsesCluster},
				{"UsesLocalEndpoints", p.UsesLocalEndpoints(), tc.wantUsesLocal},
			} {
				if c.got != c.want {
					t.Errorf("%s() = %v, want %v", c.what, c.got, c.want)
				}
			}
		})
	}
}

func TestSkipService(t *testing.T) {
	tests := []struct {
		name string
		svc  *v1.Service
		skip bool
	}{{
		name: "ClusterIP service is proxied",
		svc:  makeService(testNS, "svc", nil),
	}, {
		name: "headless",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			s.Spec.ClusterIP, s.Spec.ClusterIPs = v1.ClusterIPNone, []string{v1.ClusterIPNone}
		}),
		skip: true,
	}, {
		name: "ExternalName",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			s.Spec.Type, s.Spec.ExternalName = v1.ServiceTypeExternalName, "db.example.com"
			s.Spec.ClusterIP, s.Spec.ClusterIPs = "", nil
		}),
		skip: true,
	}, {
		name: "ExternalName even with a cluster IP",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			s.Spec.Type, s.Spec.ExternalName = v1.ServiceTypeExternalName, "db.example.com"
		}),
		skip: true,
	}, {
		name: "service-proxy-name label hands it to another proxy",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			s.Labels = map[string]string{LabelServiceProxyName: "other-proxy"}
		}),
		skip: true,
	}, {
		name: "service-proxy-name label with an empty value",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			s.Labels = map[string]string{LabelServiceProxyName: ""}
		}),
		skip: true,
	}, {
		// Upstream's informers select objects without this label, Services too.
		name: "headless label",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			s.Labels = map[string]string{LabelHeadless: ""}
		}),
		skip: true,
	}, {
		name: "other labels do not matter",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			s.Labels = map[string]string{"app": "web"}
		}),
	}, {
		name: "no cluster IP allocated yet",
		svc: makeService(testNS, "svc", func(s *v1.Service) {
			s.Spec.ClusterIP, s.Spec.ClusterIPs = "", nil
		}),
		skip: true,
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			why := SkipService(tc.svc)
			if (why != "") != tc.skip {
				t.Errorf("SkipService() = %q, want skip=%v", why, tc.skip)
			}
			ports, errs := ConvertService(tc.svc, v4Only)
			if tc.skip && (ports != nil || errs != nil) {
				t.Errorf("ConvertService of a skipped service = %v, %v; want nil, nil", ports, errs)
			}
			if !tc.skip && len(ports[IPv4]) == 0 {
				t.Errorf("ConvertService of a proxied service gave no ports (errors %v)", errs)
			}
		})
	}
}

func TestServicePortName(t *testing.T) {
	a := spn("svc", "http", TCP)
	if got, want := a.String(), "ns/svc:http/TCP"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	if got, want := spn("svc", "", UDP).String(), "ns/svc/UDP"; got != want {
		t.Errorf("String() of an unnamed port = %q, want %q", got, want)
	}
	ordered := []ServicePortName{
		{NamespacedName: a.NamespacedName, Port: "", Protocol: TCP},
		{NamespacedName: a.NamespacedName, Port: "http", Protocol: SCTP},
		{NamespacedName: a.NamespacedName, Port: "http", Protocol: TCP},
		{NamespacedName: a.NamespacedName, Port: "http", Protocol: UDP},
		spn("svd", "", TCP),
		{NamespacedName: a.NamespacedName, Port: "http", Protocol: TCP},
	}
	ordered[5].Namespace = "nt"
	for i := range ordered {
		for j := range ordered {
			got := ordered[i].Compare(ordered[j])
			want := 0
			if i < j {
				want = -1
			} else if i > j {
				want = 1
			}
			if got != want {
				t.Errorf("%s.Compare(%s) = %d, want %d", ordered[i], ordered[j], got, want)
			}
		}
	}
}

// TestServicePortEqual changes each field in turn; Equal must notice every
// one. The reflection check makes a new field fail here until it is covered.
func TestServicePortEqual(t *testing.T) {
	base := func() *ServicePort {
		return wantPort(IPv4, httpName, func(p *ServicePort) {
			p.ExternalIPs = addrs("198.19.1.1")
			p.LoadBalancerIngress = []LoadBalancerIngress{{IP: addr("198.19.2.1")}}
			p.LoadBalancerSourceRanges = []netip.Prefix{prefix("198.18.0.0/16")}
		})
	}
	tweaks := map[string]func(*ServicePort){
		"Name":                     func(p *ServicePort) { p.Name.Port = "https" },
		"Family":                   func(p *ServicePort) { p.Family = IPv6 },
		"Type":                     func(p *ServicePort) { p.Type = v1.ServiceTypeNodePort },
		"ClusterIP":                func(p *ServicePort) { p.ClusterIP = addr("198.19.0.2") },
		"Port":                     func(p *ServicePort) { p.Port = 81 },
		"Protocol":                 func(p *ServicePort) { p.Protocol = UDP },
		"TargetPort":               func(p *ServicePort) { p.TargetPort = "web" },
		"NodePort":                 func(p *ServicePort) { p.NodePort = 30080 },
		"ExternalIPs":              func(p *ServicePort) { p.ExternalIPs = addrs("198.19.1.2") },
		"LoadBalancerIngress":      func(p *ServicePort) { p.LoadBalancerIngress[0].Proxy = true },
		"LoadBalancerSourceRanges": func(p *ServicePort) { p.LoadBalancerSourceRanges = nil },
		"LoadBalancerClosed":       func(p *ServicePort) { p.LoadBalancerClosed = true },
		"StickyMaxAgeSeconds":      func(p *ServicePort) { p.StickyMaxAgeSeconds = 60 },
		"ExternalPolicyLocal":      func(p *ServicePort) { p.ExternalPolicyLocal = true },
		"InternalPolicyLocal":      func(p *ServicePort) { p.InternalPolicyLocal = true },
		"HealthCheckNodePort":      func(p *ServicePort) { p.HealthCheckNodePort = 31000 },
		"Created":                  func(p *ServicePort) { p.Created = 1767225600 },
	}
	typ := reflect.TypeOf(ServicePort{})
	for i := 0; i < typ.NumField(); i++ {
		if _, ok := tweaks[typ.Field(i).Name]; !ok {
			t.Errorf("field %s is not covered by this test", typ.Field(i).Name)
		}
	}
	if !base().Equal(base()) {
		t.Fatalf("equal ports compare unequal")
	}
	for field, tweak := range tweaks {
		changed := base()
		tweak(changed)
		if base().Equal(changed) || changed.Equal(base()) {
			t.Errorf("Equal does not notice a change of %s", field)
		}
	}
	var nilPort *ServicePort
	if !nilPort.Equal(nil) || nilPort.Equal(base()) || base().Equal(nil) {
		t.Errorf("Equal mishandles nil")
	}
}
