package nftables

// Partial sync tests, pure: Render and Commit only. Every transaction is
// applied to a cumulative tracer ruleset (which refuses what the kernel
// would refuse), and after every step that ruleset must route packets
// exactly as a fresh full render of the same state does. The address plan
// is at the top of fixtures_test.go.

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kproxy/kproxy/internal/example"
	"github.com/kproxy/kproxy/internal/kernel/nft/nfttest"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/trace"
	nfttrace "github.com/kproxy/kproxy/internal/trace/nftables"
)

// syncer plays a proxier's part for one family without a kernel: it keeps
// Applied and the cumulative ruleset that the transactions so far add up to.
type syncer struct {
	t       testing.TB
	cfg     *Config
	node    *model.Node
	state   *model.State
	applied *Applied
	// fake is the kernel the syncs are applied to; rs traces its state.
	fake  *nfttest.Fake
	rs    *nfttrace.Ruleset
	texts []string // every transaction applied, in order
	now   time.Time
	// seen are all service ports ever synced, so that packets to removed
	// services are traced too.
	seen map[model.ServicePortName]*model.ServicePort
}

func newSyncer(t testing.TB, c *exampleCluster, f v1.IPFamily) *syncer {
	t.Helper()
	o := exampleOptions(f)
	return &syncer{
		t:       t,
		cfg:     o.RenderConfig(c.node, c.node.Addresses),
		node:    c.node,
		state:   c.states[f].Clone(),
		applied: NewApplied(),
		fake:    nfttest.New(),
		rs:      &nfttrace.Ruleset{},
		now:     epoch,
		seen:    map[model.ServicePortName]*model.ServicePort{},
	}
}

func (s *syncer) input(full bool, changed sets.Set[model.ServicePortName]) *Input {
	if changed == nil {
		changed = sets.New[model.ServicePortName]()
	}
	return &Input{State: s.state, NodeName: s.node.Name, Zone: s.node.Zone(), Full: full, Changed: changed, Now: s.now}
}

// run applies a plan to the cumulative ruleset and commits it.
func (s *syncer) run(in *Input) *Plan {
	s.t.Helper()
	plan := Render(s.cfg, in, s.applied)
	text := plan.Tx.String()
	if err := s.fake.Apply(context.Background(), plan.Tx); err != nil {
		s.t.Fatalf("transaction refused (full=%v) at %s: %v\n%s", in.Full, in.Now.Sub(epoch), err, text)
	}
	s.texts = append(s.texts, text)
	plan.Commit(s.applied)
	if plan.Cleanup != nil {
		ct := plan.Cleanup.String()
		if err := s.fake.Apply(context.Background(), plan.Cleanup); err != nil {
			s.t.Fatalf("clean-up transaction refused at %s: %v\n%s", in.Now.Sub(epoch), err, ct)
		}
		s.texts = append(s.texts, ct)
		plan.CommitCleanup(s.applied)
	}
	s.rs = nfttrace.Of(s.fake.State())
	for n, sp := range s.state.Services {
		s.seen[n] = sp
	}
	return plan
}

func (s *syncer) full() *Plan {
	s.t.Helper()
	in := s.input(true, nil)
	in.Existing = objectNames(s.rs, s.cfg.table())
	return s.run(in)
}

// shardOf is the shard table of a service port in the synced tables.
func (s *syncer) shardOf(n model.ServicePortName) string {
	return ShardTable(s.cfg.table(), ShardOf(n, s.applied.shards))
}

func (s *syncer) partial(changed ...model.ServicePortName) *Plan {
	s.t.Helper()
	return s.run(s.input(false, sets.New(changed...)))
}

// apply folds a delta into the state and syncs what really changed.
func (s *syncer) apply(d *model.FamilyDelta) *Plan {
	s.t.Helper()
	changed := s.state.Apply(d)
	return s.run(s.input(false, changed))
}

var (
	tableLineRE = regexp.MustCompile(`^add table ip6? (\S+)`)
	chainLineRE = regexp.MustCompile(`^add chain ip6? (\S+) (\S+)`)
	setLineRE   = regexp.MustCompile(`^add (?:set|map) ip6? (\S+) (\S+)`)
)

// objectNames lists our tables of a ruleset with their chains and sets, as
// the proxier reads them from the kernel before a full sync.
func objectNames(rs *nfttrace.Ruleset, main string) map[string]Objects {
	out := map[string]Objects{}
	for _, l := range strings.Split(rs.String(), "\n") {
		if m := tableLineRE.FindStringSubmatch(l); m != nil && len(OurTables(main, []string{m[1]})) > 0 {
			out[m[1]] = Objects{}
		} else if m := chainLineRE.FindStringSubmatch(l); m != nil {
			if o, ok := out[m[1]]; ok {
				o.Chains = append(o.Chains, m[2])
				out[m[1]] = o
			}
		} else if m := setLineRE.FindStringSubmatch(l); m != nil {
			if o, ok := out[m[1]]; ok {
				o.Sets = append(o.Sets, m[2])
				out[m[1]] = o
			}
		}
	}
	return out
}

// packets are the packets that tell services apart: every address and
// port of every service port ever seen, from a local pod, from outside
// and from the node itself, plus a port nobody uses.
func (s *syncer) packets() []trace.Packet {
	v6 := s.cfg.Family == model.IPv6
	type src struct {
		addr string
		iif  string
	}
	srcs := []src{{localPod, podIIF}, {outside, lanIIF}, {thisNode, ""}}
	nodeIP := nodeAIPv4
	if v6 {
		srcs = []src{{localPod6, podIIF}, {outside6, lanIIF}, {thisNode6, ""}}
		nodeIP = nodeAIPv6
	}
	var out []trace.Packet
	add := func(proto v1.Protocol, dst netip.Addr, port int32) {
		for _, sr := range srcs {
			out = append(out, trace.Packet{Src: netip.MustParseAddr(sr.addr), SrcPort: 40000, Dst: dst, DstPort: uint16(port), Proto: proto, IIF: sr.iif})
		}
	}
	names := make([]model.ServicePortName, 0, len(s.seen))
	for n := range s.seen {
		names = append(names, n)
	}
	slices.SortFunc(names, model.ServicePortName.Compare)
	for _, n := range names {
		sp := s.seen[n]
		add(sp.Protocol, sp.ClusterIP, sp.Port)
		add(sp.Protocol, sp.ClusterIP, sp.Port+1000)
		for _, ip := range sp.ExternalIPs {
			add(sp.Protocol, ip, sp.Port)
		}
		for _, in := range sp.LoadBalancerIngress {
			add(sp.Protocol, in.IP, sp.Port)
		}
		if sp.NodePort != 0 {
			add(sp.Protocol, nodeIP, sp.NodePort)
		}
	}
	return out
}

