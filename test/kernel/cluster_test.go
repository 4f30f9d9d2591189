package kernel

// Address plan (the example's, internal/example/example.yaml), used only
// inside the test namespaces:
//
//   198.18.0.0/24, fd00:18::/64        the LAN: client .100/::100, node-a .10/::10, node-b .11/::11
//   198.18.129.0/24, fd00:18:1:a::/64  node-a's pods, gateway (cbr0) .1/::1
//   198.18.130.0/24, fd00:18:1:b::/64  node-b's pods, gateway (cbr0) .1/::1
//   198.18.128.0/17, fd00:18:1::/48    the cluster CIDR given to kproxy
//   198.19.0.0/16, fd00:19::/112       service cluster IPs
//   198.19.200.0/24, fd00:19::c8:0/112 external and load balancer IPs
//   203.0.113.100/24                   the client's second address, a source
//                                      for loadBalancerSourceRanges tests
//   198.19.200.2/32                    on the client's loopback: the "load
//                                      balancer" of the ipMode Proxy ingress
//
// Pods are made from the snapshot's endpoints (one namespace per targetRef
// pod, named after it, on its nodeName, serving every TCP and UDP port its
// slices list), plus two pods that only send: tester-a (198.18.129.200,
// fd00:18:1:a::200) on node-a and tester-b (198.18.130.200,
// fd00:18:1:b::200) on node-b.

import (
	"cmp"
	"fmt"
	"github.com/kproxy/kproxy/internal/testutil/vm"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/proxy/nftables"
	"github.com/kproxy/kproxy/internal/testutil/netns"
	nfttrace "github.com/kproxy/kproxy/internal/trace/nftables"
)

const (
	nodeA   = "node-a"
	nodeB   = "node-b"
	testerA = "tester-a"
	testerB = "tester-b"
	client  = "client"
	// lbProxy answers on the client at the ipMode Proxy ingress IP.
	lbProxy = "lb-proxy"
)

// Pods of the example, by the name of their targetRef.
const (
	webA      = "web-6f7c9d-a1b2c"
	webB      = "web-6f7c9d-d3e4f"
	shopA     = "shop-58d4b7-k2m9x"
	shopB     = "shop-58d4b7-q7w3z"
	logger    = "logger-n5x2q"
	sessionA  = "session-7c6d5f-f4g8h"
	sessionB  = "session-7c6d5f-j2l6m"
	dualA     = "dual-84f6c9-s3d7f"
	dualB     = "dual-84f6c9-w9e2r"
	dnsA      = "dns-5b8c7d-a8s4d"
	dnsB      = "dns-5b8c7d-f6g1h"
	drainingA = "draining-6d9f8b-r5t1y"
	drainingB = "draining-6d9f8b-u8i2o"
	topoA1    = "topo-79c5d8-a2s6d"
	topoA2    = "topo-79c5d8-f3g7h"
	topoB1    = "topo-79c5d8-j4k8l"
	topoB2    = "topo-79c5d8-z5x9c"
)

var (
	pfx = netip.MustParsePrefix
	ip  = netip.MustParseAddr
	ap  = netip.MustParseAddrPort

	clientIP = ip("198.18.0.100")
	// clientAlt is the client's second address, outside the node range.
	clientAlt   = ip("203.0.113.100")
	lbProxyIP   = ip("198.19.200.2")
	clusterCIDR = "198.18.128.0/17,fd00:18:1::/48"
)

