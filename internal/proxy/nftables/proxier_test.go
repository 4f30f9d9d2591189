package nftables

// Proxier tests: the backend applying plans to the stateful nft fake. The
// address plan is at the top of fixtures_test.go; services added here use
// 198.19.1.0/24 cluster IPs and 198.19.201.0/24 external and LB IPs.

import (
	"context"
	"errors"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kproxy/kproxy/internal/example"
	"github.com/kproxy/kproxy/internal/kernel/conntrack"
	"github.com/kproxy/kproxy/internal/kernel/nft"
	"github.com/kproxy/kproxy/internal/kernel/nft/nfttest"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy"
	"github.com/kproxy/kproxy/internal/proxy/flowtest"
	"github.com/kproxy/kproxy/internal/testutil/fixtures"
	nfttrace "github.com/kproxy/kproxy/internal/trace/nftables"
)

// proxierRig is a Proxier on the fake kernel, fed like the sync loop feeds
// it: one State it changes through deltas, the changed names per sync.
type proxierRig struct {
	t     *testing.T
	fake  *nfttest.Fake
	ct    *conntrack.Fake
	p     *Proxier
	opts  Options
	node  *model.Node
	state *model.State
	// pending are the names changed since the last successful sync (the
	// loop keeps them across a failed sync).
	pending sets.Set[model.ServicePortName]
	now     time.Time
}

// requireFakeSupport skips the test while nfttest.Fake refuses a statement
// the renderer writes (EOPNOTSUPP: not implemented in the fake), so that
// the fake's gaps show as skips rather than as proxier failures.
func requireFakeSupport(t *testing.T, c *flowtest.Snapshot, f v1.IPFamily) {
	t.Helper()
	err := nfttest.New().Apply(context.Background(), renderFull(t, c, exampleOptions(f)).Tx)
	if errors.Is(err, unix.EOPNOTSUPP) {
		t.Skipf("nfttest.Fake does not support what the renderer writes yet: %v", err)
	}
	if err != nil {
		t.Fatalf("the fake refuses a full render of the example: %v", err)
	}
}

func newProxierRig(t *testing.T, c *flowtest.Snapshot, f v1.IPFamily) *proxierRig {
	requireFakeSupport(t, c, f)
	r := &proxierRig{
		t:       t,
		fake:    nfttest.New(),
		ct:      &conntrack.Fake{},
		opts:    exampleOptions(f),
		node:    c.Node,
		state:   c.States[f].Clone(),
		pending: sets.New[model.ServicePortName](),
		now:     epoch,
	}
	r.p = r.newProxier()
	return r
}

// newProxier is a proxier over the rig's fake kernel.
func (r *proxierRig) newProxier() *Proxier {
	r.t.Helper()
	p, err := NewProxier(r.opts, Handles{NFT: r.fake, HostHandles: proxy.HostHandles{Conntrack: r.ct}})
	if err != nil {
		r.t.Fatal(err)
	}
	return p
}

func (r *proxierRig) sync(full bool) (*proxy.Result, error) {
	r.t.Helper()
	res, err := r.p.Sync(context.Background(), &proxy.Request{State: r.state, Changed: r.pending.Clone(), Node: r.node, Full: full, Now: r.now})
	if err == nil {
		r.pending = sets.New[model.ServicePortName]()
	}
	return res, err
}

func (r *proxierRig) mustSync(full bool) *proxy.Result {
	r.t.Helper()
	res, err := r.sync(full)
	if err != nil {
		r.t.Fatalf("sync: %v", err)
	}
	return res
}

func (r *proxierRig) apply(d *model.FamilyDelta) {
	r.pending = r.pending.Union(r.state.Apply(d))
}

func (r *proxierRig) family() nft.Family { return nft.FamilyFor(r.opts.Family) }

// dump is every table of the fake kernel: the main table and the shards.
func (r *proxierRig) dump() string { return r.fake.Dump() }

// lastApply is the last Apply call the fake saw.
func (r *proxierRig) lastApply() nfttest.ApplyRecord {
	r.t.Helper()
	a := r.fake.Applies()
	if len(a) == 0 {
		r.t.Fatal("no Apply call")
	}
	return a[len(a)-1]
}

