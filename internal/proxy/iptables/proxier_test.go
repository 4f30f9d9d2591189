package iptables

// Proxier tests against xtablestest.Fake, which refuses what
// iptables-restore or the kernel would refuse (a jump to a missing chain,
// deleting a chain still referenced, "-D" of a rule that is not there).
// The address plan is at the top of fixtures_test.go.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/kproxy/kproxy/internal/kernel/conntrack"
	"github.com/kproxy/kproxy/internal/kernel/nfacct"
	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/kernel/xtables/xtablestest"
	"github.com/kproxy/kproxy/internal/metrics"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy"
	"github.com/kproxy/kproxy/internal/proxy/flowtest"
	"github.com/kproxy/kproxy/internal/testutil/fixtures"
	iptrace "github.com/kproxy/kproxy/internal/trace/iptables"
)

type rig struct {
	t       *testing.T
	opts    Options
	backend xtables.Backend
	fake    *xtablestest.Fake
	ct      *conntrack.Fake
	p       *Proxier
	node    *model.Node
	state   *model.State
	changed sets.Set[model.ServicePortName]
}

func xfamily(f v1.IPFamily) xtables.Family {
	if f == model.IPv6 {
		return xtables.IPv6
	}
	return xtables.IPv4
}

func newRig(t *testing.T, c *flowtest.Snapshot, f v1.IPFamily, b xtables.Backend, tweak func(*Options)) *rig {
	t.Helper()
	o := exampleOptions(f)
	o.Hostname = c.Node.Name
	if tweak != nil {
		tweak(&o)
	}
	fake := xtablestest.NewFake(b, xfamily(f))
	fake.CommitPerTable = true
	ct := &conntrack.Fake{}
	return &rig{
		t: t, opts: o, backend: b, fake: fake, ct: ct,
		p:       mustNewProxier(t, o, Handles{IPTables: fake, HostHandles: proxy.HostHandles{Conntrack: ct}}),
		node:    c.Node,
		state:   c.States[f].Clone(),
		changed: sets.New[model.ServicePortName](),
	}
}

