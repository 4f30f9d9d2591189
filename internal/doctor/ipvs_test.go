package doctor

// Address plan: 198.18.0.0/16 nodes, 198.19.0.0/16 service IPs; a
// foreign virtual server on 192.0.2.80 (another load balancer's).

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	kipvs "github.com/kproxy/kproxy/internal/kernel/ipvs"
	"github.com/kproxy/kproxy/internal/kernel/xtables"
)

func ipvsNodeFacts() hostFacts {
	return hostFacts{
		Chosen: xtables.NFT, ChosenWhy: "IPTABLES_MODE=nft",
		Versions:    map[xtables.Backend]string{xtables.NFT: "1.8.9"},
		Missing:     map[xtables.Backend]error{},
		KubeChains:  map[xtables.Backend][]string{},
		Sysctls:     map[string]string{"net/ipv4/ip_forward": "1", "net/ipv4/vs/conntrack": "1"},
		RunningMode: "ipvs", RunningBackend: "nft",
		IPVS: kipvs.Leftovers{Link: "kube-ipvs0", IPSets: []string{"KUBE-CLUSTER-IP", "KUBE-IPVS-IPS"}, IPVSChecked: true,
			VirtualServers: []kipvs.VirtualServer{{Protocol: 6, Port: 80}}},
		IPVSNode: ipvsFacts{
			Loaded: true, Dummy: true, DummyAddrs: 3, Scheduler: "rr",
			Servers: []vsFact{
				{Name: "TCP 192.0.2.80:80", Scheduler: "wlc", Reals: 2},
				{Name: "TCP 198.19.0.10:80", Scheduler: "rr", Reals: 2, Terminate: 1, Ours: true},
			},
			Timeouts: kipvs.Timeouts{TCP: 900, TCPFin: 120, UDP: 300},
			Want:     kipvs.Timeouts{TCP: 900},
			Modules:  map[string]string{"rr": modLoaded, "wrr": modAvailable, "mh": modMissing},
		},
	}
}

// TestDiagnoseIPVS: doctor's verdict on ipvs mode's state.
func TestDiagnoseIPVS(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*hostFacts)
		want []string
		not  []string
	}{
		{name: "healthy ipvs node", edit: func(*hostFacts) {},
			want: []string{`ok: ipvs.scheduler "rr": module ip_vs_rr loaded`, "ok: 1 IPVS virtual servers of another program"},
			not:  []string{"warn:", "error:"}},
		{name: "configured scheduler without a module", edit: func(f *hostFacts) { f.IPVSNode.Scheduler = "mh" },
			want: []string{`error: ipvs.scheduler "mh": this kernel has no module ip_vs_mh`}},
		{name: "kube-ipvs0 gone under a running ipvs proxy", edit: func(f *hostFacts) { f.IPVSNode.Dummy = false },
			want: []string{"warn: the running proxy is in ipvs mode but kube-ipvs0 does not exist"}},
		{name: "timeouts changed by someone", edit: func(f *hostFacts) { f.IPVSNode.Timeouts.TCP = 7200 },
			want: []string{"warn: IPVS tcpTimeout is 7200s, the configuration says 900s"}},
		{name: "vs/conntrack off", edit: func(f *hostFacts) { f.Sysctls["net/ipv4/vs/conntrack"] = "0" },
			want: []string{"error: net.ipv4.vs.conntrack=0"}},
		{name: "ipvs mode's own chains are neither iptables mode nor foreign", edit: func(f *hostFacts) {
			f.KubeChains[xtables.NFT] = []string{"IPv4 nat/KUBE-SERVICES", "IPv4 filter/KUBE-IPVS-FILTER"}
			f.ForeignRules = map[xtables.Backend][]string{xtables.NFT: {
				"IPv4 nat: -A KUBE-SERVICES -s 127.0.0.0/8 -j RETURN (no kube-proxy comment)",
				"IPv4 nat: -A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT (no kube-proxy comment)",
				"IPv6 nat: -A KUBE-SERVICES -s ::1/128 -j RETURN (no kube-proxy comment)",
				"IPv4 nat: -A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT (no kube-proxy comment)",
				"IPv4 nat: -A KUBE-SERVICES -d 198.19.0.10/32 -j DNAT --to-destination 198.18.1.99:8080 (rewrites addresses in a dispatch chain)",
			}}
		}, want: []string{"error: 1 rules in kube-proxy's chains of the nft backend that kube-proxy does not write (another program's, or injected): they can redirect or open service traffic. First: IPv4 nat: -A KUBE-SERVICES -d 198.19.0.10/32 -j DNAT"},
			not: []string{"several proxy modes"}},
		{name: "ipvs mode on nft, kube-proxy chains in legacy", edit: func(f *hostFacts) {
			f.KubeChains[xtables.NFT] = []string{"IPv4 nat/KUBE-SERVICES"}
			f.KubeChains[xtables.Legacy] = []string{"IPv4 nat/KUBE-SERVICES"}
		}, want: []string{"error: the running proxy (ipvs mode) uses the nft backend but the legacy backend holds kube-proxy chains",
			"warn: rules of several proxy modes at once (iptables, ipvs)"}},
		{name: "scheduler module cannot be told", edit: func(f *hostFacts) { f.IPVSNode.Modules["rr"] = modUnknown },
			want: []string{`warn: ipvs.scheduler "rr": module ip_vs_rr is not loaded and this kernel's module list cannot be read`}},
		{name: "ipvs leftovers after a switch to nftables mode", edit: func(f *hostFacts) {
			f.RunningMode, f.RunningBackend = "nftables", ""
			f.NFTables = []string{"ip kube-proxy"}
		}, want: []string{"warn: ipvs mode's leftovers while the node runs nftables mode: interface kube-ipvs0, 2 ipsets (KUBE-CLUSTER-IP, KUBE-IPVS-IPS), 1 virtual servers of kube-proxy's"},
			not: []string{"ipvs.scheduler"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := ipvsNodeFacts()
			tc.edit(&f)
			var lines []string
			for _, fd := range diagnose(f) {
				lines = append(lines, fd.Level+": "+fd.Text)
			}
			all := strings.Join(lines, "\n")
			for _, w := range tc.want {
				if !strings.Contains(all, w) {
					t.Errorf("findings lack %q:\n%s", w, all)
				}
			}
			for _, n := range tc.not {
				if strings.Contains(all, n) {
					t.Errorf("findings have %q:\n%s", n, all)
				}
			}
		})
	}
}