// isFull reports whether a transaction is a full sync: it (re)declares the
// table and flushes the fixed maps.
func isFull(tx *nft.Transaction) bool {
	return tx.Len() > 0 && tx.Ops[0].Kind == nft.OpAdd && tx.Ops[0].Table != nil &&
		strings.Contains(tx.String(), "flush map ip"+map[bool]string{true: "6", false: ""}[tx.Family == nft.IPv6]+" kube-proxy no-endpoint-services\n") &&
		strings.Contains(tx.String(), "flush map ip"+map[bool]string{true: "6", false: ""}[tx.Family == nft.IPv6]+" kube-proxy-s0 service-ips\n")
}

// freshDump is what a fresh node holds after a full sync of the state.
func (r *proxierRig) freshDump() string {
	r.t.Helper()
	f := nfttest.New()
	cfg := r.opts.RenderConfig(r.node, r.node.Addresses)
	in := &Input{RenderInput: proxy.RenderInput{State: r.state, NodeName: r.node.Name, Zone: r.node.Zone()}, Full: true, Now: r.now}
	if err := f.Apply(context.Background(), Render(cfg, in, NewApplied()).Tx); err != nil {
		r.t.Fatalf("a fresh full render does not apply: %v", err)
	}
	return f.Dump()
}

// rules traces the fake kernel's current table.
func (r *proxierRig) rules() *nfttrace.Ruleset {
	r.t.Helper()
	return parse(r.t, r.dump())
}

func TestProxierSync(t *testing.T) {
	c := flowtest.Example(t, example.NodeA)
	r := newProxierRig(t, c, model.IPv4)

	// The first sync is full even when not asked for.
	res := r.mustSync(false)
	if a := r.lastApply(); !isFull(a.Tx) {
		t.Errorf("first sync is not a full sync:\n%s", a.Tx)
	}
	if diff := cmp.Diff(r.freshDump(), r.dump()); diff != "" {
		t.Errorf("kernel after the first sync differs from a full render (-want +got):\n%s", diff)
	}
	etp := types.NamespacedName{Namespace: example.Namespace, Name: "etp-local"}
	if diff := cmp.Diff(map[types.NamespacedName]uint16{etp: 32081}, res.HealthCheckPorts); diff != "" {
		t.Errorf("health check ports (-want +got):\n%s", diff)
	}
	if res.LocalEndpoints[etp] != 1 {
		t.Errorf("local endpoints of %s: %d, want 1", etp, res.LocalEndpoints[etp])
	}
	if diff := cmp.Diff(map[string]int{"internal": 0, "external": 0}, res.NoLocalEndpoints); diff != "" {
		t.Errorf("no-local-endpoint counts (-want +got):\n%s", diff)
	}

	// Nothing changed: no kernel work at all.
	calls, ops := len(r.fake.Applies()), r.fake.OpsApplied()
	r.now = r.now.Add(time.Second)
	r.mustSync(false)
	if len(r.fake.Applies()) != calls || r.fake.OpsApplied() != ops {
		t.Errorf("unchanged sync sent work to the kernel: %d calls, %d ops (before: %d, %d)", len(r.fake.Applies()), r.fake.OpsApplied(), calls, ops)
	}

	// One change: a partial transaction naming only that service.
	web := fixtures.SPName("web-clusterip", "http", model.TCP)
	r.apply(&model.FamilyDelta{Endpoints: map[model.ServicePortName][]*model.Endpoint{web: r.state.Endpoints[web][:1]}})
	r.mustSync(false)
	a := r.lastApply()
	if isFull(a.Tx) || a.Ops == 0 {
		t.Errorf("one change: want a partial transaction, got %d ops:\n%s", a.Ops, a.Tx)
	}
	for i := range a.Tx.Ops {
		// web-clusterip is a plain ClusterIP port: with one endpoint it
		// goes to the chain plain TCP ports with one endpoint share,
		// created now (no other port of its shard has one endpoint).
		op := a.Tx.OpText(i)
		if f := strings.Fields(op); len(f) > 4 && f[1] != "element" && strings.HasPrefix(f[4], prefixSharedChain+"tcp/1") {
			continue
		}
		if !servicesMentioned(op).Equal(sets.New("web-clusterip")) && !strings.Contains(op, "198.19.0.10") {
			t.Errorf("partial sync touches another service: %s", op)
		}
	}
	runPacketFlowTests(t, r.rules(), hostA, []packetFlowTest{
		{name: "one endpoint left", src: localPod, iif: podIIF, dst: "198.19.0.10:80", output: "198.18.129.10:8080"},
	})

	// A requested full sync rewrites everything and leaves the same
	// table as a fresh node once the stale endpoint chain is gone.
	// (Its clean-up transaction follows: the endpoint map only
	// web-clusterip used, which its one endpoint no longer needs, is
	// deleted.)
	r.now = r.now.Add(time.Second)
	before := len(r.fake.Applies())
	r.mustSync(true)
	if a := r.fake.Applies()[before]; !isFull(a.Tx) {
		t.Errorf("requested full sync is partial:\n%s", a.Tx)
	}
	if diff := cmp.Diff(r.freshDump(), r.dump()); diff != "" {
		t.Errorf("after a full sync (-want +got):\n%s", diff)
	}
}

