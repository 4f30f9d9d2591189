package kernel

// Drift: rules changed behind kproxy's back. Addresses are the example's
// (cluster_test.go); the probe is the client's request to web-clusterip,
// 198.19.0.10:80, which node-a DNATs to web-…-a1b2c or web-…-d3e4f.

import (
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/testutil/netns"
)

// driftSyncPeriod is long enough that the periodic full sync cannot be
// what repairs.
const driftSyncPeriod = 5 * time.Minute

// driftBudget is the longest a repair may take, by mode: nftables is
// notified at once (DriftWindow, 100 ms, then a full sync); iptables
// compares on a schedule of at least 1 s (20 times what a comparison
// takes), then syncs.
func driftBudget(m proxyMode) time.Duration {
	if m.iptables {
		return 5 * time.Second
	}
	return time.Second
}

// driftCase breaks something; the command runs in node-a.
type driftCase struct {
	name string
	// argv returns the command, given the current rules (to find a
	// chain's name).
	argv func(t *testing.T, dump string) []string
}

func fixed(argv ...string) func(*testing.T, string) []string {
	return func(*testing.T, string) []string { return argv }
}

var svcChain = regexp.MustCompile(`(?m)^-A (KUBE-SVC-\S+) .*demo/web-clusterip:http`)

func driftCases(m proxyMode) []driftCase {
	if !m.iptables {
		return []driftCase{
			{"delete the main table", fixed("nft", "delete", "table", "ip", "kube-proxy")},
			{"flush a chain", fixed("nft", "flush", "chain", "ip", "kube-proxy-s0", "services")},
			{"flush a map", fixed("nft", "flush", "map", "ip", "kube-proxy-s0", "cluster-services")},
			{"delete one element", fixed("nft", "delete", "element", "ip", "kube-proxy-s0", "cluster-services", "{", "198.19.0.10", ".", "tcp", ".", "80", "}")},
			{"delete a shard table", fixed("nft", "delete", "table", "ip", "kube-proxy-s0")},
		}
	}
	ipt := "iptables-" + strings.TrimPrefix(m.name, "iptables-")
	return []driftCase{
		{"flush KUBE-SERVICES", fixed(ipt, "-t", "nat", "-F", "KUBE-SERVICES")},
		{"delete the PREROUTING jump", fixed(ipt, "-t", "nat", "-D", "PREROUTING", "-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES")},
		{"delete a KUBE-SVC rule", func(t *testing.T, dump string) []string {
			mm := svcChain.FindStringSubmatch(dump)
			if mm == nil {
				t.Fatalf("no KUBE-SVC chain of demo/web-clusterip:http in\n%s", dump)
			}
			return []string{ipt, "-t", "nat", "-D", mm[1], "1"}
		}},
	}
}

var (
	nftCounter = regexp.MustCompile(`counter packets \d+ bytes \d+`)
	iptCounter = regexp.MustCompile(`\[\d+:\d+\]`)
)

// normalize makes dumps comparable: counters dropped, lines sorted (a
// repair may insert a jump at another position than where it was, or
// list a map's elements in another order; what matters is that it is
// all there).
func normalize(dump string) string {
	dump = nftCounter.ReplaceAllString(dump, "counter")
	dump = iptCounter.ReplaceAllString(dump, "")
	var lines []string
	for _, l := range strings.Split(dump, "\n") {
		l = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(l), ","))
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		lines = append(lines, l)
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// driftTotal sums kproxy_rules_drift_total over its labels.
func driftTotal(t *testing.T, n *netns.NS) float64 {
	t.Helper()
	code, body, err := n.HTTPGet("http://127.0.0.1:10249/metrics", 2*time.Second)
	if err != nil || code != 200 {
		t.Fatalf("metrics: %d %v", code, err)
	}
	sum := 0.0
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, "kproxy_rules_drift_total{") {
			f, err := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64)
			if err != nil {
				t.Fatalf("metric line %q: %v", l, err)
			}
			sum += f
		}
	}
	return sum
}

// driftRuns is how many times each case runs (KPROXY_DRIFT_RUNS, for the
// figures in docs/reliability.md).
func driftRuns() int {
	if n, err := strconv.Atoi(os.Getenv("KPROXY_DRIFT_RUNS")); err == nil && n > 0 && n <= 20 {
		return n
	}
	return 1
}

// TestDriftRepaired: with a sync period of 5 minutes, each breakage of
// kproxy's rules by another program is repaired within the mode's budget
// (traffic answered again and the rules as they were), with one log line
// naming it and kproxy_rules_drift_total counting it; kproxy's own repair
// is not counted as drift.
func TestDriftRepaired(t *testing.T) {
	t.Parallel()
	for _, m := range []proxyMode{nftablesMode, iptablesMode(xtables.Legacy), iptablesMode(xtables.NFT)} {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			for _, bin := range m.needs {
				netns.Require(t, bin)
			}
			testDriftRepaired(t, m)
		})
	}
}

