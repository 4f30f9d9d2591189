package proxy

// Address plan: 198.18.0.0/16 nodes and pods, 198.19.0.0/16 service IPs.

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	k8stestutil "k8s.io/component-base/metrics/testutil"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/kproxy/kproxy/internal/metrics"
	"github.com/kproxy/kproxy/internal/model"
)

// recordingBackend remembers each request and can be told to fail.
type recordingBackend struct {
	reqs []Request
	fail error
	res  *Result
}

func (b *recordingBackend) Sync(_ context.Context, r *Request) (*Result, error) {
	cp := *r
	cp.Changed = sets.New(r.Changed.UnsortedList()...)
	b.reqs = append(b.reqs, cp)
	if b.fail != nil {
		return nil, b.fail
	}
	return b.res, nil
}

func (b *recordingBackend) last(t *testing.T) Request {
	t.Helper()
	if len(b.reqs) == 0 {
		t.Fatal("backend was not called")
	}
	return b.reqs[len(b.reqs)-1]
}

type recordingHealth struct{ queued, updated, failed map[v1.IPFamily]int }

func (h *recordingHealth) QueuedUpdate(f v1.IPFamily) { h.queued[f]++ }
func (h *recordingHealth) Updated(f v1.IPFamily)      { h.updated[f]++ }
func (h *recordingHealth) Failed(f v1.IPFamily)       { h.failed[f]++ }

type recordingServices struct {
	ports map[types.NamespacedName]uint16
	local map[types.NamespacedName]int
}

func (s *recordingServices) SyncServices(p map[types.NamespacedName]uint16) error {
	s.ports = p
	return nil
}
func (s *recordingServices) SyncEndpoints(l map[types.NamespacedName]int) error {
	s.local = l
	return nil
}

func makeService(name, ip string) *v1.Service {
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, ClusterIP: ip, ClusterIPs: []string{ip},
			Ports: []v1.ServicePort{{Name: "p", Port: 80, Protocol: v1.ProtocolTCP}}},
	}
}

func makeSlice(svc, ip string, trigger time.Time) *discovery.EndpointSlice {
	return &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: svc + "-1",
			Labels:      map[string]string{discovery.LabelServiceName: svc},
			Annotations: map[string]string{model.AnnotationTriggerTime: trigger.UTC().Format(time.RFC3339Nano)}},
		AddressType: discovery.AddressTypeIPv4,
		Endpoints:   []discovery.Endpoint{{Addresses: []string{ip}, NodeName: ptr.To("node-a")}},
		Ports:       []discovery.EndpointPort{{Name: ptr.To("p"), Port: ptr.To[int32](8080), Protocol: ptr.To(v1.ProtocolTCP)}},
	}
}

func makeNode(zone string) *v1.Node {
	return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{v1.LabelTopologyZone: zone}}}
}

func setup(t *testing.T) (*Loop, *model.Tracker, *recordingBackend, *clocktesting.FakeClock, *recordingHealth, *recordingServices) {
	t.Helper()
	tr := model.NewTracker(model.TrackerOptions{Hostname: "node-a", Families: []v1.IPFamily{model.IPv4}})
	b := &recordingBackend{}
	clk := clocktesting.NewFakeClock(time.Now())
	h := &recordingHealth{queued: map[v1.IPFamily]int{}, updated: map[v1.IPFamily]int{}, failed: map[v1.IPFamily]int{}}
	s := &recordingServices{}
	l := New(Options{Tracker: tr, Backends: map[v1.IPFamily]Backend{model.IPv4: b}, SyncPeriod: 30 * time.Second, Clock: clk, Health: h, Services: s})
	return l, tr, b, clk, h, s
}

func TestLoopNoSyncBeforeSourcesSynced(t *testing.T) {
	l, tr, b, _, _, _ := setup(t)
	tr.ServiceUpdated(makeService("a", "198.19.0.1"))
	if err := l.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(b.reqs) != 0 {
		t.Fatalf("backend called before sources synced: %d calls", len(b.reqs))
	}
}