// TestProxierApplyFailure changes a service port with chains of its own
// (a NodePort service), so that a chain deleted behind our back is one the
// partial transaction uses.
func TestProxierApplyFailure(t *testing.T) {
	c := flowtest.Example(t, example.NodeA)
	for _, tc := range []struct {
		name   string
		break_ func(r *proxierRig)
	}{{
		name: "kernel refuses the transaction",
		break_: func(r *proxierRig) {
			r.fake.BeforeApply = func(*nft.Transaction) error {
				r.fake.BeforeApply = nil // only this once
				return &nft.OpError{Index: -1, Err: unix.ENOMEM, Message: "out of memory"}
			}
		},
	}, {
		// Someone deleted our tables behind our back: the partial
		// transaction refers to chains that are gone.
		name: "tables deleted by someone else",
		break_: func(r *proxierRig) {
			tables, err := r.fake.ListTables(context.Background(), r.family())
			if err != nil {
				r.t.Fatal(err)
			}
			for _, t := range tables {
				if err := r.fake.DeleteTable(context.Background(), r.family(), t); err != nil {
					r.t.Fatal(err)
				}
			}
		},
	}, {
		// Someone emptied a service chain and deleted the endpoint chain
		// it used: the partial transaction sends traffic to a chain it
		// believes exists, and the kernel refuses it.
		name: "service chain deleted by someone else",
		break_: func(r *proxierRig) {
			web := fixtures.SPName("web-nodeport", "http", model.TCP)
			sp := r.state.Services[web]
			tx := nft.NewTransaction(r.family(), ShardTable(DefaultTableName, ShardOf(web, r.p.applied.shards)))
			tx.Delete(&nft.Element{Set: mapServiceIPs, Key: []nft.Value{{Addr: sp.ClusterIP}, {Proto: sp.Protocol}, {Port: uint16(sp.Port)}}})
			// Its external chain jumps to it: emptied first.
			tx.Flush(&nft.Chain{Name: serviceChainName(prefixExternalChain, web)})
			ch := &nft.Chain{Name: serviceChainName(prefixServiceChain, web)}
			tx.Flush(ch)
			tx.Delete(ch)
			if err := r.fake.Apply(context.Background(), tx); err != nil {
				r.t.Fatal(err)
			}
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			r := newProxierRig(t, c, model.IPv4)
			r.mustSync(false)
			good := r.dump()

			tc.break_(r)
			before := r.dump()
			web := fixtures.SPName("web-nodeport", "http", model.TCP)
			r.apply(&model.FamilyDelta{Endpoints: map[model.ServicePortName][]*model.Endpoint{web: r.state.Endpoints[web][1:]}})
			r.now = r.now.Add(time.Second)
			if _, err := r.sync(false); err == nil {
				t.Fatalf("sync succeeded; want an error. Last transaction:\n%s", r.lastApply().Tx)
			} else if tc.name == "kernel refuses the transaction" && !errors.Is(err, unix.ENOMEM) {
				t.Errorf("error does not wrap the kernel's: %v", err)
			}
			if diff := cmp.Diff(before, r.dump()); diff != "" {
				t.Errorf("a failed sync changed the kernel (-before +after):\n%s", diff)
			}
			if tc.name == "kernel refuses the transaction" && r.dump() != good {
				t.Errorf("previous rules not kept")
			}

			// The next sync is full and repairs everything.
			r.now = r.now.Add(time.Second)
			r.mustSync(false)
			if a := r.lastApply(); !isFull(a.Tx) {
				t.Errorf("sync after a failure is partial:\n%s", a.Tx)
			}
			runPacketFlowTests(t, r.rules(), hostA, []packetFlowTest{
				{name: "change applied", src: localPod, iif: podIIF, dst: "198.19.0.11:80", output: "198.18.130.10:8080"},
				{name: "others intact", src: localPod, iif: podIIF, dst: "198.19.0.16:80", output: affinityEps},
			})
			// Once stale objects are gone the kernel holds exactly what a
			// fresh node would.
			r.now = r.now.Add(time.Minute)
			r.mustSync(false)
			if diff := cmp.Diff(r.freshDump(), r.dump()); diff != "" {
				t.Errorf("after recovery (-want +got):\n%s", diff)
			}
		})
	}
}

