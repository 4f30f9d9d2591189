package doctor

import (
	"errors"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/kernel/ipvs"
	"github.com/kproxy/kproxy/internal/kernel/xtables"
)

// TestDiagnose: doctor's verdict for typical node states.
func TestDiagnose(t *testing.T) {
	healthy := func() hostFacts {
		return hostFacts{
			Chosen: xtables.NFT, ChosenWhy: "IPTABLES_MODE=nft",
			Versions:   map[xtables.Backend]string{xtables.Legacy: "1.8.9", xtables.NFT: "1.8.9"},
			Missing:    map[xtables.Backend]error{},
			KubeChains: map[xtables.Backend][]string{},
			Sysctls:    map[string]string{"net/ipv4/ip_forward": "1"},
		}
	}
	for _, tc := range []struct {
		name  string
		edit  func(*hostFacts)
		want  []string // "level: substring"
		clean bool     // no warn or error at all
	}{
		{name: "fresh node", edit: func(*hostFacts) {}, clean: true,
			want: []string{"ok: iptables mode would use the nft backend (IPTABLES_MODE=nft)", "ok: no proxy answers"}},
		{name: "foreign rule in kube-proxy's chains", edit: func(f *hostFacts) {
			f.ForeignRules = map[xtables.Backend][]string{xtables.NFT: {"IPv4 nat: -A KUBE-SERVICES -d 198.19.0.10/32 -j DNAT --to-destination 198.18.1.99:8080 (rewrites addresses in a dispatch chain)"}}
		}, want: []string{"error: 1 rules in kube-proxy's chains of the nft backend that kube-proxy does not write"}},
		{name: "running proxy with contested addresses", edit: func(f *hostFacts) {
			f.RunningMode = "nftables"
			f.RunningProblems = problemLines("# HELP x\nkproxy_contested_addresses{ip_family=\"IPv4\",kind=\"nodePort\"} 1\nkproxy_contested_addresses{ip_family=\"IPv6\",kind=\"nodePort\"} 0\nkproxy_refused_service_ports{ip_family=\"IPv4\"} 0\n")
		}, want: []string{`warn: the running proxy reports kproxy_contested_addresses{ip_family="IPv4",kind="nodePort"} 1`}},
		{name: "both iptables backends", edit: func(f *hostFacts) {
			f.KubeChains[xtables.Legacy] = []string{"IPv4 nat/KUBE-SERVICES"}
			f.KubeChains[xtables.NFT] = []string{"IPv4 nat/KUBE-SERVICES", "IPv4 filter/KUBE-FORWARD"}
		}, want: []string{"error: kube-proxy rules in BOTH iptables backends (legacy: 1 chains, nft: 2)"}},
		{name: "iptables and nftables after a mode switch", edit: func(f *hostFacts) {
			f.KubeChains[xtables.Legacy] = []string{"IPv4 nat/KUBE-SERVICES"}
			f.NFTables = []string{"ip kube-proxy", "ip kube-proxy-s0"}
			f.RunningMode = "nftables"
		}, want: []string{"warn: rules of several proxy modes at once (iptables, nftables)", "ok: a proxy answers on /proxyMode: nftables",
			"warn: the running proxy is in nftables mode but kube-proxy iptables rules exist"}},
		{name: "running on one backend, rules in the other", edit: func(f *hostFacts) {
			f.KubeChains[xtables.Legacy] = []string{"IPv4 nat/KUBE-SERVICES"}
			f.RunningMode, f.RunningBackend = "iptables", "nft"
		}, want: []string{"ok: a proxy answers on /proxyMode: iptables (backend nft)",
			"error: the running proxy uses the nft backend but the legacy backend holds kube-proxy chains"}},
		{name: "IPVS leftovers beside iptables", edit: func(f *hostFacts) {
			f.KubeChains[xtables.NFT] = []string{"IPv4 nat/KUBE-SERVICES"}
			f.IPVS = ipvs.Leftovers{Link: "kube-ipvs0"}
		}, want: []string{"warn: rules of several proxy modes at once (iptables, ipvs)"}},
		{name: "chosen backend missing, forwarding off", edit: func(f *hostFacts) {
			f.Missing[xtables.NFT] = errors.New("iptables-nft-restore not found")
			f.Sysctls["net/ipv4/ip_forward"] = "0"
		}, want: []string{"warn: iptables nft backend not usable", "error: net.ipv4.ip_forward=0"}},
		{name: "no backend to choose", edit: func(f *hostFacts) {
			f.Chosen, f.ChosenWhy, f.ChooseErr = "", "", errors.New("no iptables binaries")
		}, want: []string{"error: iptables mode could not choose a backend: no iptables binaries"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := healthy()
			tc.edit(&f)
			got := diagnose(f)
			var lines []string
			for _, fd := range got {
				lines = append(lines, fd.Level+": "+fd.Text)
				if tc.clean && fd.Level != levelOK {
					t.Errorf("unexpected %s", fd.Level+": "+fd.Text)
				}
			}
			all := strings.Join(lines, "\n")
			for _, w := range tc.want {
				if !strings.Contains(all, w) {
					t.Errorf("findings lack %q:\n%s", w, all)
				}
			}
		})
	}
}