// mustNewProxier is NewProxier for options and handles a test knows good.
func mustNewProxier(t testing.TB, o Options, h Handles) *Proxier {
	t.Helper()
	p, err := NewProxier(o, h)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// setNFAcct has the rig's proxier count in n's counters: a new proxier
// over the same kernel, before its first sync.
func (r *rig) setNFAcct(n nfacct.Interface) {
	r.p = mustNewProxier(r.t, r.opts, Handles{IPTables: r.fake, NFAcct: n, HostHandles: proxy.HostHandles{Conntrack: r.ct}})
}

func (r *rig) sync(full bool) (*proxy.Result, error) {
	res, err := r.p.Sync(context.Background(), &proxy.Request{State: r.state, Changed: r.changed, Node: r.node, Full: full})
	if err == nil {
		r.changed = sets.New[model.ServicePortName]()
	}
	return res, err
}

func (r *rig) mustSync(full bool) *proxy.Result {
	r.t.Helper()
	res, err := r.sync(full)
	if err != nil {
		r.t.Fatalf("sync(full=%v): %v", full, err)
	}
	return res
}

// set changes a service port and its endpoints (sp nil: remove it).
func (r *rig) set(n model.ServicePortName, sp *model.ServicePort, eps []*model.Endpoint) {
	if sp == nil {
		delete(r.state.Services, n)
		delete(r.state.Endpoints, n)
	} else {
		r.state.Services[n] = sp
		r.state.Endpoints[n] = eps
	}
	r.changed.Insert(n)
}

// restoresSince returns the inputs of the Restore calls after the first
// skip ones.
func (r *rig) restoresSince(skip int) []string {
	var out []string
	for _, c := range r.fake.Restores()[skip:] {
		out = append(out, string(c.Data))
	}
	return out
}

// freshDump is what a full sync of the current state writes on a fresh node.
func (r *rig) freshDump() string {
	r.t.Helper()
	fresh := xtablestest.NewFake(r.backend, xfamily(r.opts.Family))
	p := mustNewProxier(r.t, r.opts, Handles{IPTables: fresh})
	if _, err := p.Sync(context.Background(), &proxy.Request{State: r.state, Changed: sets.New[model.ServicePortName](), Node: r.node, Full: true}); err != nil {
		r.t.Fatalf("full sync on a fresh node: %v", err)
	}
	return normalize(fresh.Dump())
}

// sharedChains hold rules of many services; a partial sync inserts and
// deletes single rules there, so their order differs from a full sync's.
var sharedChains = []string{chainServices, chainNodePorts, chainExternalServices, chainProxyFirewall, chainPostrouting}

// normalize sorts the rules of the shared chains (keeping nat
// KUBE-SERVICES' node port jump last) so that dumps compare by content.
func normalize(dump string) string {
	lines := strings.Split(dump, "\n")
	var out, group []string
	groupChain := ""
	flush := func() {
		slices.SortStableFunc(group, func(a, b string) int {
			fixed := func(l string) bool {
				return strings.Contains(l, "NOTE: this must be the last rule") || (strings.Contains(l, chainPostrouting) && !strings.Contains(l, "hairpin"))
			}
			la, lb := fixed(a), fixed(b)
			switch {
			case la && !lb:
				return 1
			case lb && !la:
				return -1
			}
			return strings.Compare(a, b)
		})
		out = append(out, group...)
		group, groupChain = nil, ""
	}
	for _, l := range lines {
		chain := ""
		if strings.HasPrefix(l, "-A ") {
			chain = strings.Fields(l)[1]
		}
		if chain != groupChain {
			flush()
		}
		if slices.Contains(sharedChains, chain) {
			group = append(group, l)
			groupChain = chain
			continue
		}
		out = append(out, l)
	}
	flush()
	return strings.Join(out, "\n")
}

func TestProxierFirstSyncAndRepeat(t *testing.T) {
	c := flowtest.Example(t, "node-a")
	for _, b := range xtables.Backends {
		for _, f := range []v1.IPFamily{model.IPv4, model.IPv6} {
			t.Run(string(b)+"/"+string(f), func(t *testing.T) {
				r := newRig(t, c, f, b, nil)
				// Someone else's rules in the built-in chains stay.
				if err := r.fake.Restore(context.Background(), []byte("*filter\n-A INPUT -p tcp --dport 22 -j ACCEPT\nCOMMIT\n"), xtables.RestoreOptions{NoFlush: true}); err != nil {
					t.Fatal(err)
				}
				res := r.mustSync(false) // the first sync is full whatever is asked
				first := r.fake.Dump()
				if !strings.Contains(first, "-A INPUT -p tcp --dport 22 -j ACCEPT") {
					t.Errorf("another program's rule in INPUT is gone:\n%s", first)
				}
				for table, lines := range JumpRuleLines() {
					for _, l := range lines {
						chain := strings.Fields(l)[1]
						if n := strings.Count(strings.Join(r.fake.Rules(table, chain), "\n"), l); n != 1 {
							t.Errorf("%s %s: jump rule %q present %d times", table, chain, l, n)
						}
					}
				}
				if f == model.IPv4 {
					if got := res.HealthCheckPorts; len(got) != 1 {
						t.Errorf("health check ports = %v, want etp-local's", got)
					}
				}
				// A second full sync finds its jump rules and adds none.
				r.mustSync(true)
				if again := r.fake.Dump(); again != first {
					t.Errorf("a second full sync changed the rules:\n%s", cmp.Diff(first, again))
				}
				// A partial sync with nothing changed writes nothing.
				n := len(r.fake.Restores())
				r.mustSync(false)
				if got := r.restoresSince(n); len(got) != 0 {
					t.Errorf("an empty partial sync ran iptables-restore: %q", got)
				}
			})
		}
	}
}

// TestProxierPartialSync changes service ports one at a time and checks
// that each partial restore is small and leaves exactly what a full sync
// of the new state would write.
func TestProxierPartialSync(t *testing.T) {
	c := flowtest.Example(t, "node-a")
	web := fixtures.SPName("web-clusterip", "http", model.TCP)
	dns := fixtures.SPName("dns-udp", "dns", model.UDP)
	newSvc := fixtures.SPName("new", "http", model.TCP)
	noEP := fixtures.SPName("no-endpoints", "http", model.TCP)
	lb := fixtures.SPName("lb-ranges", "https", model.TCP)
	steps := []partialStep{
		{
			name: "one endpoint added",
			do: func(r *rig) {
				eps := append(slices.Clone(r.state.Endpoints[web]), fixtures.Endpoint("198.18.129.11", 8080, true, nil))
				r.set(web, r.state.Services[web], eps)
			},
			want:    []string{"-A KUBE-SVC-L3ZXZ5RL5JV2UINA", "--probability 0.3333333333", "--to-destination 198.18.129.11:8080"},
			notWant: []string{"*filter", ":KUBE-SERVICES", "-A KUBE-SERVICES", "KUBE-SEP-5FM52R3KVI3RBTFP - [0:0]"},
		},
		{
			name: "one endpoint removed",
			do: func(r *rig) {
				r.set(web, r.state.Services[web], r.state.Endpoints[web][1:])
			},
			want:    []string{"-X KUBE-SEP-"},
			notWant: []string{":KUBE-SERVICES"},
		},
		{
			name: "new service",
			do: func(r *rig) {
				r.set(newSvc, fixtures.ServicePort("new", "198.19.1.1", 80, nil), []*model.Endpoint{fixtures.Endpoint("198.18.130.90", 8080, false, nil)})
			},
			want: []string{`-I KUBE-SERVICES 1 -m comment --comment "demo/new:http cluster IP"`},
		},
		{
			name: "service loses its endpoints: nat jump out, REJECT in",
			do:   func(r *rig) { r.set(newSvc, r.state.Services[newSvc], nil) },
			want: []string{`-D KUBE-SERVICES -m comment --comment "demo/new:http cluster IP"`, `-A KUBE-SERVICES -m comment --comment "demo/new:http has no endpoints"`},
		},
		{
			name: "service without endpoints gains one",
			do: func(r *rig) {
				r.set(noEP, r.state.Services[noEP], []*model.Endpoint{fixtures.Endpoint("198.18.129.99", 8080, true, nil)})
			},
			want: []string{`-D KUBE-SERVICES -m comment --comment "demo/no-endpoints:http has no endpoints"`},
		},
		{
			name:    "service removed",
			do:      func(r *rig) { r.set(newSvc, nil, nil) },
			want:    []string{`-D KUBE-SERVICES -m comment --comment "demo/new:http has no endpoints"`},
			notWant: []string{"*nat"},
		},
		{
			name: "UDP service loses an endpoint",
			do:   func(r *rig) { r.set(dns, r.state.Services[dns], r.state.Endpoints[dns][:1]) },
			want: []string{"-X KUBE-SEP-"},
		},
		{
			name: "source ranges change",
			do: func(r *rig) {
				sp := *r.state.Services[lb]
				sp.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}
				r.set(lb, &sp, r.state.Endpoints[lb])
			},
			want: []string{"-A KUBE-FW-EDLNQQTDUOW7MKI7", "-s 192.0.2.0/24"},
		},
	}
	for _, b := range xtables.Backends {
		for _, compact := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/compact=%v", b, compact), func(t *testing.T) {
				testPartialSteps(t, c, b, compact, steps)
			})
		}
	}
}