// TestProxierRestart: a new proxier over the table of an old one takes it
// over; what the old one had and the new state lacks is removed after the
// stale delay.
func TestProxierRestart(t *testing.T) {
	c := flowtest.Example(t, example.NodeA)
	old := newProxierRig(t, c, model.IPv4)
	old.mustSync(false)

	r := newProxierRig(t, c, model.IPv4)
	r.fake = old.fake
	r.p = r.newProxier()
	gone := fixtures.SPName("affinity", "http", model.TCP)
	delete(r.state.Services, gone)
	delete(r.state.Endpoints, gone)
	r.now = r.now.Add(time.Hour)
	r.mustSync(false)
	runPacketFlowTests(t, r.rules(), hostA, []packetFlowTest{
		{name: "removed while down", src: localPod, iif: podIIF, dst: "198.19.0.16:80", output: "ACCEPT"},
		{name: "others intact", src: localPod, iif: podIIF, dst: "198.19.0.10:80", output: webEps},
	})
	leftovers := func() []string {
		var out []string
		for _, l := range strings.Split(r.dump(), "\n") {
			if strings.Contains(l, "demo/affinity/") && (strings.HasPrefix(l, "add chain") || strings.HasPrefix(l, "add set")) {
				out = append(out, l)
			}
		}
		return out
	}
	if n := len(leftovers()); n != 3 {
		t.Errorf("want the chain and 2 sets of the removed service kept for now, got %d:\n%s", n, strings.Join(leftovers(), "\n"))
	}
	// The first sync after the stale delay deletes them, in a clean-up
	// transaction of its own.
	r.now = r.now.Add(staleDelay)
	res := r.mustSync(false)
	if res.CleanupPending {
		t.Error("clean-up still pending after the stale delay")
	}
	if l := leftovers(); len(l) != 0 {
		t.Errorf("left over after the stale delay:\n%s", strings.Join(l, "\n"))
	}
	if diff := cmp.Diff(r.freshDump(), r.dump()); diff != "" {
		t.Errorf("after the takeover (-want +got):\n%s", diff)
	}
}

// TestProxierInvalidService: a service the tracker finds invalid is left
// out (or only its invalid parts are), and every other service is still
// programmed.
func TestProxierInvalidService(t *testing.T) {
	objs := example.Objects()
	svc := func(name, clusterIP string, tweak func(*v1.Service)) *v1.Service {
		s := &v1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: example.Namespace, Name: name},
			Spec: v1.ServiceSpec{
				Type: v1.ServiceTypeClusterIP, ClusterIP: clusterIP, ClusterIPs: []string{clusterIP},
				IPFamilies: []v1.IPFamily{v1.IPv4Protocol},
				Ports:      []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)}},
			},
		}
		if tweak != nil {
			tweak(s)
		}
		return s
	}
	// Between the example's services, so that neither order of feeding
	// nor of rendering can hide a failure.
	bad := []*v1.Service{
		svc("bad-cluster-ip", "198.19.1.300", nil),
		svc("bad-parts", "198.19.1.2", func(s *v1.Service) {
			s.Spec.ExternalIPs = []string{"not-an-ip", "198.19.201.5"}
			s.Spec.Ports = append(s.Spec.Ports,
				v1.ServicePort{Name: "zero", Port: 0, Protocol: v1.ProtocolTCP},
				v1.ServicePort{Name: "weird", Port: 81, Protocol: "ICMP"})
		}),
	}
	objs.Services = append(objs.Services[:3], append(bad, objs.Services[3:]...)...)

	var invalid []string
	tracker := model.NewTracker(model.TrackerOptions{
		Hostname:  example.NodeA,
		Families:  []v1.IPFamily{model.IPv4, model.IPv6},
		OnInvalid: func(e *model.InvalidError) { invalid = append(invalid, e.Object+" "+e.Field) },
	})
	objs.Feed(tracker)
	u := tracker.Take()
	slices.Sort(invalid)
	want := []string{
		"demo/bad-cluster-ip spec.clusterIPs[0]",
		"demo/bad-parts spec.externalIPs[0]",
		"demo/bad-parts spec.ports[1].port",
		"demo/bad-parts spec.ports[2].protocol",
	}
	if diff := cmp.Diff(want, invalid); diff != "" {
		t.Errorf("reported invalid parts (-want +got):\n%s", diff)
	}

	c := flowtest.Example(t, example.NodeA)
	st := model.NewState(model.IPv4)
	st.Apply(u.Families[model.IPv4])
	c.States[model.IPv4] = st
	r := newProxierRig(t, c, model.IPv4)
	r.mustSync(false)
	runPacketFlowTests(t, r.rules(), hostA, []packetFlowTest{
		{name: "valid part of the bad service", src: outside, iif: lanIIF, dst: "198.19.201.5:80", output: "REJECT"},
		{name: "bad service's cluster IP", src: localPod, iif: podIIF, dst: "198.19.1.2:80", output: "REJECT"},
		{name: "invalid port left out", src: localPod, iif: podIIF, dst: "198.19.1.2:0", output: "REJECT"},
		{name: "clusterIP", src: localPod, iif: podIIF, dst: "198.19.0.10:80", output: webEps},
		{name: "nodePort", src: outside, iif: lanIIF, dst: "198.18.0.10:30080", output: webEps, masq: true},
		{name: "LB", src: outside, iif: lanIIF, dst: "198.19.200.1:443", output: webEps, masq: true},
		{name: "UDP", proto: v1.ProtocolUDP, src: localPod, iif: podIIF, dst: "198.19.0.18:53", output: dnsEps},
		{name: "topology", src: localPod, iif: podIIF, dst: "198.19.0.22:80", output: topoZoneAEps},
	})
	if n := len(st.Services); n != 15 {
		t.Errorf("%d IPv4 service ports programmed, want the example's 14 and bad-parts' valid one", n)
	}
}

