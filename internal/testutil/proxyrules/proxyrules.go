// Package proxyrules lists, for tests, which kube-proxy rules a node's
// network namespace holds in each place a proxy mode writes them: the
// nftables mode's tables and kube-proxy's chains in each iptables backend
// and family. Mode switch tests use it to check that only the new mode's
// rules remain. It reads the kernel with the tools (nft, *-save) and
// recognizes the names itself, independently of kproxy's leftover code.
package proxyrules

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kproxy/kproxy/internal/testutil/netns"
)

// Keep says which rules belong to the mode that runs now.
type Keep struct {
	// NFTables: the nftables mode's tables (kube-proxy, kube-proxy-sN).
	NFTables bool
	// Backend: kube-proxy's chains in this iptables backend ("legacy" or
	// "nft"; "" for none).
	Backend string
}

// KubeletChains are the kubelet's chains, not kube-proxy's: they stay
// whatever mode runs. kube-proxy's iptables mode writes a copy of
// KUBE-FIREWALL too but never removes it (upstream neither).
var KubeletChains = []string{"KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT", "KUBE-MARK-DROP"}

// OthersLeft returns the rules of kube-proxy modes other than keep's in
// the namespace, one string per table or chain ("nftables ip kube-proxy",
// "iptables-legacy-save nat/KUBE-SERVICES"). Backends whose save tool is
// not installed are not looked at.
func OthersLeft(n *netns.NS, keep Keep) ([]string, error) {
	var left []string
	if !keep.NFTables {
		for _, fam := range []string{"ip", "ip6"} {
			out, err := n.Exec(10*time.Second, "nft", "list", "tables", fam)
			if err != nil {
				return nil, fmt.Errorf("nft list tables %s: %w", fam, err)
			}
			for _, l := range strings.Split(out, "\n") {
				if name, ok := strings.CutPrefix(strings.TrimSpace(l), "table "+fam+" "); ok && strings.HasPrefix(name, "kube-proxy") {
					left = append(left, "nftables "+fam+" "+name)
				}
			}
		}
	}
	for _, b := range []string{"legacy", "nft"} {
		if b == keep.Backend {
			continue
		}
		for _, bin := range []string{"iptables-" + b + "-save", "ip6tables-" + b + "-save"} {
			if netns.Missing(bin) != "" {
				continue
			}
			out, err := n.Exec(10*time.Second, bin)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", bin, err)
			}
			table := ""
			for _, l := range strings.Split(out, "\n") {
				if t, ok := strings.CutPrefix(l, "*"); ok {
					table = t
				}
				rest, ok := strings.CutPrefix(l, ":KUBE-")
				if !ok || len(strings.Fields(rest)) == 0 {
					continue
				}
				if name := "KUBE-" + strings.Fields(rest)[0]; !slices.Contains(KubeletChains, name) {
					left = append(left, bin+" "+table+"/"+name)
				}
			}
		}
	}
	return left, nil
}

// CheckOnly is OthersLeft as an error naming what is left (nil: nothing).
func CheckOnly(n *netns.NS, keep Keep) error {
	left, err := OthersLeft(n, keep)
	if err != nil {
		return err
	}
	if len(left) > 0 {
		return fmt.Errorf("rules of another mode left: %s", strings.Join(left, ", "))
	}
	return nil
}
