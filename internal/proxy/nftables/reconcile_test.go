package nftables

// Conntrack reconciliation tests. Addresses follow fixtures_test.go:
// 198.18.129.0/24 and 198.18.130.0/24 pods (endpoints), 198.19.1.0/24 cluster
// IPs, 198.19.201.0/24 external and LB IPs, 203.0.113.0/24 clients,
// 198.18.0.10 node-a; fd00:19::/112 IPv6 cluster IPs, fd00:18:1::/48 IPv6
// pods, 2001:db8::/32 IPv6 clients. 192.0.2.80 is a server outside the
// cluster that pods talk to.

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kproxy/kproxy/internal/example"
	"github.com/kproxy/kproxy/internal/kernel/conntrack"
	"github.com/kproxy/kproxy/internal/metrics"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy/flowtest"
	"github.com/kproxy/kproxy/internal/proxy/udpflows"
	"github.com/kproxy/kproxy/internal/testutil/fixtures"
)

// udpFlow is a client at src:sport sending to dst (ip:port) and answered
// by reply (ip:port).
func udpFlow(src string, sport uint16, dst, reply string) conntrack.Flow {
	d, r := netip.MustParseAddrPort(dst), netip.MustParseAddrPort(reply)
	return conntrack.Flow{OrigSrc: netip.MustParseAddr(src), OrigSrcPort: sport, OrigDst: d.Addr(), OrigDstPort: d.Port(), ReplySrc: r.Addr(), ReplySrcPort: r.Port()}
}

func udpSP(name, clusterIP string, port int32, tweak func(*model.ServicePort)) *model.ServicePort {
	return fixtures.ServicePort(name, clusterIP, port, func(sp *model.ServicePort) {
		sp.Protocol = model.UDP
		if tweak != nil {
			tweak(sp)
		}
	})
}

func stateOf(f v1.IPFamily, sps ...any) *model.State {
	s := model.NewState(f)
	var last *model.ServicePort
	for _, x := range sps {
		switch x := x.(type) {
		case *model.ServicePort:
			s.Services[x.Name], last = x, x
		case []*model.Endpoint:
			s.Endpoints[last.Name] = x
		}
	}
	return s
}

var cmpAddr = cmp.Comparer(func(a, b netip.Addr) bool { return a == b })

func sortFilters(fs []conntrack.Filter) []conntrack.Filter {
	slices.SortFunc(fs, func(a, b conntrack.Filter) int { return strings.Compare(a.String(), b.String()) })
	return fs
}

