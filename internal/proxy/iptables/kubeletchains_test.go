package iptables

// The kubelet's chains as upstream kube-proxy v1.37 treats them
// (pkg/proxy/iptables/proxier.go): KUBE-FIREWALL is ensured in the filter
// table of both families and hooked from INPUT and OUTPUT
// (iptablesKubeletJumpChains), its rule written only for IPv4 with
// localhost node ports; KUBE-IPTABLES-HINT is never created. The address
// plan is at the top of fixtures_test.go.

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy"
	"github.com/kproxy/kproxy/internal/proxy/flowtest"
	"github.com/kproxy/kproxy/internal/testutil/netns"
)

const kubeletMartianRule = `-A KUBE-FIREWALL -m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP`

func TestKubeletChains(t *testing.T) {
	c := flowtest.Example(t, "node-a")
	for _, tc := range []struct {
		name               string
		family             v1.IPFamily
		localhostNodePorts bool
		// kubelet is what the kubelet wrote before kproxy's first sync.
		kubelet string
		// wantRules are KUBE-FIREWALL's rules after two full syncs.
		wantRules []string
	}{{
		name: "IPv6: an empty chain, hooked", family: model.IPv6, localhostNodePorts: true,
	}, {
		name: "IPv4 with localhost node ports: upstream's copy of the rule", family: model.IPv4, localhostNodePorts: true,
		wantRules: []string{kubeletMartianRule},
	}, {
		name: "IPv4 without localhost node ports: empty, hooked", family: model.IPv4,
	}, {
		name: "IPv4 without localhost node ports: the kubelet's rule stays", family: model.IPv4,
		kubelet:   "*filter\n:KUBE-FIREWALL - [0:0]\n" + kubeletMartianRule + "\n-A INPUT -j KUBE-FIREWALL\n-A OUTPUT -j KUBE-FIREWALL\nCOMMIT\n",
		wantRules: []string{kubeletMartianRule},
	}, {
		name: "IPv6: the kubelet's empty chain and jumps are not doubled", family: model.IPv6,
		kubelet: "*filter\n:KUBE-FIREWALL - [0:0]\n-A INPUT -j KUBE-FIREWALL\n-A OUTPUT -j KUBE-FIREWALL\nCOMMIT\n",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, c, tc.family, xtables.Legacy, func(o *Options) { o.LocalhostNodePorts = tc.localhostNodePorts })
			if tc.kubelet != "" {
				if err := r.fake.Restore(context.Background(), []byte(tc.kubelet), xtables.RestoreOptions{NoFlush: true}); err != nil {
					t.Fatal(err)
				}
			}
			r.mustSync(true)
			r.mustSync(true)
			if got := r.fake.Rules(tableFilter, chainKubeletFirewall); !slices.Equal(got, tc.wantRules) {
				t.Errorf("KUBE-FIREWALL rules = %q, want %q\n%s", got, tc.wantRules, r.fake.Dump())
			}
			if !slices.Contains(r.fake.Chains(tableFilter), chainKubeletFirewall) {
				t.Errorf("no KUBE-FIREWALL chain in filter:\n%s", r.fake.Dump())
			}
			for _, chain := range []string{"INPUT", "OUTPUT"} {
				jump := "-A " + chain + " -j KUBE-FIREWALL"
				got := r.fake.Rules(tableFilter, chain)
				n := 0
				for _, l := range got {
					if l == jump {
						n++
					}
				}
				// On a fresh node it is inserted last at the head, as
				// upstream's prepend: it comes first. A jump already
				// there stays where it is.
				if n != 1 || (tc.kubelet == "" && got[0] != jump) {
					t.Errorf("%s = %q, want one jump to KUBE-FIREWALL (first on a fresh node)", chain, got)
				}
			}
			mangle := r.fake.Chains("mangle")
			if slices.Contains(mangle, "KUBE-IPTABLES-HINT") || !slices.Contains(mangle, chainCanary) {
				t.Errorf("mangle chains = %q, want %s and no KUBE-IPTABLES-HINT (the kubelet's, upstream never writes it)", mangle, chainCanary)
			}
		})
	}
}

// TestRuleCounts: the rules Applied counts (sync_proxy_rules_iptables_total)
// are the rules in kproxy's chains of the kernel after a full sync, in
// every configuration that changes the fixed rules.
func TestRuleCounts(t *testing.T) {
	c := flowtest.Example(t, "node-a")
	for _, tc := range []struct {
		name   string
		family v1.IPFamily
		tweak  func(*Options)
	}{
		{"IPv4 defaults", model.IPv4, nil},
		{"IPv6", model.IPv6, nil},
		{"IPv4 without localhost node ports", model.IPv4, func(o *Options) { o.LocalhostNodePorts = false }},
		{"IPv4 tcp be liberal", model.IPv4, func(o *Options) { o.ConntrackTCPBeLiberal = true }},
		// Two node addresses in the CIDR: a node port jump for each.
		{"IPv4 node port CIDRs", model.IPv4, func(o *Options) { o.NodePortAddresses = []string{"198.18.0.0/24"} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, c, tc.family, xtables.Legacy, tc.tweak)
			node := *r.node
			node.Addresses = append(slices.Clip(node.Addresses), netip.MustParseAddr("198.18.0.12"))
			r.node = &node
			r.mustSync(true)
			var kernel [2]int
			for i, table := range []string{tableNAT, tableFilter} {
				for _, ch := range r.fake.Chains(table) {
					if !strings.HasPrefix(ch, "KUBE-") {
						continue
					}
					kernel[i] += len(r.fake.Rules(table, ch))
				}
			}
			nat, filter := r.p.applied.Rules()
			if nat != kernel[0] || filter != kernel[1] {
				t.Errorf("counted nat %d, filter %d; the kernel's KUBE-* chains hold nat %d, filter %d", nat, filter, kernel[0], kernel[1])
			}
		})
	}
}

// TestKernelBackendChoiceAfterSync: on a node without a kubelet, kproxy's
// own rules must not pass for the kubelet's: the backend choice (as the
// kube-proxy image's iptables-wrapper makes it, and `kproxy doctor`
// reports it) counts rules and names no kubelet chain.
func TestKernelBackendChoiceAfterSync(t *testing.T) {
	netns.Require(t)
	c := flowtest.Example(t, "node-a")
	for _, b := range xtables.Backends {
		t.Run(string(b), func(t *testing.T) {
			ns := netns.New(t, netns.RandomID(4), "ipt")
			prefix := xtables.WithCommandPrefix("ip", "netns", "exec", ns.Name)
			ipt, err := xtables.New(b, xtables.IPv4, prefix)
			if errors.Is(err, xtables.ErrNotInstalled) {
				t.Skip(err)
			}
			if err != nil {
				t.Fatal(err)
			}
			o := exampleOptions(model.IPv4)
			o.Hostname = "node-a"
			p := mustNewProxier(t, o, Handles{IPTables: ipt})
			if _, err := p.Sync(context.Background(), &proxy.Request{State: c.States[model.IPv4].Clone(), Changed: sets.New[model.ServicePortName](), Node: c.Node, Full: true}); err != nil {
				t.Fatal(err)
			}
			got, reason, err := xtables.Select(context.Background(), "", prefix)
			if err != nil {
				t.Fatal(err)
			}
			if got != b || strings.Contains(reason, "kubelet") || strings.Contains(reason, "KUBE-IPTABLES-HINT") {
				t.Errorf("after kproxy's sync in %s: Select = %s (%s), want %s by rule count", b, got, reason, b)
			}
		})
	}
}