// conflicted are the destinations more than one service port of the
// current state claims: who gets them depends on history (the first
// claimant keeps them), so a fresh full render may differ there.
func (s *syncer) conflicted() sets.Set[string] {
	owners := map[string]sets.Set[model.ServicePortName]{}
	for n := range s.state.Services {
		for _, k := range s.claims(n) {
			if owners[k] == nil {
				owners[k] = sets.New[model.ServicePortName]()
			}
			owners[k].Insert(n)
		}
	}
	out := sets.New[string]()
	for k, o := range owners {
		if o.Len() > 1 {
			out.Insert(k)
		}
	}
	return out
}

// claims are the destinations a service port of the state wants.
func (s *syncer) claims(n model.ServicePortName) []string {
	sp := s.state.Services[n]
	proto := strings.ToLower(string(sp.Protocol))
	key := func(ip netip.Addr, port int32) string { return fmt.Sprintf("%s/%s/%d", proto, ip, port) }
	out := []string{key(sp.ClusterIP, sp.Port)}
	for _, ip := range sp.ExternalIPs {
		out = append(out, key(ip, sp.Port))
	}
	for _, ip := range sp.LoadBalancerVIPs() {
		out = append(out, key(ip, sp.Port))
	}
	if sp.NodePort != 0 {
		out = append(out, fmt.Sprintf("%s/nodeport/%d", proto, sp.NodePort))
	}
	return out
}

func packetKeys(p trace.Packet, nodeIP netip.Addr) []string {
	proto := strings.ToLower(string(p.Proto))
	keys := []string{fmt.Sprintf("%s/%s/%d", proto, p.Dst, p.DstPort)}
	if p.Dst == nodeIP {
		keys = append(keys, fmt.Sprintf("%s/nodeport/%d", proto, p.DstPort))
	}
	return keys
}

// checkLikeFull compares the cumulative ruleset with a fresh full render of
// the current state, packet by packet.
func (s *syncer) checkLikeFull(step string) {
	s.t.Helper()
	fresh := Render(s.cfg, s.input(true, nil), NewApplied())
	frs, err := nfttrace.ParseNFT(fresh.Tx.String())
	if err != nil {
		s.t.Fatalf("%s: fresh full render does not load: %v", step, err)
	}
	host := hostA
	skip := s.conflicted()
	nodeIP := nodeAIPv4
	if s.cfg.Family == model.IPv6 {
		nodeIP = nodeAIPv6
	}
	bad := 0
	for _, p := range s.packets() {
		if slices.ContainsFunc(packetKeys(p, nodeIP), skip.Has) {
			continue
		}
		got, err := s.rs.Trace(p, host)
		if err != nil {
			s.t.Fatalf("%s: trace %s over the partial syncs: %v", step, p, err)
		}
		want, err := frs.Trace(p, host)
		if err != nil {
			s.t.Fatalf("%s: trace %s over a full render: %v", step, p, err)
		}
		if diff := cmp.Diff(outcomeKeys(want), outcomeKeys(got)); diff != "" {
			bad++
			if bad <= 3 {
				s.t.Errorf("%s: %s: partial syncs and a full render differ (-full +partial):\n%s\npartial:\n%s\nfull:\n%s", step, p, diff, got, want)
			}
		}
	}
	if bad > 3 {
		s.t.Errorf("%s: %d more packets differ", step, bad-3)
	}
}

// opTexts returns the operations of a plan, one line each.
func opTexts(p *Plan) []string {
	out := make([]string, p.Tx.Len())
	for i := range out {
		out[i] = p.Tx.OpText(i)
	}
	return out
}

var exampleServiceRE = regexp.MustCompile(`demo/[a-z-]+[/:]`)

// servicesMentioned lists the example services an operation names.
func servicesMentioned(op string) sets.Set[string] {
	out := sets.New[string]()
	for _, m := range exampleServiceRE.FindAllString(op, -1) {
		out.Insert(strings.TrimRight(strings.TrimPrefix(m, "demo/"), "/:"))
	}
	return out
}