func TestStaleFlows(t *testing.T) {
	notReady := func(e *model.Endpoint) { e.Ready = false }
	terminatingServing := func(e *model.Endpoint) { e.Ready, e.Terminating = false, true }
	terminatingGone := func(e *model.Endpoint) { e.Ready, e.Serving, e.Terminating = false, false, true }

	game := udpSP("game", "198.19.1.7", 7777, func(sp *model.ServicePort) {
		sp.Type, sp.NodePort = v1.ServiceTypeLoadBalancer, 30777
		sp.ExternalIPs = []netip.Addr{netip.MustParseAddr("198.19.201.7")}
		sp.LoadBalancerIngress = []model.LoadBalancerIngress{
			{IP: netip.MustParseAddr("198.19.201.8")},
			{IP: netip.MustParseAddr("198.19.201.9"), Proxy: true},
		}
	})
	gameEps := []*model.Endpoint{fixtures.Endpoint("198.18.129.77", 7777, true, nil), fixtures.Endpoint("198.18.130.77", 7777, false, nil)}
	dnsTCP := fixtures.ServicePort("dns", "198.19.1.10", 53, nil)
	dnsTCPEps := []*model.Endpoint{fixtures.Endpoint("198.18.129.53", 53, true, nil)}

	for _, tc := range []struct {
		name  string
		state *model.State
		flows []conntrack.Flow
		// stale are indexes into flows.
		stale []int
	}{
		{
			name:  "flows to serving endpoints are kept, others deleted",
			state: stateOf(model.IPv4, game, gameEps),
			flows: []conntrack.Flow{
				udpFlow("203.0.113.1", 5000, "198.19.1.7:7777", "198.18.129.77:7777"),
				udpFlow("203.0.113.1", 5001, "198.19.1.7:7777", "198.18.130.77:7777"),
				udpFlow("203.0.113.1", 5002, "198.19.1.7:7777", "198.18.129.99:7777"),
			},
			stale: []int{2},
		},
		{
			name:  "external IP and LB VIP are frontends; an ipMode Proxy ingress IP is not",
			state: stateOf(model.IPv4, game, gameEps),
			flows: []conntrack.Flow{
				udpFlow("203.0.113.1", 5000, "198.19.201.7:7777", "198.18.129.99:7777"),
				udpFlow("203.0.113.1", 5000, "198.19.201.8:7777", "198.18.129.99:7777"),
				udpFlow("203.0.113.1", 5000, "198.19.201.9:7777", "198.18.129.99:7777"),
				udpFlow("203.0.113.1", 5000, "198.19.201.8:7777", "198.18.130.77:7777"),
			},
			stale: []int{0, 1},
		},
		{
			name:  "another port of a service IP is not the service",
			state: stateOf(model.IPv4, game, gameEps),
			flows: []conntrack.Flow{udpFlow("203.0.113.1", 5000, "198.19.1.7:7778", "198.18.129.99:7778")},
		},
		{
			name:  "a flow to the cluster IP that was never DNATed is stale",
			state: stateOf(model.IPv4, game, gameEps),
			flows: []conntrack.Flow{udpFlow("198.18.129.5", 5000, "198.19.1.7:7777", "198.19.1.7:7777")},
			stale: []int{0},
		},
		{
			name:  "node port on any local address",
			state: stateOf(model.IPv4, game, gameEps),
			flows: []conntrack.Flow{
				udpFlow("203.0.113.1", 5000, "198.18.0.10:30777", "198.18.129.99:7777"),
				udpFlow("203.0.113.1", 5001, "127.0.0.1:30777", "198.18.129.99:7777"),
				udpFlow("203.0.113.1", 5002, "198.18.0.10:30777", "198.18.130.77:7777"),
				// A pod talking to a server's port 30777 elsewhere:
				// masqueraded, not DNATed, not ours.
				udpFlow("198.18.129.5", 5003, "192.0.2.80:30777", "192.0.2.80:30777"),
			},
			stale: []int{0, 1},
		},
		{
			name: "serving terminating endpoints are kept, non-serving ones are not",
			state: stateOf(model.IPv4, game, []*model.Endpoint{
				fixtures.Endpoint("198.18.129.77", 7777, true, terminatingServing),
				fixtures.Endpoint("198.18.130.77", 7777, false, terminatingGone),
				fixtures.Endpoint("198.18.130.78", 7777, false, notReady),
			}),
			flows: []conntrack.Flow{
				udpFlow("203.0.113.1", 5000, "198.19.1.7:7777", "198.18.129.77:7777"),
				udpFlow("203.0.113.1", 5001, "198.19.1.7:7777", "198.18.130.77:7777"),
				udpFlow("203.0.113.1", 5002, "198.19.1.7:7777", "198.18.130.78:7777"),
			},
			// notReady keeps Serving (fixtures.Endpoint sets it): only readiness
			// changed, which does not count.
			stale: []int{1},
		},
		{
			name: "traffic policies and topology do not count",
			state: stateOf(model.IPv4, udpSP("local", "198.19.1.8", 53, func(sp *model.ServicePort) {
				sp.Type, sp.NodePort = v1.ServiceTypeNodePort, 30053
				sp.InternalPolicyLocal, sp.ExternalPolicyLocal = true, true
			}), []*model.Endpoint{
				fixtures.Endpoint("198.18.129.53", 53, true, nil),
				fixtures.Endpoint("198.18.130.53", 53, false, func(e *model.Endpoint) { e.NodeHints = sets.New(example.NodeB) }),
			}),
			flows: []conntrack.Flow{
				// Remote endpoint: not selected under Local policy, but serving.
				udpFlow("198.18.129.5", 5000, "198.19.1.8:53", "198.18.130.53:53"),
				udpFlow("203.0.113.1", 5000, "198.18.0.10:30053", "198.18.130.53:53"),
			},
		},
		{
			name:  "a UDP service port without serving endpoints loses all its flows",
			state: stateOf(model.IPv4, game, []*model.Endpoint{fixtures.Endpoint("198.18.130.77", 7777, false, terminatingGone)}),
			flows: []conntrack.Flow{
				udpFlow("203.0.113.1", 5000, "198.19.1.7:7777", "198.18.130.77:7777"),
				udpFlow("203.0.113.1", 5001, "198.18.0.10:30777", "198.18.130.77:7777"),
			},
			stale: []int{0, 1},
		},
		{
			name:  "TCP service ports are ignored",
			state: stateOf(model.IPv4, dnsTCP, dnsTCPEps),
			flows: []conntrack.Flow{udpFlow("203.0.113.1", 5000, "198.19.1.10:53", "198.18.130.99:53")},
		},
		{
			name:  "flows to unknown addresses are ignored",
			state: stateOf(model.IPv4, game, gameEps),
			flows: []conntrack.Flow{udpFlow("198.18.129.5", 5000, "192.0.2.80:53", "192.0.2.80:53")},
		},
		{
			name: "IPv6",
			state: stateOf(model.IPv6, udpSP("dns6", "fd00:19::18", 53, func(sp *model.ServicePort) {
				sp.Type, sp.NodePort = v1.ServiceTypeNodePort, 30053
			}), []*model.Endpoint{fixtures.Endpoint("fd00:18:1:a::53", 53, true, nil)}),
			flows: []conntrack.Flow{
				udpFlow("2001:db8::1", 5000, "[fd00:19::18]:53", "[fd00:18:1:a::53]:53"),
				udpFlow("2001:db8::1", 5001, "[fd00:19::18]:53", "[fd00:18:1:b::53]:53"),
				udpFlow("2001:db8::1", 5002, "[fd00:18::10]:30053", "[fd00:18:1:b::53]:53"),
				udpFlow("2001:db8::1", 5003, "[fd00:18::10]:30053", "[fd00:18:1:a::53]:53"),
			},
			stale: []int{1, 2},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var want []conntrack.Filter
			for _, i := range tc.stale {
				want = append(want, tc.flows[i].Filter())
			}
			got := udpflows.StaleFlows(tc.state, tc.flows)
			if diff := cmp.Diff(sortFilters(want), sortFilters(got), cmpAddr); diff != "" {
				t.Errorf("stale flows (-want +got):\n%s", diff)
			}
			// Each filter must select its flow and no other listed flow.
			for _, f := range got {
				n := 0
				for _, fl := range tc.flows {
					if f.Matches(fl) {
						n++
					}
				}
				if n != 1 {
					t.Errorf("filter %v selects %d listed flows, want 1", f, n)
				}
			}
		})
	}
}

