package e2e

// Addresses in these tests:
//   198.18.250.1        API server (control-plane namespace)
//   198.18.250.11       node-a (the node namespace, on the control-plane network)
//   198.18.128.0/17     cluster (pod) CIDR given to kproxy
//   198.18.128.10, .11  "pods": addresses on the node namespace's lo with
//                       listeners answering "pod-1" / "pod-2"
//   198.19.0.0/16       service range; 198.19.0.10 is the test's ClusterIP

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/kproxy/kproxy/internal/trace"
	"github.com/kproxy/kproxy/test/e2e/framework"
)

const (
	nodeName    = "node-a"
	clusterCIDR = "198.18.128.0/17"
	healthzAddr = "127.0.0.1:10256"
	metricsAddr = "127.0.0.1:10249"
	// waitTimeout bounds each wait for kproxy to act; a sync takes
	// milliseconds, the minimum sync interval is 1 s, so this is generous
	// even on a loaded machine.
	waitTimeout = 30 * time.Second
)

var (
	nodeIP    = netip.MustParseAddr("198.18.250.11")
	clusterIP = netip.MustParseAddr("198.19.0.10")
	pod1      = netip.MustParseAddr("198.18.128.10")
	pod2      = netip.MustParseAddr("198.18.128.11")
)

// testNode is a node namespace running kproxy against the control plane.
type testNode struct {
	ns     string
	dir    string
	kproxy *framework.Process
	http   *http.Client
	local  []netip.Addr // the node's addresses, for the tracer
}

// startNode creates the node namespace, connects it to the control plane,
// registers the Node object, gives it the pod listeners and runs kproxy in
// it with kube-proxy's own RBAC identity.
func startNode(t *testing.T, cp *framework.ControlPlane) *testNode {
	t.Helper()
	n := &testNode{ns: framework.AddNamespace(t, "kpe2e-node"), dir: t.TempDir()}
	link := cp.ConnectNamespace(t, n.ns, netip.PrefixFrom(nodeIP, 24))
	ctx := context.Background()
	// A real node has a default route; without one, connecting to a
	// ClusterIP fails in routing before netfilter ever sees the packet.
	// Pods are local addresses (on lo: the dummy interface type is not
	// available on every kernel), so DNAT to them delivers locally.
	for _, c := range [][]string{
		{"ip", "-n", n.ns, "route", "add", "default", "via", framework.ControlPlaneIP4.String(), "dev", link.Name},
		{"ip", "-n", n.ns, "addr", "add", pod1.String() + "/32", "dev", "lo"},
		{"ip", "-n", n.ns, "addr", "add", pod2.String() + "/32", "dev", "lo"},
	} {
		if _, err := framework.Run(ctx, c[0], c[1:]...); err != nil {
			t.Fatal(err)
		}
	}
	n.local = []netip.Addr{nodeIP, pod1, pod2}
	servePod(t, n.ns, pod1, "pod-1")
	servePod(t, n.ns, pod2, "pod-2")
	n.http = framework.HTTPClientIn(n.ns)

	cp.CreateNode(t, nodeName, nodeIP)
	kubeconfig := cp.Kubeconfig(t, "system:kube-proxy")
	n.kproxy = framework.StartProcess(t, n.ns, n.dir, "kproxy", kproxyBinary,
		"--kubeconfig", kubeconfig,
		"--hostname-override", nodeName,
		"--proxy-mode", "nftables",
		"--cluster-cidr", clusterCIDR,
		"--healthz-bind-address", healthzAddr,
		"--metrics-bind-address", metricsAddr,
		"--v=2",
	)
	return n
}

// servePod answers every connection to addr:8080 in ns with name.
func servePod(t *testing.T, ns string, addr netip.Addr, name string) {
	l := framework.ListenIn(t, ns, "tcp", netip.AddrPortFrom(addr, 8080).String())
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return // closed in cleanup
			}
			io.WriteString(c, name+"\n")
			c.Close()
		}
	}()
}

