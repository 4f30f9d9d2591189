// Package netdev holds the interface ipvs mode binds service addresses
// to (kube-ipvs0, a dummy) and reads the node's local addresses.
package netdev

import "net/netip"

// Handle changes network interfaces in one network namespace.
type Handle interface {
	// EnsureDummy creates the dummy interface if it is missing (it stays
	// down, as upstream's) and says whether it did.
	EnsureDummy(name string) (created bool, err error)
	DeleteLink(name string) error
	// Addresses lists the addresses on the interface (/32 and /128 in
	// ipvs mode, scope global as upstream binds them).
	Addresses(name string) ([]netip.Addr, error)
	AddAddress(name string, a netip.Addr) error
	DelAddress(name string, a netip.Addr) error
	Close()
}
