package ipvs

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kproxy/kproxy/internal/example"
	"github.com/kproxy/kproxy/internal/kernel/conntrack"
	"github.com/kproxy/kproxy/internal/kernel/ipset"
	"github.com/kproxy/kproxy/internal/kernel/ipset/ipsettest"
	"github.com/kproxy/kproxy/internal/kernel/ipvs"
	"github.com/kproxy/kproxy/internal/kernel/ipvs/ipvstest"
	"github.com/kproxy/kproxy/internal/kernel/netdev/netdevtest"
	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/kernel/xtables/xtablestest"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy"
	"github.com/kproxy/kproxy/internal/proxy/flowtest"
)

// world is one network namespace's worth of fakes and a proxier over
// them; plan is what the stub render hands the proxier.
type world struct {
	ipvs *ipvstest.Fake
	sets *ipsettest.Fake
	dev  *netdevtest.Fake
	ipt  *xtablestest.Fake
	ct   *conntrack.Fake
	p    *Proxier
	plan *Plan
	now  time.Time
}

func newWorld(t *testing.T, opts Options) *world {
	t.Helper()
	w := &world{
		ipvs: ipvstest.New(), sets: ipsettest.New(), dev: netdevtest.New(),
		ipt: xtablestest.NewFake(xtables.Legacy, xtables.IPv4), ct: &conntrack.Fake{},
		now: time.Unix(1_700_000_000, 0),
	}
	w.restart(opts)
	return w
}

// restart replaces the proxier by a new one over the same kernel (a
// restart of kproxy).
func (w *world) restart(opts Options) {
	if opts.Family == "" {
		opts.Family = model.IPv4
	}
	w.p = newProxier(opts, FullRenderer(func(*proxy.Request, Host) (*Plan, error) {
		if w.plan == nil {
			return nil, errors.New("no plan")
		}
		return w.plan, nil
	}), Handles{IPVS: w.ipvs, IPSet: w.sets, NetDev: w.dev, IPTables: w.ipt, Conntrack: w.ct})
	w.p.now = func() time.Time { return w.now }
}

func (w *world) sync(t *testing.T, full bool) *proxy.Result {
	t.Helper()
	res, err := w.p.Sync(context.Background(), &proxy.Request{State: model.NewState(model.IPv4), Full: full})
	if err != nil {
		t.Fatalf("sync: %v", err)
	}
	return res
}

func (w *world) resetCalls() {
	w.ipvs.ResetCalls()
	w.sets.ResetCalls()
	w.dev.ResetCalls()
}

// writes counts every changing call on the fakes since resetCalls.
func (w *world) writes() int {
	return w.ipvs.Writes() + w.sets.Calls(ipsettest.OpAdd) + w.sets.Calls(ipsettest.OpDel) + w.sets.Calls(ipsettest.OpCreate) +
		w.dev.Calls(netdevtest.OpAddAddress) + w.dev.Calls(netdevtest.OpDelAddress)
}

var (
	vip   = netip.MustParseAddr("198.19.0.10")
	vip2  = netip.MustParseAddr("198.19.0.11")
	node  = netip.MustParseAddr("198.18.0.1")
	ep1   = netip.MustParseAddr("198.18.1.1")
	ep2   = netip.MustParseAddr("198.18.1.2")
	other = netip.MustParseAddr("198.18.200.1")
)

func vsOf(proto uint16, a netip.Addr, port uint16) ipvs.VirtualServer {
	return key(ipvs.VirtualServer{Protocol: proto, Addr: a, Port: port})
}

func reals(port uint16, addrs ...netip.Addr) []ipvs.Destination {
	var out []ipvs.Destination
	for _, a := range addrs {
		out = append(out, ipvs.Destination{Addr: a, Port: port, Weight: 1})
	}
	return out
}

