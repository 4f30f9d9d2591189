package compat

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/test/e2e/framework"
)

// initSysctls are the sysctls kube-proxy may write at start; compared in a
// fresh network namespace after --init-only with kubeadm's configuration.
var initSysctls = []string{
	"net/netfilter/nf_conntrack_max",
	"net/netfilter/nf_conntrack_tcp_timeout_established",
	"net/netfilter/nf_conntrack_tcp_timeout_close_wait",
	"net/netfilter/nf_conntrack_tcp_be_liberal",
	"net/netfilter/nf_conntrack_udp_timeout",
	"net/netfilter/nf_conntrack_udp_timeout_stream",
	"net/ipv4/conf/all/route_localnet",
	"net/ipv4/ip_forward",
	"net/ipv6/conf/all/forwarding",
	"net/bridge/bridge-nf-call-iptables",
}

func compareInitOnly(t *testing.T, cp *framework.ControlPlane, dir, kubeconfig string) {
	c := liveConfigs[0] // kubeadm, iptables
	var got [2]map[string]string
	for i, n := range []node{{binName: "kube-proxy", bin: upstreamBin, name: "compat-up"}, {binName: "kproxy", bin: kproxyBin, name: "compat-kp"}} {
		n.ns = framework.AddNamespace(t, "kpe2e-init")
		cp.ConnectNamespace(t, n.ns)
		c.name = "init-only"
		c.args = []string{"--init-only"}
		p := start(t, dir, kubeconfig, n, c)
		select {
		case <-p.Done():
		case <-time.After(20 * time.Second):
			// Upstream exits at once; kproxy runs on.
			t.Logf("%s --init-only still running after 20s", n.binName)
			_ = p.Stop()
		}
		got[i] = map[string]string{}
		for _, s := range initSysctls {
			out, err := framework.RunIn(context.Background(), n.ns, "cat", "/proc/sys/"+s)
			if err != nil {
				out = "unreadable"
			}
			got[i][strings.ReplaceAll(s, "/", ".")] = strings.TrimSpace(out)
		}
	}
	for _, s := range unionKeys(got[0], got[1]) {
		t.Run(s, func(t *testing.T) {
			compare(t, kindSysctl, s, s, got[0][s], got[1][s])
		})
	}
	sectionDone(kindSysctl)
}
