package xtables

// Address ranges in the fixtures (testdata/*.save):
//   10.96.0.0/16, fd00:96::/112     service cluster IPs
//   10.244.0.0/16, fd00:244::/64    pod (endpoint) IPs
//   192.168.100.0/24                load balancer IPs
//   203.0.113.0/24                  external clients (source ranges, a user's DROP)
//   172.17.0.0/16, fd00:17::/64     a user's docker bridge (masqueraded by the user's rule)

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/kernel/execer/execertest"

	"github.com/google/go-cmp/cmp"
)

func readFixture(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// tableScript is the expected restore input for one table: the deletes,
// then -F and -X of each chain, in that order.
func tableScript(table string, deletes []string, chains ...string) string {
	var b strings.Builder
	b.WriteString("*" + table + "\n")
	for _, d := range deletes {
		b.WriteString(d + "\n")
	}
	for _, c := range chains {
		b.WriteString("-F " + c + "\n")
	}
	for _, c := range chains {
		b.WriteString("-X " + c + "\n")
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

func chainList(table string, names ...string) []Chain {
	var out []Chain
	for _, n := range names {
		out = append(out, Chain{Table: table, Name: n})
	}
	return out
}

func concat[T any](parts ...[]T) []T {
	var out []T
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

var (
	v4FilterChains = []string{"KUBE-EXTERNAL-SERVICES", "KUBE-FORWARD", "KUBE-NODEPORTS", "KUBE-PROXY-CANARY", "KUBE-PROXY-FIREWALL", "KUBE-SERVICES"}
	v4NATChains    = []string{
		"KUBE-EXT-3DU66DE6VORVEQVD", "KUBE-FW-3DU66DE6VORVEQVD", "KUBE-MARK-MASQ", "KUBE-NODEPORTS", "KUBE-POSTROUTING", "KUBE-PROXY-CANARY",
		"KUBE-SEP-IT2ZTR26TO4XFPTO", "KUBE-SEP-N4G2XR5TDX7PQE7P", "KUBE-SEP-ZP3FB6NMPNCO4VBJ", "KUBE-SERVICES",
		"KUBE-SVC-3DU66DE6VORVEQVD", "KUBE-SVC-TCOU7JCQXEZGVUNU", "KUBE-SVL-3DU66DE6VORVEQVD",
	}
	// The jumps kube-proxy's iptables mode adds to the filter table's
	// built-in chains, as iptables-save prints them.
	filterJumps = []string{
		`-D INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL`,
		`-D INPUT -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS`,
		`-D INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES`,
		`-D FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL`,
		`-D FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD`,
		`-D FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`,
		`-D FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES`,
		`-D OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL`,
		`-D OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`,
	}
	natJumps = []string{
		`-D PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`,
		`-D OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`,
		`-D POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING`,
	}
)

func TestCleanupScript(t *testing.T) {
	v6NATChains := []string{"KUBE-MARK-MASQ", "KUBE-NODEPORTS", "KUBE-POSTROUTING", "KUBE-PROXY-CANARY", "KUBE-SEP-5BRQGR2HGBQOD7ZQ", "KUBE-SERVICES", "KUBE-SVC-6W3U2DDHJAT5LSJL"}
	ipvsNATChains := []string{"KUBE-LOAD-BALANCER", "KUBE-MARK-MASQ", "KUBE-NODE-PORT", "KUBE-POSTROUTING", "KUBE-SERVICES"}
	ipvsFilterChains := []string{"KUBE-FORWARD", "KUBE-IPVS-FILTER", "KUBE-IPVS-OUT-FILTER", "KUBE-NODE-PORT", "KUBE-PROXY-FIREWALL", "KUBE-SOURCE-RANGES-FIREWALL"}

	tests := []struct {
		name       string
		save       string
		wantScript string
		wantChains []Chain
		wantErr    string
	}{
		{
			name: "iptables mode IPv4: kubelet chains, KUBE-FIREWALL and the user's rules stay",
			save: readFixture(t, "iptables-v4.save"),
			wantScript: tableScript("mangle", nil, "KUBE-PROXY-CANARY") +
				tableScript("filter", filterJumps, v4FilterChains...) +
				tableScript("nat", natJumps, v4NATChains...),
			wantChains: concat(chainList("mangle", "KUBE-PROXY-CANARY"), chainList("filter", v4FilterChains...), chainList("nat", v4NATChains...)),
		},
		{
			name: "iptables mode IPv6",
			save: readFixture(t, "iptables-v6.save"),
			wantScript: tableScript("mangle", nil, "KUBE-PROXY-CANARY") +
				tableScript("filter", filterJumps, v4FilterChains...) +
				tableScript("nat", natJumps, v6NATChains...),
			wantChains: concat(chainList("mangle", "KUBE-PROXY-CANARY"), chainList("filter", v4FilterChains...), chainList("nat", v6NATChains...)),
		},
		{
			name: "IPVS mode: its own chain names, the kubelet's KUBE-FIREWALL stays",
			save: readFixture(t, "ipvs-v4.save"),
			wantScript: tableScript("nat", natJumps, ipvsNATChains...) +
				tableScript("filter", []string{
					`-D INPUT -m comment --comment "kubernetes health check rules" -j KUBE-NODE-PORT`,
					`-D INPUT -m comment --comment "kubernetes ipvs access filter" -j KUBE-IPVS-FILTER`,
					`-D INPUT -m comment --comment "kube-proxy firewall rules" -j KUBE-PROXY-FIREWALL`,
					`-D FORWARD -m comment --comment "kube-proxy firewall rules" -j KUBE-PROXY-FIREWALL`,
					`-D FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD`,
					`-D OUTPUT -m comment --comment "kubernetes ipvs access filter" -j KUBE-IPVS-OUT-FILTER`,
				}, ipvsFilterChains...),
			wantChains: concat(chainList("nat", ipvsNATChains...), chainList("filter", ipvsFilterChains...)),
		},
		{
			name: "exact format of a small case",
			save: `# Generated by iptables-save v1.8.9 (nf_tables) on Mon Jan  1 00:00:00 2026
*nat
:PREROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
-A PREROUTING -m comment --comment "kubernetes  service  portals" -j KUBE-SERVICES
COMMIT
# Completed on Mon Jan  1 00:00:00 2026
`,
			wantScript: "*nat\n" +
				"-D PREROUTING -m comment --comment \"kubernetes  service  portals\" -j KUBE-SERVICES\n" +
				"-F KUBE-SERVICES\n" +
				"-X KUBE-SERVICES\n" +
				"COMMIT\n",
			wantChains: chainList("nat", "KUBE-SERVICES"),
		},
		{
			name: "only the kubelet's and the user's: nothing to do",
			save: `*mangle
:PREROUTING ACCEPT [0:0]
:KUBE-IPTABLES-HINT - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
COMMIT
*filter
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-FIREWALL - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
-A INPUT -j KUBE-FIREWALL
-A OUTPUT -j KUBE-FIREWALL
-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block incoming localnet connections" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:KUBE-KUBELET-CANARY - [0:0]
:KUBE-MARK-DROP - [0:0]
-A KUBE-MARK-DROP -j MARK --set-xmark 0x8000/0x8000
COMMIT
`,
		},
		{
			name: "empty output (no tables loaded)",
			save: "",
		},
		{
			name: "kube-router's KUBE- chains are not kube-proxy's",
			save: `*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:KUBE-NWPLCY-DEFAULT - [0:0]
:KUBE-POD-FW-7ENBIMBS4G5CXXRU - [0:0]
:KUBE-ROUTER-FORWARD - [0:0]
:KUBE-ROUTER-INPUT - [0:0]
-A INPUT -m comment --comment "kube-router netpol - 4IA2OSFRMVNDXBVV" -j KUBE-ROUTER-INPUT
-A FORWARD -m comment --comment "kube-router netpol - TEMCG2JMHZYE7H7T" -j KUBE-ROUTER-FORWARD
-A KUBE-ROUTER-FORWARD -d 10.244.1.5/32 -m comment --comment "rule to jump traffic destined to POD name:web namespace: default to chain KUBE-POD-FW-7ENBIMBS4G5CXXRU" -j KUBE-POD-FW-7ENBIMBS4G5CXXRU
-A KUBE-POD-FW-7ENBIMBS4G5CXXRU -j KUBE-NWPLCY-DEFAULT
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:KUBE-SVC-lowercase0000000 - [0:0]
:KUBE-SEP-TOOSHORT - [0:0]
COMMIT
`,
		},
		{
			name: "a chain another tool jumps to stays, with what it jumps to; the built-in jumps go",
			save: `*nat
:PREROUTING ACCEPT [0:0]
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
-A KUBE-SEP-IT2ZTR26TO4XFPTO -s 10.244.0.2/32 -j KUBE-MARK-MASQ
-A KUBE-SEP-IT2ZTR26TO4XFPTO -p tcp -m tcp -j DNAT --to-destination 10.244.0.2:53
-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m tcp --dport 53 -j KUBE-SVC-TCOU7JCQXEZGVUNU
-A KUBE-SVC-TCOU7JCQXEZGVUNU -j KUBE-SEP-IT2ZTR26TO4XFPTO
COMMIT
`,
			wantScript: tableScript("nat", []string{
				`-D PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`,
				`-D POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING`,
			}, "KUBE-POSTROUTING", "KUBE-SERVICES"),
			wantChains: chainList("nat", "KUBE-POSTROUTING", "KUBE-SERVICES"),
		},
		{
			name: "goto targets count; a comment that reads -j does not",
			save: `*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
-A PREROUTING -g KUBE-SERVICES
-A OUTPUT -m comment --comment "-j KUBE-SERVICES" -j ACCEPT
-A OUTPUT -m comment --comment "say \"hi\" -j KUBE-SERVICES" -j RETURN
COMMIT
`,
			wantScript: tableScript("nat", []string{"-D PREROUTING -g KUBE-SERVICES"}, "KUBE-SERVICES"),
			wantChains: chainList("nat", "KUBE-SERVICES"),
		},
		{
			name: "iptables-nft with only the mangle canary",
			save: `*mangle
:PREROUTING ACCEPT [0:0]
:KUBE-PROXY-CANARY - [0:0]
COMMIT
`,
			wantScript: tableScript("mangle", nil, "KUBE-PROXY-CANARY"),
			wantChains: chainList("mangle", "KUBE-PROXY-CANARY"),
		},
		{
			name:    "rule outside a table",
			save:    "-A PREROUTING -j KUBE-SERVICES\n",
			wantErr: "outside a table",
		},
		{
			name:    "unterminated quote",
			save:    "*nat\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -m comment --comment \"oops -j KUBE-SERVICES\nCOMMIT\n",
			wantErr: "unterminated quote",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			script, chains, err := cleanupScript(tc.save)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.wantScript, script); d != "" {
				t.Errorf("script (-want +got):\n%s", d)
			}
			if d := cmp.Diff(tc.wantChains, chains); d != "" {
				t.Errorf("chains (-want +got):\n%s", d)
			}
		})
	}
}

func TestKeptChains(t *testing.T) {
	// The same table as the "another tool jumps" case above: what stays,
	// and why, is reported by CleanupLeftovers in its log.
	save := `*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:CNI-HOSTPORT-DNAT - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-SEP-IT2ZTR26TO4XFPTO - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-TCOU7JCQXEZGVUNU - [0:0]
-A OUTPUT -p tcp -m tcp --dport 53 -j KUBE-SVC-TCOU7JCQXEZGVUNU
-A CNI-HOSTPORT-DNAT -p tcp -m tcp --dport 8053 -j KUBE-SVC-TCOU7JCQXEZGVUNU
-A KUBE-SEP-IT2ZTR26TO4XFPTO -s 10.244.0.2/32 -j KUBE-MARK-MASQ
-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m tcp --dport 53 -j KUBE-SVC-TCOU7JCQXEZGVUNU
-A KUBE-SVC-TCOU7JCQXEZGVUNU -j KUBE-SEP-IT2ZTR26TO4XFPTO
COMMIT
`
	tables, err := parseSave(save)
	if err != nil {
		t.Fatal(err)
	}
	plans := makePlan(tables, isKubeProxyChain)
	want := chainList("nat", "KUBE-MARK-MASQ", "KUBE-SEP-IT2ZTR26TO4XFPTO", "KUBE-SVC-TCOU7JCQXEZGVUNU")
	if d := cmp.Diff(want, chainsOf(plans, true)); d != "" {
		t.Errorf("kept (-want +got):\n%s", d)
	}
	if d := cmp.Diff(chainList("nat", "KUBE-SERVICES"), chainsOf(plans, false)); d != "" {
		t.Errorf("removed (-want +got):\n%s", d)
	}
	// The jump from OUTPUT to a kept chain goes: FindLeftovers reports
	// the chain so that the caller runs the cleanup.
	if d := cmp.Diff(chainList("nat", "KUBE-SERVICES", "KUBE-SVC-TCOU7JCQXEZGVUNU"), leftovers(plans)); d != "" {
		t.Errorf("leftovers (-want +got):\n%s", d)
	}
	if got := render(plans); !strings.Contains(got, "-D OUTPUT -p tcp -m tcp --dport 53 -j KUBE-SVC-TCOU7JCQXEZGVUNU\n") {
		t.Errorf("script does not unhook the kept chain:\n%s", got)
	}
}

func TestIsKubeProxyChain(t *testing.T) {
	tests := []struct {
		table, name string
		want        bool
	}{
		{"nat", "KUBE-SERVICES", true},
		{"nat", "KUBE-SVC-TCOU7JCQXEZGVUNU", true},
		{"nat", "KUBE-XLB-TCOU7JCQXEZGVUNU", true},
		{"nat", "KUBE-FIREWALL", true}, // old IPVS mode's nat chain
		{"filter", "KUBE-FIREWALL", false},
		{"nat", "KUBE-MARK-DROP", false},
		{"filter", "KUBE-KUBELET-CANARY", false},
		{"mangle", "KUBE-IPTABLES-HINT", false},
		{"mangle", "KUBE-PROXY-CANARY", true},
		{"filter", "KUBE-SVC-TCOU7JCQXEZGVUNU", false}, // hashed chains live in nat only
		{"nat", "KUBE-POD-FW-7ENBIMBS4G5CXXRU", false},
		{"nat", "KUBE-HOSTPORTS", false},
		{"raw", "KUBE-SERVICES", false},
	}
	for _, tc := range tests {
		if got := isKubeProxyChain(tc.table, tc.name); got != tc.want {
			t.Errorf("isKubeProxyChain(%s, %s) = %v, want %v", tc.table, tc.name, got, tc.want)
		}
	}
}

const smallSave = `*nat
:PREROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
COMMIT
`

const smallScript = `*nat
-D PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-F KUBE-SERVICES
-X KUBE-SERVICES
COMMIT
`

func TestCleanupLeftoversCommands(t *testing.T) {
	ns := []string{"ip", "netns", "exec", "kpt-x"}
	tests := []struct {
		name        string
		backend     Backend
		family      Family
		script      []execertest.Call
		wantRemoved int
		wantErr     string
	}{
		{
			name: "legacy IPv4 waits for the xtables lock", backend: Legacy, family: IPv4,
			script: []execertest.Call{
				{Argv: append(ns, "/usr/sbin/iptables-legacy-save"), Stdout: smallSave},
				{Argv: append(ns, "/usr/sbin/iptables-legacy-restore", "--noflush", "-w", "5"), Stdin: smallScript},
			},
			wantRemoved: 1,
		},
		{
			name: "nft IPv6", backend: NFT, family: IPv6,
			script: []execertest.Call{
				{Argv: append(ns, "/usr/sbin/ip6tables-nft-save"), Stdout: smallSave},
				{Argv: append(ns, "/usr/sbin/ip6tables-nft-restore", "--noflush"), Stdin: smallScript},
			},
			wantRemoved: 1,
		},
		{
			name: "nothing to remove: no restore", backend: NFT, family: IPv4,
			script: []execertest.Call{
				{Argv: append(ns, "/usr/sbin/iptables-nft-save"), Stdout: "*nat\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n"},
			},
		},
		{
			name: "a failed restore is retried once on a fresh listing", backend: NFT, family: IPv4,
			script: []execertest.Call{
				{Argv: append(ns, "/usr/sbin/iptables-nft-save"), Stdout: smallSave},
				{Argv: append(ns, "/usr/sbin/iptables-nft-restore", "--noflush"), Stdin: smallScript, Stderr: "iptables-nft-restore: line 2 failed"},
				{Argv: append(ns, "/usr/sbin/iptables-nft-save"), Stdout: smallSave},
				{Argv: append(ns, "/usr/sbin/iptables-nft-restore", "--noflush"), Stdin: smallScript},
			},
			wantRemoved: 1,
		},
		{
			name: "two failures are an error", backend: Legacy, family: IPv6,
			script: []execertest.Call{
				{Argv: append(ns, "/usr/sbin/ip6tables-legacy-save"), Stdout: smallSave},
				{Argv: append(ns, "/usr/sbin/ip6tables-legacy-restore", "--noflush", "-w", "5"), Stdin: smallScript, Stderr: "ip6tables-restore: line 2 failed"},
				{Argv: append(ns, "/usr/sbin/ip6tables-legacy-save"), Stdout: smallSave},
				{Argv: append(ns, "/usr/sbin/ip6tables-legacy-restore", "--noflush", "-w", "5"), Stdin: smallScript, Stderr: "ip6tables-restore: line 2 failed"},
			},
			wantErr: "removing legacy IPv6 rules",
		},
		{
			name: "failed listing", backend: Legacy, family: IPv4,
			script: []execertest.Call{
				{Argv: append(ns, "/usr/sbin/iptables-legacy-save"), Stderr: "Permission denied (you must be root)"},
			},
			wantErr: "listing legacy IPv4 rules",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			x := &execertest.Script{T: t, Calls: tc.script}
			removed, err := CleanupLeftovers(context.Background(), tc.backend, tc.family, withExecer(x), WithCommandPrefix(ns...))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if removed != tc.wantRemoved {
				t.Errorf("removed = %d, want %d", removed, tc.wantRemoved)
			}
			x.Done()
		})
	}
}

func TestFindLeftoversCommands(t *testing.T) {
	// Plain -save, never with -t: naming a table creates it in the legacy
	// backend.
	x := &execertest.Script{T: t, Calls: []execertest.Call{
		{Argv: []string{"/usr/sbin/iptables-legacy-save"}, Stdout: readFixture(t, "ipvs-v4.save")},
	}}
	chains, err := FindLeftovers(context.Background(), Legacy, IPv4, withExecer(x))
	if err != nil {
		t.Fatal(err)
	}
	want := concat(
		chainList("nat", "KUBE-LOAD-BALANCER", "KUBE-MARK-MASQ", "KUBE-NODE-PORT", "KUBE-POSTROUTING", "KUBE-SERVICES"),
		chainList("filter", "KUBE-FORWARD", "KUBE-IPVS-FILTER", "KUBE-IPVS-OUT-FILTER", "KUBE-NODE-PORT", "KUBE-PROXY-FIREWALL", "KUBE-SOURCE-RANGES-FIREWALL"),
	)
	if d := cmp.Diff(want, chains); d != "" {
		t.Errorf("chains (-want +got):\n%s", d)
	}
	x.Done()
}

func TestMissingBinaries(t *testing.T) {
	tests := []struct {
		backend Backend
		family  Family
		missing []string
		want    string
	}{
		{Legacy, IPv4, []string{"iptables-legacy-save", "iptables-legacy-restore"}, "iptables-legacy-save and iptables-legacy-restore not found"},
		{NFT, IPv6, []string{"ip6tables-nft-restore"}, "ip6tables-nft-restore not found"},
	}
	for _, tc := range tests {
		x := &execertest.Script{T: t, Missing: map[string]bool{}}
		for _, m := range tc.missing {
			x.Missing[m] = true
		}
		_, err := FindLeftovers(context.Background(), tc.backend, tc.family, withExecer(x))
		if !errors.Is(err, ErrNotInstalled) {
			t.Errorf("%s %s: err = %v, want ErrNotInstalled", tc.backend, tc.family, err)
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s %s: err = %v, want it to say %q", tc.backend, tc.family, err, tc.want)
		}
		_, err = CleanupLeftovers(context.Background(), tc.backend, tc.family, withExecer(x))
		if !errors.Is(err, ErrNotInstalled) {
			t.Errorf("%s %s: CleanupLeftovers err = %v, want ErrNotInstalled", tc.backend, tc.family, err)
		}
		x.Done()
	}
	if _, err := FindLeftovers(context.Background(), "iptables", IPv4); err == nil || errors.Is(err, ErrNotInstalled) {
		t.Errorf("unknown backend: err = %v, want a plain error", err)
	}
}

// TestIPTablesModeLeftoversUnderIPVSMode: ipvs mode after iptables mode on
// the same backend. ipvs mode's first sync rewrote the chains of its own
// (nat KUBE-SERVICES now holds its rules); what only iptables mode made
// goes, above all filter KUBE-SERVICES and KUBE-EXTERNAL-SERVICES, whose
// REJECT rules for services that had no endpoints would otherwise keep
// refusing them; ipvs mode's chains and their jumps stay.
func TestIPTablesModeLeftoversUnderIPVSMode(t *testing.T) {
	save := ipvsAfterIPTablesSave
	tables, err := parseSave(save)
	if err != nil {
		t.Fatal(err)
	}
	plans := makePlan(tables, isIPTablesModeChain)
	script := render(plans)
	want := `*nat
-F KUBE-NODEPORTS
-F KUBE-SEP-IT2ZTR26TO4XFPTO
-F KUBE-SVC-TCOU7JCQXEZGVUNU
-X KUBE-NODEPORTS
-X KUBE-SEP-IT2ZTR26TO4XFPTO
-X KUBE-SVC-TCOU7JCQXEZGVUNU
COMMIT
*filter
-D INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-D INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-D FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-D OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-F KUBE-EXTERNAL-SERVICES
-F KUBE-SERVICES
-X KUBE-EXTERNAL-SERVICES
-X KUBE-SERVICES
COMMIT
`
	if d := cmp.Diff(want, script); d != "" {
		t.Errorf("script (-want +got):\n%s", d)
	}
}

// ipvsAfterIPTablesSave is a node after iptables mode then ipvs mode's
// first sync on the same backend: ipvs mode's chains (nat KUBE-SERVICES
// now holds its rules) beside what only iptables mode made, filter
// KUBE-SERVICES's REJECT rule hooked from INPUT, FORWARD and OUTPUT among
// it. The unit test and the kernel test of CleanupIPTablesModeLeftovers
// both start from it.
const ipvsAfterIPTablesSave = `*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-NODE-PORT - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-SEP-IT2ZTR26TO4XFPTO - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-TCOU7JCQXEZGVUNU - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-SEP-IT2ZTR26TO4XFPTO -s 10.244.0.2/32 -j KUBE-MARK-MASQ
-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT
-A KUBE-SVC-TCOU7JCQXEZGVUNU -j KUBE-SEP-IT2ZTR26TO4XFPTO
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-IPVS-FILTER - [0:0]
:KUBE-SERVICES - [0:0]
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A INPUT -m comment --comment "kubernetes ipvs access filter" -j KUBE-IPVS-FILTER
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-SERVICES -d 198.19.0.10/32 -p tcp -m comment --comment "ns/web:http has no endpoints" -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable
COMMIT
`
