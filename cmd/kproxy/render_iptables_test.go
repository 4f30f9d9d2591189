package main

// Address plan: 198.18.0.0/16 nodes and pods, 198.19.0.0/16 service IPs
// (the built-in example).

import (
	"strings"
	"testing"
)

func TestRenderIPTablesRules(t *testing.T) {
	nft, _, err := execute(t, "render", "--proxy-mode", "iptables")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"iptables-nft-restore --noflush",
		"ip6tables-nft-restore --noflush",
		"*mangle\n:KUBE-PROXY-CANARY - [0:0]\nCOMMIT\n",
		`-A KUBE-SERVICES -m comment --comment "demo/web-clusterip:http cluster IP" -m tcp -p tcp -d 198.19.0.10 --dport 80 -j KUBE-SVC-L3ZXZ5RL5JV2UINA`,
		`-A KUBE-SERVICES -m comment --comment "demo/no-endpoints:http has no endpoints" -m tcp -p tcp -d 198.19.0.20 --dport 80 -j REJECT`,
		`-A KUBE-SERVICES -m comment --comment "demo/dual-stack:http cluster IP" -m tcp -p tcp -d fd00:19::17 --dport 80`,
		// IPv6 never has localhost node ports.
		"-m addrtype --dst-type LOCAL ! -d ::1/128 -j KUBE-NODEPORTS",
	} {
		if !strings.Contains(nft, want) {
			t.Errorf("rules lack %q", want)
		}
	}
	legacy, _, err := execute(t, "render", "--proxy-mode", "iptables", "--iptables-backend", "legacy")
	if err != nil {
		t.Fatal(err)
	}
	// The two backends get the same bytes; only the header says which tool.
	if strings.ReplaceAll(nft, "-nft-restore", "-legacy-restore") != legacy {
		t.Errorf("legacy and nft restore input differ beyond the header")
	}
	// Flags shape the rules: no localhost node ports, another mark bit.
	out, _, err := execute(t, "render", "--proxy-mode", "iptables", "--iptables-localhost-nodeports=false", "--iptables-masquerade-bit", "13")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"--or-mark 0x00002000", "-m addrtype --dst-type LOCAL ! -d 127.0.0.0/8 -j KUBE-NODEPORTS"} {
		if !strings.Contains(out, want) {
			t.Errorf("with flags, rules lack %q", want)
		}
	}
	if strings.Contains(out, "-A KUBE-FIREWALL") {
		t.Errorf("without localhost node ports there is no anti-martian rule (only the kubelet's empty chain)")
	}
	if _, _, err := execute(t, "render", "--proxy-mode", "iptables", "--iptables-backend", "nf"); err == nil || !strings.Contains(err.Error(), "--iptables-backend") {
		t.Errorf("a bad backend: want an error naming --iptables-backend, got %v", err)
	}
}
