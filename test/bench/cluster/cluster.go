// Package cluster generates benchmark clusters: Nodes, Services and
// EndpointSlices, deterministically from a seed, in a realistic mix of
// service kinds with long-tailed endpoint counts, or in the plain shape
// (ClusterIP services × 10 endpoints) the older benchmarks use. The objects
// serve both as a file-source snapshot (WriteJSON) and as objects to create
// in a kube-apiserver.
//
// Addresses (the project's test ranges):
//
//	198.18.0.10 + k      node k (198.18.0.0/20); fd00:18::a + k for dual-stack
//	198.18.16.0–239.255  pod (endpoint) addresses, 57344 of them; beyond that
//	                     the endpoints reuse addresses with another port
//	                     (8080 + 10·round + port index), so every address and
//	                     port stays distinct
//	198.18.240–255.x     left to the harness (its links; 198.18.250.0/24 is
//	                     the e2e control plane's)
//	198.19.0.2 + i       service i's ClusterIP (198.19.0.1 is the kubernetes
//	                     Service's); fd00:19::2 + i for dual-stack
//	198.19.255.254 − j   the j-th LoadBalancer's ingress IP, from the top
//	fd00:18:1::/64       IPv6 pod addresses
package cluster

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/netip"
	"strconv"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// Mix is the shape of a generated cluster.
type Mix string

const (
	// Realistic: about 60 % plain ClusterIP, 15 % NodePort, 10 %
	// LoadBalancer (half with source ranges), 5 % ClientIP affinity, 5 %
	// externalTrafficPolicy Local (LoadBalancers), 5 % internalTraffic
	// Policy Local; 5 % dual-stack and 10 % with two ports across all of
	// them; endpoint counts long-tailed (mean about 10, a tenth of a
	// percent of the services with 500–1000).
	Realistic Mix = "realistic"
	// Plain: ClusterIP services with one port and exactly 10 endpoints on
	// another node, IPv4 only: the older benchmarks' cluster.
	Plain Mix = "plain"
)

// Kind is a service's category in the mix.
type Kind string

const (
	KindClusterIP     Kind = "clusterip"
	KindNodePort      Kind = "nodeport"
	KindLB            Kind = "loadbalancer"
	KindLBRanges      Kind = "loadbalancer-source-ranges"
	KindAffinity      Kind = "affinity"
	KindETPLocal      Kind = "etp-local"
	KindITPLocal      Kind = "itp-local"
	defaultNS              = "bench"
	nodePortBase           = 20000 // the API server runs with --service-node-port-range=NodePortRange
	maxServices            = 55000 // ClusterIPs from the bottom and LB IPs from the top of 198.19.0.0/16
	podAddresses           = 224 * 256
	endpointsPerSlice      = 100 // the EndpointSlice controller's default
	tailFraction           = 0.001
)

// NodePortRange is the --service-node-port-range a kube-apiserver needs to
// accept the generated node ports (the default 30000-32767 holds 2768).
const NodePortRange = "20000-65000"

// kinds is the realistic mix, in percent.
var kinds = []struct {
	kind    Kind
	percent int
}{
	{KindClusterIP, 60}, {KindNodePort, 15}, {KindLB, 5}, {KindLBRanges, 5},
	{KindAffinity, 5}, {KindETPLocal, 5}, {KindITPLocal, 5},
}

// Options say what to generate.
type Options struct {
	Services int
	Mix      Mix
	Seed     uint64
	// Nodes is how many nodes the endpoints spread over (node 0 is the
	// one the proxy runs on); max(20, Services/20) when zero.
	Nodes int
	// Zones is how many zones the nodes are in; 3 when zero.
	Zones int
	// Namespace holds the services; "bench" when empty.
	Namespace string
}

// Cluster is a generated cluster. Services[i] is service i; its slices
// are SlicesOf[i] (indexes into Slices).
type Cluster struct {
	Opts     Options
	Nodes    []*v1.Node
	Services []*v1.Service
	Kinds    []Kind
	Slices   []*discovery.EndpointSlice
	SlicesOf [][]int

	rng      *rand.Rand
	nextPod  int // next pod address index
	nextNP   int // next node port
	nextLB   int
	nextSvc  int // index for the next added service
	sliceGen map[string]int
}

