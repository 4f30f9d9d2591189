package xtablestest

// Kernel test: the Fake must agree with the real backends. The same
// restore inputs (in canonical iptables-save syntax, since the Fake does
// not canonicalize) go to the Fake and, as root, to iptables-restore in a
// fresh network namespace per backend; after each step both accepted or
// both rejected the input, and both hold the same rules.
//
// Addresses: 10.96.0.0/16 service cluster IPs, 10.244.0.0/16 pod IPs,
// 192.168.100.0/24 load balancer IPs, 203.0.113.0/24 external clients,
// 198.51.100.0/24 a user's addresses, 172.17.0.0/16 a docker bridge.

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/testutil/netns"
)

var counters = regexp.MustCompile(`\[\d+:\d+\]`)

// normalize drops comment lines, zeroes counters and sorts the tables by
// name (the backends print them in different orders).
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

type step struct {
	name    string
	input   string
	noflush bool
	fails   bool
	// only runs the step with this backend (where the backends differ).
	only xtables.Backend
}

// partialDNS replaces kube-dns's endpoint 10.244.0.3 by 10.244.0.4 the
// way kube-proxy's partial syncs do: the stale endpoint chain is declared
// (flushed) and then deleted.
const partialDNS = `*nat
:KUBE-SERVICES - [0:0]
:KUBE-SVC-TCOU7JCQXEZGVUNU - [0:0]
:KUBE-SEP-N4G2XR5TDX7PQE7P - [0:0]
:KUBE-SEP-QWERTYQWERTYQWER - [0:0]
-A KUBE-SERVICES -d 10.96.0.10/32 -p udp -m comment --comment "kube-system/kube-dns:dns cluster IP" -m udp --dport 53 -j KUBE-SVC-TCOU7JCQXEZGVUNU
-A KUBE-SERVICES -d 10.96.0.80/32 -p tcp -m comment --comment "default/lb:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-3DU66DE6VORVEQVD
-A KUBE-SERVICES -d 192.168.100.10/32 -p tcp -m comment --comment "default/lb:http loadbalancer IP" -m tcp --dport 80 -j KUBE-FW-3DU66DE6VORVEQVD
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-SVC-TCOU7JCQXEZGVUNU ! -s 10.244.0.0/16 -d 10.96.0.10/32 -p udp -m comment --comment "kube-system/kube-dns:dns cluster IP" -m udp --dport 53 -j KUBE-MARK-MASQ
-A KUBE-SVC-TCOU7JCQXEZGVUNU -m comment --comment "kube-system/kube-dns:dns -> 10.244.0.2:53" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-IT2ZTR26TO4XFPTO
-A KUBE-SVC-TCOU7JCQXEZGVUNU -m comment --comment "kube-system/kube-dns:dns -> 10.244.0.4:53" -j KUBE-SEP-QWERTYQWERTYQWER
-A KUBE-SEP-QWERTYQWERTYQWER -s 10.244.0.4/32 -m comment --comment "kube-system/kube-dns:dns" -j KUBE-MARK-MASQ
-A KUBE-SEP-QWERTYQWERTYQWER -p udp -m comment --comment "kube-system/kube-dns:dns" -m udp -j DNAT --to-destination 10.244.0.4:53
-X KUBE-SEP-N4G2XR5TDX7PQE7P
COMMIT
`

