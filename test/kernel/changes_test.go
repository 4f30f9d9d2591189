package kernel

// Changes while traffic flows: endpoints going away (UDP conntrack cleanup,
// established TCP connections left alone), services changed, added and
// deleted, kproxy killed and restarted, and snapshots with malformed
// objects.

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/testutil/netns"
)

// conntrackGrace is how long after the rules show a change the test waits
// before it expects the traffic to follow: kproxy clears stale UDP conntrack
// entries right after it applied the rules, in the same sync.
const conntrackGrace = 300 * time.Millisecond

// TestStaleUDPConntrack: a UDP client that keeps its source port keeps its
// conntrack entry, which pins it to the endpoint it first reached. When that
// endpoint is removed, kproxy must delete the entry, or the client keeps
// talking to the removed pod for as long as it keeps sending.
func TestStaleUDPConntrack(t *testing.T) { forEachMode(t, testStaleUDPConntrack) }

func testStaleUDPConntrack(t *testing.T, m proxyMode) {
	snap := exampleSnapshot(t)
	c := newCluster(t, clusterOptions{mode: m, snapshot: snap, kproxyOn: []string{nodeA}})
	svc := ap("198.19.0.18:53")

	type flow struct {
		from  string
		ask   func() netns.Reply
		first string
	}
	var flows []*flow
	for i, from := range []string{testerA, client} {
		conn, err := c.ns(from).DialUDP(svc, netns.DialOptions{SourcePort: 40053 + i})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		f := &flow{from: from, ask: func() netns.Reply {
			return netns.UDPAsk(conn, time.Now().Add(time.Second))
		}}
		r := f.ask()
		if r.Outcome != netns.Answered {
			t.Fatalf("udp %s from %s: %v", svc, from, r)
		}
		f.first = r.Server
		// The same source port stays with the same endpoint.
		for j := 0; j < 5; j++ {
			if r := f.ask(); r.Server != f.first {
				t.Fatalf("udp %s from %s port %d: %v, but the first answer came from %s", svc, from, r.Local.Port(), r, f.first)
			}
		}
		flows = append(flows, f)
	}

	// Remove the endpoint that answered the first flow; the second flow
	// may or may not have been on it.
	gone := flows[0].first
	other := dnsA
	if gone == dnsA {
		other = dnsB
	}
	snap.removeEndpoint(t, "dns-udp", gone)
	c.apply(snap)
	goneIP := c.Pod(t, gone).IP(clientIP)
	c.waitRules(nodeA, "dns-udp without "+gone, func(d string) bool {
		return !c.mode.routesTo(d, "demo/dns-udp/udp/dns", goneIP) && c.mode.routesTo(d, "demo/dns-udp/udp/dns", c.Pod(t, other).IP(clientIP))
	})
	time.Sleep(conntrackGrace)
	expect := func(phase string, want netns.Outcome, servers ...string) {
		t.Helper()
		for _, f := range flows {
			for j := 0; j < 5; j++ {
				r := f.ask()
				if r.Outcome != want || (want == netns.Answered && !slices.Contains(servers, r.Server)) {
					t.Errorf("%s: udp %s from %s port %d: %v; want %v by one of %v", phase, svc, f.from, r.Local.Port(), r, want, servers)
					break
				}
			}
		}
	}
	expect(gone+" removed (a stale conntrack entry would still send to it)", netns.Answered, other)

	// Scale to zero and back, a known regression case upstream: with no
	// endpoint the flows are rejected; when endpoints return, the same
	// source ports are answered again.
	snap.removeEndpoint(t, "dns-udp", other)
	c.apply(snap)
	c.waitRules(nodeA, "dns-udp without endpoints", func(d string) bool {
		return !c.mode.routesTo(d, "demo/dns-udp/udp/dns", c.Pod(t, other).IP(clientIP))
	})
	time.Sleep(conntrackGrace)
	expect("no endpoints", netns.Refused)

	restored := exampleSnapshot(t)
	c.apply(restored)
	c.waitRules(nodeA, "dns-udp with both endpoints again", func(d string) bool {
		return c.mode.routesTo(d, "demo/dns-udp/udp/dns", goneIP) && c.mode.routesTo(d, "demo/dns-udp/udp/dns", c.Pod(t, other).IP(clientIP))
	})
	time.Sleep(conntrackGrace)
	expect("endpoints back", netns.Answered, dnsA, dnsB)
}

