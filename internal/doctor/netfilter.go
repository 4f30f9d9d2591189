package doctor

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/kernel/nft/nfnetlink"
	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/proxy/nftables"
)

// This file is doctor's view of the other netfilter users on the host
// (firewalld, docker, a NAS vendor's scripts): their nftables base chains
// and their chains hooked into the iptables built-in chains kube-proxy
// uses, and which of them can break service traffic.
//
// Why a foreign drop matters: every base chain on a hook sees the packet,
// in priority order, and a drop in any of them is final; kproxy's accept
// in its own chain does not spare the packet from another table's chain.
// So a forward-hook chain with policy drop drops the service traffic
// forwarded to pods unless it accepts it itself (docker's FORWARD DROP is
// the classic). In iptables mode the same holds across the two backends:
// the rules of both run.

// foreignUsers is what doctor sees of other netfilter users.
type foreignUsers struct {
	// BaseChains are nftables base chains outside kproxy's tables and
	// outside iptables-nft's (those are reported with the iptables
	// backends, in their terms).
	BaseChains []nfnetlink.BaseChain
	BaseErr    error
	// Hooked are, per backend, the built-in chains kube-proxy hooks
	// into with their policy and the non-KUBE chains they jump to.
	Hooked map[xtables.Backend][]hookedChain
}

// hookedChain is one built-in chain of one backend, family and table.
type hookedChain struct {
	Family  xtables.Family
	Table   string
	Chain   string
	Policy  string
	Targets []string // user chains it jumps to that are not kube-proxy's
}

func (h hookedChain) String() string {
	s := fmt.Sprintf("%s %s/%s policy %s", h.Family, h.Table, h.Chain, h.Policy)
	if len(h.Targets) > 0 {
		s += " -> " + strings.Join(h.Targets, ", ")
	}
	return s
}

// kubeHooks are the built-in chains kube-proxy hooks into, by table.
var kubeHooks = map[string][]string{
	"filter": {"INPUT", "FORWARD", "OUTPUT"},
	"nat":    {"PREROUTING", "OUTPUT", "POSTROUTING"},
}

// gatherForeign reads the host's other netfilter users (best effort).
func gatherForeign(ctx context.Context) foreignUsers {
	u := foreignUsers{Hooked: map[xtables.Backend][]hookedChain{}}
	if nl, err := nfnetlink.NewNetlink(); err != nil {
		u.BaseErr = err
	} else {
		chains, err := nl.ListBaseChains(ctx)
		_ = nl.Close()
		if err != nil {
			u.BaseErr = err
		}
		for _, c := range chains {
			ip := c.Family == nft.IPv4 || c.Family == nft.IPv6
			ours := ip && len(nftables.OurTables(nftables.DefaultTableName, []string{c.Table})) > 0
			if !ours && !(ip && isXtablesChain(c)) {
				u.BaseChains = append(u.BaseChains, c)
			}
		}
	}
	for _, b := range xtables.Backends {
		for _, fam := range xtables.Families {
			ipt, err := xtables.New(b, fam)
			if err != nil {
				continue
			}
			for _, table := range []string{"filter", "nat"} {
				data, err := ipt.Save(ctx, table)
				if err != nil {
					continue
				}
				u.Hooked[b] = append(u.Hooked[b], parseHooked(fam, table, data)...)
			}
		}
	}
	return u
}

// isXtablesChain reports whether an nftables base chain is one of
// iptables-nft's: a built-in chain (upper case) of an xtables table.
func isXtablesChain(c nfnetlink.BaseChain) bool {
	return slices.Contains(xtables.Tables, c.Table) && c.Name == strings.ToUpper(c.Name)
}

// parseHooked reads the built-in chains kube-proxy uses from one table's
// iptables-save output. A table nothing has touched has no such chains
// in iptables-nft (it creates them on first use): nothing to report.
func parseHooked(fam xtables.Family, table string, data []byte) []hookedChain {
	byName := map[string]*hookedChain{}
	var order []string
	userChains := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, ":"):
			f := strings.Fields(line[1:])
			if len(f) < 2 {
				continue
			}
			if f[1] == "-" {
				userChains[f[0]] = true
				continue
			}
			if slices.Contains(kubeHooks[table], f[0]) {
				byName[f[0]] = &hookedChain{Family: fam, Table: table, Chain: f[0], Policy: f[1]}
				order = append(order, f[0])
			}
		case strings.HasPrefix(line, "-A "):
			f := strings.Fields(line)
			h := byName[f[1]]
			if h == nil {
				continue
			}
			for i := 2; i+1 < len(f); i++ {
				if (f[i] == "-j" || f[i] == "-g") && userChains[f[i+1]] && !strings.HasPrefix(f[i+1], "KUBE-") && !slices.Contains(h.Targets, f[i+1]) {
					h.Targets = append(h.Targets, f[i+1])
				}
			}
		}
	}
	out := make([]hookedChain, 0, len(order))
	for _, n := range order {
		out = append(out, *byName[n])
	}
	return out
}

// diagnoseForeign flags the other users that can break service traffic
// for the proxy mode in use (mode: the running proxy's, else the
// configured one; backend: the iptables backend it uses or would use).
func diagnoseForeign(u foreignUsers, mode string, backend xtables.Backend, iptablesModeEnv string, add func(level, format string, args ...any)) {
	if iptablesModeEnv != "" && mode == config.ModeNFTables {
		add(levelWarn, "IPTABLES_MODE=%s is set but the proxy mode is nftables: it has no effect there (it only picks the iptables backend of iptables mode)", iptablesModeEnv)
	}
	if u.BaseErr != nil {
		add(levelWarn, "could not list nftables base chains: %v", u.BaseErr)
	}
	for _, c := range u.BaseChains {
		if !c.Drop || (c.Family != nft.IPv4 && c.Family != nft.IPv6 && c.Family != "inet") {
			continue
		}
		switch c.Hook {
		case nft.HookForward, nft.HookInput, nft.HookOutput, nft.HookPrerouting:
			add(levelWarn, "nftables chain %s drops what it does not accept itself: service traffic on the %s hook is dropped there whatever kproxy accepts (a drop in any base chain is final); it must accept service and pod traffic", c, c.Hook)
		}
	}
	for _, b := range xtables.Backends {
		// Rules of the backend kproxy does not write to (in nftables
		// mode: either) run beside kproxy's rules without its accepts.
		uses := mode == config.ModeIPTables && b == backend
		for _, h := range u.Hooked[b] {
			if h.Table == "filter" && h.Chain == "FORWARD" && h.Policy == "DROP" && !uses {
				add(levelWarn, "iptables %s %s: policy DROP, and kproxy's rules are not in that backend: forwarded service traffic is dropped there unless a rule accepts it", b, h)
			}
		}
	}
}

// printForeign lists the other users.
func printForeign(p func(format string, args ...any), u foreignUsers) {
	p("other netfilter users:")
	if len(u.BaseChains) == 0 {
		p("  nftables base chains outside kproxy's tables: none")
	}
	for _, c := range u.BaseChains {
		p("  nftables %s", c)
	}
	for _, b := range xtables.Backends {
		for _, h := range u.Hooked[b] {
			if len(h.Targets) > 0 || h.Policy != "ACCEPT" {
				p("  iptables-%s %s", b, h)
			}
		}
	}
}