func steps(t *testing.T) []step {
	fixture, err := os.ReadFile("../testdata/iptables-v4.save")
	if err != nil {
		t.Fatal(err)
	}
	return []step{
		{name: "full restore of kube-proxy's, the kubelet's and a user's rules", input: string(fixture)},
		{name: "partial sync: an endpoint replaced", input: partialDNS, noflush: true},
		{
			name:    "insert and delete rules by rule and by number",
			input:   "*filter\n-I INPUT 1 -s 198.51.100.7/32 -j DROP\n-D INPUT -p tcp -m tcp --dport 22 -j ACCEPT\n-D USER-INPUT 1\n-A USER-INPUT -s 198.51.100.8/32 -j DROP\nCOMMIT\n",
			noflush: true,
		},
		{name: "new chain and policy", input: "*filter\n-N KUBE-NEWCHAIN\n-P FORWARD ACCEPT\nCOMMIT\n", noflush: true},
		{name: "jump to a missing chain", input: "*nat\n:KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]\n-A KUBE-SVC-AAAAAAAAAAAAAAAA -j KUBE-SEP-BBBBBBBBBBBBBBBB\nCOMMIT\n", noflush: true, fails: true},
		{name: "rule in an undeclared chain of a flushed table", input: "*nat\n:PREROUTING ACCEPT [0:0]\n-A KUBE-SERVICES -j RETURN\nCOMMIT\n", fails: true},
		{name: "deleting a chain still jumped to", input: "*nat\n:KUBE-SEP-ZP3FB6NMPNCO4VBJ - [0:0]\n-X KUBE-SEP-ZP3FB6NMPNCO4VBJ\nCOMMIT\n", noflush: true, fails: true},
		{name: "deleting a chain with rules", input: "*nat\n-X KUBE-MARK-MASQ\nCOMMIT\n", noflush: true, fails: true},
		{name: "deleting a missing chain", input: "*nat\n-X KUBE-SEP-CCCCCCCCCCCCCCCC\nCOMMIT\n", noflush: true, fails: true},
		{name: "deleting a rule that is not there", input: "*nat\n-D PREROUTING -j KUBE-NODEPORTS\nCOMMIT\n", noflush: true, fails: true},
		{name: "DNAT reachable from POSTROUTING", input: "*nat\n-A POSTROUTING -j KUBE-SEP-ZP3FB6NMPNCO4VBJ\nCOMMIT\n", noflush: true, fails: true},
		{name: "MASQUERADE in PREROUTING", input: "*nat\n-A PREROUTING -j MASQUERADE\nCOMMIT\n", noflush: true, fails: true},
		{name: "REJECT in nat", input: "*nat\n-A KUBE-NODEPORTS -p tcp -j REJECT --reject-with icmp-port-unreachable\nCOMMIT\n", noflush: true, fails: true},
		{
			name:    "a loop of jumps reachable from INPUT",
			input:   "*filter\n:KUBE-LOOP-A - [0:0]\n:KUBE-LOOP-B - [0:0]\n-A INPUT -j KUBE-LOOP-A\n-A KUBE-LOOP-A -j KUBE-LOOP-B\n-A KUBE-LOOP-B -j KUBE-LOOP-A\nCOMMIT\n",
			noflush: true, fails: true,
		},
		{
			name:    "a loop of jumps nothing reaches is accepted",
			input:   "*filter\n:KUBE-LOOP-A - [0:0]\n:KUBE-LOOP-B - [0:0]\n-A KUBE-LOOP-A -j KUBE-LOOP-B\n-A KUBE-LOOP-B -j KUBE-LOOP-A\nCOMMIT\n",
			noflush: true,
		},
		{name: "then a jump into it is not", input: "*filter\n-A FORWARD -j KUBE-LOOP-B\nCOMMIT\n", noflush: true, fails: true},
		{name: "unhooking and deleting the loop", input: "*filter\n-F KUBE-LOOP-A\n-F KUBE-LOOP-B\n-X KUBE-LOOP-A\n-X KUBE-LOOP-B\nCOMMIT\n", noflush: true},
		{name: "missing COMMIT", input: "*filter\n:KUBE-NEW - [0:0]\n", noflush: true, fails: true},
		{name: "unknown table", input: "*bogus\nCOMMIT\n", noflush: true, fails: true},
		{name: "chain name of 29 characters", input: "*filter\n:KUBE-SVC-ABCDEFGHIJKLMNOPQRSTU - [0:0]\nCOMMIT\n", noflush: true, fails: true},
		{
			name:    "second table fails: the first one is committed",
			input:   "*filter\n:KUBE-COMMITTED - [0:0]\nCOMMIT\n*nat\n-A KUBE-NOPE -j RETURN\nCOMMIT\n",
			noflush: true, fails: true,
		},
		{
			name:  "user chain declared twice in a flushing restore (legacy only; nft accepts it)",
			input: "*mangle\n:PREROUTING ACCEPT [0:0]\n:KUBE-TWICE - [0:0]\n:KUBE-TWICE - [0:0]\nCOMMIT\n", fails: true, only: xtables.Legacy,
		},
		{
			name:  "user chain with a policy (legacy only; nft accepts it)",
			input: "*mangle\n:KUBE-POLICY ACCEPT [0:0]\nCOMMIT\n", noflush: true, fails: true, only: xtables.Legacy,
		},
		{name: "declaring a user chain again with --noflush flushes it", input: "*nat\n:KUBE-MARK-MASQ - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\nCOMMIT\n", noflush: true},
		{
			name:  "flushing restore of one table replaces it",
			input: "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:KUBE-KUBELET-CANARY - [0:0]\n-A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE\nCOMMIT\n",
		},
		{name: "deleting all user chains of a table", input: "*mangle\n-X\nCOMMIT\n", noflush: true},
	}
}

