package ipvs_test

import (
	"errors"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/kproxy/kproxy/internal/kernel/ipvs"
	"github.com/kproxy/kproxy/internal/kernel/ipvs/ipvstest"
	"github.com/kproxy/kproxy/internal/kernel/sysctl/sysctltest"
)

func TestCheckScheduler(t *testing.T) {
	f := ipvstest.New()
	if err := ipvs.CheckScheduler(f, ""); err != nil {
		t.Fatal(err)
	}
	if f.Calls(ipvstest.OpAddService) != 1 || f.Calls(ipvstest.OpDeleteService) != 1 {
		t.Errorf("the probe: %d adds, %d deletes; want 1 and 1", f.Calls(ipvstest.OpAddService), f.Calls(ipvstest.OpDeleteService))
	}
	if s, _ := f.Services(); len(s) != 0 {
		t.Errorf("the probe is left: %+v", s)
	}

	// A service that uses the scheduler already: no probe.
	vs := vsOf(syscall.IPPROTO_TCP, "198.19.0.1", 80)
	if err := f.AddService(ipvs.Service{VirtualServer: vs, Scheduler: "sh"}); err != nil {
		t.Fatal(err)
	}
	f.ResetCalls()
	if err := ipvs.CheckScheduler(f, "sh"); err != nil || f.Writes() != 0 {
		t.Errorf("CheckScheduler(sh) with an sh service: %v, %d writes", err, f.Writes())
	}

	// The kernel cannot load the module: the error names it.
	f.FailNext(ipvstest.OpAddService, syscall.ENOENT)
	err := ipvs.CheckScheduler(f, "mh")
	if err == nil || !strings.Contains(err.Error(), `"mh"`) || !strings.Contains(err.Error(), "ip_vs_mh") {
		t.Errorf("CheckScheduler(mh) without the module = %v", err)
	}
	// Every scheduler config validation takes is checked with the kernel
	// (fo, ovf and twos were refused as unknown before the kernel was asked).
	for _, s := range []string{"fo", "ovf", "twos"} {
		if err := ipvs.CheckScheduler(f, s); err != nil {
			t.Errorf("CheckScheduler(%s) = %v", s, err)
		}
	}
	if err := ipvs.CheckScheduler(f, "fastest"); err == nil || !strings.Contains(err.Error(), `"fastest" is unknown`) {
		t.Errorf("unknown scheduler = %v", err)
	}

	// A probe left by a check that died is deleted, then made again.
	probe := vsOf(syscall.IPPROTO_TCP, "198.51.100.0", 20000)
	if err := f.AddService(ipvs.Service{VirtualServer: probe, Scheduler: "wrr"}); err != nil {
		t.Fatal(err)
	}
	if err := ipvs.CheckScheduler(f, "lc"); err != nil {
		t.Fatal(err)
	}
	ss, _ := f.Services()
	if len(ss) != 1 || ss[0].Addr != vs.Addr {
		t.Errorf("services after the check: %+v", ss)
	}
	boom := errors.New("boom")
	f.FailNext(ipvstest.OpServices, boom)
	if err := ipvs.CheckScheduler(f, "rr"); !errors.Is(err, boom) {
		t.Errorf("listing error = %v", err)
	}
}

func TestEnsureSysctls(t *testing.T) {
	all := func(v int) map[string]int {
		return map[string]int{
			ipvs.SysctlVSConntrack: v, ipvs.SysctlConnReuseMode: v, ipvs.SysctlExpireNoDestConn: v,
			ipvs.SysctlExpireQuiescentTemplate: v, ipvs.SysctlIPForward: v, ipvs.SysctlArpIgnore: v, ipvs.SysctlArpAnnounce: v,
		}
	}
	for _, c := range []struct {
		release   string
		strictARP bool
		start     int
		want      []string
	}{
		{"6.1.0-28-amd64", true, 0, []string{
			ipvs.SysctlVSConntrack + "=1", ipvs.SysctlExpireNoDestConn + "=1", ipvs.SysctlExpireQuiescentTemplate + "=1",
			ipvs.SysctlIPForward + "=1", ipvs.SysctlArpIgnore + "=1", ipvs.SysctlArpAnnounce + "=2"}},
		{"5.4.0", false, 0, []string{
			ipvs.SysctlVSConntrack + "=1", ipvs.SysctlExpireNoDestConn + "=1", ipvs.SysctlExpireQuiescentTemplate + "=1", ipvs.SysctlIPForward + "=1"}},
		// conn_reuse_mode=0 on 4.1 to 5.8 only; values already right are
		// not written.
		{"5.4.0", false, 1, []string{ipvs.SysctlConnReuseMode + "=0"}},
		{"3.10.0", false, 1, nil},
	} {
		f := sysctltest.New(all(c.start))
		if err := ipvs.EnsureSysctls(f, c.strictARP, c.release); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(f.Writes, c.want) {
			t.Errorf("%s strictARP=%v from %d: writes %q, want %q", c.release, c.strictARP, c.start, f.Writes, c.want)
		}
	}
	f := sysctltest.New(map[string]int{ipvs.SysctlVSConntrack: 0})
	if err := ipvs.EnsureSysctls(f, false, "6.1"); err == nil {
		t.Error("a missing sysctl is no error")
	}
}
