package e2e

// The scenario environment: a small cluster of network namespaces
// (internal/testutil/netns) with kproxy running on node-a against the
// framework's API server, and helpers to write cluster state through
// client-go (env_objects_test.go), to check it with real traffic
// (env_traffic_test.go) and to read kproxy's metrics and health
// (env_status_test.go).
//
// Addresses (the control plane's own are in package framework's doc):
//
//	198.18.0.0/24, fd00:18::/64        the LAN: client .100/::100, node-a .10/::10,
//	                                   node-b .11/::11 (no kproxy runs on node-b)
//	198.18.129.0/24, fd00:18:1:a::/64  node-a's pods (gateway cbr0 .1/::1):
//	                                   a1 .11/::11, a2 .12/::12, tester-a .200/::200
//	198.18.130.0/24, fd00:18:1:b::/64  node-b's pods: b1 .11/::11
//	198.18.128.0/17, fd00:18:1::/48    the cluster CIDR given to kproxy
//	198.18.250.0/24                    the control-plane network: node-a's
//	                                   second interface (framework.ConnectNamespace)
//	198.19.0.0/17, fd00:19::/112       ClusterIP ranges; the API server allocates
//	198.19.200.0/24                    load-balancer ingress IPs (outside the
//	                                   ClusterIP range, so never allocated)
//
// The client routes 198.19.0.0/16 and fd00:19::/112 via node-a. Pods a1, a2
// and b1 run echo servers (package netns's protocol: they answer with their
// name and the source address they saw) on TCP 8080 and UDP 8053; tester-a
// only sends.

import (
	"context"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/internal/testutil/netns"
	"github.com/kproxy/kproxy/test/e2e/framework"
)

const (
	nodeA   = "node-a"
	nodeB   = "node-b"
	client  = "client"
	podA1   = "a1"
	podA2   = "a2"
	podB1   = "b1"
	testerA = "tester-a"

	clusterCIDR = "198.18.128.0/17,fd00:18:1::/48"
	healthzPort = 10256
	metricsAddr = "127.0.0.1:10249"
	// Pods serve these ports; services map their ports onto them.
	targetTCP = 8080
	targetUDP = 8053

	// requestTimeout bounds one request; a negative check (expecting a
	// drop) costs this much per attempt.
	requestTimeout = time.Second
	// flowGrace bounds how long a long-lived UDP flow may keep its old
	// path after the rules changed: kproxy deletes stale conntrack entries
	// in the same sync that applies the rules. A stale entry would keep
	// the flow on its old path for as long as it keeps sending.
	flowGrace = 3 * time.Second
)

// waitTimeout bounds each wait for kproxy to act; a sync takes
// milliseconds and the minimum sync interval is 1 s, so this is generous
// even on a loaded machine. The test VM raises it (TestMain): emulated,
// a proxy's start there takes many times as long.
var waitTimeout = 30 * time.Second

var (
	clientIP = netip.MustParseAddr("198.18.0.100")
	nodeAIP  = netip.MustParseAddr("198.18.0.10")
	nodeAIP6 = netip.MustParseAddr("fd00:18::10")
	lbIP     = netip.MustParseAddr("198.19.200.10")
	// serviceCIDRs leave 198.19.128.0/17 unallocated, for LB ingress IPs.
	serviceCIDRs = []netip.Prefix{netip.MustParsePrefix("198.19.0.0/17"), netip.MustParsePrefix("fd00:19::/112")}
	echoPods     = []string{podA1, podA2, podB1}
	v4, v6       = netip.IPv4Unspecified(), netip.IPv6Unspecified()
)

func pfx(s string) netip.Prefix                { return netip.MustParsePrefix(s) }
func addr(s string) netip.Addr                 { return netip.MustParseAddr(s) }
func ap(a netip.Addr, port int) netip.AddrPort { return netip.AddrPortFrom(a, uint16(port)) }

// controlPlaneOptions are the options of the package's shared control
// plane: the union of what its tests need. --allow-privileged=true: like
// kube-proxy, kproxy's DaemonSet runs privileged, and kubeadm and RKE2 run
// the API server so for that reason (TestDeployApply); nothing else here
// creates Pods.
var controlPlaneOptions = framework.Options{
	ServiceCIDRs:  serviceCIDRs,
	APIServerArgs: []string{"--allow-privileged=true"},
}

