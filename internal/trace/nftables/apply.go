package nftables

import (
	"errors"
	"strings"

	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/kernel/nft/nftstate"
	"github.com/kproxy/kproxy/internal/trace"
)

// ParseNFT parses nftables text and returns the resulting state. The text
// is a sequence of operations in the `nft -f` form the nft package prints
// (one "add|insert|create|flush|delete table|chain|set|map|element|rule ..."
// per line), typically a full sync followed by partial syncs; operations
// apply in order. Tables in the nested form `nft list table` prints
// ("table ip kube-proxy { ... }") are accepted too. Only the ip and ip6
// families and the statements kproxy writes are understood; anything else
// is an error naming the line (see nft.Read, which reads it).
func ParseNFT(text string) (*Ruleset, error) {
	r := &Ruleset{}
	if err := r.Apply(text); err != nil {
		return nil, err
	}
	return r, nil
}

// Apply applies more operations (same syntax as ParseNFT) to the ruleset,
// with the kernel's checks (nftstate's File dialect). Like an nft
// transaction it is all or nothing: on error the ruleset is unchanged.
// Line numbers in errors count from the start of text.
func (r *Ruleset) Apply(text string) error {
	st := r.state
	x := st.Begin(nftstate.File, r.gen+1)
	if err := nft.Read(text, x.SetDef, x.Apply); err != nil {
		return err
	}
	if err := x.Commit(); err != nil {
		var pe *trace.ParseError
		if errors.As(err, &pe) && pe.Line > 0 {
			pe.Text = strings.TrimSpace(strings.Split(text, "\n")[pe.Line-1])
		}
		return err
	}
	r.state = st
	r.gen++
	return nil
}
