package main

import (
	"context"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/kernel/nft/nfnetlink"
	"github.com/kproxy/kproxy/internal/proxy/nftables"
	"github.com/kproxy/kproxy/internal/testutil/netns"
)

// repairs records what the drift monitor asks for.
type repairs chan string

func (r repairs) Repair(f v1.IPFamily) { r <- "full " + string(f) }
func (r repairs) RepairTables(f v1.IPFamily, tables []string) {
	r <- "tables " + string(f)
}

// TestWatchNFTablesRepairsTheGap (root, a fresh network namespace): the
// monitor subscribes after kproxy's first sync; a shard table deleted by
// nft between that sync and the subscription is not notified, and is
// repaired by a full sync of the family all the same. Without a foreign
// commit in between, nothing is repaired; a deletion after the
// subscription is notified and repairs the table.
func TestWatchNFTablesRepairsTheGap(t *testing.T) {
	netns.Require(t, "nft")
	shard := nftables.ShardTable(nftables.DefaultTableName, 0)
	for _, tc := range []struct {
		name    string
		foreign bool
	}{{name: "deleted in the gap", foreign: true}, {name: "nothing else committed"}} {
		t.Run(tc.name, func(t *testing.T) {
			ns := netns.New(t, "gap-"+netns.RandomID(3), "node")
			opt := nfnetlink.WithNetNSPath("/run/netns/" + ns.Name)
			gens := &nfnetlink.Generations{}
			nl, err := nfnetlink.NewNetlink(opt, nfnetlink.WithGenerations(gens))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = nl.Close() })
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			// kproxy's first sync (its tables, in one transaction each).
			for _, table := range []string{nftables.DefaultTableName, shard} {
				tx := nft.NewTransaction(nft.IPv4, table)
				tx.Add(&nft.Table{}, &nft.Chain{Name: "services"}, &nft.Rule{Chain: "services", Stmts: []nft.Stmt{nft.Counter{}}})
				if err := nl.Apply(ctx, tx); err != nil {
					t.Fatal(err)
				}
			}
			if tc.foreign {
				if out, err := ns.Exec(10*time.Second, "nft", "delete", "table", "ip", shard); err != nil {
					t.Fatalf("nft delete table: %v: %s", err, out)
				}
			}
			r := make(repairs, 8)
			wctx, stop := context.WithCancel(ctx)
			done := make(chan struct{})
			go func() {
				defer close(done)
				watchNFTables(wctx, r, nftDrift{nls: []*nfnetlink.Netlink{nl}, gens: gens}, []v1.IPFamily{v1.IPv4Protocol}, opt)
			}()
			t.Cleanup(func() { stop(); <-done })
			next := func(within time.Duration) string {
				select {
				case got := <-r:
					return got
				case <-time.After(within):
					return ""
				}
			}
			want := ""
			if tc.foreign {
				want = "full IPv4"
			}
			if got := next(2 * time.Second); got != want {
				t.Fatalf("repair asked for: %q, want %q", got, want)
			}
			if got := next(300 * time.Millisecond); got != "" {
				t.Errorf("another repair: %q", got)
			}
			// Listening now: a deletion is notified.
			if out, err := ns.Exec(10*time.Second, "nft", "delete", "table", "ip", nftables.DefaultTableName); err != nil {
				t.Fatalf("nft delete table: %v: %s", err, out)
			}
			if got := next(5 * time.Second); got != "tables IPv4" {
				t.Errorf("after a deletion while listening: %q, want %q", got, "tables IPv4")
			}
		})
	}
}