// Generate makes a cluster. It fails on options it cannot honour.
func Generate(o Options) (*Cluster, error) {
	if o.Services < 1 || o.Services > maxServices {
		return nil, fmt.Errorf("services: %d is not within 1..%d", o.Services, maxServices)
	}
	switch o.Mix {
	case "":
		o.Mix = Realistic
	case Realistic, Plain:
	default:
		return nil, fmt.Errorf("mix %q: want %q or %q", o.Mix, Realistic, Plain)
	}
	if o.Nodes == 0 {
		o.Nodes = max(20, o.Services/20)
	}
	if o.Nodes < 2 || o.Nodes > 4000 {
		return nil, fmt.Errorf("nodes: %d is not within 2..4000", o.Nodes)
	}
	if o.Zones == 0 {
		o.Zones = 3
	}
	if o.Namespace == "" {
		o.Namespace = defaultNS
	}
	c := &Cluster{Opts: o, rng: rand.New(rand.NewPCG(o.Seed, 0x6b70726f7879)), nextNP: nodePortBase, sliceGen: map[string]int{}}
	for k := range o.Nodes {
		c.Nodes = append(c.Nodes, c.node(k))
	}
	// The long tail: a tenth of a percent of the services, at random
	// places, get 500–1000 endpoints.
	tail := map[int]bool{}
	if o.Mix == Realistic {
		for _, i := range c.rng.Perm(o.Services)[:int(float64(o.Services)*tailFraction)] {
			tail[i] = true
		}
	}
	for i := range o.Services {
		c.addService(i, tail[i])
	}
	c.nextSvc = o.Services
	return c, nil
}

// LocalNode is the node the proxy under test runs as.
func (c *Cluster) LocalNode() *v1.Node { return c.Nodes[0] }

// NodeIP is node k's IPv4 address.
func NodeIP(k int) netip.Addr { return offset(netip.MustParseAddr("198.18.0.10"), k) }

// ClusterIP is service i's IPv4 ClusterIP.
func ClusterIP(i int) netip.Addr { return offset(netip.MustParseAddr("198.19.0.2"), i) }

func offset(a netip.Addr, n int) netip.Addr {
	b := a.As16()
	v := uint64(b[12])<<24 | uint64(b[13])<<16 | uint64(b[14])<<8 | uint64(b[15])
	v += uint64(n)
	b[12], b[13], b[14], b[15] = byte(v>>24), byte(v>>16), byte(v>>8), byte(v)
	if a.Is4() {
		return netip.AddrFrom16(b).Unmap()
	}
	return netip.AddrFrom16(b)
}

func (c *Cluster) node(k int) *v1.Node {
	zone := "zone-" + string(rune('a'+k%c.Opts.Zones))
	n := &v1.Node{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%04d", k), Labels: map[string]string{
			v1.LabelTopologyZone: zone, v1.LabelHostname: fmt.Sprintf("node-%04d", k)}},
		Status: v1.NodeStatus{Addresses: []v1.NodeAddress{
			{Type: v1.NodeInternalIP, Address: NodeIP(k).String()},
		}},
	}
	if c.Opts.Mix == Realistic {
		n.Status.Addresses = append(n.Status.Addresses, v1.NodeAddress{Type: v1.NodeInternalIP, Address: offset(netip.MustParseAddr("fd00:18::a"), k).String()})
	}
	return n
}

// endpointCount draws a service's endpoint count: log-normal (median 4.5,
// mean about 9) clamped to 1..400 for the body, 500–1000 for the tail.
func (c *Cluster) endpointCount(tail bool) int {
	if c.Opts.Mix == Plain {
		return 10
	}
	if tail {
		return 500 + c.rng.IntN(501)
	}
	v := math.Exp(1.5 + 1.2*c.rng.NormFloat64())
	return min(400, max(1, int(math.Round(v))))
}

func (c *Cluster) kind() Kind {
	if c.Opts.Mix == Plain {
		return KindClusterIP
	}
	r := c.rng.IntN(100)
	for _, k := range kinds {
		if r < k.percent {
			return k.kind
		}
		r -= k.percent
	}
	return KindClusterIP
}

func name(i int) string { return "svc-" + strconv.Itoa(i) }