// TestPrintIPVS: the facts part of the report.
func TestPrintIPVS(t *testing.T) {
	var b strings.Builder
	printIPVS(func(format string, args ...any) {
		b.WriteString(strings.TrimRight(fmt.Sprintf(format, args...), " ") + "\n")
	}, ipvsNodeFacts().IPVSNode)
	for _, want := range []string{
		"IPVS: 2 virtual servers\n",
		"TCP 192.0.2.80:80", "foreign\n",
		"TCP 198.19.0.10:80", "2 real servers, 1 terminating (weight 0)  kube-proxy's\n",
		"IPVS timeouts: tcp 900s, tcpfin 120s, udp 300s\n",
		"kube-ipvs0: present, 3 addresses\n",
		"IPVS schedulers without a module in this kernel: mh\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
}

// TestPrintIPVSObjects: kube-proxy's IPVS objects are "leftovers" only
// on a node that does not run ipvs mode.
func TestPrintIPVSObjects(t *testing.T) {
	for _, tc := range []struct {
		name       string
		edit       func(*hostFacts)
		want, nots string
	}{
		{name: "ipvs mode running", edit: func(*hostFacts) {},
			want: `ipvs mode's objects (in use): interface "kube-ipvs0", 2 ipsets, 1 virtual servers`, nots: "leftovers"},
		{name: "ipvs mode configured, nothing answers", edit: func(f *hostFacts) { f.RunningMode, f.RunningBackend, f.Mode = "", "", "ipvs" },
			want: "ipvs mode's objects (in use):", nots: "leftovers"},
		{name: "iptables mode running", edit: func(f *hostFacts) { f.RunningMode = "iptables" },
			want: `IPVS leftovers: interface "kube-ipvs0", 2 ipsets, 1 virtual servers`, nots: "in use"},
		{name: "nftables mode, none left", edit: func(f *hostFacts) { f.RunningMode, f.IPVS = "nftables", kipvs.Leftovers{IPVSChecked: true} },
			want: "IPVS leftovers: none", nots: "in use"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := ipvsNodeFacts()
			tc.edit(&f)
			var b strings.Builder
			printFacts(&b, f, nil)
			if !strings.Contains(b.String(), tc.want) {
				t.Errorf("report lacks %q:\n%s", tc.want, b.String())
			}
			if strings.Contains(b.String(), tc.nots) {
				t.Errorf("report says %q:\n%s", tc.nots, b.String())
			}
		})
	}
}

// TestSchedulerModules: loaded, built in, loadable and missing modules
// told apart from /sys/module and the kernel's module lists.
func TestSchedulerModules(t *testing.T) {
	root := t.TempDir()
	mk := func(p, text string) {
		p = filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mk("sys/module/ip_vs_rr/refcnt", "1\n")
	mk("lib/modules/6.1.0-28-amd64/modules.builtin", "kernel/net/netfilter/ipvs/ip_vs_wrr.ko\n")
	mk("lib/modules/6.1.0-28-amd64/modules.dep", "kernel/net/netfilter/ipvs/ip_vs_sh.ko.xz: kernel/net/netfilter/ipvs/ip_vs.ko.xz\nkernel/net/netfilter/ipvs/ip_vs_lc.ko: kernel/net/netfilter/ipvs/ip_vs.ko\n")
	got := schedulerModules(root, "6.1.0-28-amd64")
	for s, want := range map[string]string{"rr": modLoaded, "wrr": modBuiltin, "sh": modAvailable, "lc": modAvailable, "mh": modMissing, "wlc": modMissing} {
		if got[s] != want {
			t.Errorf("%s: %q, want %q", s, got[s], want)
		}
	}
	// Without the kernel's module lists, what is not loaded is unknown,
	// not missing.
	got = schedulerModules(root, "6.99.0-other")
	for s, want := range map[string]string{"rr": modLoaded, "wrr": modUnknown, "mh": modUnknown} {
		if got[s] != want {
			t.Errorf("without modules.dep, %s: %q, want %q", s, got[s], want)
		}
	}
}