// planOf builds a Plan: TCP and UDP on vip:80/53, a NodePort on the
// node address, the cluster IP set and an iptables input.
func planOf(tcpEPs, udpEPs []netip.Addr) *Plan {
	d := &Plan{
		Addresses: []netip.Addr{vip},
		Services:  map[ipvs.VirtualServer]*VirtualServer{},
		Sets: map[string]*Set{
			"KUBE-CLUSTER-IP": {Set: ipset.Set{Name: "KUBE-CLUSTER-IP", Type: "hash:ip,port"}, Entries: []string{"198.19.0.10,tcp:80", "198.19.0.10,udp:53"}},
		},
		IPTables: []byte("*nat\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT\nCOMMIT\n"),
	}
	add := func(vs ipvs.VirtualServer, rs []ipvs.Destination) {
		d.Services[vs] = &VirtualServer{Service: ipvs.Service{VirtualServer: vs, Scheduler: "rr"}, Reals: rs}
	}
	add(vsOf(protoTCP, vip, 80), reals(8080, tcpEPs...))
	add(vsOf(protoUDP, vip, 53), reals(5353, udpEPs...))
	add(vsOf(protoTCP, node, 30080), reals(8080, tcpEPs...))
	return d
}

func destsOf(t *testing.T, f *ipvstest.Fake, vs ipvs.VirtualServer) map[netip.AddrPort]int {
	t.Helper()
	ds, err := f.Destinations(vs)
	if err != nil {
		t.Fatalf("destinations of %s: %v", vs, err)
	}
	out := map[netip.AddrPort]int{}
	for _, d := range ds {
		out[netip.AddrPortFrom(d.Addr, d.Port)] = d.Weight
	}
	return out
}

func hasService(t *testing.T, f *ipvstest.Fake, vs ipvs.VirtualServer) bool {
	t.Helper()
	svcs, err := f.Services()
	if err != nil {
		t.Fatal(err)
	}
	return slices.ContainsFunc(svcs, func(s ipvs.Service) bool { return key(s.VirtualServer) == vs })
}

func TestProxierFirstSyncThenNothingToDo(t *testing.T) {
	w := newWorld(t, Options{})
	w.plan = planOf([]netip.Addr{ep1, ep2}, []netip.Addr{ep1})
	w.sync(t, true)

	for vs, want := range w.plan.Services {
		if !hasService(t, w.ipvs, vs) {
			t.Fatalf("virtual server %s missing", vs)
		}
		if got := destsOf(t, w.ipvs, vs); len(got) != len(want.Reals) {
			t.Errorf("%s has real servers %v, want %v", vs, got, want.Reals)
		}
	}
	addrs, err := w.dev.Addresses(DummyDevice)
	if err != nil || !slices.Equal(addrs, []netip.Addr{vip}) {
		t.Errorf("%s holds %v (%v), want [%s]", DummyDevice, addrs, err, vip)
	}
	es, err := w.sets.Entries("KUBE-CLUSTER-IP")
	if err != nil || len(es) != 2 {
		t.Errorf("KUBE-CLUSTER-IP holds %v (%v)", es, err)
	}
	if n := len(w.ipt.Restores()); n != 1 {
		t.Fatalf("%d iptables restores, want 1", n)
	}

	// The same state again, partial and full: nothing is written.
	for _, full := range []bool{false, true} {
		w.resetCalls()
		w.sync(t, full)
		if n := w.writes(); n != 0 {
			t.Errorf("full=%v: %d kernel writes for an unchanged state, want 0", full, n)
		}
		if n := len(w.ipt.Restores()); n != 1 {
			t.Errorf("full=%v: iptables restored again (%d restores) though its text did not change", full, n)
		}
	}
	// Partial syncs do not read the kernel either.
	w.resetCalls()
	w.sync(t, false)
	if n := w.ipvs.Calls(ipvstest.OpServices) + w.sets.Calls(ipsettest.OpEntries); n != 0 {
		t.Errorf("a partial sync read the kernel %d times", n)
	}
}

