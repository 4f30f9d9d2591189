package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"

	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/kernel/nft/nfnetlink"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy/iptables"
	"github.com/kproxy/kproxy/internal/proxy/nftables"
	iptrace "github.com/kproxy/kproxy/internal/trace/iptables"
)

// traceIPTables tells whether trace walks iptables rules: --proxy-mode
// iptables says so; a --rules file in iptables-save syntax too; with
// --live and no --proxy-mode, iptables unless this node has the nftables
// mode's table. Without any of these, trace keeps to nftables mode.
func traceIPTables(ctx context.Context, o *config.Options, tf traceFlags) (bool, error) {
	switch o.Config.Mode {
	case config.ModeIPTables:
		return true, nil
	case config.ModeNFTables:
		return false, nil
	case "":
	default:
		return false, usageError{fmt.Errorf("trace follows nftables, iptables or ipvs mode, not --proxy-mode %s", o.Config.Mode)}
	}
	switch {
	case len(tf.rules) > 0:
		b, err := readRules(tf.rules)
		if err != nil {
			return false, err
		}
		return looksLikeIPTablesSave(b), nil
	case tf.live:
		iface, err := nfnetlink.NewNetlink()
		if err != nil {
			return true, nil // no nf_tables at all: not nftables mode
		}
		defer iface.Close()
		exists, err := iface.TableExists(ctx, nft.IPv4, nftables.DefaultTableName)
		return err == nil && !exists, nil
	}
	return false, nil
}

// looksLikeIPTablesSave: iptables-save and restore input start tables with
// "*name" lines; nft text never has a line starting with '*'.
func looksLikeIPTablesSave(text string) bool {
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "*") {
			return true
		}
	}
	return false
}

// iptablesRuleset builds the iptables ruleset of the destination's family:
// from this node's kernel (the backend kproxy would choose), a file, or a
// snapshot rendered as a fresh node's first sync.
func iptablesRuleset(ctx context.Context, errOut io.Writer, o *config.Options, tf traceFlags, dst netip.Addr, local []netip.Addr) (*iptrace.Ruleset, []netip.Addr, error) {
	fam := model.FamilyOf(dst)
	var data string
	switch {
	case tf.live:
		out, err := liveIPTablesSave(ctx, errOut, o, fam)
		if err != nil {
			return nil, nil, err
		}
		data = out
	case len(tf.rules) > 0:
		b, err := readRules(tf.rules)
		if err != nil {
			return nil, nil, err
		}
		data = b
	default:
		snap, err := loadSnapshot(errOut, o, tf.file)
		if err != nil {
			return nil, nil, err
		}
		var st *model.State
		for _, s := range snap.States {
			if s.Family == fam {
				st = s
			}
		}
		if st == nil {
			return nil, nil, fmt.Errorf("the snapshot has no %s services", fam)
		}
		if len(local) == 0 && snap.Node != nil {
			local = snap.Node.Addresses
		}
		opts := iptables.NewOptions(o.Config, fam, snap.NodeName)
		opts.MaxChainsPerRestore = -1
		cfg := opts.RenderConfig(snap.Node, local)
		in := &iptables.Input{State: st, NodeName: snap.NodeName, Zone: snap.Node.Zone(), Full: true,
			Changed: sets.New[model.ServicePortName](), Existing: &iptables.Existing{}}
		data = iptables.Render(cfg, in, iptables.NewApplied()).Text()
	}
	rs, err := iptrace.Parse([]byte(data))
	if err != nil {
		return nil, nil, fmt.Errorf("parsing the iptables rules: %w", err)
	}
	if f := rs.Family(); f != 0 && (f == 4) != (fam == model.IPv4) {
		return nil, nil, errors.New("the rules are of the other IP family than --dst")
	}
	// Localhost node ports: kproxy sets route_localnet on a node whose
	// rules serve them; a rendered snapshot stands for such a node.
	rs.RouteLocalnet = !tf.live || sysctlIs("net/ipv4/conf/all/route_localnet", "1")
	return rs, local, nil
}

func sysctlIs(path, want string) bool {
	v, err := readFile("/proc/sys/" + path)
	return err == nil && strings.TrimSpace(v) == want
}