// TestPartialSyncOneEndpointChange follows an endpoint change of a
// service port with chains of its own (a NodePort service); plain
// ClusterIP ports are in plain_test.go.
func TestPartialSyncOneEndpointChange(t *testing.T) {
	c := loadExample(t, example.NodeA)
	s := newSyncer(t, c, model.IPv4)
	s.full()
	s.checkLikeFull("full")

	web := spName("web-nodeport", "http", model.TCP)
	old := s.state.Endpoints[web]
	if len(old) != 2 || old[1].IP != netip.MustParseAddr("198.18.130.10") {
		t.Fatalf("unexpected endpoints of %s in the example: %v", web, old)
	}
	moved := *old[1]
	moved.IP = netip.MustParseAddr("198.18.130.11")
	s.now = s.now.Add(time.Second)
	plan := s.apply(&model.FamilyDelta{Endpoints: map[model.ServicePortName][]*model.Endpoint{web: {old[0], &moved}}})

	ops := opTexts(plan)
	svc := serviceChainName(prefixServiceChain, web)
	shard := s.shardOf(web)
	epMap := endpointMapName(web)
	// The endpoint map's new keys name no service: they are the ones the
	// service chain's new rule draws (checked below).
	newKeys := []string{
		"add element ip " + shard + " " + epMap + " { 2 : 198.18.129.10 . 8080 }",
		"add element ip " + shard + " " + epMap + " { 3 : 198.18.130.11 . 8080 }",
	}
	// Nor does the new endpoint's hairpin pair: it stands for the address,
	// whichever services it backs.
	hairpinPair := "add element ip kube-proxy hairpin-endpoints { 198.18.130.11 . 198.18.130.11 }"
	for _, op := range ops {
		if slices.Contains(newKeys, op) || op == hairpinPair {
			continue
		}
		if m := servicesMentioned(op); !m.Equal(sets.New("web-nodeport")) {
			t.Errorf("operation names %v, want only web-nodeport: %s", sets.List(m), op)
		}
	}
	// The rules written are those a full render writes for the service
	// chain, inserted at its head (so in reverse order, after a closing
	// "return"), except that the endpoints get fresh keys in the endpoint
	// map (2 and 3; the full render numbers from 0), plus the hairpin
	// pair of the new endpoint. Nothing is deleted: a deletion costs the
	// kernel an RCU grace period, so the old keys 0 and 1 stay until a
	// clean-up.
	fresh := opTexts(Render(s.cfg, s.input(true, nil), NewApplied()))
	var svcRules []string
	for _, op := range fresh {
		if strings.HasPrefix(op, "add rule ip "+shard+" "+svc+" ") {
			svcRules = append(svcRules, op)
		}
	}
	if len(svcRules) == 0 {
		t.Fatalf("a full render writes no rules in %s", svc)
	}
	if last := svcRules[len(svcRules)-1]; !strings.HasSuffix(last, "meta l4proto tcp dnat ip to numgen random mod 2 offset 0 map @"+epMap) {
		t.Errorf("service chain must pick among its 2 endpoints through %s: %s", epMap, last)
	}
	want := []string{"insert rule ip " + shard + " " + svc + " return"}
	for i := len(svcRules) - 1; i >= 0; i-- {
		want = append(want, "insert"+strings.Replace(strings.TrimPrefix(svcRules[i], "add"), " offset 0 ", " offset 2 ", 1))
	}
	// The external chain (NodePort traffic) is rewritten the same way.
	ext := serviceChainName(prefixExternalChain, web)
	want = append(want, "insert rule ip "+shard+" "+ext+" return")
	var extRules []string
	for _, op := range fresh {
		if strings.HasPrefix(op, "add rule ip "+shard+" "+ext+" ") {
			extRules = append(extRules, op)
		}
	}
	for i := len(extRules) - 1; i >= 0; i-- {
		want = append(want, "insert"+strings.TrimPrefix(extRules[i], "add"))
	}
	want = append(want, hairpinPair)
	want = append(want, newKeys...)
	if diff := cmp.Diff(want, ops); diff != "" {
		t.Errorf("transaction (-want +got):\n%s", diff)
	}
	for _, op := range ops {
		if strings.HasPrefix(op, "delete") || strings.HasPrefix(op, "flush") {
			t.Errorf("a partial sync deletes: %s", op)
		}
	}
	if len(plan.StaleUDP) != 0 || len(plan.NewlyServedUDP) != 0 {
		t.Errorf("TCP change reported UDP work: %+v %+v", plan.StaleUDP, plan.NewlyServedUDP)
	}
	s.checkLikeFull("endpoint moved")
	runPacketFlowTests(t, s.rs, hostA, []packetFlowTest{
		{name: "new endpoint in use", src: localPod, iif: podIIF, dst: "198.19.0.11:80", output: "198.18.129.10:8080, 198.18.130.11:8080"},
	})

	// The first sync a second later sends nothing in its sync transaction;
	// its clean-up rewrites the chain without the shadowed rules: the
	// table is then exactly what a
	// fresh full render gives. A full sync changes nothing after that.
	s.now = s.now.Add(time.Second)
	p := s.partial()
	if p.Tx.Len() != 0 {
		t.Errorf("sync with nothing changed: want no operations, got:\n%s", p.Tx)
	}
	// (198.18.130.10 still backs other services: its hairpin pair stays.)
	if p.Cleanup == nil || !strings.Contains(p.Cleanup.String(), "flush chain ip "+shard+" "+svc) {
		t.Errorf("clean-up a second later: want the service chain rewritten, got:\n%v", p.Cleanup)
	}
	for _, k := range []string{"0 : 198.18.129.10 . 8080", "1 : 198.18.130.10 . 8080"} {
		if p.Cleanup == nil || !strings.Contains(p.Cleanup.String(), "delete element ip "+shard+" "+epMap+" { "+k+" }") {
			t.Errorf("clean-up a second later: want the old key %s deleted, got:\n%v", k, p.Cleanup)
		}
	}
	fresh1 := parse(t, Render(s.cfg, s.input(true, nil), NewApplied()).Tx.String())
	if diff := cmp.Diff(contents(fresh1), contents(s.rs)); diff != "" {
		t.Errorf("after the clean-up the table differs from a fresh full render (-fresh +synced):\n%s", diff)
	}
	if p := s.partial(); p.Tx.Len() != 0 || p.Cleanup != nil {
		t.Errorf("nothing left to clean up, yet:\n%s%v", p.Tx, p.Cleanup)
	}
	s.full()
	fresh2 := parse(t, Render(s.cfg, s.input(true, nil), NewApplied()).Tx.String())
	if diff := cmp.Diff(contents(fresh2), contents(s.rs)); diff != "" {
		t.Errorf("after a full sync the table differs from a fresh full render (-fresh +synced):\n%s", diff)
	}
}