// TestProxierUDPConntrack: the conntrack entries the proxier asks to
// delete when UDP endpoints go away or a UDP service gets endpoints.
func TestProxierUDPConntrack(t *testing.T) {
	c := flowtest.Example(t, example.NodeA)
	r := newProxierRig(t, c, model.IPv4)
	// A UDP service reachable every way: cluster IP, external IP, an LB
	// VIP, an ipMode Proxy ingress IP (not ours) and a NodePort.
	game := fixtures.ServicePort("game", "198.19.1.7", 7777, func(sp *model.ServicePort) {
		sp.Protocol = model.UDP
		sp.Type, sp.NodePort = v1.ServiceTypeLoadBalancer, 30777
		sp.ExternalIPs = []netip.Addr{netip.MustParseAddr("198.19.201.7")}
		sp.LoadBalancerIngress = []model.LoadBalancerIngress{
			{IP: netip.MustParseAddr("198.19.201.8")},
			{IP: netip.MustParseAddr("198.19.201.9"), Proxy: true},
		}
	})
	gameEps := []*model.Endpoint{fixtures.Endpoint("198.18.129.77", 7777, true, nil), fixtures.Endpoint("198.18.130.77", 7777, false, nil)}
	r.apply(&model.FamilyDelta{
		Services:  map[model.ServicePortName]*model.ServicePort{game.Name: game},
		Endpoints: map[model.ServicePortName][]*model.Endpoint{game.Name: gameEps},
	})
	r.mustSync(false)
	if len(r.ct.Calls) != 0 {
		t.Errorf("first (full) sync deleted conntrack entries: %+v", r.ct.Calls)
	}
	addr := netip.MustParseAddr
	step := func(name string, d *model.FamilyDelta, want []conntrack.Filter) {
		t.Helper()
		r.ct.Calls = nil
		r.apply(d)
		r.now = r.now.Add(time.Second)
		r.mustSync(false)
		var got []conntrack.Filter
		for _, call := range r.ct.Calls {
			if call.IPv6 {
				t.Errorf("%s: IPv6 conntrack call from the IPv4 proxier", name)
			}
			got = append(got, call.Filters...)
		}
		less := func(a, b conntrack.Filter) int { return strings.Compare(a.String(), b.String()) }
		slices.SortFunc(got, less)
		slices.SortFunc(want, less)
		if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
			t.Errorf("%s: conntrack filters (-want +got):\n%s", name, diff)
		}
	}
	dns := fixtures.SPName("dns-udp", "dns", model.UDP)
	dnsEpsAll := r.state.Endpoints[dns]

	step("a UDP endpoint goes away", &model.FamilyDelta{Endpoints: map[model.ServicePortName][]*model.Endpoint{dns: dnsEpsAll[:1]}},
		[]conntrack.Filter{{OrigDst: addr("198.19.0.18"), OrigDstPort: 53, ReplySrc: addr("198.18.130.53")}})
	step("a TCP endpoint goes away", &model.FamilyDelta{Endpoints: map[model.ServicePortName][]*model.Endpoint{fixtures.SPName("dns-udp", "dns-tcp", model.TCP): dnsEpsAll[:1]}},
		nil)
	step("a UDP endpoint of an externally reachable service goes away", &model.FamilyDelta{Endpoints: map[model.ServicePortName][]*model.Endpoint{game.Name: gameEps[1:]}},
		[]conntrack.Filter{
			{OrigDst: addr("198.19.1.7"), OrigDstPort: 7777, ReplySrc: addr("198.18.129.77")},
			{OrigDst: addr("198.19.201.7"), OrigDstPort: 7777, ReplySrc: addr("198.18.129.77")},
			{OrigDst: addr("198.19.201.8"), OrigDstPort: 7777, ReplySrc: addr("198.18.129.77")},
			{OrigDstPort: 30777, ReplySrc: addr("198.18.129.77")},
		})
	step("the last UDP endpoint goes away", &model.FamilyDelta{Endpoints: map[model.ServicePortName][]*model.Endpoint{dns: nil}},
		[]conntrack.Filter{{OrigDst: addr("198.19.0.18"), OrigDstPort: 53, ReplySrc: addr("198.18.129.53")}})
	step("a UDP service gets its first endpoint", &model.FamilyDelta{Endpoints: map[model.ServicePortName][]*model.Endpoint{dns: dnsEpsAll}},
		[]conntrack.Filter{{OrigDst: addr("198.19.0.18"), OrigDstPort: 53}})
	step("a UDP service with endpoints is deleted", &model.FamilyDelta{
		Services:  map[model.ServicePortName]*model.ServicePort{game.Name: nil},
		Endpoints: map[model.ServicePortName][]*model.Endpoint{game.Name: nil},
	}, []conntrack.Filter{
		{OrigDst: addr("198.19.1.7"), OrigDstPort: 7777, ReplySrc: addr("198.18.130.77")},
		{OrigDst: addr("198.19.201.7"), OrigDstPort: 7777, ReplySrc: addr("198.18.130.77")},
		{OrigDst: addr("198.19.201.8"), OrigDstPort: 7777, ReplySrc: addr("198.18.130.77")},
		{OrigDstPort: 30777, ReplySrc: addr("198.18.130.77")},
	})
	// Upstream's reconciler (pkg/proxy/conntrack, 1.32+) keeps flows to
	// every serving endpoint: "changes to the service should not affect
	// existing flows", so neither traffic policy, topology nor
	// terminating status count; kproxy does the same.
	draining := *dnsEpsAll[1]
	draining.Ready, draining.Terminating = false, true
	r.ct.Calls = nil
	r.apply(&model.FamilyDelta{Endpoints: map[model.ServicePortName][]*model.Endpoint{dns: {dnsEpsAll[0], &draining}}})
	r.now = r.now.Add(time.Second)
	r.mustSync(false)
	t.Run("terminating endpoint keeps its flows", func(t *testing.T) {
		if len(r.ct.Calls) != 0 {
			t.Fatalf("flows to a serving terminating endpoint were deleted: %+v", r.ct.Calls)
		}
	})
	newUDP := fixtures.ServicePort("new-udp", "198.19.1.8", 53, func(sp *model.ServicePort) { sp.Protocol = model.UDP })
	step("a new UDP service with endpoints", &model.FamilyDelta{
		Services:  map[model.ServicePortName]*model.ServicePort{newUDP.Name: newUDP},
		Endpoints: map[model.ServicePortName][]*model.Endpoint{newUDP.Name: {fixtures.Endpoint("198.18.129.88", 53, true, nil)}},
	}, []conntrack.Filter{{OrigDst: addr("198.19.1.8"), OrigDstPort: 53}})
}

