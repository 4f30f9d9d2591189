package udpflows

// Addresses: 198.19.1.0/24 cluster IPs, 198.19.201.0/24 external and load
// balancer IPs, 198.18.129.0/24 and 198.18.130.0/24 pods (endpoints),
// 198.18.0.10 the node, 203.0.113.0/24 clients; fd00:19::/112 IPv6 cluster
// IPs, fd00:18:1::/48 IPv6 pods, 2001:db8::/32 IPv6 clients. 192.0.2.80 is a
// server outside the cluster that pods talk to.
//
// The table of StaleFlows cases with every endpoint state and traffic
// policy is TestStaleFlows in internal/proxy/nftables (reconcile_test.go);
// the cases here are the ones it lacks (shared frontends) and the calls
// Clear and Reconcile make to the kernel.

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	v1 "k8s.io/api/core/v1"

	"github.com/kproxy/kproxy/internal/kernel/conntrack"
	"github.com/kproxy/kproxy/internal/metrics"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/testutil/fixtures"
)

var cmpAddr = cmp.Comparer(func(a, b netip.Addr) bool { return a == b })

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }

// udpSP returns a UDP ClusterIP service port demo/name:http.
func udpSP(name, clusterIP string, port int32, tweak func(*model.ServicePort)) *model.ServicePort {
	return fixtures.ServicePort(name, clusterIP, port, func(sp *model.ServicePort) {
		sp.Protocol = model.UDP
		if tweak != nil {
			tweak(sp)
		}
	})
}

func ep(ip string, port int32, serving bool) *model.Endpoint {
	return &model.Endpoint{IP: addr(ip), Port: port, Ready: serving, Serving: serving}
}

// flow is a client at src:sport sending to dst and answered by reply.
func flow(src string, sport uint16, dst, reply string) conntrack.Flow {
	d, r := netip.MustParseAddrPort(dst), netip.MustParseAddrPort(reply)
	return conntrack.Flow{OrigSrc: addr(src), OrigSrcPort: sport, OrigDst: d.Addr(), OrigDstPort: d.Port(), ReplySrc: r.Addr(), ReplySrcPort: r.Port()}
}

func state(f v1.IPFamily, sps map[*model.ServicePort][]*model.Endpoint) *model.State {
	s := model.NewState(f)
	for sp, eps := range sps {
		s.Services[sp.Name] = sp
		if eps != nil {
			s.Endpoints[sp.Name] = eps
		}
	}
	return s
}

func sorted(fs []conntrack.Filter) []conntrack.Filter {
	fs = slices.Clone(fs)
	slices.SortFunc(fs, func(a, b conntrack.Filter) int { return strings.Compare(a.String(), b.String()) })
	return fs
}

// game is a UDP LoadBalancer service port: cluster IP, one external IP, a
// VIP-mode and a Proxy-mode ingress IP, node port 30777.
func game() *model.ServicePort {
	return udpSP("game", "198.19.1.7", 7777, func(sp *model.ServicePort) {
		sp.Type, sp.NodePort = v1.ServiceTypeLoadBalancer, 30777
		sp.ExternalIPs = []netip.Addr{addr("198.19.201.7")}
		sp.LoadBalancerIngress = []model.LoadBalancerIngress{
			{IP: addr("198.19.201.8")},
			{IP: addr("198.19.201.9"), Proxy: true},
		}
	})
}

func TestServiceIPs(t *testing.T) {
	got := ServiceIPs(game())
	want := []netip.Addr{addr("198.19.1.7"), addr("198.19.201.7"), addr("198.19.201.8")}
	if diff := cmp.Diff(want, got, cmpAddr); diff != "" {
		t.Errorf("service IPs (-want +got), the Proxy-mode ingress IP is no frontend of this node:\n%s", diff)
	}
	plain := udpSP("dns", "198.19.1.10", 53, nil)
	if diff := cmp.Diff([]netip.Addr{addr("198.19.1.10")}, ServiceIPs(plain), cmpAddr); diff != "" {
		t.Errorf("plain cluster IP (-want +got):\n%s", diff)
	}
}