func testDriftRepaired(t *testing.T, m proxyMode) {
	c := newCluster(t, clusterOptions{mode: m, kproxyOn: []string{nodeA},
		args: []string{"--iptables-sync-period", driftSyncPeriod.String()}})
	node := c.Nodes[nodeA].NS
	svc := ap("198.19.0.10:80")
	probe := func(timeout time.Duration) netns.Reply {
		return c.Client.Request("tcp", svc, netns.DialOptions{Timeout: timeout})
	}
	if r := probe(0); r.Outcome != netns.Answered {
		t.Fatalf("before: %v", r)
	}
	budget := driftBudget(m)
	runs := driftRuns()
	for _, dc := range driftCases(m) {
		var took []time.Duration
		for run := 0; run < runs; run++ {
			before, err := m.dump(node)
			if err != nil {
				t.Fatal(err)
			}
			want := normalize(before)
			drift0 := driftTotal(t, node)
			logLen := len(c.kproxy[nodeA].Log())
			argv := dc.argv(t, before)
			if out, err := node.Exec(10*time.Second, argv...); err != nil {
				t.Fatalf("%s: %v: %s", strings.Join(argv, " "), err, out)
			}
			broke := time.Now()
			brokeTraffic := false
			var repaired time.Duration
			var last string
			for deadline := broke.Add(budget + 10*time.Second); ; {
				if time.Now().After(deadline) {
					t.Fatalf("%s: not repaired within %v; last: %s\nkproxy's log:\n%s", dc.name, budget+10*time.Second, last, c.kproxy[nodeA].Tail(30))
				}
				// Traffic first (cheap when answered), then the rules.
				r := probe(100 * time.Millisecond)
				answered := time.Since(broke)
				if r.Outcome != netns.Answered {
					brokeTraffic = true
					last = "traffic: " + r.String()
					continue
				}
				d, err := m.dump(node)
				if err != nil {
					last = err.Error()
					continue
				}
				if normalize(d) != want {
					last = "rules differ from before"
					time.Sleep(10 * time.Millisecond)
					continue
				}
				repaired = answered
				break
			}
			took = append(took, repaired)
			if repaired > budget {
				t.Errorf("%s: repaired after %v, budget %v", dc.name, repaired.Round(time.Millisecond), budget)
			}
			// Logged once, counted; the repair itself is not drift.
			netns.Eventually(t, 5*time.Second, dc.name+": drift counted", func() (bool, string) {
				return driftTotal(t, node) > drift0, "kproxy_rules_drift_total did not go up"
			})
			time.Sleep(300 * time.Millisecond)
			after := driftTotal(t, node)
			time.Sleep(1500 * time.Millisecond)
			if again := driftTotal(t, node); again != after {
				t.Errorf("%s: kproxy_rules_drift_total went on from %v to %v after the repair (its own changes counted as drift?)", dc.name, after, again)
			}
			logged := c.kproxy[nodeA].Log()[logLen:]
			if n := strings.Count(logged, "Rules changed behind kproxy's back"); n != 1 {
				t.Errorf("%s: %d drift log lines, want 1:\n%s", dc.name, n, logged)
			} else {
				i := strings.Index(logged, "Rules changed behind kproxy's back")
				line, _, _ := strings.Cut(logged[i:], "\n")
				t.Logf("%s: broke traffic %v, repaired in %v; %s", dc.name, brokeTraffic, repaired.Round(time.Millisecond), line)
			}
		}
		slices.Sort(took)
		t.Logf("FIGURE %s | %s | runs %d | min %v | median %v | max %v", m.name, dc.name, len(took),
			took[0].Round(time.Millisecond), took[len(took)/2].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond))
	}
}

// TestDriftRepairedHairpin: in nftables mode the hairpin pairs are in the
// shard tables (by address), the masquerading in the main table. After
// the table holding web-…-a1b2c's pair is deleted behind kproxy's back
// and repaired, and then the main table, the rules are as before and the
// pod reaching its own service is still masqueraded when it lands on
// itself.
func TestDriftRepairedHairpin(t *testing.T) {
	t.Parallel()
	m := nftablesMode
	for _, bin := range m.needs {
		netns.Require(t, bin)
	}
	c := newCluster(t, clusterOptions{mode: m, kproxyOn: []string{nodeA},
		args: []string{"--iptables-sync-period", driftSyncPeriod.String()}})
	node := c.Nodes[nodeA].NS
	before, err := m.dump(node)
	if err != nil {
		t.Fatal(err)
	}
	want := normalize(before)
	pair := "198.18.129.10 . 198.18.129.10"
	pairTable := ""
	table := ""
	for _, l := range strings.Split(before, "\n") {
		if f := strings.Fields(l); len(f) >= 3 && f[0] == "table" && f[1] == "ip" {
			table = f[2]
		}
		if strings.Contains(l, pair) {
			pairTable = table
		}
	}
	if pairTable == "" || pairTable == "kube-proxy" {
		t.Fatalf("want %s's hairpin pair in a shard table, found it in %q:\n%s", webA, pairTable, before)
	}
	pod := c.Pod(t, webA)
	for _, table := range []string{pairTable, "kube-proxy"} {
		if out, err := node.Exec(10*time.Second, "nft", "delete", "table", "ip", table); err != nil {
			t.Fatalf("nft delete table ip %s: %v: %s", table, err, out)
		}
		netns.Eventually(t, 10*time.Second, table+" repaired", func() (bool, string) {
			d, err := m.dump(node)
			if err != nil {
				return false, err.Error()
			}
			return normalize(d) == want, "rules differ from before"
		})
		hit := false
		// Two endpoints, random choice: 40 tries miss the pod itself
		// with probability 2^-40.
		for i := 0; i < 40 && !hit; i++ {
			r := pod.Request("tcp", ap("198.19.0.10:80"), netns.DialOptions{})
			if r.Outcome != netns.Answered {
				t.Fatalf("after repairing %s, request %d: %v", table, i+1, r)
			}
			if hit = r.Server == webA; hit && r.Peer.Addr() != ip("198.18.129.1") {
				t.Errorf("after repairing %s, hairpin: %v; want it masqueraded to the node's bridge address", table, r)
			}
		}
		if !hit {
			t.Fatalf("40 requests never reached %s itself", webA)
		}
	}
}
