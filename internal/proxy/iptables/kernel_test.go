package iptables

// Kernel tests: the proxier's restores go to the real iptables-restore of
// each backend and family, in a network namespace per case. They check
// what only the real tools can: that the input is accepted, that the jump
// rules are recognised in iptables-save's output (a second full sync adds
// none), and that rule deletions by text find the kernel's rules. Traffic
// through these rules is tested in test/kernel.

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy"
	"github.com/kproxy/kproxy/internal/proxy/flowtest"
	"github.com/kproxy/kproxy/internal/testutil/fixtures"
	"github.com/kproxy/kproxy/internal/testutil/netns"
)

func TestKernelRestore(t *testing.T) {
	netns.Require(t)
	c := flowtest.Example(t, "node-a")
	web := fixtures.SPName("web-clusterip", "http", model.TCP)
	noEP := fixtures.SPName("no-endpoints", "http", model.TCP)
	for _, b := range xtables.Backends {
		for _, f := range []v1.IPFamily{model.IPv4, model.IPv6} {
			for _, compact := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%s/compact=%v", b, f, compact), func(t *testing.T) {
					ns := netns.New(t, netns.RandomID(4), "ipt")
					ipt, err := xtables.New(b, xfamily(f), xtables.WithCommandPrefix("ip", "netns", "exec", ns.Name))
					if errors.Is(err, xtables.ErrNotInstalled) {
						t.Skip(err)
					}
					if err != nil {
						t.Fatal(err)
					}
					ctx := context.Background()
					o := exampleOptions(f)
					o.Hostname = c.Node.Name
					// A small chain budget, so that the nft backend's split
					// restores run too.
					o.MaxChainsPerRestore = 8
					o.CompactLayout = compact
					st := c.States[f].Clone()
					p := mustNewProxier(t, o, Handles{IPTables: ipt})
					sync := func(full bool, changed ...model.ServicePortName) {
						t.Helper()
						if _, err := p.Sync(ctx, &proxy.Request{State: st, Changed: sets.New(changed...), Node: c.Node, Full: full}); err != nil {
							t.Fatalf("sync(full=%v): %v", full, err)
						}
					}
					save := func() string {
						t.Helper()
						var out []string
						for _, table := range []string{tableFilter, tableNAT} {
							data, err := ipt.Save(ctx, table)
							if err != nil {
								t.Fatal(err)
							}
							for _, l := range strings.Split(string(data), "\n") {
								// Counters and the header's date change.
								if strings.HasPrefix(l, "#") || strings.HasPrefix(l, ":") {
									l, _, _ = strings.Cut(l, " [")
								}
								if !strings.HasPrefix(l, "#") {
									out = append(out, l)
								}
							}
						}
						return strings.Join(out, "\n")
					}
					sync(true)
					first := save()
					for table, lines := range JumpRuleLines() {
						data, _ := ipt.Save(ctx, table)
						for _, l := range lines {
							if n := strings.Count(string(data), l+"\n"); n != 1 {
								t.Errorf("%s: %q appears %d times in iptables-save", table, l, n)
							}
						}
					}
					sync(true)
					if again := save(); again != first {
						t.Errorf("a second full sync changed the kernel's rules:\n--- first\n%s\n--- second\n%s", first, again)
					}
					if f == model.IPv4 {
						// Partial syncs: rules deleted by their text.
						st.Endpoints[web] = st.Endpoints[web][:1]
						sync(false, web)
						st.Endpoints[noEP] = []*model.Endpoint{fixtures.Endpoint("198.18.129.99", 8080, true, nil)}
						sync(false, noEP)
						delete(st.Services, web)
						delete(st.Endpoints, web)
						sync(false, web)
						nat, _ := ipt.Save(ctx, tableNAT)
						filter, _ := ipt.Save(ctx, tableFilter)
						for _, gone := range []string{"demo/web-clusterip", "demo/no-endpoints:http has no endpoints"} {
							if strings.Contains(string(nat)+string(filter), gone) {
								t.Errorf("rules of %q are still there", gone)
							}
						}
						if !strings.Contains(string(nat), `"demo/no-endpoints:http cluster IP"`) {
							t.Errorf("no-endpoints gained an endpoint but has no cluster IP rule")
						}
						// A full sync after the partial ones rewrites nothing
						// that matters: the same chains exist.
						before := chainsOf(nat)
						sync(true)
						nat, _ = ipt.Save(ctx, tableNAT)
						if after := chainsOf(nat); !slices.Equal(before, after) {
							t.Errorf("chains after partial syncs %v differ from a full sync's %v", before, after)
						}
					}
				})
			}
		}
	}
}

