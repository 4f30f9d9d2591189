package ipvs

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kproxy/kproxy/internal/kernel/conntrack"
	"github.com/kproxy/kproxy/internal/kernel/ipset/ipsettest"
	"github.com/kproxy/kproxy/internal/kernel/ipvs/ipvstest"
	"github.com/kproxy/kproxy/internal/kernel/netdev/netdevtest"
	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/kernel/xtables/xtablestest"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy"
	"github.com/kproxy/kproxy/internal/testutil/fixtures"
)

// kernelOf is one namespace's worth of fakes.
type kernelOf struct {
	ipvs *ipvstest.Fake
	sets *ipsettest.Fake
	dev  *netdevtest.Fake
	ipt  *xtablestest.Fake
}

func newKernel(f v1.IPFamily) *kernelOf {
	fam := xtables.IPv4
	if f == model.IPv6 {
		fam = xtables.IPv6
	}
	return &kernelOf{ipvs: ipvstest.New(), sets: ipsettest.New(), dev: netdevtest.New(), ipt: xtablestest.NewFake(xtables.Legacy, fam)}
}

func (k *kernelOf) handles(f v1.IPFamily) Handles {
	return Handles{IPVS: k.ipvs, IPSet: k.sets, NetDev: k.dev, IPTables: k.ipt, Conntrack: &conntrack.Fake{},
		LocalAddrs: func() ([]netip.Addr, error) { return hostAddrs, nil }}
}

// dump writes everything the fakes hold, sorted, for comparison.
func (k *kernelOf) dump(t *testing.T) string {
	t.Helper()
	var lines []string
	svcs, err := k.ipvs.Services()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range svcs {
		lines = append(lines, fmt.Sprintf("vs %s %s flags=%#x timeout=%d", s.VirtualServer, s.Scheduler, s.Flags, s.Timeout))
		ds, err := k.ipvs.Destinations(s.VirtualServer)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			lines = append(lines, fmt.Sprintf("vs %s -> %s weight %d", s.VirtualServer, netip.AddrPortFrom(d.Addr, d.Port), d.Weight))
		}
	}
	names, err := k.sets.Sets()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		es, err := k.sets.Entries(n)
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, "set "+n)
		for _, e := range es {
			lines = append(lines, "set "+n+" "+e)
		}
	}
	as, _ := k.dev.Addresses(DummyDevice)
	for _, a := range as {
		lines = append(lines, "addr "+a.String())
	}
	slices.Sort(lines)
	for _, table := range []string{TableNAT, TableFilter} {
		out, err := k.ipt.Save(context.Background(), table)
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, string(out))
	}
	return strings.Join(lines, "\n")
}

// countingRenderer counts full renders.
type countingRenderer struct {
	Renderer
	fullRenders int
}

func (c *countingRenderer) RenderFull(req *proxy.Request, host Host) (*Plan, error) {
	c.fullRenders++
	return c.Renderer.RenderFull(req, host)
}

// randomCluster makes random service ports over a few shared addresses,
// so that virtual servers, set members and kube-ipvs0 addresses are
// shared between service ports and now and then contested.
type randomCluster struct {
	f   v1.IPFamily
	rnd *rand.Rand
}

func (c *randomCluster) addr(v4 string, v6 string) netip.Addr {
	if c.f == model.IPv6 {
		return netip.MustParseAddr(v6)
	}
	return netip.MustParseAddr(v4)
}

func (c *randomCluster) pick(n int) int { return c.rnd.IntN(n) }

