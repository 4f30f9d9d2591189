// Package node is `kproxy trace` below its flags: it gathers what a
// packet meets on one node, in the mode the node runs (nftables, iptables
// or ipvs), from one of three places, and traces the packet through it:
//
//   - this node's kernel (live.go: nft listings of kproxy's tables, the
//     iptables-save of the backend kproxy would choose, the IPVS table and
//     ipsets over netlink, the interfaces' addresses);
//   - saved files (saved.go: nft listings, iptables-save, ipvsadm -S and
//     ipset save output, or kproxy render's);
//   - a rendering of a cluster snapshot, which the caller does (Render):
//     rendering needs the proxy's configuration, which is the command's.
//
// Which mode, when not given, is found from the files or the node
// (mode.go); ipvs.go assembles ipvs mode's host (ipsets, virtual servers,
// the addresses that are local because of them).
package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/kernel/execer"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy"
	ipvsmode "github.com/kproxy/kproxy/internal/proxy/ipvs"
	"github.com/kproxy/kproxy/internal/proxy/nftables"
	"github.com/kproxy/kproxy/internal/trace"
	iptrace "github.com/kproxy/kproxy/internal/trace/iptables"
	nfttrace "github.com/kproxy/kproxy/internal/trace/nftables"
)

// Request is one trace.
type Request struct {
	// Mode is the configured proxy mode: config.ModeNFTables, ModeIPTables
	// or ModeIPVS; "" finds it (see FindMode).
	Mode string
	// Rules are files of saved rules (see ReadRules); Live reads this
	// node's kernel instead. Without either, Render gives the rules.
	Rules []string
	Live  bool
	// IPTablesMode is IPTABLES_MODE: which iptables backend Live reads
	// ("" as kproxy would choose).
	IPTablesMode string
	// Render renders the rules of a cluster snapshot in a mode, for the
	// destination's family.
	Render func(mode string, fam v1.IPFamily, local []netip.Addr) (*Rendered, error)
	// Packet is the packet; a zero Src is chosen (see Source).
	Packet trace.Packet
	// Local are the node's addresses as given; none: the snapshot's
	// node's, or with Live this host's.
	Local []netip.Addr
	// Log receives notes on what was read ("Reading iptables-legacy-save
	// (...)").
	Log io.Writer
}

// Rendered is the rules a snapshot gives a fresh node at its first sync.
type Rendered struct {
	// Text is the rules: nft text of both families (nftables mode), or
	// iptables-restore input of the family (iptables and ipvs modes).
	Text string
	// IPVS is ipvs mode's rendering: its ipsets, virtual servers and
	// kube-ipvs0 addresses.
	IPVS *ipvsmode.Plan
	// NodeAddrs are the snapshot's node's addresses.
	NodeAddrs []netip.Addr
}

// Trace finds the mode if need be, reads or renders the rules and traces
// the packet.
func Trace(ctx context.Context, req Request) (*trace.Result, error) {
	mode, err := FindMode(ctx, req.Mode, req.Rules, req.Live)
	if err != nil {
		return nil, err
	}
	switch mode {
	case config.ModeIPVS:
		return traceIPVS(ctx, req)
	case config.ModeIPTables:
		return traceIPTables(ctx, req)
	}
	return traceNFTables(ctx, req)
}

func traceNFTables(ctx context.Context, req Request) (*trace.Result, error) {
	text, local, err := rules(ctx, req, config.ModeNFTables)
	if err != nil {
		return nil, err
	}
	rs, err := nfttrace.ParseNFT(text)
	if err != nil {
		return nil, fmt.Errorf("parsing the rules: %w", err)
	}
	return rs.Trace(Source(req.Packet, local), trace.Host{LocalAddrs: local})
}

func traceIPTables(ctx context.Context, req Request) (*trace.Result, error) {
	text, local, err := rules(ctx, req, config.ModeIPTables)
	if err != nil {
		return nil, err
	}
	rs, err := iptablesRuleset(text, model.FamilyOf(req.Packet.Dst), req.Live)
	if err != nil {
		return nil, err
	}
	return rs.Trace(Source(req.Packet, local), trace.Host{LocalAddrs: local})
}

// rules reads or renders the rules of nftables or iptables mode, and the
// node's addresses when the request gives none.
func rules(ctx context.Context, req Request, mode string) (text string, local []netip.Addr, err error) {
	local = req.Local
	fam := model.FamilyOf(req.Packet.Dst)
	switch {
	case req.Live && mode == config.ModeNFTables:
		text, err = NFTRules(ctx, execer.OS{}, nftables.DefaultTableName)
	case req.Live:
		text, err = IPTablesSave(ctx, req.Log, req.IPTablesMode, fam)
	case len(req.Rules) > 0:
		text, err = ReadRules(req.Rules)
	default:
		var r *Rendered
		if r, err = req.Render(mode, fam, local); err != nil {
			return "", nil, err
		}
		text = r.Text
		if len(local) == 0 {
			local = r.NodeAddrs
		}
	}
	if err == nil && req.Live && len(local) == 0 {
		local, err = proxy.LocalAddrs()
	}
	return text, local, err
}

// iptablesRuleset parses the rules of one family.
func iptablesRuleset(text string, fam v1.IPFamily, live bool) (*iptrace.Ruleset, error) {
	rs, err := iptrace.Parse([]byte(text))
	if err != nil {
		return nil, fmt.Errorf("parsing the iptables rules: %w", err)
	}
	if f := rs.Family(); f != 0 && (f == 4) != (fam == model.IPv4) {
		return nil, errors.New("the iptables rules are of the other IP family than the destination")
	}
	// Localhost node ports: kproxy sets route_localnet on a node whose
	// rules serve them; a rendered snapshot stands for such a node.
	rs.RouteLocalnet = !live || RouteLocalnet()
	return rs, nil
}

// DefaultSrcPort is the source port of a packet given without one.
const DefaultSrcPort = 40000

// Source gives p a source when it has none: the node's own address of the
// destination's family for a packet the node sends (no input interface),
// else a documentation address standing for "somewhere outside".
func Source(p trace.Packet, local []netip.Addr) trace.Packet {
	if p.Src.IsValid() {
		return p
	}
	p.SrcPort = DefaultSrcPort
	if p.IIF == "" {
		for _, a := range local {
			if a.Is4() == p.Dst.Is4() && !a.IsLoopback() {
				p.Src = a
				return p
			}
		}
	}
	if p.Dst.Is4() {
		p.Src = netip.MustParseAddr("203.0.113.9")
	} else {
		p.Src = netip.MustParseAddr("2001:db8::9")
	}
	return p
}
