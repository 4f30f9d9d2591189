package kernel

// Hostile names through the file source: Services whose names,
// namespaces and port names hold quotes, newlines with iptables-restore or
// nft commands, control characters, non-ASCII or 1,000 characters (see
// internal/testutil/hostile). The API server would refuse them; a file
// hands them over as they are. Addresses: the example's plan
// (cluster_test.go), plus 198.19.50.N for the hostile services' cluster
// IPs and 198.18.1.99, the address the injections try to send the
// example's web-clusterip to (nothing listens there).

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/kproxy/kproxy/internal/testutil/hostile"
	"github.com/kproxy/kproxy/internal/testutil/netns"
)

// hostileObjects returns, per hostile case, a Service and its slice as
// JSON (which YAML reads), so that every byte of the names survives.
func hostileObjects(t *testing.T) []string {
	t.Helper()
	var out []string
	for i, n := range hostile.Names() {
		if n.Case == hostile.Long.Case {
			continue // valid: TestLongNames
		}
		if hasControl(n.Namespace + n.Name + n.Port) {
			// No YAML file can hold these (the file would be unparsable
			// as a whole); the renderers' own tests cover them.
			continue
		}
		svc := map[string]any{
			"apiVersion": "v1", "kind": "Service",
			"metadata": map[string]any{"name": n.Name, "namespace": n.Namespace, "resourceVersion": fmt.Sprint(9500 + i)},
			"spec": map[string]any{
				"type": "NodePort", "clusterIP": fmt.Sprintf("198.19.50.%d", i+1), "clusterIPs": []string{fmt.Sprintf("198.19.50.%d", i+1)},
				"ports": []any{map[string]any{"name": n.Port, "port": 80, "protocol": "TCP", "targetPort": 8080, "nodePort": 31000 + i}},
			},
		}
		slice := map[string]any{
			"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
			"metadata": map[string]any{"name": "s" + fmt.Sprint(i), "namespace": n.Namespace, "resourceVersion": fmt.Sprint(9600 + i),
				"labels": map[string]any{"kubernetes.io/service-name": n.Name}},
			"endpoints": []any{map[string]any{"addresses": []string{"198.18.1.99"}, "conditions": map[string]any{"ready": true}}},
			"ports":     []any{map[string]any{"name": n.Port, "port": 8080, "protocol": "TCP"}},
		}
		for _, o := range []any{svc, slice} {
			b, err := json.Marshal(o)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, string(b))
		}
	}
	return out
}

// TestHostileNames: on a fresh node and on a running one, in every mode,
// the hostile objects hijack nothing, add no rule outside kproxy's own,
// are named in the log and counted, and every healthy service keeps
// carrying traffic (a good change in the same file is applied).
func TestHostileNames(t *testing.T) { forEachMode(t, testHostileNames) }

func testHostileNames(t *testing.T, m proxyMode) {
	for _, tc := range nodeStates {
		t.Run(tc.name, func(t *testing.T) {
			snap := exampleSnapshot(t)
			objs := hostileObjects(t)
			if tc.atStart {
				for _, o := range objs {
					snap.add(t, o)
				}
			}
			c := newCluster(t, clusterOptions{mode: m, snapshot: snap, kproxyOn: []string{nodeA}})
			if !tc.atStart {
				for _, o := range objs {
					snap.add(t, o)
				}
			}
			snap.removeEndpoint(t, "web-nodeport", webB)
			c.apply(snap)
			webBIP := c.Pod(t, webB).IP(clientIP)
			c.waitRules(nodeA, "web-nodeport without web-b", func(d string) bool {
				return !c.mode.routesTo(d, "demo/web-nodeport/tcp/http", webBIP)
			})
			runProbes(t, c, []probe{
				{from: testerA, network: "tcp", dst: "198.19.0.10:80", servers: web, every: true, peer: peerOwn},
				{from: client, network: "tcp", dst: "198.19.0.10:80", servers: web, every: true, peer: peerMasq, masqBy: nodeA},
				{from: testerA, network: "tcp", dst: "198.19.0.11:80", n: 5, servers: []string{webA}, peer: peerOwn},
				{from: testerA, network: "udp", dst: "198.19.0.18:53", servers: dns, every: true, peer: peerOwn},
				{from: client, network: "tcp", dst: "[fd00:19::17]:80", servers: dual, every: true, peer: peerMasq, masqBy: nodeA},
			})
			dump, err := c.mode.dump(c.Nodes[nodeA].NS)
			if err != nil {
				t.Fatal(err)
			}
			for _, bad := range []string{"198.18.1.99", "203.0.113.0/24 -j ACCEPT", "services accept"} {
				if strings.Contains(dump, bad) {
					t.Errorf("the node's rules hold %q, from a hostile object:\n%s", bad, dump)
				}
			}
			if m.iptables {
				// Nothing in the built-in chains but kproxy's jumps.
				for _, line := range strings.Split(dump, "\n") {
					for _, chain := range []string{"INPUT", "FORWARD", "OUTPUT", "PREROUTING", "POSTROUTING"} {
						if strings.HasPrefix(line, "-A "+chain+" ") && !strings.Contains(line, "-j KUBE-") {
							t.Errorf("a rule outside kproxy's chains: %s", line)
						}
					}
				}
			}
			node := c.Nodes[nodeA]
			netns.Eventually(t, syncTimeout, "the hostile objects counted", func() (bool, string) {
				code, body, err := node.HTTPGet("http://127.0.0.1:10249/metrics", 2*time.Second)
				if err != nil || code != 200 {
					return false, "metrics unreachable"
				}
				return metricPositive(body, `kproxy_invalid_objects_total{kind="Service",reason="invalid_port_name"}`) &&
					metricPositive(body, `kproxy_invalid_objects_total{kind="Service",reason="invalid_name"}`), "kproxy_invalid_objects_total not counted"
			})
			log := c.kproxy[nodeA].Log()
			for _, n := range []string{"web", "nft"} {
				if !strings.Contains(log, `"Skipping invalid object" kind="Service" object="ns/`+n+`"`) {
					t.Errorf("the hostile Service ns/%s is not named in the log", n)
				}
			}
			if done, err := c.kproxy[nodeA].Exited(); done {
				t.Fatalf("kproxy exited: %v", err)
			}
		})
	}
}

// hasControl reports a control character other than newline and tab, or
// invalid UTF-8.
func hasControl(s string) bool {
	if !utf8.ValidString(s) {
		return true
	}
	for _, r := range s {
		if (r < 0x20 && r != '\n' && r != '\t') || r == 0x7f {
			return true
		}
	}
	return false
}
