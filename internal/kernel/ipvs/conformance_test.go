package ipvs_test

// Conformance: the same scenarios run against the stateful fakes
// (ipvstest, ipsettest, netdevtest) and against the real Handles in a
// fresh network namespace of a kernel with IPVS, ipset and dummy links
// (the test VM; TestKernelVM boots it once for all of them), and must give
// the same transcript: listings, and for every call its error class
// (EEXIST, ipset.ErrNoEntry, ...). Addresses: 198.19.0.0/16 and
// fd00:19::/64 for services, 198.18.0.0/16 and fd00:18::/64 for pods.

import (
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kproxy/kproxy/internal/kernel/ipset"
	"github.com/kproxy/kproxy/internal/kernel/ipset/ipsettest"
	"github.com/kproxy/kproxy/internal/kernel/ipvs"
	"github.com/kproxy/kproxy/internal/kernel/ipvs/ipvstest"
	"github.com/kproxy/kproxy/internal/kernel/netdev"
	"github.com/kproxy/kproxy/internal/kernel/netdev/netdevtest"
	"github.com/kproxy/kproxy/internal/kernel/sysctl"
	"github.com/kproxy/kproxy/internal/testutil/netns"
)

// env is one side of the comparison.
type env struct {
	ipvs   ipvs.Handle
	ipset  ipset.Handle
	netdev netdev.Handle
	// timeouts reads IPVS's timeouts back.
	timeouts func() (ipvs.Timeouts, error)
	// setInUse makes an iptables rule match the set (the fake: SetInUse).
	setInUse func(name string, inUse bool) error
}

func fakeEnv(t *testing.T) *env {
	iv, is, nd := ipvstest.New(), ipsettest.New(), netdevtest.New()
	return &env{
		ipvs: iv, ipset: is, netdev: nd,
		timeouts: func() (ipvs.Timeouts, error) { return iv.Timeouts(), nil },
		setInUse: is.SetInUse,
	}
}

