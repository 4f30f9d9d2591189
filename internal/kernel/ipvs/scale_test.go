package ipvs_test

import (
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/kernel/ipset"
	"github.com/kproxy/kproxy/internal/kernel/ipvs"
	"github.com/kproxy/kproxy/internal/kernel/netdev"
	"github.com/kproxy/kproxy/internal/testutil/netns"
)

// TestKernelScale times the real Handles at ipvs mode's scale: N virtual
// servers × 10 real servers, N set members, N addresses on kube-ipvs0,
// with N from KPROXY_IPVS_SCALE (skipped without it). It measures, it
// does not judge: run it in the VM through the gate,
//
//	KPROXY_IPVS_SCALE=1000 go test -count=1 -p 1 ./internal/kernel/ipvs -run TestKernelVM -v
func TestKernelScale(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("KPROXY_IPVS_SCALE"))
	if n <= 0 {
		t.Skip("KPROXY_IPVS_SCALE=<services> runs it")
	}
	if n > 60000 {
		t.Fatalf("KPROXY_IPVS_SCALE=%d: at most 60000 (distinct addresses and ports here)", n)
	}
	ipvs.RequireVMKernel(t)
	ns := netns.New(t, "scale-"+netns.RandomID(3), "node")
	path := "/run/netns/" + ns.Name
	iv, err := ipvs.NewHandle(path)
	if err != nil {
		t.Fatal(err)
	}
	defer iv.Close()
	sets, err := ipset.NewHandle(path)
	if err != nil {
		t.Fatal(err)
	}
	defer sets.Close()
	nd, err := netdev.NewHandle(path)
	if err != nil {
		t.Fatal(err)
	}
	defer nd.Close()

	vip := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{198, 19, byte(i >> 8), byte(i)}) }
	vsOfI := func(i int) ipvs.VirtualServer {
		return ipvs.VirtualServer{Protocol: syscall.IPPROTO_TCP, Addr: vip(i), Port: 80}
	}
	timed := func(what string, ops int, fn func() error) {
		t.Helper()
		start := time.Now()
		if err := fn(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		d := time.Since(start)
		t.Logf("%-45s %6d calls %10v  %8v/call", what, ops, d.Round(time.Millisecond), (d / time.Duration(max(ops, 1))).Round(time.Microsecond))
	}
	t.Logf("scale %d services × 10 real servers (emulated CPU when in the TCG VM)", n)
	timed("add virtual servers", n, func() error {
		for i := range n {
			if err := iv.AddService(ipvs.Service{VirtualServer: vsOfI(i), Scheduler: "rr"}); err != nil {
				return err
			}
		}
		return nil
	})
	timed("add real servers", n*10, func() error {
		for i := range n {
			for j := range 10 {
				d := ipvs.Destination{Addr: netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}), Port: uint16(8000 + j), Weight: 1}
				if err := iv.AddDestination(vsOfI(i), d); err != nil {
					return err
				}
			}
		}
		return nil
	})
	timed("list virtual servers", 1, func() error {
		s, err := iv.Services()
		if err == nil && len(s) != n {
			err = fmt.Errorf("%d listed, want %d", len(s), n)
		}
		return err
	})
	timed("list real servers of every virtual server", n, func() error {
		for i := range n {
			ds, err := iv.Destinations(vsOfI(i))
			if err == nil && len(ds) != 10 {
				err = fmt.Errorf("%v: %d real servers", vsOfI(i), len(ds))
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
	timed("one real server to weight 0", 1, func() error {
		return iv.UpdateDestination(vsOfI(n/2), ipvs.Destination{Addr: netip.AddrFrom4([4]byte{198, 18, byte((n / 2) >> 8), byte(n / 2)}), Port: 8000})
	})

	timed("create hash:ip,port set", 1, func() error {
		return sets.Create(ipset.Set{Name: "KUBE-CLUSTER-IP", Type: "hash:ip,port", Comment: "x"})
	})
	timed("add set members", n, func() error {
		for i := range n {
			if err := sets.Add("KUBE-CLUSTER-IP", vip(i).String()+",tcp:80"); err != nil {
				return err
			}
		}
		return nil
	})
	timed("list set members", 1, func() error {
		e, err := sets.Entries("KUBE-CLUSTER-IP")
		if err == nil && len(e) != n {
			err = fmt.Errorf("%d listed, want %d", len(e), n)
		}
		return err
	})

	if _, err := nd.EnsureDummy(ipvs.DummyDevice); err != nil {
		t.Fatal(err)
	}
	timed("bind addresses to kube-ipvs0", n, func() error {
		for i := range n {
			if err := nd.AddAddress(ipvs.DummyDevice, vip(i)); err != nil {
				return err
			}
		}
		return nil
	})
	timed("list kube-ipvs0's addresses", 1, func() error {
		a, err := nd.Addresses(ipvs.DummyDevice)
		if err == nil && len(a) != n {
			err = fmt.Errorf("%d listed, want %d", len(a), n)
		}
		return err
	})
	// The namespace goes at the end of the test, and with it every
	// virtual server, set and address made here.
}
