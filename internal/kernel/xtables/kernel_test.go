package xtables

// Kernel tests: as root, each case loads a ruleset as kube-proxy leaves it
// (testdata/*.save, with the kubelet's chains and a user's rules) into a
// fresh network namespace with one backend's restore binary, runs
// CleanupLeftovers there through `ip netns exec`, and compares what the
// save binary prints afterwards with what must survive. Address ranges: see
// leftovers_test.go.

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"

	"github.com/kproxy/kproxy/internal/testutil/netns"
)

// survivorsV4 is what must remain of iptables-v4.save: the kubelet's
// chains and rules and the user's, in their order.
const survivorsV4 = `*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-FIREWALL - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
:USER-INPUT - [0:0]
-A INPUT -j KUBE-FIREWALL
-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT
-A INPUT -j USER-INPUT
-A OUTPUT -j KUBE-FIREWALL
-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block incoming localnet connections" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
-A USER-INPUT -s 203.0.113.0/24 -j DROP
COMMIT
*mangle
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-IPTABLES-HINT - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-KUBELET-CANARY - [0:0]
-A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE
COMMIT
`

const survivorsV6 = `*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-KUBELET-CANARY - [0:0]
-A INPUT -p ipv6-icmp -j ACCEPT
COMMIT
*mangle
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-IPTABLES-HINT - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-KUBELET-CANARY - [0:0]
-A POSTROUTING -s fd00:17::/64 -j MASQUERADE
COMMIT
`

const survivorsIPVS = `*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-FIREWALL - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
-A INPUT -j KUBE-FIREWALL
-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT
-A OUTPUT -j KUBE-FIREWALL
-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block incoming localnet connections" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-KUBELET-CANARY - [0:0]
-A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE
COMMIT
`

var counters = regexp.MustCompile(`\[\d+:\d+\]`)

// normalize drops comments, zeroes counters and orders tables by name
// (legacy and nft print them in different orders), keeping the order of
// lines inside each table.
func normalize(save string) string {
	var tables []string
	var cur []string
	for _, l := range strings.Split(save, "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		cur = append(cur, counters.ReplaceAllString(l, "[0:0]"))
		if l == "COMMIT" {
			tables = append(tables, strings.Join(cur, "\n")+"\n")
			cur = nil
		}
	}
	slices.Sort(tables)
	return strings.Join(tables, "")
}

type kernelCase struct {
	ns      *netns.NS
	backend Backend
	family  Family
	save    string
	restore string
}

func requireBinaries(t *testing.T, b Backend, f Family) (save, restore string) {
	t.Helper()
	save, restore, err := binaries(b, f)
	if err != nil {
		t.Fatal(err)
	}
	netns.Require(t, save, restore)
	return save, restore
}

func newKernelCase(t *testing.T, b Backend, f Family) *kernelCase {
	t.Helper()
	save, restore := requireBinaries(t, b, f)
	return &kernelCase{
		ns:      netns.New(t, "xt-"+netns.RandomID(3), string(b)),
		backend: b, family: f, save: save, restore: restore,
	}
}

func (k *kernelCase) run(t *testing.T, stdin string, argv ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", k.ns.Name}, argv...)...)
	cmd.Stdin = strings.NewReader(stdin)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(argv, " "), err, stderr.String())
	}
	return string(out)
}

func (k *kernelCase) load(t *testing.T, rules string) {
	t.Helper()
	k.run(t, rules, k.restore)
}

func (k *kernelCase) dump(t *testing.T) string {
	t.Helper()
	return k.run(t, "", k.save)
}

func (k *kernelCase) opts() []Option {
	return []Option{WithCommandPrefix("ip", "netns", "exec", k.ns.Name)}
}

// createIPVSSets creates the sets the IPVS fixture's rules match, as
// kube-proxy's IPVS mode does, so that the rules can be loaded.
func createIPVSSets(t *testing.T, nsName string) {
	t.Helper()
	h, err := vnetns.GetFromName(nsName)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	nl, err := netlink.NewHandleAt(h)
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Close()
	sets := []struct{ name, typ string }{
		{"KUBE-CLUSTER-IP", "hash:ip,port"},
		{"KUBE-LOAD-BALANCER", "hash:ip,port"},
		{"KUBE-EXTERNAL-IP", "hash:ip,port"},
		{"KUBE-EXTERNAL-IP-LOCAL", "hash:ip,port"},
		{"KUBE-LOOP-BACK", "hash:ip,port,ip"},
		{"KUBE-IPVS-IPS", "hash:ip"},
		{"KUBE-NODE-PORT-TCP", "bitmap:port"},
		{"KUBE-HEALTH-CHECK-NODE-PORT", "bitmap:port"},
	}
	for _, s := range sets {
		o := netlink.IpsetCreateOptions{Family: 2 /* AF_INET */}
		if s.typ == "bitmap:port" {
			o = netlink.IpsetCreateOptions{PortFrom: 0, PortTo: 65535}
		}
		if err := nl.IpsetCreate(s.name, s.typ, o); err != nil {
			t.Fatalf("creating ipset %s (%s): %v", s.name, s.typ, err)
		}
	}
}

