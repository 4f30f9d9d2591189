package kernel

// Session affinity that expires: a ClientIP Service with a short
// timeoutSeconds keeps each client on one endpoint while it keeps coming
// back within the timeout, and once the client's entry has expired its
// next connection picks an endpoint at random again, as a new client's
// would. Addresses: the example's plan (cluster_test.go), plus
//
//   198.19.0.42                       sticky: ClientIP, timeoutSeconds 2, port 80
//   198.18.129.110, 198.18.130.110,   its endpoints sticky-a (node-a), sticky-b
//   198.18.129.111                    (node-b), sticky-c (node-a), port 8080
//   198.18.129.201 … .216             more addresses of tester-a: one client
//                                     (one affinity entry) each

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/testutil/netns"
)

const (
	stickyA = "sticky-a"
	stickyB = "sticky-b"
	stickyC = "sticky-c"
)

// stickyTimeout is the Service's timeoutSeconds.
const stickyTimeout = 2 * time.Second

// stickyPastExpiry is how long after the timeout a round's client comes
// back, alternately.
var stickyPastExpiry = [2]time.Duration{500 * time.Millisecond, 3 * time.Second}

// stickyService is the Service and its slice, as a List.
const stickyService = `
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Service
  metadata:
    name: sticky
    namespace: demo
    resourceVersion: "9501"
    uid: 6b1f0c2e-9501-4a5b-9c8d-000000009501
    creationTimestamp: "2026-01-15T10:00:00Z"
  spec:
    clusterIP: 198.19.0.42
    clusterIPs: [198.19.0.42]
    ipFamilies: [IPv4]
    ipFamilyPolicy: SingleStack
    ports:
    - name: http
      port: 80
      protocol: TCP
      targetPort: 8080
    sessionAffinity: ClientIP
    sessionAffinityConfig:
      clientIP:
        timeoutSeconds: 2
    type: ClusterIP
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  addressType: IPv4
  metadata:
    name: sticky-x1
    namespace: demo
    resourceVersion: "9502"
    labels:
      kubernetes.io/service-name: sticky
  endpoints:
  - addresses: [198.18.129.110]
    conditions: {ready: true, serving: true, terminating: false}
    nodeName: node-a
    targetRef: {kind: Pod, name: sticky-a, namespace: demo}
  - addresses: [198.18.130.110]
    conditions: {ready: true, serving: true, terminating: false}
    nodeName: node-b
    targetRef: {kind: Pod, name: sticky-b, namespace: demo}
  - addresses: [198.18.129.111]
    conditions: {ready: true, serving: true, terminating: false}
    nodeName: node-a
    targetRef: {kind: Pod, name: sticky-c, namespace: demo}
  ports:
  - name: http
    port: 8080
    protocol: TCP
`

// Expiry sampling: stickyClients clients, each through stickyRounds
// expiries, give 128 connections made after the client's entry expired.
// With a random choice among 3 endpoints, the number that reach the
// endpoint the client had before is Binomial(128, 1/3) (mean 42.7); it
// falls outside [22, 63] with probability 8.6e-5 (4.3e-5 below, 4.3e-5
// above). A choice that keeps the previous endpoint half of the time fails
// the test with probability 0.53, three times in four with probability
// 1 - 1e-9.
const (
	stickyClients        = 16
	stickyRounds         = 8
	stickySameMin        = 22
	stickySameMax        = 63
	stickyExpiredSamples = stickyClients * stickyRounds
)

func TestAffinityExpiry(t *testing.T) { forEachMode(t, testAffinityExpiry) }

// testAffinityExpiry runs stickyRounds+1 rounds. In each, every client
// connects once, then once more half a timeout later (affinity: the same
// endpoint, and the entry is refreshed), then waits out the timeout and
// more (stickyPastExpiry). The first connection of every round after the
// first is made with the client's entry expired: it counts as "same" when
// it reaches the endpoint the client had in the round before.
func testAffinityExpiry(t *testing.T, m proxyMode) {
	snap := exampleSnapshot(t)
	snap.addList(t, stickyService)
	c := newCluster(t, clusterOptions{mode: m, snapshot: snap})
	tester := c.ns(testerA)
	clients := make([]netip.Addr, stickyClients)
	for i := range clients {
		clients[i] = netip.AddrFrom4([4]byte{198, 18, 129, byte(201 + i)})
		if err := tester.AddAddr("eth0", netip.PrefixFrom(clients[i], 24)); err != nil {
			t.Fatal(err)
		}
	}
	dst := ap("198.19.0.42:80")
	endpoints := []string{stickyA, stickyB, stickyC}
	ask := func(from netip.Addr, what string) string {
		t.Helper()
		r := tester.Request("tcp", dst, netns.DialOptions{Source: from})
		if r.Outcome != netns.Answered {
			t.Fatalf("client %s, %s: %v", from, what, r)
		}
		if !slices.Contains(endpoints, r.Server) || r.Peer.Addr() != from {
			t.Fatalf("client %s, %s: %v; want one of %v, seeing the client's own address", from, what, r, endpoints)
		}
		return r.Server
	}
	prev := make([]string, len(clients))
	firstAt := make([]time.Time, len(clients))
	picks := map[string]int{}
	// same counts the "same" connections by how long after the expiry
	// they came (stickyPastExpiry's index).
	var same [2]int
	for round := 0; round <= stickyRounds; round++ {
		start := time.Now()
		for i, from := range clients {
			firstAt[i] = time.Now()
			got := ask(from, fmt.Sprintf("round %d", round))
			picks[got]++
			if round > 0 && got == prev[i] {
				same[(round-1)%2]++
			}
			prev[i] = got
		}
		time.Sleep(stickyTimeout/2 - time.Since(start))
		for i, from := range clients {
			got := ask(from, fmt.Sprintf("round %d, within the timeout", round))
			if got == prev[i] {
				continue
			}
			if took := time.Since(firstAt[i]); took < stickyTimeout {
				t.Fatalf("client %s, round %d: %s %v after its first connection; want %s, as before (affinity for %v)",
					from, round, got, took, prev[i], stickyTimeout)
			} else {
				// The entry may have expired between the two
				// connections: the machine was too slow to tell.
				t.Logf("client %s, round %d: %s %v after its first connection, past the timeout; not checked", from, round, got, took)
			}
			prev[i] = got
		}
		if round < stickyRounds {
			// Every entry was last refreshed in the loop above. Half
			// the rounds come back soon after it expired, half when the
			// set's garbage collection (every second in nf_tables) has
			// surely removed it.
			time.Sleep(stickyTimeout + stickyPastExpiry[round%2])
		}
	}
	total := same[0] + same[1]
	t.Logf("%s: %d of %d connections after the affinity expired reached the endpoint before it (%.2f; random: 1/3): %d of %d at %v past the expiry, %d of %d at %v; first picks %v",
		m.name, total, stickyExpiredSamples, float64(total)/stickyExpiredSamples,
		same[0], stickyExpiredSamples/2, stickyPastExpiry[0], same[1], stickyExpiredSamples/2, stickyPastExpiry[1], picks)
	if total < stickySameMin || total > stickySameMax {
		t.Errorf("%d of %d connections after the affinity expired reached the client's previous endpoint; want %d..%d (a random choice among 3)",
			total, stickyExpiredSamples, stickySameMin, stickySameMax)
	}
	for _, e := range endpoints {
		if picks[e] == 0 {
			t.Errorf("%s was never picked (first picks %v)", e, picks)
		}
	}
}
