package kernel

// A node whose Node object kproxy has not seen (addresses as in
// cluster_test.go).

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/testutil/netns"
)

// TestNodeNotSeen runs kproxy (nftables mode) from a snapshot without
// node-a's Node, as upstream kube-proxy runs when its Node does not exist
// in time: kproxy starts and syncs; /healthz answers 503 with nodeEligible
// false (so load balancers skip the node) while /livez answers 200;
// /configz shows the defaulted mode and nodePortAddresses ([primary]); the
// node's primary IPs being unknown, NodePorts answer on all its addresses.
// Once the Node appears: /healthz 200, NodePorts on the primary IPs only.
func TestNodeNotSeen(t *testing.T) {
	t.Parallel()
	full := exampleSnapshot(t)
	noNode := full.clone(t)
	noNode.Items = slices.DeleteFunc(noNode.Items, func(o map[string]any) bool {
		k, n := kindName(o)
		return k == "Node" && n == nodeA
	})
	if len(noNode.Items) != len(full.Items)-1 {
		t.Fatal("the example has no Node node-a to remove")
	}
	c := newCluster(t, clusterOptions{snapshot: noNode, kproxyOn: []string{nodeA}})
	node := c.Nodes[nodeA]
	base := "http://" + netip.AddrPortFrom(node.Addr(clientIP), 10256).String()

	type health struct {
		NodeEligible *bool `json:"nodeEligible"`
		Healthy      bool  `json:"healthy"`
	}
	expect := func(path string, code int, eligible *bool) {
		t.Helper()
		netns.Eventually(t, syncTimeout, fmt.Sprintf("%s %d", path, code), func() (bool, string) {
			got, body, err := c.Client.HTTPGet(base+path, 2*time.Second)
			var h health
			if err == nil {
				err = json.Unmarshal([]byte(body), &h)
			}
			ok := err == nil && got == code && (eligible == nil) == (h.NodeEligible == nil) &&
				(eligible == nil || *eligible == *h.NodeEligible)
			return ok, fmt.Sprintf("%d %s %v", got, body, err)
		})
	}
	no, yes := false, true
	expect("/healthz", 503, &no)
	expect("/livez", 200, nil)

	code, body, err := node.HTTPGet("http://127.0.0.1:10249/configz", 2*time.Second)
	if err != nil || code != 200 {
		t.Fatalf("/configz: %d %v", code, err)
	}
	var cz map[string]struct {
		Mode              string   `json:"mode"`
		NodePortAddresses []string `json:"nodePortAddresses"`
	}
	if err := json.Unmarshal([]byte(body), &cz); err != nil {
		t.Fatalf("/configz: %v\n%s", err, body)
	}
	if got := cz["kubeproxy.config.k8s.io"]; got.Mode != "nftables" || !slices.Equal(got.NodePortAddresses, []string{"primary"}) {
		t.Errorf("/configz: mode %q, nodePortAddresses %q; want nftables, [primary] (upstream's defaulted values)\n%s", got.Mode, got.NodePortAddresses, body)
	}

	runProbes(t, c, []probe{
		{from: client, network: "tcp", dst: "198.18.0.10:30080", servers: web, n: 3},
		{from: testerA, network: "tcp", dst: "198.18.129.1:30080", servers: web, n: 3},
	})

	c.apply(full)
	expect("/healthz", 200, &yes)
	netns.Eventually(t, syncTimeout, "NodePorts on the primary IPs only", func() (bool, string) {
		r := c.Pod(t, testerA).NS.Request("tcp", ap("198.18.129.1:30080"), netns.DialOptions{})
		return r.Outcome == netns.Refused, r.String()
	})
	runProbes(t, c, []probe{
		{from: client, network: "tcp", dst: "198.18.0.10:30080", servers: web, n: 3},
	})
}
