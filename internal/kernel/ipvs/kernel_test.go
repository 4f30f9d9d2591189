package ipvs

// Kernel tests: as root, in a fresh network namespace per case, set up what
// kube-proxy's IPVS mode leaves (kube-ipvs0 with service addresses, its
// ipsets, virtual servers where the kernel has IPVS) next to other tools'
// sets, run CleanupLeftovers there and check what is left.
//
// kube-proxy makes kube-ipvs0 a dummy interface; kernels without
// CONFIG_DUMMY (this project's test machines) get a veth of that name: the
// cleanup deletes the interface by name whatever its type. Address ranges:
// see ipvs_test.go.

import (
	"context"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/kproxy/kproxy/internal/testutil/netns"
	"github.com/kproxy/kproxy/internal/testutil/vm"
)

// vmModules are loaded up front when TestKernelVM boots the test VM (an
// on-demand load costs seconds there): IPVS with the schedulers the tests
// use, every ipset type ipvs mode makes, dummy links, and what an iptables
// rule matching a set needs.
var vmModules = []string{
	"ip_vs", "ip_vs_rr", "ip_vs_wrr", "ip_vs_sh", "ip_vs_mh",
	"ip_set", "ip_set_hash_ip", "ip_set_hash_ipport", "ip_set_hash_ipportip",
	"ip_set_hash_ipportnet", "ip_set_hash_net", "ip_set_bitmap_port",
	"dummy", "xt_set", "nft_compat",
}

// vmTests are this package's tests that need a kernel with IPVS, every
// ipset type and dummy links; TestKernelVM runs them all in one VM boot.
const vmTests = "^(TestKernelVirtualServers|TestKernelConformance.*|TestKernelScale)$"

// vmKernelMissing says what the running kernel lacks of what vmTests
// need ("" for nothing).
func vmKernelMissing() string {
	if vm.InVM() {
		return ""
	}
	for _, f := range []struct{ path, what string }{
		{"/proc/net/ip_vs", "IPVS (ip_vs)"},
		{"/sys/module/dummy", "dummy links"},
		{"/sys/module/ip_set", "ipset"},
	} {
		if _, err := os.Stat(f.path); err != nil {
			return "this kernel has no " + f.what + " loaded (" + f.path + ")"
		}
	}
	return ""
}

// requireVMKernel skips a test of vmTests on a host kernel that lacks what
// it needs: TestKernelVM runs it in the test VM then.
func requireVMKernel(t *testing.T) {
	t.Helper()
	netns.Require(t)
	if why := vmKernelMissing(); why != "" {
		t.Skipf("%s: TestKernelVM runs this test in the test VM", why)
	}
}

// TestKernelVM is the gate of this package's VM tests: when the host
// kernel lacks IPVS, dummy links or ipset, it boots the test VM once and
// runs every test of vmTests there. Without a VM it skips, saying why,
// unless KPROXY_VM=1 (CI), where it fails.
func TestKernelVM(t *testing.T) {
	netns.Require(t)
	if vm.InVM() {
		t.Skip("the gate does not run inside the VM")
	}
	why := vmKernelMissing()
	if why == "" {
		t.Skip("the host kernel has IPVS, dummy links and ipset: the tests ran on the host")
	}
	avail, whyNot := vm.Available()
	switch {
	case avail:
		t.Logf("%s: running %s in the test VM", why, vmTests)
		defer func(m []string) { vm.DefaultModules = m }(vm.DefaultModules)
		vm.DefaultModules = append(slices.Clone(vm.DefaultModules), vmModules...)
		start := time.Now()
		vm.RunTestInVM(t, vmTests)
		t.Logf("VM boot and tests took %v", time.Since(start).Round(time.Second))
		return
	case vm.Required():
		t.Fatalf("%s, and no test VM: %s (KPROXY_VM=1 requires one)", why, whyNot)
	}
	t.Skipf("kernel test skipped: %s, and no test VM: %s (test/vm/prepare.sh makes one)", why, whyNot)
}

type kernelNS struct {
	ns *netns.NS
	h  *netlink.Handle
}