// openSessionTo opens long-lived connections from the namespace to dst
// until one lands on the wanted pod (bounded), closing the others.
func openSessionTo(t *testing.T, from *netns.NS, dst netip.AddrPort, pod string) *netns.Session {
	t.Helper()
	for i := 0; i < 40; i++ {
		s, err := from.OpenSession(dst, netns.DialOptions{})
		if err != nil {
			t.Fatalf("session to %s from %s: %v", dst, from.Role, err)
		}
		if s.Greeting.Server == pod {
			t.Cleanup(func() { s.Close() })
			return s
		}
		s.Close()
	}
	t.Fatalf("40 connections to %s from %s never reached %s", dst, from.Role, pod)
	return nil
}

// checkSession checks that an established connection still carries data
// both ways, to the same pod.
func checkSession(t *testing.T, what string, s *netns.Session, pod string) {
	t.Helper()
	msg := fmt.Sprintf("still-there-%d", time.Now().UnixNano())
	got, err := s.Echo(msg, 2*time.Second)
	if err != nil || got != pod+" "+msg {
		t.Errorf("%s: echo %q = %q, %v; want %q", what, msg, got, err, pod+" "+msg)
	}
}

// TestEndpointChangeKeepsEstablished: web-clusterip and web-nodeport share
// the pods web-a and web-b. Removing web-b from web-nodeport moves new
// web-nodeport traffic to web-a only, but an established connection to
// web-clusterip that landed on web-b keeps working.
func TestEndpointChangeKeepsEstablished(t *testing.T) {
	forEachMode(t, testEndpointChangeKeepsEstablished)
}

func testEndpointChangeKeepsEstablished(t *testing.T, m proxyMode) {
	snap := exampleSnapshot(t)
	c := newCluster(t, clusterOptions{mode: m, snapshot: snap, kproxyOn: []string{nodeA}})
	fromPod := openSessionTo(t, c.Pod(t, testerA).NS, ap("198.19.0.10:80"), webB)
	fromOutside := openSessionTo(t, c.Client, ap("198.19.0.10:80"), webB)
	// An established connection to the service that changes, on the pod
	// that stays, is kept too.
	toChanged := openSessionTo(t, c.Client, ap("198.18.0.10:30080"), webA)

	snap.removeEndpoint(t, "web-nodeport", webB)
	c.apply(snap)
	webBIP := c.Pod(t, webB).IP(clientIP)
	c.waitRules(nodeA, "web-nodeport without web-b", func(d string) bool {
		return !c.mode.routesTo(d, "demo/web-nodeport/tcp/http", webBIP) && c.mode.routesTo(d, "demo/web-clusterip/tcp/http", webBIP)
	})

	checkSession(t, "pod's connection to web-clusterip on web-b", fromPod, webB)
	checkSession(t, "client's connection to web-clusterip on web-b", fromOutside, webB)
	checkSession(t, "client's connection to web-nodeport on web-a", toChanged, webA)
	runProbes(t, c, []probe{
		{from: testerA, network: "tcp", dst: "198.19.0.11:80", n: 10, servers: []string{webA}, peer: peerOwn},
		{from: client, network: "tcp", dst: "198.18.0.10:30080", n: 10, servers: []string{webA}, peer: peerMasq, masqBy: nodeA},
		{from: testerA, network: "tcp", dst: "198.19.0.10:80", servers: web, every: true, peer: peerOwn},
	})
}

// TestKproxyKilledAndRestarted: kproxy killed with SIGKILL leaves its rules;
// established connections and new ones keep working while it is down. A
// change made meanwhile is applied by the restarted kproxy, which takes
// over its old tables without breaking established connections.
func TestKproxyKilledAndRestarted(t *testing.T) { forEachMode(t, testKproxyKilledAndRestarted) }

