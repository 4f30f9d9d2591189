package e2e

// The scenario environment: a small cluster of network namespaces
// (internal/testutil/netns) with kproxy running on node-a against the
// framework's API server, and helpers to write cluster state through
// client-go and to check it with real traffic.
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
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

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

	// waitTimeout bounds each wait for kproxy to act; a sync takes
	// milliseconds and the minimum sync interval is 1 s, so this is
	// generous even on a loaded machine.
	waitTimeout = 30 * time.Second
	// requestTimeout bounds one request; a negative check (expecting a
	// drop) costs this much per attempt.
	requestTimeout = time.Second
	// flowGrace bounds how long a long-lived UDP flow may keep its old
	// path after the rules changed: kproxy deletes stale conntrack entries
	// in the same sync that applies the rules. A stale entry would keep
	// the flow on its old path for as long as it keeps sending.
	flowGrace = 3 * time.Second
)

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

// metrics fetches kproxy's /metrics from inside node-a.
func (e *env) metrics() (string, error) {
	code, body, err := e.node.HTTPGet("http://"+metricsAddr+"/metrics", 3*time.Second)
	if err == nil && code != 200 {
		err = fmt.Errorf("/metrics: status %d", code)
	}
	return body, err
}

// lastSync is the time of kproxy's last successful sync of an IP family
// (sync_proxy_rules_last_timestamp_seconds), zero before the first.
func (e *env) lastSync(family string) (time.Time, error) {
	m, err := e.metrics()
	if err != nil {
		return time.Time{}, err
	}
	v, ok := metricValue(m, `kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="`+family+`"}`)
	if !ok || v <= 0 {
		return time.Time{}, nil
	}
	return time.Unix(0, int64(v*1e9)), nil
}

// waitFirstSync waits until the current kproxy has synced both families.
func (e *env) waitFirstSync() {
	e.t.Helper()
	e.eventually("kproxy's first sync of both IP families", func() error {
		for _, f := range []string{"IPv4", "IPv6"} {
			t, err := e.lastSync(f)
			if err != nil {
				return err
			}
			if t.IsZero() {
				return fmt.Errorf("no %s sync yet", f)
			}
		}
		return nil
	})
}

// health fetches /healthz or /livez from the client, over the LAN, as a
// load balancer's health check would.
func (e *env) health(path string) (int, healthStatus, error) {
	code, body, err := e.c.Client.HTTPGet(fmt.Sprintf("http://%s%s", ap(nodeAIP, healthzPort), path), 3*time.Second)
	if err != nil {
		return 0, healthStatus{}, err
	}
	var h healthStatus
	if err := json.Unmarshal([]byte(body), &h); err != nil {
		return code, h, fmt.Errorf("%s: not JSON: %v: %s", path, err, body)
	}
	return code, h, nil
}

// healthStatus is the part of upstream's /healthz and /livez JSON the
// tests read.
type healthStatus struct {
	LastUpdated  time.Time `json:"lastUpdated"`
	CurrentTime  time.Time `json:"currentTime"`
	NodeEligible *bool     `json:"nodeEligible"`
	Healthy      *bool     `json:"healthy"`
}

// expectHealth waits until path answers code, with nodeEligible as given
// (nil: not checked).
func (e *env) expectHealth(path string, code int, eligible *bool) {
	e.t.Helper()
	what := fmt.Sprintf("%s answers %d", path, code)
	if eligible != nil {
		what += fmt.Sprintf(" with nodeEligible %v", *eligible)
	}
	e.eventually(what, func() error {
		return e.checkHealth(path, code, eligible)
	})
}

func (e *env) checkHealth(path string, code int, eligible *bool) error {
	got, h, err := e.health(path)
	if err != nil {
		return err
	}
	if got != code {
		return fmt.Errorf("%s: status %d, want %d (%+v)", path, got, code, h)
	}
	if eligible != nil && (h.NodeEligible == nil || *h.NodeEligible != *eligible) {
		return fmt.Errorf("%s: nodeEligible %v, want %v", path, h.NodeEligible, *eligible)
	}
	return nil
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

// ---- cluster state through client-go ----

// Standard service ports: TCP 80 and UDP 53 onto the pods' echo servers.
var (
	portTCP = corev1.ServicePort{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(targetTCP)}
	portUDP = corev1.ServicePort{Name: "udp", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(targetUDP)}
)

// createService creates a ClusterIP Service with a TCP port, edited by the
// given functions, and returns it as the API server completed it (with its
// allocated cluster IPs and node ports).
func (e *env) createService(name string, edits ...func(*corev1.Service)) *corev1.Service {
	e.t.Helper()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.kns},
		Spec: corev1.ServiceSpec{
			Type:  corev1.ServiceTypeClusterIP,
			Ports: []corev1.ServicePort{portTCP},
		},
	}
	for _, edit := range edits {
		edit(svc)
	}
	out, err := e.cp.Client.CoreV1().Services(e.kns).Create(e.ctx, svc, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("creating Service %s: %v", name, err)
	}
	return out
}

