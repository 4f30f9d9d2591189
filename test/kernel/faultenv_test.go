package kernel

// faultEnv: the cluster a fault case runs in (kproxy on node-a only), the
// change a sync must program while the fault lasts (web-b leaves
// web-nodeport, 198.19.0.11:80), and the node-side tools the cases use:
// the real netfilter binaries, iptables-save's nat table and a line diff.
// Addresses are the example's; see faults_test.go.

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/testutil/netns"
)

// faultEnv is what a fault case adds to a proxy mode and cluster.
type faultEnv struct {
	t   *testing.T
	m   proxyMode
	dir string
	// env and args are added to kproxy's; bin replaces it.
	env, args []string
	bin       string
	// cgroup is the cgroup v2 directory kproxy starts in.
	cgroup string
	snap   *snapshot
	c      *kcluster
	w      *faultWatch
}

// start builds the cluster with kproxy on node-a and starts the watch.
func (f *faultEnv) start() {
	f.t.Helper()
	m := f.m
	// A private xtables lock: other tests on this host (and other
	// people's) take /run/xtables.lock; waiting for them is not the
	// fault under test.
	env := []string{"XTABLES_LOCKFILE=" + filepath.Join(f.dir, "xtables.lock")}
	m.env = append(append(slices.Clone(m.env), env...), f.env...)
	if f.snap == nil {
		f.snap = exampleSnapshot(f.t)
	}
	f.c = newCluster(f.t, clusterOptions{mode: m, snapshot: f.snap, kproxyOn: []string{nodeA}, bin: f.bin, cgroup: f.cgroup,
		args: append([]string{"--iptables-sync-period", faultSyncPeriod.String()}, f.args...)})
	f.w = watchFaults(f.t, f.c)
	f.w.waitHealth("start", 200, time.Time{}, syncTimeout)
}

// change makes a change a sync must program: web-b leaves web-nodeport.
func (f *faultEnv) change() {
	f.t.Helper()
	f.snap.removeEndpoint(f.t, "web-nodeport", webB)
	f.c.apply(f.snap)
}

// changeApplied reports whether the node's rules have the change.
func (f *faultEnv) changeApplied() bool {
	d, err := f.c.mode.dump(f.c.Nodes[nodeA].NS)
	return err == nil && !f.c.mode.routesTo(d, "demo/web-nodeport/tcp/http", f.c.Pod(f.t, webB).IP(clientIP))
}

// notApplied checks, a while into the fault, that the change is not in
// the rules and the old rules still serve it.
func (f *faultEnv) notApplied(what string) {
	f.t.Helper()
	if f.changeApplied() {
		f.t.Errorf("%s: the change was applied while the fault lasts", what)
	}
	f.c.run(f.t, probe{from: testerA, network: "tcp", dst: "198.19.0.11:80", servers: web, every: true, peer: peerOwn})
}

// waitApplied waits for the change and returns when it was seen.
func (f *faultEnv) waitApplied(what string) time.Time {
	f.t.Helper()
	netns.Eventually(f.t, syncTimeout+2*faultSyncPeriod, what+": the change applied", func() (bool, string) {
		return f.changeApplied(), "not yet"
	})
	return time.Now()
}

// realPath resolves a tool in the test's own PATH.
func realPath(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Skipf("%s not installed: %v", name, err)
	}
	return p
}

// notAppliedBack checks that web-nodeport still lacks web-b (kproxy is
// down, the old rules serve).
func (f *faultEnv) notAppliedBack(what string) {
	f.t.Helper()
	if !f.changeApplied() {
		f.t.Errorf("%s: the rules changed with kproxy down", what)
	}
	f.c.run(f.t, probe{from: testerA, network: "tcp", dst: "198.19.0.11:80", n: 5, servers: []string{webA}, peer: peerOwn})
}

// linkTools fills dir with symlinks to the netfilter tools kproxy may run.
func linkTools(t *testing.T, dir string) {
	t.Helper()
	for _, name := range []string{
		"nft", "conntrack", "modprobe",
		"iptables", "ip6tables", "iptables-save", "ip6tables-save", "iptables-restore", "ip6tables-restore",
		"iptables-legacy", "ip6tables-legacy", "iptables-legacy-save", "ip6tables-legacy-save", "iptables-legacy-restore", "ip6tables-legacy-restore",
		"iptables-nft", "ip6tables-nft", "iptables-nft-save", "ip6tables-nft-save", "iptables-nft-restore", "ip6tables-nft-restore",
	} {
		p, err := exec.LookPath(name)
		if err != nil {
			continue
		}
		if err := os.Symlink(p, filepath.Join(dir, name)); err != nil && !os.IsExist(err) {
			t.Fatal(err)
		}
	}
}

// iptablesNat is the node's IPv4 nat table without counters.
func iptablesNat(t *testing.T, n *netns.NS, m proxyMode) string {
	t.Helper()
	save := "iptables-" + strings.TrimPrefix(m.name, "iptables-") + "-save"
	out, err := n.Exec(10*time.Second, save, "-t", "nat")
	if err != nil {
		t.Fatal(err)
	}
	var keep []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "#") {
			continue
		}
		if strings.HasPrefix(l, ":") {
			// ":CHAIN POLICY [packets:bytes]"
			if i := strings.LastIndex(l, " ["); i > 0 {
				l = l[:i]
			}
		}
		keep = append(keep, l)
	}
	return strings.Join(keep, "\n")
}

// lineDiff lists the lines only in a (-) and only in b (+).
func lineDiff(a, b string) string {
	in := func(s string) map[string]bool {
		m := map[string]bool{}
		for _, l := range strings.Split(s, "\n") {
			m[l] = true
		}
		return m
	}
	ma, mb := in(a), in(b)
	var out []string
	for _, l := range strings.Split(a, "\n") {
		if !mb[l] {
			out = append(out, "-"+l)
		}
	}
	for _, l := range strings.Split(b, "\n") {
		if !ma[l] {
			out = append(out, "+"+l)
		}
	}
	return strings.Join(out, "\n")
}
