package main

// Kernel test (root): a namespace as a node left by kube-proxy in IPVS mode
// (rules in both iptables backends that match its ipsets, kube-ipvs0) is
// cleaned by cleanupOtherModes. The order matters: the sets can only go
// once the rules that match them are gone.
//   10.96.0.0/16  service cluster IPs on kube-ipvs0

import (
	"context"
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/internal/kernel/ipvs"
	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/testutil/netns"
)

const ipvsModeRules = `*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-SERVICES - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-SERVICES ! -s 10.244.0.0/16 -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ
-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT
COMMIT
`

type leftoverNode struct {
	ns *netns.NS
	h  *netlink.Handle
}

func newLeftoverNode(t *testing.T) *leftoverNode {
	t.Helper()
	netns.Require(t, "iptables-legacy-restore", "iptables-nft-restore", "iptables-legacy-save", "iptables-nft-save")
	n := &leftoverNode{ns: netns.New(t, "lo-"+netns.RandomID(3), "node")}
	nsh, err := vnetns.GetFromName(n.ns.Name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nsh.Close() })
	if n.h, err = netlink.NewHandleAt(nsh); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.h.Close)
	if err := netns.Veth(n.ns, ipvs.DummyDevice, n.ns, "kipvs-peer"); err != nil {
		t.Fatal(err)
	}
	if err := n.ns.AddAddr(ipvs.DummyDevice, netip.MustParsePrefix("10.96.0.1/32")); err != nil {
		t.Fatal(err)
	}
	if err := n.h.IpsetCreate("KUBE-CLUSTER-IP", "hash:ip,port", netlink.IpsetCreateOptions{Family: unix.AF_INET}); err != nil {
		t.Fatal(err)
	}
	return n
}

func (n *leftoverNode) run(t *testing.T, stdin string, argv ...string) string {
	t.Helper()
	cmd := exec.Command("ip", append([]string{"netns", "exec", n.ns.Name}, argv...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(argv, " "), err, out)
	}
	return string(out)
}

func (n *leftoverNode) opts() leftoverOptions {
	return leftoverOptions{
		xtables: []xtables.Option{xtables.WithCommandPrefix("ip", "netns", "exec", n.ns.Name)},
		ipvs:    []ipvs.Option{ipvs.WithNetNSPath("/run/netns/" + n.ns.Name)},
	}
}

func TestCleanupOtherModes(t *testing.T) {
	n := newLeftoverNode(t)
	n.run(t, ipvsModeRules, "iptables-legacy-restore")
	n.run(t, ipvsModeRules, "iptables-nft-restore")

	if err := cleanupOtherModesWith(context.Background(), n.opts()); err != nil {
		t.Fatal(err)
	}
	for _, save := range []string{"iptables-legacy-save", "iptables-nft-save"} {
		if out := n.run(t, "", save); strings.Contains(out, "KUBE-") {
			t.Errorf("%s still shows kube-proxy's rules:\n%s", save, out)
		}
	}
	if _, err := n.h.LinkByName(ipvs.DummyDevice); err == nil {
		t.Errorf("%s still exists", ipvs.DummyDevice)
	}
	if sets, err := n.h.IpsetListAll(); err != nil || len(sets) > 0 {
		t.Errorf("ipsets left: %v, %v", sets, err)
	}
}

// TestCleanupOtherModesWithoutIptables: without the iptables binaries the
// iptables checks are skipped (not an error) and the IPVS part still runs.
func TestCleanupOtherModesWithoutIptables(t *testing.T) {
	n := newLeftoverNode(t)
	o := n.opts()
	t.Setenv("PATH", t.TempDir())
	if err := cleanupOtherModesWith(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	if _, err := n.h.LinkByName(ipvs.DummyDevice); err == nil {
		t.Errorf("%s still exists", ipvs.DummyDevice)
	}
}
