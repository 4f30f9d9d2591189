package main

import (
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/kernel/xtables"
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

func TestIPVSLogLine(t *testing.T) {
	s := &ipvsSetup{backend: xtables.NFT, reason: "IPTABLES_MODE=nft"}
	if l := s.logLine(); !strings.Contains(l, "Using ipvs Proxier") || !strings.Contains(l, "nft") || !strings.Contains(l, "IPTABLES_MODE=nft") {
		t.Errorf("log line %q", l)
	}
	if !strings.HasPrefix(ipvsDeprecation, "The ipvs proxier has been deprecated and will be disabled by default in Kubernetes 1.40") {
		t.Errorf("deprecation message %q", ipvsDeprecation)
	}
}