// eventually polls f until it returns nil, failing the test with f's last
// error after waitTimeout, or at once if kproxy has exited.
func (n *testNode) eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		err := f()
		if err == nil {
			return
		}
		select {
		case <-n.kproxy.Done():
			t.Fatalf("%s: kproxy exited (%v); last log lines:\n%s", what, n.kproxy.ExitError(), n.kproxy.Tail(30))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not true after %s: %v", what, waitTimeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// get fetches a URL from inside the node namespace.
func (n *testNode) get(url string) (int, string, error) {
	resp, err := n.http.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	return resp.StatusCode, string(b), err
}

// nft runs nft inside the node namespace.
func (n *testNode) nft(args ...string) (string, error) {
	return framework.RunIn(context.Background(), n.ns, "nft", args...)
}

// serviceIPs lists the keys of the service-ips map as nft prints them
// ("198.19.0.10 . tcp . 80").
func (n *testNode) serviceIPs() ([]string, error) {
	out, err := n.nft("-j", "list", "map", "ip", "kube-proxy", "service-ips")
	if err != nil {
		return nil, err
	}
	return mapKeys(out)
}

// mapKeys reads the element keys out of `nft -j list map` output. A
// concatenated key is {"concat": [addr, proto, port]}; an element with a
// comment (kproxy comments every element) wraps it as
// {"elem": {"val": key, "comment": ...}}.
func mapKeys(jsonText string) ([]string, error) {
	var doc struct {
		Nftables []struct {
			Map *struct {
				Elem [][]json.RawMessage `json:"elem"`
			} `json:"map"`
		} `json:"nftables"`
	}
	if err := json.Unmarshal([]byte(jsonText), &doc); err != nil {
		return nil, fmt.Errorf("parsing nft -j output: %w", err)
	}
	type concat struct {
		Concat []any `json:"concat"`
	}
	var keys []string
	for _, o := range doc.Nftables {
		if o.Map == nil {
			continue
		}
		for _, e := range o.Map.Elem {
			if len(e) != 2 {
				return nil, fmt.Errorf("map element %s is not [key, value]", e)
			}
			var k struct {
				concat
				Elem *struct {
					Val concat `json:"val"`
				} `json:"elem"`
			}
			if err := json.Unmarshal(e[0], &k); err != nil {
				return nil, fmt.Errorf("map key %s: %w", e[0], err)
			}
			parts := k.Concat
			if k.Elem != nil {
				parts = k.Elem.Val.Concat
			}
			if len(parts) == 0 {
				return nil, fmt.Errorf("map key %s: not a concatenation", e[0])
			}
			s := make([]string, len(parts))
			for i, p := range parts {
				s[i] = fmt.Sprint(p)
			}
			keys = append(keys, strings.Join(s, " . "))
		}
	}
	slices.Sort(keys)
	return keys, nil
}

// traceClusterIP walks a new TCP connection from a process on the node to
// clusterIP:80 through the node's live ruleset (as `nft list table` shows
// it) and returns the endpoints it can be DNATed to.
func (n *testNode) traceClusterIP() ([]netip.AddrPort, error) {
	text, err := n.nft("list", "table", "ip", "kube-proxy")
	if err != nil {
		return nil, err
	}
	rs, err := trace.ParseNFT(text)
	if err != nil {
		return nil, fmt.Errorf("parsing the live ruleset: %w", err)
	}
	res, err := rs.Trace(trace.Packet{
		Src: nodeIP, Dst: clusterIP, Proto: corev1.ProtocolTCP, SrcPort: 40000, DstPort: 80,
	}, trace.Host{LocalAddrs: n.local})
	if err != nil {
		return nil, err
	}
	return res.Endpoints(), nil
}

// connect opens a real connection from the node to clusterIP:80 and returns
// what the pod behind it said.
func (n *testNode) connect() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c, err := framework.DialContextIn(n.ns)(ctx, "tcp", netip.AddrPortFrom(clusterIP, 80).String())
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

// metricCount returns the _count sample of histogram name summed over its
// label sets, and whether the metric is present at all.
func metricCount(metrics, name string) (float64, bool) {
	var sum float64
	found := false
	for _, line := range strings.Split(metrics, "\n") {
		rest, ok := strings.CutPrefix(line, name+"_count")
		if !ok || (rest != "" && rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		f := strings.Fields(rest[strings.LastIndex(rest, "}")+1:])
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			continue
		}
		sum += v
		found = true
	}
	return sum, found
}

func makeService() *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: metav1.NamespaceDefault},
		Spec: corev1.ServiceSpec{
			Type:      corev1.ServiceTypeClusterIP,
			ClusterIP: clusterIP.String(),
			Ports: []corev1.ServicePort{{
				Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080),
			}},
		},
	}
}

