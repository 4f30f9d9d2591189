package proxy

import "fmt"

// MasqueradeMark is the masquerade mark as upstream's iptables and ipvs
// proxiers write it in iptables rules: "%#08x" of 1<<bit ("0x00004000"
// for bit 14, the default).
func MasqueradeMark(bit int) string {
	return fmt.Sprintf("%#08x", 1<<uint(bit))
}