// addService appends service i (a new index) with its slices.
func (c *Cluster) addService(i int, tail bool) {
	kind := c.kind()
	dual, ports := false, 1
	if c.Opts.Mix == Realistic {
		dual = c.rng.IntN(100) < 5
		if c.rng.IntN(100) < 10 {
			ports = 2
		}
	}
	n := c.endpointCount(tail)
	svc := &v1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Namespace: c.Opts.Namespace, Name: name(i), Labels: map[string]string{"app": name(i)}},
		Spec: v1.ServiceSpec{
			Type:       v1.ServiceTypeClusterIP,
			ClusterIP:  ClusterIP(i).String(),
			ClusterIPs: []string{ClusterIP(i).String()},
			IPFamilies: []v1.IPFamily{v1.IPv4Protocol},
			Selector:   map[string]string{"app": name(i)},
		},
	}
	if dual {
		v6 := offset(netip.MustParseAddr("fd00:19::2"), i).String()
		svc.Spec.ClusterIPs = append(svc.Spec.ClusterIPs, v6)
		svc.Spec.IPFamilies = append(svc.Spec.IPFamilies, v1.IPv6Protocol)
		svc.Spec.IPFamilyPolicy = ptr.To(v1.IPFamilyPolicyPreferDualStack)
	}
	for p := range ports {
		sp := v1.ServicePort{Name: "http", Port: 80, Protocol: v1.ProtocolTCP, TargetPort: intstr.FromString("http")}
		if p == 1 {
			sp = v1.ServicePort{Name: "metrics", Port: 9090, Protocol: v1.ProtocolTCP, TargetPort: intstr.FromString("metrics")}
		}
		svc.Spec.Ports = append(svc.Spec.Ports, sp)
	}
	switch kind {
	case KindNodePort:
		svc.Spec.Type = v1.ServiceTypeNodePort
	case KindLB, KindLBRanges, KindETPLocal:
		svc.Spec.Type = v1.ServiceTypeLoadBalancer
		for _, ip := range svc.Spec.ClusterIPs {
			lb := offset(netip.MustParseAddr("198.19.255.254"), -c.nextLB)
			if netip.MustParseAddr(ip).Is6() {
				lb = offset(netip.MustParseAddr("fd00:19::ffff:fffe"), -c.nextLB)
			}
			svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, v1.LoadBalancerIngress{IP: lb.String()})
		}
		c.nextLB++
		if kind == KindLBRanges {
			svc.Spec.LoadBalancerSourceRanges = []string{"203.0.113.0/24", "198.51.100.0/24"}
			if dual {
				svc.Spec.LoadBalancerSourceRanges = append(svc.Spec.LoadBalancerSourceRanges, "fd00:203::/48")
			}
		}
		if kind == KindETPLocal {
			svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			svc.Spec.HealthCheckNodePort = int32(c.nodePort())
		}
	case KindAffinity:
		svc.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		svc.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](10800)}}
	case KindITPLocal:
		svc.Spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicyLocal)
	}
	if svc.Spec.Type != v1.ServiceTypeClusterIP {
		if svc.Spec.ExternalTrafficPolicy == "" {
			svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyCluster
		}
		for p := range svc.Spec.Ports {
			svc.Spec.Ports[p].NodePort = int32(c.nodePort())
		}
	}
	c.Services = append(c.Services, svc)
	c.Kinds = append(c.Kinds, kind)
	c.SlicesOf = append(c.SlicesOf, nil)
	eps := make([]discovery.Endpoint, n)
	for j := range eps {
		eps[j] = c.endpoint(v1.IPv4Protocol)
	}
	c.setEndpoints(i, v1.IPv4Protocol, eps)
	if dual {
		for j := range eps {
			eps[j] = c.endpoint(v1.IPv6Protocol)
		}
		c.setEndpoints(i, v1.IPv6Protocol, eps)
	}
}

func (c *Cluster) nodePort() int {
	p := c.nextNP
	c.nextNP++
	return p
}

// podAddr is pod address k and the port round it is in.
func podAddr(fam v1.IPFamily, k int) (netip.Addr, int) {
	if fam == v1.IPv6Protocol {
		return offset(netip.MustParseAddr("fd00:18:1::1"), k), 0
	}
	return offset(netip.MustParseAddr("198.18.16.0"), k%podAddresses), k / podAddresses
}

