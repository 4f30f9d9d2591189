// Package xtables is kproxy's side of the iptables binaries: it runs one
// backend's iptables-restore and iptables-save for the iptables mode
// (Interface, New), picks the backend that mode uses (Select), and finds
// and removes what kube-proxy's iptables and IPVS modes left in the
// kernel's xtables rules (FindLeftovers, CleanupLeftovers,
// OtherBackendRules), for a node that switches modes or backends and for
// --cleanup.
//
// The iptables binaries come with two backends that program different
// kernel objects: "legacy" (iptables-legacy*, the ip_tables modules) and
// "nft" (iptables-nft*, xtables rules stored in nf_tables tables named
// nat, filter, mangle... of families ip and ip6). Plain `iptables` is one
// of them depending on the host (Debian's /etc/alternatives), and
// kube-proxy's image picks one by looking at the rules already there, so a
// node may carry rules in either. kproxy always runs a backend's explicit
// binary names.
package xtables

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// Backend is one implementation of the iptables binaries.
type Backend string

const (
	// Legacy is iptables-legacy: the ip_tables/ip6_tables kernel modules.
	Legacy Backend = "legacy"
	// NFT is iptables-nft: xtables rules inside nf_tables tables.
	NFT Backend = "nft"
)

// Backends lists both backends, legacy first.
var Backends = []Backend{Legacy, NFT}

// Family is the IP family, which picks iptables or ip6tables.
type Family string

const (
	IPv4 Family = "IPv4"
	IPv6 Family = "IPv6"
)

// Families lists both families.
var Families = []Family{IPv4, IPv6}

// ErrNotInstalled means a backend's save or restore binary is not on PATH.
// Callers treat it as "this backend cannot be checked here", not as a
// failure: a host without iptables can still run nftables mode.
var ErrNotInstalled = errors.New("iptables binaries not installed")

// binaries names the save and restore binaries of a backend and family,
// for example ip6tables-nft-save and ip6tables-nft-restore.
func binaries(b Backend, f Family) (save, restore string, err error) {
	cmd, err := command(b, f)
	if err != nil {
		return "", "", err
	}
	return cmd + "-save", cmd + "-restore", nil
}

// command names the main binary of a backend and family, for example
// ip6tables-nft.
func command(b Backend, f Family) (string, error) {
	if b != Legacy && b != NFT {
		return "", fmt.Errorf("xtables: unknown backend %q (want %q or %q)", b, Legacy, NFT)
	}
	base := "iptables"
	switch f {
	case IPv4:
	case IPv6:
		base = "ip6tables"
	default:
		return "", fmt.Errorf("xtables: unknown IP family %q", f)
	}
	return base + "-" + string(b), nil
}

// tool holds the resolved binaries of one backend and family.
type tool struct {
	backend Backend
	family  Family
	save    string
	restore string
	cmd     string // only when asked for
	o       *options
}

// newTool resolves the save and restore binaries, and with withCmd the
// main one (for --version) too.
func newTool(b Backend, f Family, o *options, withCmd bool) (*tool, error) {
	save, restore, err := binaries(b, f)
	if err != nil {
		return nil, err
	}
	cmd, _ := command(b, f)
	t := &tool{backend: b, family: f, o: o}
	var missing []string
	if withCmd {
		if t.cmd, err = o.exec.LookPath(cmd); err != nil {
			missing = append(missing, cmd)
		}
	}
	if t.save, err = o.exec.LookPath(save); err != nil {
		missing = append(missing, save)
	}
	if t.restore, err = o.exec.LookPath(restore); err != nil {
		missing = append(missing, restore)
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("xtables: %w: %s not found in $PATH (they come with the iptables package)", ErrNotInstalled, joinAnd(missing))
	}
	if len(o.prefix) > 0 {
		if _, err := o.exec.LookPath(o.prefix[0]); err != nil {
			return nil, fmt.Errorf("xtables: command prefix %q not found: %w", o.prefix[0], err)
		}
	}
	return t, nil
}

func (t *tool) argv(bin string, args ...string) []string {
	return append(append(append([]string(nil), t.o.prefix...), bin), args...)
}

// dump runs the backend's save binary without -t: it prints only the
// tables that exist. Naming a table (-t mangle) would make the legacy
// backend load and create that table, and iptables-wrapper style
// detection in kube-proxy's image counts tables, so listing must not
// change anything.
func (t *tool) dump(ctx context.Context) (string, error) {
	out, err := t.o.exec.Run(ctx, t.argv(t.save), "")
	if err != nil {
		return "", fmt.Errorf("xtables: listing %s %s rules: %w", t.backend, t.family, err)
	}
	return out, nil
}

// apply runs the restore binary with --noflush: tables and chains not
// named in the script are left as they are. One run is one kernel
// transaction per table (legacy: one table replace; nft: one batch).
func (t *tool) apply(ctx context.Context, script string) error {
	args := []string{"--noflush"}
	if t.backend == Legacy {
		// Legacy rules are replaced table by table under the xtables lock
		// that kubelet and other tools take too; wait for it rather than
		// fail. The nft backend has no such lock.
		args = append(args, "-w", "5")
	}
	if _, err := t.o.exec.Run(ctx, t.argv(t.restore, args...), script); err != nil {
		return fmt.Errorf("xtables: removing %s %s rules: %w", t.backend, t.family, err)
	}
	return nil
}

// joinAnd lists names as "a", "a and b", "a, b and c".
func joinAnd(names []string) string {
	if len(names) <= 1 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}
