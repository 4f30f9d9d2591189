package kernel

import (
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/testutil/netns"
)

// staleLegacyRules is what an old kube-proxy on the legacy backend left:
// its chains, hooked into PREROUTING and OUTPUT. (Every KUBE-SERVICES rule
// upstream writes has a comment; doctor reports one without as foreign.)
const staleLegacyRules = `*nat
:KUBE-SERVICES - [0:0]
:KUBE-SVC-STALESTALESTALEZ - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-SERVICES -d 198.19.0.99/32 -p tcp -m comment --comment "demo/stale:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-STALESTALESTALEZ
COMMIT
`

// TestOtherBackendRules: kproxy uses the nft backend (IPTABLES_MODE=nft)
// on a node whose legacy backend still holds an old kube-proxy's rules (a
// switch of backends). kproxy removes them once its own rules are in place
// (after its first sync). Rules that appear there later were written by
// something else while kproxy runs: kproxy must not touch them (no fight
// with another kube-proxy), must say so loudly (log and metric) at its
// drift checks (at least every sync period), keep serving, and `kproxy
// --cleanup` must remove them.
func TestOtherBackendRules(t *testing.T) {
	t.Parallel()
	m := iptablesMode(xtables.NFT)
	for _, bin := range append(m.needs, "iptables-legacy-restore", "iptables-legacy-save") {
		netns.Require(t, bin)
	}
	// Drift checks (which look at the other backend too) at least every
	// 2 s; full syncs are hourly.
	c := newCluster(t, clusterOptions{mode: m, kproxyOn: []string{}, args: []string{"--iptables-sync-period", "2s"}})
	node := c.Nodes[nodeA]
	writeStale := func() {
		t.Helper()
		if out, err := node.Exec(10*time.Second, "sh", "-c", `printf '%s' "$0" | iptables-legacy-restore --noflush`, staleLegacyRules); err != nil {
			t.Fatalf("writing stale legacy rules: %v\n%s", err, out)
		}
	}
	legacyNAT := func() string {
		t.Helper()
		out, err := node.Exec(10*time.Second, "iptables-legacy-save", "-t", "nat")
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	otherChains := func() string {
		t.Helper()
		_, body, err := node.HTTPGet("http://127.0.0.1:10249/metrics", 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(body, "\n") {
			if v, ok := strings.CutPrefix(l, `kproxy_iptables_other_backend_chains{backend="legacy"} `); ok {
				return v
			}
		}
		return "(missing)"
	}
	writeStale()
	c.startKproxy(nodeA)
	c.waitSynced(nodeA)

	if log := c.kproxy[nodeA].Log(); !strings.Contains(log, "Using iptables Proxier in nft mode (IPTABLES_MODE=nft)") {
		t.Errorf("kproxy's log does not name the backend and why:\n%s", log)
	}
	// The switch: the old kube-proxy's legacy rules go after the first
	// sync, without a warning about them.
	netns.Eventually(t, syncTimeout, "the legacy rules removed after the first sync", func() (bool, string) {
		return !strings.Contains(legacyNAT(), "KUBE-"), "legacy nat still has KUBE- chains"
	})
	netns.Eventually(t, syncTimeout, "kproxy_iptables_other_backend_chains 0", func() (bool, string) {
		v := otherChains()
		return v == "0", "metric " + v
	})
	if log := c.kproxy[nodeA].Log(); strings.Contains(log, "kube-proxy rules found in the iptables backend kproxy does not use") {
		t.Errorf("kproxy warned about the rules it was about to remove:\n%s", log)
	}

	// Written again while kproxy runs: reported, left alone.
	writeStale()
	netns.Eventually(t, syncTimeout, "the warning about the legacy backend", func() (bool, string) {
		log := c.kproxy[nodeA].Log()
		return strings.Contains(log, "kube-proxy rules found in the iptables backend kproxy does not use") &&
			strings.Contains(log, "legacy IPv4 nat/KUBE-SERVICES"), "no warning naming legacy IPv4 nat/KUBE-SERVICES yet"
	})
	if v := otherChains(); v == "0" || v == "(missing)" {
		t.Errorf("kproxy_iptables_other_backend_chains{backend=\"legacy\"} = %s, want above 0", v)
	}
	if code, proxyMode, err := node.HTTPGet("http://127.0.0.1:10249/proxyMode?verbose", 2*time.Second); err != nil || code != 200 || proxyMode != "iptables (backend: nft)" {
		t.Errorf("/proxyMode?verbose = %d %q %v, want iptables (backend: nft)", code, proxyMode, err)
	}
	// kproxy left the new legacy rules alone (several checks later)
	// and serves through nft.
	time.Sleep(5 * time.Second)
	if legacy := legacyNAT(); !strings.Contains(legacy, "KUBE-SVC-STALESTALESTALEZ") {
		t.Errorf("kproxy changed the legacy backend while running:\n%s", legacy)
	}
	runProbes(t, c, []probe{
		{from: testerA, network: "tcp", dst: "198.19.0.10:80", servers: web, every: true, peer: peerOwn},
	})

	// --cleanup removes kube-proxy's rules from both backends.
	if err := c.kproxy[nodeA].Stop(); err != nil {
		t.Fatal(err)
	}
	argv := append([]string{"env"}, m.env...)
	argv = append(argv, kproxyBin, "--cleanup", "-v", "2")
	if out, err := node.Exec(30*time.Second, argv...); err != nil {
		t.Fatalf("kproxy --cleanup: %v\n%s", err, out)
	}
	for _, bin := range []string{"iptables-legacy-save", "iptables-nft-save", "ip6tables-nft-save"} {
		out, err := node.Exec(10*time.Second, bin)
		if err != nil {
			t.Fatalf("%s: %v", bin, err)
		}
		if strings.Contains(out, "KUBE-SERVICES") || strings.Contains(out, "KUBE-SVC-") || strings.Contains(out, "KUBE-SEP-") {
			t.Errorf("%s after kproxy --cleanup still has kube-proxy chains:\n%s", bin, out)
		}
	}
}