func newKernelNS(t *testing.T) *kernelNS {
	t.Helper()
	netns.Require(t)
	ns := netns.New(t, "ipvs-"+netns.RandomID(3), "node")
	nsh, err := vnetns.GetFromName(ns.Name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nsh.Close() })
	h, err := netlink.NewHandleAt(nsh)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return &kernelNS{ns: ns, h: h}
}

func (k *kernelNS) opts() []Option { return []Option{WithNetNSPath("/run/netns/" + k.ns.Name)} }

// addKubeIPVS0 creates kube-ipvs0 with the service addresses bound.
func (k *kernelNS) addKubeIPVS0(t *testing.T, addrs ...string) {
	t.Helper()
	if err := netns.Veth(k.ns, DummyDevice, k.ns, "kipvs-peer"); err != nil {
		t.Fatal(err)
	}
	for _, s := range addrs {
		ip := netip.MustParseAddr(s)
		if err := k.ns.AddAddr(DummyDevice, netip.PrefixFrom(ip, ip.BitLen())); err != nil {
			t.Fatal(err)
		}
	}
}

type testSet struct {
	name, typ string
	v6        bool
	ips       []string
	ports     []uint16
}

func (k *kernelNS) addSets(t *testing.T, sets ...testSet) {
	t.Helper()
	for _, s := range sets {
		o := netlink.IpsetCreateOptions{Family: unix.AF_INET}
		if s.v6 {
			o.Family = unix.AF_INET6
		}
		if s.typ == "bitmap:port" {
			o = netlink.IpsetCreateOptions{PortFrom: 0, PortTo: 65535}
		}
		if err := k.h.IpsetCreate(s.name, s.typ, o); err != nil {
			t.Fatalf("creating ipset %s: %v", s.name, err)
		}
		// hash:ip,port entries pair ips[i] with ports[i].
		for i, ip := range s.ips {
			e := &netlink.IPSetEntry{IP: net.ParseIP(ip)}
			if i < len(s.ports) {
				e.Port = &s.ports[i]
			}
			if err := k.h.IpsetAdd(s.name, e); err != nil {
				t.Fatalf("adding %s to %s: %v", ip, s.name, err)
			}
		}
	}
}

func (k *kernelNS) setNames(t *testing.T) []string {
	t.Helper()
	res, err := k.h.IpsetListAll()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range res {
		names = append(names, r.SetName)
	}
	slices.Sort(names)
	return names
}