// editService changes a Service (retrying on conflicts) and returns it as
// stored.
func (e *env) editService(name string, edit func(*corev1.Service)) *corev1.Service {
	e.t.Helper()
	var out *corev1.Service
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		svc, err := e.cp.Client.CoreV1().Services(e.kns).Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		edit(svc)
		out, err = e.cp.Client.CoreV1().Services(e.kns).Update(e.ctx, svc, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		e.t.Fatalf("updating Service %s: %v", name, err)
	}
	return out
}

// setLoadBalancerIngress sets the Service's status.loadBalancer.ingress, as
// a cloud controller would.
func (e *env) setLoadBalancerIngress(name string, ips ...netip.Addr) *corev1.Service {
	e.t.Helper()
	var out *corev1.Service
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		svc, err := e.cp.Client.CoreV1().Services(e.kns).Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		svc.Status.LoadBalancer.Ingress = nil
		for _, ip := range ips {
			svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip.String()})
		}
		out, err = e.cp.Client.CoreV1().Services(e.kns).UpdateStatus(e.ctx, svc, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		e.t.Fatalf("setting the load balancer ingress of Service %s: %v", name, err)
	}
	return out
}

func (e *env) deleteService(name string) {
	e.t.Helper()
	if err := e.cp.Client.CoreV1().Services(e.kns).Delete(e.ctx, name, metav1.DeleteOptions{}); err != nil {
		e.t.Fatalf("deleting Service %s: %v", name, err)
	}
}

// endpoint describes one endpoint of a slice: a pod, its conditions and
// topology hints.
type endpoint struct {
	pod string
	// state: "" ready; "terminating" serving and terminating; "stopping"
	// terminating and no longer serving; "unready" neither ready nor
	// terminating.
	state string
	// hintZone, hintNode: the EndpointSlice controller's hints (forZones,
	// forNodes), when set.
	hintZone, hintNode string
}

// podNode and podZone: where each pod runs. Node a is in zone-a, b in zone-b.
func podNode(pod string) string {
	if strings.HasPrefix(pod, "b") {
		return nodeB
	}
	return nodeA
}

func podZone(pod string) string { return "zone-" + strings.TrimPrefix(podNode(pod), "node-") }

// sliceName is the one EndpointSlice of a service for a family.
func sliceName(svc string, fam discoveryv1.AddressType) string {
	return svc + "-" + strings.ToLower(string(fam))
}

// setEndpoints creates or replaces the service's EndpointSlice of a family
// (IPv4 or IPv6) with eps, listing the TCP and UDP target ports. The
// trigger-time annotation is set to now, as the EndpointSlice controller
// sets it to the time of the change that caused the update (no controller
// runs here). It returns the trigger time.
func (e *env) setEndpoints(svc string, fam discoveryv1.AddressType, eps ...endpoint) time.Time {
	e.t.Helper()
	like := v4
	if fam == discoveryv1.AddressTypeIPv6 {
		like = v6
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name:      sliceName(svc, fam),
			Namespace: e.kns,
			Labels: map[string]string{
				discoveryv1.LabelServiceName: svc,
				discoveryv1.LabelManagedBy:   "e2e.kproxy.io",
			},
		},
		AddressType: fam,
		Endpoints:   []discoveryv1.Endpoint{},
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr.To(portTCP.Name), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](targetTCP)},
			{Name: ptr.To(portUDP.Name), Protocol: ptr.To(corev1.ProtocolUDP), Port: ptr.To[int32](targetUDP)},
		},
	}
	for _, ep := range eps {
		d := discoveryv1.Endpoint{
			Addresses: []string{e.podIP(ep.pod, like).String()},
			NodeName:  ptr.To(podNode(ep.pod)),
			Zone:      ptr.To(podZone(ep.pod)),
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: e.kns, Name: ep.pod},
		}
		switch ep.state {
		case "":
			d.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)}
		case "terminating":
			d.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)}
		case "stopping":
			d.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(false), Terminating: ptr.To(true)}
		case "unready":
			d.Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(false), Terminating: ptr.To(false)}
		default:
			e.t.Fatalf("endpoint %s: unknown state %q", ep.pod, ep.state)
		}
		if ep.hintZone != "" || ep.hintNode != "" {
			d.Hints = &discoveryv1.EndpointHints{}
			if ep.hintZone != "" {
				d.Hints.ForZones = []discoveryv1.ForZone{{Name: ep.hintZone}}
			}
			if ep.hintNode != "" {
				d.Hints.ForNodes = []discoveryv1.ForNode{{Name: ep.hintNode}}
			}
		}
		slice.Endpoints = append(slice.Endpoints, d)
	}
	var trigger time.Time
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := e.cp.Client.DiscoveryV1().EndpointSlices(e.kns).Get(e.ctx, slice.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			slice.ResourceVersion = ""
		case err != nil:
			return err
		default:
			slice.ResourceVersion = cur.ResourceVersion
		}
		trigger = time.Now()
		slice.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: trigger.UTC().Format(time.RFC3339Nano)}
		if slice.ResourceVersion == "" {
			_, err = e.cp.Client.DiscoveryV1().EndpointSlices(e.kns).Create(e.ctx, slice, metav1.CreateOptions{})
		} else {
			_, err = e.cp.Client.DiscoveryV1().EndpointSlices(e.kns).Update(e.ctx, slice, metav1.UpdateOptions{})
		}
		return err
	})
	if err != nil {
		e.t.Fatalf("writing EndpointSlice %s: %v", slice.Name, err)
	}
	return trigger
}

