package ipvs

// Address plan: node-a 198.18.0.10 / fd00:18::10 (the built-in example),
// services in 198.19.0.0/16 and fd00:19::/64; foreign virtual servers on
// 192.0.2.80 (another load balancer's VIP, not local) and on the node's
// own address at port 22 (a port of no NodePort).

import (
	"context"
	"net/netip"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/example"
	"github.com/kproxy/kproxy/internal/kernel/conntrack"
	"github.com/kproxy/kproxy/internal/kernel/ipset"
	"github.com/kproxy/kproxy/internal/kernel/ipvs"
	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/kernel/xtables/xtablestest"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy"
	"github.com/kproxy/kproxy/internal/proxy/flowtest"
)

// TestCleanupRemovesOnlyIPVSMode: the proxier programs the example (both
// families) into the fakes beside another program's virtual servers and
// ipsets; the cleanup that --cleanup and a mode switch run
// (ipvs.CleanupLeftovers) then removes kube-ipvs0, ipvs mode's sets and
// its virtual servers, and leaves the others as they were.
func TestCleanupRemovesOnlyIPVSMode(t *testing.T) {
	s := flowtest.Example(t, example.NodeA)
	w := newWorld(t, Options{})
	local := func() ([]netip.Addr, error) { return s.Node.Addresses, nil }
	ours := 0
	for _, f := range []v1.IPFamily{model.IPv4, model.IPv6} {
		render := func(req *proxy.Request, h Host) (*Plan, error) {
			return Render(exampleConfig(f), req.State, req.Node, h)
		}
		xf := xtables.IPv4
		if f == model.IPv6 {
			xf = xtables.IPv6
		}
		p := newProxier(Options{Config: Config{Family: f}}, NewPartialRenderer(exampleConfig(f)), Handles{IPVS: w.ipvs, IPSet: w.sets, NetDev: w.dev,
			IPTables: xtablestest.NewFake(xtables.Legacy, xf), Conntrack: &conntrack.Fake{}, LocalAddrs: local})
		if _, err := p.Sync(context.Background(), &proxy.Request{State: s.States[f], Node: s.Node, Full: true}); err != nil {
			t.Fatalf("%s sync: %v", f, err)
		}
		d, err := render(&proxy.Request{State: s.States[f], Node: s.Node}, Host{Addrs: s.Node.Addresses})
		if err != nil {
			t.Fatal(err)
		}
		ours += len(d.Services)
	}
	foreign := []ipvs.Service{
		{VirtualServer: vsOf(protoTCP, netip.MustParseAddr("192.0.2.80"), 80), Scheduler: "wlc"},
		{VirtualServer: vsOf(protoTCP, netip.MustParseAddr("198.18.0.10"), 22), Scheduler: "rr"},
		{VirtualServer: vsOf(protoUDP, netip.MustParseAddr("fd00:18::10"), 30080), Scheduler: "rr"}, // no UDP NodePort 30080
	}
	for _, fs := range foreign {
		if err := w.ipvs.AddService(fs); err != nil {
			t.Fatal(err)
		}
		if err := w.ipvs.AddDestination(fs.VirtualServer, ipvs.Destination{Addr: foreignReal(fs.VirtualServer), Port: 8080, Weight: 1}); err != nil {
			t.Fatal(err)
		}
	}
	foreignSets := []ipset.Set{{Name: "KUBE-SRC-ABCDEF", Type: "hash:ip"}, {Name: "f2b-sshd", Type: "hash:ip"}}
	for _, fs := range foreignSets {
		if err := w.sets.Create(fs); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.sets.Add("KUBE-SRC-ABCDEF", "198.18.0.77"); err != nil {
		t.Fatal(err)
	}
	before, _ := w.ipvs.Services()
	if len(before) != ours+len(foreign) {
		t.Fatalf("%d virtual servers before the cleanup, want %d of ipvs mode and %d foreign", len(before), ours, len(foreign))
	}

	opt := ipvs.WithHandles(ipvs.Handles{IPVS: w.ipvs, IPSet: w.sets, NetDev: w.dev, LocalAddrs: local})
	l, err := ipvs.FindLeftovers(context.Background(), opt)
	if err != nil {
		t.Fatal(err)
	}
	if l.Link != DummyDevice || len(l.VirtualServers) != ours || len(l.IPSets) != 2*len(setInfo) {
		t.Errorf("leftovers: link %q, %d virtual servers (want %d), %d ipsets (want %d)", l.Link, len(l.VirtualServers), ours, len(l.IPSets), 2*len(setInfo))
	}
	if err := ipvs.CleanupLeftovers(context.Background(), opt); err != nil {
		t.Fatal(err)
	}

	after, err := w.ipvs.Services()
	if err != nil {
		t.Fatal(err)
	}
	var left []ipvs.VirtualServer
	for _, s := range after {
		left = append(left, key(s.VirtualServer))
	}
	for _, fs := range foreign {
		if !slices.Contains(left, key(fs.VirtualServer)) {
			t.Errorf("foreign virtual server %s was deleted", fs.VirtualServer)
		}
		if ds, err := w.ipvs.Destinations(fs.VirtualServer); err != nil || len(ds) != 1 {
			t.Errorf("foreign virtual server %s: real servers %v (%v), want its one", fs.VirtualServer, ds, err)
		}
	}
	if len(left) != len(foreign) {
		t.Errorf("after the cleanup: %v, want only the %d foreign virtual servers", left, len(foreign))
	}
	if _, err := w.dev.Addresses(DummyDevice); err == nil {
		t.Errorf("%s still exists", DummyDevice)
	}
	sets, err := w.sets.Sets()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(sets)
	if !slices.Equal(sets, []string{"KUBE-SRC-ABCDEF", "f2b-sshd"}) {
		t.Errorf("ipsets after the cleanup: %v, want only the foreign ones", sets)
	}
	if es, _ := w.sets.Entries("KUBE-SRC-ABCDEF"); !slices.Equal(es, []string{"198.18.0.77"}) {
		t.Errorf("a foreign set's members changed: %v", es)
	}
	// A second run finds nothing and changes nothing.
	if l, err := ipvs.FindLeftovers(context.Background(), opt); err != nil || !l.Empty() {
		t.Errorf("after the cleanup, leftovers %+v (%v)", l, err)
	}
}