func (k *kernelNS) hasLink(t *testing.T, name string) bool {
	t.Helper()
	_, err := k.h.LinkByName(name)
	if _, ok := err.(netlink.LinkNotFoundError); ok {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return true
}

// kubeProxySets are sets as kube-proxy's IPVS mode makes them, filled.
var kubeProxySets = []testSet{
	{name: "KUBE-CLUSTER-IP", typ: "hash:ip,port"},
	{name: "KUBE-LOOP-BACK", typ: "hash:ip,port,ip"},
	{name: "KUBE-IPVS-IPS", typ: "hash:ip", ips: []string{"10.96.0.1", "10.96.0.10"}},
	{name: "KUBE-6-IPVS-IPS", typ: "hash:ip", v6: true, ips: []string{"fd00:96::1"}},
	{name: "KUBE-6-LOAD-BALANCER-SOURCE-CID", typ: "hash:ip,port,net", v6: true}, // name cut to 31
	// Empty: vishvananda/netlink cannot add to bitmap:port sets (the
	// kernel rejects the protocol attribute it always sends).
	{name: "KUBE-NODE-PORT-TCP", typ: "bitmap:port"},
	{name: "KUBE-HEALTH-CHECK-NODE-PORT", typ: "bitmap:port"},
}

// otherSets belong to kube-router and the user.
var otherSets = []testSet{
	{name: "KUBE-SRC-DQZ3TM3B6LDWP5K4", typ: "hash:ip"},
	{name: "KUBE-DST-DQZ3TM3B6LDWP5K4", typ: "hash:ip"},
	{name: "user-allowed", typ: "hash:net"},
}

func TestKernelCleanupLeftovers(t *testing.T) {
	k := newKernelNS(t)
	k.addKubeIPVS0(t, "10.96.0.1", "10.96.0.10", "fd00:96::1")
	k.addSets(t, kubeProxySets...)
	k.addSets(t, otherSets...)
	ctx := context.Background()

	l, err := FindLeftovers(ctx, k.opts()...)
	if err != nil {
		t.Fatal(err)
	}
	want := Leftovers{
		Link:        DummyDevice,
		IPSets:      []string{"KUBE-6-IPVS-IPS", "KUBE-6-LOAD-BALANCER-SOURCE-CID", "KUBE-CLUSTER-IP", "KUBE-HEALTH-CHECK-NODE-PORT", "KUBE-IPVS-IPS", "KUBE-LOOP-BACK", "KUBE-NODE-PORT-TCP"},
		IPVSChecked: l.IPVSChecked, // depends on the kernel
	}
	slices.Sort(l.IPSets)
	if d := cmp.Diff(want, l, equateAddrs); d != "" {
		t.Errorf("FindLeftovers (-want +got):\n%s", d)
	}
	if !l.IPVSChecked {
		t.Log("this kernel has no IPVS (no IPVS generic netlink family): virtual servers are not part of this test")
	}

	if err := CleanupLeftovers(ctx, k.opts()...); err != nil {
		t.Fatal(err)
	}
	if k.hasLink(t, DummyDevice) {
		t.Errorf("%s still exists", DummyDevice)
	}
	if !k.hasLink(t, "lo") {
		t.Error("lo is gone")
	}
	if d := cmp.Diff([]string{"KUBE-DST-DQZ3TM3B6LDWP5K4", "KUBE-SRC-DQZ3TM3B6LDWP5K4", "user-allowed"}, k.setNames(t)); d != "" {
		t.Errorf("sets after cleanup (-want +got):\n%s", d)
	}
	if l, err := FindLeftovers(ctx, k.opts()...); err != nil || !l.Empty() {
		t.Errorf("FindLeftovers after cleanup = %+v, %v; want empty", l, err)
	}
	if err := CleanupLeftovers(ctx, k.opts()...); err != nil {
		t.Errorf("second cleanup: %v", err)
	}
}

// TestKernelSetInUse: a set an iptables rule still matches cannot be
// destroyed; the error names it and the rest is removed all the same.
func TestKernelSetInUse(t *testing.T) {
	netns.Require(t, "iptables-nft-restore")
	k := newKernelNS(t)
	k.addKubeIPVS0(t, "10.96.0.1")
	k.addSets(t, kubeProxySets...)
	cmd := exec.Command("ip", "netns", "exec", k.ns.Name, "iptables-nft-restore", "--noflush")
	cmd.Stdin = strings.NewReader("*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT\nCOMMIT\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("iptables-nft-restore: %v: %s", err, out)
	}
	err := CleanupLeftovers(context.Background(), k.opts()...)
	if err == nil || !strings.Contains(err.Error(), "destroying ipset KUBE-CLUSTER-IP") {
		t.Fatalf("err = %v, want one about KUBE-CLUSTER-IP", err)
	}
	if d := cmp.Diff([]string{"KUBE-CLUSTER-IP"}, k.setNames(t)); d != "" {
		t.Errorf("sets left (-want +got):\n%s", d)
	}
	if k.hasLink(t, DummyDevice) {
		t.Errorf("%s still exists", DummyDevice)
	}
}

// TestKernelVirtualServers needs a kernel with IPVS; it creates kube-proxy's
// virtual servers and another load balancer's, and checks that only
// kube-proxy's go. On a host kernel without IPVS (CONFIG_IP_VS off, as on
// this project's CI machines) TestKernelVM runs it inside the test VM.
func TestKernelVirtualServers(t *testing.T) {
	requireVMKernel(t)
	k := newKernelNS(t)
	kern, err := newNetlinkKernel("/run/netns/" + k.ns.Name)
	if err != nil {
		t.Fatal(err)
	}
	defer kern.close()
	ok, err := kern.ipvsAvailable()
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Fatal("this kernel has no IPVS (CONFIG_IP_VS off or ip_vs not loaded: no IPVS generic netlink family)")
	}
	k.addKubeIPVS0(t, "10.96.0.1")
	if err := netns.Veth(k.ns, "eth0", k.ns, "eth0-peer"); err != nil {
		t.Fatal(err)
	}
	if err := k.ns.AddAddr("eth0", netip.MustParsePrefix("192.168.1.5/24")); err != nil {
		t.Fatal(err)
	}
	// NodePorts come from KUBE-NODE-PORT-TCP; a hash:ip,port set of that
	// name stands in for kube-proxy's bitmap:port (see kubeProxySets).
	k.addSets(t, testSet{name: "KUBE-NODE-PORT-TCP", typ: "hash:ip,port", ips: []string{"192.168.1.5"}, ports: []uint16{30080}})
	ours := []VirtualServer{tcp("10.96.0.1", 443), tcp("192.168.1.5", 30080)}
	others := []VirtualServer{tcp("192.0.2.10", 443), tcp("192.168.1.5", 8443)}
	for _, vs := range append(slices.Clone(ours), others...) {
		if err := addVirtualServer(kern, vs); err != nil {
			t.Fatalf("adding %v: %v", vs, err)
		}
	}
	if err := CleanupLeftovers(context.Background(), k.opts()...); err != nil {
		t.Fatal(err)
	}
	left, err := kern.virtualServers()
	if err != nil {
		t.Fatal(err)
	}
	for i := range left {
		left[i].Family = 0
	}
	if d := cmp.Diff(others, left, equateAddrs, cmpSortVS); d != "" {
		t.Errorf("virtual servers left (-want +got):\n%s", d)
	}
}