type partialStep struct {
	name string
	do   func(r *rig)
	// want are substrings of the partial restore (upstream layout);
	// notWant must not be there.
	want, notWant []string
}

func testPartialSteps(t *testing.T, c *flowtest.Snapshot, b xtables.Backend, compact bool, steps []partialStep) {
	r := newRig(t, c, model.IPv4, b, func(o *Options) { o.CompactLayout = compact })
	r.mustSync(true)
	for _, st := range steps {
		n := len(r.fake.Restores())
		st.do(r)
		r.mustSync(false)
		got := strings.Join(r.restoresSince(n), "")
		if compact {
			if strings.Contains(got, "KUBE-SEP-") && !strings.Contains(got, "--name KUBE-SEP-") {
				t.Errorf("%s: the compact layout writes endpoint chains:\n%s", st.name, got)
			}
			st.want, st.notWant = nil, nil
		}
		for _, w := range st.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: partial restore lacks %q:\n%s", st.name, w, got)
			}
		}
		for _, w := range st.notWant {
			if strings.Contains(got, w) {
				t.Errorf("%s: partial restore has %q:\n%s", st.name, w, got)
			}
		}
		if diff := cmp.Diff(r.freshDump(), normalize(r.fake.Dump())); diff != "" {
			t.Fatalf("%s: after the partial sync the rules differ from a full sync's (-full +partial):\n%s", st.name, diff)
		}
		r.checkTraces(t, st.name)
		rules := r.fake.Rules(tableNAT, chainServices)
		if last := rules[len(rules)-1]; !strings.Contains(last, "NOTE: this must be the last rule") {
			t.Errorf("%s: the node port jump is not last in nat KUBE-SERVICES: %s", st.name, last)
		}
		post := r.fake.Rules(tableNAT, chainPostrouting)
		if i := slices.IndexFunc(post, func(l string) bool { return strings.Contains(l, "-j RETURN") }); i < 0 || strings.Contains(strings.Join(post[i:], "\n"), "hairpin") {
			t.Errorf("%s: hairpin rules after the RETURN in KUBE-POSTROUTING:\n%s", st.name, strings.Join(post, "\n"))
		}
	}
}

