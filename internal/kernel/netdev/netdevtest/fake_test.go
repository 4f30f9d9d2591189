package netdevtest

import (
	"errors"
	"net/netip"
	"slices"
	"testing"

	"github.com/kproxy/kproxy/internal/kernel/netdev"
)

func TestFake(t *testing.T) {
	f := New()
	created, err := f.EnsureDummy("kube-ipvs0")
	if err != nil || !created {
		t.Fatalf("EnsureDummy = %v, %v", created, err)
	}
	if created, err := f.EnsureDummy("kube-ipvs0"); err != nil || created {
		t.Errorf("second EnsureDummy = %v, %v; want false, nil", created, err)
	}
	f.AddLink("eth0", "veth", netip.MustParseAddr("198.18.0.2"))
	if _, err := f.EnsureDummy("eth0"); !errors.Is(err, netdev.ErrNotDummy) {
		t.Errorf("EnsureDummy on a veth = %v", err)
	}
	if _, err := f.EnsureDummy("a-name-of-16-byt"); !errors.Is(err, netdev.ErrBadArg) {
		t.Errorf("long name = %v", err)
	}
	a4, a6 := netip.MustParseAddr("198.19.0.1"), netip.MustParseAddr("fd00:19::1")
	for _, a := range []netip.Addr{a6, a4} {
		if err := f.AddAddress("kube-ipvs0", a); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.AddAddress("kube-ipvs0", a4); !errors.Is(err, netdev.ErrAddrExists) {
		t.Errorf("duplicate AddAddress = %v", err)
	}
	if err := f.AddAddress("kube-ipvs0", netip.Addr{}); !errors.Is(err, netdev.ErrBadArg) {
		t.Errorf("invalid address = %v", err)
	}
	if err := f.AddAddress("nope", a4); !errors.Is(err, netdev.ErrNoLink) {
		t.Errorf("AddAddress on a missing link = %v", err)
	}
	got, err := f.Addresses("kube-ipvs0")
	if err != nil || !slices.Equal(got, []netip.Addr{a4, a6}) {
		t.Errorf("Addresses = %v, %v", got, err)
	}
	if err := f.DelAddress("kube-ipvs0", a4); err != nil {
		t.Fatal(err)
	}
	if err := f.DelAddress("kube-ipvs0", a4); !errors.Is(err, netdev.ErrNoAddr) {
		t.Errorf("second DelAddress = %v", err)
	}
	if err := f.DeleteLink("kube-ipvs0"); err != nil {
		t.Fatal(err)
	}
	if err := f.DeleteLink("kube-ipvs0"); !errors.Is(err, netdev.ErrNoLink) {
		t.Errorf("second DeleteLink = %v", err)
	}
	if _, err := f.Addresses("kube-ipvs0"); !errors.Is(err, netdev.ErrNoLink) {
		t.Errorf("Addresses of a deleted link = %v", err)
	}
	boom := errors.New("boom")
	f.FailNext(OpEnsureDummy, boom)
	if _, err := f.EnsureDummy("kube-ipvs0"); !errors.Is(err, boom) {
		t.Errorf("injected = %v", err)
	}
	if f.Calls(OpEnsureDummy) != 5 || f.Calls(OpAddAddress) != 5 {
		t.Errorf("calls: EnsureDummy %d, AddAddress %d", f.Calls(OpEnsureDummy), f.Calls(OpAddAddress))
	}
}