func TestPartialSyncNothingChanged(t *testing.T) {
	c := loadExample(t, example.NodeA)
	for _, f := range []v1.IPFamily{model.IPv4, model.IPv6} {
		t.Run(string(f), func(t *testing.T) {
			s := newSyncer(t, c, f)
			if p := s.full(); p.Tx.Len() == 0 {
				t.Fatal("full sync rendered nothing")
			}
			if p := s.partial(); p.Tx.Len() != 0 {
				t.Errorf("nothing changed: want no operations, got:\n%s", p.Tx)
			}
			// Services reported as changed that render the same touch
			// no element and no endpoint chain (their few per-service
			// chains are rewritten by design).
			for _, op := range opTexts(s.partial(s.state.SortedNames()...)) {
				if strings.Contains(op, " element ") || strings.Contains(op, " endpoint-") && !strings.HasPrefix(op, "add rule ") {
					t.Errorf("unchanged services re-rendered: %s", op)
				}
			}
			// An update carrying equal objects is not a change.
			d := &model.FamilyDelta{Services: map[model.ServicePortName]*model.ServicePort{}, Endpoints: map[model.ServicePortName][]*model.Endpoint{}}
			for n, sp := range s.state.Services {
				cp := *sp
				d.Services[n] = &cp
			}
			if p := s.apply(d); p.Tx.Len() != 0 {
				t.Errorf("equal update: want no operations, got:\n%s", p.Tx)
			}
			// A second full sync rewrites everything but changes nothing.
			s.full()
			if p := s.partial(); p.Tx.Len() != 0 {
				t.Errorf("after a second full sync: want no operations, got:\n%s", p.Tx)
			}
			s.checkLikeFull("second full sync")
		})
	}
}

func TestPartialSyncRemoveAndRevive(t *testing.T) {
	c := loadExample(t, example.NodeA)
	// Service ports with chains of their own (plain ClusterIP ports have
	// none; see plain_test.go).
	itp := spName("itp-local", "http", model.TCP)
	aff := spName("affinity", "http", model.TCP)
	for _, tc := range []struct {
		name string
		n    model.ServicePortName
		// chains and sets the service owns.
		chains, sets int
	}{
		{"itp-local", itp, 1, 0},
		{"affinity (with sets)", aff, 1, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSyncer(t, c, model.IPv4)
			s.full()
			sp, eps := s.state.Services[tc.n], s.state.Endpoints[tc.n]
			dst := netip.AddrPortFrom(sp.ClusterIP, uint16(sp.Port)).String()
			owned := func() (chains, sets []string) {
				base := "-" + portBase(tc.n)
				for t, o := range objectNames(s.rs, s.cfg.table()) {
					for _, n := range o.Chains {
						if strings.Contains(n, base) {
							chains = append(chains, t+" "+n)
						}
					}
					for _, n := range o.Sets {
						if strings.Contains(n, base) {
							sets = append(sets, t+" "+n)
						}
					}
				}
				return chains, sets
			}
			ch, st := owned()
			if len(ch) != tc.chains || len(st) != tc.sets {
				t.Fatalf("service owns chains %v and sets %v; want %d and %d", ch, st, tc.chains, tc.sets)
			}

			// Removal: its map and set elements are deleted (the hairpin
			// pairs wait for a full sync); its chains and sets stay, unused,
			// until a full sync after the stale delay.
			s.now = s.now.Add(10 * time.Second)
			removedAt := s.now
			p := s.apply(&model.FamilyDelta{
				Services:  map[model.ServicePortName]*model.ServicePort{tc.n: nil},
				Endpoints: map[model.ServicePortName][]*model.Endpoint{tc.n: nil},
			})
			var elemDeletes int
			for _, op := range opTexts(p) {
				switch {
				case strings.HasPrefix(op, "delete element "):
					elemDeletes++
				default:
					t.Errorf("removal: unexpected operation %s", op)
				}
				// Element deletes name only the key (the service's IP).
				if m := servicesMentioned(op); !m.Equal(sets.New(tc.n.Name)) && !strings.Contains(op, sp.ClusterIP.String()+" ") {
					t.Errorf("removal: operation names %v: %s", sets.List(m), op)
				}
			}
			if elemDeletes != 2 {
				t.Errorf("removal: %d element deletes; want 2 (cluster-ips, service-ips):\n%s", elemDeletes, p.Tx)
			}
			s.checkLikeFull("removed")
			runPacketFlowTests(t, s.rs, hostA, []packetFlowTest{
				{name: "removed service is not ours", src: localPod, iif: podIIF, dst: dst, output: "ACCEPT"},
			})

			// No sync deletes them before the stale delay; the first
			// sync after it does, in a clean-up transaction of its own.
			s.now = removedAt.Add(staleDelay - time.Millisecond)
			if p := s.partial(); p.Tx.Len() != 0 || p.Cleanup != nil {
				t.Errorf("partial sync before the stale delay: want no operations, got:\n%s%v", p.Tx, p.Cleanup)
			}
			if p := s.full(); p.Cleanup != nil {
				t.Errorf("full sync before the stale delay cleans up:\n%s", p.Cleanup)
			}
			s.now = removedAt.Add(staleDelay)
			p = s.partial()
			if p.Tx.Len() != 0 {
				t.Errorf("partial sync after the stale delay: want only a clean-up, got:\n%s", p.Tx)
			}
			if p.Cleanup == nil {
				t.Fatal("sync after the stale delay: no clean-up")
			}
			var deletes []string
			for _, op := range strings.Split(strings.TrimSpace(p.Cleanup.String()), "\n") {
				switch {
				case strings.HasPrefix(op, "flush chain "):
				case strings.HasPrefix(op, "delete chain "), strings.HasPrefix(op, "delete set "):
					deletes = append(deletes, op)
				case strings.HasPrefix(op, "delete map ") && strings.Contains(op, " "+endpointMapName(tc.n)):
					// Its endpoint map, when no other service port of
					// its group used it.
				default:
					t.Errorf("stale cleanup: unexpected operation %s", op)
				}
			}
			if len(deletes) != tc.chains+tc.sets {
				t.Errorf("stale cleanup: want %d deletes, got:\n%s", tc.chains+tc.sets, p.Cleanup)
			}
			// Chains are deleted before the sets their rules used.
			if i := slices.IndexFunc(deletes, func(op string) bool { return strings.HasPrefix(op, "delete set ") }); i >= 0 && slices.ContainsFunc(deletes[i:], func(op string) bool { return strings.HasPrefix(op, "delete chain ") }) {
				t.Errorf("a set is deleted before a chain:\n%s", p.Cleanup)
			}
			if ch, st := owned(); len(ch)+len(st) != 0 {
				t.Errorf("left in the table: %v %v", ch, st)
			}
			s.now = s.now.Add(time.Hour)
			if p := s.partial(); p.Tx.Len() != 0 {
				t.Errorf("after cleanup: want no operations, got:\n%s", p.Tx)
			}
			s.checkLikeFull("stale deleted")

			// Remove again, and bring it back before a full sync: the
			// stale objects are used again and never deleted.
			s.apply(&model.FamilyDelta{Services: map[model.ServicePortName]*model.ServicePort{tc.n: sp}, Endpoints: map[model.ServicePortName][]*model.Endpoint{tc.n: eps}})
			s.checkLikeFull("re-added")
			s.now = s.now.Add(time.Hour)
			removedAt = s.now
			s.apply(&model.FamilyDelta{
				Services:  map[model.ServicePortName]*model.ServicePort{tc.n: nil},
				Endpoints: map[model.ServicePortName][]*model.Endpoint{tc.n: nil},
			})
			s.now = removedAt.Add(staleDelay / 2)
			p = s.apply(&model.FamilyDelta{Services: map[model.ServicePortName]*model.ServicePort{tc.n: sp}, Endpoints: map[model.ServicePortName][]*model.Endpoint{tc.n: eps}})
			for _, op := range opTexts(p) {
				if strings.HasPrefix(op, "delete chain ") || strings.HasPrefix(op, "delete set ") {
					t.Errorf("revival deletes: %s", op)
				}
			}
			s.checkLikeFull("revived")
			for _, later := range []time.Duration{staleDelay, 10 * staleDelay} {
				s.now = removedAt.Add(later)
				if p := s.partial(); p.Tx.Len() != 0 {
					t.Errorf("%s after the removal: the revived service must not be touched, got:\n%s", later, p.Tx)
				}
				if p := s.full(); p.Cleanup != nil {
					t.Errorf("%s after the removal: a full sync deletes objects of the revived service:\n%s", later, p.Cleanup)
				}
			}
			if ch, st := owned(); len(ch) != tc.chains || len(st) != tc.sets {
				t.Errorf("after revival the service owns %v and %v; want %d chains and %d sets", ch, st, tc.chains, tc.sets)
			}
			s.checkLikeFull("revived, later")
		})
	}
}

