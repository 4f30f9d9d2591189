package nft

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestRefs(t *testing.T) {
	stmts := []Stmt{
		MatchAddr{Set: "a"}, MatchAddr{}, UpdateSaddr{Set: "b"}, VmapLookup{Map: "c"}, MatchInSet{Set: "d"},
		DNATMap{Map: "e"}, DNATByService{Map: "f"}, NumgenVmap{Chains: []string{"x", "y"}},
		Verdict{Kind: Jump, Chain: "z"}, Verdict{Kind: Goto, Chain: "w"}, Verdict{Kind: Accept}, Counter{},
	}
	chains, sets := Refs(stmts)
	if d := cmp.Diff([]string{"x", "y", "z", "w"}, chains); d != "" {
		t.Errorf("chains (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"a", "b", "c", "d", "e", "f"}, sets); d != "" {
		t.Errorf("sets (-want +got):\n%s", d)
	}
}
