package kernel

// Faults: for each, long-lived TCP streams to
// services the fault does not concern survive, the next sync repairs the
// state, and /healthz tells the truth meanwhile.
//
// Addresses are the example's (cluster_test.go): web-clusterip is
// 198.19.0.10:80 (pods web-a on node-a, web-b on node-b), web-nodeport
// 198.19.0.11 and NodePort 30080, dual-stack fd00:19::17:80, etp-local's
// health check node port 32081; node-a is 198.18.0.10 (198.18.0.12 after
// its IP changes), the client 198.18.0.100. Generated services (the
// SIGKILL and memory cases) take 198.19.10.1 onwards.
//
// Every case runs on node-a only, through a faultWatch: three streams
// (client → web-clusterip on web-a, tester-a → web-clusterip on web-b,
// tester-a → dual-stack over IPv6) that echo every 300 ms, a prober that
// opens a new connection to web-clusterip (client) or dual-stack (tester-a)
// every 100 ms, and a poller of node-a's /healthz every 200 ms. The fault
// itself comes with a change (web-b leaves web-nodeport), so that a sync
// has something to do while it lasts. Each case logs one "figures:" line;
// docs/reliability.md quotes them.

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/kernel/xtables"
	"github.com/kproxy/kproxy/internal/testutil/netns"
)

const (
	streamEvery = 300 * time.Millisecond
	probeEvery  = 100 * time.Millisecond
	healthEvery = 200 * time.Millisecond
	// faultSyncPeriod is the sync period of every fault case: the health
	// timeout is twice that, and a full sync repairs within it.
	faultSyncPeriod = 2 * time.Second
	// bigSyncTimeout bounds a sync of 2,000 services on a busy host.
	bigSyncTimeout = 90 * time.Second
)

type faultCase struct {
	name  string
	modes []proxyMode
	// prepare adjusts the environment before the cluster is built.
	prepare func(f *faultEnv)
	// run injects the fault, checks the node through it, repairs it and
	// returns the repair time (0: not measured) and whether new
	// connections may fail meanwhile (the rules themselves were hit).
	run func(f *faultEnv) (repair time.Duration, newFailuresOK bool)
}

var (
	iptModes = []proxyMode{iptablesMode(xtables.Legacy), iptablesMode(xtables.NFT)}
	allModes = []proxyMode{nftablesMode, iptablesMode(xtables.Legacy), iptablesMode(xtables.NFT)}
)

// TestFaults runs every fault case in the modes it concerns, each in its
// own cluster.
func TestFaults(t *testing.T) {
	t.Parallel()
	for _, fc := range faultCases {
		t.Run(fc.name, func(t *testing.T) {
			t.Parallel()
			for _, m := range fc.modes {
				t.Run(m.name, func(t *testing.T) {
					for _, bin := range m.needs {
						netns.Require(t, bin)
					}
					requireKernel(t)
					f := &faultEnv{t: t, m: m, dir: t.TempDir()}
					if fc.prepare != nil {
						fc.prepare(f)
					}
					f.start()
					repair, failuresOK := fc.run(f)
					f.w.finish(fc.name+"/"+m.name, failuresOK, repair)
				})
			}
		})
	}
}

