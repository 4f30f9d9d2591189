package masquerade

import (
	"slices"
	"testing"
)

func TestMark(t *testing.T) {
	for bit, want := range map[int]string{0: "0x00000001", 14: "0x00004000", 15: "0x00008000", 24: "0x01000000", 31: "0x80000000"} {
		if got := Mark(bit); got != want {
			t.Errorf("Mark(%d) = %q, want %q", bit, got, want)
		}
	}
	if Value(14) != 0x4000 || Value(31) != 0x80000000 {
		t.Errorf("Value(14), Value(31) = %#x, %#x", Value(14), Value(31))
	}
}

// The rules as upstream's proxiers write them (iptables proxier's
// writeIptablesRules, ipvs proxier's writeIptablesRules), bit 14.
func TestRules(t *testing.T) {
	r := NewRules(Mark(14), true)
	want := []string{
		"-A KUBE-POSTROUTING -m mark ! --mark 0x00004000/0x00004000 -j RETURN",
		"-A KUBE-POSTROUTING -j MARK --xor-mark 0x00004000",
		`-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully`,
	}
	if !slices.Equal(r.Postrouting, want) {
		t.Errorf("Postrouting = %q, want %q", r.Postrouting, want)
	}
	if r.MarkMasq != "-A KUBE-MARK-MASQ -j MARK --or-mark 0x00004000" {
		t.Errorf("MarkMasq = %q", r.MarkMasq)
	}
	if last := NewRules(Mark(14), false).Postrouting[2]; last != `-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE` {
		t.Errorf("without --random-fully: %q", last)
	}
}