func TestKernelCleanupLeftovers(t *testing.T) {
	tests := []struct {
		fixture   string
		family    Family
		ipvs      bool
		survivors string
		removed   int
	}{
		{fixture: "iptables-v4.save", family: IPv4, survivors: survivorsV4, removed: 20},
		{fixture: "iptables-v6.save", family: IPv6, survivors: survivorsV6, removed: 14},
		{fixture: "ipvs-v4.save", family: IPv4, ipvs: true, survivors: survivorsIPVS, removed: 11},
	}
	for _, b := range Backends {
		for _, tc := range tests {
			t.Run(fmt.Sprintf("%s/%s", b, tc.fixture), func(t *testing.T) {
				k := newKernelCase(t, b, tc.family)
				ctx := context.Background()
				if tc.ipvs {
					createIPVSSets(t, k.ns.Name)
				}
				fixture := readFixture(t, tc.fixture)
				k.load(t, fixture)
				// The fixture is in canonical save syntax: what the kernel
				// holds is exactly the fixture.
				if d := cmp.Diff(normalize(fixture), normalize(k.dump(t))); d != "" {
					t.Fatalf("loaded rules differ from the fixture (-fixture +kernel):\n%s", d)
				}

				found, err := FindLeftovers(ctx, b, tc.family, k.opts()...)
				if err != nil {
					t.Fatal(err)
				}
				_, want, err := cleanupScript(fixture)
				if err != nil {
					t.Fatal(err)
				}
				slices.SortFunc(found, compareChains)
				slices.SortFunc(want, compareChains)
				if d := cmp.Diff(want, found); d != "" {
					t.Errorf("FindLeftovers (-want +got):\n%s", d)
				}

				removed, err := CleanupLeftovers(ctx, b, tc.family, k.opts()...)
				if err != nil {
					t.Fatal(err)
				}
				if removed != tc.removed {
					t.Errorf("removed %d chains, want %d", removed, tc.removed)
				}
				if d := cmp.Diff(normalize(tc.survivors), normalize(k.dump(t))); d != "" {
					t.Errorf("after cleanup (-want +got):\n%s", d)
				}

				// A second run finds and does nothing.
				if found, err := FindLeftovers(ctx, b, tc.family, k.opts()...); err != nil || len(found) > 0 {
					t.Errorf("second FindLeftovers = %v, %v; want nothing", found, err)
				}
				if removed, err := CleanupLeftovers(ctx, b, tc.family, k.opts()...); err != nil || removed != 0 {
					t.Errorf("second CleanupLeftovers = %d, %v; want 0, nil", removed, err)
				}
			})
		}
	}
}

func compareChains(a, b Chain) int {
	return strings.Compare(a.String(), b.String())
}

// TestKernelBackendsAreSeparate loads the same rules with both backends and
// cleans one: the other keeps its rules, and the clean one is not
// recreated by the listing of the other.
func TestKernelBackendsAreSeparate(t *testing.T) {
	requireBinaries(t, Legacy, IPv4)
	requireBinaries(t, NFT, IPv4)
	ns := netns.New(t, "xt-"+netns.RandomID(3), "both")
	legacy := &kernelCase{ns: ns, backend: Legacy, family: IPv4, save: "iptables-legacy-save", restore: "iptables-legacy-restore"}
	nft := &kernelCase{ns: ns, backend: NFT, family: IPv4, save: "iptables-nft-save", restore: "iptables-nft-restore"}
	fixture := readFixture(t, "iptables-v4.save")
	legacy.load(t, fixture)
	nft.load(t, fixture)

	if _, err := CleanupLeftovers(context.Background(), NFT, IPv4, nft.opts()...); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(normalize(survivorsV4), normalize(nft.dump(t))); d != "" {
		t.Errorf("nft after cleanup (-want +got):\n%s", d)
	}
	if d := cmp.Diff(normalize(fixture), normalize(legacy.dump(t))); d != "" {
		t.Errorf("legacy changed by the nft cleanup (-want +got):\n%s", d)
	}
	if _, err := CleanupLeftovers(context.Background(), Legacy, IPv4, legacy.opts()...); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(normalize(survivorsV4), normalize(legacy.dump(t))); d != "" {
		t.Errorf("legacy after cleanup (-want +got):\n%s", d)
	}
}

