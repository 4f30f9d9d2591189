package main

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/model"
)

// TestIPVSModeGate: ipvs mode is accepted while the KubeProxyIPVS gate is
// on (its default in 1.37), and refused with the gate named when it is
// off, as upstream's validation.
func TestIPVSModeGate(t *testing.T) {
	c := config.NewOptions().Config
	if err := checkSupported(c, config.ModeIPVS); err != nil {
		t.Errorf("ipvs mode: %v", err)
	}
	_, _, err := execute(t, "--proxy-mode", "ipvs", "--hostname-override", "node-a", "--feature-gates", "KubeProxyIPVS=false")
	if err == nil || !strings.Contains(err.Error(), "KubeProxyIPVS") {
		t.Fatalf("ipvs mode with KubeProxyIPVS=false: %v, want an error naming the gate", err)
	}
}

func TestIPVSRenderConfig(t *testing.T) {
	c := config.NewOptions().Config
	c.IPVS.Scheduler = "wrr"
	c.ClusterCIDR = "198.18.128.0/17,fd00:18:1::/48"
	c.BindAddress = "198.18.0.10"
	c.IPVS.ExcludeCIDRs = []string{"198.19.99.0/24", "fd00:99::/64"}
	c.IPVS.TCPTimeout = metav1.Duration{Duration: 90 * time.Second}
	rc := ipvsRenderConfig(c, model.IPv4, "node-a")
	if rc.Scheduler != "wrr" || rc.NodeName != "node-a" || len(rc.LocalDetect.ClusterCIDRs) != 1 ||
		rc.LocalDetect.ClusterCIDRs[0] != netip.MustParsePrefix("198.18.128.0/17") || len(rc.NodeIPs) != 1 {
		t.Errorf("IPv4 render config: %+v", rc)
	}
	if err := rc.Validate(); err != nil {
		t.Error(err)
	}
	if rc6 := ipvsRenderConfig(c, model.IPv6, "node-a"); len(rc6.NodeIPs) != 0 || rc6.LocalDetect.ClusterCIDRs[0].Addr().Is4() {
		t.Errorf("IPv6 render config: %+v", rc6)
	}
	ex, err := excludeCIDRs(c)
	if err != nil || len(ofFamily(ex, model.IPv4)) != 1 || len(ofFamily(ex, model.IPv6)) != 1 {
		t.Errorf("excludeCIDRs: %v, %v", ex, err)
	}
	c.IPVS.ExcludeCIDRs = []string{"not-a-cidr"}
	if _, err := excludeCIDRs(c); err == nil || !strings.Contains(err.Error(), "not-a-cidr") {
		t.Errorf("a bad excludeCIDR: %v", err)
	}
	c.IPVS.Scheduler = "nope"
	if err := ipvsRenderConfig(c, model.IPv4, "node-a").Validate(); err == nil {
		t.Error("an unknown scheduler passed validation")
	}
}

func TestIPVSLogLine(t *testing.T) {
	s := &ipvsSetup{backend: xtables.NFT, reason: "IPTABLES_MODE=nft"}
	if l := s.logLine(); !strings.Contains(l, "Using ipvs Proxier") || !strings.Contains(l, "nft") || !strings.Contains(l, "IPTABLES_MODE=nft") {
		t.Errorf("log line %q", l)
	}
	if !strings.HasPrefix(ipvsDeprecation, "The ipvs proxier has been deprecated and will be disabled by default in Kubernetes 1.40") {
		t.Errorf("deprecation message %q", ipvsDeprecation)
	}
}