func clusterSpec(pods []podInfo) netns.ClusterSpec {
	spec := netns.ClusterSpec{
		Nodes: []netns.NodeSpec{
			{Name: nodeA, Addrs: []netip.Prefix{pfx("198.18.0.10/24"), pfx("fd00:18::10/64")},
				PodCIDRs: []netip.Prefix{pfx("198.18.129.0/24"), pfx("fd00:18:1:a::/64")}},
			{Name: nodeB, Addrs: []netip.Prefix{pfx("198.18.0.11/24"), pfx("fd00:18::11/64")},
				PodCIDRs: []netip.Prefix{pfx("198.18.130.0/24"), pfx("fd00:18:1:b::/64")}},
		},
		Client: netns.ClientSpec{
			Addrs: []netip.Prefix{pfx("198.18.0.100/24"), pfx("fd00:18::100/64"), pfx("203.0.113.100/24")},
			ServiceRoutes: []netip.Prefix{
				pfx("198.19.0.0/16"), pfx("fd00:19::/112"), pfx("fd00:19::c8:0/112"),
			},
			Via: nodeA,
		},
		Pods: []netns.PodSpec{
			{Name: testerA, Node: nodeA, IPs: []netip.Addr{ip("198.18.129.200"), ip("fd00:18:1:a::200")}},
			{Name: testerB, Node: nodeB, IPs: []netip.Addr{ip("198.18.130.200"), ip("fd00:18:1:b::200")}},
		},
	}
	for _, p := range pods {
		spec.Pods = append(spec.Pods, netns.PodSpec{Name: p.name, Node: p.node, IPs: p.ips})
	}
	return spec
}

// proxyMode is what the tests need to know of a proxy mode: its name and
// how to read its rules. Only nftables exists so far; iptables and ipvs get
// their own value.
type proxyMode struct {
	// name names the subtests; flag is --proxy-mode (name when empty).
	name, flag string
	// env is set for kproxy (IPTABLES_MODE); args are added to its flags.
	env, args []string
	// needs lists binaries the mode's tests cannot run without.
	needs []string
	// iptables is true for both iptables backends: what upstream's
	// iptables mode does differently from nftables mode (node ports on
	// every local address, no reject of undefined ClusterIP ports).
	// ipvs mode has it too (its rules are iptables rules as well).
	iptables bool
	// ipvs is true in ipvs mode, where upstream differs from iptables
	// mode (probe.ipvs says how).
	ipvs bool
	// dump returns the node's rules in the mode's own syntax.
	dump func(n *netns.NS) (string, error)
	// routesTo reports whether the rules in dump send traffic of the
	// service port ("demo/dns-udp/udp/dns") to the endpoint IP.
	routesTo func(dump, servicePort string, endpoint netip.Addr) bool
}

