package iptables

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/metrics"
	"github.com/kproxy/kproxy/internal/model"
	"github.com/kproxy/kproxy/internal/proxy"
	"github.com/kproxy/kproxy/internal/proxy/flowtest"
	"github.com/kproxy/kproxy/internal/testutil/fixtures"
)

func driftString(ds []proxy.Drift) string {
	var s []string
	for _, d := range ds {
		s = append(s, d.String())
	}
	return strings.Join(s, "; ")
}

// TestCheckDrift: after full and partial syncs the kernel matches what
// kproxy wrote; each change made behind its back is found and named, once,
// and the full sync after it repairs it.
func TestCheckDrift(t *testing.T) {
	c := flowtest.Example(t, "node-a")
	web := fixtures.SPName("web-clusterip", "http", model.TCP)
	for _, b := range []xtables.Backend{xtables.Legacy, xtables.NFT} {
		t.Run(string(b), func(t *testing.T) {
			r := newRig(t, c, model.IPv4, b, nil)
			ctx := context.Background()
			check := func(step string) string {
				t.Helper()
				ds, err := r.p.CheckDrift(ctx)
				if err != nil {
					t.Fatalf("%s: CheckDrift: %v", step, err)
				}
				return driftString(ds)
			}
			if ds, err := r.p.CheckDrift(ctx); !errors.Is(err, proxy.ErrNothingToCompare) || len(ds) > 0 {
				t.Errorf("before the first sync: drift %q, err %v; want none, ErrNothingToCompare", driftString(ds), err)
			}
			r.mustSync(true)
			if got := check("after a full sync"); got != "" {
				t.Fatalf("after a full sync: %s", got)
			}
			r.set(web, r.state.Services[web], r.state.Endpoints[web][:1])
			r.mustSync(false)
			if got := check("after a partial sync"); got != "" {
				t.Fatalf("after a partial sync: %s", got)
			}
			svcChain := ""
			for _, l := range strings.Split(r.fake.Dump(), "\n") {
				if strings.HasPrefix(l, "-A KUBE-SVC-") && strings.Contains(l, "demo/web-clusterip:http") {
					svcChain = strings.Fields(l)[1]
					break
				}
			}
			for _, tc := range []struct {
				name, restore, want string
			}{
				{"flush KUBE-SERVICES", "*nat\n-F KUBE-SERVICES\nCOMMIT\n", "chain nat/KUBE-SERVICES flushed"},
				{"delete the PREROUTING jump", "*nat\n-D PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\nCOMMIT\n", "rule nat/PREROUTING jump to KUBE-SERVICES deleted"},
				{"delete a KUBE-SVC rule", "*nat\n-D " + svcChain + " 1\nCOMMIT\n", "rule nat/" + svcChain + " 1 deleted"},
				{"add a rule", "*filter\n-A KUBE-FORWARD -j ACCEPT\nCOMMIT\n", "rule filter/KUBE-FORWARD 1 added"},
				{"delete the canary", "*mangle\n-X KUBE-PROXY-CANARY\nCOMMIT\n", "chain mangle/KUBE-PROXY-CANARY deleted"},
			} {
				if err := r.fake.Restore(ctx, []byte(tc.restore), xtables.RestoreOptions{NoFlush: true}); err != nil {
					t.Fatalf("%s: %v", tc.name, err)
				}
				if got := check(tc.name); !strings.HasPrefix(got, tc.want) {
					t.Errorf("%s: drift %q, want it to start with %q", tc.name, got, tc.want)
				}
				// Reported once: until the repair the check reads nothing.
				if ds, err := r.p.CheckDrift(ctx); !errors.Is(err, proxy.ErrNothingToCompare) || len(ds) > 0 {
					t.Errorf("%s, again: drift %q, err %v; want none, ErrNothingToCompare", tc.name, driftString(ds), err)
				}
				// The repair's full sync does not report it again.
				before := testutil.ToFloat64(metrics.RulesDriftTotal.WithLabelValues("iptables", "chain")) + testutil.ToFloat64(metrics.RulesDriftTotal.WithLabelValues("iptables", "rule"))
				r.mustSync(true)
				after := testutil.ToFloat64(metrics.RulesDriftTotal.WithLabelValues("iptables", "chain")) + testutil.ToFloat64(metrics.RulesDriftTotal.WithLabelValues("iptables", "rule"))
				if after != before {
					t.Errorf("%s: the repair counted drift again (%v -> %v)", tc.name, before, after)
				}
				if got := check(tc.name + ", repaired"); got != "" {
					t.Errorf("%s: after the repair: %s", tc.name, got)
				}
			}
			// Found by the full sync itself when no check ran before it.
			if err := r.fake.Restore(ctx, []byte("*nat\n-F KUBE-SERVICES\nCOMMIT\n"), xtables.RestoreOptions{NoFlush: true}); err != nil {
				t.Fatal(err)
			}
			before := testutil.ToFloat64(metrics.RulesDriftTotal.WithLabelValues("iptables", "chain"))
			r.mustSync(true)
			if after := testutil.ToFloat64(metrics.RulesDriftTotal.WithLabelValues("iptables", "chain")); after != before+1 {
				t.Errorf("a full sync after a flush counted %v drift, want 1", after-before)
			}
		})
	}
}