func testKproxyKilledAndRestarted(t *testing.T, m proxyMode) {
	snap := exampleSnapshot(t)
	c := newCluster(t, clusterOptions{mode: m, snapshot: snap, kproxyOn: []string{nodeA}})
	fromPod := openSessionTo(t, c.Pod(t, testerA).NS, ap("198.19.0.10:80"), webB)
	fromOutside := openSessionTo(t, c.Client, ap("198.19.0.10:80"), webA)
	// New connections to the unchanged web-clusterip all along, and a
	// stream echoing every 50 ms: neither the crash nor the restart may
	// leave a moment without rules.
	prober := netns.StartProber(c.Client, "client to web-clusterip", ap("198.19.0.10:80"), web, masqueraded)
	defer prober.Stop()
	stream := netns.StartStream(t, c.Pod(t, testerA).NS, "pod to web-clusterip", ap("198.19.0.10:80"), web)
	defer stream.Stop()

	if err := c.kproxy[nodeA].Kill(); err != nil {
		t.Fatal(err)
	}
	checkSession(t, "pod's connection while kproxy is down", fromPod, webB)
	c.run(t, probe{from: client, network: "tcp", dst: "198.19.0.10:80", servers: web, every: true, peer: peerMasq, masqBy: nodeA})

	snap.removeEndpoint(t, "web-nodeport", webB)
	c.apply(snap)
	c.restartKproxy(nodeA)
	webBIP := c.Pod(t, webB).IP(clientIP)
	c.waitRules(nodeA, "web-nodeport without web-b", func(d string) bool {
		return !c.mode.routesTo(d, "demo/web-nodeport/tcp/http", webBIP)
	})

	checkSession(t, "pod's connection to web-clusterip after the restart", fromPod, webB)
	checkSession(t, "client's connection to web-clusterip after the restart", fromOutside, webA)
	n, failures := prober.Result()
	echoes, err := stream.Result()
	if n == 0 || len(failures) > 0 || err != nil {
		t.Errorf("during the kill and restart: %d of %d new connections failed %v; stream after %d echoes: %v", len(failures), n, failures, echoes, err)
	} else {
		t.Logf("during the kill and restart: %d new connections, none failed; a stream echoed %d times unbroken", n, echoes)
	}
	runProbes(t, c, []probe{
		{from: testerA, network: "tcp", dst: "198.19.0.10:80", servers: web, every: true, peer: peerOwn},
		{from: client, network: "tcp", dst: "198.18.0.10:30080", n: 10, servers: []string{webA}, peer: peerMasq, masqBy: nodeA},
		{from: testerA, network: "udp", dst: "198.19.0.18:53", servers: dns, every: true, peer: peerOwn},
		{from: testerA, network: "tcp", dst: "[fd00:19::17]:80", servers: dual, every: true, peer: peerOwn},
		{from: testerA, network: "tcp", dst: "198.19.0.20:80", outcome: netns.Refused, within: quick},
	})
	// One table per family, each defined once: the restart reused them.
	d, err := c.mode.dump(c.Nodes[nodeA].NS)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.definedOnce(d); err != nil {
		t.Errorf("after the restart: %v", err)
	}
}

// malformedObjects are objects the API server would refuse; a file source
// (or a buggy controller) can still deliver them. kproxy must skip them and
// serve the rest.
const malformedService = `
apiVersion: v1
kind: Service
metadata:
  name: broken-ip
  namespace: demo
  resourceVersion: "9001"
  uid: 6b1f0c2e-9001-4a5b-9c8d-000000009001
spec:
  clusterIP: not-an-ip
  clusterIPs: [not-an-ip]
  ipFamilies: [IPv4]
  ports:
  - name: http
    port: 80
    protocol: TCP
    targetPort: 8080
  type: ClusterIP
`

const malformedPort = `
apiVersion: v1
kind: Service
metadata:
  name: broken-port
  namespace: demo
  resourceVersion: "9002"
  uid: 6b1f0c2e-9002-4a5b-9c8d-000000009002
spec:
  clusterIP: 198.19.0.99
  clusterIPs: [198.19.0.99]
  ipFamilies: [IPv4]
  ports:
  - name: http
    port: eighty
    protocol: TCP
  type: ClusterIP
`

// TestMalformedService: a snapshot with malformed Services still programs
// every other service, at start and when the bad objects arrive later along
// with a good change.
func TestMalformedService(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// atStart: the bad objects are in the first snapshot; else they
		// come with a later change.
		atStart bool
	}{
		{"at start", true},
		{"in a change", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			snap := exampleSnapshot(t)
			if tc.atStart {
				snap.add(t, malformedService)
				snap.add(t, malformedPort)
			}
			c := newCluster(t, clusterOptions{snapshot: snap, kproxyOn: []string{nodeA}})
			if !tc.atStart {
				snap.add(t, malformedService)
				snap.add(t, malformedPort)
			}
			// A good change in the same file must be applied.
			snap.removeEndpoint(t, "web-nodeport", webB)
			c.apply(snap)
			webBIP := c.Pod(t, webB).IP(clientIP)
			c.waitRules(nodeA, "web-nodeport without web-b", func(d string) bool {
				return !c.mode.routesTo(d, "demo/web-nodeport/tcp/http", webBIP)
			})
			runProbes(t, c, []probe{
				{from: testerA, network: "tcp", dst: "198.19.0.10:80", servers: web, every: true, peer: peerOwn},
				{from: testerA, network: "tcp", dst: "198.19.0.11:80", n: 5, servers: []string{webA}, peer: peerOwn},
				{from: testerA, network: "udp", dst: "198.19.0.18:53", servers: dns, every: true, peer: peerOwn},
				{from: client, network: "tcp", dst: "[fd00:19::17]:80", servers: dual, every: true, peer: peerMasq, masqBy: nodeA},
				// The malformed services program nothing.
				{from: testerA, network: "tcp", dst: "198.19.0.99:80", outcome: netns.Timeout},
			})
			if done, err := c.kproxy[nodeA].Exited(); done {
				t.Fatalf("kproxy exited: %v", err)
			}
		})
	}
}

