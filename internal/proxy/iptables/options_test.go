package iptables

import (
	"net/netip"
	"strings"
	"testing"

	"k8s.io/utils/ptr"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/kernel/xtables/xtablestest"
	"github.com/kproxy/kproxy/internal/model"
)

// TestNewOptions: one family's options as the configuration gives them
// (bindAddress names the IPv4 node IP only; cluster CIDRs by family).
func TestNewOptions(t *testing.T) {
	c := config.NewOptions().Config
	c.Mode = config.ModeIPTables
	c.ClusterCIDR = "198.18.128.0/17,fd00:18:1::/48"
	c.BindAddress = "198.18.0.10"
	c.IPTables.LocalhostNodePorts = ptr.To(false)
	config.Defaults(c)
	o := NewOptions(c, model.IPv4, "node-a")
	if o.Family != model.IPv4 || o.Hostname != "node-a" || o.LocalhostNodePorts || o.MasqueradeBit != 14 ||
		len(o.NodeIPs) != 1 || o.NodeIPs[0] != netip.MustParseAddr("198.18.0.10") ||
		len(o.LocalDetect.ClusterCIDRs) != 1 || o.LocalDetect.ClusterCIDRs[0] != netip.MustParsePrefix("198.18.128.0/17") {
		t.Errorf("IPv4 options: %+v", o)
	}
	if o6 := NewOptions(c, model.IPv6, "node-a"); len(o6.NodeIPs) != 0 || o6.LocalDetect.ClusterCIDRs[0] != netip.MustParsePrefix("fd00:18:1::/48") {
		t.Errorf("IPv6 options: %+v", o6)
	}
}

// TestNewProxierRefuses: a family that is none, and iptables of the other
// family, are refused before anything is written.
func TestNewProxierRefuses(t *testing.T) {
	v4 := xtablestest.NewFake(xtables.Legacy, xtables.IPv4)
	if _, err := NewProxier(Options{Family: model.IPv6}, Handles{IPTables: v4}); err == nil || !strings.Contains(err.Error(), "IPv6 proxier given IPv4 iptables") {
		t.Errorf("IPv6 options over IPv4 iptables: %v", err)
	}
	if _, err := NewProxier(Options{Family: "IPv5"}, Handles{IPTables: v4}); err == nil {
		t.Error("an unknown family was accepted")
	}
	if _, err := NewProxier(Options{Family: model.IPv4}, Handles{}); err == nil {
		t.Error("no iptables was accepted")
	}
	if _, err := NewProxier(Options{Family: model.IPv4}, Handles{IPTables: v4}); err != nil {
		t.Errorf("IPv4 over IPv4 iptables: %v", err)
	}
}