// pausingSave is an iptables whose Save of the nat table, once armed,
// reads the table at once but returns only when released: a drift check
// caught in the middle of a long iptables-save.
type pausingSave struct {
	xtables.Interface
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func (s *pausingSave) Save(ctx context.Context, table string) ([]byte, error) {
	data, err := s.Interface.Save(ctx, table)
	if table == tableNAT && s.armed.CompareAndSwap(true, false) {
		close(s.entered)
		<-s.release
	}
	return data, err
}

// TestCheckDriftLetsSyncsRun: a sync does not wait for a drift check's
// iptables-save (seconds at 10k services), and the check that the sync
// overlapped reports nothing: its reading of the nat table predates the
// sync's change, which is kproxy's own writing, not drift. The next check
// compares again.
func TestCheckDriftLetsSyncsRun(t *testing.T) {
	c := flowtest.Example(t, "node-a")
	web := fixtures.SPName("web-clusterip", "http", model.TCP)
	r := newRig(t, c, model.IPv4, xtables.Legacy, nil)
	ps := &pausingSave{Interface: r.fake, entered: make(chan struct{}), release: make(chan struct{})}
	r.p = mustNewProxier(t, r.opts, Handles{IPTables: ps, HostHandles: proxy.HostHandles{Conntrack: r.ct}})
	ctx := context.Background()
	r.mustSync(true)
	if len(r.state.Endpoints[web]) < 2 {
		t.Fatalf("%s has %d endpoints; the test removes one of several", web, len(r.state.Endpoints[web]))
	}

	ps.armed.Store(true)
	type result struct {
		ds  []proxy.Drift
		err error
	}
	checked := make(chan result, 1)
	go func() {
		ds, err := r.p.CheckDrift(ctx)
		checked <- result{ds, err}
	}()
	<-ps.entered
	r.set(web, r.state.Services[web], r.state.Endpoints[web][:1])
	synced := make(chan error, 1)
	go func() {
		_, err := r.sync(false)
		synced <- err
	}()
	select {
	case err := <-synced:
		if err != nil {
			t.Fatalf("the sync during the check: %v", err)
		}
	case <-time.After(10 * time.Second):
		close(ps.release)
		t.Fatal("the sync waited for the drift check's iptables-save")
	}
	close(ps.release)
	if res := <-checked; res.err != nil || len(res.ds) > 0 {
		t.Errorf("the check a sync overlapped: drift %q, err %v; want none", driftString(res.ds), res.err)
	}

	if ds, err := r.p.CheckDrift(ctx); err != nil || len(ds) > 0 {
		t.Errorf("the next check: drift %q, err %v; want none", driftString(ds), err)
	}
	if err := r.fake.Restore(ctx, []byte("*nat\n-F KUBE-SERVICES\nCOMMIT\n"), xtables.RestoreOptions{NoFlush: true}); err != nil {
		t.Fatal(err)
	}
	if ds, err := r.p.CheckDrift(ctx); err != nil || !strings.HasPrefix(driftString(ds), "chain nat/KUBE-SERVICES flushed") {
		t.Errorf("after a flush behind kproxy's back: drift %q, err %v; want KUBE-SERVICES flushed", driftString(ds), err)
	}
}

// TestParseSavedTable: rules are counted per chain (declared chains with
// none count 0); only the rules of chains kproxy does not follow keep
// their text (its jumps are checked there), not the tens of MB of its own.
func TestParseSavedTable(t *testing.T) {
	save := `# Generated by iptables-save
*nat
:PREROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-ABC - [0:0]
:KUBE-EMPTY - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-SERVICES -d 198.19.0.1/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-ABC
-A KUBE-SVC-ABC -j KUBE-SEP-1
-A KUBE-SVC-ABC -j KUBE-SEP-2  
-A KUBE-SEP-1 -p tcp -j DNAT --to-destination 198.18.1.1:80
COMMIT
`
	s := parseSavedTable([]byte(save))
	want := map[string]int{"PREROUTING": 1, "KUBE-SERVICES": 1, "KUBE-SVC-ABC": 2, "KUBE-EMPTY": 0, "KUBE-SEP-1": 1}
	if len(s.chains) != len(want) {
		t.Errorf("chains %d, want %d", len(s.chains), len(want))
	}
	for c, n := range want {
		if got := s.chains[c]; got == nil || *got != n {
			t.Errorf("chain %s: %v rules, want %d", c, got, n)
		}
	}
	jump := `-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`
	if len(s.lines) != 1 || !s.lines[jump] {
		t.Errorf("kept lines %v, want only the built-in chain's jump", s.lines)
	}
}

// driftScale is a restore input and the matching iptables-save output of
// n chains of per rules each, in nat.
func driftScale(n, per int) (restore, save []byte) {
	var r, s strings.Builder
	r.WriteString("*nat\n")
	s.WriteString("*nat\n")
	for i := range n {
		c := fmt.Sprintf("KUBE-SEP-%016d", i)
		r.WriteString(":" + c + " - [0:0]\n")
		s.WriteString(":" + c + " - [0:0]\n")
	}
	for i := range n {
		c := fmt.Sprintf("KUBE-SEP-%016d", i)
		for j := range per {
			rule := fmt.Sprintf(" -m comment --comment \"ns/svc:p%d\" -j MARK --set-xmark 0x4000/0x4000\n", j)
			r.WriteString("-A " + c + rule)
			s.WriteString("-A " + c + rule)
		}
	}
	r.WriteString("COMMIT\n")
	s.WriteString("COMMIT\n")
	return []byte(r.String()), []byte(s.String())
}

// TestDriftBookkeepingAllocations: following a restore and comparing with
// iptables-save cost allocations per chain, not per rule or per
// comparison of the sort (a full sync at 10k services follows 330k lines
// of 110k chains, and the check after it sorts them).
func TestDriftBookkeepingAllocations(t *testing.T) {
	const chains, per = 500, 10
	restore, save := driftScale(chains, per)
	w := newWritten()
	w.follow(restore)
	w.valid = true
	if ds := w.diff(map[string][]byte{tableNAT: save}); len(ds) != 0 {
		t.Fatalf("drift where there is none: %s", driftString(ds))
	}
	if got := w.rules[chainKey{tableNAT, fmt.Sprintf("KUBE-SEP-%016d", 7)}]; got != per {
		t.Fatalf("followed %d rules in a chain, want %d", got, per)
	}
	follow := testing.AllocsPerRun(5, func() { w.follow(restore) })
	// A chain's name is kept at its declaration and again at its first
	// rule (the rules come after all the declarations), nothing per rule.
	if max := float64(2*chains + 50); follow > max {
		t.Errorf("follow of %d chains × %d rules: %.0f allocations, want at most %.0f", chains, per, follow, max)
	}
	// parseSavedTable keeps a name and a counter per chain.
	diff := testing.AllocsPerRun(5, func() { w.diff(map[string][]byte{tableNAT: save}) })
	if max := float64(3*chains + 100); diff > max {
		t.Errorf("diff of %d chains: %.0f allocations, want at most %.0f", chains, diff, max)
	}
	t.Logf("follow: %.0f allocations, diff: %.0f", follow, diff)
}
