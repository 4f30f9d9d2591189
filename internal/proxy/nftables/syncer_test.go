package nftables

// The harness of the sync tests (partial_test.go, fullsync_test.go,
// plain_test.go, shard_test.go, property_test.go): a syncer renders and
// commits without a kernel, applies every transaction to a cumulative
// tracer ruleset, and checks that it routes packets as a fresh full
// render of the same state does. The address plan is at the top of
// fixtures_test.go.

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

	"github.com/kproxy/kproxy/internal/kernel/nft/nfttest"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy"
	"github.com/kproxy/kproxy/internal/proxy/flowtest"
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

func newSyncer(t testing.TB, c *flowtest.Snapshot, f v1.IPFamily) *syncer {
	t.Helper()
	o := exampleOptions(f)
	return &syncer{
		t:       t,
		cfg:     o.RenderConfig(c.Node, c.Node.Addresses),
		node:    c.Node,
		state:   c.States[f].Clone(),
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
	return &Input{RenderInput: proxy.RenderInput{State: s.state, NodeName: s.node.Name, Zone: s.node.Zone(), Changed: changed}, Full: full, Now: s.now}
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

// hairpinTable is the table that holds the hairpin pair of address ip.
func (s *syncer) hairpinTable(ip string) string {
	return ShardTable(s.cfg.table(), hairpinShard(netip.MustParseAddr(ip), s.applied.shards))
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