func TestProxierEndpointChangeTouchesOnlyIt(t *testing.T) {
	w := newWorld(t, Options{})
	w.plan = planOf([]netip.Addr{ep1}, []netip.Addr{ep1})
	w.sync(t, true)
	w.resetCalls()
	d := planOf([]netip.Addr{ep1}, []netip.Addr{ep1})
	d.Services[vsOf(protoTCP, vip, 80)].Reals = reals(8080, ep1, ep2)
	w.plan = d
	w.sync(t, false)
	if n := w.ipvs.Calls(ipvstest.OpAddDestination); n != 1 || w.writes() != 1 {
		t.Errorf("one added endpoint: %d AddDestination, %d writes; want 1 and 1", n, w.writes())
	}
	if got := destsOf(t, w.ipvs, vsOf(protoTCP, vip, 80)); len(got) != 2 {
		t.Errorf("real servers %v, want 2", got)
	}
	// A changed scheduler updates the virtual server in place.
	w.resetCalls()
	d.Services[vsOf(protoTCP, vip, 80)].Scheduler = "wrr"
	w.sync(t, false)
	if n := w.ipvs.Calls(ipvstest.OpUpdateService); n != 1 || w.writes() != 1 {
		t.Errorf("changed scheduler: %d UpdateService, %d writes; want 1 and 1", n, w.writes())
	}
	// A removed service goes with its address and set member.
	w.resetCalls()
	d2 := planOf([]netip.Addr{ep1}, []netip.Addr{ep1})
	d2.Addresses = []netip.Addr{vip2}
	d2.Services = map[ipvs.VirtualServer]*VirtualServer{}
	d2.Sets["KUBE-CLUSTER-IP"].Entries = nil
	w.plan = d2
	w.sync(t, false)
	for _, vs := range sortedServices(d.Services) {
		if hasService(t, w.ipvs, vs) {
			t.Errorf("virtual server %s survived its removal", vs)
		}
	}
	if addrs, _ := w.dev.Addresses(DummyDevice); !slices.Equal(addrs, []netip.Addr{vip2}) {
		t.Errorf("%s holds %v, want [%s]", DummyDevice, addrs, vip2)
	}
	if es, _ := w.sets.Entries("KUBE-CLUSTER-IP"); len(es) != 0 {
		t.Errorf("KUBE-CLUSTER-IP keeps %v", es)
	}
}

