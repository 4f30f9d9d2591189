package ipsettest

import (
	"errors"
	"slices"
	"testing"

	"github.com/kproxy/kproxy/internal/kernel/ipset"
)

func TestFake(t *testing.T) {
	f := New()
	ci := ipset.Set{Name: "KUBE-CLUSTER-IP", Type: "hash:ip,port", Comment: "Kubernetes service cluster ip + port for masquerade purpose"}
	if err := f.Create(ci); err != nil {
		t.Fatal(err)
	}
	if err := f.Create(ci); err != nil {
		t.Errorf("Create of the same set again: %v", err)
	}
	if err := f.Create(ipset.Set{Name: ci.Name, Type: "hash:ip"}); !errors.Is(err, ipset.ErrSetExists) {
		t.Errorf("Create with another type = %v, want ErrSetExists", err)
	}
	if err := f.Create(ipset.Set{Name: ci.Name, Type: ci.Type, IPv6: true}); !errors.Is(err, ipset.ErrSetExists) {
		t.Errorf("Create with another family = %v, want ErrSetExists", err)
	}
	if err := f.Create(ipset.Set{Name: "KUBE-NODE-PORT-TCP", Type: "bitmap:port"}); err != nil {
		t.Fatal(err)
	}
	if err := f.Create(ipset.Set{Name: "bad", Type: "list:set"}); !errors.Is(err, ipset.ErrBadSet) {
		t.Errorf("Create of an unknown type = %v", err)
	}
	if err := f.Add(ci.Name, "198.19.0.1,tcp:80"); err != nil {
		t.Fatal(err)
	}
	if err := f.Add(ci.Name, "198.19.0.1,tcp:80"); !errors.Is(err, ipset.ErrEntryExists) {
		t.Errorf("duplicate Add = %v", err)
	}
	if err := f.Add(ci.Name, "198.19.0.1"); !errors.Is(err, ipset.ErrBadEntry) {
		t.Errorf("Add of the wrong shape = %v", err)
	}
	if err := f.Add(ci.Name, "fd00::1,tcp:80"); !errors.Is(err, ipset.ErrBadEntry) {
		t.Errorf("Add of the wrong family = %v", err)
	}
	if err := f.Add("KUBE-NODE-PORT-TCP", "30080"); err != nil {
		t.Fatal(err)
	}
	if err := f.Add("missing", "30080"); !errors.Is(err, ipset.ErrNoSet) {
		t.Errorf("Add to a missing set = %v", err)
	}
	if err := f.Add(ci.Name, "198.19.0.2,udp:53"); err != nil {
		t.Fatal(err)
	}
	got, err := f.Entries(ci.Name)
	if err != nil || !slices.Equal(got, []string{"198.19.0.1,tcp:80", "198.19.0.2,udp:53"}) {
		t.Errorf("Entries = %q, %v", got, err)
	}
	if err := f.Del(ci.Name, "198.19.0.2,udp:53"); err != nil {
		t.Fatal(err)
	}
	if err := f.Del(ci.Name, "198.19.0.2,udp:53"); !errors.Is(err, ipset.ErrNoEntry) {
		t.Errorf("second Del = %v", err)
	}
	if names, _ := f.Sets(); !slices.Equal(names, []string{"KUBE-CLUSTER-IP", "KUBE-NODE-PORT-TCP"}) {
		t.Errorf("Sets = %q", names)
	}
	if err := f.SetInUse(ci.Name, true); err != nil {
		t.Fatal(err)
	}
	if err := f.Destroy(ci.Name); !errors.Is(err, ipset.ErrInUse) {
		t.Errorf("Destroy in use = %v", err)
	}
	_ = f.SetInUse(ci.Name, false)
	if err := f.Destroy(ci.Name); err != nil {
		t.Fatal(err)
	}
	if err := f.Destroy(ci.Name); !errors.Is(err, ipset.ErrNoSet) {
		t.Errorf("second Destroy = %v", err)
	}
	if _, err := f.Entries(ci.Name); !errors.Is(err, ipset.ErrNoSet) {
		t.Errorf("Entries of a destroyed set = %v", err)
	}
	boom := errors.New("boom")
	f.FailNext(OpAdd, boom)
	if err := f.Add("KUBE-NODE-PORT-TCP", "30081"); !errors.Is(err, boom) {
		t.Errorf("injected = %v", err)
	}
	if got, _ := f.Entries("KUBE-NODE-PORT-TCP"); !slices.Equal(got, []string{"30080"}) {
		t.Errorf("a failed Add changed the set: %q", got)
	}
	if f.Calls(OpAdd) != 8 {
		t.Errorf("Calls(Add) = %d, want 8", f.Calls(OpAdd))
	}
}
