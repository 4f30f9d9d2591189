package kernel

// Conntrack reconciliation across a kproxy restart. Addresses are the
// example's (cluster_test.go): dns-udp is 198.19.0.18:53 with the pods
// dns-…-a8s4d and dns-…-f6g1h; tester-a is a pod on node-a, client is
// outside the cluster.

import (
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/testutil/netns"
)

// TestConntrackReconciledAfterRestart: UDP clients with fixed source ports
// are pinned by conntrack to the dns-udp pod they first reached. kproxy is
// killed, that pod's endpoint is removed while nobody watches, and kproxy
// starts again. The new kproxy never saw the endpoint go, so only comparing
// the conntrack table with the endpoints (on its first, full sync) can free
// the clients; otherwise they keep talking to the removed pod, which still
// answers, until their entries time out.
func TestConntrackReconciledAfterRestart(t *testing.T) {
	forEachMode(t, testConntrackReconciledAfterRestart)
}

func testConntrackReconciledAfterRestart(t *testing.T, m proxyMode) {
	snap := exampleSnapshot(t)
	c := newCluster(t, clusterOptions{mode: m, snapshot: snap, kproxyOn: []string{nodeA}})
	svc := ap("198.19.0.18:53")

	type flow struct {
		from  string
		ask   func() netns.Reply
		first string
	}
	var flows []*flow
	for i, from := range []string{client, testerA} {
		conn, err := c.ns(from).DialUDP(svc, netns.DialOptions{SourcePort: 41053 + i})
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
		flows = append(flows, f)
	}
	gone := flows[0].first
	other := dnsA
	if gone == dnsA {
		other = dnsB
	}

	if err := c.kproxy[nodeA].Kill(); err != nil {
		t.Fatal(err)
	}
	snap.removeEndpoint(t, "dns-udp", gone)
	c.apply(snap)
	// While kproxy is down its rules and the entry stay: the client is
	// still answered by the pod whose endpoint is gone.
	if r := flows[0].ask(); r.Outcome != netns.Answered || r.Server != gone {
		t.Fatalf("udp %s from %s while kproxy is down: %v; want the answer of %s", svc, flows[0].from, r, gone)
	}

	c.restartKproxy(nodeA)
	goneIP := c.Pod(t, gone).IP(clientIP)
	c.waitRules(nodeA, "dns-udp without "+gone, func(d string) bool {
		return !c.mode.routesTo(d, "demo/dns-udp/udp/dns", goneIP) && c.mode.routesTo(d, "demo/dns-udp/udp/dns", c.Pod(t, other).IP(clientIP))
	})
	time.Sleep(conntrackGrace)
	for _, f := range flows {
		for j := 0; j < 5; j++ {
			r := f.ask()
			if r.Outcome != netns.Answered || r.Server != other {
				t.Errorf("after the restart: udp %s from %s port %d: %v; want the answer of %s (a stale conntrack entry still sends to %s)",
					svc, f.from, r.Local.Port(), r, other, gone)
				break
			}
		}
	}

	// The restarted kproxy counts what it deleted.
	code, body, err := c.Nodes[nodeA].HTTPGet("http://127.0.0.1:10249/metrics", 2*time.Second)
	if err != nil || code != 200 {
		t.Fatalf("metrics: %d %v", code, err)
	}
	if !metricPositive(body, `kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family="IPv4"}`) {
		t.Errorf("kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family=\"IPv4\"} is not positive after the restart; metrics:\n%s",
			grepLines(body, "conntrack_reconciler"))
	}
}

// grepLines returns the lines of body that contain substr.
func grepLines(body, substr string) string {
	var out []string
	for _, l := range strings.Split(body, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