// TestProxierReconcilesConntrackOnFullSyncs: entries to endpoints that died
// while no proxier watched are removed by the first sync of a new proxier
// and by later full syncs, not by partial ones; a conntrack failure does
// not fail the sync.
func TestProxierReconcilesConntrackOnFullSyncs(t *testing.T) {
	c := flowtest.Example(t, example.NodeA)
	r := newProxierRig(t, c, model.IPv4)
	dns := fixtures.SPName("dns-udp", "dns", model.UDP)
	sp, eps := r.state.Services[dns], r.state.Endpoints[dns]
	if sp == nil || len(eps) < 2 {
		t.Fatalf("the example lacks dns-udp with two endpoints: %v %v", sp, eps)
	}
	vip := netip.AddrPortFrom(sp.ClusterIP, uint16(sp.Port)).String()
	live := udpFlow("198.18.129.5", 5000, vip, eps[0].String())
	dead := udpFlow("198.18.129.5", 5001, vip, "198.18.130.250:53")
	other := udpFlow("198.18.129.5", 5002, "192.0.2.80:53", "192.0.2.80:53")
	r.ct.Flows4 = []conntrack.Flow{live, dead, other}
	deleted := metrics.ReconcileConntrackFlowsDeletedEntriesTotal.WithLabelValues(string(model.IPv4)).(prometheus.Counter)
	before := testutil.ToFloat64(deleted)

	r.mustSync(false) // the first sync of a proxier is full
	if d := testutil.ToFloat64(deleted) - before; d != 1 {
		t.Errorf("deleted entries metric grew by %v, want 1", d)
	}
	if diff := cmp.Diff([]conntrack.Flow{live, other}, r.ct.Flows4, cmpAddr); diff != "" {
		t.Errorf("after the first sync, flows (-want +got):\n%s", diff)
	}
	if len(r.ct.Calls) != 1 || r.ct.Calls[0].IPv6 {
		t.Errorf("want one IPv4 delete call, got %+v", r.ct.Calls)
	}

	// An entry appearing behind the proxier's back: a partial sync does
	// not look, the next full sync does.
	r.ct.Calls = nil
	r.ct.Flows4 = append(r.ct.Flows4, dead)
	r.mustSync(false)
	if len(r.ct.Calls) != 0 || len(r.ct.Flows4) != 3 {
		t.Errorf("a partial sync reconciled: calls %+v, flows %v", r.ct.Calls, r.ct.Flows4)
	}
	r.mustSync(true)
	if diff := cmp.Diff([]conntrack.Flow{live, other}, r.ct.Flows4, cmpAddr); diff != "" {
		t.Errorf("after a full sync, flows (-want +got):\n%s", diff)
	}

	r.ct.ListErr = errors.New("netlink: no buffer space available")
	if _, err := r.sync(true); err != nil {
		t.Errorf("a conntrack listing failure failed the sync: %v", err)
	}
}
