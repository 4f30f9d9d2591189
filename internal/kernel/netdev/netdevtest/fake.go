// Package netdevtest holds a stateful fake of netdev.Handle for unit tests
// of ipvs mode: interfaces with their kind and addresses, errors as the
// real Handle returns them (the VM test in package netdev compares).
package netdevtest

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"

	"github.com/kproxy/kproxy/internal/kernel/netdev"
	"github.com/kproxy/kproxy/internal/testutil/faultplan"
)

// Op names one Handle method.
type Op string

// The operations a Fake counts and can fail.
const (
	OpEnsureDummy Op = "EnsureDummy"
	OpDeleteLink  Op = "DeleteLink"
	OpAddresses   Op = "Addresses"
	OpAddAddress  Op = "AddAddress"
	OpDelAddress  Op = "DelAddress"
)

type link struct {
	kind  string
	addrs []netip.Addr
}

// Fake is an in-memory netdev.Handle; make one with New. It is safe for
// concurrent use.
type Fake struct {
	mu    sync.Mutex
	links map[string]*link
	faultplan.Plan[Op]
	closed bool
}

// New returns a fake with only lo (127.0.0.1 and ::1).
func New() *Fake {
	return &Fake{
		links: map[string]*link{"lo": {kind: "loopback", addrs: []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback()}}},
	}
}

var _ netdev.Handle = (*Fake)(nil)

// AddLink adds an interface of another kind (a veth, a bridge): EnsureDummy
// on its name fails as the real Handle's does.
func (f *Fake) AddLink(name, kind string, addrs ...netip.Addr) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.links[name] = &link{kind: kind, addrs: slices.Clone(addrs)}
}

// Closed says whether Close was called.
func (f *Fake) Closed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.closed
}

func (f *Fake) enter(op Op) error { return f.Enter(op) }

func (f *Fake) get(name string) (*link, error) {
	l, ok := f.links[name]
	if !ok {
		return nil, fmt.Errorf("interface %s: %w", name, netdev.ErrNoLink)
	}
	return l, nil
}

// EnsureDummy implements netdev.Handle.
func (f *Fake) EnsureDummy(name string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(OpEnsureDummy); err != nil {
		return false, err
	}
	if err := netdev.CheckName(name); err != nil {
		return false, err
	}
	if l, ok := f.links[name]; ok {
		if l.kind != "dummy" {
			return false, fmt.Errorf("interface %s: %w (it is a %s)", name, netdev.ErrNotDummy, l.kind)
		}
		return false, nil
	}
	f.links[name] = &link{kind: "dummy"}
	return true, nil
}

// DeleteLink implements netdev.Handle.
func (f *Fake) DeleteLink(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(OpDeleteLink); err != nil {
		return err
	}
	if _, err := f.get(name); err != nil {
		return err
	}
	delete(f.links, name)
	return nil
}

// Addresses implements netdev.Handle; IPv4 first, each family sorted.
func (f *Fake) Addresses(name string) ([]netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(OpAddresses); err != nil {
		return nil, err
	}
	l, err := f.get(name)
	if err != nil {
		return nil, err
	}
	out := slices.Clone(l.addrs)
	netdev.SortAddrs(out)
	return out, nil
}

// AddAddress implements netdev.Handle.
func (f *Fake) AddAddress(name string, a netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(OpAddAddress); err != nil {
		return err
	}
	l, err := f.get(name)
	if err != nil {
		return err
	}
	if err := netdev.CheckAddr(a); err != nil {
		return err
	}
	if slices.Contains(l.addrs, a) {
		return fmt.Errorf("adding %s to %s: %w", a, name, netdev.ErrAddrExists)
	}
	l.addrs = append(l.addrs, a)
	return nil
}

// DelAddress implements netdev.Handle.
func (f *Fake) DelAddress(name string, a netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter(OpDelAddress); err != nil {
		return err
	}
	l, err := f.get(name)
	if err != nil {
		return err
	}
	if err := netdev.CheckAddr(a); err != nil {
		return err
	}
	i := slices.Index(l.addrs, a)
	if i < 0 {
		return fmt.Errorf("deleting %s from %s: %w", a, name, netdev.ErrNoAddr)
	}
	l.addrs = slices.Delete(l.addrs, i, i+1)
	return nil
}

// Close implements netdev.Handle.
func (f *Fake) Close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
}
