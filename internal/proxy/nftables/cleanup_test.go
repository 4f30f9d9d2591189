package nftables

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/kernel/nft/nfttest"
)

// TestCleanupLeftovers: --cleanup and a switch to another mode delete the main table and all its shard
// tables (also those a larger shard count left), in both families, and
// nothing else.
func TestCleanupLeftovers(t *testing.T) {
	ctx := context.Background()
	f := nfttest.New()
	for fam, tables := range map[nft.Family][]string{
		nft.IPv4: {"kube-proxy", "kube-proxy-s0", "kube-proxy-s1", "kube-proxy-s9", "kube-proxy-sx", "filter"},
		nft.IPv6: {"kube-proxy", "kube-proxy-s0", "nat"},
	} {
		for _, name := range tables {
			tx := nft.NewTransaction(fam, name)
			tx.Add(&nft.Table{})
			if err := f.Apply(ctx, tx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := CleanupLeftovers(ctx, f); err != nil {
		t.Fatal(err)
	}
	for fam, want := range map[nft.Family][]string{nft.IPv4: {"filter", "kube-proxy-sx"}, nft.IPv6: {"nat"}} {
		got, err := f.ListTables(ctx, fam)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s tables left (-want +got):\n%s", fam, diff)
		}
	}
}