func TestLoopFullThenPartial(t *testing.T) {
	ctx := context.Background()
	l, tr, b, clk, h, _ := setup(t)
	tr.NodeUpdated(makeNode("z1"))
	tr.ServiceUpdated(makeService("a", "198.19.0.1"))
	tr.ServiceUpdated(makeService("b", "198.19.0.2"))
	tr.Synced()
	if err := l.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	first := b.last(t)
	if !first.Full || first.Changed.Len() != 2 || len(first.State.Services) != 2 || first.Node == nil {
		t.Fatalf("first sync: full=%v changed=%v services=%d node=%v", first.Full, first.Changed, len(first.State.Services), first.Node)
	}
	if h.updated[model.IPv4] != 1 {
		t.Fatalf("health not told of the update: %v", h.updated)
	}

	clk.Step(time.Second)
	tr.EndpointSliceUpdated(makeSlice("a", "198.18.129.5", clk.Now()))
	if err := l.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	second := b.last(t)
	want := model.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "a"}, Port: "p", Protocol: model.TCP}
	if second.Full || !second.Changed.Equal(sets.New(want)) {
		t.Fatalf("second sync: full=%v changed=%v, want partial with only %v", second.Full, second.Changed, want)
	}

	// Nothing changed: the backend is not called, health still updated.
	n := len(b.reqs)
	if err := l.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if len(b.reqs) != n {
		t.Fatalf("backend called with nothing to do")
	}
	if h.updated[model.IPv4] != 3 {
		t.Fatalf("health updates = %d, want 3", h.updated[model.IPv4])
	}

	// The sync period forces a full sync.
	clk.Step(31 * time.Second)
	if err := l.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if !b.last(t).Full {
		t.Fatal("no full sync after the sync period")
	}
}

// TestLoopFullSyncPeriod: with a full sync period longer than the sync
// period (nftables and iptables modes, as upstream), the periodic sync
// with nothing to do calls no backend but still counts as a successful
// sync; a change after the sync period is partial; the full sync comes
// once the full sync period has passed.
func TestLoopFullSyncPeriod(t *testing.T) {
	ctx := context.Background()
	tr := model.NewTracker(model.TrackerOptions{Hostname: "node-a", Families: []v1.IPFamily{model.IPv4}})
	b := &recordingBackend{}
	clk := clocktesting.NewFakeClock(time.Now())
	h := &recordingHealth{queued: map[v1.IPFamily]int{}, updated: map[v1.IPFamily]int{}, failed: map[v1.IPFamily]int{}}
	l := New(Options{Tracker: tr, Backends: map[v1.IPFamily]Backend{model.IPv4: b}, SyncPeriod: 30 * time.Second,
		FullSyncPeriod: DefaultFullSyncPeriod, Clock: clk, Health: h})
	tr.ServiceUpdated(makeService("a", "198.19.0.1"))
	tr.Synced()
	if err := l.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if !b.last(t).Full {
		t.Fatal("first sync not full")
	}

	stamp := metrics.SyncProxyRulesLastTimestamp.WithLabelValues("IPv4")
	stamp.Set(0)
	clk.Step(31 * time.Second)
	n := len(b.reqs)
	if err := l.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if len(b.reqs) != n {
		t.Fatalf("the periodic sync with nothing to do called the backend: %+v", b.last(t))
	}
	if got, err := k8stestutil.GetGaugeMetricValue(stamp); err != nil || got <= 0 {
		t.Errorf("last sync timestamp = %v (%v) after the periodic sync, want the time of it", got, err)
	}
	if h.updated[model.IPv4] != 2 {
		t.Errorf("health updates = %d, want 2", h.updated[model.IPv4])
	}

	tr.EndpointSliceUpdated(makeSlice("a", "198.18.129.5", clk.Now()))
	if err := l.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if r := b.last(t); r.Full || r.Changed.Len() != 1 {
		t.Fatalf("change after the sync period: full=%v changed=%v, want partial with one port", r.Full, r.Changed)
	}

	clk.Step(DefaultFullSyncPeriod)
	if err := l.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if len(b.reqs) != n+2 || !b.last(t).Full {
		t.Fatalf("no full sync after the full sync period (%d backend calls, want %d)", len(b.reqs), n+2)
	}
}