var nftablesMode = proxyMode{
	name: "nftables",
	dump: func(n *netns.NS) (string, error) {
		var b strings.Builder
		// The main table and its shard tables (services' dispatch).
		for _, fam := range []string{"ip", "ip6"} {
			list, err := n.Exec(10*time.Second, "nft", "list", "tables", fam)
			if err != nil {
				return b.String(), err
			}
			var tables []string
			for _, l := range strings.Split(list, "\n") {
				if name, ok := strings.CutPrefix(strings.TrimSpace(l), "table "+fam+" "); ok {
					tables = append(tables, name)
				}
			}
			slices.Sort(tables)
			for _, t := range nftables.OurTables(nftables.DefaultTableName, tables) {
				out, err := n.Exec(10*time.Second, "nft", "list", "table", fam, t)
				if err != nil {
					return b.String(), err
				}
				b.WriteString(out)
			}
		}
		return b.String(), nil
	},
	routesTo: func(dump, servicePort string, endpoint netip.Addr) bool {
		// A service port's policy chains (service-HASH-<ns>/<svc>/<proto>/<port>,
		// and local-… for traffic policy Local) DNAT to the endpoints:
		// directly, or (without session affinity) through the keys
		// "numgen random mod N offset O" draws in an endpoint map. A
		// partial sync inserts a chain's new rules at its head, closed by
		// "return", above the old ones until the next full sync: only the
		// rules before the first "return" are live. The dump is read with
		// the tracer's parser: one element per line, offsets spelled out.
		rs, err := nfttrace.ParseNFT(dump)
		if err != nil {
			return false
		}
		flat := strings.Split(rs.String(), "\n")
		target := "dnat to " + netip.AddrPortFrom(endpoint, 0).String()
		target = strings.TrimSuffix(target, ":0") + ":"
		elemRE := regexp.MustCompile(`^add element ip6? (\S+) (endpoints-\S+) \{ (\d+) : (\S+) \. \d+ \}$`)
		mapRE := regexp.MustCompile(`numgen random mod (\d+) offset (\d+) map @(\S+)`)
		eps := map[string]string{} // "TABLE MAP KEY" -> address
		for _, l := range flat {
			if m := elemRE.FindStringSubmatch(l); m != nil {
				eps[m[1]+" "+m[2]+" "+m[3]] = m[4]
			}
		}
		// A plain ClusterIP port (no chain of its own) has an element
		// "ADDR . PROTO . PORT comment NAME : goto cluster/PROTO/N" in
		// its shard's cluster-services map, and after partial syncs in
		// cluster-services-new or -newer (looked up first), and keys
		// "ADDR . PORT . 0" … "ADDR . PORT . N-1" in the matching
		// cluster-endpoints[-new|-newer]-PROTO map.
		if parts := strings.Split(servicePort, "/"); len(parts) == 4 {
			name := parts[0] + "/" + parts[1] + ":" + parts[3] + "/" + strings.ToUpper(parts[2])
			if parts[3] == "" {
				name = parts[0] + "/" + parts[1] + "/" + strings.ToUpper(parts[2])
			}
			svcRE := regexp.MustCompile(`^add element ip6? (\S+) cluster-services(-new|-newer)? \{ (\S+) \. \S+ \. (\d+) comment "` + regexp.QuoteMeta(name) + `" : goto cluster/\S+/(\d+) \}$`)
			type plainElem struct{ table, vip, port, n string }
			found := map[string]*plainElem{}
			for _, l := range flat {
				if m := svcRE.FindStringSubmatch(l); m != nil {
					found[m[2]] = &plainElem{m[1], m[3], m[4], m[5]}
				}
			}
			tier := ""
			for _, t := range []string{"-new", "-newer"} {
				if found[t] != nil {
					tier = t
				}
			}
			if e := found[tier]; e != nil {
				m := "cluster-endpoints" + tier + "-" + parts[2]
				keyRE := regexp.MustCompile(`^add element ip6? ` + regexp.QuoteMeta(e.table+" "+m) + ` \{ ` + regexp.QuoteMeta(e.vip+" . "+e.port) + ` \. (\d+) : (\S+) \. \d+ \}$`)
				n, _ := strconv.Atoi(e.n)
				for _, l := range flat {
					if k := keyRE.FindStringSubmatch(l); k != nil {
						if i, _ := strconv.Atoi(k[1]); i < n && k[2] == endpoint.String() {
							return true
						}
					}
				}
				return false
			}
		}
		chainRE := regexp.MustCompile(`^add rule ip6? (\S+) ((service|local)-[A-Z0-9]+-` + regexp.QuoteMeta(servicePort) + `) (.*)$`)
		returned := map[string]bool{}
		for _, l := range flat {
			m := chainRE.FindStringSubmatch(l)
			if m == nil || returned[m[2]] {
				continue
			}
			body := m[4]
			if body == "return" {
				returned[m[2]] = true
				continue
			}
			if strings.Contains(body, target) {
				return true
			}
			if g := mapRE.FindStringSubmatch(body); g != nil {
				n, _ := strconv.Atoi(g[1])
				off, _ := strconv.Atoi(g[2])
				for k := off; k < off+n; k++ {
					if eps[m[1]+" "+g[3]+" "+strconv.Itoa(k)] == endpoint.String() {
						return true
					}
				}
			}
		}
		return false
	},
}

// nodeStates are the two starts a robustness test runs from: the objects
// under test in the first snapshot (a fresh node: kproxy's first, full
// sync), or arriving while kproxy runs (a running node: a partial sync).
var nodeStates = []struct {
	name    string
	atStart bool
}{{"fresh node", true}, {"running node", false}}

// kcluster is a cluster with kproxy running on some nodes.
type kcluster struct {
	*netns.Cluster
	t    *testing.T
	mode proxyMode
	// snapPath is the snapshot file kproxy reads; it sits alone in its
	// directory (kproxy watches the directory).
	snapPath string
	// fromDir makes kproxy read snapPath's directory, not the file.
	fromDir bool
	// args are added to kproxy's flags after the mode's.
	args    []string
	logDir  string
	kproxy  map[string]*netns.Process
	servers map[string][]*netns.EchoServer
	// bin is the kproxy binary (kproxyBin unless clusterOptions say).
	bin string
	// cgroup is where kproxy starts (clusterOptions.cgroup).
	cgroup string
}