// editNode changes node-a's Node object (retrying on conflicts).
func (e *env) editNode(edit func(*corev1.Node)) {
	e.t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := e.cp.Client.CoreV1().Nodes().Get(e.ctx, nodeA, metav1.GetOptions{})
		if err != nil {
			return err
		}
		edit(n)
		_, err = e.cp.Client.CoreV1().Nodes().Update(e.ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		e.t.Fatalf("updating Node %s: %v", nodeA, err)
	}
}

// deleteObjects removes the scenario's Services and EndpointSlices.
func (e *env) deleteObjects() {
	select {
	case <-e.cp.APIServer.Done():
		return // a disruption test's API server, stopped by a later cleanup
	default:
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := e.cp.Client
	var errs []error
	svcs, err := client.CoreV1().Services(e.kns).List(ctx, metav1.ListOptions{})
	errs = append(errs, err)
	if err == nil {
		for _, s := range svcs.Items {
			errs = append(errs, client.CoreV1().Services(e.kns).Delete(ctx, s.Name, metav1.DeleteOptions{}))
		}
	}
	errs = append(errs, client.DiscoveryV1().EndpointSlices(e.kns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}))
	if err := errors.Join(errs...); err != nil {
		// The API server may be down because the test failed half way
		// through an outage: say so, but do not fail for it.
		e.t.Logf("cleanup: deleting the objects of namespace %s: %v", e.kns, err)
	}
}

// ---- traffic ----

// request sends one request (a new connection, or a new UDP socket) and
// says who answered.
func request(from *netns.NS, network string, dst netip.AddrPort) netns.Reply {
	return from.Request(network, dst, netns.DialOptions{Timeout: requestTimeout})
}

// peerCheck says what is wrong with the source address a server saw ("" if
// nothing).
type peerCheck func(peer netip.Addr) string

// anyPeer accepts every source address.
func anyPeer(netip.Addr) string { return "" }

// keeps wants the client's own address: not masqueraded.
func keeps(src netip.Addr) peerCheck {
	return func(peer netip.Addr) string {
		if peer != src {
			return fmt.Sprintf("saw %s, want the client's own %s (not masqueraded)", peer, src)
		}
		return ""
	}
}

// masqueraded wants one of node-a's addresses (the one masquerading picks
// towards the endpoint: the LAN address for b1, cbr0's for a local pod).
func (e *env) masqueraded() peerCheck {
	own := append([]netip.Addr{nodeAIP, nodeAIP6}, e.node.Gateways...)
	return func(peer netip.Addr) string {
		if !slices.Contains(own, peer) {
			return fmt.Sprintf("saw %s, want one of node-a's addresses %v (masqueraded)", peer, own)
		}
		return ""
	}
}

// serversOnce sends requests until every server in want has answered
// (bounded). It fails at the first request that is not answered, or
// answered by a server not in want, or whose source as the server saw it
// fails peer.
func serversOnce(from *netns.NS, network string, dst netip.AddrPort, want []string, peer peerCheck) error {
	seen := map[string]bool{}
	// With two endpoints chosen at random, 40 tries all missing one
	// happens once in 2^39.
	for range 40 {
		r := request(from, network, dst)
		if r.Outcome != netns.Answered {
			return fmt.Errorf("%s %s from %s: %v", network, dst, from.Role, r)
		}
		if !slices.Contains(want, r.Server) {
			return fmt.Errorf("%s %s from %s: answered by %s, want only %v", network, dst, from.Role, r.Server, want)
		}
		if msg := peer(r.Peer.Addr()); msg != "" {
			return fmt.Errorf("%s %s from %s: %s %s", network, dst, from.Role, r.Server, msg)
		}
		seen[r.Server] = true
		if len(seen) == len(want) {
			return nil
		}
	}
	return fmt.Errorf("%s %s from %s: only %v answered, want all of %v", network, dst, from.Role, seen, want)
}

