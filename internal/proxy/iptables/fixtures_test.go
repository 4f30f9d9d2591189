package iptables

// Addresses in these tests (the built-in example's plan, see
// internal/example/example.yaml):
//
//	198.18.0.10, fd00:18::10        node-a, the node the rules are rendered for (zone-a)
//	198.18.0.11, fd00:18::11        node-b, another node (zone-b)
//	198.18.129.0/24, fd00:18:1:a::/64  node-a's pods
//	198.18.130.0/24, fd00:18:1:b::/64  node-b's pods
//	198.18.128.0/17, fd00:18:1::/48    the cluster CIDRs (detectLocalMode ClusterCIDR)
//	198.19.0.0/16, fd00:19::/112       service cluster IPs
//	198.19.200.0/24, fd00:19::c8:0/112 external and load balancer IPs (not local to the node)
//	203.0.113.0/24, 2001:db8::/32      clients outside the cluster; 203.0.113.0/24 is
//	                                   also in lb-ranges' loadBalancerSourceRanges
//	192.0.2.0/24                       clients outside every source range
//	198.19.1.0/24                      services the partial-sync tests add

import (
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kproxy/kproxy/internal/example"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy/flowtest"
	"github.com/kproxy/kproxy/internal/proxy/localdetect"
)

const masqueradeBit = 14

// The address plan of the shared packet-flow table (package flowtest),
// under the names this package's tests use.
const (
	podIIF    = flowtest.PodIIF
	lanIIF    = flowtest.LanIIF
	localPod  = flowtest.LocalPod
	localPod6 = flowtest.LocalPod6
	outside   = flowtest.Outside
	webEps    = flowtest.WebEps
)

// hostA is node-a as the tracer sees it.
var hostA = flowtest.HostA

// exampleCluster is the built-in example as seen from one node.
type exampleCluster struct {
	nodeName string
	node     *model.Node
	states   map[v1.IPFamily]*model.State
}

// loadExample runs the example through the tracker as `kproxy render` does.
func loadExample(t testing.TB, nodeName string) *exampleCluster {
	t.Helper()
	s := flowtest.Example(t, nodeName)
	return &exampleCluster{nodeName: nodeName, node: s.Node, states: s.States}
}

// exampleOptions are the options of the golden files: cluster CIDRs from
// the example, masquerade bit 14, localhost node ports on (the default),
// nodePortAddresses left at iptables mode's default (all local IPs).
func exampleOptions(f v1.IPFamily) Options {
	o := Options{Family: f, MasqueradeBit: masqueradeBit, LocalDetect: localdetect.Config{Mode: DetectClusterCIDR}, LocalhostNodePorts: true}
	for _, s := range example.ClusterCIDRs {
		p := netip.MustParsePrefix(s)
		if model.FamilyOf(p.Addr()) == f {
			o.LocalDetect.ClusterCIDRs = append(o.LocalDetect.ClusterCIDRs, p)
		}
	}
	return o
}

func (c *exampleCluster) input(f v1.IPFamily) *Input {
	return &Input{
		State:    c.states[f],
		NodeName: c.nodeName,
		Zone:     c.node.Zone(),
		Full:     true,
		Changed:  sets.New[model.ServicePortName](),
		Existing: &Existing{},
	}
}

// renderFull renders a full sync of one family on a fresh node.
func (c *exampleCluster) renderFull(t testing.TB, o Options) *Plan {
	t.Helper()
	return Render(o.RenderConfig(c.node, c.node.Addresses), c.input(o.Family), NewApplied())
}

// spName is the name of a port of demo/name.
func spName(name, port string, proto v1.Protocol) model.ServicePortName {
	return flowtest.SPName(name, port, proto)
}

// makeSP returns a ClusterIP service port demo/name:http, edited by tweak.
func makeSP(name, clusterIP string, port int32, tweak func(*model.ServicePort)) *model.ServicePort {
	ip := netip.MustParseAddr(clusterIP)
	sp := &model.ServicePort{
		Name:      spName(name, "http", model.TCP),
		Family:    model.FamilyOf(ip),
		Type:      v1.ServiceTypeClusterIP,
		ClusterIP: ip,
		Port:      port,
		Protocol:  model.TCP,
	}
	if tweak != nil {
		tweak(sp)
	}
	sp.Name.Protocol = sp.Protocol
	return sp
}

// makeEP returns a ready endpoint on node-a (local) or node-b.
func makeEP(addr string, port int32, local bool, tweak func(*model.Endpoint)) *model.Endpoint {
	e := &model.Endpoint{IP: netip.MustParseAddr(addr), Port: port, Ready: true, Serving: true, NodeName: example.NodeB, Zone: "zone-b"}
	if local {
		e.Local, e.NodeName, e.Zone = true, example.NodeA, "zone-a"
	}
	if tweak != nil {
		tweak(e)
	}
	return e
}