// TestPartialSyncConflicts: the renderer's own safety net for a key two
// service ports want (a State filled by hand, bypassing the model's
// resolution), then the normal case where State.Apply resolves it.
func TestPartialSyncConflicts(t *testing.T) {
	c := loadExample(t, example.NodeA)
	s := newSyncer(t, c, model.IPv4)
	const extIP = "198.19.201.1"
	claimA := makeSP("claim-a", "198.19.1.1", 80, func(sp *model.ServicePort) {
		sp.ExternalIPs = []netip.Addr{netip.MustParseAddr(extIP)}
	})
	claimB := makeSP("claim-b", "198.19.1.2", 80, func(sp *model.ServicePort) {
		sp.ExternalIPs = []netip.Addr{netip.MustParseAddr(extIP)}
	})
	epA := makeEP("198.18.129.101", 8080, true, nil)
	epB := makeEP("198.18.130.102", 8080, false, nil)
	epB2 := makeEP("198.18.130.103", 8080, false, nil)
	s.state.Services[claimA.Name], s.state.Endpoints[claimA.Name] = claimA, []*model.Endpoint{epA}
	s.state.Services[claimB.Name], s.state.Endpoints[claimB.Name] = claimB, []*model.Endpoint{epB}

	p := s.full()
	want := []string{"demo/claim-b:http/TCP wants service-ips { 198.19.201.1 . tcp . 80 } which demo/claim-a:http/TCP already has"}
	if diff := cmp.Diff(want, p.Conflicts); diff != "" {
		t.Errorf("conflicts (-want +got):\n%s", diff)
	}
	ext := extIP + ":80"
	runPacketFlowTests(t, s.rs, hostA, []packetFlowTest{
		{name: "first claimant serves", src: outside, iif: lanIIF, dst: ext, output: "198.18.129.101:8080", masq: true},
		{name: "second claimant's cluster IP", src: localPod, iif: podIIF, dst: "198.19.1.2:80", output: "198.18.130.102:8080"},
	})
	s.checkLikeFull("both claim")

	// A change of the second claimant does not move the address.
	s.now = s.now.Add(time.Second)
	p = s.apply(&model.FamilyDelta{Endpoints: map[model.ServicePortName][]*model.Endpoint{claimB.Name: {epB2}}})
	for _, op := range opTexts(p) {
		if strings.Contains(op, extIP) && !strings.HasPrefix(op, "add rule ") {
			t.Errorf("second claimant's change touches the contested element: %s", op)
		}
	}
	runPacketFlowTests(t, s.rs, hostA, []packetFlowTest{
		{name: "first claimant still serves", src: outside, iif: lanIIF, dst: ext, output: "198.18.129.101:8080", masq: true},
	})

	// Removing the first claimant hands the address to the second.
	s.now = s.now.Add(time.Second)
	p = s.apply(&model.FamilyDelta{
		Services:  map[model.ServicePortName]*model.ServicePort{claimA.Name: nil},
		Endpoints: map[model.ServicePortName][]*model.Endpoint{claimA.Name: nil},
	})
	if len(p.Conflicts) != 0 {
		t.Errorf("conflicts after the first claimant left: %v", p.Conflicts)
	}
	var handover []string
	for _, op := range opTexts(p) {
		if strings.Contains(op, extIP) {
			handover = append(handover, op)
		}
	}
	wantOps := []string{
		// From the first claimant's shard to the second's.
		`delete element ip ` + s.shardOf(claimA.Name) + ` service-ips { 198.19.201.1 . tcp . 80 }`,
		`add element ip ` + s.shardOf(claimB.Name) + ` service-ips { 198.19.201.1 . tcp . 80 comment "demo/claim-b:http/TCP" : goto ` + serviceChainName(prefixExternalChain, claimB.Name) + ` }`,
	}
	if diff := cmp.Diff(wantOps, handover); diff != "" {
		t.Errorf("hand-over operations (-want +got):\n%s", diff)
	}
	runPacketFlowTests(t, s.rs, hostA, []packetFlowTest{
		{name: "second claimant serves now", src: outside, iif: lanIIF, dst: ext, output: "198.18.130.103:8080", masq: true},
	})
	s.checkLikeFull("first claimant removed")

	// The first claimant coming back queues behind the second.
	s.now = s.now.Add(time.Second)
	p = s.apply(&model.FamilyDelta{
		Services:  map[model.ServicePortName]*model.ServicePort{claimA.Name: claimA},
		Endpoints: map[model.ServicePortName][]*model.Endpoint{claimA.Name: {epA}},
	})
	want = []string{"demo/claim-a:http/TCP wants service-ips { 198.19.201.1 . tcp . 80 } which demo/claim-b:http/TCP already has"}
	if diff := cmp.Diff(want, p.Conflicts); diff != "" {
		t.Errorf("conflicts on return (-want +got):\n%s", diff)
	}
	runPacketFlowTests(t, s.rs, hostA, []packetFlowTest{
		{name: "second claimant keeps it", src: outside, iif: lanIIF, dst: ext, output: "198.18.130.103:8080", masq: true},
	})

	// Claims that reach the renderer through State.Apply are resolved by
	// the model first (model/resolve.go): the older service keeps the node
	// port whatever the order, the renderer sees no conflict, and the
	// service that loses or regains it is re-rendered.
	npA := makeSP("np-a", "198.19.1.3", 80, func(sp *model.ServicePort) {
		sp.Type, sp.NodePort, sp.Created = v1.ServiceTypeNodePort, 30500, 2000
	})
	npB := makeSP("np-b", "198.19.1.4", 81, func(sp *model.ServicePort) {
		sp.Type, sp.NodePort, sp.Created = v1.ServiceTypeNodePort, 30500, 1000
	})
	s.now = s.now.Add(time.Second)
	p = s.apply(&model.FamilyDelta{
		Services:  map[model.ServicePortName]*model.ServicePort{npA.Name: npA},
		Endpoints: map[model.ServicePortName][]*model.Endpoint{npA.Name: {epA}},
	})
	if len(p.Conflicts) != 0 {
		t.Errorf("nodePort conflicts reached the renderer: %v", p.Conflicts)
	}
	runPacketFlowTests(t, s.rs, hostA, []packetFlowTest{
		{name: "only nodePort claimant serves", src: outside, iif: lanIIF, dst: "198.18.0.10:30500", output: "198.18.129.101:8080", masq: true},
	})
	s.now = s.now.Add(time.Second)
	p = s.apply(&model.FamilyDelta{
		Services:  map[model.ServicePortName]*model.ServicePort{npB.Name: npB},
		Endpoints: map[model.ServicePortName][]*model.Endpoint{npB.Name: {epB}},
	})
	if len(p.Conflicts) != 0 {
		t.Errorf("nodePort conflicts reached the renderer: %v", p.Conflicts)
	}
	runPacketFlowTests(t, s.rs, hostA, []packetFlowTest{
		{name: "older nodePort claimant takes it", src: outside, iif: lanIIF, dst: "198.18.0.10:30500", output: "198.18.130.102:8080", masq: true},
		{name: "newer claimant keeps its cluster IP", src: localPod, iif: podIIF, dst: "198.19.1.3:80", output: "198.18.129.101:8080"},
	})
	s.checkLikeFull("nodePort taken by the older service")
	s.now = s.now.Add(time.Second)
	s.apply(&model.FamilyDelta{Services: map[model.ServicePortName]*model.ServicePort{npB.Name: nil}})
	runPacketFlowTests(t, s.rs, hostA, []packetFlowTest{
		{name: "nodePort handed back", src: outside, iif: lanIIF, dst: "198.18.0.10:30500", output: "198.18.129.101:8080", masq: true},
	})
	s.checkLikeFull("nodePort handed back")
}

