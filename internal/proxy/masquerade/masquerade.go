// Package masquerade is the masquerade mark and the rules that act on it
// as upstream's iptables and ipvs proxiers both write them: a packet
// marked in KUBE-MARK-MASQ is masqueraded in KUBE-POSTROUTING. The
// nftables backend uses the mark's value (Value) in its own syntax.
package masquerade

import "fmt"

// Value is the mark bit's value: 1<<bit.
func Value(bit int) uint32 { return 1 << uint(bit) }

// Mark is the mark as upstream writes it in iptables rules: "%#08x" of
// Value ("0x00004000" for bit 14, the default).
func Mark(bit int) string {
	return fmt.Sprintf("%#08x", Value(bit))
}

// Rules are the masquerade rules for mark, in iptables-restore form
// without the trailing newline: Postrouting are KUBE-POSTROUTING's, in
// order; MarkMasq is KUBE-MARK-MASQ's one rule. randomFully adds
// --random-fully to MASQUERADE.
type Rules struct {
	Postrouting []string
	MarkMasq    string
}

// NewRules returns the rules for mark (as Mark writes it).
func NewRules(mark string, randomFully bool) Rules {
	masq := `-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE`
	if randomFully {
		masq += " --random-fully"
	}
	return Rules{
		Postrouting: []string{
			"-A KUBE-POSTROUTING -m mark ! --mark " + mark + "/" + mark + " -j RETURN",
			// Clear the mark so that a packet re-entering the stack
			// (a tunnel) is not masqueraded twice.
			"-A KUBE-POSTROUTING -j MARK --xor-mark " + mark,
			masq,
		},
		MarkMasq: "-A KUBE-MARK-MASQ -j MARK --or-mark " + mark,
	}
}
