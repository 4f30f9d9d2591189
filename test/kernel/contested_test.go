package kernel

// Contested addresses: demo/web-nodeport (198.19.0.11:80, node port 30080,
// pods web-a and web-b, created 2026-01-15) and three newer Services in
// namespace "aaa" (which sorts first) that claim its cluster IP and port,
// its node port, and its cluster IP as an external IP; their endpoints are
// the shop pods. 198.19.0.40 and 198.19.0.41 are the intruders' own
// cluster IPs.

import "testing"

const contestedIntruders = `
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Service
  metadata: {name: cip, namespace: aaa, creationTimestamp: "2026-02-01T00:00:00Z", resourceVersion: "9201"}
  spec:
    clusterIP: 198.19.0.11
    clusterIPs: [198.19.0.11]
    ipFamilies: [IPv4]
    ports: [{name: http, port: 80, protocol: TCP, targetPort: 8080}]
    type: ClusterIP
- apiVersion: v1
  kind: Service
  metadata: {name: np, namespace: aaa, creationTimestamp: "2026-02-01T00:00:00Z", resourceVersion: "9202"}
  spec:
    clusterIP: 198.19.0.40
    clusterIPs: [198.19.0.40]
    ipFamilies: [IPv4]
    ports: [{name: http, port: 80, protocol: TCP, targetPort: 8080, nodePort: 30080}]
    type: NodePort
- apiVersion: v1
  kind: Service
  metadata: {name: ext, namespace: aaa, creationTimestamp: "2026-02-01T00:00:00Z", resourceVersion: "9203"}
  spec:
    clusterIP: 198.19.0.41
    clusterIPs: [198.19.0.41]
    externalIPs: [198.19.0.11]
    ipFamilies: [IPv4]
    ports: [{name: http, port: 80, protocol: TCP, targetPort: 8080}]
    type: ClusterIP
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  addressType: IPv4
  metadata: {name: cip-1, namespace: aaa, resourceVersion: "9204", labels: {kubernetes.io/service-name: cip}}
  endpoints:
  - addresses: [198.18.129.20]
    conditions: {ready: true, serving: true, terminating: false}
    nodeName: node-a
    targetRef: {kind: Pod, name: shop-58d4b7-k2m9x, namespace: demo}
  - addresses: [198.18.130.20]
    conditions: {ready: true, serving: true, terminating: false}
    nodeName: node-b
    targetRef: {kind: Pod, name: shop-58d4b7-q7w3z, namespace: demo}
  ports: [{name: http, port: 8080, protocol: TCP}]
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  addressType: IPv4
  metadata: {name: np-1, namespace: aaa, resourceVersion: "9205", labels: {kubernetes.io/service-name: np}}
  endpoints:
  - addresses: [198.18.129.20]
    conditions: {ready: true, serving: true, terminating: false}
    nodeName: node-a
    targetRef: {kind: Pod, name: shop-58d4b7-k2m9x, namespace: demo}
  - addresses: [198.18.130.20]
    conditions: {ready: true, serving: true, terminating: false}
    nodeName: node-b
    targetRef: {kind: Pod, name: shop-58d4b7-q7w3z, namespace: demo}
  ports: [{name: http, port: 8080, protocol: TCP}]
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  addressType: IPv4
  metadata: {name: ext-1, namespace: aaa, resourceVersion: "9206", labels: {kubernetes.io/service-name: ext}}
  endpoints:
  - addresses: [198.18.129.20]
    conditions: {ready: true, serving: true, terminating: false}
    nodeName: node-a
    targetRef: {kind: Pod, name: shop-58d4b7-k2m9x, namespace: demo}
  - addresses: [198.18.130.20]
    conditions: {ready: true, serving: true, terminating: false}
    nodeName: node-b
    targetRef: {kind: Pod, name: shop-58d4b7-q7w3z, namespace: demo}
  ports: [{name: http, port: 8080, protocol: TCP}]
`

// TestContestedAddresses: whoever claims web-nodeport's addresses, and
// whether the claims are there at start or arrive later and kproxy is then
// restarted, web-nodeport's traffic reaches web-nodeport's pods; the
// intruders keep what is theirs.
func TestContestedAddresses(t *testing.T) { forEachMode(t, testContestedAddresses) }

func testContestedAddresses(t *testing.T, m proxyMode) {
	shop := []string{shopA, shopB}
	probes := func() []probe {
		return []probe{
			{from: testerA, network: "tcp", dst: "198.19.0.11:80", servers: web, every: true, peer: peerOwn},
			{from: client, network: "tcp", dst: "198.19.0.11:80", servers: web, every: true, peer: peerMasq, masqBy: nodeA},
			{from: client, network: "tcp", dst: "198.18.0.10:30080", servers: web, every: true, peer: peerMasq, masqBy: nodeA},
			// The losers are skipped for the contested address only.
			{from: testerA, network: "tcp", dst: "198.19.0.40:80", servers: shop, every: true, peer: peerOwn},
			{from: testerA, network: "tcp", dst: "198.19.0.41:80", servers: shop, every: true, peer: peerOwn},
		}
	}
	intrudersProgrammed := func(c *kcluster) {
		shopAIP := c.Pod(t, shopA).IP(clientIP)
		c.waitRules(nodeA, "the intruders' own cluster IPs", func(d string) bool {
			return c.mode.routesTo(d, "aaa/np/tcp/http", shopAIP) && c.mode.routesTo(d, "aaa/ext/tcp/http", shopAIP)
		})
	}
	t.Run("fresh node", func(t *testing.T) {
		snap := exampleSnapshot(t)
		snap.addList(t, contestedIntruders)
		c := newCluster(t, clusterOptions{mode: m, snapshot: snap, kproxyOn: []string{nodeA}})
		intrudersProgrammed(c)
		runProbes(t, c, probes())
		if done, err := c.kproxy[nodeA].Exited(); done {
			t.Fatalf("kproxy exited: %v", err)
		}
	})
	t.Run("running node, then restarted", func(t *testing.T) {
		snap := exampleSnapshot(t)
		c := newCluster(t, clusterOptions{mode: m, snapshot: snap, kproxyOn: []string{nodeA}})
		snap.addList(t, contestedIntruders)
		c.apply(snap)
		intrudersProgrammed(c)
		t.Run("running", func(t *testing.T) { runProbes(t, c, probes()) })
		if err := c.kproxy[nodeA].Kill(); err != nil {
			t.Fatal(err)
		}
		c.restartKproxy(nodeA)
		intrudersProgrammed(c)
		t.Run("restarted", func(t *testing.T) { runProbes(t, c, probes()) })
	})
}
