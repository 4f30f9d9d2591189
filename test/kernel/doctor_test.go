package kernel

import (
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/testutil/netns"
)

// TestDoctor: kproxy doctor on a node where kproxy runs in nftables mode
// while an old kube-proxy's rules sit in the legacy backend, and then in
// the nft backend too: it names what it finds, warns about two modes at
// once, and fails on kube-proxy rules in both iptables backends.
func TestDoctor(t *testing.T) {
	t.Parallel()
	for _, bin := range []string{"iptables-legacy-restore", "iptables-nft-restore", "iptables-legacy-save", "iptables-nft-save"} {
		netns.Require(t, bin)
	}
	c := newCluster(t, clusterOptions{kproxyOn: []string{}})
	node := c.Nodes[nodeA]
	doctor := func() (string, error) {
		return node.Exec(60*time.Second, kproxyBin, "doctor", "--metrics-url", "http://127.0.0.1:10249")
	}
	out, err := doctor()
	if err != nil || strings.Contains(out, "WARN") {
		t.Fatalf("doctor on a clean node: %v\n%s", err, out)
	}

	// kproxy in nftables mode, then an old kube-proxy's legacy rules.
	c.startKproxy(nodeA)
	c.waitSynced(nodeA)
	c.waitOldModesRemoved(nodeA)
	restore := func(bin string) {
		t.Helper()
		if out, err := node.Exec(10*time.Second, "sh", "-c", `printf '%s' "$0" | `+bin+` --noflush`, staleLegacyRules); err != nil {
			t.Fatalf("%s: %v\n%s", bin, err, out)
		}
	}
	restore("iptables-legacy-restore")
	out, err = doctor()
	if err != nil {
		t.Fatalf("doctor with rules of two modes: %v (want warnings only)\n%s", err, out)
	}
	for _, want := range []string{
		"nftables mode tables: ip kube-proxy, ip kube-proxy-s0",
		"a proxy answers on /proxyMode: nftables",
		"WARN  rules of several proxy modes at once (iptables, nftables)",
		"WARN  the running proxy is in nftables mode but kube-proxy iptables rules exist",
		"IPv4 nat/KUBE-SERVICES",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("doctor output lacks %q:\n%s", want, out)
		}
	}

	// The same rules in the nft backend too: an error, exit status 1.
	restore("iptables-nft-restore")
	out, err = doctor()
	if err == nil || !strings.Contains(out, "ERROR kube-proxy rules in BOTH iptables backends") {
		t.Errorf("doctor with kube-proxy rules in both backends: err %v, want exit 1 and an ERROR line:\n%s", err, out)
	}
	if strings.Contains(out, "kube-proxy does not write") {
		t.Errorf("doctor flags an old kube-proxy's own rules as foreign:\n%s", out)
	}

	// A rule slipped into kube-proxy's KUBE-SERVICES that redirects a
	// service: an error naming it.
	if out, err := node.Exec(10*time.Second, "iptables-legacy", "-t", "nat", "-I", "KUBE-SERVICES", "1",
		"-d", "198.19.0.10/32", "-p", "tcp", "--dport", "80", "-j", "DNAT", "--to-destination", "198.18.1.99:8080"); err != nil {
		t.Fatalf("inserting a foreign rule: %v\n%s", err, out)
	}
	out, err = doctor()
	if err == nil || !strings.Contains(out, "ERROR 1 rules in kube-proxy's chains of the legacy backend that kube-proxy does not write") ||
		!strings.Contains(out, "198.18.1.99:8080") {
		t.Errorf("doctor with a foreign rule in KUBE-SERVICES: err %v, want exit 1 and an ERROR line naming it:\n%s", err, out)
	}
}

// TestDoctorForeignUsers: doctor lists other netfilter users of a node
// (an nftables table of its own with a forward chain of policy drop, a
// DOCKER-USER chain hooked into FORWARD of the legacy backend, FORWARD
// policy DROP in the nft backend) and warns about those that drop service
// traffic, and about IPTABLES_MODE in nftables mode. Nothing else runs in
// the namespace, so its verdict cannot come from anywhere else.
func TestDoctorForeignUsers(t *testing.T) {
	t.Parallel()
	requireKernel(t)
	netns.Require(t, "nft", "iptables-legacy", "iptables-nft")
	n := netns.New(t, netns.RandomID(8), "doctor")
	for _, argv := range [][]string{
		{"nft", "add", "table", "inet", "fw"},
		{"nft", "add", "chain", "inet", "fw", "fw_forward", "{ type filter hook forward priority 0 ; policy drop ; }"},
		{"iptables-legacy", "-N", "DOCKER-USER"},
		{"iptables-legacy", "-A", "FORWARD", "-j", "DOCKER-USER"},
		{"iptables-nft", "-P", "FORWARD", "DROP"},
	} {
		if out, err := n.Exec(10*time.Second, argv...); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, out)
		}
	}
	out, _ := n.Exec(60*time.Second, "env", "IPTABLES_MODE=nft", kproxyBin, "doctor", "--proxy-mode", "nftables", "--metrics-url", "")
	for _, want := range []string{
		"nftables inet fw/fw_forward: type filter hook forward priority 0 policy drop",
		"iptables-legacy IPv4 filter/FORWARD policy ACCEPT -> DOCKER-USER",
		"iptables-nft IPv4 filter/FORWARD policy DROP",
		"WARN  IPTABLES_MODE=nft is set but the proxy mode is nftables: it has no effect there",
		"WARN  nftables chain inet fw/fw_forward",
		"WARN  iptables nft IPv4 filter/FORWARD policy DROP: policy DROP, and kproxy's rules are not in that backend",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("doctor output lacks %q:\n%s", want, out)
		}
	}
	// The legacy FORWARD accepts by default: listed, not flagged.
	if strings.Contains(out, "WARN  iptables legacy") {
		t.Errorf("doctor flags the legacy FORWARD chain, whose policy is ACCEPT:\n%s", out)
	}
}