// makeSlice is the EndpointSlice of "web" with one ready endpoint on this
// node. The trigger-time annotation is what the EndpointSlice controller
// sets and what network_programming_duration_seconds is measured from.
func makeSlice(ep netip.Addr) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name:      "web-e2e",
			Namespace: metav1.NamespaceDefault,
			Labels: map[string]string{
				discoveryv1.LabelServiceName: "web",
				discoveryv1.LabelManagedBy:   "e2e.kproxy.io",
			},
			Annotations: map[string]string{
				corev1.EndpointsLastChangeTriggerTime: time.Now().UTC().Format(time.RFC3339Nano),
			},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{ep.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
			NodeName:   ptr.To(nodeName),
		}},
		Ports: []discoveryv1.EndpointPort{{
			Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](8080),
		}},
	}
}

// TestServiceLifecycle: kproxy against a real API server programs a
// ClusterIP service when it appears, follows its endpoints and removes it,
// while its health and metrics endpoints say what upstream's do.
func TestServiceLifecycle(t *testing.T) {
	cp := framework.Start(t, framework.Options{})
	n := startNode(t, cp)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	svcKey := clusterIP.String() + " . tcp . 80"
	pod1EP := netip.AddrPortFrom(pod1, 8080)
	pod2EP := netip.AddrPortFrom(pod2, 8080)

	// Health and mode first: they answer once the first sync is done.
	start := time.Now()
	n.eventually(t, "/healthz answers 200 with JSON", func() error {
		code, body, err := n.get("http://" + healthzAddr + "/healthz")
		if err != nil {
			return err
		}
		if code != http.StatusOK {
			return fmt.Errorf("status %d: %s", code, body)
		}
		var h struct {
			LastUpdated  time.Time `json:"lastUpdated"`
			CurrentTime  time.Time `json:"currentTime"`
			NodeEligible *bool     `json:"nodeEligible"`
		}
		if err := json.Unmarshal([]byte(body), &h); err != nil {
			return fmt.Errorf("not JSON: %v: %s", err, body)
		}
		if h.CurrentTime.IsZero() || h.LastUpdated.IsZero() {
			return fmt.Errorf("lastUpdated/currentTime missing: %s", body)
		}
		if h.NodeEligible == nil || !*h.NodeEligible {
			return fmt.Errorf("nodeEligible is not true: %s", body)
		}
		return nil
	})
	t.Logf("kproxy healthy %s after start", time.Since(start).Round(time.Millisecond))
	code, mode, err := n.get("http://" + metricsAddr + "/proxyMode")
	if err != nil || code != http.StatusOK || strings.TrimSpace(mode) != "nftables" {
		t.Fatalf("/proxyMode: %d %q %v, want 200 \"nftables\"", code, mode, err)
	}

	// The "kubernetes" Service is programmed from the first sync; ours
	// does not exist yet.
	n.eventually(t, "the kubernetes Service is in service-ips", func() error {
		keys, err := n.serviceIPs()
		if err != nil {
			return err
		}
		if !slices.Contains(keys, "198.19.0.1 . tcp . 443") {
			return fmt.Errorf("service-ips keys %v", keys)
		}
		if slices.Contains(keys, svcKey) {
			t.Fatalf("%s programmed before the Service exists: %v", svcKey, keys)
		}
		return nil
	})

	// Create the Service and its endpoints.
	start = time.Now()
	if _, err := cp.Client.CoreV1().Services(metav1.NamespaceDefault).Create(ctx, makeService(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Client.DiscoveryV1().EndpointSlices(metav1.NamespaceDefault).Create(ctx, makeSlice(pod1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	n.eventually(t, "the ClusterIP is in service-ips and leads to pod-1", func() error {
		keys, err := n.serviceIPs()
		if err != nil {
			return err
		}
		if !slices.Contains(keys, svcKey) {
			return fmt.Errorf("service-ips keys %v lack %q", keys, svcKey)
		}
		eps, err := n.traceClusterIP()
		if err != nil {
			return err
		}
		if !slices.Equal(eps, []netip.AddrPort{pod1EP}) {
			return fmt.Errorf("trace: endpoints %v, want %v", eps, pod1EP)
		}
		return nil
	})
	t.Logf("new Service programmed %s after creation", time.Since(start).Round(time.Millisecond))
	// The kernel agrees with the tracer: a real connection reaches pod-1.
	for range 3 {
		if got, err := n.connect(); err != nil || got != "pod-1" {
			t.Fatalf("connecting to %s:80: %q, %v; want pod-1", clusterIP, got, err)
		}
	}

	_, metrics, err := n.get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"kubeproxy_sync_proxy_rules_duration_seconds", "kubeproxy_network_programming_duration_seconds"} {
		if c, ok := metricCount(metrics, name); !ok || c < 1 {
			t.Errorf("/metrics: %s_count = %v (present %v), want >= 1", name, c, ok)
		}
	}

	// Move the endpoint to pod-2.
	slice, err := cp.Client.DiscoveryV1().EndpointSlices(metav1.NamespaceDefault).Get(ctx, "web-e2e", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	moved := makeSlice(pod2)
	moved.ResourceVersion = slice.ResourceVersion
	start = time.Now()
	if _, err := cp.Client.DiscoveryV1().EndpointSlices(metav1.NamespaceDefault).Update(ctx, moved, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	n.eventually(t, "the ClusterIP leads to pod-2 only", func() error {
		eps, err := n.traceClusterIP()
		if err != nil {
			return err
		}
		if !slices.Equal(eps, []netip.AddrPort{pod2EP}) {
			return fmt.Errorf("trace: endpoints %v, want %v", eps, pod2EP)
		}
		return nil
	})
	t.Logf("endpoint change programmed %s after the update", time.Since(start).Round(time.Millisecond))
	for range 3 {
		if got, err := n.connect(); err != nil || got != "pod-2" {
			t.Fatalf("connecting to %s:80 after the update: %q, %v; want pod-2", clusterIP, got, err)
		}
	}

	// Delete the Service: its ClusterIP leaves the map and leads nowhere.
	start = time.Now()
	if err := cp.Client.CoreV1().Services(metav1.NamespaceDefault).Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	n.eventually(t, "the ClusterIP is gone from service-ips", func() error {
		keys, err := n.serviceIPs()
		if err != nil {
			return err
		}
		if slices.Contains(keys, svcKey) {
			return fmt.Errorf("service-ips keys %v still hold %q", keys, svcKey)
		}
		if !slices.Contains(keys, "198.19.0.1 . tcp . 443") {
			t.Fatalf("the kubernetes Service went too: %v", keys)
		}
		eps, err := n.traceClusterIP()
		if err != nil {
			return err
		}
		if len(eps) != 0 {
			return fmt.Errorf("trace: still DNATed to %v", eps)
		}
		return nil
	})
	t.Logf("Service deletion programmed %s after the delete", time.Since(start).Round(time.Millisecond))
	if got, err := n.connect(); err == nil {
		t.Errorf("connecting to the deleted Service's ClusterIP reached %q", got)
	}

	select {
	case <-n.kproxy.Done():
		t.Fatalf("kproxy exited (%v)", n.kproxy.ExitError())
	default:
	}
}

func TestMapKeys(t *testing.T) {
	tests := []struct {
		name    string
		json    string
		want    []string
		wantErr bool
	}{
		{
			name: "plain and commented elements",
			json: `{"nftables": [{"metainfo": {"version": "1.0.6"}}, {"map": {"family": "ip", "name": "service-ips", "elem": [
				[{"elem": {"val": {"concat": ["198.19.0.1", "tcp", 443]}, "comment": "default/kubernetes:https/TCP"}}, {"goto": {"target": "a"}}],
				[{"concat": ["198.19.0.10", "udp", 53]}, {"goto": {"target": "b"}}]]}}]}`,
			want: []string{"198.19.0.1 . tcp . 443", "198.19.0.10 . udp . 53"},
		},
		{
			name: "empty map",
			json: `{"nftables": [{"map": {"family": "ip", "name": "service-ips"}}]}`,
		},
		{
			name:    "a key of unknown shape is an error, not an empty key",
			json:    `{"nftables": [{"map": {"elem": [[{"prefix": {"addr": "10.0.0.0", "len": 8}}, {"accept": null}]]}}]}`,
			wantErr: true,
		},
		{name: "not JSON", json: `table ip kube-proxy {`, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := mapKeys(tc.json)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("keys %q, want %q", got, tc.want)
			}
		})
	}
}

func TestMetricCount(t *testing.T) {
	metrics := `# HELP kubeproxy_sync_proxy_rules_duration_seconds x
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="+Inf"} 3
kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"} 3
kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv6"} 2
kubeproxy_sync_proxy_rules_duration_seconds_counted 99
plain_count 7
`
	tests := []struct {
		name      string
		want      float64
		wantFound bool
	}{
		{name: "kubeproxy_sync_proxy_rules_duration_seconds", want: 5, wantFound: true},
		{name: "plain", want: 7, wantFound: true},
		{name: "kubeproxy_network_programming_duration_seconds"},
	}
	for _, tc := range tests {
		got, found := metricCount(metrics, tc.name)
		if got != tc.want || found != tc.wantFound {
			t.Errorf("metricCount(%s) = %v, %v; want %v, %v", tc.name, got, found, tc.want, tc.wantFound)
		}
	}
}
