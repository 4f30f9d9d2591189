package kernel

// Mode switches and restarts under traffic. kproxy runs on node-a in one
// mode; it is stopped (SIGTERM: its rules stay, as kube-proxy's do) and
// started again in another mode (or the same one: a restart). Meanwhile
// long-lived TCP streams echo a line every 50 ms, and probers open a new
// TCP connection every 20 ms; no connection may fail, no stream may
// break, and at the end only the new mode's rules may remain.
//
// Addresses are the example's (cluster_test.go); the services used:
//
//   198.19.0.10:80     web-clusterip, pods web-a (node-a) and web-b (node-b)
//   198.18.0.10:30080  web-nodeport on node-a, the same pods
//   [fd00:19::17]:80   dual-stack's IPv6 ClusterIP, pods dual-a and dual-b

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/testutil/netns"
	"github.com/kproxy/kproxy/internal/testutil/proxyrules"
)

// afterSwitch keeps the traffic going after the old rules are gone.
const afterSwitch = time.Second

// TestModeSwitch: restarting kproxy in another mode (or the same) breaks
// nothing. The new mode's rules are in place (first sync of both
// families) before the old mode's are removed.
func TestModeSwitch(t *testing.T) {
	t.Parallel()
	nft := nftablesMode
	legacy, nftBackend := iptablesMode(xtables.Legacy), iptablesMode(xtables.NFT)
	for _, tc := range []struct{ from, to proxyMode }{
		{legacy, nft},
		{nftBackend, nft},
		{nft, legacy},
		{nft, nftBackend},
		{legacy, nftBackend},
		{nftBackend, legacy},
		// Restarts with unchanged state.
		{nft, nft},
		{legacy, legacy},
		{nftBackend, nftBackend},
	} {
		t.Run(tc.from.name+"-to-"+tc.to.name, func(t *testing.T) {
			t.Parallel()
			for _, m := range []proxyMode{tc.from, tc.to} {
				for _, bin := range m.needs {
					netns.Require(t, bin)
				}
			}
			testModeSwitch(t, tc.from, tc.to)
		})
	}
}

func testModeSwitch(t *testing.T, from, to proxyMode) {
	c := newCluster(t, clusterOptions{mode: from, kproxyOn: []string{nodeA}})
	node := c.Nodes[nodeA].NS
	if err := otherModesLeft(node, from); err != nil {
		t.Fatalf("before the switch: %v", err)
	}
	tester := c.Pod(t, testerA)
	streams := []*netns.Stream{
		netns.StartStream(t, c.Client, "client to web-clusterip", ap("198.19.0.10:80"), web),
		netns.StartStream(t, tester.NS, "pod to web-clusterip", ap("198.19.0.10:80"), web),
		netns.StartStream(t, c.Client, "client to web-nodeport", ap("198.18.0.10:30080"), web),
		netns.StartStream(t, tester.NS, "pod to dual-stack over IPv6", ap("[fd00:19::17]:80"), dual),
	}
	probers := []*netns.Prober{
		netns.StartProber(c.Client, "client to web-clusterip", ap("198.19.0.10:80"), web, masqueraded),
		netns.StartProber(tester.NS, "pod to web-clusterip", ap("198.19.0.10:80"), web, notMasqueraded),
		netns.StartProber(tester.NS, "pod to dual-stack over IPv6", ap("[fd00:19::17]:80"), dual, notMasqueraded),
	}
	stopAll := func() {
		for _, p := range probers {
			p.Stop()
		}
		for _, s := range streams {
			s.Stop()
		}
	}
	defer stopAll()
	// Some traffic through the old rules first.
	time.Sleep(200 * time.Millisecond)

	if err := c.kproxy[nodeA].Stop(); err != nil {
		t.Fatal(err)
	}
	c.mode = to
	start := time.Now()
	c.restartKproxy(nodeA)
	synced := time.Since(start)

	// The old mode's rules go after the first sync; wait for that (and
	// for nothing in the restart cases).
	err := netns.Poll(syncTimeout, func() (bool, string) {
		if err := otherModesLeft(node, to); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
	if err != nil {
		t.Errorf("the old mode's rules were not removed: %v", err)
	}
	gone := time.Since(start)
	time.Sleep(afterSwitch)
	stopAll()

	// The new mode's rules, once, and routing to both web pods.
	d, err := to.dump(node)
	if err != nil {
		t.Fatal(err)
	}
	if err := to.definedOnce(d); err != nil {
		t.Errorf("after the switch: %v", err)
	}
	for _, pod := range web {
		if !to.routesTo(d, "demo/web-clusterip/tcp/http", c.Pod(t, pod).IP(clientIP)) {
			t.Errorf("after the switch the %s rules do not route web-clusterip to %s", to.name, pod)
		}
	}
	// The log says the removal came after the first sync of both families.
	log := c.kproxy[nodeA].Log()
	run := log[strings.LastIndex(log, "==== "):]
	removed := strings.Index(run, oldModesRemovedLine)
	for _, fam := range []string{"IPv4", "IPv6"} {
		if i := strings.Index(run, `"Synced" ipFamily="`+fam+`"`); i < 0 || removed < 0 || i > removed {
			t.Errorf("kproxy's log does not show the first %s sync (at %d) before the removal of the old rules (at %d)", fam, i, removed)
		}
	}

	tr := netns.Report(t, probers, streams, nil)
	t.Logf("switch %s -> %s: connections attempted %d, failed %d; streams held %d of %d (%d echoes), broken %d; first sync %v and old rules gone %v after the start",
		from.name, to.name, tr.Attempted, tr.Failed, len(streams)-tr.Broken, len(streams), tr.Echoes, tr.Broken,
		synced.Round(time.Millisecond), gone.Round(time.Millisecond))
}

// otherModesLeft reports the kube-proxy rules on the node that do not
// belong to mode m (see package proxyrules).
func otherModesLeft(n *netns.NS, m proxyMode) error {
	keep := proxyrules.Keep{NFTables: !m.iptables}
	for _, b := range []xtables.Backend{xtables.Legacy, xtables.NFT} {
		if m.iptables && slices.Contains(m.env, xtables.EnvMode+"="+string(b)) {
			keep.Backend = string(b)
		}
	}
	if err := proxyrules.CheckOnly(n, keep); err != nil {
		return fmt.Errorf("beside %s: %w", m.name, err)
	}
	return nil
}

// masqueraded: the client is outside the cluster CIDR, so the pod must
// see another source than the client's own.
func masqueraded(r netns.Reply) string {
	if r.Peer.Addr() == r.Local.Addr() {
		return "not masqueraded"
	}
	return ""
}

// notMasqueraded: a pod's traffic keeps its source.
func notMasqueraded(r netns.Reply) string {
	if r.Peer.Addr() != r.Local.Addr() {
		return fmt.Sprintf("masqueraded; want the pod to see %s", r.Local.Addr())
	}
	return ""
}