// TestKernelListingCreatesNothing checks that looking for leftovers in a
// namespace without any tables leaves it without tables: kube-proxy's
// image and k3s pick the backend by what tables and rules exist.
func TestKernelListingCreatesNothing(t *testing.T) {
	for _, b := range Backends {
		for _, f := range Families {
			t.Run(fmt.Sprintf("%s/%s", b, f), func(t *testing.T) {
				k := newKernelCase(t, b, f)
				for i := 0; i < 2; i++ {
					if found, err := FindLeftovers(context.Background(), b, f, k.opts()...); err != nil || len(found) > 0 {
						t.Fatalf("FindLeftovers = %v, %v; want nothing", found, err)
					}
					if n, err := CleanupLeftovers(context.Background(), b, f, k.opts()...); err != nil || n != 0 {
						t.Fatalf("CleanupLeftovers = %d, %v; want 0, nil", n, err)
					}
				}
				if out := normalize(k.dump(t)); out != "" {
					t.Errorf("tables appeared:\n%s", out)
				}
			})
		}
	}
}

// TestKernelKeepsChainsOtherToolsUse: a chain of another tool jumps into
// kube-proxy's chains; those chains stay (deleting them would fail the
// whole restore), the rest goes.
func TestKernelKeepsChainsOtherToolsUse(t *testing.T) {
	const rules = `*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:CNI-HOSTPORT-DNAT - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-SEP-IT2ZTR26TO4XFPTO - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-TCOU7JCQXEZGVUNU - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A CNI-HOSTPORT-DNAT -p tcp -m tcp --dport 8053 -j KUBE-SVC-TCOU7JCQXEZGVUNU
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-SEP-IT2ZTR26TO4XFPTO -s 10.244.0.2/32 -j KUBE-MARK-MASQ
-A KUBE-SEP-IT2ZTR26TO4XFPTO -p tcp -m tcp -j DNAT --to-destination 10.244.0.2:53
-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m tcp --dport 53 -j KUBE-SVC-TCOU7JCQXEZGVUNU
-A KUBE-SVC-TCOU7JCQXEZGVUNU -j KUBE-SEP-IT2ZTR26TO4XFPTO
COMMIT
`
	const want = `*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:CNI-HOSTPORT-DNAT - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-SEP-IT2ZTR26TO4XFPTO - [0:0]
:KUBE-SVC-TCOU7JCQXEZGVUNU - [0:0]
-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
-A CNI-HOSTPORT-DNAT -p tcp -m tcp --dport 8053 -j KUBE-SVC-TCOU7JCQXEZGVUNU
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-SEP-IT2ZTR26TO4XFPTO -s 10.244.0.2/32 -j KUBE-MARK-MASQ
-A KUBE-SEP-IT2ZTR26TO4XFPTO -p tcp -m tcp -j DNAT --to-destination 10.244.0.2:53
-A KUBE-SVC-TCOU7JCQXEZGVUNU -j KUBE-SEP-IT2ZTR26TO4XFPTO
COMMIT
`
	for _, b := range Backends {
		t.Run(string(b), func(t *testing.T) {
			k := newKernelCase(t, b, IPv4)
			k.load(t, rules)
			removed, err := CleanupLeftovers(context.Background(), b, IPv4, k.opts()...)
			if err != nil {
				t.Fatal(err)
			}
			if removed != 2 {
				t.Errorf("removed %d chains, want 2 (KUBE-POSTROUTING, KUBE-SERVICES)", removed)
			}
			if d := cmp.Diff(normalize(want), normalize(k.dump(t))); d != "" {
				t.Errorf("after cleanup (-want +got):\n%s", d)
			}
		})
	}
}

// TestKernelIPTablesModeLeftoversUnderIPVSMode: on a node that ran
// iptables mode, then ipvs mode's first sync on the same backend, the
// cleanup after it leaves ipvs mode's chains and jumps and removes what
// only iptables mode made, above all the filter REJECT rules of
// KUBE-SERVICES hooked from INPUT, FORWARD and OUTPUT.
func TestKernelIPTablesModeLeftoversUnderIPVSMode(t *testing.T) {
	for _, b := range Backends {
		t.Run(string(b), func(t *testing.T) {
			k := newKernelCase(t, b, IPv4)
			k.load(t, ipvsAfterIPTablesSave)
			removed, err := CleanupIPTablesModeLeftovers(context.Background(), b, IPv4, k.opts()...)
			if err != nil {
				t.Fatal(err)
			}
			if removed != 5 {
				t.Errorf("removed %d chains, want 5 (nat KUBE-NODEPORTS, a KUBE-SEP-, a KUBE-SVC-; filter KUBE-SERVICES, KUBE-EXTERNAL-SERVICES)", removed)
			}
			after := k.dump(t)
			for _, gone := range []string{"KUBE-EXTERNAL-SERVICES", "KUBE-NODEPORTS", "KUBE-SVC-", "KUBE-SEP-", "REJECT"} {
				if strings.Contains(after, gone) {
					t.Errorf("%s is still there:\n%s", gone, after)
				}
			}
			for _, kept := range []string{"-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES", "-j KUBE-NODE-PORT", "-j KUBE-IPVS-FILTER", "-j KUBE-FORWARD", "-j KUBE-POSTROUTING", ":KUBE-MARK-MASQ"} {
				if !strings.Contains(after, kept) {
					t.Errorf("ipvs mode's %q is gone:\n%s", kept, after)
				}
			}
		})
	}
}