type clusterOptions struct {
	// mode defaults to nftables.
	mode proxyMode
	// snapshot defaults to the example.
	snapshot *snapshot
	// kproxyOn lists the nodes that run kproxy; nil means both.
	kproxyOn []string
	// bin is the kproxy binary to run; "" means kproxyBin.
	bin string
	// fromDir gives kproxy the snapshot's directory (--from-file DIR).
	fromDir bool
	// args are more kproxy flags.
	args []string
	// files are more files (name → content) put beside the snapshot
	// before kproxy starts (with fromDir, kproxy reads them too).
	files map[string][]byte
	// cgroup is the cgroup v2 directory kproxy starts in ("": the test's).
	cgroup string
}

// newCluster builds a fresh cluster for the test, starts the echo servers
// and kproxy, and waits for kproxy's first sync.
func newCluster(t *testing.T, o clusterOptions) *kcluster {
	t.Helper()
	requireKernel(t)
	snap := o.snapshot
	if snap == nil {
		snap = exampleSnapshot(t)
	}
	pods := snap.pods(t)
	if o.mode.name == "" {
		o.mode = nftablesMode
	}
	c := &kcluster{
		Cluster: netns.NewCluster(t, clusterSpec(pods)),
		t:       t,
		mode:    o.mode,
		fromDir: o.fromDir,
		args:    o.args,
		logDir:  t.TempDir(),
		kproxy:  map[string]*netns.Process{},
		servers: map[string][]*netns.EchoServer{},
		bin:     cmp.Or(o.bin, kproxyBin),
		cgroup:  o.cgroup,
	}
	c.snapPath = filepath.Join(t.TempDir(), "snapshot.yaml")
	for _, p := range pods {
		for _, pp := range p.ports {
			proto, port, _ := strings.Cut(pp, "/")
			n, _ := strconv.Atoi(port)
			c.servers[p.name] = append(c.servers[p.name], netns.ServeEcho(t, c.Pods[p.name].NS, p.name, proto, n))
		}
	}
	// The load balancer behind the ipMode Proxy ingress IP lives on the
	// client, the LAN's router, where nodes send what they do not capture.
	if err := c.Client.AddAddr("lo", netip.PrefixFrom(lbProxyIP, 32)); err != nil {
		t.Fatal(err)
	}
	netns.ServeEcho(t, c.Client, lbProxy, "tcp", 443)

	snap.writeTo(t, c.snapPath)
	for name, data := range o.files {
		if err := os.WriteFile(filepath.Join(filepath.Dir(c.snapPath), name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	nodes := o.kproxyOn
	if nodes == nil {
		nodes = []string{nodeA, nodeB}
	}
	for _, n := range nodes {
		c.startKproxy(n)
	}
	for _, n := range nodes {
		c.waitSynced(n)
	}
	t.Cleanup(func() {
		if t.Failed() && os.Getenv("KPROXY_KERNEL_TEST_DUMP") != "" {
			for _, n := range nodes {
				d, err := c.mode.dump(c.Nodes[n].NS)
				t.Logf("rules on %s (err %v):\n%s", n, err, d)
			}
		}
	})
	return c
}

// kproxyArgs is kproxy's command line on a node.
func (c *kcluster) kproxyArgs(node string) []string {
	n := c.Nodes[node]
	flag := c.mode.flag
	if flag == "" {
		flag = c.mode.name
	}
	from := c.snapPath
	if c.fromDir {
		from = filepath.Dir(c.snapPath)
	}
	var argv []string
	if len(c.mode.env) > 0 {
		argv = append([]string{"env"}, c.mode.env...)
	}
	return append(append(argv, c.bin,
		"--proxy-mode", flag,
		"--hostname-override", node,
		"--from-file", from,
		"--cluster-cidr", clusterCIDR,
		"--healthz-bind-address", netip.AddrPortFrom(n.Addr(clientIP), 10256).String(),
		"--metrics-bind-address", "127.0.0.1:10249",
		// nf_conntrack_max is global and read-only in a node namespace:
		// on a host with many CPUs the default (32768 per CPU) is above
		// its value and kproxy, like kube-proxy, would fail to raise it.
		// kind's kube-proxy config sets the same for the same reason.
		"--conntrack-max-per-core", "0",
		"-v", "2",
	), append(slices.Clone(c.mode.args), c.args...)...)
}

func (c *kcluster) startKproxy(node string) {
	c.t.Helper()
	c.kproxy[node] = netns.StartProcessIn(c.t, c.Nodes[node].NS, c.cgroup, "kproxy-"+node, c.logDir, c.kproxyArgs(node)...)
}

// restartKproxy starts kproxy again on a node after it was stopped or
// killed, and waits for its first sync.
func (c *kcluster) restartKproxy(node string) {
	c.t.Helper()
	if err := c.kproxy[node].Restart(c.Nodes[node].NS, c.kproxyArgs(node)...); err != nil {
		c.t.Fatal(err)
	}
	c.waitSynced(node)
}

// syncTimeout bounds every wait for kproxy to program a change: the file
// source notices a change within ~1 s, the sync follows at once. In the
// test VM (emulated, no KVM here) everything is several times slower, and
// much more when the host is busy (the end-to-end tests run beside): a
// first sync in iptables-legacy mode took over 45 s there.
var syncTimeout = func() time.Duration {
	if vm.InVM() {
		return 2 * time.Minute
	}
	return 15 * time.Second
}()

// waitSynced waits until kproxy on the node has synced both IP families
// (its sync_proxy_rules_last_timestamp_seconds metric is set for each), and
// fails early if kproxy exited.
func (c *kcluster) waitSynced(node string) {
	c.t.Helper()
	n, p := c.Nodes[node], c.kproxy[node]
	netns.Eventually(c.t, syncTimeout, "kproxy's first sync on "+node, func() (bool, string) {
		if done, err := p.Exited(); done {
			c.t.Fatalf("kproxy on %s exited: %v\n%s", node, err, p.Tail(netns.LogTailLines))
		}
		code, body, err := n.HTTPGet("http://127.0.0.1:10249/metrics", 2*time.Second)
		if err != nil || code != 200 {
			return false, fmt.Sprintf("metrics: %d %v", code, err)
		}
		for _, fam := range []string{"IPv4", "IPv6"} {
			if !metricPositive(body, `kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="`+fam+`"}`) {
				return false, "no " + fam + " sync yet"
			}
		}
		return true, ""
	})
}

// oldModesRemovedLine is what kproxy logs once it removed the rules of the
// mode the node ran before (after its first sync of every IP family).
const oldModesRemovedLine = "Removed the rules of the mode this node ran before"

// waitOldModesRemoved waits until the current kproxy run on the node has
// removed the other modes' rules: a test that writes such rules itself
// must wait for it, or kproxy may remove them too.
func (c *kcluster) waitOldModesRemoved(node string) {
	c.t.Helper()
	p := c.kproxy[node]
	netns.Eventually(c.t, syncTimeout, "kproxy's removal of the other modes' rules on "+node, func() (bool, string) {
		log := p.Log()
		run := log[max(strings.LastIndex(log, "==== "), 0):]
		return strings.Contains(run, oldModesRemovedLine), "not logged yet"
	})
}

// metricPositive reports whether the metric line (name with labels) has a
// value above zero.
func metricPositive(body, series string) bool {
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return err == nil && f > 0
		}
	}
	return false
}

// waitRules waits until cond holds for the node's rules.
func (c *kcluster) waitRules(node, what string, cond func(dump string) bool) {
	c.t.Helper()
	netns.Eventually(c.t, syncTimeout, what+" on "+node, func() (bool, string) {
		d, err := c.mode.dump(c.Nodes[node].NS)
		if err != nil {
			return false, err.Error()
		}
		return cond(d), "rules not there yet"
	})
}

// apply replaces the snapshot kproxy reads.
func (c *kcluster) apply(s *snapshot) {
	c.t.Helper()
	s.writeTo(c.t, c.snapPath)
}

// ns returns the namespace called name: "client", a node or a pod.
func (c *kcluster) ns(name string) *netns.NS {
	c.t.Helper()
	if name == client {
		return c.Client
	}
	if n, ok := c.Nodes[name]; ok {
		return n.NS
	}
	return c.Pod(c.t, name).NS
}