// upstreamLayout rewrites a full render of the example into the layout of
// an upstream kube-proxy release, so that a kproxy start on a node upstream
// ran on can be tested: one table (the shards' objects folded into the
// main table), masquerade marks set by "jump mark-for-masquerade", and
// upstream's base chains. Chains, sets and per-service objects keep
// kproxy's form (upstream names them the same way).
func upstreamLayout(text string, preDNAT bool) string {
	base := sets.New[string]()
	for _, b := range slices.Concat(mainBaseChains, shardBaseChains) {
		base.Insert(b.name)
	}
	shardRE := regexp.MustCompile(`^(\S+ \S+ ip) kube-proxy-s[0-9]+ `)
	seen := sets.New[string]()
	var out []string
	epMapRE := regexp.MustCompile(`(endpoints-[a-z]+/[0-9]+)`)
	for i, l := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		// Endpoint maps of different shards share names: one table
		// needs them apart (kproxy's own maps, as far as takeover goes).
		if m := regexp.MustCompile(`^\S+ \S+ ip kube-proxy-(s[0-9]+) `).FindStringSubmatch(l); m != nil {
			l = epMapRE.ReplaceAllString(l, "${1}-"+m[1])
		}
		l = shardRE.ReplaceAllString(l, "$1 kube-proxy ")
		f := strings.Fields(l)
		if len(f) >= 5 && (f[1] == "chain" || f[1] == "rule") && base.Has(f[4]) {
			continue
		}
		if len(f) >= 5 && f[1] == "rule" && isOurs(f[4]) {
			l = strings.Replace(l, "meta mark set meta mark | 0x00004000", "jump mark-for-masquerade", 1)
		}
		// Each shard declares and fills its fixed objects: once is enough.
		if seen.Has(l) {
			continue
		}
		seen.Insert(l)
		out = append(out, l)
		if i == 0 {
			out = append(out, "add chain ip kube-proxy mark-for-masquerade",
				"add rule ip kube-proxy mark-for-masquerade meta mark set meta mark | 0x00004000")
		}
	}
	// Upstream 1.29 to 1.33.4: the same chains as kproxy. Upstream 1.34
	// and 1.33.5 on (PR #132456): firewall checks in *-pre-dnat chains,
	// endpoint checks after DNAT at priority 0.
	chains := `add chain ip kube-proxy filter-prerouting { type filter hook prerouting priority -110 ; }
add chain ip kube-proxy filter-input { type filter hook input priority -110 ; }
add chain ip kube-proxy filter-forward { type filter hook forward priority -110 ; }
add chain ip kube-proxy filter-output { type filter hook output priority -110 ; }
add chain ip kube-proxy filter-output-post-dnat { type filter hook output priority -90 ; }
add rule ip kube-proxy filter-prerouting ct state new jump firewall-check
add rule ip kube-proxy filter-output ct state new jump service-endpoints-check
add rule ip kube-proxy filter-output ct state new jump firewall-check
add rule ip kube-proxy filter-output-post-dnat ct state new jump cluster-ips-check
`
	if preDNAT {
		chains = `add chain ip kube-proxy filter-prerouting-pre-dnat { type filter hook prerouting priority -110 ; }
add chain ip kube-proxy filter-output-pre-dnat { type filter hook output priority -110 ; }
add chain ip kube-proxy filter-input { type filter hook input priority 0 ; }
add chain ip kube-proxy filter-forward { type filter hook forward priority 0 ; }
add chain ip kube-proxy filter-output { type filter hook output priority 0 ; }
add rule ip kube-proxy filter-prerouting-pre-dnat ct state new jump firewall-check
add rule ip kube-proxy filter-output-pre-dnat ct state new jump firewall-check
add rule ip kube-proxy filter-output ct state new jump service-endpoints-check
add rule ip kube-proxy filter-output ct state new jump cluster-ips-check
`
	}
	chains += `add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }
add chain ip kube-proxy nat-output { type nat hook output priority -100 ; }
add chain ip kube-proxy nat-postrouting { type nat hook postrouting priority 100 ; }
add rule ip kube-proxy filter-input ct state new jump nodeport-endpoints-check
add rule ip kube-proxy filter-input ct state new jump service-endpoints-check
add rule ip kube-proxy filter-forward ct state new jump service-endpoints-check
add rule ip kube-proxy filter-forward ct state new jump cluster-ips-check
add rule ip kube-proxy nat-prerouting jump services
add rule ip kube-proxy nat-output jump services
add rule ip kube-proxy nat-postrouting jump masquerading
`
	return strings.Join(out, "\n") + "\n" + chains
}