// expectServers waits until requests from `from` to dst are answered by the
// servers in want and only them, each at least once.
func (e *env) expectServers(from string, network string, dst netip.AddrPort, want ...string) {
	e.t.Helper()
	e.expectServersPeer(from, network, dst, anyPeer, want...)
}

// expectServersPeer is expectServers where the source address the servers
// see must also pass peer.
func (e *env) expectServersPeer(from string, network string, dst netip.AddrPort, peer peerCheck, want ...string) {
	e.t.Helper()
	n := e.ns(from)
	e.eventually(fmt.Sprintf("%s %s from %s reaches %v", network, dst, from, want), func() error {
		return serversOnce(n, network, dst, want, peer)
	})
}

// expectOutcome waits until a request from `from` to dst ends with want
// (Refused: rejected; Timeout: dropped).
func (e *env) expectOutcome(from string, network string, dst netip.AddrPort, want netns.Outcome) {
	e.t.Helper()
	n := e.ns(from)
	e.eventually(fmt.Sprintf("%s %s from %s is %v", network, dst, from, want), func() error {
		if r := request(n, network, dst); r.Outcome != want {
			return fmt.Errorf("%v", r)
		}
		return nil
	})
}

// expectUnanswered waits until requests from `from` to dst get no answer
// from any pod, however they fail (refused, dropped, unreachable).
func (e *env) expectUnanswered(from string, network string, dst netip.AddrPort) {
	e.t.Helper()
	n := e.ns(from)
	e.eventually(fmt.Sprintf("%s %s from %s is not answered", network, dst, from), func() error {
		if r := request(n, network, dst); r.Outcome == netns.Answered {
			return fmt.Errorf("%v", r)
		}
		return nil
	})
}

// expectCaptured waits until the node's rules capture (or, with present
// false, no longer capture) every key.
func (e *env) expectCaptured(present bool, keys ...string) {
	e.t.Helper()
	e.eventually(fmt.Sprintf("rules capture %v: %v", keys, present), func() error {
		got, err := e.mode.captured(e.node.Name)
		if err != nil {
			return err
		}
		for _, k := range keys {
			if slices.Contains(got, k) != present {
				return fmt.Errorf("captured %v", got)
			}
		}
		return nil
	})
}

// udpFlow is a long-lived UDP "connection": one socket, one source port, so
// one conntrack entry for as long as it keeps sending.
type udpFlow struct {
	from string
	ask  func() netns.Reply
}

func (e *env) openUDPFlow(from string, dst netip.AddrPort, srcPort int) *udpFlow {
	e.t.Helper()
	conn, err := e.ns(from).DialUDP(dst, netns.DialOptions{SourcePort: srcPort})
	if err != nil {
		e.t.Fatalf("UDP socket from %s to %s: %v", from, dst, err)
	}
	e.t.Cleanup(func() { conn.Close() })
	return &udpFlow{from: from, ask: func() netns.Reply {
		return netns.UDPAsk(conn, time.Now().Add(300*time.Millisecond))
	}}
}

// expectFlow waits (at most flowGrace) until the flow's datagrams get want
// (by one of servers when answered), then checks that the next five do too.
func (e *env) expectFlow(what string, f *udpFlow, want netns.Outcome, servers ...string) {
	e.t.Helper()
	ok := func(r netns.Reply) bool {
		return r.Outcome == want && (want != netns.Answered || slices.Contains(servers, r.Server))
	}
	deadline := time.Now().Add(flowGrace)
	for {
		e.alive()
		r := f.ask()
		if ok(r) {
			break
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: UDP flow from %s: %v, still not %v %v after %s", what, f.from, r, want, servers, flowGrace)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for range 5 {
		if r := f.ask(); !ok(r) {
			e.t.Fatalf("%s: UDP flow from %s: %v after it had %v %v", what, f.from, r, want, servers)
		}
	}
}

// ---- metrics text ----

// metricValue returns the value of one exact series ("name" or
// `name{label="v"}`, labels as the exposition format prints them).
func metricValue(metrics, series string) (float64, bool) {
	for _, line := range strings.Split(metrics, "\n") {
		rest, ok := strings.CutPrefix(line, series+" ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
		return v, err == nil
	}
	return 0, false
}

// percentile is the nearest-rank q-quantile (0 < q <= 1) of xs.
func percentile(xs []time.Duration, q float64) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(float64(len(s))*q+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}