var cmpSortVS = cmp.Transformer("sort", func(in []VirtualServer) []string {
	var out []string
	for _, v := range in {
		out = append(out, v.String())
	}
	slices.Sort(out)
	return out
})

// addVirtualServer sends IPVS_CMD_NEW_SERVICE with the attributes a new
// service needs: scheduler, flags, timeout and netmask.
func addVirtualServer(k *netlinkKernel, vs VirtualServer) error {
	req, err := k.ipvsRequest(1 /* IPVS_CMD_NEW_SERVICE */, unix.NLM_F_ACK)
	if err != nil {
		return err
	}
	svc := serviceAttr(vs)
	svc.AddRtAttr(6, nl.ZeroTerminated("rr"))   // SCHED_NAME
	svc.AddRtAttr(7, make([]byte, 8))           // FLAGS: struct ip_vs_flags {flags, mask}
	svc.AddRtAttr(8, nl.Uint32Attr(0))          // TIMEOUT
	svc.AddRtAttr(9, nl.Uint32Attr(0xffffffff)) // NETMASK
	req.AddData(svc)
	_, err = req.Execute(unix.NETLINK_GENERIC, 0)
	return err
}

// TestKernelNewHandleWithoutIPVS: on a kernel without IPVS NewHandle
// fails, saying so (moby/ipvs alone would hand back a Handle whose every
// call succeeds and lists nothing).
func TestKernelNewHandleWithoutIPVS(t *testing.T) {
	netns.Require(t)
	if _, err := os.Stat(procIPVS); err == nil || vm.InVM() {
		t.Skip("this kernel has IPVS loaded")
	}
	if out, err := exec.Command("modprobe", "-n", "ip_vs").CombinedOutput(); err == nil {
		t.Skipf("ip_vs can be loaded here (modprobe -n: %s)", out)
	}
	ns := netns.New(t, "ipvs-"+netns.RandomID(3), "node")
	h, err := NewHandle("/run/netns/" + ns.Name)
	if err == nil {
		h.Close()
		t.Fatal("NewHandle on a kernel without IPVS: no error")
	}
	if !strings.Contains(err.Error(), "no IPVS") {
		t.Errorf("err = %v, want one saying the kernel has no IPVS", err)
	}
}