// TestStaleFlowsSharedFrontends: two UDP service ports on one frontend (a
// conflict the renderer reports) or one node port pool their endpoints, so
// a flow to either's endpoint is kept.
func TestStaleFlowsSharedFrontends(t *testing.T) {
	a := udpSP("a", "198.19.1.20", 53, func(sp *model.ServicePort) { sp.Type, sp.NodePort = v1.ServiceTypeNodePort, 30053 })
	b := udpSP("b", "198.19.1.21", 53, func(sp *model.ServicePort) {
		sp.Type, sp.NodePort = v1.ServiceTypeNodePort, 30053
		sp.ExternalIPs = []netip.Addr{addr("198.19.1.20")} // a's cluster IP
	})
	s := state(model.IPv4, map[*model.ServicePort][]*model.Endpoint{
		a: {ep("198.18.129.1", 53, true)},
		b: {ep("198.18.130.1", 53, true), ep("198.18.130.2", 53, false)},
	})
	flows := []conntrack.Flow{
		flow("203.0.113.1", 5000, "198.19.1.20:53", "198.18.129.1:53"),    // a's endpoint: kept
		flow("203.0.113.1", 5001, "198.19.1.20:53", "198.18.130.1:53"),    // b's endpoint via b's external IP: kept
		flow("203.0.113.1", 5002, "198.19.1.20:53", "198.18.130.2:53"),    // b's, not serving: stale
		flow("203.0.113.1", 5003, "198.19.1.21:53", "198.18.129.1:53"),    // b's cluster IP to a's endpoint: stale
		flow("203.0.113.1", 5004, "198.18.0.10:30053", "198.18.129.1:53"), // node port, either's endpoint: kept
		flow("203.0.113.1", 5005, "198.18.0.10:30053", "198.18.130.1:53"),
		flow("203.0.113.1", 5006, "198.18.0.10:30053", "198.18.129.9:53"), // nobody's: stale
	}
	want := []conntrack.Filter{flows[2].Filter(), flows[3].Filter(), flows[6].Filter()}
	if diff := cmp.Diff(sorted(want), sorted(StaleFlows(s, flows)), cmpAddr); diff != "" {
		t.Errorf("stale flows (-want +got):\n%s", diff)
	}
}

func TestStaleFlowsEmpty(t *testing.T) {
	if got := StaleFlows(model.NewState(model.IPv4), []conntrack.Flow{flow("203.0.113.1", 1, "198.19.1.7:7777", "198.18.129.1:7777")}); len(got) != 0 {
		t.Errorf("no service ports: stale %v, want none", got)
	}
	s := state(model.IPv4, map[*model.ServicePort][]*model.Endpoint{game(): {ep("198.18.129.1", 7777, true)}})
	if got := StaleFlows(s, nil); len(got) != 0 {
		t.Errorf("no flows: stale %v, want none", got)
	}
}

// failingConntrack deletes like the fake, then reports an error.
type failingConntrack struct{ conntrack.Fake }

func (f *failingConntrack) DeleteUDP(ipv6 bool, filters []conntrack.Filter) (int, error) {
	n, _ := f.Fake.DeleteUDP(ipv6, filters)
	return n, errors.New("netlink: operation not permitted")
}

