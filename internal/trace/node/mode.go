package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/kernel/nft/nfnetlink"
	ipvsmode "github.com/kproxy/kproxy/internal/proxy/ipvs"
	"github.com/kproxy/kproxy/internal/proxy/nftables"
	"github.com/kproxy/kproxy/internal/trace/savedstate"
)

// ErrMode is wrapped by FindMode's error for a mode trace does not
// follow.
var ErrMode = errors.New("unsupported proxy mode")

// FindMode is the mode a trace follows: the configured one; else that of
// the --rules files (ipvsadm or ipset save lines: ipvs; iptables-save
// syntax: iptables; else nftables); else with live, ipvs on a node with
// kube-ipvs0, nftables on one with the nftables mode's table, iptables
// otherwise; else nftables.
func FindMode(ctx context.Context, configured string, rules []string, live bool) (string, error) {
	switch configured {
	case config.ModeNFTables, config.ModeIPTables, config.ModeIPVS:
		return configured, nil
	case "":
	default:
		return "", fmt.Errorf("%w: trace follows nftables, iptables or ipvs mode, not --proxy-mode %s", ErrMode, configured)
	}
	switch {
	case len(rules) > 0:
		text, err := ReadRules(rules)
		if err != nil {
			return "", err
		}
		p, err := savedstate.Split(text)
		if err != nil {
			return "", err
		}
		switch {
		case p.IPVSAdm != "" || p.IPSet != "":
			return config.ModeIPVS, nil
		case LooksLikeIPTablesSave(text):
			return config.ModeIPTables, nil
		}
	case live:
		_, err := net.InterfaceByName(ipvsmode.DummyDevice)
		dummy := err == nil
		iface, err := nfnetlink.NewNetlink()
		if err != nil {
			// No nf_tables at all: not nftables mode.
			if dummy {
				return config.ModeIPVS, nil
			}
			return config.ModeIPTables, nil
		}
		defer iface.Close()
		exists, err := iface.TableExists(ctx, nft.IPv4, nftables.DefaultTableName)
		switch {
		case err == nil && exists:
			return config.ModeNFTables, nil
		case dummy:
			return config.ModeIPVS, nil
		case err == nil:
			return config.ModeIPTables, nil
		}
	}
	return config.ModeNFTables, nil
}

// LooksLikeIPTablesSave: iptables-save and restore input start tables
// with "*name" lines; nft text never has a line starting with '*'.
func LooksLikeIPTablesSave(text string) bool {
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "*") {
			return true
		}
	}
	return false
}