// TestProxierSplitRestores: with a small chain budget (as the nft backend
// gets at scale) a sync is spread over several restores, each within the
// budget up to one service port's chains, and the result is the same.
func TestProxierSplitRestores(t *testing.T) {
	c := flowtest.Example(t, "node-a")
	r := newRig(t, c, model.IPv4, xtables.NFT, func(o *Options) { o.MaxChainsPerRestore = 6 })
	r.mustSync(true)
	calls := r.fake.Restores()
	if len(calls) < 4 {
		t.Fatalf("a full sync with a budget of 6 chains ran %d restores, want several", len(calls))
	}
	for i, call := range calls[:len(calls)-1] {
		if n := strings.Count(string(call.Data), " - [0:0]\n"); n > 10 {
			t.Errorf("restore %d declares %d chains:\n%s", i, n, call.Data)
		}
	}
	if diff := cmp.Diff(r.freshDump(), normalize(r.fake.Dump())); diff != "" {
		t.Errorf("split full sync differs from a single restore (-single +split):\n%s", diff)
	}
	// Stale chains of a removed service go in restores after the shared
	// chains stop jumping to them.
	web := fixtures.SPName("web-clusterip", "http", model.TCP)
	r.set(web, nil, nil)
	for _, n := range []string{"affinity", "dual-stack", "topology"} {
		r.set(fixtures.SPName(n, "http", model.TCP), nil, nil)
	}
	k := len(r.fake.Restores())
	r.mustSync(false)
	got := r.restoresSince(k)
	if len(got) < 2 || !strings.Contains(got[0], "-D KUBE-SERVICES") || !strings.Contains(got[len(got)-1], "-X KUBE-SEP-") {
		t.Errorf("removing services: want the shared rules deleted first, chains last; got %q", got)
	}
	if diff := cmp.Diff(r.freshDump(), normalize(r.fake.Dump())); diff != "" {
		t.Errorf("after removing services (-full +partial):\n%s", diff)
	}
}