func TestLoopFailureMakesNextSyncFullAndKeepsChanges(t *testing.T) {
	ctx := context.Background()
	l, tr, b, _, h, _ := setup(t)
	tr.Synced()
	if err := l.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	tr.ServiceUpdated(makeService("a", "198.19.0.1"))
	b.fail = errors.New("kernel says no")
	err := l.Sync(ctx)
	if err == nil || !errors.Is(err, b.fail) {
		t.Fatalf("error not reported: %v", err)
	}
	updatedBefore := h.updated[model.IPv4]
	b.fail = nil
	if err := l.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	r := b.last(t)
	want := model.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "a"}, Port: "p", Protocol: model.TCP}
	if !r.Full || !r.Changed.Has(want) {
		t.Fatalf("after a failure: full=%v changed=%v; want a full sync still listing %v", r.Full, r.Changed, want)
	}
	if h.updated[model.IPv4] != updatedBefore+1 {
		t.Fatal("health not updated after the retry succeeded")
	}
}

func TestLoopNodeLabelChangeForcesFull(t *testing.T) {
	ctx := context.Background()
	l, tr, b, _, _, _ := setup(t)
	tr.NodeUpdated(makeNode("z1"))
	tr.Synced()
	if err := l.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	tr.NodeUpdated(makeNode("z1")) // same labels: nothing to do
	if err := l.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if len(b.reqs) != 1 {
		t.Fatalf("an unchanged node caused a sync")
	}
	tr.NodeUpdated(makeNode("z2"))
	if err := l.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if r := b.last(t); !r.Full || r.Node.Zone() != "z2" {
		t.Fatalf("zone change: full=%v zone=%q", r.Full, r.Node.Zone())
	}
}

func TestLoopFeedsServiceHealth(t *testing.T) {
	ctx := context.Background()
	l, tr, b, _, _, s := setup(t)
	key := types.NamespacedName{Namespace: "ns", Name: "a"}
	b.res = &Result{HealthCheckPorts: map[types.NamespacedName]uint16{key: 32000}, LocalEndpoints: map[types.NamespacedName]int{key: 2}}
	tr.Synced()
	if err := l.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if s.ports[key] != 32000 || s.local[key] != 2 {
		t.Fatalf("service health got ports=%v local=%v", s.ports, s.local)
	}
}

// TestLoopNoLocalEndpointsLabels checks that the no-local-endpoints gauge
// gets the family in ip_family and the policy in traffic_policy (they were
// once swapped, which dashboards grouping by ip_family cannot show).
func TestLoopNoLocalEndpointsLabels(t *testing.T) {
	metrics.SyncProxyRulesNoLocalEndpointsTotal.Reset()
	t.Cleanup(metrics.SyncProxyRulesNoLocalEndpointsTotal.Reset)
	l, tr, b, _, _, _ := setup(t)
	b.res = &Result{NoLocalEndpoints: map[string]int{"internal": 2, "external": 3}}
	tr.Synced()
	if err := l.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	g := metrics.SyncProxyRulesNoLocalEndpointsTotal
	if n := testutil.CollectAndCount(g); n != 2 {
		t.Errorf("%d series, want 2", n)
	}
	for policy, want := range map[string]float64{"internal": 2, "external": 3} {
		lbl := map[string]string{metrics.LabelIPFamily: "IPv4", metrics.LabelTrafficPolicy: policy}
		if got := testutil.ToFloat64(g.With(lbl).(prometheus.Gauge)); got != want {
			t.Errorf("%v = %v, want %v", lbl, got, want)
		}
	}
}

// TestLoopServicePortsGauge checks kproxy_service_ports: the service ports
// of the last successful sync, unchanged by a failed one.
func TestLoopServicePortsGauge(t *testing.T) {
	ctx := context.Background()
	metrics.ServicePorts.Reset()
	t.Cleanup(metrics.ServicePorts.Reset)
	l, tr, b, _, _, _ := setup(t)
	g := metrics.ServicePorts.WithLabelValues("IPv4")
	tr.ServiceUpdated(makeService("a", "198.19.0.1"))
	tr.ServiceUpdated(makeService("b", "198.19.0.2"))
	tr.Synced()
	if err := l.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(g); got != 2 {
		t.Fatalf("service ports = %v after the first sync, want 2", got)
	}
	tr.ServiceUpdated(makeService("c", "198.19.0.3"))
	b.fail = errors.New("kernel says no")
	_ = l.Sync(ctx)
	if got := testutil.ToFloat64(g); got != 2 {
		t.Fatalf("service ports = %v after a failed sync, want 2 (the last successful one's)", got)
	}
	b.fail = nil
	if err := l.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(g); got != 3 {
		t.Fatalf("service ports = %v, want 3", got)
	}
}

