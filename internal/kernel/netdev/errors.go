package netdev

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
)

// Errors of Handle, the same from the real Handle and from netdevtest's
// fake (test with errors.Is; the real Handle wraps the kernel's error).
var (
	ErrNoLink     = errors.New("no such interface")
	ErrNotDummy   = errors.New("interface exists and is no dummy")
	ErrAddrExists = errors.New("the interface has this address already")
	ErrNoAddr     = errors.New("the interface has no such address")
	ErrBadArg     = errors.New("invalid argument")
)

// CheckName says why the kernel would not take name for an interface.
func CheckName(name string) error {
	if name == "" || len(name) > 15 {
		return fmt.Errorf("%w: interface name %q is empty or longer than 15 bytes", ErrBadArg, name)
	}
	return nil
}

// CheckAddr says why a is no address to bind (ipvs mode binds plain IPv4
// and IPv6 addresses, /32 and /128).
func CheckAddr(a netip.Addr) error {
	if !a.IsValid() || a.Zone() != "" || a.Is4In6() || a.IsUnspecified() {
		return fmt.Errorf("%w: address %v", ErrBadArg, a)
	}
	return nil
}

// SortAddrs sorts addresses as Addresses lists them: IPv4 first, then
// by value.
func SortAddrs(a []netip.Addr) {
	slices.SortFunc(a, func(x, y netip.Addr) int {
		if c := cmp.Compare(x.BitLen(), y.BitLen()); c != 0 {
			return c
		}
		return x.Compare(y)
	})
}