// sharedControlPlane is the test binary's one control plane (started by
// the first test to ask, stopped in TestMain), as tb's test found it: empty
// but for what the API server makes itself, and put back so when tb ends.
// A test that needs other API server flags uses cp.WithAPIServerArgs.
func sharedControlPlane(tb testing.TB) *framework.ControlPlane {
	tb.Helper()
	return framework.Shared(tb, controlPlaneOptions)
}

func topology() netns.ClusterSpec {
	return netns.ClusterSpec{
		Nodes: []netns.NodeSpec{
			{Name: nodeA, Addrs: []netip.Prefix{pfx("198.18.0.10/24"), pfx("fd00:18::10/64")},
				PodCIDRs: []netip.Prefix{pfx("198.18.129.0/24"), pfx("fd00:18:1:a::/64")}},
			{Name: nodeB, Addrs: []netip.Prefix{pfx("198.18.0.11/24"), pfx("fd00:18::11/64")},
				PodCIDRs: []netip.Prefix{pfx("198.18.130.0/24"), pfx("fd00:18:1:b::/64")}},
		},
		Client: netns.ClientSpec{
			Addrs:         []netip.Prefix{pfx("198.18.0.100/24"), pfx("fd00:18::100/64")},
			ServiceRoutes: []netip.Prefix{pfx("198.19.0.0/16"), pfx("fd00:19::/112")},
			Via:           nodeA,
		},
		Pods: []netns.PodSpec{
			{Name: podA1, Node: nodeA, IPs: []netip.Addr{addr("198.18.129.11"), addr("fd00:18:1:a::11")}},
			{Name: podA2, Node: nodeA, IPs: []netip.Addr{addr("198.18.129.12"), addr("fd00:18:1:a::12")}},
			{Name: testerA, Node: nodeA, IPs: []netip.Addr{addr("198.18.129.200"), addr("fd00:18:1:a::200")}},
			{Name: podB1, Node: nodeB, IPs: []netip.Addr{addr("198.18.130.11"), addr("fd00:18:1:b::11")}},
		},
	}
}

// env is one scenario's world: the cluster namespaces, the Node object,
// kproxy on node-a, and a Kubernetes namespace for the scenario's objects.
type env struct {
	t    *testing.T
	cp   *framework.ControlPlane
	mode modeCase
	c    *netns.Cluster
	// node is node-a, where kproxy runs.
	node *netns.Node
	// kns is the Kubernetes namespace of the scenario's objects.
	kns    string
	ctx    context.Context
	logDir string
	// kproxy is the current kproxy process; kproxyRuns counts its starts.
	kproxy     *framework.Process
	kproxyRuns int
	extraArgs  []string
	// launch, when set, turns kproxy's environment additions and flags
	// into the command that runs it (the image test runs the image's
	// kproxy in its root filesystem); nil runs kproxyBinary.
	launch func(env, flags []string) []string
}

// newEnv builds the namespaces, registers node-a, starts kproxy on it and
// waits for its first sync. Everything is undone in t.Cleanup, also when the
// test fails. extraArgs are added to kproxy's command line.
func newEnv(t *testing.T, cp *framework.ControlPlane, mode modeCase, extraArgs ...string) *env {
	t.Helper()
	return newEnvLaunch(t, cp, mode, nil, extraArgs...)
}

// newEnvLaunch is newEnv with kproxy started by launch (see env.launch).
func newEnvLaunch(t *testing.T, cp *framework.ControlPlane, mode modeCase, launch func(env, flags []string) []string, extraArgs ...string) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	t.Cleanup(cancel)
	e := &env{
		t: t, cp: cp, mode: mode, ctx: ctx, logDir: t.TempDir(), extraArgs: extraArgs, launch: launch,
		kns: "e2e-" + strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name())),
	}
	if len(e.kns) > 63 {
		e.kns = e.kns[:63]
	}
	e.kns = strings.TrimRight(e.kns, "-")
	e.c = netns.NewCluster(t, topology())
	e.node = e.c.Node(t, nodeA)
	// Rules reject by sending an ICMP error, which the kernel rate-limits
	// per destination (one a second after a burst of six). The scenarios
	// send many rejected requests in a row: without this, "refused" would
	// turn into "timeout" at random.
	if err := e.node.Sysctls("net.ipv4.icmp_ratelimit", "0", "net.ipv6.icmp.ratelimit", "0"); err != nil {
		t.Fatal(err)
	}
	cp.ConnectNamespace(t, e.node.Name)
	for _, p := range echoPods {
		netns.ServeEcho(t, e.c.Pod(t, p).NS, p, "tcp", targetTCP)
		netns.ServeEcho(t, e.c.Pod(t, p).NS, p, "udp", targetUDP)
	}

	cp.CreateNode(t, nodeA, nodeAIP, nodeAIP6)
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e.kns}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating namespace %s: %v", e.kns, err)
	}
	// No namespace controller runs, so deleting the namespace would leave
	// its objects (and kproxy of the next scenario would see them): delete
	// the objects themselves.
	t.Cleanup(e.deleteObjects)

	e.startKproxy()
	e.waitFirstSync()
	return e
}