// TestPartialSyncUDPConntrack: the plan says which UDP conntrack entries
// must go.
func TestPartialSyncUDPConntrack(t *testing.T) {
	c := loadExample(t, example.NodeA)
	s := newSyncer(t, c, model.IPv4)
	if p := s.full(); len(p.StaleUDP) != 0 || len(p.NewlyServedUDP) != 0 {
		t.Errorf("first full sync reported UDP work: %+v %+v", p.StaleUDP, p.NewlyServedUDP)
	}
	dns := spName("dns-udp", "dns", model.UDP)
	eps := s.state.Endpoints[dns]
	s.now = s.now.Add(time.Second)
	p := s.apply(&model.FamilyDelta{Endpoints: map[model.ServicePortName][]*model.Endpoint{dns: eps[:1]}})
	if len(p.StaleUDP) != 1 || p.StaleUDP[0].Service.Name != dns || len(p.StaleUDP[0].Endpoints) != 1 || p.StaleUDP[0].Endpoints[0].AddrPort() != eps[1].AddrPort() {
		t.Errorf("endpoint removed: StaleUDP = %+v, want %s losing %s", p.StaleUDP, dns, eps[1])
	}
	if len(p.NewlyServedUDP) != 0 {
		t.Errorf("endpoint removed: NewlyServedUDP = %v", p.NewlyServedUDP)
	}
	s.now = s.now.Add(time.Second)
	p = s.apply(&model.FamilyDelta{Endpoints: map[model.ServicePortName][]*model.Endpoint{dns: nil}})
	if len(p.StaleUDP) != 1 || len(p.StaleUDP[0].Endpoints) != 1 || p.StaleUDP[0].Endpoints[0].AddrPort() != eps[0].AddrPort() {
		t.Errorf("last endpoint removed: StaleUDP = %+v", p.StaleUDP)
	}
	runPacketFlowTests(t, s.rs, hostA, []packetFlowTest{
		{name: "no endpoints: rejected", proto: v1.ProtocolUDP, src: localPod, iif: podIIF, dst: "198.19.0.18:53", output: "REJECT"},
	})
	s.now = s.now.Add(time.Second)
	p = s.apply(&model.FamilyDelta{Endpoints: map[model.ServicePortName][]*model.Endpoint{dns: eps}})
	if len(p.NewlyServedUDP) != 1 || p.NewlyServedUDP[0].Name != dns || len(p.StaleUDP) != 0 {
		t.Errorf("endpoints back: NewlyServedUDP = %v, StaleUDP = %v", p.NewlyServedUDP, p.StaleUDP)
	}
	// The TCP port of the same service never asks for UDP work.
	dnsTCP := spName("dns-udp", "dns-tcp", model.TCP)
	s.now = s.now.Add(time.Second)
	p = s.apply(&model.FamilyDelta{Endpoints: map[model.ServicePortName][]*model.Endpoint{dnsTCP: s.state.Endpoints[dnsTCP][:1]}})
	if len(p.StaleUDP) != 0 || len(p.NewlyServedUDP) != 0 {
		t.Errorf("TCP change: %+v %+v", p.StaleUDP, p.NewlyServedUDP)
	}
	s.checkLikeFull("dns changes")

	// Changes that a full sync picks up (the periodic one, or the retry
	// after a failure) need the same cleanup.
	s.now = s.now.Add(time.Second)
	s.state.Apply(&model.FamilyDelta{Endpoints: map[model.ServicePortName][]*model.Endpoint{dns: eps[1:]}})
	p = s.full()
	if len(p.StaleUDP) != 1 || p.StaleUDP[0].Service.Name != dns || len(p.StaleUDP[0].Endpoints) != 1 || p.StaleUDP[0].Endpoints[0].AddrPort() != eps[0].AddrPort() {
		t.Errorf("endpoint removed, full sync: StaleUDP = %+v, want %s losing %s", p.StaleUDP, dns, eps[0])
	}
	s.now = s.now.Add(time.Second)
	s.state.Apply(&model.FamilyDelta{Endpoints: map[model.ServicePortName][]*model.Endpoint{dns: nil}})
	s.full()
	s.now = s.now.Add(time.Second)
	s.state.Apply(&model.FamilyDelta{Endpoints: map[model.ServicePortName][]*model.Endpoint{dns: eps}})
	p = s.full()
	if len(p.NewlyServedUDP) != 1 || p.NewlyServedUDP[0].Name != dns {
		t.Errorf("endpoints back, full sync: NewlyServedUDP = %v", p.NewlyServedUDP)
	}
	s.now = s.now.Add(time.Second)
	sp := s.state.Services[dns]
	s.state.Apply(&model.FamilyDelta{Services: map[model.ServicePortName]*model.ServicePort{dns: nil}, Endpoints: map[model.ServicePortName][]*model.Endpoint{dns: nil}})
	p = s.full()
	if len(p.StaleUDP) != 1 || p.StaleUDP[0].Service != sp || len(p.StaleUDP[0].Endpoints) != 2 {
		t.Errorf("UDP service removed, full sync: StaleUDP = %+v, want both endpoints of %s", p.StaleUDP, dns)
	}
	// A restart knows nothing of what was there before: no cleanup
	// (upstream's reconciler would compare with the conntrack table).
	s.applied = NewApplied()
	s.state.Apply(&model.FamilyDelta{Services: map[model.ServicePortName]*model.ServicePort{dns: sp}, Endpoints: map[model.ServicePortName][]*model.Endpoint{dns: eps}})
	if p := s.full(); len(p.StaleUDP) != 0 || len(p.NewlyServedUDP) != 0 {
		t.Errorf("restart: %+v %v", p.StaleUDP, p.NewlyServedUDP)
	}
}

