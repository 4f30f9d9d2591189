package nfttest

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/kernel/nft/nftstate"
)

// readdScript re-adds a table, a chain and a set with other comments,
// and deletes a chain that has rules but that nothing jumps to. The fake
// and the tracer once disagreed on the comments (the tracer replaced
// them); `nft -f` is the oracle: the first comments stay, and the chain
// goes with its rules.
const readdScript = `add table ip t { comment "first" ; }
add chain ip t c { comment "c1" ; }
add set ip t s { type ipv4_addr ; comment "s1" ; }
add chain ip t d
add rule ip t d accept
add table ip t { comment "second" ; }
add chain ip t c { comment "c2" ; }
add set ip t s { type ipv4_addr ; comment "s2" ; }
delete chain ip t d
`

func checkReadd(t *testing.T, comment, chainComment, setComment string, chainD bool) {
	t.Helper()
	if comment != "first" || chainComment != "c1" || setComment != "s1" {
		t.Errorf("comments after re-adding: table %q chain %q set %q, want first, c1, s1", comment, chainComment, setComment)
	}
	if chainD {
		t.Errorf("chain d (with a rule, unreferenced) is still there after its deletion")
	}
}

// TestReaddKeepsComments runs the script through both dialects of the
// one applier, and through nft -f in a fresh network namespace.
func TestReaddKeepsComments(t *testing.T) {
	for _, d := range []nftstate.Dialect{nftstate.Netlink, nftstate.File} {
		st := &nftstate.State{}
		x := st.Begin(d, 1)
		if err := nft.Read(readdScript, x.SetDef, x.Apply); err != nil {
			t.Fatalf("dialect %d: %v", d, err)
		}
		if err := x.Commit(); err != nil {
			t.Fatalf("dialect %d: %v", d, err)
		}
		tb := st.Table(nft.IPv4, "t")
		checkReadd(t, tb.Comment, tb.Chains["c"].Def.Comment, tb.Sets["s"].Def.Comment, tb.Chains["d"] != nil)
	}

	t.Run("kernel", func(t *testing.T) {
		ns := newNetNS(t)
		cmd := exec.Command("ip", "netns", "exec", ns, "nft", "-f", "-")
		cmd.Stdin = strings.NewReader(readdScript)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("nft -f: %v: %s", err, out)
		}
		listing := listTable(t, ns, nft.IPv4, "t")
		st := &nftstate.State{}
		x := st.Begin(nftstate.File, 1)
		if err := nft.Read(listing, x.SetDef, x.Apply); err != nil {
			t.Fatalf("reading the listing: %v\n%s", err, listing)
		}
		if err := x.Commit(); err != nil {
			t.Fatal(err)
		}
		tb := st.Table(nft.IPv4, "t")
		checkReadd(t, tb.Comment, tb.Chains["c"].Def.Comment, tb.Sets["s"].Def.Comment, tb.Chains["d"] != nil)
	})
}