func chainsOf(save []byte) []string {
	var out []string
	for _, l := range strings.Split(string(save), "\n") {
		if strings.HasPrefix(l, ":") {
			name, _, _ := strings.Cut(l[1:], " ")
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// TestNFTRestoreTestResolvesNoChain pins what the proxier's checks of a
// split trial rely on (proxier.go, Request.Trial): iptables-nft-restore
// --test resolves no chain (an -A to a chain that does not exist and a
// jump to one pass; only the lines' own syntax and options are checked),
// so each restore of a split plan checked alone is the same check as the
// whole plan's; iptables-legacy-restore --test resolves jumps against the
// kernel, so a legacy trial is not split. Then a trial of the example
// (split by a budget of 8 chains for nft) on a fresh namespace passes and
// leaves no chain behind, in each backend.
func TestNFTRestoreTestResolvesNoChain(t *testing.T) {
	netns.Require(t)
	// A private xtables lock (iptables and kproxy both read
	// XTABLES_LOCKFILE): the host's /run/xtables.lock is taken by other
	// tests, and waiting for them is not what this test is about.
	t.Setenv("XTABLES_LOCKFILE", filepath.Join(t.TempDir(), "xtables.lock"))
	c := flowtest.Example(t, "node-a")
	for _, b := range xtables.Backends {
		t.Run(string(b), func(t *testing.T) {
			ns := netns.New(t, netns.RandomID(4), "ipt")
			ipt, err := xtables.New(b, xtables.IPv4, xtables.WithCommandPrefix("ip", "netns", "exec", ns.Name))
			if errors.Is(err, xtables.ErrNotInstalled) {
				t.Skip(err)
			}
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			check := func(in string) error {
				return ipt.Restore(ctx, []byte(in), xtables.RestoreOptions{NoFlush: true, Test: true})
			}
			missingJump := "*nat\n:KPROXY-TEST-A - [0:0]\n-A KPROXY-TEST-A -j KPROXY-TEST-MISSING\nCOMMIT\n"
			missingChain := "*nat\n-A KPROXY-TEST-MISSING -j ACCEPT\nCOMMIT\n"
			badOption := "*nat\n:KPROXY-TEST-A - [0:0]\n-A KPROXY-TEST-A -m statistic --mode random --probability 2 -j ACCEPT\nCOMMIT\n"
			if err := check(badOption); err == nil {
				t.Errorf("--test accepted a rule with a bad option: the check checks nothing")
			}
			switch b {
			case xtables.NFT:
				for name, in := range map[string]string{"a jump to a missing chain": missingJump, "an -A to a missing chain": missingChain} {
					if err := check(in); err != nil {
						t.Errorf("iptables-nft-restore --test refused %s (%v): it resolves chains now, and the restores of a split trial can no longer be checked one by one", name, err)
					}
				}
			case xtables.Legacy:
				if err := check(missingJump); err == nil {
					t.Errorf("iptables-legacy-restore --test accepted a jump to a missing chain: a legacy trial need not be unsplit any more")
				}
			}

			o := exampleOptions(model.IPv4)
			o.Hostname = c.Node.Name
			o.MaxChainsPerRestore = 8
			p := mustNewProxier(t, o, Handles{IPTables: ipt})
			st := c.States[model.IPv4].Clone()
			if _, err := p.Sync(ctx, &proxy.Request{State: st, Changed: sets.KeySet(st.Services), Node: c.Node, Full: true, Trial: true}); err != nil {
				t.Fatalf("trial of the example on a fresh node: %v", err)
			}
			nat, err := ipt.Save(ctx, tableNAT)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(nat), "KUBE-") {
				t.Errorf("a trial left rules behind:\n%s", nat)
			}
		})
	}
}