// TestProxierTrialIsChecked: a trial of failure isolation is only checked
// (iptables-restore --test), never committed, split or not: nothing is
// applied, the applied state stays, and a refused check of any restore is
// the trial's failure. iptables-nft's plan is split (a budget of 6 chains)
// and each restore checked; a legacy trial is rendered unsplit, as
// legacy's --test resolves the chains an earlier restore would create.
func TestProxierTrialIsChecked(t *testing.T) {
	c := flowtest.Example(t, "node-a")
	for _, b := range xtables.Backends {
		t.Run(string(b), func(t *testing.T) {
			r := newRig(t, c, model.IPv4, b, func(o *Options) { o.MaxChainsPerRestore = 6 })
			all := sets.KeySet(r.state.Services)
			ctx := context.Background()
			trial := func(st *model.State) ([]xtablestest.RestoreCall, error) {
				t.Helper()
				k := len(r.fake.Restores())
				_, err := r.p.Sync(ctx, &proxy.Request{State: st, Changed: all, Node: r.node, Full: true, Trial: true})
				return r.fake.Restores()[k:], err
			}
			checkedOnly := func(what string, calls []xtablestest.RestoreCall, before string) {
				t.Helper()
				for i, call := range calls {
					if !call.Test {
						t.Errorf("%s: restore %d of %d was committed:\n%s", what, i+1, len(calls), call.Data)
					}
				}
				want := 1
				if b == xtables.NFT {
					want = 4 // split: the prelude, chunks, the shared chains
				}
				if len(calls) < want || (b == xtables.Legacy && len(calls) != 1) {
					t.Errorf("%s: %d restores checked, want %s%d", what, len(calls), map[bool]string{true: "", false: "at least "}[b == xtables.Legacy], want)
				}
				if got := r.fake.Dump(); got != before {
					t.Errorf("%s changed the rules:\n%s", what, cmp.Diff(before, got))
				}
			}

			// On a fresh node: the whole state, split, checked against a
			// kernel that has none of the chains the first restores
			// would create.
			calls, err := trial(r.state)
			if err != nil {
				t.Fatalf("trial on a fresh node: %v", err)
			}
			// (Reading the tables creates them empty in legacy, as
			// iptables-legacy-save does.)
			empty := xtablestest.NewFake(b, xtables.IPv4)
			for _, tb := range []string{"filter", "nat"} {
				if _, err := empty.Save(ctx, tb); err != nil {
					t.Fatal(err)
				}
			}
			checkedOnly("trial on a fresh node", calls, empty.Dump())

			r.mustSync(true)
			before := r.fake.Dump()
			// Without web-clusterip (isolation's first trial, without the
			// suspects): its chains would go.
			without := r.state.Clone()
			web := fixtures.SPName("web-clusterip", "http", model.TCP)
			delete(without.Services, web)
			delete(without.Endpoints, web)
			calls, err = trial(without)
			if err != nil {
				t.Fatalf("trial without web-clusterip: %v", err)
			}
			checkedOnly("trial without web-clusterip", calls, before)

			// A refused check of the last restore fails the trial and
			// commits nothing before it.
			n := len(calls)
			seen := 0
			r.fake.RestoreHook = func(data []byte, opts xtables.RestoreOptions) error {
				if !opts.Test {
					return errors.New("a trial committed a restore")
				}
				if seen++; seen == n {
					return &xtables.RestoreError{Backend: b, Family: xtables.IPv4, Line: 1, Detail: "refused"}
				}
				return nil
			}
			calls, err = trial(without)
			r.fake.RestoreHook = nil
			if err == nil {
				t.Fatal("a refused check passed")
			}
			checkedOnly("refused trial", calls, before)

			// The next real partial sync still knows what the kernel holds.
			r.mustSync(false)
			if diff := cmp.Diff(normalize(before), normalize(r.fake.Dump())); diff != "" {
				t.Errorf("after the trials, a sync changed the rules:\n%s", diff)
			}
		})
	}
}

// TestProxierLeftovers: chains of an earlier run that no service uses any
// more are deleted by the first full sync; other programs' chains stay.
func TestProxierLeftovers(t *testing.T) {
	c := flowtest.Example(t, "node-a")
	r := newRig(t, c, model.IPv4, xtables.Legacy, nil)
	old := "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]\n:KUBE-SEP-BBBBBBBBBBBBBBBB - [0:0]\n:KUBE-XLB-CCCCCCCCCCCCCCCC - [0:0]\n:CNI-HOSTPORT - [0:0]\n" +
		"-A KUBE-SERVICES -d 198.19.9.9/32 -p tcp --dport 80 -j KUBE-XLB-CCCCCCCCCCCCCCCC\n" +
		"-A KUBE-XLB-CCCCCCCCCCCCCCCC -j KUBE-SVC-AAAAAAAAAAAAAAAA\n-A KUBE-SVC-AAAAAAAAAAAAAAAA -j KUBE-SEP-BBBBBBBBBBBBBBBB\n" +
		"-A KUBE-SEP-BBBBBBBBBBBBBBBB -p tcp -j DNAT --to-destination 198.18.130.9:80\nCOMMIT\n"
	if err := r.fake.Restore(context.Background(), []byte(old), xtables.RestoreOptions{NoFlush: true}); err != nil {
		t.Fatal(err)
	}
	r.mustSync(true)
	chains := r.fake.Chains(tableNAT)
	for _, gone := range []string{"KUBE-SVC-AAAAAAAAAAAAAAAA", "KUBE-SEP-BBBBBBBBBBBBBBBB", "KUBE-XLB-CCCCCCCCCCCCCCCC"} {
		if slices.Contains(chains, gone) {
			t.Errorf("stale chain %s is still there", gone)
		}
	}
	if !slices.Contains(chains, "CNI-HOSTPORT") {
		t.Errorf("another program's chain was deleted")
	}
}

