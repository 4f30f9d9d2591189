package ipvstest

import (
	"errors"
	"net/netip"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kproxy/kproxy/internal/kernel/ipvs"
)

var (
	vs4 = ipvs.VirtualServer{Protocol: 6, Addr: netip.MustParseAddr("198.19.0.1"), Port: 80}
	vs6 = ipvs.VirtualServer{Protocol: 17, Addr: netip.MustParseAddr("fd00:19::1"), Port: 53}
	ep1 = ipvs.Destination{Addr: netip.MustParseAddr("198.18.1.1"), Port: 8080, Weight: 1}
	ep2 = ipvs.Destination{Addr: netip.MustParseAddr("198.18.1.2"), Port: 8080, Weight: 1}
)

func TestServicesAndDestinations(t *testing.T) {
	f := New()
	if err := f.AddService(ipvs.Service{VirtualServer: vs4, Scheduler: "rr"}); err != nil {
		t.Fatal(err)
	}
	if err := f.AddService(ipvs.Service{VirtualServer: vs6, Scheduler: "wrr", Flags: ipvs.FlagPersistent, Timeout: 10800}); err != nil {
		t.Fatal(err)
	}
	if err := f.AddService(ipvs.Service{VirtualServer: vs4, Scheduler: "rr"}); !errors.Is(err, syscall.EEXIST) {
		t.Errorf("duplicate AddService = %v, want EEXIST", err)
	}
	if err := f.AddService(ipvs.Service{VirtualServer: ipvs.VirtualServer{Protocol: 6, Addr: vs4.Addr, Port: 81}, Scheduler: "nope"}); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("unknown scheduler = %v, want ENOENT", err)
	}
	got, err := f.Services()
	if err != nil {
		t.Fatal(err)
	}
	want4, want6 := vs4, vs6
	want4.Family, want6.Family = syscall.AF_INET, syscall.AF_INET6
	want := []ipvs.Service{
		{VirtualServer: want4, Scheduler: "rr", Flags: ipvs.FlagHashed},
		{VirtualServer: want6, Scheduler: "wrr", Flags: ipvs.FlagPersistent | ipvs.FlagHashed, Timeout: 10800},
	}
	if d := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); d != "" {
		t.Errorf("Services (-want +got):\n%s", d)
	}

	for _, d := range []ipvs.Destination{ep1, ep2} {
		if err := f.AddDestination(vs4, d); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.AddDestination(vs4, ep1); !errors.Is(err, syscall.EEXIST) {
		t.Errorf("duplicate AddDestination = %v, want EEXIST", err)
	}
	if err := f.AddDestination(ipvs.VirtualServer{Protocol: 6, Addr: vs4.Addr, Port: 99}, ep1); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("AddDestination without service = %v, want ESRCH", err)
	}
	if err := f.AddDestination(vs6, ep1); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("IPv4 real server in an IPv6 service = %v, want EINVAL", err)
	}
	bad := ep1
	bad.Weight = -1
	if err := f.UpdateDestination(vs4, bad); !errors.Is(err, syscall.ERANGE) {
		t.Errorf("negative weight = %v, want ERANGE", err)
	}
	if err := f.SetConns(vs4, ep1.Addr, ep1.Port, 3, 4); err != nil {
		t.Fatal(err)
	}
	w0 := ep1
	w0.Weight = 0
	if err := f.UpdateDestination(vs4, w0); err != nil {
		t.Fatal(err)
	}
	ds, err := f.Destinations(vs4)
	if err != nil {
		t.Fatal(err)
	}
	wantD := []ipvs.Destination{{Addr: ep1.Addr, Port: 8080, Weight: 0, ActiveConns: 3, InactiveConns: 4}, ep2}
	if d := cmp.Diff(wantD, ds, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); d != "" {
		t.Errorf("Destinations (-want +got):\n%s", d)
	}
	if err := f.DeleteDestination(vs4, ep2); err != nil {
		t.Fatal(err)
	}
	if err := f.DeleteDestination(vs4, ep2); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("second DeleteDestination = %v, want ENOENT", err)
	}
	if err := f.UpdateDestination(vs4, ep2); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("UpdateDestination of a deleted one = %v, want ENOENT", err)
	}
	if err := f.DeleteService(vs4); err != nil {
		t.Fatal(err)
	}
	if err := f.DeleteService(vs4); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("second DeleteService = %v, want ESRCH", err)
	}
	if err := f.UpdateService(ipvs.Service{VirtualServer: vs4, Scheduler: "rr"}); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("UpdateService of a deleted one = %v, want ESRCH", err)
	}
	if ds, err := f.Destinations(vs4); err != nil || len(ds) != 0 {
		t.Errorf("Destinations of a deleted service = %v, %v; want none, nil", ds, err)
	}
	if err := f.UpdateService(ipvs.Service{VirtualServer: vs6, Scheduler: "sh"}); err != nil {
		t.Fatal(err)
	}
	got, _ = f.Services()
	if len(got) != 1 || got[0].Scheduler != "sh" || got[0].Flags != ipvs.FlagHashed {
		t.Errorf("after UpdateService: %+v", got)
	}
}

func TestCountsAndInjectedErrors(t *testing.T) {
	f := New()
	boom := errors.New("boom")
	f.FailNext(OpAddService, nil, boom)
	if err := f.AddService(ipvs.Service{VirtualServer: vs4, Scheduler: "rr"}); err != nil {
		t.Fatal(err)
	}
	if err := f.AddService(ipvs.Service{VirtualServer: vs6, Scheduler: "rr"}); !errors.Is(err, boom) {
		t.Errorf("injected = %v", err)
	}
	if err := f.AddService(ipvs.Service{VirtualServer: vs6, Scheduler: "rr"}); err != nil {
		t.Errorf("after the queue: %v", err)
	}
	f.Hook = func(op Op, vs ipvs.VirtualServer, d *ipvs.Destination) error {
		if op == OpAddDestination && d.Addr == ep2.Addr {
			return syscall.ENOMEM
		}
		return nil
	}
	_ = f.AddDestination(vs4, ep1)
	if err := f.AddDestination(vs4, ep2); !errors.Is(err, syscall.ENOMEM) {
		t.Errorf("hook = %v", err)
	}
	if ds, _ := f.Destinations(vs4); len(ds) != 1 {
		t.Errorf("a failed add changed the state: %v", ds)
	}
	f.FailAlways(OpServices, boom)
	if _, err := f.Services(); !errors.Is(err, boom) {
		t.Errorf("FailAlways = %v", err)
	}
	f.FailAlways(OpServices, nil)
	if _, err := f.Services(); err != nil {
		t.Error(err)
	}
	if f.Calls(OpAddService) != 3 || f.Calls(OpAddDestination) != 2 || f.Writes() != 5 {
		t.Errorf("calls: add service %d, add destination %d, writes %d", f.Calls(OpAddService), f.Calls(OpAddDestination), f.Writes())
	}
	f.ResetCalls()
	if f.Writes() != 0 {
		t.Error("ResetCalls kept counts")
	}
	if err := f.SetTimeouts(ipvs.Timeouts{TCP: 60}); err != nil {
		t.Fatal(err)
	}
	if got := f.Timeouts(); got != (ipvs.Timeouts{TCP: 60, TCPFin: 120, UDP: 300}) {
		t.Errorf("Timeouts = %+v", got)
	}
	if err := f.SetConns(vs4, ep2.Addr, ep2.Port, 1, 1); err == nil {
		t.Error("SetConns on a missing real server: no error")
	}
	f.Close()
	if !f.Closed() {
		t.Error("not closed")
	}
}
