package nftables

import (
	"net/netip"
	"testing"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/kernel/nft/nfttest"
	"github.com/kproxy/kproxy/internal/model"
)

// TestNewOptions: one family's options as the configuration gives them,
// nftables' own masquerade bit included.
func TestNewOptions(t *testing.T) {
	c := config.NewOptions().Config
	c.Mode = config.ModeNFTables
	c.ClusterCIDR = "198.18.128.0/17,fd00:18:1::/48"
	c.BindAddress = "fd00:18::10"
	bit := int32(9)
	c.NFTables.MasqueradeBit = &bit
	o := NewOptions(c, model.IPv6)
	if o.Family != model.IPv6 || o.TableName != DefaultTableName || o.MasqueradeBit != 9 ||
		len(o.NodeIPs) != 1 || o.NodeIPs[0] != netip.MustParseAddr("fd00:18::10") ||
		len(o.LocalDetect.ClusterCIDRs) != 1 || o.LocalDetect.ClusterCIDRs[0] != netip.MustParsePrefix("fd00:18:1::/48") {
		t.Errorf("IPv6 options: %+v", o)
	}
	if o4 := NewOptions(c, model.IPv4); len(o4.NodeIPs) != 0 {
		t.Errorf("IPv4 options take the IPv6 bindAddress: %+v", o4)
	}
}

// TestNewProxierRefuses: no family, or no nf_tables, is refused.
func TestNewProxierRefuses(t *testing.T) {
	if _, err := NewProxier(Options{}, Handles{NFT: nfttest.New()}); err == nil {
		t.Error("options without a family were accepted")
	}
	if _, err := NewProxier(Options{Family: model.IPv4}, Handles{}); err == nil {
		t.Error("no nf_tables interface was accepted")
	}
	if _, err := NewProxier(Options{Family: model.IPv4}, Handles{NFT: nfttest.New()}); err != nil {
		t.Errorf("IPv4 over the fake: %v", err)
	}
}
