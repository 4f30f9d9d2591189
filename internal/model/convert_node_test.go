package model

// Addresses: 198.18.0.0/16 nodes and pods (198.18.0.x nodes, 198.18.1.0/24
// this node's pods), fd00::/8 ULAs for IPv6 (fd00:18:: nodes and pods).

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestConvertNode(t *testing.T) {
	tests := []struct {
		name     string
		node     *v1.Node
		want     *Node // Object is checked separately
		wantErrs []string
		wantV4   []netip.Prefix
		wantV6   []netip.Prefix
		wantZone string
	}{{
		name: "dual-stack pod CIDRs and addresses",
		node: makeNode(thisNode, func(n *v1.Node) {
			n.Labels = map[string]string{v1.LabelTopologyZone: "zone-a"}
			n.Spec.PodCIDR = "198.18.1.0/24"
			n.Spec.PodCIDRs = []string{"198.18.1.0/24", "fd00:18:1::/64"}
			n.Status.Addresses = []v1.NodeAddress{
				{Type: v1.NodeHostName, Address: thisNode},
				{Type: v1.NodeInternalIP, Address: "198.18.0.1"},
				{Type: v1.NodeInternalIP, Address: "fd00:18::1"},
				{Type: v1.NodeExternalIP, Address: "198.18.0.101"},
				{Type: v1.NodeInternalDNS, Address: "node-a.cluster.example"},
			}
		}),
		want: &Node{
			Name:      thisNode,
			Labels:    map[string]string{v1.LabelTopologyZone: "zone-a"},
			PodCIDRs:  []netip.Prefix{prefix("198.18.1.0/24"), prefix("fd00:18:1::/64")},
			Addresses: addrs("198.18.0.1", "fd00:18::1", "198.18.0.101"),
		},
		wantV4:   []netip.Prefix{prefix("198.18.1.0/24")},
		wantV6:   []netip.Prefix{prefix("fd00:18:1::/64")},
		wantZone: "zone-a",
	}, {
		name: "legacy spec.podCIDR only, host bits masked",
		node: makeNode(thisNode, func(n *v1.Node) {
			n.Spec.PodCIDR = "198.18.1.7/24"
		}),
		want:   &Node{Name: thisNode, PodCIDRs: []netip.Prefix{prefix("198.18.1.0/24")}},
		wantV4: []netip.Prefix{prefix("198.18.1.0/24")},
	}, {
		name: "being deleted",
		node: makeNode(thisNode, func(n *v1.Node) {
			n.DeletionTimestamp = &metav1.Time{}
		}),
		want: &Node{Name: thisNode, Deleting: true},
	}, {
		name: "tainted by the cluster autoscaler",
		node: makeNode(thisNode, func(n *v1.Node) {
			n.Spec.Taints = []v1.Taint{
				{Key: "node.kubernetes.io/unschedulable", Effect: v1.TaintEffectNoSchedule},
				{Key: TaintToBeDeleted, Value: "1700000000", Effect: v1.TaintEffectNoSchedule},
			}
		}),
		want: &Node{Name: thisNode, Deleting: true},
	}, {
		name: "other taints do not drain the node",
		node: makeNode(thisNode, func(n *v1.Node) {
			n.Spec.Taints = []v1.Taint{{Key: "node.kubernetes.io/unschedulable", Effect: v1.TaintEffectNoSchedule}}
		}),
		want: &Node{Name: thisNode},
	}, {
		name: "invalid pod CIDR and address are skipped",
		node: makeNode(thisNode, func(n *v1.Node) {
			n.Spec.PodCIDRs = []string{"198.18.1.0/24", "fd00:18:1::/129"}
			n.Status.Addresses = []v1.NodeAddress{
				{Type: v1.NodeInternalIP, Address: "198.18.0.300"},
				{Type: v1.NodeInternalIP, Address: "198.18.0.1"},
			}
		}),
		want: &Node{
			Name:      thisNode,
			PodCIDRs:  []netip.Prefix{prefix("198.18.1.0/24")},
			Addresses: addrs("198.18.0.1"),
		},
		wantErrs: []string{"spec.podCIDRs[1]", "status.addresses"},
		wantV4:   []netip.Prefix{prefix("198.18.1.0/24")},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, errs := ConvertNode(tc.node)
			if got.Object != tc.node {
				t.Errorf("Object is not the converted node")
			}
			if diff := cmp.Diff(tc.want, got, netipComparers, cmpopts.IgnoreFields(Node{}, "Object"), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("node (-want +got):\n%s", diff)
			}
			checkErrs(t, errs, "Node", tc.node.Name, tc.wantErrs)
			if diff := cmp.Diff(tc.wantV4, got.PodCIDRsOf(IPv4), netipComparers); diff != "" {
				t.Errorf("PodCIDRsOf(IPv4) (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantV6, got.PodCIDRsOf(IPv6), netipComparers); diff != "" {
				t.Errorf("PodCIDRsOf(IPv6) (-want +got):\n%s", diff)
			}
			if z := got.Zone(); z != tc.wantZone {
				t.Errorf("Zone() = %q, want %q", z, tc.wantZone)
			}
		})
	}
}