// TestLoopDeferredCleanup: a backend's deferred clean-up asks the runner
// for a low-priority sync after the backend's delay (one that does not
// hold back the next change), or for a plain one without that seam; a
// sync with nothing deferred asks for neither.
func TestLoopDeferredCleanup(t *testing.T) {
	ctx := context.Background()
	l, tr, b, _, _, _ := setup(t)
	var requests int
	var cleanups []time.Duration
	l.opts.Request = func() { requests++ }
	l.opts.RequestCleanup = func(d time.Duration) { cleanups = append(cleanups, d) }
	tr.Synced()

	b.res = &Result{CleanupPending: true, CleanupAfter: 700 * time.Millisecond}
	if err := l.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if requests != 0 || len(cleanups) != 1 || cleanups[0] != 700*time.Millisecond {
		t.Fatalf("pending clean-up: requests=%d cleanups=%v, want 0 and [700ms]", requests, cleanups)
	}

	b.res = &Result{CleanupPending: true}
	if err := l.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if len(cleanups) != 2 || cleanups[1] != time.Second {
		t.Fatalf("no delay given: cleanups=%v, want a second", cleanups)
	}

	rc := l.opts.RequestCleanup
	l.opts.RequestCleanup = nil
	b.res = &Result{CleanupPending: true}
	if err := l.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if requests != 1 {
		t.Fatalf("without RequestCleanup the loop must fall back to Request: requests=%d", requests)
	}
	l.opts.RequestCleanup = rc

	b.res = &Result{}
	if err := l.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if requests != 1 || len(cleanups) != 2 {
		t.Fatalf("nothing pending: requests=%d cleanups=%v", requests, cleanups)
	}
}

// TestLoopNetworkProgrammingLatencyFamily: a change to an IPv4
// EndpointSlice is measured in kubeproxy_network_programming_duration_seconds
// of IPv4 only, one of an IPv6 slice in IPv6 only (upstream: each family's
// proxier records its own change tracker's trigger times). The service is
// dual-stack; the other family syncs too (or has nothing to do), and must
// not count the change.
func TestLoopNetworkProgrammingLatencyFamily(t *testing.T) {
	ctx := context.Background()
	both := []v1.IPFamily{model.IPv4, model.IPv6}
	tr := model.NewTracker(model.TrackerOptions{Hostname: "node-a", Families: both})
	b4, b6 := &recordingBackend{}, &recordingBackend{}
	// Trigger times must be later than the tracker's start (real time);
	// the loop's clock says when the rules were applied.
	clk := clocktesting.NewFakeClock(time.Now().Add(time.Hour))
	l := New(Options{Tracker: tr, Backends: map[v1.IPFamily]Backend{model.IPv4: b4, model.IPv6: b6}, SyncPeriod: 30 * time.Second, Clock: clk})
	svc := makeService("a", "198.19.0.1")
	svc.Spec.ClusterIPs = []string{"198.19.0.1", "fd00:19::1"}
	svc.Spec.IPFamilies = both
	tr.ServiceUpdated(svc)
	tr.Synced()
	if err := l.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	v6Slice := func(trigger time.Time) *discovery.EndpointSlice {
		s := makeSlice("a", "fd00:18::5", trigger)
		s.Name, s.AddressType = "a-2", discovery.AddressTypeIPv6
		return s
	}
	count := func(f v1.IPFamily) uint64 {
		t.Helper()
		n, err := k8stestutil.GetHistogramMetricCount(metrics.NetworkProgrammingLatency.WithLabelValues(string(f)))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, tc := range []struct {
		name  string
		slice func(time.Time) *discovery.EndpointSlice
		want  v1.IPFamily
	}{
		{"IPv4 slice", func(tt time.Time) *discovery.EndpointSlice { return makeSlice("a", "198.18.129.5", tt) }, model.IPv4},
		{"IPv6 slice", v6Slice, model.IPv6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := map[v1.IPFamily]uint64{model.IPv4: count(model.IPv4), model.IPv6: count(model.IPv6)}
			tr.EndpointSliceUpdated(tc.slice(time.Now().Add(time.Second)))
			if err := l.Sync(ctx); err != nil {
				t.Fatal(err)
			}
			for _, f := range both {
				want := before[f]
				if f == tc.want {
					want++
				}
				if got := count(f); got != want {
					t.Errorf("%s samples: %d -> %d, want %d", f, before[f], got, want)
				}
			}
		})
	}
}

