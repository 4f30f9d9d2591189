// Package fuzzsnap turns fuzz bytes into a snapshot for the renderers'
// fuzz targets: up to six Services of every type with their
// EndpointSlices, built as Kubernetes objects and passed through the model
// (model.Tracker, then model.State) exactly as a source's objects are,
// plus one service port put into the State directly with a fuzzed
// namespace, name and port name (what the renderers must keep safe
// whatever the model lets through). The bytes choose from small pools so
// that services contest addresses and node ports, and include values the
// model must refuse (ports 0 and 65536, unknown protocols, bad IPs and
// CIDRs, affinity timeouts outside 1..86400).
//
// Addresses (node-a of the built-in example, internal/example):
//
//	198.18.0.10, fd00:18::10            node-a, the node rendered for (zone-a)
//	198.18.129.0/24, fd00:18:1:a::/64   node-a's pods (endpoints .100-.107 are local)
//	198.18.130.0/24, fd00:18:1:b::/64   node-b's pods (remote endpoints)
//	198.19.3.1-6, fd00:19::3:1-6        cluster IPs (contested on purpose)
//	198.19.3.100, fd00:19::3:64         the directly added service port
//	198.19.200.1-3, fd00:19::c8:1-3     external and load balancer IPs
//	203.0.113.0/24, 2001:db8::/32       source ranges
package fuzzsnap

import (
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/trace"
)

// Node and Zone are the node rendered for.
const (
	Node = "node-a"
	Zone = "zone-a"
)

// Families are the families of every snapshot.
var Families = []v1.IPFamily{model.IPv4, model.IPv6}

// Snapshot is what the renderers get.
type Snapshot struct {
	Node   *model.Node
	States map[v1.IPFamily]*model.State
	// Services and Slices are the objects given to the model.
	Services []*v1.Service
	Slices   []*discovery.EndpointSlice
}

type reader struct{ b []byte }

func (r *reader) next() byte {
	if len(r.b) == 0 {
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

// n returns a number in 0..k-1.
func (r *reader) n(k int) int { return int(r.next()) % k }

func pick[T any](r *reader, xs ...T) T { return xs[r.n(len(xs))] }

func addr(f v1.IPFamily, v4, v6 string, i int) string {
	if f == model.IPv6 {
		return fmt.Sprintf(v6, i)
	}
	return fmt.Sprintf(v4, i)
}

// Build makes a snapshot from data; name is put, as it is, in the
// directly added port and, when the bytes say so, in objects' names.
func Build(data []byte, name string) *Snapshot {
	r := &reader{b: data}
	s := &Snapshot{States: map[v1.IPFamily]*model.State{}}
	node := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: Node, Labels: map[string]string{v1.LabelTopologyZone: Zone}},
		Spec:       v1.NodeSpec{PodCIDRs: []string{"198.18.129.0/24", "fd00:18:1:a::/64"}},
		Status: v1.NodeStatus{Addresses: []v1.NodeAddress{
			{Type: v1.NodeInternalIP, Address: "198.18.0.10"}, {Type: v1.NodeInternalIP, Address: "fd00:18::10"}}},
	}
	tr := model.NewTracker(model.TrackerOptions{Hostname: Node, Families: Families})
	tr.NodeUpdated(node)
	nsvc := 1 + r.n(6)
	for i := range nsvc {
		svc, sls := service(r, i, name)
		s.Services = append(s.Services, svc)
		s.Slices = append(s.Slices, sls...)
		tr.ServiceUpdated(svc)
		for _, sl := range sls {
			tr.EndpointSliceUpdated(sl)
		}
	}
	tr.Synced()
	u := tr.Take()
	s.Node = tr.Node()
	for _, f := range Families {
		st := model.NewState(f)
		st.Apply(u.Families[f])
		st.Apply(direct(r, f, name))
		s.States[f] = st
	}
	return s
}