func (c *randomCluster) servicePort(i int) (*model.ServicePort, []*model.Endpoint) {
	name := fmt.Sprintf("s%d", i)
	proto := []v1.Protocol{model.TCP, model.TCP, model.UDP, model.SCTP}[c.pick(4)]
	cip := c.addr(fmt.Sprintf("198.19.0.%d", 1+i%36), fmt.Sprintf("fd00:19::%x", 1+i%36))
	sp := &model.ServicePort{
		Name:      fixtures.SPName(name, "p", proto),
		Family:    c.f,
		Type:      v1.ServiceTypeClusterIP,
		ClusterIP: cip,
		Port:      []int32{80, 443}[c.pick(2)],
		Protocol:  proto,
	}
	switch c.pick(4) {
	case 1:
		sp.Type, sp.NodePort = v1.ServiceTypeNodePort, int32(30000+i)
	case 2, 3:
		sp.Type, sp.NodePort = v1.ServiceTypeLoadBalancer, int32(30000+i)
		sp.LoadBalancerIngress = []model.LoadBalancerIngress{{IP: c.addr(fmt.Sprintf("198.19.200.%d", c.pick(12)), fmt.Sprintf("fd00:19:200::%d", c.pick(12)))}}
		switch c.pick(3) {
		case 1:
			sp.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix(map[bool]string{true: "fd00:203::/64", false: "203.0.113.0/24"}[c.f == model.IPv6])}
		case 2:
			sp.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix(map[bool]string{true: "fd00:18::/64", false: "198.18.0.0/16"}[c.f == model.IPv6])}
		}
	}
	if c.pick(4) == 0 {
		// One external IP is a node address (not bound to kube-ipvs0).
		sp.ExternalIPs = []netip.Addr{[]netip.Addr{c.addr("198.19.100.1", "fd00:19:100::1"), c.addr("198.18.0.10", "fd00:18::10")}[c.pick(2)]}
	}
	if sp.Type != v1.ServiceTypeClusterIP && c.pick(3) == 0 {
		sp.ExternalPolicyLocal = true
		sp.HealthCheckNodePort = int32(32000 + i)
	}
	sp.InternalPolicyLocal = c.pick(5) == 0
	if c.pick(5) == 0 {
		sp.StickyMaxAgeSeconds = int32(60 + c.pick(3))
	}
	var eps []*model.Endpoint
	for range c.pick(5) {
		e := &model.Endpoint{
			IP:    c.addr(fmt.Sprintf("198.18.130.%d", 1+c.pick(6)), fmt.Sprintf("fd00:18:130::%d", 1+c.pick(6))),
			Port:  int32(8080 + c.pick(2)),
			Ready: true, Serving: true, NodeName: "node-b",
		}
		if c.pick(3) == 0 {
			e.Local, e.NodeName = true, nodeA.Name
		}
		if c.pick(6) == 0 {
			e.Ready, e.Terminating = false, true
		}
		eps = append(eps, e)
	}
	return sp, eps
}

// TestPartialMatchesFull: after every partial sync of random
// changes, the kernel the partial renderer programmed holds exactly
// what a fresh proxier's full sync of the same state programs, and the
// sync reports the same health check ports and counts; partial
// syncs render no whole state unless a virtual server is contested.
func TestPartialMatchesFull(t *testing.T) {
	for _, f := range []v1.IPFamily{model.IPv4, model.IPv6} {
		t.Run(string(f), func(t *testing.T) {
			c := &randomCluster{f: f, rnd: rand.New(rand.NewPCG(7, uint64(len(f))))}
			const slots = 40
			state := model.NewState(f)
			names := map[int]model.ServicePortName{}
			set := func(i int) {
				if n, ok := names[i]; ok {
					delete(state.Services, n)
					delete(state.Endpoints, n)
				}
				sp, eps := c.servicePort(i)
				names[i] = sp.Name
				state.Services[sp.Name] = sp
				state.Endpoints[sp.Name] = eps
			}
			for i := range slots {
				set(i)
			}
			cfg := testConfig(f)
			k := newKernel(f)
			counting := &countingRenderer{Renderer: NewPartialRenderer(cfg)}
			p := newProxier(Options{Config: Config{Family: f}}, counting, k.handles(f))
			req := &proxy.Request{State: state, Node: nodeA, Full: true}
			if _, err := p.Sync(context.Background(), req); err != nil {
				t.Fatal(err)
			}
			partial, contested := 0, 0
			for step := range 300 {
				changed := sets.New[model.ServicePortName]()
				for range 1 + c.pick(3) {
					i := c.pick(slots)
					changed.Insert(names[i])
					switch c.pick(6) {
					case 0: // removed
						delete(state.Services, names[i])
						delete(state.Endpoints, names[i])
					case 1, 2: // endpoints only
						if sp := state.Services[names[i]]; sp != nil {
							_, eps := c.servicePort(i)
							state.Endpoints[names[i]] = eps
							break
						}
						fallthrough
					default:
						set(i)
						changed.Insert(names[i])
					}
				}
				before := counting.fullRenders
				req := &proxy.Request{State: state, Changed: changed, Node: nodeA}
				got, err := p.Sync(context.Background(), req)
				if err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				if counting.fullRenders == before {
					partial++
				} else {
					contested++
				}
				fresh := newKernel(f)
				fp := newProxier(Options{Config: Config{Family: f}}, NewPartialRenderer(cfg), fresh.handles(f))
				want, err := fp.Sync(context.Background(), &proxy.Request{State: state, Node: nodeA, Full: true})
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Fatalf("step %d: the partial sync's report differs from a full sync's (-full +partial):\n%s", step, diff)
				}
				if diff := cmp.Diff(fresh.dump(t), k.dump(t)); diff != "" {
					t.Fatalf("step %d (changed %v): partial syncs left the kernel different from a full sync (-full +partial):\n%s", step, sets.List(sliceNames(changed)), diff)
				}
			}
			t.Logf("%d partial syncs applied as deltas, %d rendered whole (a contested virtual server)", partial, contested)
			if partial < 200 {
				t.Errorf("only %d of 300 partial syncs were applied as deltas", partial)
			}
		})
	}
}

func sliceNames(s sets.Set[model.ServicePortName]) sets.Set[string] {
	out := sets.New[string]()
	for n := range s {
		out.Insert(n.String())
	}
	return out
}