// slowBackend's sync takes step on the loop's fake clock.
type slowBackend struct {
	recordingBackend
	clk  *clocktesting.FakeClock
	step time.Duration
}

func (b *slowBackend) Sync(ctx context.Context, r *Request) (*Result, error) {
	b.clk.Step(b.step)
	return b.recordingBackend.Sync(ctx, r)
}

// TestLoopNetworkProgrammingLatencyEndsWithItsFamily: a family's changes
// are programmed when its own sync ends, as with upstream's proxier per
// family; a slow sync of the other family (here IPv6, 10 s, after IPv4's
// in the same pass) is not part of IPv4's latency.
func TestLoopNetworkProgrammingLatencyEndsWithItsFamily(t *testing.T) {
	ctx := context.Background()
	both := []v1.IPFamily{model.IPv4, model.IPv6}
	tr := model.NewTracker(model.TrackerOptions{Hostname: "node-a", Families: both})
	trigger := time.Now().Add(time.Second)
	clk := clocktesting.NewFakeClock(trigger.Add(2 * time.Second))
	b4, b6 := &recordingBackend{}, &slowBackend{clk: clk, step: 10 * time.Second}
	l := New(Options{Tracker: tr, Backends: map[v1.IPFamily]Backend{model.IPv4: b4, model.IPv6: b6}, SyncPeriod: 30 * time.Second, Clock: clk})
	svc := makeService("lat", "198.19.0.7")
	svc.Spec.ClusterIPs = []string{"198.19.0.7", "fd00:19::7"}
	svc.Spec.IPFamilies = both
	tr.ServiceUpdated(svc)
	tr.Synced()
	if err := l.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	h := metrics.NetworkProgrammingLatency.WithLabelValues(string(model.IPv4))
	n0, err := k8stestutil.GetHistogramMetricCount(h)
	if err != nil {
		t.Fatal(err)
	}
	sum0, err := k8stestutil.GetHistogramMetricValue(h)
	if err != nil {
		t.Fatal(err)
	}
	tr.EndpointSliceUpdated(makeSlice("lat", "198.18.129.7", trigger))
	// IPv6 has a change of its own in the same pass, so it syncs too.
	v6 := makeSlice("lat", "fd00:18::7", trigger)
	v6.Name, v6.AddressType = "lat-2", discovery.AddressTypeIPv6
	tr.EndpointSliceUpdated(v6)
	clk.SetTime(trigger.Add(2 * time.Second))
	if err := l.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	n1, _ := k8stestutil.GetHistogramMetricCount(h)
	sum1, _ := k8stestutil.GetHistogramMetricValue(h)
	if n1 != n0+1 {
		t.Fatalf("IPv4 samples %d -> %d, want one more", n0, n1)
	}
	// IPv4 ran first and took no time: 2 s after the trigger. With the
	// end of the whole pass it would be 12 s.
	if got := sum1 - sum0; got < 1.9 || got > 2.1 {
		t.Errorf("IPv4 latency %.2f s, want 2 s (its own sync's end, not IPv6's)", got)
	}
}

// TestCheckFamily: IPv4 and IPv6 pass; anything else is named, with the
// backend.
func TestCheckFamily(t *testing.T) {
	for _, f := range []v1.IPFamily{model.IPv4, model.IPv6} {
		if err := CheckFamily("nftables", f); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
	for _, f := range []v1.IPFamily{"", "IPv5"} {
		err := CheckFamily("nftables", f)
		if err == nil || !strings.HasPrefix(err.Error(), "nftables: unknown IP family") {
			t.Errorf("%q: %v; want the family refused", f, err)
		}
	}
}

// TestCheckNew: a bad family is refused before a missing kernel
// interface, which is named with the backend; both present pass.
func TestCheckNew(t *testing.T) {
	if err := CheckNew("nftables", model.IPv4, false, "nf_tables interface"); err != nil {
		t.Errorf("IPv4 with its interface: %v", err)
	}
	if err := CheckNew("nftables", model.IPv6, true, "nf_tables interface"); err == nil || err.Error() != "nftables: no nf_tables interface" {
		t.Errorf("missing interface: %v; want it named", err)
	}
	if err := CheckNew("iptables", "IPv5", true, "iptables interface"); err == nil || !strings.HasPrefix(err.Error(), "iptables: unknown IP family") {
		t.Errorf("bad family: %v; want the family refused first", err)
	}
}