// service returns Service fz/sI (or fz/name) and its slices.
func service(r *reader, i int, name string) (*v1.Service, []*discovery.EndpointSlice) {
	svcName := fmt.Sprintf("s%d", i)
	if r.n(8) == 0 {
		svcName = name
	}
	typ := pick(r, v1.ServiceTypeClusterIP, v1.ServiceTypeNodePort, v1.ServiceTypeLoadBalancer, v1.ServiceTypeClusterIP)
	var fams []v1.IPFamily
	switch r.n(3) {
	case 0:
		fams = []v1.IPFamily{model.IPv4}
	case 1:
		fams = []v1.IPFamily{model.IPv6}
	default:
		fams = []v1.IPFamily{model.IPv4, model.IPv6}
	}
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "fz", Name: svcName, CreationTimestamp: metav1.Unix(int64(1700000000+i), 0)},
		Spec:       v1.ServiceSpec{Type: typ, IPFamilies: fams},
	}
	for _, f := range fams {
		ip := addr(f, "198.19.3.%d", "fd00:19::3:%x", 1+r.n(6))
		if r.n(16) == 0 {
			ip = pick(r, "198.19.3.300", "fd00:19::3::1", "", " ")
		}
		svc.Spec.ClusterIPs = append(svc.Spec.ClusterIPs, ip)
	}
	svc.Spec.ClusterIP = svc.Spec.ClusterIPs[0]
	nports := 1 + r.n(3)
	for p := range nports {
		port := pick(r, int32(80), int32(443), int32(53), int32(8080), int32(0), int32(65535), int32(65536),
			int32(r.next())<<8|int32(r.next()))
		sp := v1.ServicePort{
			Name:       fmt.Sprintf("p%d", p),
			Port:       port,
			Protocol:   pick(r, v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP, v1.ProtocolTCP, "", "ICMP"),
			TargetPort: intstr.FromInt32(8080 + int32(p)),
		}
		if r.n(10) == 0 {
			sp.Name = name
		}
		if typ != v1.ServiceTypeClusterIP {
			sp.NodePort = pick(r, int32(30000+r.n(4)), int32(30000+r.n(4)), int32(0), int32(65536), int32(-1))
		}
		svc.Spec.Ports = append(svc.Spec.Ports, sp)
	}
	for range r.n(3) {
		f := pick(r, fams...)
		svc.Spec.ExternalIPs = append(svc.Spec.ExternalIPs, pick(r, addr(f, "198.19.200.%d", "fd00:19::c8:%x", 1+r.n(3)), "bogus"))
	}
	if typ == v1.ServiceTypeLoadBalancer {
		for range 1 + r.n(2) {
			f := pick(r, fams...)
			in := v1.LoadBalancerIngress{IP: addr(f, "198.19.200.%d", "fd00:19::c8:%x", 1+r.n(3))}
			if r.n(4) == 0 {
				m := v1.LoadBalancerIPModeProxy
				in.IPMode = &m
			}
			svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, in)
		}
		for range r.n(3) {
			svc.Spec.LoadBalancerSourceRanges = append(svc.Spec.LoadBalancerSourceRanges,
				pick(r, "203.0.113.0/24", "2001:db8::/32", "198.18.0.0/16", "bad/99", "0.0.0.0/0"))
		}
	}
	if r.n(3) == 0 {
		svc.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		if t := pick(r, int32(0), int32(1), int32(10800), int32(86400), int32(86401), int32(-1)); t != -1 {
			svc.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: &t}}
		}
	}
	if typ != v1.ServiceTypeClusterIP && r.n(3) == 0 {
		svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		svc.Spec.HealthCheckNodePort = int32(32000 + i)
	}
	if r.n(4) == 0 {
		p := v1.ServiceInternalTrafficPolicyLocal
		svc.Spec.InternalTrafficPolicy = &p
	}
	var out []*discovery.EndpointSlice
	for _, f := range fams {
		at := discovery.AddressTypeIPv4
		if f == model.IPv6 {
			at = discovery.AddressTypeIPv6
		}
		sl := &discovery.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "fz", Name: fmt.Sprintf("%s-%s", svcName, strings.ToLower(string(at))), Labels: map[string]string{discovery.LabelServiceName: svcName}},
			AddressType: at,
		}
		if r.n(12) == 0 {
			sl.AddressType = pick(r, discovery.AddressTypeFQDN, "IPv5")
		}
		for p, sp := range svc.Spec.Ports {
			name, port, proto := sp.Name, int32(8080+p), sp.Protocol
			if r.n(12) == 0 {
				proto = pick(r, v1.ProtocolUDP, v1.ProtocolTCP)
			}
			if proto == "" {
				proto = v1.ProtocolTCP
			}
			sl.Ports = append(sl.Ports, discovery.EndpointPort{Name: &name, Port: &port, Protocol: &proto})
		}
		seen := map[string]bool{}
		for range r.n(5) {
			local := r.n(2) == 0
			ip := addr(f, "198.18.130.%d", "fd00:18:1:b::%x", 100+r.n(8))
			nodeName, zone := "node-b", "zone-b"
			if local {
				ip = addr(f, "198.18.129.%d", "fd00:18:1:a::%x", 100+r.n(8))
				nodeName, zone = Node, Zone
			}
			if r.n(20) == 0 {
				ip = pick(r, "198.18.129.300", "fd00:18:1:a::1%eth0", "")
			}
			if seen[ip] {
				continue
			}
			seen[ip] = true
			bits := r.next()
			ready, serving, terminating := bits&1 != 0, bits&2 != 0, bits&4 != 0
			ep := discovery.Endpoint{Addresses: []string{ip}, NodeName: &nodeName, Zone: &zone,
				Conditions: discovery.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &terminating}}
			if bits&8 != 0 {
				ep.Hints = &discovery.EndpointHints{ForZones: []discovery.ForZone{{Name: pick(r, Zone, "zone-b")}}}
			}
			sl.Endpoints = append(sl.Endpoints, ep)
		}
		out = append(out, sl)
	}
	return svc, out
}

