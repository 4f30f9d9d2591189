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
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy"
	"github.com/kproxy/kproxy/internal/proxy/flowtest"
	"github.com/kproxy/kproxy/internal/proxy/localdetect"
	"github.com/kproxy/kproxy/internal/testutil/fixtures"
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

// exampleOptions are the options of the golden files: cluster CIDRs from
// the example, masquerade bit 14, localhost node ports on (the default),
// nodePortAddresses left at iptables mode's default (all local IPs).
func exampleOptions(f v1.IPFamily) Options {
	o := Options{Family: f, ModeOptions: config.ModeOptions{MasqueradeBit: masqueradeBit, LocalDetect: localdetect.Config{Mode: localdetect.ClusterCIDR}}, LocalhostNodePorts: true}
	o.LocalDetect.ClusterCIDRs = fixtures.ClusterCIDRs(f)
	return o
}

// exampleInput is a full sync of family f of the example on a fresh node.
func exampleInput(c *flowtest.Snapshot, f v1.IPFamily) *Input {
	return &Input{
		RenderInput: proxy.RenderInput{State: c.States[f], NodeName: c.Node.Name, Zone: c.Node.Zone(), Changed: sets.New[model.ServicePortName]()},
		Full:        true,
		Existing:    &Existing{},
	}
}

// renderFull renders a full sync of one family on a fresh node.
func renderFull(t testing.TB, c *flowtest.Snapshot, o Options) *Plan {
	t.Helper()
	return Render(o.RenderConfig(c.Node, c.Node.Addresses), exampleInput(c, o.Family), NewApplied())
}