func TestClear(t *testing.T) {
	g := game()
	served := udpSP("dns", "198.19.1.10", 53, nil)
	stale := []Stale{{Service: g, Endpoints: []*model.Endpoint{ep("198.18.129.77", 7777, true)}}}
	wantFilters := []conntrack.Filter{
		// The endpoint's flows through every frontend and the node port.
		{OrigDst: addr("198.19.1.7"), OrigDstPort: 7777, ReplySrc: addr("198.18.129.77")},
		{OrigDst: addr("198.19.201.7"), OrigDstPort: 7777, ReplySrc: addr("198.18.129.77")},
		{OrigDst: addr("198.19.201.8"), OrigDstPort: 7777, ReplySrc: addr("198.18.129.77")},
		{OrigDstPort: 30777, ReplySrc: addr("198.18.129.77")},
		// The cached rejects of the newly served port: any reply source.
		{OrigDst: addr("198.19.1.10"), OrigDstPort: 53},
	}
	keep := flow("203.0.113.1", 5000, "198.19.1.7:7777", "198.18.130.77:7777")
	flows := []conntrack.Flow{
		flow("203.0.113.1", 5001, "198.19.1.7:7777", "198.18.129.77:7777"),
		flow("203.0.113.1", 5002, "198.18.0.10:30777", "198.18.129.77:7777"),
		flow("203.0.113.1", 5003, "198.19.1.10:53", "198.19.1.10:53"),
		keep,
	}

	t.Run("deletes the stale and rejected flows", func(t *testing.T) {
		ct := &conntrack.Fake{Flows4: slices.Clone(flows)}
		deleted := metrics.ReconcileConntrackFlowsDeletedEntriesTotal.WithLabelValues(string(model.IPv4)).(prometheus.Counter)
		before := testutil.ToFloat64(deleted)
		Clear(ct, model.IPv4, stale, []*model.ServicePort{served})
		if len(ct.Calls) != 1 || ct.Calls[0].IPv6 {
			t.Fatalf("want one IPv4 delete call, got %+v", ct.Calls)
		}
		if diff := cmp.Diff(sorted(wantFilters), sorted(ct.Calls[0].Filters), cmpAddr); diff != "" {
			t.Errorf("filters (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]conntrack.Flow{keep}, ct.Flows4, cmpAddr); diff != "" {
			t.Errorf("flows left (-want +got):\n%s", diff)
		}
		if d := testutil.ToFloat64(deleted) - before; d != 3 {
			t.Errorf("deleted entries metric grew by %v, want 3", d)
		}
	})

	t.Run("IPv6 goes to the IPv6 table", func(t *testing.T) {
		sp := udpSP("dns6", "fd00:19::18", 53, nil)
		gone := flow("2001:db8::1", 5000, "[fd00:19::18]:53", "[fd00:18:1:a::53]:53")
		ct := &conntrack.Fake{Flows4: []conntrack.Flow{keep}, Flows6: []conntrack.Flow{gone}}
		Clear(ct, model.IPv6, []Stale{{Service: sp, Endpoints: []*model.Endpoint{ep("fd00:18:1:a::53", 53, true)}}}, nil)
		if len(ct.Calls) != 1 || !ct.Calls[0].IPv6 {
			t.Fatalf("want one IPv6 delete call, got %+v", ct.Calls)
		}
		if len(ct.Flows6) != 0 || len(ct.Flows4) != 1 {
			t.Errorf("IPv4 flows %v (want 1 kept), IPv6 flows %v (want none)", ct.Flows4, ct.Flows6)
		}
	})

	t.Run("nothing to clear makes no call", func(t *testing.T) {
		ct := &conntrack.Fake{Flows4: slices.Clone(flows)}
		Clear(ct, model.IPv4, nil, nil)
		// A stale service port without endpoints gives no filter either.
		Clear(ct, model.IPv4, []Stale{{Service: g}}, nil)
		if len(ct.Calls) != 0 || len(ct.Flows4) != len(flows) {
			t.Errorf("calls %+v, %d flows left, want none and %d", ct.Calls, len(ct.Flows4), len(flows))
		}
	})

	t.Run("nil conntrack", func(t *testing.T) {
		Clear(nil, model.IPv4, stale, []*model.ServicePort{served}) // must not panic
	})

	t.Run("a failed delete still counts what was deleted", func(t *testing.T) {
		ct := &failingConntrack{conntrack.Fake{Flows4: slices.Clone(flows)}}
		deleted := metrics.ReconcileConntrackFlowsDeletedEntriesTotal.WithLabelValues(string(model.IPv4)).(prometheus.Counter)
		before := testutil.ToFloat64(deleted)
		Clear(ct, model.IPv4, stale, []*model.ServicePort{served})
		if d := testutil.ToFloat64(deleted) - before; d != 3 {
			t.Errorf("deleted entries metric grew by %v, want 3", d)
		}
	})
}

func TestReconcile(t *testing.T) {
	g := game()
	s := state(model.IPv4, map[*model.ServicePort][]*model.Endpoint{g: {ep("198.18.129.77", 7777, true)}})
	live := flow("203.0.113.1", 5000, "198.19.1.7:7777", "198.18.129.77:7777")
	dead := flow("203.0.113.1", 5001, "198.19.201.8:7777", "198.18.130.250:7777")
	other := flow("198.18.129.5", 5002, "192.0.2.80:53", "192.0.2.80:53")

	t.Run("deletes what is stale, keeps the rest", func(t *testing.T) {
		ct := &conntrack.Fake{Flows4: []conntrack.Flow{live, dead, other}, Flows6: []conntrack.Flow{dead}}
		deleted := metrics.ReconcileConntrackFlowsDeletedEntriesTotal.WithLabelValues(string(model.IPv4)).(prometheus.Counter)
		before := testutil.ToFloat64(deleted)
		Reconcile(ct, model.IPv4, s)
		if diff := cmp.Diff([]conntrack.Flow{live, other}, ct.Flows4, cmpAddr); diff != "" {
			t.Errorf("IPv4 flows (-want +got):\n%s", diff)
		}
		if len(ct.Flows6) != 1 {
			t.Errorf("reconciling IPv4 touched the IPv6 table: %v", ct.Flows6)
		}
		if diff := cmp.Diff([]conntrack.Filter{dead.Filter()}, ct.Calls[0].Filters, cmpAddr); len(ct.Calls) != 1 || diff != "" {
			t.Errorf("want one call deleting exactly the dead flow, got %+v", ct.Calls)
		}
		if d := testutil.ToFloat64(deleted) - before; d != 1 {
			t.Errorf("deleted entries metric grew by %v, want 1", d)
		}
	})

	t.Run("nothing stale makes no delete call", func(t *testing.T) {
		ct := &conntrack.Fake{Flows4: []conntrack.Flow{live, other}}
		Reconcile(ct, model.IPv4, s)
		if len(ct.Calls) != 0 {
			t.Errorf("delete calls %+v, want none", ct.Calls)
		}
	})

	t.Run("a listing failure deletes nothing", func(t *testing.T) {
		ct := &conntrack.Fake{Flows4: []conntrack.Flow{live, dead}, ListErr: errors.New("netlink: no buffer space available")}
		Reconcile(ct, model.IPv4, s)
		if len(ct.Calls) != 0 || len(ct.Flows4) != 2 {
			t.Errorf("calls %+v, flows %v: want none and both kept", ct.Calls, ct.Flows4)
		}
	})

	t.Run("each run is timed and counted, also when nothing is stale", func(t *testing.T) {
		ct := &conntrack.Fake{Flows6: []conntrack.Flow{flow("2001:db8::1", 5000, "[fd00:19::18]:53", "[fd00:18:1:a::53]:53")}}
		s6 := state(model.IPv6, map[*model.ServicePort][]*model.Endpoint{udpSP("dns6", "fd00:19::18", 53, nil): {ep("fd00:18:1:a::53", 53, true)}})
		metrics.ReconcileConntrackFlowsDeletedEntriesTotal.DeleteLabelValues(string(model.IPv6))
		before := sampleCount(t, model.IPv6)
		Reconcile(ct, model.IPv6, s6)
		if d := sampleCount(t, model.IPv6) - before; d != 1 {
			t.Errorf("reconciler duration observed %d times, want 1", d)
		}
		if !hasSeries(t, "kubeproxy_conntrack_reconciler_deleted_entries_total", model.IPv6) {
			t.Errorf("the deleted entries counter has no IPv6 series after a run that deleted nothing")
		}
	})

	t.Run("no UDP service port: nothing listed, nothing observed", func(t *testing.T) {
		// Like upstream, whose reconciler runs only when a UDP service
		// port's endpoints changed, the metric appears with the first
		// run that had something to check.
		ct := &listCounter{}
		tcp := udpSP("web", "198.19.1.80", 80, func(sp *model.ServicePort) { sp.Protocol = model.TCP })
		before := sampleCount(t, model.IPv4)
		Reconcile(ct, model.IPv4, state(model.IPv4, map[*model.ServicePort][]*model.Endpoint{tcp: {ep("198.18.129.80", 80, true)}}))
		if ct.lists != 0 || sampleCount(t, model.IPv4) != before {
			t.Errorf("listed %d times, %d observations added; want none", ct.lists, sampleCount(t, model.IPv4)-before)
		}
	})

	t.Run("a listing failure is not timed", func(t *testing.T) {
		ct := &conntrack.Fake{ListErr: errors.New("netlink: no buffer space available")}
		before := sampleCount(t, model.IPv4)
		Reconcile(ct, model.IPv4, s)
		if d := sampleCount(t, model.IPv4) - before; d != 0 {
			t.Errorf("a failed run was observed %d times", d)
		}
	})

	t.Run("nil conntrack or state", func(t *testing.T) {
		Reconcile(nil, model.IPv4, s) // must not panic
		ct := &conntrack.Fake{Flows4: []conntrack.Flow{dead}}
		Reconcile(ct, model.IPv4, nil)
		if len(ct.Calls) != 0 {
			t.Errorf("reconciled without a state: %+v", ct.Calls)
		}
	})
}

// listCounter counts ListUDP calls.
type listCounter struct {
	conntrack.Fake
	lists int
}

func (l *listCounter) ListUDP(ipv6 bool) ([]conntrack.Flow, error) {
	l.lists++
	return l.Fake.ListUDP(ipv6)
}

// sampleCount is the number of observations of the reconciler duration
// histogram for family (0 without a series).
func sampleCount(t *testing.T, family v1.IPFamily) uint64 {
	t.Helper()
	for _, m := range gather(t, "kubeproxy_conntrack_reconciler_sync_duration_seconds") {
		if labelIs(m, metrics.LabelIPFamily, string(family)) {
			return m.GetHistogram().GetSampleCount()
		}
	}
	return 0
}

func hasSeries(t *testing.T, name string, family v1.IPFamily) bool {
	t.Helper()
	for _, m := range gather(t, name) {
		if labelIs(m, metrics.LabelIPFamily, string(family)) {
			return true
		}
	}
	return false
}

func gather(t *testing.T, name string) []*dto.Metric {
	t.Helper()
	mfs, err := metrics.Gatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()
		}
	}
	return nil
}