// direct is one ClusterIP port named fz/name:name, put into the state as
// the model hands ports over, with one local and one remote endpoint.
func direct(r *reader, f v1.IPFamily, name string) *model.FamilyDelta {
	proto := pick(r, v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP)
	n := model.ServicePortName{Port: name, Protocol: proto}
	n.Namespace, n.Name = name, name
	sp := &model.ServicePort{
		Name: n, Family: f, Type: v1.ServiceTypeClusterIP, Protocol: proto, Port: 80,
		ClusterIP: netip.MustParseAddr(addr(f, "198.19.3.%d", "fd00:19::3:%x", 100)),
	}
	eps := []*model.Endpoint{
		{IP: netip.MustParseAddr(addr(f, "198.18.129.%d", "fd00:18:1:a::%x", 110)), Port: 8080, Ready: true, Serving: true, Local: true, NodeName: Node, Zone: Zone},
		{IP: netip.MustParseAddr(addr(f, "198.18.130.%d", "fd00:18:1:b::%x", 110)), Port: 8080, Ready: true, Serving: true, NodeName: "node-b", Zone: "zone-b"},
	}
	return &model.FamilyDelta{
		Services:  map[model.ServicePortName]*model.ServicePort{n: sp},
		Endpoints: map[model.ServicePortName][]*model.Endpoint{n: eps},
	}
}

// Allowed returns where the model lets a packet from one of this node's
// pods to the cluster IP of sp go: the endpoints of its selection for
// internal traffic (Local when the internal traffic policy is Local, else
// Cluster). None means the packet must be dropped or rejected.
func Allowed(st *model.State, sp *model.ServicePort) []netip.AddrPort {
	sel := model.SelectEndpoints(sp, st.Endpoints[sp.Name], Node, Zone)
	eps := sel.Cluster
	if sp.InternalPolicyLocal {
		eps = sel.Local
	}
	out := make([]netip.AddrPort, 0, len(eps))
	for _, e := range eps {
		out = append(out, e.AddrPort())
	}
	return out
}