// TestProxierTakeOverUpstreamTable: kproxy started on a node where
// upstream kube-proxy ran in nftables mode takes its table over (the names
// say so) and ends with exactly the table of a fresh node.
func TestProxierTakeOverUpstreamTable(t *testing.T) {
	c := flowtest.Example(t, example.NodeA)
	for _, tc := range []struct {
		name      string
		preDNAT   bool
		knownDiff string
	}{
		{name: "upstream 1.29 to 1.33.4 layout"},
		{name: "upstream 1.34 layout", preDNAT: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newProxierRig(t, c, model.IPv4)
			old := upstreamLayout(renderFull(t, c, exampleOptions(model.IPv4)).Tx.String(), tc.preDNAT)
			if err := r.fake.Load(old); err != nil {
				t.Fatalf("loading the upstream table: %v\n%s", err, old)
			}
			_, err := r.sync(false)
			if err == nil {
				r.now = r.now.Add(time.Minute)
				r.mustSync(false)
			}
			var diff string
			if err == nil {
				diff = cmp.Diff(r.freshDump(), r.dump())
			}
			if tc.knownDiff != "" {
				if err == nil && diff == "" {
					t.Fatalf("kproxy now takes this table over: remove the knownDiff note %q", tc.knownDiff)
				}
				t.Skipf("known difference from upstream: %s (sync error: %v)", tc.knownDiff, err)
			}
			if err != nil {
				t.Fatalf("first sync over upstream's table: %v", err)
			}
			if diff != "" {
				t.Errorf("table after the takeover differs from a fresh node's (-want +got):\n%s", diff)
			}
		})
	}
}