func labelIs(m *dto.Metric, name, value string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue() == value
		}
	}
	return false
}

func TestRemoved(t *testing.T) {
	a, b, c := ep("198.18.129.1", 53, true), ep("198.18.129.2", 53, true), ep("198.18.129.3", 53, true)
	now := []*model.Endpoint{ep("198.18.129.1", 53, true), ep("198.18.129.2", 53, false), ep("198.18.129.3", 5353, true)}
	got := Removed([]*model.Endpoint{a, b, c}, now)
	// a still serves; b no longer serves; c moved to another port.
	if len(got) != 2 || got[0] != b || got[1] != c {
		t.Errorf("Removed = %v, want [%v %v]", got, b, c)
	}
	if got := Removed(nil, now); got != nil {
		t.Errorf("Removed(nil) = %v", got)
	}
}

// TestKeptThenRemoved: an endpoint that turns terminating (serving, no
// longer reachable) keeps its flows, and is named stale by the sync in
// which it goes away, as the Conntrack e2e test of a cycling UDP server
// pod needs. Comparing with the reachable endpoints alone never names it.
func TestKeptThenRemoved(t *testing.T) {
	first, second := ep("198.18.129.1", 53, true), ep("198.18.129.2", 53, true)
	// Both ready: both reachable, both kept.
	kept := Kept([]*model.Endpoint{first, second}, []*model.Endpoint{first, second})
	if len(kept) != 2 {
		t.Fatalf("Kept = %v, want both", kept)
	}
	// The first terminates: new traffic goes to the second only, the
	// first still serves, so its flows stay.
	terminating := ep("198.18.129.1", 53, true)
	terminating.Ready = false
	now := []*model.Endpoint{terminating, second}
	if got := Removed(kept, now); len(got) != 0 {
		t.Errorf("a serving terminating endpoint named stale: %v", got)
	}
	kept = Kept([]*model.Endpoint{second}, now)
	if len(kept) != 2 {
		t.Fatalf("Kept = %v, want the reachable one and the serving terminating one", kept)
	}
	// The first goes away: its flows must go.
	now = []*model.Endpoint{second}
	if got := Removed(kept, now); len(got) != 1 || got[0].AddrPort() != first.AddrPort() {
		t.Errorf("Removed = %v, want the endpoint that went away (%v)", got, first)
	}
	if got := Removed([]*model.Endpoint{second}, now); len(got) != 0 {
		t.Errorf("the reachable list alone names %v", got)
	}
}