var faultCases = []faultCase{
	{
		// A restore whose last table fails: iptables-restore commits the
		// tables before it (legacy: one commit per COMMIT line), the
		// failing one not at all. A wrapper earlier in kproxy's PATH adds
		// a rule jumping from a missing chain before the input's last
		// COMMIT while a trigger file exists.
		name:  "iptables-restore fails half way",
		modes: iptModes,
		prepare: func(f *faultEnv) {
			b := strings.TrimPrefix(f.m.name, "iptables-")
			wrap := filepath.Join(f.dir, "wrap")
			if err := os.Mkdir(wrap, 0o755); err != nil {
				f.t.Fatal(err)
			}
			for _, fam := range []string{"iptables", "ip6tables"} {
				name := fam + "-" + b + "-restore"
				real := realPath(f.t, name)
				script := fmt.Sprintf(`#!/bin/sh
# Fails the last table of the input while %[1]s/trigger exists.
[ -e %[1]s/trigger ] || exec %[2]s "$@"
in=$(mktemp) || exit 1
cat > "$in"
n=$(grep -c '^COMMIT' "$in")
echo "$0 tables=$n" >> %[1]s/calls
awk -v n="$n" '/^COMMIT/ { c++; if (c == n) print "-A KPROXY-FAULT-NO-SUCH-CHAIN -j ACCEPT" } { print }' "$in" | %[2]s "$@"
rc=$?
rm -f "$in"
exit $rc
`, f.dir, real)
				if err := os.WriteFile(filepath.Join(wrap, name), []byte(script), 0o755); err != nil {
					f.t.Fatal(err)
				}
			}
			f.env = append(f.env, "PATH="+wrap+":"+os.Getenv("PATH"))
		},
		run: func(f *faultEnv) (time.Duration, bool) {
			node := f.c.Nodes[nodeA]
			if err := os.WriteFile(filepath.Join(f.dir, "trigger"), nil, 0o644); err != nil {
				f.t.Fatal(err)
			}
			natBefore := iptablesNat(f.t, node.NS, f.m)
			on := f.w.mark("fault on")
			f.change()
			f.w.waitHealth("restore failing", 503, on, syncTimeout)
			time.Sleep(faultSyncPeriod) // retries and isolation trials fail too
			calls, _ := os.ReadFile(filepath.Join(f.dir, "calls"))
			if !regexp.MustCompile(`tables=[2-9]`).Match(calls) {
				f.t.Fatalf("the wrapper never failed a restore of several tables (calls: %q)", calls)
			}
			natDuring := iptablesNat(f.t, node.NS, f.m)
			// Every service still carries traffic: the old rules, or the
			// nat table of the intended state (committed before the
			// filter table failed), never a subset of the services.
			f.c.run(f.t, probe{from: testerA, network: "tcp", dst: "198.19.0.11:80", n: 5, servers: web, peer: peerOwn})
			f.c.run(f.t, probe{from: testerA, network: "udp", dst: "198.19.0.18:53", servers: dns, every: true, peer: peerOwn})
			f.c.run(f.t, probe{from: client, network: "tcp", dst: "198.18.0.10:30081", n: 3, servers: []string{shopA}, peer: peerOwn})
			if !strings.Contains(f.c.kproxy[nodeA].Log(), "KPROXY-FAULT-NO-SUCH-CHAIN") && !strings.Contains(f.c.kproxy[nodeA].Log(), "restore failed") {
				f.t.Errorf("the failed restore is not in kproxy's log")
			}
			f.t.Logf("restore calls while failing: %d", strings.Count(string(calls), "\n"))
			if err := os.Remove(filepath.Join(f.dir, "trigger")); err != nil {
				f.t.Fatal(err)
			}
			off := f.w.mark("fault off")
			done := f.waitApplied("restore working again")
			f.w.waitHealth("restore working again", 200, off, syncTimeout)
			// What the fault left in the nat table was whole: the old
			// state (the failing restore held the nat table alone, or
			// only failed trials ran) or the intended state itself (a
			// restore of nat and filter commits nat before filter fails),
			// never a subset of the services.
			after := iptablesNat(f.t, node.NS, f.m)
			if lineDiff(after, natDuring) != "" && lineDiff(natBefore, natDuring) != "" {
				f.t.Errorf("the nat table during the fault was neither the old nor the intended one (-during +after the repair):\n%s\n(-during +before the fault):\n%s", lineDiff(natDuring, after), lineDiff(natDuring, natBefore))
			}
			// A new connection that starts during the failing or the
			// repairing restore sometimes times out (1 of ~40 seen, in
			// both backends; not explained yet): counted in the figures,
			// not failed on.
			return done.Sub(off), true
		},
	},
	{
		// Another program holds the xtables lock (legacy backend) longer
		// than kproxy waits for it (5 s). The lock file is the test's own
		// (XTABLES_LOCKFILE, which kproxy and iptables both read), so the
		// host's /run/xtables.lock is never held.
		name:  "xtables lock held past the wait",
		modes: []proxyMode{iptablesMode(xtables.Legacy)},
		run: func(f *faultEnv) (time.Duration, bool) {
			const held = 14 * time.Second
			lock := filepath.Join(f.dir, "xtables.lock")
			holder := netns.StartProcess(f.t, f.c.Nodes[nodeA].NS, "lock-holder", f.dir,
				"flock", lock, "sleep", strconv.Itoa(int(held/time.Second)))
			netns.Eventually(f.t, 5*time.Second, "the lock held", func() (bool, string) {
				err := exec.Command("flock", "-n", lock, "true").Run()
				return err != nil, "lock free"
			})
			on := f.w.mark("lock taken")
			f.change()
			f.w.waitHealth("lock held", 503, on, syncTimeout)
			f.notApplied("lock held")
			netns.Eventually(f.t, held+5*time.Second, "the holder exits", func() (bool, string) {
				done, _ := holder.Exited()
				return done, "still holding"
			})
			off := f.w.mark("lock released")
			done := f.waitApplied("lock released")
			f.w.waitHealth("lock released", 200, off, syncTimeout)
			if !strings.Contains(f.c.kproxy[nodeA].Log(), "held by another program") {
				f.t.Errorf("kproxy's log does not say the lock was held")
			}
			return done.Sub(off), false
		},
	},
	{
		// Netlink refuses every nftables transaction (a kproxy built with
		// the faultinject tag, whose fault file the test fills and
		// empties).
		name:  "netlink errors",
		modes: []proxyMode{nftablesMode},
		prepare: func(f *faultEnv) {
			if kproxyFaultBin == "" {
				f.t.Skip("kproxy with fault injection was not built (KPROXY_KERNEL_TEST_BIN is set)")
			}
			f.bin = kproxyFaultBin
			f.env = append(f.env, "KPROXY_FAULT_REFUSE_FILE="+filepath.Join(f.dir, "refuse"))
		},
		run: func(f *faultEnv) (time.Duration, bool) {
			refuse := filepath.Join(f.dir, "refuse")
			if err := os.WriteFile(refuse, []byte("*"), 0o644); err != nil {
				f.t.Fatal(err)
			}
			on := f.w.mark("fault on")
			f.change()
			f.w.waitHealth("netlink failing", 503, on, syncTimeout)
			time.Sleep(faultSyncPeriod)
			f.notApplied("netlink failing")
			if err := os.WriteFile(refuse, nil, 0o644); err != nil {
				f.t.Fatal(err)
			}
			off := f.w.mark("fault off")
			done := f.waitApplied("netlink working again")
			f.w.waitHealth("netlink working again", 200, off, syncTimeout)
			return done.Sub(off), false
		},
	},
	{
		// kproxy's PATH is one directory of symlinks to the tools. They
		// disappear while kproxy runs (the next sync fails), come back
		// (repaired), and are missing when it starts: iptables mode
		// exits naming the tool and a supervisor restarts it once they
		// are back; nftables mode talks netlink and needs none of them.
		name:  "nft and iptables binaries missing",
		modes: allModes,
		prepare: func(f *faultEnv) {
			bin := filepath.Join(f.dir, "bin")
			if err := os.Mkdir(bin, 0o755); err != nil {
				f.t.Fatal(err)
			}
			linkTools(f.t, bin)
			f.env = append(f.env, "PATH="+bin)
		},
		run: func(f *faultEnv) (time.Duration, bool) {
			bin := filepath.Join(f.dir, "bin")
			unlink := func() {
				ents, _ := os.ReadDir(bin)
				for _, e := range ents {
					if err := os.Remove(filepath.Join(bin, e.Name())); err != nil {
						f.t.Fatal(err)
					}
				}
			}
			// Disappearing while kproxy runs.
			unlink()
			on := f.w.mark("tools gone")
			f.change()
			if f.m.iptables {
				f.w.waitHealth("tools gone", 503, on, syncTimeout)
				f.notApplied("tools gone")
			} else {
				f.waitApplied("tools gone (netlink needs none)")
				f.w.healthNever("tools gone (nftables)", 503, on)
			}
			linkTools(f.t, bin)
			off := f.w.mark("tools back")
			done := f.waitApplied("tools back")
			f.w.waitHealth("tools back", 200, off, syncTimeout)
			repair := done.Sub(off)

			// Missing at start.
			p := f.c.kproxy[nodeA]
			if err := p.Kill(); err != nil {
				f.t.Fatal(err)
			}
			unlink()
			// web-b back in web-nodeport: a change to program.
			f.snap = exampleSnapshot(f.t)
			f.c.apply(f.snap)
			f.w.mark("restart without tools")
			if err := p.Restart(f.c.Nodes[nodeA].NS, f.c.kproxyArgs(nodeA)...); err != nil {
				f.t.Fatal(err)
			}
			if f.m.iptables {
				netns.Eventually(f.t, syncTimeout, "kproxy exits without its tools", func() (bool, string) {
					done, _ := p.Exited()
					return done, "still running"
				})
				if !strings.Contains(p.Log(), "restore") {
					f.t.Errorf("kproxy's exit does not name the missing tool:\n%s", p.Tail(10))
				}
				f.notAppliedBack("tools missing at start")
				linkTools(f.t, bin)
				f.w.mark("tools back, restarted")
				f.c.restartKproxy(nodeA)
			} else {
				f.c.waitSynced(nodeA)
				linkTools(f.t, bin)
			}
			netns.Eventually(f.t, syncTimeout, "web-b back in web-nodeport", func() (bool, string) {
				return !f.changeApplied(), "not yet"
			})
			return repair, false
		},
	},
	{
		// Someone deletes kproxy's rules between syncs: nftables mode's
		// IPv4 table, or iptables mode's KUBE-SERVICES (flushed) and a
		// service chain (flushed). /healthz stays 200 and kproxy repairs
		// the rules with a full sync of that family. New connections to
		// the hit services fail until then; established ones keep their
		// conntrack NAT and survive.
		name:  "kproxy rules deleted between syncs",
		modes: allModes,
		run: func(f *faultEnv) (time.Duration, bool) {
			node := f.c.Nodes[nodeA].NS
			var argv [][]string
			if f.m.iptables {
				ipt := "iptables-" + strings.TrimPrefix(f.m.name, "iptables-")
				d, err := f.c.mode.dump(node)
				if err != nil {
					f.t.Fatal(err)
				}
				svc := regexp.MustCompile(`-A KUBE-SERVICES .*--comment "?demo/web-clusterip:http cluster IP"? .*-j (KUBE-SVC-\S+)`).FindStringSubmatch(d)
				if svc == nil {
					f.t.Fatalf("no KUBE-SVC chain of web-clusterip in:\n%s", d)
				}
				// The node's private xtables lock (see start), not the
				// host's, which other tests may hold.
				lock := "XTABLES_LOCKFILE=" + filepath.Join(f.dir, "xtables.lock")
				argv = [][]string{{"env", lock, ipt, "-w", "5", "-t", "nat", "-F", svc[1]}, {"env", lock, ipt, "-w", "5", "-t", "nat", "-F", "KUBE-SERVICES"}}
			} else {
				argv = [][]string{{"nft", "delete", "table", "ip", "kube-proxy"}}
			}
			before := time.Now()
			for _, a := range argv {
				if out, err := node.Exec(10*time.Second, a...); err != nil {
					f.t.Fatalf("%v: %v\n%s", a, err, out)
				}
			}
			off := f.w.mark("rules deleted")
			var repaired time.Time
			netns.Eventually(f.t, 3*faultSyncPeriod+syncTimeout, "web-clusterip answers again", func() (bool, string) {
				r := f.c.Client.Request("tcp", ap("198.19.0.10:80"), netns.DialOptions{Timeout: 300 * time.Millisecond})
				repaired = time.Now()
				return r.Outcome == netns.Answered, r.String()
			})
			f.w.mark("repaired")
			f.w.healthNever("rules deleted (kproxy cannot know)", 503, before)
			f.c.run(f.t, probe{from: testerA, network: "tcp", dst: "198.19.0.11:80", servers: web, every: true, peer: peerOwn})
			return repaired.Sub(off), true
		},
	},
	{
		// SIGKILL while kproxy programs 2,000 new services (a long sync),
		// then a restart, as a supervisor would. While it is down nothing
		// serves /healthz (connection refused: no false 200); the
		// restarted kproxy programs everything.
		name:  "SIGKILL in the middle of a sync",
		modes: allModes,
		run: func(f *faultEnv) (time.Duration, bool) {
			p := f.c.kproxy[nodeA]
			addServices(f.t, f.snap, 2000)
			f.c.apply(f.snap)
			// The file source notices within ~1 s and the sync follows;
			// kill 50 ms after the reread, and tell from the log whether
			// that sync had finished.
			reread := regexp.MustCompile(`Reread object files.*changes=[0-9]{4}`)
			deadline := time.Now().Add(bigSyncTimeout)
			for !reread.MatchString(p.Log()) && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			time.Sleep(50 * time.Millisecond)
			if err := p.Kill(); err != nil {
				f.t.Fatal(err)
			}
			off := f.w.mark("killed")
			log := p.Log()
			i := reread.FindStringIndex(log)
			if i == nil {
				f.t.Fatalf("kproxy never read the 2,000 services:\n%s", p.Tail(20))
			}
			mid := !strings.Contains(log[i[1]:], `"Synced"`)
			f.t.Logf("killed in the middle of the sync: %v", mid)
			f.w.mark(fmt.Sprintf("mid-sync=%v", mid))
			if h := f.w.healthPolledAfter(off); h.code != 0 {
				f.t.Errorf("/healthz answered %d with kproxy dead", h.code)
			}
			if err := p.Restart(f.c.Nodes[nodeA].NS, f.c.kproxyArgs(nodeA)...); err != nil {
				f.t.Fatal(err)
			}
			netns.Eventually(f.t, bigSyncTimeout, "the restarted kproxy serves the 2,000 services", func() (bool, string) {
				r := f.c.Pod(f.t, testerA).NS.Request("tcp", ap("198.19.19.200:80"), netns.DialOptions{Timeout: 500 * time.Millisecond})
				return r.Outcome == netns.Answered, r.String()
			})
			f.c.waitSynced(nodeA)
			f.w.mark("restarted")
			f.c.run(f.t, probe{from: testerA, network: "tcp", dst: "198.19.10.1:80", servers: web, every: true, peer: peerOwn})
			f.c.run(f.t, probe{from: client, network: "tcp", dst: "198.19.19.200:80", n: 3, servers: web})
			return time.Since(off), false
		},
	},
	{
		// The node's IP changes: the Node's InternalIP and the address on
		// its interface (198.18.0.10 → 198.18.0.12; the client's service
		// route and node-b's route to node-a's pods follow, as a CNI
		// would). nftables mode's node ports (primary IPs) and the health
		// check node port of etp-local move to the new address.
		name:  "the node's IP changes",
		modes: allModes,
		prepare: func(f *faultEnv) {
			f.args = append(f.args, "--healthz-bind-address", "0.0.0.0:10256")
		},
		run: func(f *faultEnv) (time.Duration, bool) {
			node := f.c.Nodes[nodeA].NS
			oldIP, newIP := ip("198.18.0.10"), ip("198.18.0.12")
			// Without promote_secondaries, deleting the old (primary)
			// address would delete the new one of the same subnet too.
			if err := node.Sysctl("net.ipv4.conf.eth0.promote_secondaries", "1"); err != nil {
				f.t.Fatal(err)
			}
			if err := node.AddAddr("eth0", netip.PrefixFrom(newIP, 24)); err != nil {
				f.t.Fatal(err)
			}
			f.snap.editNode(f.t, nodeA, func(addrs []string) []string {
				return slices.Insert(slices.DeleteFunc(addrs, func(a string) bool { return a == oldIP.String() }), 0, newIP.String())
			})
			f.c.apply(f.snap)
			for _, c := range []struct {
				ns   *netns.NS
				argv []string
			}{
				{f.c.Client, []string{"ip", "route", "replace", "198.19.0.0/16", "via", newIP.String()}},
				{f.c.Nodes[nodeB].NS, []string{"ip", "route", "replace", "198.18.129.0/24", "via", newIP.String()}},
				{node, []string{"ip", "addr", "del", netip.PrefixFrom(oldIP, 24).String(), "dev", "eth0"}},
			} {
				if out, err := c.ns.Exec(10*time.Second, c.argv...); err != nil {
					f.t.Fatalf("%v: %v\n%s", c.argv, err, out)
				}
			}
			off := f.w.mark("IP changed")
			f.w.setHealthURL("http://" + netip.AddrPortFrom(newIP, 10256).String() + "/healthz")
			var done time.Time
			netns.Eventually(f.t, syncTimeout, "NodePort 30080 on the new IP", func() (bool, string) {
				r := f.c.Client.Request("tcp", netip.AddrPortFrom(newIP, 30080), netns.DialOptions{Timeout: 500 * time.Millisecond})
				done = time.Now()
				return r.Outcome == netns.Answered, r.String()
			})
			netns.Eventually(f.t, syncTimeout, "etp-local's health check on the new IP", func() (bool, string) {
				code, body, err := f.c.Client.HTTPGet("http://"+netip.AddrPortFrom(newIP, 32081).String()+"/", time.Second)
				return err == nil && code == 200 && strings.Contains(body, `"localEndpoints": 1`), fmt.Sprintf("%d %v %s", code, err, body)
			})
			// Masqueraded to the new address (or cbr0's for web-a), which
			// the cluster helper does not know: not checked.
			f.c.run(f.t, probe{from: client, network: "tcp", dst: netip.AddrPortFrom(newIP, 30080).String(), servers: web, every: true})
			return done.Sub(off), false
		},
	},
}