func kernelEnv(t *testing.T) *env {
	t.Helper()
	ns := netns.New(t, "conf-"+netns.RandomID(3), "node")
	path := "/run/netns/" + ns.Name
	iv, err := ipvs.NewHandle(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(iv.Close)
	is, err := ipset.NewHandle(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(is.Close)
	nd, err := netdev.NewHandle(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nd.Close)
	return &env{
		ipvs: iv, ipset: is, netdev: nd,
		timeouts: func() (ipvs.Timeouts, error) { return ipvs.GetTimeouts(iv) },
		setInUse: func(name string, inUse bool) error {
			op := "-A"
			if !inUse {
				op = "-D"
			}
			cmd := exec.Command("ip", "netns", "exec", ns.Name, "iptables-nft", "-w", op, "INPUT", "-m", "set", "--match-set", name, "dst", "-j", "ACCEPT")
			if out, err := cmd.CombinedOutput(); err != nil {
				return fmt.Errorf("%v: %v: %s", cmd.Args, err, out)
			}
			return nil
		},
	}
}

// errClasses are the errors the Handles promise, most specific first
// (the ipset and netdev errors wrap the kernel's errno).
var errClasses = []struct {
	name string
	err  error
}{
	{"ipset.ErrNoSet", ipset.ErrNoSet},
	{"ipset.ErrSetExists", ipset.ErrSetExists},
	{"ipset.ErrEntryExists", ipset.ErrEntryExists},
	{"ipset.ErrNoEntry", ipset.ErrNoEntry},
	{"ipset.ErrBadEntry", ipset.ErrBadEntry},
	{"ipset.ErrBadSet", ipset.ErrBadSet},
	{"ipset.ErrInUse", ipset.ErrInUse},
	{"netdev.ErrNoLink", netdev.ErrNoLink},
	{"netdev.ErrNotDummy", netdev.ErrNotDummy},
	{"netdev.ErrAddrExists", netdev.ErrAddrExists},
	{"netdev.ErrNoAddr", netdev.ErrNoAddr},
	{"netdev.ErrBadArg", netdev.ErrBadArg},
	{"EEXIST", syscall.EEXIST},
	{"ESRCH", syscall.ESRCH},
	{"ENOENT", syscall.ENOENT},
	{"ERANGE", syscall.ERANGE},
	{"EINVAL", syscall.EINVAL},
}

func class(err error) string {
	if err == nil {
		return "ok"
	}
	for _, c := range errClasses {
		if errors.Is(err, c.err) {
			return c.name
		}
	}
	return "error"
}

// transcript records one line per step.
type transcript struct {
	t     *testing.T
	lines []string
}

func (tr *transcript) step(what string, err error) {
	tr.t.Helper()
	tr.lines = append(tr.lines, what+": "+class(err))
	if class(err) == "error" {
		tr.t.Logf("%s: unclassified error: %v", what, err)
	}
}

func (tr *transcript) list(what string, items []string, err error) {
	tr.t.Helper()
	slices.Sort(items)
	tr.lines = append(tr.lines, fmt.Sprintf("%s: %s [%s]", what, class(err), strings.Join(items, " ")))
	if class(err) == "error" {
		tr.t.Logf("%s: unclassified error: %v", what, err)
	}
}

// compare runs scenario on the fakes and on the kernel and requires the
// same transcript.
func compare(t *testing.T, scenario func(*transcript, *env)) {
	t.Helper()
	ipvs.RequireVMKernel(t)
	fake := &transcript{t: t}
	scenario(fake, fakeEnv(t))
	kern := &transcript{t: t}
	scenario(kern, kernelEnv(t))
	if d := cmp.Diff(fake.lines, kern.lines); d != "" {
		t.Errorf("fake and kernel differ (-fake +kernel):\n%s", d)
	}
	if len(fake.lines) < 10 {
		t.Fatalf("the scenario recorded only %d steps", len(fake.lines))
	}
	t.Logf("%d steps agree:\n%s", len(kern.lines), strings.Join(kern.lines, "\n"))
}

func svcString(s ipvs.Service) string {
	return fmt.Sprintf("%v/af%d/%s/flags%#x/timeout%d", s.VirtualServer, s.Family, s.Scheduler, s.Flags, s.Timeout)
}

func services(h ipvs.Handle) ([]string, error) {
	ss, err := h.Services()
	var out []string
	for _, s := range ss {
		out = append(out, svcString(s))
	}
	return out, err
}

func dests(h ipvs.Handle, vs ipvs.VirtualServer) ([]string, error) {
	ds, err := h.Destinations(vs)
	var out []string
	for _, d := range ds {
		out = append(out, fmt.Sprintf("%s w%d a%d i%d", netip.AddrPortFrom(d.Addr, d.Port), d.Weight, d.ActiveConns, d.InactiveConns))
	}
	return out, err
}

func vsOf(proto uint16, addr string, port uint16) ipvs.VirtualServer {
	return ipvs.VirtualServer{Protocol: proto, Addr: netip.MustParseAddr(addr), Port: port}
}

func dest(addr string, port uint16, w int) ipvs.Destination {
	return ipvs.Destination{Addr: netip.MustParseAddr(addr), Port: port, Weight: w}
}

func TestKernelConformanceIPVS(t *testing.T) {
	compare(t, func(tr *transcript, e *env) {
		h := e.ipvs
		tcp4 := vsOf(syscall.IPPROTO_TCP, "198.19.0.1", 80)
		udp6 := vsOf(syscall.IPPROTO_UDP, "fd00:19::1", 53)
		sctp4 := vsOf(syscall.IPPROTO_SCTP, "198.19.0.2", 3868)
		tcp6 := vsOf(syscall.IPPROTO_TCP, "fd00:19::2", 443)
		fwmark := ipvs.VirtualServer{FWMark: 0x4000}
		missing := vsOf(syscall.IPPROTO_TCP, "198.19.0.99", 80)

		tr.list("services initially", nil, nil)
		tr.step("add tcp4", h.AddService(ipvs.Service{VirtualServer: tcp4, Scheduler: "rr"}))
		tr.step("add tcp4 again", h.AddService(ipvs.Service{VirtualServer: tcp4, Scheduler: "rr"}))
		tr.step("add udp6 persistent", h.AddService(ipvs.Service{VirtualServer: udp6, Scheduler: "wrr", Flags: ipvs.FlagPersistent, Timeout: 10800}))
		tr.step("add sctp4 sh", h.AddService(ipvs.Service{VirtualServer: sctp4, Scheduler: "sh"}))
		tr.step("add tcp6 mh", h.AddService(ipvs.Service{VirtualServer: tcp6, Scheduler: "mh"}))
		tr.step("add foreign fwmark", h.AddService(ipvs.Service{VirtualServer: fwmark, Scheduler: "rr"}))
		tr.step("add unknown scheduler", h.AddService(ipvs.Service{VirtualServer: missing, Scheduler: "nosuchsched"}))
		l, err := services(h)
		tr.list("services", l, err)

		tr.step("update tcp4 to sh persistent", h.UpdateService(ipvs.Service{VirtualServer: tcp4, Scheduler: "sh", Flags: ipvs.FlagPersistent, Timeout: 60}))
		tr.step("update udp6 not persistent", h.UpdateService(ipvs.Service{VirtualServer: udp6, Scheduler: "wrr"}))
		tr.step("update missing", h.UpdateService(ipvs.Service{VirtualServer: missing, Scheduler: "rr"}))
		tr.step("delete missing", h.DeleteService(missing))
		l, err = services(h)
		tr.list("services after updates", l, err)

		for _, d := range []ipvs.Destination{dest("198.18.1.1", 8080, 1), dest("198.18.1.2", 8080, 1), dest("198.18.1.2", 8081, 5)} {
			tr.step("add dest "+d.Addr.String(), h.AddDestination(tcp4, d))
		}
		tr.step("add dest again", h.AddDestination(tcp4, dest("198.18.1.1", 8080, 1)))
		tr.step("add dest to missing", h.AddDestination(missing, dest("198.18.1.1", 8080, 1)))
		tr.step("add IPv6 dest to missing IPv4 service", h.AddDestination(missing, dest("fd00:18::1", 8080, 1)))
		tr.step("add dest negative weight", h.AddDestination(tcp4, dest("198.18.1.3", 8080, -1)))
		tr.step("add IPv4 dest to IPv6 service", h.AddDestination(udp6, dest("198.18.1.1", 5353, 1)))
		tr.step("add dest6", h.AddDestination(udp6, dest("fd00:18::5", 5353, 1)))
		tr.step("add dest6 2", h.AddDestination(udp6, dest("fd00:18::6", 5353, 1)))
		tr.step("add sctp dest", h.AddDestination(sctp4, dest("198.18.2.1", 3868, 1)))
		l, err = dests(h, tcp4)
		tr.list("dests tcp4", l, err)
		l, err = dests(h, udp6)
		tr.list("dests udp6", l, err)
		l, err = dests(h, missing)
		tr.list("dests of missing", l, err)

		tr.step("weight 0", h.UpdateDestination(tcp4, dest("198.18.1.1", 8080, 0)))
		tr.step("update missing dest", h.UpdateDestination(tcp4, dest("198.18.1.9", 8080, 1)))
		tr.step("update dest of missing", h.UpdateDestination(missing, dest("198.18.1.1", 8080, 1)))
		tr.step("delete dest", h.DeleteDestination(tcp4, dest("198.18.1.2", 8081, 5)))
		tr.step("delete dest again", h.DeleteDestination(tcp4, dest("198.18.1.2", 8081, 5)))
		tr.step("delete dest of missing", h.DeleteDestination(missing, dest("198.18.1.2", 8081, 5)))
		tr.step("delete dest6", h.DeleteDestination(udp6, dest("fd00:18::6", 5353, 1)))
		l, err = dests(h, tcp4)
		tr.list("dests tcp4 after", l, err)
		l, err = dests(h, udp6)
		tr.list("dests udp6 after", l, err)

		tr.step("delete tcp4 with dests", h.DeleteService(tcp4))
		l, err = dests(h, tcp4)
		tr.list("dests of deleted tcp4", l, err)
		tr.step("re-add tcp4", h.AddService(ipvs.Service{VirtualServer: tcp4, Scheduler: "rr"}))
		l, err = dests(h, tcp4)
		tr.list("dests of re-added tcp4", l, err)
		// The Family is filled in by both when it is left 0; a key with
		// the family set finds the same service.
		withFamily := udp6
		withFamily.Family = syscall.AF_INET6
		l, err = dests(h, withFamily)
		tr.list("dests udp6 by family", l, err)

		// rr is in use (no probe); lc and dh are not (a probe virtual
		// server loads ip_vs_lc and ip_vs_dh).
		for _, s := range []string{"rr", "lc", "dh", ""} {
			tr.step("check scheduler "+s, ipvs.CheckScheduler(h, s))
		}
		tr.step("check scheduler bogus", ipvs.CheckScheduler(h, "bogus"))
		l, err = services(h)
		tr.list("services after checks (no probe left)", l, err)

		to, err := e.timeouts()
		tr.list("default timeouts", []string{fmt.Sprint(to)}, err)
		tr.step("set timeouts", h.SetTimeouts(ipvs.Timeouts{TCP: 901, TCPFin: 121, UDP: 301}))
		tr.step("set udp timeout only", h.SetTimeouts(ipvs.Timeouts{UDP: 77}))
		to, err = e.timeouts()
		tr.list("timeouts", []string{fmt.Sprint(to)}, err)

		for _, vs := range []ipvs.VirtualServer{tcp4, udp6, sctp4, tcp6, fwmark} {
			tr.step("delete "+vs.String(), h.DeleteService(vs))
		}
		l, err = services(h)
		tr.list("services at the end", l, err)
	})
}

// ipsetCases: per set type, members to add (in any accepted form) and
// one that does not fit.
var ipsetCases = []struct {
	typ        string
	v6         bool
	add        []string
	misfit     []string
	nonMember  string
	deleteForm string // a member in another form than added
}{
	{"hash:ip", false, []string{"198.19.0.1", "198.19.0.2"}, []string{"fd00::1", "198.19.0.1,tcp:80"}, "198.19.0.3", "198.19.0.2"},
	{"hash:ip", true, []string{"fd00:19::1", "FD00:19:0::2"}, []string{"198.19.0.1"}, "fd00:19::3", "fd00:19::2"},
	{"hash:ip,port", false, []string{"198.19.0.1,tcp:80", "198.19.0.1,udp:53", "198.19.0.2,sctp:3868"}, []string{"198.19.0.1", "198.19.0.1,icmp:8"}, "198.19.0.1,tcp:81", "198.19.0.1,udp:53"},
	{"hash:ip,port", true, []string{"fd00:19::1,tcp:80", "fd00:19::1,udp:53"}, []string{"198.19.0.1,tcp:80"}, "fd00:19::1,sctp:80", "fd00:19::1,udp:53"},
	{"hash:ip,port,ip", false, []string{"198.18.0.5,tcp:8080,198.18.0.5", "198.18.0.6,udp:53,198.18.0.6"}, []string{"198.18.0.5,tcp:8080,198.18.0.0/24"}, "198.18.0.7,tcp:8080,198.18.0.7", "198.18.0.6,udp:53,198.18.0.6"},
	{"hash:ip,port,ip", true, []string{"fd00:18::5,tcp:8080,fd00:18::5"}, []string{"fd00:18::5,tcp:8080"}, "fd00:18::6,tcp:8080,fd00:18::6", "fd00:18::5,tcp:8080,fd00:18::5"},
	{"hash:ip,port,net", false, []string{"198.19.0.1,tcp:80,198.18.0.7/24", "198.19.0.1,tcp:80,198.18.5.5/32", "198.19.0.2,udp:53,198.18.9.9"}, []string{"198.19.0.1,tcp:80,0.0.0.0/0", "198.19.0.1,tcp:80"}, "198.19.0.1,tcp:80,198.18.1.0/24", "198.19.0.1,tcp:80,198.18.5.5"},
	{"hash:ip,port,net", true, []string{"fd00:19::1,tcp:80,fd00:18::/64", "fd00:19::1,tcp:80,fd00:18::1:1/128"}, []string{"fd00:19::1,tcp:80,198.18.0.0/16"}, "fd00:19::1,tcp:80,fd00:18:1::/64", "fd00:19::1,tcp:80,fd00:18::/64"},
	{"hash:net", false, []string{"198.18.0.0/16", "198.19.3.3/32", "10.1.2.3/8"}, []string{"198.18.0.0/0", "fd00::/8"}, "198.20.0.0/16", "10.0.0.0/8"},
	{"hash:net", true, []string{"fd00:18::/64", "fd00:19::1"}, []string{"198.18.0.0/16"}, "fd00:20::/64", "fd00:19::1/128"},
	{"bitmap:port", false, []string{"30080", "0", "65535"}, []string{"tcp:30080", "65536", "198.19.0.1"}, "30081", "65535"},
}

func TestKernelConformanceIPSet(t *testing.T) {
	compare(t, func(tr *transcript, e *env) {
		h := e.ipset
		l, err := h.Sets()
		tr.list("sets initially", l, err)
		var names []string
		for i, c := range ipsetCases {
			name := fmt.Sprintf("KPT-%d-%s", i, strings.ReplaceAll(c.typ, ",", "-"))
			names = append(names, name)
			s := ipset.Set{Name: name, Type: c.typ, IPv6: c.v6}
			if i%2 == 0 {
				s.Comment = "as upstream: sets with a comment"
			}
			tr.step(name+" create", h.Create(s))
			tr.step(name+" create again", h.Create(s))
			other := s
			other.Type = "hash:ip,port"
			if c.typ == other.Type {
				other.Type = "hash:ip"
			}
			tr.step(name+" create with another type", h.Create(other))
			if c.typ != "bitmap:port" {
				other = s
				other.IPv6 = !s.IPv6
				tr.step(name+" create with another family", h.Create(other))
			}
			for _, a := range c.add {
				tr.step(name+" add "+a, h.Add(name, a))
			}
			tr.step(name+" add again "+c.add[0], h.Add(name, c.add[0]))
			for _, m := range c.misfit {
				tr.step(name+" add misfit "+m, h.Add(name, m))
			}
			l, err := h.Entries(name)
			tr.list(name+" entries", l, err)
			tr.step(name+" del non-member", h.Del(name, c.nonMember))
			tr.step(name+" del "+c.deleteForm, h.Del(name, c.deleteForm))
			tr.step(name+" del again", h.Del(name, c.deleteForm))
			l, err = h.Entries(name)
			tr.list(name+" entries after del", l, err)
			// Every listed entry goes back in as listed (round trip).
			for _, en := range l {
				tr.step(name+" del listed "+en, h.Del(name, en))
				tr.step(name+" add listed "+en, h.Add(name, en))
			}
			l2, err := h.Entries(name)
			tr.list(name+" entries after round trip", l2, err)
		}
		tr.step("create bad name", h.Create(ipset.Set{Name: "KUBE-6-LOAD-BALANCER-SOURCE-CIDR", Type: "hash:ip"}))
		tr.step("create bad type", h.Create(ipset.Set{Name: "KPT-bad", Type: "hash:mac"}))
		l, err = h.Sets()
		tr.list("sets", l, err)

		tr.step("in use", e.setInUse(names[0], true))
		tr.step("destroy in use", h.Destroy(names[0]))
		tr.step("not in use", e.setInUse(names[0], false))
		for _, n := range names {
			tr.step(n+" destroy", h.Destroy(n))
		}
		tr.step("destroy again", h.Destroy(names[0]))
		l, err = h.Entries(names[0])
		tr.list("entries of destroyed", l, err)
		tr.step("add to destroyed", h.Add(names[0], "198.19.0.1"))
		tr.step("del from destroyed", h.Del(names[0], "198.19.0.1"))
		l, err = h.Sets()
		tr.list("sets at the end", l, err)
	})
}

func TestKernelConformanceNetdev(t *testing.T) {
	compare(t, func(tr *transcript, e *env) {
		h := e.netdev
		addrs := func(what string) {
			as, err := h.Addresses(ipvs.DummyDevice)
			var l []string
			for _, a := range as {
				l = append(l, a.String())
			}
			tr.list(what, l, err)
		}
		a4, a6 := netip.MustParseAddr("198.19.0.1"), netip.MustParseAddr("fd00:19::1")
		addrs("addresses before")
		tr.step("add address before", h.AddAddress(ipvs.DummyDevice, a4))
		created, err := h.EnsureDummy(ipvs.DummyDevice)
		tr.list("ensure", []string{fmt.Sprint(created)}, err)
		created, err = h.EnsureDummy(ipvs.DummyDevice)
		tr.list("ensure again", []string{fmt.Sprint(created)}, err)
		_, err = h.EnsureDummy("lo")
		tr.step("ensure on lo", err)
		_, err = h.EnsureDummy("a-name-too-long-")
		tr.step("ensure long name", err)
		for _, a := range []netip.Addr{a6, a4, netip.MustParseAddr("198.19.0.2"), netip.MustParseAddr("fd00:19::2")} {
			tr.step("add "+a.String(), h.AddAddress(ipvs.DummyDevice, a))
		}
		tr.step("add again", h.AddAddress(ipvs.DummyDevice, a4))
		tr.step("add again 6", h.AddAddress(ipvs.DummyDevice, a6))
		tr.step("add invalid", h.AddAddress(ipvs.DummyDevice, netip.Addr{}))
		addrs("addresses")
		tr.step("del "+a4.String(), h.DelAddress(ipvs.DummyDevice, a4))
		tr.step("del again", h.DelAddress(ipvs.DummyDevice, a4))
		tr.step("del "+a6.String(), h.DelAddress(ipvs.DummyDevice, a6))
		tr.step("del again 6", h.DelAddress(ipvs.DummyDevice, a6))
		addrs("addresses after del")
		tr.step("delete link", h.DeleteLink(ipvs.DummyDevice))
		tr.step("delete link again", h.DeleteLink(ipvs.DummyDevice))
		addrs("addresses of deleted")
		tr.step("del address of deleted", h.DelAddress(ipvs.DummyDevice, a4))
	})
}

// TestKernelConformanceTraffic: what the fakes only stand in for, with
// real traffic, IPv4 and IPv6. The real Handles bind a service address to
// kube-ipvs0 (a dummy left down, as upstream's) and send it to a pod: a
// real server's connection counters (which graceful termination reads;
// ipvstest.Fake.SetConns plays them) count an open TCP connection, which
// keeps working at weight 0 while a new one finds no real server; the
// counters drop when it closes. EnsureSysctls sets upstream's ipvs
// sysctls and strictARP in the namespace.
func TestKernelConformanceTraffic(t *testing.T) {
	ipvs.RequireVMKernel(t)
	for _, fam := range []struct {
		name                     string
		nodeIP, podIP, vip, dflt string
	}{
		{"IPv4", "198.18.0.1/24", "198.18.0.2/24", "198.19.0.10", "0.0.0.0/0"},
		{"IPv6", "fd00:18::1/64", "fd00:18::2/64", "fd00:19::10", "::/0"},
	} {
		t.Run(fam.name, func(t *testing.T) {
			id := netns.RandomID(3)
			node := netns.New(t, id, "node")
			pod := netns.New(t, id, "pod")
			if err := netns.Veth(node, "eth-pod", pod, "eth0"); err != nil {
				t.Fatal(err)
			}
			nodeIP, podIP := netip.MustParsePrefix(fam.nodeIP), netip.MustParsePrefix(fam.podIP)
			for _, s := range []struct {
				ns  *netns.NS
				dev string
				p   netip.Prefix
			}{{node, "eth-pod", nodeIP}, {pod, "eth0", podIP}} {
				if err := s.ns.LinkUp(s.dev); err != nil {
					t.Fatal(err)
				}
				if err := s.ns.AddAddr(s.dev, s.p); err != nil {
					t.Fatal(err)
				}
			}
			if err := pod.AddRoute(netip.MustParsePrefix(fam.dflt), nodeIP.Addr()); err != nil {
				t.Fatal(err)
			}
			netns.ServeEcho(t, pod, "pod", "tcp", 8080)
			trafficThroughIPVS(t, node, netip.MustParseAddr(fam.vip), podIP.Addr())
		})
	}
}

func trafficThroughIPVS(t *testing.T, node *netns.NS, vip, podIP netip.Addr) {
	path := "/run/netns/" + node.Name
	nd, err := netdev.NewHandle(path)
	if err != nil {
		t.Fatal(err)
	}
	defer nd.Close()
	iv, err := ipvs.NewHandle(path)
	if err != nil {
		t.Fatal(err)
	}
	defer iv.Close()

	if err := node.Do(func() error { return ipvs.EnsureSysctls(sysctl.Files{}, true, "") }); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{
		"net.ipv4.vs.conntrack": "1", "net.ipv4.vs.expire_nodest_conn": "1",
		"net.ipv4.vs.expire_quiescent_template": "1", "net.ipv4.ip_forward": "1",
		"net.ipv4.conf.all.arp_ignore": "1", "net.ipv4.conf.all.arp_announce": "2",
	} {
		if got, err := node.ReadSysctl(k); err != nil || strings.TrimSpace(got) != want {
			t.Errorf("%s = %q, %v; want %s", k, got, err, want)
		}
	}

	if _, err := nd.EnsureDummy(ipvs.DummyDevice); err != nil {
		t.Fatal(err)
	}
	if err := nd.AddAddress(ipvs.DummyDevice, vip); err != nil {
		t.Fatal(err)
	}
	vs := ipvs.VirtualServer{Protocol: syscall.IPPROTO_TCP, Addr: vip, Port: 80}
	if err := iv.AddService(ipvs.Service{VirtualServer: vs, Scheduler: "rr"}); err != nil {
		t.Fatal(err)
	}
	ep := ipvs.Destination{Addr: podIP, Port: 8080, Weight: 1}
	if err := iv.AddDestination(vs, ep); err != nil {
		t.Fatal(err)
	}
	conns := func() (int, int) {
		t.Helper()
		ds, err := iv.Destinations(vs)
		if err != nil || len(ds) != 1 {
			t.Fatalf("Destinations = %+v, %v", ds, err)
		}
		return ds[0].ActiveConns, ds[0].InactiveConns
	}
	dst := netip.AddrPortFrom(vip, 80)
	s, err := node.OpenSession(dst, netns.DialOptions{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("connecting to %v through IPVS: %v", dst, err)
	}
	defer s.Close()
	if s.Greeting.Server != "pod" {
		t.Fatalf("greeting from %q, want pod", s.Greeting.Server)
	}
	if a, _ := conns(); a != 1 {
		t.Errorf("ActiveConns with one open connection = %d, want 1", a)
	}
	ep.Weight = 0
	if err := iv.UpdateDestination(vs, ep); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Echo("still there", 5*time.Second); err != nil || got != "pod still there" {
		t.Errorf("echo at weight 0 = %q, %v", got, err)
	}
	if r := node.Request("tcp", dst, netns.DialOptions{Timeout: 2 * time.Second}); r.Outcome == netns.Answered {
		t.Errorf("a new connection at weight 0 was answered: %v", r)
	}
	if a, _ := conns(); a != 1 {
		t.Errorf("ActiveConns at weight 0 = %d, want 1", a)
	}
	s.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		a, i := conns()
		if a == 0 {
			t.Logf("after close: %d active, %d inactive", a, i)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ActiveConns still %d 10s after the close", a)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
