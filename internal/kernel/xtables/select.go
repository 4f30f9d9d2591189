package xtables

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"k8s.io/klog/v2"
)

// EnvMode is the environment variable that forces the backend, as in
// RKE2/k3s images (k3s-root's iptables-detect.sh).
const EnvMode = "IPTABLES_MODE"

// Other returns the other backend.
func (b Backend) Other() Backend {
	if b == Legacy {
		return NFT
	}
	return Legacy
}

// kubeletChain matches the chains the kubelet (1.17 and later) creates in
// the backend it uses: KUBE-IPTABLES-HINT in mangle, and its monitoring
// canary KUBE-KUBELET-CANARY in mangle, nat and filter.
var kubeletChain = regexp.MustCompile(`(?m)^:(KUBE-IPTABLES-HINT|KUBE-KUBELET-CANARY)\b`)

// Select picks the iptables backend for kproxy's iptables mode. env is the
// value of IPTABLES_MODE: "legacy" or "nft" wins, anything else but ""
// is an error. Otherwise it decides as the kube-proxy image's
// iptables-wrapper does, so that kproxy writes its rules where the kubelet
// writes its own:
//
//  1. the kubelet's KUBE-IPTABLES-HINT or KUBE-KUBELET-CANARY chain in
//     iptables-nft-save -t mangle or ip6tables-nft-save -t mangle: nft;
//  2. one of them in the full iptables-legacy-save or ip6tables-legacy-save
//     output: legacy. Not `-t mangle`: that would make the kernel create
//     the legacy mangle table, and the next detection (ours, the
//     kubelet's image, k3s's) would count it;
//  3. more rule lines (-A) in legacy than in nft, both families together:
//     legacy;
//  4. else nft.
//
// A command that fails is skipped, as the wrapper does; only when all of
// them fail is it an error. If only one backend is installed, that one is
// chosen. Nothing is created or changed: the nft backend's -t mangle only
// prints. reason says why, for the log ("IPTABLES_MODE=legacy",
// "kubelet's KUBE-IPTABLES-HINT found in the iptables-nft mangle table",
// "42 legacy rules vs 3 nft rules").
func Select(ctx context.Context, env string, opts ...Option) (b Backend, reason string, err error) {
	switch env {
	case string(Legacy), string(NFT):
		return Backend(env), EnvMode + "=" + env, nil
	case "":
	default:
		return "", "", fmt.Errorf("xtables: %s=%q is not valid: want %q or %q, or leave it unset to detect the backend", EnvMode, env, Legacy, NFT)
	}
	o := newOptions(opts)
	tools := map[Backend][]*tool{}
	for _, b := range Backends {
		for _, f := range Families {
			t, err := newTool(b, f, o, false)
			switch {
			case err == nil:
				tools[b] = append(tools[b], t)
			case errors.Is(err, ErrNotInstalled):
				klog.V(2).InfoS("iptables binaries not found; not looking at their rules", "backend", b, "family", f, "err", err)
			default:
				return "", "", err
			}
		}
	}
	switch {
	case len(tools[Legacy]) == 0 && len(tools[NFT]) == 0:
		return "", "", fmt.Errorf("xtables: %w: neither iptables-legacy nor iptables-nft binaries found", ErrNotInstalled)
	case len(tools[NFT]) == 0:
		return Legacy, "only iptables-legacy is installed", nil
	case len(tools[Legacy]) == 0:
		return NFT, "only iptables-nft is installed", nil
	}

	var runs, failures []error
	run := func(t *tool, args ...string) string {
		out, err := t.o.exec.Run(ctx, t.argv(t.save, args...), "")
		runs = append(runs, err)
		if err != nil {
			klog.V(2).InfoS("Listing iptables rules to pick the backend failed; going on without them", "backend", t.backend, "family", t.family, "err", err)
			failures = append(failures, err)
			return ""
		}
		return out
	}
	name := func(t *tool) string { return strings.TrimSuffix(t.save[strings.LastIndex(t.save, "/")+1:], "-save") }

	for _, t := range tools[NFT] {
		if m := kubeletChain.FindStringSubmatch(run(t, "-t", "mangle")); m != nil {
			return NFT, fmt.Sprintf("kubelet's %s found in the %s mangle table", m[1], name(t)), nil
		}
	}
	legacyRules := 0
	for _, t := range tools[Legacy] {
		out := run(t)
		if m := kubeletChain.FindStringSubmatch(out); m != nil {
			return Legacy, fmt.Sprintf("kubelet's %s found in the %s rules", m[1], name(t)), nil
		}
		legacyRules += countRules(out)
	}
	nftRules := 0
	for _, t := range tools[NFT] {
		nftRules += countRules(run(t))
	}
	if len(failures) == len(runs) {
		return "", "", fmt.Errorf("xtables: cannot read any iptables rules to pick the backend: %w", errors.Join(failures...))
	}
	reason = fmt.Sprintf("%d legacy rules vs %d nft rules", legacyRules, nftRules)
	if legacyRules > nftRules {
		return Legacy, reason, nil
	}
	return NFT, reason, nil
}

// countRules counts the rule lines of iptables-save output (the wrapper's
// `grep '^-'`).
func countRules(save string) int {
	n := 0
	for _, l := range strings.Split(save, "\n") {
		if strings.HasPrefix(l, "-") {
			n++
		}
	}
	return n
}

// Leftover is one of kube-proxy's chains in one backend and family.
type Leftover struct {
	Backend Backend
	Family  Family
	Chain   Chain
}

func (l Leftover) String() string {
	return fmt.Sprintf("%s %s %s", l.Backend, l.Family, l.Chain)
}

// OtherBackendRules lists kube-proxy's chains (those FindLeftovers
// reports: kube-proxy's or kproxy's iptables or IPVS mode chains, not the
// kubelet's) in the backend that was not chosen, both families. Rules of
// both backends run, legacy ones first, so such chains can still catch
// service traffic: the proxier warns about them at start and at every
// full sync. CleanupLeftovers removes them. A family whose binaries are
// missing is skipped; other errors are returned with what was found.
func OtherBackendRules(ctx context.Context, chosen Backend, opts ...Option) ([]Leftover, error) {
	if chosen != Legacy && chosen != NFT {
		return nil, fmt.Errorf("xtables: unknown backend %q (want %q or %q)", chosen, Legacy, NFT)
	}
	other := chosen.Other()
	var out []Leftover
	var errs []error
	for _, f := range Families {
		chains, err := FindLeftovers(ctx, other, f, opts...)
		if errors.Is(err, ErrNotInstalled) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, c := range chains {
			out = append(out, Leftover{Backend: other, Family: f, Chain: c})
		}
	}
	return out, errors.Join(errs...)
}
