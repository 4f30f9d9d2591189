package node

// Addresses: 198.18.0.0/16 nodes and pods, 198.19.0.0/16 services,
// fd00::/8 IPv6; 203.0.113.9 and 2001:db8::9 stand for "outside".

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/trace"
)

func TestFindModeFromRulesFiles(t *testing.T) {
	for _, tc := range []struct {
		name, text, configured, want string
	}{
		{"nft listing", "table ip kube-proxy {\n}\n", "", config.ModeNFTables},
		{"iptables-save", "*nat\n:KUBE-SERVICES - [0:0]\nCOMMIT\n", "", config.ModeIPTables},
		{"ipvsadm beside iptables-save", "-A -t 198.19.0.10:80 -s rr\n*nat\nCOMMIT\n", "", config.ModeIPVS},
		{"ipset save", "create KUBE-CLUSTER-IP hash:ip,port family inet\n", "", config.ModeIPVS},
		{"the configured mode wins", "*nat\nCOMMIT\n", config.ModeNFTables, config.ModeNFTables},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "rules")
			if err := os.WriteFile(path, []byte(tc.text), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := FindMode(context.Background(), tc.configured, []string{path}, false)
			if err != nil || got != tc.want {
				t.Errorf("FindMode = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	if _, err := FindMode(context.Background(), "kernelspace", nil, false); !errors.Is(err, ErrMode) {
		t.Errorf("FindMode(kernelspace) = %v, want ErrMode", err)
	}
	if got, err := FindMode(context.Background(), "", nil, false); err != nil || got != config.ModeNFTables {
		t.Errorf("FindMode without rules = %q, %v; want nftables (the rendered example)", got, err)
	}
}

func TestFamilySection(t *testing.T) {
	text := "# IPv4: a\n*nat\nv4\n# IPv6: b\n*nat\nv6\n"
	if got, want := FamilySection(text, model.IPv6), "# IPv6: b\n*nat\nv6\n"; got != want {
		t.Errorf("IPv6 section = %q, want %q", got, want)
	}
	if got, want := FamilySection(text, model.IPv4), "# IPv4: a\n*nat\nv4\n"; got != want {
		t.Errorf("IPv4 section = %q, want %q", got, want)
	}
	if plain := "*nat\nx\n"; FamilySection(plain, model.IPv6) != plain {
		t.Errorf("text without family headers is not kept whole")
	}
}

func TestSource(t *testing.T) {
	a := netip.MustParseAddr
	local := []netip.Addr{a("127.0.0.1"), a("198.18.0.10"), a("fd00:18::10")}
	for _, tc := range []struct {
		name string
		p    trace.Packet
		want netip.AddrPort
	}{
		{"given", trace.Packet{Src: a("198.18.129.5"), SrcPort: 1234, Dst: a("198.19.0.10")}, netip.MustParseAddrPort("198.18.129.5:1234")},
		{"from the node", trace.Packet{Dst: a("198.19.0.10")}, netip.MustParseAddrPort("198.18.0.10:40000")},
		{"from the node, IPv6", trace.Packet{Dst: a("fd00:19::17")}, netip.MustParseAddrPort("[fd00:18::10]:40000")},
		{"from outside", trace.Packet{Dst: a("198.19.0.10"), IIF: "eth0"}, netip.MustParseAddrPort("203.0.113.9:40000")},
		{"from outside, IPv6", trace.Packet{Dst: a("fd00:19::17"), IIF: "eth0"}, netip.MustParseAddrPort("[2001:db8::9]:40000")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := Source(tc.p, local)
			if got := netip.AddrPortFrom(p.Src, p.SrcPort); got != tc.want {
				t.Errorf("source %s, want %s", got, tc.want)
			}
		})
	}
}
