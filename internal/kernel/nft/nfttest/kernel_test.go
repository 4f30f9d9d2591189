package nfttest

// Conformance with the kernel: the shared cases run against nf_tables in
// fresh network namespaces (kproxy-nfttest-<random>); the fake must
// accept and reject exactly the same transactions, with the same errno.
// Needs root and nft; skipped otherwise.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/kernel/nft/nfnetlink"
)

func newNetNS(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("kernel test: needs root to create network namespaces and program nf_tables")
	}
	for _, bin := range []string{"nft", "ip"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("kernel test: %s is not installed", bin)
		}
	}
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	name := "kproxy-nfttest-" + hex.EncodeToString(rnd[:])
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "delete", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns delete %s: %v: %s", name, err, out)
		}
	})
	return name
}

func newNetlink(t *testing.T, ns string) *nfnetlink.Netlink {
	t.Helper()
	nl, err := nfnetlink.NewNetlink(nfnetlink.WithNetNSPath("/run/netns/" + ns))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nl.Close() })
	return nl
}

func TestKernelConformance(t *testing.T) {
	ns := newNetNS(t)
	nl := newNetlink(t, ns)
	ctx := context.Background()
	for _, c := range fakeCases {
		t.Run(c.name, func(t *testing.T) {
			if err := nl.DeleteTable(ctx, nft.IPv4, tbl); err != nil {
				t.Fatal(err)
			}
			if err := nl.Apply(ctx, baseTx()); err != nil {
				t.Fatalf("base state: %v", err)
			}
			tx := nft.NewTransaction(nft.IPv4, tbl)
			c.build(tx)
			err := nl.Apply(ctx, tx)
			t.Logf("kernel: %v", err)
			switch {
			case c.fakeStricter:
				if err != nil {
					t.Errorf("the kernel rejects this (%v): the case is not fake-only", err)
				}
			case c.errno == 0:
				if err != nil {
					t.Errorf("the kernel rejects a transaction the fake accepts: %v", err)
				}
			case !errors.Is(err, c.errno):
				t.Errorf("kernel error %v, the fake says %v", err, c.errno)
			case c.checkIndex:
				var oe *nft.OpError
				if !errors.As(err, &oe) || oe.Index != c.index {
					t.Errorf("kernel error %v does not name operation %d like the fake", err, c.index)
				}
			}
		})
	}
}

// listTable runs `nft list table` in a namespace, without the time left
// of elements with timeouts.
func listTable(t *testing.T, ns string, fam nft.Family, table string) string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", ns, "nft", "list", "table", string(fam), table).CombinedOutput()
	if err != nil {
		t.Fatalf("nft list table: %v: %s", err, out)
	}
	return regexp.MustCompile(` expires [0-9hmsd]+`).ReplaceAllString(string(out), "")
}

// sortBlocks sorts the set, map and chain blocks of a table listing: nft
// lists objects in creation order, the fake's Dump creates them sorted.
// It also drops the "size 65535" the kernel gives a set for good once an
// "update @set" rule has used it: history the dump cannot carry.
func sortBlocks(listing string) string {
	listing = regexp.MustCompile(`(?m)^\t\tsize 65535\n`).ReplaceAllString(listing, "")
	lines := strings.Split(listing, "\n")
	var head, blocks []string
	var cur []string
	for _, l := range lines {
		switch {
		case cur != nil:
			cur = append(cur, l)
			if l == "\t}" {
				blocks = append(blocks, strings.Join(cur, "\n"))
				cur = nil
			}
		case strings.HasPrefix(l, "\tset ") || strings.HasPrefix(l, "\tmap ") || strings.HasPrefix(l, "\tchain "):
			cur = []string{l}
		case l == "":
		default:
			head = append(head, l)
		}
	}
	slices.Sort(blocks)
	return strings.Join(head, "\n") + "\n" + strings.Join(blocks, "\n")
}

// For every transaction the fake accepts, its Dump fed to nft -f must
// give the kernel the same table as the transactions themselves.
func TestKernelDumpReproducesState(t *testing.T) {
	direct, fromDump := newNetNS(t), newNetNS(t)
	nl := newNetlink(t, direct)
	ex, err := nft.NewExec("", nft.WithCommandPrefix("ip", "netns", "exec", fromDump))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, c := range fakeCases {
		if c.errno != 0 {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			for _, del := range []nft.Interface{nl, ex} {
				if err := del.DeleteTable(ctx, nft.IPv4, tbl); err != nil {
					t.Fatal(err)
				}
			}
			f := New()
			tx := nft.NewTransaction(nft.IPv4, tbl)
			c.build(tx)
			for _, tx := range []*nft.Transaction{baseTx(), tx} {
				if err := f.Apply(ctx, tx); err != nil {
					t.Fatal(err)
				}
				if err := nl.Apply(ctx, tx); err != nil {
					t.Fatal(err)
				}
			}
			loaded, err := nft.Parse(f.Dump())
			if err != nil {
				t.Fatal(err)
			}
			for _, tx := range loaded {
				if err := ex.Apply(ctx, tx); err != nil {
					t.Fatalf("nft -f of the dump: %v\n%s", err, f.Dump())
				}
			}
			if d := cmp.Diff(sortBlocks(listTable(t, direct, nft.IPv4, tbl)), sortBlocks(listTable(t, fromDump, nft.IPv4, tbl))); d != "" {
				t.Errorf("kernel state from transactions (-) and from the fake's dump (+) differ:\n%s", d)
			}
		})
	}
}
