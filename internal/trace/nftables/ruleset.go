package nftables

import (
	"strings"

	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/kernel/nft/nftstate"
)

// Ruleset is the state of the nftables tables of families ip and ip6 after
// a sequence of transactions. Build one with ParseNFT, change it with Apply
// or Remember, walk packets through it with Trace. The state is an
// nftstate.State, as nfttest.Fake's is: Of traces a state built by other
// means.
//
// Trace only reads the ruleset, so traces may run concurrently; Apply and
// Remember must not run concurrently with anything else.
type Ruleset struct {
	state nftstate.State
	gen   int // counts Apply calls, to tell this text's lines from older ones
}

// Of returns a Ruleset that traces st, nfttest.Fake's state for one
// (Fake.State). It shares st's tables; Apply and Remember copy before
// they change anything, so st stays as it is.
func Of(st *nftstate.State) *Ruleset { return &Ruleset{state: *st} }

type (
	table = nftstate.Table
	chain = nftstate.Chain
	rule  = nftstate.Rule
)

// String dumps the ruleset as one full transaction per table in the text
// form of the nft package: the table, its chains, sets, elements, then
// rules. ParseNFT of the dump gives the same ruleset.
func (r *Ruleset) String() string {
	var b strings.Builder
	for _, t := range r.state.Tables {
		tx := nft.NewTransaction(t.Family, t.Name)
		tx.Add(&nft.Table{Family: t.Family, Name: t.Name, Comment: t.Comment})
		for _, cn := range t.ChainOrder {
			c := t.Chains[cn]
			def := c.Def
			tx.Add(&def)
		}
		for _, sn := range t.SetOrder {
			def := t.Sets[sn].Def
			tx.Add(&def)
		}
		for _, sn := range t.SetOrder {
			for _, e := range t.Sets[sn].Elems {
				el := e.Elem(sn)
				tx.Add(&el)
			}
		}
		for _, cn := range t.ChainOrder {
			for _, ru := range t.Chains[cn].Rules {
				tx.Add(&nft.Rule{Chain: cn, Stmts: ru.Stmts, Comment: ru.Comment})
			}
		}
		text := tx.String()
		// nft.Chain has no policy; spell out the rare drop policy here.
		for _, cn := range t.ChainOrder {
			if c := t.Chains[cn]; c.Policy == nft.Drop {
				old := chainLine(t, c.Def)
				text = strings.Replace(text, old, strings.TrimSuffix(old, " }")+" policy drop ; }", 1)
			}
		}
		b.WriteString(text)
	}
	return b.String()
}

func chainLine(t *table, c nft.Chain) string {
	tx := nft.NewTransaction(t.Family, t.Name)
	tx.Add(&c)
	return strings.TrimSuffix(tx.String(), "\n")
}
