package proxy

import "testing"

func TestMasqueradeMark(t *testing.T) {
	for bit, want := range map[int]string{0: "0x00000001", 14: "0x00004000", 15: "0x00008000", 24: "0x01000000", 31: "0x80000000"} {
		if got := MasqueradeMark(bit); got != want {
			t.Errorf("MasqueradeMark(%d) = %q, want %q", bit, got, want)
		}
	}
}