// TestProxierFailureAndCanary: a failed restore makes the next sync full
// (and it repairs what the failure left); a flushed ruleset (canary gone)
// makes the next partial restore fail, and so the sync after it full.
func TestProxierFailureAndCanary(t *testing.T) {
	c := flowtest.Example(t, "node-a")
	web := fixtures.SPName("web-clusterip", "http", model.TCP)
	r := newRig(t, c, model.IPv4, xtables.NFT, nil)
	r.mustSync(true)

	boom := errors.New("boom")
	r.fake.RestoreHook = func([]byte, xtables.RestoreOptions) error { return boom }
	r.set(web, r.state.Services[web], r.state.Endpoints[web][:1])
	if _, err := r.sync(false); !errors.Is(err, boom) {
		t.Fatalf("sync with a failing restore: err = %v, want boom", err)
	}
	// A lock timeout is a failure like any other, and counted.
	timeouts := testutil.ToFloat64(metrics.IPTablesLockTimeoutsTotal.WithLabelValues(string(model.IPv4)))
	r.fake.RestoreHook = func([]byte, xtables.RestoreOptions) error {
		return fmt.Errorf("iptables-restore: %w", xtables.ErrLockTimeout)
	}
	if _, err := r.sync(false); !errors.Is(err, xtables.ErrLockTimeout) {
		t.Fatalf("sync with a lock timeout: err = %v", err)
	}
	if got := testutil.ToFloat64(metrics.IPTablesLockTimeoutsTotal.WithLabelValues(string(model.IPv4))); got != timeouts+1 {
		t.Errorf("kproxy_iptables_lock_timeouts_total went from %v to %v, want +1", timeouts, got)
	}
	r.fake.RestoreHook = nil
	n := len(r.fake.Restores())
	r.mustSync(false) // the loop keeps the change pending and asks for a partial sync
	got := r.restoresSince(n)
	if len(got) != 1 || !strings.Contains(got[0], "*mangle") {
		t.Errorf("the sync after a failure is not full: %q", got)
	}
	if diff := cmp.Diff(r.freshDump(), normalize(r.fake.Dump())); diff != "" {
		t.Errorf("after recovery (-want +got):\n%s", diff)
	}

	// Delete everything, as firewalld's reload does: the next partial
	// restore fails on the canary and the sync after it is full.
	r.fake = xtablestest.NewFake(xtables.NFT, xtables.IPv4)
	r.p.ipt = r.fake
	r.set(web, r.state.Services[web], c.States[model.IPv4].Endpoints[web])
	_, err := r.sync(false)
	if err == nil || !strings.Contains(err.Error(), chainCanary) {
		t.Fatalf("a partial sync after the rules were flushed: err = %v, want one naming %s", err, chainCanary)
	}
	if got := r.restoresSince(0); len(got) != 1 || !strings.HasPrefix(got[0], "*nat\n-F "+chainCanary+"\n") {
		t.Errorf("the partial restore does not start with the canary check: %q", got)
	}
	r.mustSync(false)
	if diff := cmp.Diff(r.freshDump(), normalize(r.fake.Dump())); diff != "" {
		t.Errorf("after the flush and a full sync (-want +got):\n%s", diff)
	}
}

func TestProxierUDPConntrack(t *testing.T) {
	c := flowtest.Example(t, "node-a")
	dns := fixtures.SPName("dns-udp", "dns", model.UDP)
	r := newRig(t, c, model.IPv4, xtables.Legacy, nil)
	a := netip.MustParseAddr
	// Flows as the kernel would have them: one to each endpoint of the
	// DNS service, one to a dead endpoint (reconciled at the full sync).
	r.ct.Flows4 = []conntrack.Flow{
		{OrigSrc: a("198.18.129.5"), OrigSrcPort: 1000, OrigDst: a("198.19.0.18"), OrigDstPort: 53, ReplySrc: a("198.18.129.53"), ReplySrcPort: 53},
		{OrigSrc: a("198.18.129.5"), OrigSrcPort: 1001, OrigDst: a("198.19.0.18"), OrigDstPort: 53, ReplySrc: a("198.18.130.53"), ReplySrcPort: 53},
		{OrigSrc: a("198.18.129.5"), OrigSrcPort: 1002, OrigDst: a("198.19.0.18"), OrigDstPort: 53, ReplySrc: a("198.18.130.99"), ReplySrcPort: 53},
	}
	r.mustSync(true)
	if len(r.ct.Flows4) != 2 {
		t.Fatalf("after the first full sync %d flows are left, want the 2 to serving endpoints: %v", len(r.ct.Flows4), r.ct.Flows4)
	}
	r.set(dns, r.state.Services[dns], r.state.Endpoints[dns][:1])
	r.mustSync(false)
	if len(r.ct.Flows4) != 1 || r.ct.Flows4[0].ReplySrc != a("198.18.129.53") {
		t.Errorf("after removing endpoint 198.18.130.53 the flows are %v, want only the one to 198.18.129.53", r.ct.Flows4)
	}
}

