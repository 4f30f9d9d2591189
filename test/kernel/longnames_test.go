package kernel

// Long names: a Service with the longest namespace, name and
// port name the API server accepts (63, 63 and 15 characters) must not
// keep the node's other services, or itself, from being programmed. Its
// element comments ("ns/name:port/TCP", 147 bytes) are past nf_tables'
// 128 bytes unless cut, and then the whole transaction was refused.
// Addresses: the example's plan (cluster_test.go), plus
//
//   198.19.0.41, fd00:19::41  the long-named service's cluster IPs, port 80
//   node port 30141           the same service on the nodes' addresses
//
// Its endpoints are the example's web pods (IPv4) and dual pods (IPv6),
// port 8080.

import (
	"strings"
	"testing"
)

var (
	longNamespace = "ns-" + strings.Repeat("n", 56) + "-end"
	longName      = "svc-" + strings.Repeat("s", 55) + "-end"
	longPort      = "port-pppppp-end"
)

// longNamed is the Service and its slices, as a List.
func longNamed() string {
	r := strings.NewReplacer("NS", longNamespace, "NAME", longName, "PORT", longPort)
	return r.Replace(`
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Service
  metadata:
    name: NAME
    namespace: NS
    resourceVersion: "9401"
    uid: 6b1f0c2e-9401-4a5b-9c8d-000000009401
    creationTimestamp: "2026-01-15T10:00:00Z"
  spec:
    clusterIP: 198.19.0.41
    clusterIPs: [198.19.0.41, fd00:19::41]
    ipFamilies: [IPv4, IPv6]
    ipFamilyPolicy: RequireDualStack
    ports:
    - name: PORT
      port: 80
      protocol: TCP
      targetPort: 8080
      nodePort: 30141
    type: NodePort
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  addressType: IPv4
  metadata:
    name: NAME-v4
    namespace: NS
    resourceVersion: "9402"
    labels:
      kubernetes.io/service-name: NAME
  endpoints:
  - addresses: [198.18.129.10]
    conditions: {ready: true, serving: true, terminating: false}
    nodeName: node-a
    targetRef: {kind: Pod, name: web-6f7c9d-a1b2c, namespace: demo}
  - addresses: [198.18.130.10]
    conditions: {ready: true, serving: true, terminating: false}
    nodeName: node-b
    targetRef: {kind: Pod, name: web-6f7c9d-d3e4f, namespace: demo}
  ports:
  - name: PORT
    port: 8080
    protocol: TCP
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  addressType: IPv6
  metadata:
    name: NAME-v6
    namespace: NS
    resourceVersion: "9403"
    labels:
      kubernetes.io/service-name: NAME
  endpoints:
  - addresses: ["fd00:18:1:a::50"]
    conditions: {ready: true, serving: true, terminating: false}
    nodeName: node-a
    targetRef: {kind: Pod, name: dual-84f6c9-s3d7f, namespace: demo}
  - addresses: ["fd00:18:1:b::50"]
    conditions: {ready: true, serving: true, terminating: false}
    nodeName: node-b
    targetRef: {kind: Pod, name: dual-84f6c9-w9e2r, namespace: demo}
  ports:
  - name: PORT
    port: 8080
    protocol: TCP
`)
}

// TestLongNames: a node whose snapshot holds the example and the
// long-named service, from the start (a fresh node) or added while kproxy
// runs (a partial sync): every service carries traffic, the long-named one
// included, in both families.
func TestLongNames(t *testing.T) { forEachMode(t, testLongNames) }

func testLongNames(t *testing.T, m proxyMode) {
	for _, tc := range nodeStates {
		t.Run(tc.name, func(t *testing.T) {
			snap := exampleSnapshot(t)
			if tc.atStart {
				snap.addList(t, longNamed())
			}
			c := newCluster(t, clusterOptions{mode: m, snapshot: snap, kproxyOn: []string{nodeA}})
			if !tc.atStart {
				snap.addList(t, longNamed())
				c.apply(snap)
				c.waitRules(nodeA, "the long-named service", func(d string) bool {
					return c.mode.captures(d, "198.19.0.41", "tcp", 80)
				})
			}
			runProbes(t, c, []probe{
				// The long-named service: cluster IPs and node port.
				{from: testerA, network: "tcp", dst: "198.19.0.41:80", servers: web, every: true, peer: peerOwn},
				{from: nodeA, network: "tcp", dst: "198.19.0.41:80", servers: web, every: true, peer: peerMasq, masqBy: nodeA},
				{from: testerA, network: "tcp", dst: "[fd00:19::41]:80", servers: dual, every: true, peer: peerOwn},
				{from: client, network: "tcp", dst: "198.18.0.10:30141", servers: web, every: true, peer: peerMasq, masqBy: nodeA},
				{from: client, network: "tcp", dst: "[fd00:18::10]:30141", servers: dual, every: true, peer: peerMasq, masqBy: nodeA},
				// Healthy services beside it.
				{from: testerA, network: "tcp", dst: "198.19.0.10:80", servers: web, every: true, peer: peerOwn},
				{from: client, network: "tcp", dst: "198.18.0.10:30080", servers: web, every: true, peer: peerMasq, masqBy: nodeA},
				{from: testerA, network: "udp", dst: "198.19.0.18:53", servers: dns, every: true, peer: peerOwn},
				{from: testerA, network: "tcp", dst: "[fd00:19::17]:80", servers: dual, every: true, peer: peerOwn},
			})
		})
	}
}