func TestKernelFakeAgrees(t *testing.T) {
	for _, b := range xtables.Backends {
		t.Run(string(b), func(t *testing.T) {
			restore := "iptables-" + string(b) + "-restore"
			save := "iptables-" + string(b) + "-save"
			netns.Require(t, restore, save, "iptables-"+string(b))
			ns := netns.New(t, "xtf-"+netns.RandomID(3), string(b))
			ipt, err := xtables.New(b, xtables.IPv4, xtables.WithCommandPrefix("ip", "netns", "exec", ns.Name))
			if err != nil {
				t.Fatal(err)
			}
			fake := NewFake(b, xtables.IPv4)
			// The kernel commits table by table; so does the Fake here.
			fake.CommitPerTable = true
			dump := func() string {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				out, err := exec.CommandContext(ctx, "ip", "netns", "exec", ns.Name, save).Output()
				if err != nil {
					t.Fatalf("%s: %v", save, err)
				}
				return normalize(string(out))
			}
			ctx := context.Background()
			for _, s := range steps(t) {
				if s.only != "" && s.only != b {
					continue
				}
				opts := xtables.RestoreOptions{NoFlush: s.noflush}
				kerr := ipt.Restore(ctx, []byte(s.input), opts)
				ferr := fake.Restore(ctx, []byte(s.input), opts)
				switch {
				case s.fails && (kerr == nil || ferr == nil):
					t.Errorf("%s: kernel err %v, fake err %v; want both to fail", s.name, kerr, ferr)
				case !s.fails && (kerr != nil || ferr != nil):
					t.Errorf("%s: kernel err %v, fake err %v; want both to succeed", s.name, kerr, ferr)
				}
				var kre, fre *xtables.RestoreError
				if errors.As(kerr, &kre) && errors.As(ferr, &fre) {
					t.Logf("%s:\n  kernel: %v\n  fake:   %v", s.name, kerr, ferr)
				}
				if d := cmp.Diff(dump(), normalize(fake.Dump())); d != "" {
					t.Fatalf("%s: state differs (-kernel +fake):\n%s", s.name, d)
				}
			}
			// Save of one table agrees too, byte for byte after comments
			// and counters.
			for _, table := range fake.Tables() {
				k, err := ipt.Save(ctx, table)
				if err != nil {
					t.Fatal(err)
				}
				f, _ := fake.Save(ctx, table)
				if d := cmp.Diff(normalize(string(k)), string(f)); d != "" {
					t.Errorf("Save(%s) (-kernel +fake):\n%s", table, d)
				}
			}
		})
	}
}