func TestProxierLeavesForeignVirtualServers(t *testing.T) {
	w := newWorld(t, Options{ExcludeCIDRs: []netip.Prefix{netip.MustParsePrefix("198.19.99.0/24")}})
	foreign := []ipvs.VirtualServer{
		vsOf(protoTCP, other, 80),                              // another load balancer's address
		vsOf(protoTCP, node, 22),                               // on the node address, outside the node port range
		vsOf(protoTCP, netip.MustParseAddr("198.19.99.1"), 80), // excludeCIDRs, though bound below
		vsOf(protoTCP, netip.MustParseAddr("fd00::1"), 80),     // the other family
		{FWMark: 7, Family: syscall.AF_INET},                   // firewall mark
	}
	for _, vs := range foreign {
		s := ipvs.Service{VirtualServer: vs, Scheduler: "rr"}
		if vs.FWMark != 0 {
			s.Protocol, s.Addr, s.Port = 0, netip.Addr{}, 0
		}
		if err := w.ipvs.AddService(s); err != nil {
			t.Fatalf("adding foreign %s: %v", vs, err)
		}
		if vs.FWMark == 0 {
			if err := w.ipvs.AddDestination(vs, ipvs.Destination{Addr: foreignReal(vs), Port: 1, Weight: 3}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A leftover of an earlier run: on kube-ipvs0, no longer wanted.
	stale := vsOf(protoTCP, vip2, 443)
	if _, err := w.dev.EnsureDummy(DummyDevice); err != nil {
		t.Fatal(err)
	}
	for _, a := range []netip.Addr{vip2, netip.MustParseAddr("198.19.99.1")} {
		if err := w.dev.AddAddress(DummyDevice, a); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.ipvs.AddService(ipvs.Service{VirtualServer: stale, Scheduler: "rr"}); err != nil {
		t.Fatal(err)
	}
	// And a stale NodePort one on the node address.
	staleNP := vsOf(protoTCP, node, 31000)
	if err := w.ipvs.AddService(ipvs.Service{VirtualServer: staleNP, Scheduler: "rr"}); err != nil {
		t.Fatal(err)
	}
	w.plan = planOf([]netip.Addr{ep1}, nil)
	check := func(when string) {
		t.Helper()
		for _, vs := range foreign {
			if !hasService(t, w.ipvs, vs) {
				t.Fatalf("%s: foreign virtual server %s is gone", when, vs)
			}
			if vs.FWMark == 0 {
				if got := destsOf(t, w.ipvs, vs); got[netip.AddrPortFrom(foreignReal(vs), 1)] != 3 || len(got) != 1 {
					t.Errorf("%s: foreign %s's real servers changed: %v", when, vs, got)
				}
			}
		}
	}
	w.sync(t, true)
	check("first sync")
	for _, vs := range []ipvs.VirtualServer{stale, staleNP} {
		if hasService(t, w.ipvs, vs) {
			t.Errorf("kproxy's stale virtual server %s survived a full sync", vs)
		}
	}
	w.sync(t, false)
	w.restart(Options{ExcludeCIDRs: []netip.Prefix{netip.MustParsePrefix("198.19.99.0/24")}})
	w.sync(t, true)
	check("restart")
}

func TestProxierRestartWritesNothing(t *testing.T) {
	w := newWorld(t, Options{})
	w.plan = planOf([]netip.Addr{ep1, ep2}, []netip.Addr{ep2})
	w.sync(t, true)
	w.resetCalls()
	w.restart(Options{})
	w.sync(t, true)
	if n := w.writes(); n != 0 {
		t.Errorf("a restart over an unchanged kernel wrote %d times, want 0", n)
	}
}

func TestProxierFailedStepIsRetriedInFull(t *testing.T) {
	w := newWorld(t, Options{})
	w.plan = planOf([]netip.Addr{ep1}, []netip.Addr{ep1})
	w.sync(t, true)
	d := planOf([]netip.Addr{ep1, ep2}, []netip.Addr{ep2})
	d.IPTables = append(d.IPTables, "*filter\n:KUBE-FORWARD - [0:0]\nCOMMIT\n"...)
	w.plan = d
	w.ipvs.FailNext(ipvstest.OpAddDestination, syscall.ENOMEM)
	if _, err := w.p.Sync(context.Background(), &proxy.Request{State: model.NewState(model.IPv4)}); err == nil || !errors.Is(err, syscall.ENOMEM) {
		t.Fatalf("sync with a failing AddDestination: %v, want ENOMEM", err)
	}
	// Something else changes the kernel meanwhile: the retry reads it.
	if err := w.ipvs.DeleteDestination(vsOf(protoTCP, node, 30080), ipvs.Destination{Addr: ep1, Port: 8080}); err != nil {
		t.Fatal(err)
	}
	restores := len(w.ipt.Restores())
	w.sync(t, false)
	for vs, want := range d.Services {
		got := destsOf(t, w.ipvs, vs)
		if len(got) != len(want.Reals) {
			t.Errorf("after the retry %s has %v, want %v", vs, got, want.Reals)
		}
	}
	if len(w.ipt.Restores()) != restores+1 {
		t.Errorf("the retry after a failure did not write the iptables rules again")
	}
}

func TestProxierBadSetEntryIsAnError(t *testing.T) {
	w := newWorld(t, Options{})
	d := planOf([]netip.Addr{ep1}, nil)
	d.Sets["KUBE-CLUSTER-IP"].Entries = append(d.Sets["KUBE-CLUSTER-IP"].Entries, "not-an-entry")
	w.plan = d
	_, err := w.p.Sync(context.Background(), &proxy.Request{State: model.NewState(model.IPv4), Full: true})
	if err == nil || !strings.Contains(err.Error(), "KUBE-CLUSTER-IP") {
		t.Fatalf("a bad set member: %v, want an error naming the set", err)
	}
	if w.ipvs.Writes() != 0 {
		t.Errorf("a refused state still changed IPVS (%d writes)", w.ipvs.Writes())
	}
}

func TestProxierTimeouts(t *testing.T) {
	w := newWorld(t, Options{Timeouts: ipvs.Timeouts{TCP: 100, UDP: 7}})
	w.plan = planOf(nil, nil)
	w.sync(t, true)
	w.sync(t, true)
	if got := w.ipvs.Timeouts(); got != (ipvs.Timeouts{TCP: 100, TCPFin: 120, UDP: 7}) {
		t.Errorf("timeouts %+v", got)
	}
	if n := w.ipvs.Calls(ipvstest.OpSetTimeouts); n != 1 {
		t.Errorf("SetTimeouts called %d times, want once", n)
	}
}

// TestProxierExampleWithRender runs the real Render of the built-in
// example through the proxier over the fakes: every virtual server,
// address and set member arrives; the jump rules are inserted once, and
// another sync rewrites nothing (a restart the iptables chains, once); a jump rule
// deleted by someone else comes back at the next full sync.
func TestProxierExampleWithRender(t *testing.T) {
	s := flowtest.Example(t, example.NodeA)
	w := newWorld(t, Options{})
	render := func(req *proxy.Request, h Host) (*Plan, error) {
		return Render(exampleConfig(model.IPv4), req.State, req.Node, h)
	}
	h := Handles{IPVS: w.ipvs, IPSet: w.sets, NetDev: w.dev, IPTables: w.ipt, Conntrack: w.ct,
		LocalAddrs: func() ([]netip.Addr, error) { return s.Node.Addresses, nil }}
	req := &proxy.Request{State: s.States[model.IPv4], Node: s.Node, Full: true}
	sync := func(full bool) {
		t.Helper()
		req.Full = full
		if _, err := w.p.Sync(context.Background(), req); err != nil {
			t.Fatalf("sync: %v", err)
		}
	}
	w.p = newProxier(Options{Config: Config{Family: model.IPv4}}, NewPartialRenderer(exampleConfig(model.IPv4)), h)
	res, err := w.p.Sync(context.Background(), req)
	if err != nil {
		t.Fatalf("sync: %v", err)
	}
	// The health check node ports reach the loop (its server answers on
	// them): etp-local's, with its one endpoint on node-a.
	etp := types.NamespacedName{Namespace: "demo", Name: "etp-local"}
	if res.HealthCheckPorts[etp] != 32081 || res.LocalEndpoints[etp] != 1 {
		t.Errorf("sync result: health check ports %v, local endpoints %v; want demo/etp-local 32081 with 1", res.HealthCheckPorts, res.LocalEndpoints)
	}
	want, err := render(req, Host{Addrs: s.Node.Addresses})
	if err != nil {
		t.Fatal(err)
	}
	for vs, v := range want.Services {
		if got := destsOf(t, w.ipvs, key(vs)); len(got) != len(v.Reals) {
			t.Errorf("%s: real servers %v, want %d", vs, got, len(v.Reals))
		}
	}
	for name, set := range want.Sets {
		es, err := w.sets.Entries(name)
		if err != nil || len(es) != len(set.Entries) {
			t.Errorf("ipset %s: %d members (%v), want %d", name, len(es), err, len(set.Entries))
		}
	}
	nat, err := w.ipt.Save(context.Background(), TableNAT)
	if err != nil || !strings.Contains(string(nat), "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES") {
		t.Fatalf("nat table lacks the jump to KUBE-SERVICES (%v):\n%s", err, nat)
	}
	restores := len(w.ipt.Restores())
	for _, full := range []bool{false, true} {
		w.resetCalls()
		sync(full)
		if n := w.writes(); n != 0 || len(w.ipt.Restores()) != restores {
			t.Errorf("full=%v: unchanged state wrote %d times, %d restores", full, n, len(w.ipt.Restores())-restores)
		}
	}
	w.p = newProxier(Options{Config: Config{Family: model.IPv4}}, NewPartialRenderer(exampleConfig(model.IPv4)), h)
	w.resetCalls()
	sync(true)
	// A new process does not know what its predecessor wrote into its
	// chains: it rewrites them once (--noflush, atomic per table), and
	// changes nothing else.
	if n := w.writes(); n != 0 || len(w.ipt.Restores()) != restores+1 {
		t.Errorf("restart: %d writes, %d restores, want 0 and 1", n, len(w.ipt.Restores())-restores)
	}
	// Someone deletes the PREROUTING jump: the next full sync puts it back.
	if err := w.ipt.Restore(context.Background(), []byte("*nat\n-D PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\nCOMMIT\n"), xtables.RestoreOptions{NoFlush: true}); err != nil {
		t.Fatal(err)
	}
	sync(true)
	nat, _ = w.ipt.Save(context.Background(), TableNAT)
	if !strings.Contains(string(nat), "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES") {
		t.Errorf("the deleted jump rule was not restored:\n%s", nat)
	}
}

// foreignReal is the real server of a foreign virtual server, of its
// family.
func foreignReal(vs ipvs.VirtualServer) netip.Addr {
	if vs.Addr.Is6() {
		return netip.MustParseAddr("fd00::2")
	}
	return ep2
}
