package main

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kproxy/kproxy/internal/kernel/execer/execertest"
	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/kernel/nft/nfttest"
)

// TestCleanupTables: --cleanup deletes the main table and all its shard
// tables (also those a larger shard count left), in both families, and
// nothing else.
func TestCleanupTables(t *testing.T) {
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
	if err := cleanupTables(ctx, f, "kube-proxy"); err != nil {
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

// TestLiveRulesReadsEveryTableOfOurs: trace --live lists the main table
// and its shards of both families, not other tables.
func TestLiveRulesReadsEveryTableOfOurs(t *testing.T) {
	ex := &execertest.Script{T: t, Calls: []execertest.Call{
		{Argv: []string{"nft", "list", "tables", "ip"}, Stdout: "table ip kube-proxy-s1\ntable ip filter\ntable ip kube-proxy\ntable ip kube-proxy-s0\n"},
		{Argv: []string{"nft", "list", "table", "ip", "kube-proxy"}, Stdout: "main4\n"},
		{Argv: []string{"nft", "list", "table", "ip", "kube-proxy-s0"}, Stdout: "s0-4\n"},
		{Argv: []string{"nft", "list", "table", "ip", "kube-proxy-s1"}, Stdout: "s1-4\n"},
		{Argv: []string{"nft", "list", "tables", "ip6"}, Stdout: "table ip6 kube-proxy\n"},
		{Argv: []string{"nft", "list", "table", "ip6", "kube-proxy"}, Stdout: "main6\n"},
	}}
	got, err := liveRules(context.Background(), ex, "kube-proxy")
	if err != nil {
		t.Fatal(err)
	}
	if want := "main4\ns0-4\ns1-4\nmain6\n"; got != want {
		t.Errorf("liveRules = %q, want %q", got, want)
	}
	if len(ex.Calls) != 0 {
		t.Errorf("commands not run: %v", ex.Calls)
	}
}