// endpoint is a new pod: the next address, on a random node, 2 % not
// ready. Its port round is in its hostname ("r<round>"), read back by
// setEndpoints.
func (c *Cluster) endpoint(fam v1.IPFamily) discovery.Endpoint {
	a, round := podAddr(fam, c.nextPod)
	c.nextPod++
	node := c.Nodes[c.rng.IntN(len(c.Nodes))]
	ready := c.Opts.Mix == Plain || c.rng.IntN(100) >= 2
	if c.Opts.Mix == Plain {
		node = c.Nodes[1]
	}
	return discovery.Endpoint{
		Addresses:  []string{a.String()},
		Hostname:   ptr.To("r" + strconv.Itoa(round)),
		NodeName:   ptr.To(node.Name),
		Zone:       ptr.To(node.Labels[v1.LabelTopologyZone]),
		Conditions: discovery.EndpointConditions{Ready: ptr.To(ready), Serving: ptr.To(ready), Terminating: ptr.To(false)},
	}
}

// setEndpoints replaces service i's slices of family fam by slices of at
// most 100 endpoints, grouped by port round (the EndpointSlice
// controller's shape: one slice set per family and port set).
func (c *Cluster) setEndpoints(i int, fam v1.IPFamily, eps []discovery.Endpoint) {
	svc := c.Services[i]
	// Drop the family's old slices from the index (the slices themselves
	// are rewritten or deleted by the caller through Change).
	var keep []int
	for _, s := range c.SlicesOf[i] {
		if string(c.Slices[s].AddressType) != string(fam) {
			keep = append(keep, s)
		}
	}
	byRound := map[int][]discovery.Endpoint{}
	var rounds []int
	for _, e := range eps {
		r, _ := strconv.Atoi((*e.Hostname)[1:])
		if _, ok := byRound[r]; !ok {
			rounds = append(rounds, r)
		}
		byRound[r] = append(byRound[r], e)
	}
	for _, r := range rounds {
		group := byRound[r]
		for start := 0; start < len(group); start += endpointsPerSlice {
			key := svc.Name + "-" + string(fam)
			c.sliceGen[key]++
			s := &discovery.EndpointSlice{
				TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
				ObjectMeta: metav1.ObjectMeta{Namespace: svc.Namespace, Name: fmt.Sprintf("%s-%s-%d", svc.Name, familySuffix(fam), c.sliceGen[key]),
					Labels: map[string]string{discovery.LabelServiceName: svc.Name, discovery.LabelManagedBy: "kproxy-bench"}},
				AddressType: discovery.AddressType(fam),
				Endpoints:   append([]discovery.Endpoint(nil), group[start:min(len(group), start+endpointsPerSlice)]...),
			}
			for p, sp := range svc.Spec.Ports {
				s.Ports = append(s.Ports, discovery.EndpointPort{Name: ptr.To(sp.Name), Port: ptr.To(int32(8080 + 10*r + p)), Protocol: ptr.To(v1.ProtocolTCP)})
			}
			keep = append(keep, len(c.Slices))
			c.Slices = append(c.Slices, s)
		}
	}
	c.SlicesOf[i] = keep
}

func familySuffix(fam v1.IPFamily) string {
	if fam == v1.IPv6Protocol {
		return "v6"
	}
	return "v4"
}

// Endpoints is how many endpoints the cluster's live slices hold.
func (c *Cluster) Endpoints() int {
	n := 0
	for _, ss := range c.SlicesOf {
		for _, s := range ss {
			n += len(c.Slices[s].Endpoints)
		}
	}
	return n
}

// Objects are the cluster's live objects: nodes, services, then their
// slices, in index order.
func (c *Cluster) Objects() []any {
	var out []any
	for _, n := range c.Nodes {
		out = append(out, n)
	}
	for i, s := range c.Services {
		if s == nil {
			continue
		}
		out = append(out, s)
		for _, si := range c.SlicesOf[i] {
			out = append(out, c.Slices[si])
		}
	}
	return out
}

// WriteJSON writes the cluster as a kubectl List (what the file source
// reads). Same options, same bytes.
func (c *Cluster) WriteJSON(w io.Writer) error {
	return json.NewEncoder(w).Encode(map[string]any{"apiVersion": "v1", "kind": "List", "items": c.Objects()})
}