// TestFullSyncOverExistingTable: a full sync over a table that already
// holds our rules (every sync period in the same process, or a restart with
// a fresh Applied) rewrites the fixed chains and maps without ever
// scheduling them for deletion, and turns leftovers into stale objects:
// leftover chains are emptied in the sync's transaction (so that a service
// reusing one finds no old rules that use sets it cannot know the owner
// of) and deleted, with leftover sets, by a later clean-up.
func TestFullSyncOverExistingTable(t *testing.T) {
	c := loadExample(t, example.NodeA)
	// A service port with chains of its own (see plain_test.go for the
	// chains plain ports share).
	gone := spName("web-nodeport", "http", model.TCP)
	for _, tc := range []struct {
		name    string
		restart bool
	}{
		{"same process", false},
		{"restart", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSyncer(t, c, model.IPv4)
			s.full()
			leftovers := []string{serviceChainName(prefixServiceChain, gone), serviceChainName(prefixExternalChain, gone)}
			// The service goes away while no sync runs (a restart, or
			// a change folded into the periodic full sync).
			delete(s.state.Services, gone)
			delete(s.state.Endpoints, gone)
			if tc.restart {
				s.applied = NewApplied()
			}
			s.now = s.now.Add(time.Minute)
			p := s.full()
			fixed := sets.New(fixedNames(s.cfg)...)
			var flushedLeftovers []string
			for i, op := range opTexts(p) {
				f := strings.Fields(op)
				if len(f) < 5 {
					continue
				}
				name := f[4]
				if f[0] == "delete" && (f[1] == "chain" || f[1] == "set" || f[1] == "map") {
					t.Errorf("op %d: a full sync deletes at once: %s", i, op)
				}
				if f[0] == "flush" && f[1] == "chain" && slices.Contains(leftovers, name) {
					flushedLeftovers = append(flushedLeftovers, name)
				}
				// A fixed chain or map is only flushed before it is
				// filled: never after one of its rules or elements.
				if f[0] == "flush" && fixed.Has(name) {
					for _, prev := range opTexts(p)[:i] {
						if strings.HasPrefix(prev, "add rule ip "+f[3]+" "+name+" ") || strings.HasPrefix(prev, "add element ip "+f[3]+" "+name+" ") {
							t.Fatalf("op %d flushes %s after it was filled: %s", i, name, op)
						}
					}
				}
			}
			slices.Sort(flushedLeftovers)
			if diff := cmp.Diff(slices.Sorted(slices.Values(leftovers)), flushedLeftovers); diff != "" {
				t.Errorf("leftover chains flushed in the sync transaction (-want +got):\n%s", diff)
			}
			if p.Cleanup != nil {
				t.Errorf("leftovers found now are cleaned up at once:\n%s", p.Cleanup)
			}
			s.checkLikeFull("full sync over the old table")
			runPacketFlowTests(t, s.rs, hostA, []packetFlowTest{
				{name: "source ranges still enforced", src: outsideDenied, iif: lanIIF, dst: "198.19.200.1:443", output: "DROP"},
				{name: "removed service gone", src: localPod, iif: podIIF, dst: "198.19.0.11:80", output: "ACCEPT"},
			})
			// The next full sync, one second later, deletes exactly the
			// leftovers in its clean-up transaction, and it loads (nothing
			// in use is deleted).
			s.now = s.now.Add(staleDelay)
			cp := s.partial()
			if cp.Tx.Len() != 0 {
				t.Errorf("a partial sync after the delay: want only a clean-up, got:\n%s", cp.Tx)
			}
			if cp.Cleanup == nil {
				t.Fatal("no clean-up transaction after the stale delay")
			}
			var deleted []string
			for _, op := range strings.Split(strings.TrimSpace(cp.Cleanup.String()), "\n") {
				f := strings.Fields(op)
				if f[0] == "flush" {
					continue
				}
				if f[0] != "delete" {
					t.Errorf("stale cleanup: unexpected %s", op)
					continue
				}
				deleted = append(deleted, f[4])
			}
			slices.Sort(deleted)
			// The service's endpoint map, which only it used, goes too
			// (the full sync emptied it with the others).
			want := append(slices.Clone(leftovers), endpointMapName(gone))
			slices.Sort(want)
			if diff := cmp.Diff(want, deleted); diff != "" {
				t.Errorf("deleted after the stale delay (-want +got):\n%s", diff)
			}
			s.now = s.now.Add(time.Hour)
			if p := s.partial(); p.Tx.Len() != 0 {
				t.Errorf("after cleanup: want no operations, got:\n%s", p.Tx)
			}
			s.checkLikeFull("after cleanup")
		})
	}
}