func TestNilNode(t *testing.T) {
	var n *Node
	if n.Zone() != "" || n.PodCIDRsOf(IPv4) != nil {
		t.Errorf("nil node: Zone() = %q, PodCIDRsOf = %v; want empty", n.Zone(), n.PodCIDRsOf(IPv4))
	}
}

func TestFamilyOf(t *testing.T) {
	for s, want := range map[string]v1.IPFamily{
		"198.18.0.1":        IPv4,
		"::ffff:198.18.0.1": IPv4,
		"fd00:18::1":        IPv6,
		"::":                IPv6,
	} {
		if got := FamilyOf(addr(s)); got != want {
			t.Errorf("FamilyOf(%s) = %s, want %s", s, got, want)
		}
	}
}

func TestInvalidError(t *testing.T) {
	e := invalid("Service", "ns/svc", "spec.ports[0].port", "%d is out of range", 0)
	if got, want := e.Error(), "Service ns/svc: spec.ports[0].port: 0 is out of range"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	e = invalid("Node", "node-a", "", "broken")
	if got, want := e.Error(), "Node node-a: broken"; got != want {
		t.Errorf("Error() without field = %q, want %q", got, want)
	}
}

func TestParseAddrAndPrefix(t *testing.T) {
	addrTests := []struct {
		in, want string // want "" means an error
	}{
		{in: "198.18.0.1", want: "198.18.0.1"},
		{in: " 198.18.0.1 ", want: "198.18.0.1"},
		{in: "198.018.000.001", want: "198.18.0.1"}, // leading zeros are decimal, as upstream
		{in: "::ffff:198.18.0.1", want: "198.18.0.1"},
		{in: "fd00:18::1", want: "fd00:18::1"},
		{in: "fe80::1%eth0"},
		{in: "198.18.0.256"},
		{in: "198.18.0.1/32"},
		{in: ""},
	}
	for _, tc := range addrTests {
		got, err := parseAddr(tc.in)
		if tc.want == "" {
			if err == nil {
				t.Errorf("parseAddr(%q) = %s, want an error", tc.in, got)
			}
			continue
		}
		if err != nil || got != addr(tc.want) {
			t.Errorf("parseAddr(%q) = %s, %v; want %s", tc.in, got, err, tc.want)
		}
	}
	prefixTests := []struct {
		in, want string
	}{
		{in: "198.18.0.0/16", want: "198.18.0.0/16"},
		{in: " 198.18.7.9/16 ", want: "198.18.0.0/16"},
		{in: "198.018.0.0/16", want: "198.18.0.0/16"},
		{in: "fd00:18::1/64", want: "fd00:18::/64"},
		{in: "0.0.0.0/0", want: "0.0.0.0/0"},
		{in: "::ffff:198.18.0.0/112"}, // family ambiguous
		{in: "198.18.0.0/33"},
		{in: "198.18.0.0"},
		{in: ""},
	}
	for _, tc := range prefixTests {
		got, err := parsePrefix(tc.in)
		if tc.want == "" {
			if err == nil {
				t.Errorf("parsePrefix(%q) = %s, want an error", tc.in, got)
			}
			continue
		}
		if err != nil || got != prefix(tc.want) {
			t.Errorf("parsePrefix(%q) = %s, %v; want %s", tc.in, got, err, tc.want)
		}
	}
}