// newWebService is a Service added while kproxy runs, with its slice.
const newWebService = `
apiVersion: v1
kind: Service
metadata:
  name: web-new
  namespace: demo
  resourceVersion: "9101"
  uid: 6b1f0c2e-9101-4a5b-9c8d-000000009101
spec:
  clusterIP: 198.19.0.30
  clusterIPs: [198.19.0.30]
  ipFamilies: [IPv4]
  ipFamilyPolicy: SingleStack
  ports:
  - name: http
    port: 80
    protocol: TCP
    targetPort: 8080
  - name: dns
    port: 53
    protocol: UDP
    targetPort: 53
  selector:
    app: web
  type: ClusterIP
`

// newWebSlices serve web-new: the ports of a slice apply to all its
// endpoints, so one slice per port (web-b answers TCP 8080, dns-a UDP 53).
const newWebSlices = `
apiVersion: v1
kind: List
items:
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  addressType: IPv4
  metadata:
    name: web-new-http
    namespace: demo
    resourceVersion: "9102"
    labels:
      kubernetes.io/service-name: web-new
  endpoints:
  - addresses: [198.18.130.10]
    conditions: {ready: true, serving: true, terminating: false}
    nodeName: node-b
    targetRef: {kind: Pod, name: web-6f7c9d-d3e4f, namespace: demo}
  ports:
  - name: http
    port: 8080
    protocol: TCP
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  addressType: IPv4
  metadata:
    name: web-new-dns
    namespace: demo
    resourceVersion: "9103"
    labels:
      kubernetes.io/service-name: web-new
  endpoints:
  - addresses: [198.18.129.53]
    conditions: {ready: true, serving: true, terminating: false}
    nodeName: node-a
    targetRef: {kind: Pod, name: dns-5b8c7d-a8s4d, namespace: demo}
  ports:
  - name: dns
    port: 53
    protocol: UDP
`

// TestServiceChanges changes services while kproxy runs (partial syncs):
// a port renumbered, a NodePort moved, a service deleted, one added.
func TestServiceChanges(t *testing.T) { forEachMode(t, testServiceChanges) }

func testServiceChanges(t *testing.T, m proxyMode) {
	snap := exampleSnapshot(t)
	c := newCluster(t, clusterOptions{mode: m, snapshot: snap, kproxyOn: []string{nodeA}})

	snap.editService(t, "web-clusterip", func(s *v1.Service) { s.Spec.Ports[0].Port = 8081 })
	snap.editService(t, "web-nodeport", func(s *v1.Service) { s.Spec.Ports[0].NodePort = 30085 })
	var kept []map[string]any
	for _, o := range snap.Items {
		if _, name := kindName(o); name != "topology" && !strings.HasPrefix(name, "topology-") {
			kept = append(kept, o)
		}
	}
	snap.Items = kept
	snap.add(t, newWebService)
	snap.addList(t, newWebSlices)
	c.apply(snap)
	c.waitRules(nodeA, "the changed services", func(d string) bool {
		return m.captures(d, "198.19.0.10", "tcp", 8081) && m.captures(d, "", "tcp", 30085) &&
			m.captures(d, "198.19.0.30", "udp", 53) && !strings.Contains(d, "198.19.0.22")
	})
	runProbes(t, c, []probe{
		{from: testerA, network: "tcp", dst: "198.19.0.10:8081", servers: web, every: true, peer: peerOwn},
		// The old port is now an undefined port of the ClusterIP
		// (iptables mode lets it route out, where it dies).
		{from: testerA, network: "tcp", dst: "198.19.0.10:80", outcome: netns.Refused, within: quick,
			ipt: &probe{outcome: netns.Timeout}},
		{from: client, network: "tcp", dst: "198.18.0.10:30085", servers: web, every: true, peer: peerMasq, masqBy: nodeA},
		// Nothing listens on the old NodePort: the node itself resets.
		{from: client, network: "tcp", dst: "198.18.0.10:30080", outcome: netns.Refused, within: quick},
		// The deleted service's IP is not captured any more: it leaves by
		// the default route and dies.
		{from: testerA, network: "tcp", dst: "198.19.0.22:80", outcome: netns.Timeout},
		{from: testerA, network: "tcp", dst: "198.19.0.30:80", n: 5, servers: []string{webB}, peer: peerOwn},
		{from: client, network: "udp", dst: "198.19.0.30:53", n: 5, servers: []string{dnsA}, peer: peerMasq, masqBy: nodeA},
		// Unchanged services are untouched.
		{from: testerA, network: "udp", dst: "198.19.0.18:53", servers: dns, every: true, peer: peerOwn},
	})
}