// TestProxierServiceCIDRsFromRequest: the ServiceCIDRs the loop passes are
// what a full sync writes (the drop of unallocated cluster IPs), and a full
// sync without them removes the drop again.
func TestProxierServiceCIDRsFromRequest(t *testing.T) {
	c := flowtest.Example(t, example.NodeA)
	r := newProxierRig(t, c, model.IPv4)
	unallocated := packetFlowTest{name: "unallocated", src: localPod, iif: podIIF, dst: "198.19.0.99:80", output: "DROP"}
	allocated := packetFlowTest{name: "allocated", src: localPod, iif: podIIF, dst: "198.19.0.10:80", output: webEps}

	sync := func(cidrs []netip.Prefix) {
		t.Helper()
		_, err := r.p.Sync(context.Background(), &proxy.Request{State: r.state, Changed: r.pending.Clone(), Node: r.node, ServiceCIDRs: cidrs, Full: true, Now: r.now})
		if err != nil {
			t.Fatalf("sync: %v", err)
		}
	}
	sync([]netip.Prefix{netip.MustParsePrefix("198.19.0.0/16")})
	runPacketFlowTests(t, r.rules(), hostA, []packetFlowTest{unallocated, allocated})

	sync(nil)
	unallocated.output = "ACCEPT"
	runPacketFlowTests(t, r.rules(), hostA, []packetFlowTest{unallocated, allocated})
}

// TestProxierTrialIsChecked: a trial of failure isolation is checked by
// the kernel and aborted: nothing is applied, the applied state stays, and
// a refused check is reported as the trial's failure.
func TestProxierTrialIsChecked(t *testing.T) {
	c := flowtest.Example(t, example.NodeA)
	r := newProxierRig(t, c, model.IPv4)
	r.mustSync(true)
	before, applies := r.dump(), len(r.fake.Applies())
	empty := model.NewState(model.IPv4)
	all := sets.KeySet(r.state.Services)
	ctx := context.Background()
	if _, err := r.p.Sync(ctx, &proxy.Request{State: empty, Changed: all, Node: r.node, Full: true, Trial: true, Now: r.now}); err != nil {
		t.Fatalf("trial: %v", err)
	}
	if r.fake.Checks != 1 || len(r.fake.Applies()) != applies || r.dump() != before {
		t.Fatalf("a trial changed the kernel: %d checks, %d applies (before %d)", r.fake.Checks, len(r.fake.Applies()), applies)
	}
	r.fake.BeforeApply = func(*nft.Transaction) error {
		return &nft.OpError{Index: -1, Err: unix.EINVAL, Message: "refused"}
	}
	if _, err := r.p.Sync(ctx, &proxy.Request{State: r.state, Changed: all, Node: r.node, Full: true, Trial: true, Now: r.now}); err == nil {
		t.Fatal("a refused check passed")
	}
	r.fake.BeforeApply = nil
	// The next real partial sync still knows what the kernel holds.
	r.mustSync(false)
	if r.dump() != before {
		t.Errorf("after the trials, a sync changed the rules:\n%s", cmp.Diff(before, r.dump()))
	}
}