// TestIsOurs: only per-service objects may be removed as stale; the fixed
// ones share prefixes with them ("firewall-check" and "firewall-ips" with
// "firewall-<hash>-...", "service-endpoints-check" and "service-ips" with
// "service-<hash>-...").
func TestIsOurs(t *testing.T) {
	n := spName("web", "http", model.TCP)
	e := makeEP("198.18.129.10", 8080, true, nil)
	for _, name := range []string{
		serviceChainName(prefixServiceChain, n), serviceChainName(prefixExternalChain, n),
		serviceChainName(prefixLocalChain, n), serviceChainName(prefixFirewallChain, n),
		endpointChainName(n, e), affinitySetName(n, e, 10800),
	} {
		if !isOurs(name) {
			t.Errorf("isOurs(%q) = false, want true", name)
		}
	}
	for _, name := range fixedNames(&Config{Family: model.IPv4}) {
		if isOurs(name) {
			t.Errorf("isOurs(%q) = true for a fixed chain or set", name)
		}
	}
}

// TestHairpinPairBackAtFullSync: an endpoint whose hairpin pair became
// garbage in a partial sync, and that a full sync brings back, keeps its
// pair: the full sync flushed the set, so it must add the pair again.
func TestHairpinPairBackAtFullSync(t *testing.T) {
	c := loadExample(t, example.NodeA)
	s := newSyncer(t, c, model.IPv4)
	s.full()
	sp := makeSP("hp", "198.19.1.50", 80, nil)
	ep := makeEP("198.18.129.150", 8080, true, nil)
	s.apply(&model.FamilyDelta{Services: map[model.ServicePortName]*model.ServicePort{sp.Name: sp}, Endpoints: map[model.ServicePortName][]*model.Endpoint{sp.Name: {ep}}})
	// The endpoint goes: its pair is garbage, still in the kernel.
	s.apply(&model.FamilyDelta{Endpoints: map[model.ServicePortName][]*model.Endpoint{sp.Name: nil}})
	// It comes back, picked up by a full sync.
	s.state.Endpoints[sp.Name] = []*model.Endpoint{ep}
	s.full()
	if !strings.Contains(s.rs.String(), "198.18.129.150 . 198.18.129.150") {
		t.Errorf("hairpin pair missing after the full sync:\n%s", s.rs.String())
	}
	runPacketFlowTests(t, s.rs, hostA, []packetFlowTest{
		{name: "pod to itself through its service", src: "198.18.129.150", iif: podIIF, dst: "198.19.1.50:80", output: "198.18.129.150:8080", masq: true},
	})
}

// fixedNames are the names of the fixed chains, sets and maps of the main
// and the shard tables.
func fixedNames(cfg *Config) []string {
	r := &renderer{cfg: cfg}
	var out []string
	for _, l := range []tableLayout{r.mainLayout(), r.shardLayout()} {
		out = append(out, l.chains...)
		for _, b := range l.base {
			out = append(out, b.name)
		}
		for _, s := range l.sets {
			out = append(out, s.Name)
		}
	}
	return out
}