// kproxyArgv is kproxy's command line on node-a.
func (e *env) kproxyArgv() []string {
	flags := []string{
		"--kubeconfig", e.cp.Kubeconfig(e.t, "system:kube-proxy"),
		"--hostname-override", nodeA,
		"--proxy-mode", e.mode.proxyMode,
		"--cluster-cidr", clusterCIDR,
		// nf_conntrack_max is global and read-only in node-a's
		// namespace; with many CPUs the default would have to raise it
		// (as kind's kube-proxy config, leave it alone).
		"--conntrack-max-per-core", "0",
		"--v=2",
	}
	flags = append(flags, e.mode.args...)
	flags = append(flags, e.extraArgs...)
	if e.launch != nil {
		return e.launch(e.mode.env, flags)
	}
	argv := append([]string{kproxyBinary}, flags...)
	if len(e.mode.env) > 0 {
		// `env` execs kproxy in place: the process is still kproxy.
		argv = append(append([]string{"env"}, e.mode.env...), argv...)
	}
	return argv
}

// startKproxy starts kproxy (again) on node-a; each run logs to a file of
// its own.
func (e *env) startKproxy() {
	e.t.Helper()
	e.kproxyRuns++
	name := "kproxy"
	if e.kproxyRuns > 1 {
		name += "-" + strconv.Itoa(e.kproxyRuns)
	}
	e.kproxy = framework.StartProcess(e.t, e.node.Name, e.logDir, name, e.kproxyArgv()...)
}

// killKproxy SIGKILLs kproxy and waits until it is gone.
func (e *env) killKproxy() {
	e.t.Helper()
	if err := e.kproxy.Signal(syscall.SIGKILL); err != nil {
		e.t.Fatal(err)
	}
	select {
	case <-e.kproxy.Done():
	case <-time.After(10 * time.Second):
		e.t.Fatal("kproxy did not exit after SIGKILL")
	}
}

// kproxyLog is the current kproxy process's whole log so far.
func (e *env) kproxyLog() string {
	b, err := os.ReadFile(e.kproxy.Log)
	if err != nil {
		e.t.Fatalf("reading kproxy's log: %v", err)
	}
	return string(b)
}

// alive fails the test at once if kproxy has exited.
func (e *env) alive() {
	e.t.Helper()
	select {
	case <-e.kproxy.Done():
		e.t.Fatalf("kproxy exited (%v); last log lines:\n%s", e.kproxy.ExitError(), e.kproxy.Tail(40))
	default:
	}
}

// eventually polls f until it returns nil, failing the test with f's last
// error after waitTimeout, or at once if kproxy has exited.
func (e *env) eventually(what string, f func() error) {
	e.t.Helper()
	e.eventuallyWithin(waitTimeout, what, f)
}

func (e *env) eventuallyWithin(timeout time.Duration, what string, f func() error) {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		e.alive()
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: not true after %s: %v", what, timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ns returns the network namespace called name: "client", a node or a pod.
func (e *env) ns(name string) *netns.NS {
	e.t.Helper()
	if name == client {
		return e.c.Client
	}
	if n, ok := e.c.Nodes[name]; ok {
		return n.NS
	}
	return e.c.Pod(e.t, name).NS
}

// podIP is the pod's address of the family of like.
func (e *env) podIP(pod string, like netip.Addr) netip.Addr {
	return e.c.Pod(e.t, pod).IP(like)
}
