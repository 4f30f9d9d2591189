package nfnetlink

// Kernel test of the generation count, in a fresh network namespace
// (kernel_test.go's helpers).

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/kernel/nft"
)

// TestKernelGenerationsTellForeignCommits: batches committed by the
// adapters sharing a Generations (two, sending at the same time), and a
// batch the kernel refused, leave Foreign false; a table deleted by the
// nft binary afterwards makes it true.
func TestKernelGenerationsTellForeignCommits(t *testing.T) {
	ns := newKernelNS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g := &Generations{}
	var nls []*Netlink
	for range 2 {
		nl, err := NewNetlink(WithNetNSPath("/run/netns/"+ns.name), WithGenerations(g))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = nl.Close() })
		nls = append(nls, nl)
	}
	if foreign, err := g.Foreign(ctx, nls[0]); err != nil || !foreign {
		t.Errorf("nothing counted yet: Foreign = %v, %v; want true (nothing to compare with)", foreign, err)
	}

	var wg sync.WaitGroup
	for i, fam := range []nft.Family{nft.IPv4, nft.IPv6} {
		wg.Go(func() {
			for _, table := range []string{"gen", "gen-s0", "gen-s1"} {
				tx := nft.NewTransaction(fam, table)
				tx.Add(&nft.Table{}, &nft.Chain{Name: "c"}, &nft.Rule{Chain: "c", Stmts: []nft.Stmt{nft.Counter{}}})
				if err := nls[i].Apply(ctx, tx); err != nil {
					t.Errorf("%s %s: %v", fam, table, err)
				}
			}
		})
	}
	wg.Wait()
	refused := nft.NewTransaction(nft.IPv4, "gen")
	refused.Add(&nft.Rule{Chain: "missing", Stmts: []nft.Stmt{nft.Counter{}}})
	if err := nls[0].Apply(ctx, refused); err == nil {
		t.Fatal("a rule in a missing chain was accepted")
	}
	if foreign, err := g.Foreign(ctx, nls[0]); err != nil || foreign {
		t.Fatalf("only kproxy's batches: Foreign = %v, %v; want false", foreign, err)
	}

	ns.nft(t, "delete", "table", "ip6", "gen-s1")
	if foreign, err := g.Foreign(ctx, nls[0]); err != nil || !foreign {
		t.Errorf("after nft deleted a table: Foreign = %v, %v; want true", foreign, err)
	}
}