// checkTraces reads what the fake holds after the syncs so far into the
// iptables tracer (the fake restored them with the tracer's restore
// simulator, package xtables/restore, which refused any "-D" of a missing
// rule or "-X" of a chain in use) and compares where packets to every
// service port go with a fresh full sync of the current state.
func (r *rig) checkTraces(t *testing.T, step string) {
	t.Helper()
	got, err := iptrace.Parse([]byte(r.fake.Dump()))
	if err != nil {
		t.Fatalf("%s: the tracer refuses what the fake holds: %v\n%s", step, err, r.fake.Dump())
	}
	got.RouteLocalnet = true
	fresh := mustNewProxier(t, r.opts, Handles{IPTables: xtablestest.NewFake(r.backend, xfamily(r.opts.Family))})
	want := &iptrace.Ruleset{RouteLocalnet: true}
	plan := Render(fresh.opts.RenderConfig(r.node, r.node.Addresses), &Input{RenderInput: proxy.RenderInput{State: r.state, NodeName: r.node.Name, Zone: r.node.Zone()}, Full: true, Existing: &Existing{}}, NewApplied())
	for _, data := range plan.Restores {
		if err := want.Apply(data, true); err != nil {
			t.Fatal(err)
		}
	}
	for _, sp := range r.state.Services {
		for _, pkt := range []flowtest.Case{
			{Src: localPod, IIF: podIIF, Dst: netip.AddrPortFrom(sp.ClusterIP, uint16(sp.Port)).String(), Proto: sp.Protocol},
			{Src: outside, IIF: lanIIF, Dst: netip.AddrPortFrom(sp.ClusterIP, uint16(sp.Port)).String(), Proto: sp.Protocol},
		} {
			p := pkt.Packet()
			g, err1 := got.Trace(p, hostA)
			w, err2 := want.Trace(p, hostA)
			if err1 != nil || err2 != nil {
				t.Fatalf("%s: trace %s: %v / %v", step, p, err1, err2)
			}
			go1, gm, _ := flowtest.Summary(g)
			wo, wm, _ := flowtest.Summary(w)
			if go1 != wo || gm != wm {
				t.Errorf("%s: %s goes to %q (masquerade %v) after partial syncs, %q (%v) after a full one", step, p, go1, gm, wo, wm)
			}
		}
	}
}

// TestLegacyFullSyncIsOneRestore: a full sync larger than the nft
// backend's chain budget is one iptables-restore run on the legacy
// backend (each legacy run reads and replaces every table it names, so N
// runs would copy the whole table N times), and several on nft; both
// leave the same rules.
func TestLegacyFullSyncIsOneRestore(t *testing.T) {
	c := flowtest.Example(t, "node-a")
	const services, perService = 100, 10 // 1,100 chains
	dumps := map[xtables.Backend]string{}
	for _, b := range []xtables.Backend{xtables.Legacy, xtables.NFT} {
		r := newRig(t, c, model.IPv4, b, nil)
		r.state = plainState(services, perService)
		r.mustSync(true)
		calls := r.fake.Restores()
		switch {
		case b == xtables.Legacy && len(calls) != 1:
			t.Errorf("legacy: the first full sync of %d chains ran iptables-restore %d times, want once", services*(perService+1), len(calls))
		case b == xtables.NFT && len(calls) < 2:
			t.Errorf("nft: the first full sync of %d chains ran iptables-restore %d times, want it split (budget %d)", services*(perService+1), len(calls), DefaultMaxChainsPerRestore)
		}
		for _, call := range calls {
			if call.Test || !call.NoFlush {
				t.Errorf("%s: restore with test=%v noflush=%v, want --noflush and no --test", b, call.Test, call.NoFlush)
			}
		}
		dumps[b] = normalize(r.fake.Dump())
	}
	if diff := cmp.Diff(dumps[xtables.Legacy], dumps[xtables.NFT]); diff != "" {
		t.Errorf("legacy's one restore and nft's split ones leave different rules (-legacy +nft):\n%s", diff)
	}
}