// Tracer traces one packet through the rules rendered for family f.
type Tracer func(f v1.IPFamily, p trace.Packet) (*trace.Result, error)

// CheckTraced sends, for every service port of every family, a packet from
// one of node-a's pods (arriving on iif) to the port's cluster IP and port,
// and checks that every outcome is DNAT to one of the endpoints the model
// allows (Allowed), or a drop or reject when it allows none.
func CheckTraced(t testing.TB, s *Snapshot, iif string, tr Tracer) {
	t.Helper()
	src := map[v1.IPFamily]netip.Addr{model.IPv4: netip.MustParseAddr("198.18.129.5"), model.IPv6: netip.MustParseAddr("fd00:18:1:a::5")}
	for _, f := range Families {
		st := s.States[f]
		for _, n := range st.SortedNames() {
			sp := st.Services[n]
			p := trace.Packet{Src: src[f], SrcPort: 40000, Dst: sp.ClusterIP, DstPort: uint16(sp.Port), Proto: sp.Protocol, IIF: iif}
			res, err := tr(f, p)
			if err != nil {
				t.Fatalf("%v: trace: %v", n, err)
			}
			allowed := Allowed(st, sp)
			if len(res.Outcomes) == 0 {
				t.Errorf("%v: no outcome for %s", n, p)
				continue
			}
			for _, o := range res.Outcomes {
				switch {
				case len(allowed) == 0:
					if o.Verdict != trace.VerdictDrop && o.Verdict != trace.VerdictReject {
						t.Errorf("%v has no endpoint for pods of this node, but %s ends %s (DNAT %v)\n%s", n, p, o.Verdict, o.DNAT, res)
					}
				case o.Verdict != trace.VerdictAccept || o.DNAT == nil || !slices.Contains(allowed, *o.DNAT):
					t.Errorf("%v: %s ends %s (DNAT %v), the model allows %v\n%s", n, p, o.Verdict, o.DNAT, allowed, res)
				}
			}
		}
	}
}

var quiet sync.Once

// Quiet silences klog for a fuzz target: the model logs every invalid
// object it is fed, and a fuzzer feeds thousands a second.
func Quiet() {
	quiet.Do(func() {
		fs := flag.NewFlagSet("klog", flag.ContinueOnError)
		klog.InitFlags(fs)
		_ = fs.Set("logtostderr", "false")
		_ = fs.Set("alsologtostderr", "false")
		_ = fs.Set("stderrthreshold", "FATAL")
		klog.SetOutput(io.Discard)
	})
}

// RenderSeeds are the renderers' fuzz seeds for Build: an empty one,
// hand-made runs that make services share cluster IPs and node ports,
// and six of Seeds.
func RenderSeeds() [][]byte {
	return append([][]byte{
		nil,
		[]byte("\x05\x01\x02\x00\x01\x00\x01\x03\x00\x02\x04\x01\x03\x07\x02\x05\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09"),
		[]byte("\x03\x02\x02\x02\x00\x02\x00\x00\x02\x01\x01\x00\x00\x03\x03\x0f\x00\x02\x03\x00\x01\x0f\x01\x00\x04\x07"),
		[]byte(strings.Repeat("\x01\x00", 64)),
		[]byte(strings.Repeat("\xff\x7f\x13", 50)),
		[]byte("\x00\x00\x00\x00\x04\x06\x05\x06\x00\x00\x00\x00\x00\x00\x00\x00\x00"),
	}, Seeds(6)...)
}

// Seeds returns n byte strings for Build drawn from a fixed
// pseudo-random sequence (the same every run): each makes a snapshot of
// several services, most with endpoints.
func Seeds(n int) [][]byte {
	r := rand.New(rand.NewPCG(17, 3))
	out := make([][]byte, n)
	for i := range out {
		b := make([]byte, 300)
		for j := range b {
			b[j] = byte(r.IntN(256))
		}
		out[i] = b
	}
	return out
}
