package main

import (
	"context"
	"testing"

	"github.com/kproxy/kproxy/internal/kernel/execer/execertest"
)

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
