package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kproxy/kproxy/test/cluster/e2erun"
	"github.com/kproxy/kproxy/test/e2e/framework"
)

// One cluster for the test binary, with kproxy deployed in nftables mode:
// started by the first test that needs it, stopped in TestMain.
var testCluster struct {
	once sync.Once
	life *framework.Suite
	c    *Cluster
	skip string // why the machine cannot run it
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if life := testCluster.life; life != nil {
		if err := life.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "stopping the test cluster: %v\n", err)
			if code == 0 {
				code = 1
			}
		}
	}
	os.Exit(code)
}

// EnvClusterName names the suite's cluster (its directories and cgroups:
// /var/lib/NAME, /run/NAME), so that runs of the suite side by side, or
// beside a developer's hack/cluster.sh cluster, do not share one;
// "kproxy-cluster-e2e" when unset.
const EnvClusterName = "KPROXY_CLUSTER"

func suiteClusterName() string {
	if name := os.Getenv(EnvClusterName); name != "" {
		return name
	}
	return "kproxy-cluster-e2e"
}

// kproxyCluster returns the test binary's cluster, kproxy deployed in
// nftables mode. Where the machine lacks a part it skips t, or fails it
// under KPROXY_E2E=1.
func kproxyCluster(t *testing.T) *Cluster {
	t.Helper()
	tc := &testCluster
	tc.once.Do(func() {
		cfg := Config{Name: suiteClusterName()}
		if m := cfg.Missing(); len(m) > 0 {
			tc.skip = "the test cluster needs " + strings.Join(m, ", ")
			return
		}
		if _, err := KproxyArchive(); err != nil {
			tc.skip = err.Error()
			return
		}
		tc.life = framework.NewSuite("test cluster")
		tc.err = tc.life.Run(func() { tc.c = Up(tc.life, cfg) })
		if tc.err != nil {
			return
		}
		began := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
		defer cancel()
		if tc.err = tc.c.DeployKproxy(ctx, "nftables"); tc.err == nil {
			t.Logf("cluster up in %s, kproxy deployed in %s", tc.c.Ready.Round(time.Second), time.Since(began).Round(time.Second))
		}
	})
	if tc.skip != "" {
		if framework.Mandatory() {
			t.Fatalf("%s=1 but %s", framework.EnvRun, tc.skip)
		}
		t.Skip(tc.skip)
	}
	if tc.err != nil {
		t.Fatalf("test cluster: %v", tc.err)
	}
	return tc.c
}

// TestServiceFromEveryNode: kproxy, deployed from deploy/kproxy.yaml,
// makes the services fixture's Services answer everywhere (checkServices).
func TestServiceFromEveryNode(t *testing.T) {
	checkServices(t, kproxyCluster(t))
}

// services is what checkServices checks, made once per cluster: agnhost
// netexec pods, one per node, behind a ClusterIP and a NodePort Service
// (namespace svcNamespace, kept while the cluster lives), and a client
// pod on every node.
var services struct {
	once      sync.Once
	done      bool
	clusterIP netip.AddrPort
	nodePort  uint16
}

const svcNamespace = "svc-every-node"

// serviceFixture creates the services fixture the first time, and returns
// the ClusterIP Service's address and the NodePort.
func serviceFixture(t *testing.T, c *Cluster) (netip.AddrPort, uint16) {
	t.Helper()
	services.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		agnhost, err := c.ImageNamed(ctx, "agnhost")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: svcNamespace}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		labels := map[string]string{"app": "backend"}
		replicas := int32(len(c.Nodes))
		backend := &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: "backend"},
			Spec: appsv1.DeploymentSpec{
				Replicas: &replicas,
				Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: labels},
					Spec: corev1.PodSpec{
						// One per node.
						TopologySpreadConstraints: []corev1.TopologySpreadConstraint{{
							MaxSkew: 1, TopologyKey: corev1.LabelHostname,
							WhenUnsatisfiable: corev1.DoNotSchedule,
							LabelSelector:     &metav1.LabelSelector{MatchLabels: labels},
						}},
						Containers: []corev1.Container{netexec(agnhost)},
					},
				},
			},
		}
		if _, err := c.Client.AppsV1().Deployments(svcNamespace).Create(ctx, backend, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		for _, n := range c.Nodes {
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "client-" + n.Name, Labels: map[string]string{"app": "client"}},
				Spec:       corev1.PodSpec{NodeName: n.Name, Containers: []corev1.Container{netexec(agnhost)}},
			}
			if _, err := c.Client.CoreV1().Pods(svcNamespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		port := corev1.ServicePort{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}
		clusterIP, err := c.Client.CoreV1().Services(svcNamespace).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "backend"},
			Spec:       corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{port}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		nodePort, err := c.Client.CoreV1().Services(svcNamespace).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "backend-nodeport"},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Selector: labels,
				Ports: []corev1.ServicePort{port}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		services.clusterIP = netip.AddrPortFrom(netip.MustParseAddr(clusterIP.Spec.ClusterIP), 80)
		services.nodePort = uint16(nodePort.Spec.Ports[0].NodePort)
		services.done = true
	})
	if !services.done {
		t.Fatal("the services fixture could not be made (see the first test that used it)")
	}
	return services.clusterIP, services.nodePort
}

// servicePods waits until the fixture's pods are Ready and returns the
// backends (pod name → pod IP) and the client pods' IPs by node.
func servicePods(ctx context.Context, t *testing.T, c *Cluster) (backends, clients map[string]string) {
	t.Helper()
	pods := waitPodsReady(ctx, t, c, svcNamespace, 2*len(c.Nodes))
	backends, clients = map[string]string{}, map[string]string{}
	for _, p := range pods {
		if p.Labels["app"] == "backend" {
			backends[p.Name] = p.Status.PodIP
		} else {
			clients[p.Spec.NodeName] = p.Status.PodIP
		}
	}
	if len(clients) != len(c.Nodes) {
		t.Fatalf("client pods on %d nodes, want %d", len(clients), len(c.Nodes))
	}
	return backends, clients
}

// checkServices is the check every journey ends with: the services
// fixture's ClusterIP and NodePort (on every node's IP) answer from a pod
// on every node, from every node itself (hostNetwork), with every backend
// answering, and the NodePort from the control plane's namespace, which
// is outside the cluster.
func checkServices(t *testing.T, c *Cluster) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	clusterIP, nodePort := serviceFixture(t, c)
	backends, clients := servicePods(ctx, t, c)

	targets := []netip.AddrPort{clusterIP}
	for _, n := range c.Nodes {
		targets = append(targets, netip.AddrPortFrom(n.IP, nodePort))
	}
	client := framework.HTTPClientIn(c.CP.Namespace)
	for _, n := range c.Nodes {
		for _, dst := range targets {
			u := dialURL(clients[n.Name], dst)
			answer := eventually(ctx, t, fmt.Sprintf("pod on %s → %s", n.Name, dst), func() (string, error) {
				return dialOnce(ctx, client, u, backends)
			})
			t.Logf("pod on %s → %s: %s", n.Name, dst, answer)
		}
	}
	// From each node's own network namespace (hostNetwork), the
	// ClusterIP and every NodePort; until every backend has answered.
	answered := map[string]bool{}
	for _, n := range c.Nodes {
		nodeClient := framework.HTTPClientIn(n.Namespace)
		for _, dst := range targets {
			answer := eventually(ctx, t, fmt.Sprintf("node %s → %s", n.Name, dst), func() (string, error) {
				return hostname(ctx, nodeClient, dst, backends)
			})
			answered[answer] = true
			t.Logf("node %s → %s: %s", n.Name, dst, answer)
		}
	}
	nodeClient := framework.HTTPClientIn(c.Nodes[0].Namespace)
	eventually(ctx, t, "every backend answering the ClusterIP", func() (string, error) {
		body, err := hostname(ctx, nodeClient, clusterIP, backends)
		if err != nil {
			return "", err
		}
		answered[body] = true
		if len(answered) < len(backends) {
			return "", fmt.Errorf("answered so far: %v of %d", keys(answered), len(backends))
		}
		return "", nil
	})
	for _, dst := range targets[1:] {
		answer := eventually(ctx, t, "control plane → "+dst.String(), func() (string, error) {
			return hostname(ctx, client, dst, backends)
		})
		t.Logf("control plane → %s: %s", dst, answer)
	}
}

// dialURL is the URL of the netexec pod at podIP that makes it send one
// HTTP request for /hostname to dst.
func dialURL(podIP string, dst netip.AddrPort) string {
	q := url.Values{"request": {"hostname"}, "protocol": {"http"}, "host": {dst.Addr().String()},
		"port": {fmt.Sprint(dst.Port())}, "tries": {"1"}}
	return "http://" + netip.AddrPortFrom(netip.MustParseAddr(podIP), 8080).String() + "/dial?" + q.Encode()
}

// dialOnce asks a netexec pod (u: dialURL) for one request and returns the
// backend that answered it.
func dialOnce(ctx context.Context, client *http.Client, u string, backends map[string]string) (string, error) {
	var r struct {
		Responses []string `json:"responses"`
		Errors    []string `json:"errors"`
	}
	body, err := get(ctx, client, u)
	if err != nil {
		return "", err
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		return "", fmt.Errorf("%q: %v", body, err)
	}
	if len(r.Responses) != 1 || backends[r.Responses[0]] == "" {
		return "", fmt.Errorf("no backend answered: %s", body)
	}
	return r.Responses[0], nil
}

// hostname sends one request for /hostname to dst and returns the backend
// that answered it.
func hostname(ctx context.Context, client *http.Client, dst netip.AddrPort, backends map[string]string) (string, error) {
	body, err := get(ctx, client, "http://"+dst.String()+"/hostname")
	if err != nil {
		return "", err
	}
	if backends[body] == "" {
		return "", fmt.Errorf("%q is no backend", body)
	}
	return body, nil
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// netexec is an agnhost container serving HTTP on 8080, ready once it
// answers.
func netexec(image string) corev1.Container {
	return corev1.Container{
		Name: "netexec", Image: image, ImagePullPolicy: corev1.PullNever,
		Args:  []string{"netexec", "--http-port=8080"},
		Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
		ReadinessProbe: &corev1.Probe{
			ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/hostname", Port: intstr.FromInt32(8080)}},
			PeriodSeconds: 2,
		},
	}
}

// waitPodsReady waits until ns holds want pods, all Ready.
func waitPodsReady(ctx context.Context, t *testing.T, c *Cluster, ns string, want int) []corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 4*time.Minute)
	defer cancel()
	var pods []corev1.Pod
	eventually(ctx, t, fmt.Sprintf("%d pods Ready in %s", want, ns), func() (string, error) {
		list, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return "", err
		}
		var notReady []string
		for _, p := range list.Items {
			if !podReady(&p) {
				notReady = append(notReady, fmt.Sprintf("%s (%s on %q)", p.Name, p.Status.Phase, p.Spec.NodeName))
			}
		}
		if len(list.Items) != want || len(notReady) > 0 {
			return "", fmt.Errorf("%d pods, not ready: %s", len(list.Items), strings.Join(notReady, ", "))
		}
		pods = list.Items
		return "", nil
	})
	return pods
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// eventually retries f every second until it succeeds or ctx ends (a
// failure of t naming what, with f's last error).
func eventually(ctx context.Context, t *testing.T, what string, f func() (string, error)) string {
	t.Helper()
	var last error
	for {
		v, err := f()
		if err == nil {
			return v
		}
		last = err
		select {
		case <-ctx.Done():
			t.Fatalf("%s: %v", what, last)
		case <-time.After(time.Second):
		}
	}
}

func get(ctx context.Context, client *http.Client, u string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s: %s", u, resp.Status, b)
	}
	return strings.TrimSpace(string(b)), nil
}

// kproxyYAML is deploy/kproxy.yaml as the repository has it.
func kproxyYAML(t *testing.T) []byte {
	t.Helper()
	root, err := framework.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(root + "/deploy/kproxy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestKproxyManifest: the edits a user makes to deploy/kproxy.yaml (its
// header's list) apply to the manifest as it is, exactly once each.
func TestKproxyManifest(t *testing.T) {
	orig := kproxyYAML(t)
	got, err := KproxyManifest(orig, "iptables")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"value: \"198.18.250.1\"", "value: \"6443\"", "    clusterCIDR: 198.18.16.0/20\n", "    mode: iptables\n",
	} {
		if !strings.Contains(string(got), want) {
			t.Errorf("edited manifest lacks %q", want)
		}
	}
	if strings.Contains(string(got), "127.0.0.1\"\n") {
		t.Errorf("edited manifest still points kproxy at 127.0.0.1")
	}
	if _, err := KproxyManifest([]byte("kind: DaemonSet\n"), "nftables"); err == nil {
		t.Errorf("a manifest without the lines to edit was accepted")
	}
}

// TestNodeConfig: no route out of the sandbox (pods route only
// 198.18.0.0/15 through their node, no masquerading), and every path of a
// node's containerd is its own.
func TestNodeConfig(t *testing.T) {
	cfg := Config{Name: "kc-test", BinDir: "/bin", ImagesDir: "/images"}
	if err := cfg.defaults(); err != nil {
		t.Fatal(err)
	}
	c := &Cluster{Config: cfg}
	n := &Node{Name: "node2", IP: nodeIP(2), PodCIDR: podCIDR(2), VarDir: "/var/lib/kc-test/node2", RunDir: "/run/kc-test/node2",
		Socket: "/run/kc-test/node2/containerd.sock"}
	b, err := json.Marshal(cniConfig(n))
	if err != nil {
		t.Fatal(err)
	}
	cni := string(b)
	for _, want := range []string{`"subnet":"198.18.18.0/24"`, `"routes":[{"dst":"198.18.0.0/15"}]`, `"ipMasq":false`} {
		if !strings.Contains(cni, want) {
			t.Errorf("CNI config %s lacks %s", cni, want)
		}
	}
	if strings.Contains(cni, "0.0.0.0/0") {
		t.Errorf("CNI config %s routes everything", cni)
	}
	toml := containerdConfig(n)
	for _, line := range strings.Split(toml, "\n") {
		if i := strings.Index(line, `"/`); i >= 0 && !strings.Contains(line, "/usr/") && !strings.Contains(line, "node2") {
			t.Errorf("containerd config line %q names a path not the node's own", line)
		}
	}
	for _, want := range []string{"restrict_oom_score_adj = true", "sandbox = \"" + PauseImage + "\"", "SystemdCgroup = false"} {
		if !strings.Contains(toml, want) {
			t.Errorf("containerd config lacks %q", want)
		}
	}
	if got := c.Config.cgroupRoot("node2"); got != "/kc-test/node2" {
		t.Errorf("cgroupRoot %q", got)
	}
	if !slices.Contains(clusterBinaries, "kubelet") {
		t.Errorf("kubelet is not among the binaries checked")
	}
}

// TestConformanceServices runs upstream's [Conformance] Services tests
// (e2e.test v1.37.2, selection conformance-services of e2erun) against the
// cluster, kproxy in nftables mode, from the control plane's network
// namespace; every one must pass, within 10 minutes.
func TestConformanceServices(t *testing.T) {
	c := kproxyCluster(t)
	o := e2erun.Options{
		E2ETest:    filepath.Join(c.Config.BinDir, "e2e.test"),
		Ginkgo:     filepath.Join(c.Config.BinDir, "ginkgo"),
		Kubectl:    filepath.Join(c.Config.BinDir, "kubectl"),
		Kubeconfig: c.Config.AdminKubeconfig(),
		NetNS:      c.CP.Namespace,
		Selection:  "conformance-services",
		ReportDir:  t.TempDir(),
		Timeout:    10 * time.Minute,
		NumNodes:   len(c.Nodes),
		Procs:      3,
		Proxy:      "kproxy",
		Mode:       "nftables",
	}
	for _, p := range []string{o.E2ETest, o.Ginkgo} {
		if !executable(p) {
			if framework.Mandatory() {
				t.Fatalf("%s=1 but %s is missing (test/tools/build.sh builds it)", framework.EnvRun, p)
			}
			t.Skipf("%s is missing (test/tools/build.sh builds it)", p)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 11*time.Minute)
	defer cancel()
	run, runErr := e2erun.Execute(ctx, o)
	report, err := e2erun.ReadReport(o.ReportDir)
	if err != nil {
		b, _ := os.ReadFile(filepath.Join(o.ReportDir, "e2e.log"))
		t.Fatalf("e2e.test (%v): no report: %v\n%s", runErr, err, TailLines(string(b), 40))
	}
	passed := 0
	for _, tc := range report.Cases {
		switch tc.Result {
		case e2erun.Passed:
			passed++
		case e2erun.Failed:
			t.Errorf("FAILED %s: %s", tc.Name, tc.Message)
		}
	}
	t.Logf("%d [Conformance] Services tests passed in %s: %s", passed, run.Finished.Sub(run.Started).Round(time.Second), run.Command)
	if passed == 0 {
		t.Errorf("no test passed (e2e.test: %v)", runErr)
	}
	if runErr != nil && !t.Failed() {
		t.Errorf("e2e.test: %v", runErr)
	}
}

// TestManifestBackend: a mode with a backend ("iptables-legacy") runs
// iptables mode on that backend with either proxy: kproxy through
// deploy/kproxy.yaml's IPTABLES_MODE entry, upstream through its commands
// linked first in PATH; without one, neither forces a backend.
func TestManifestBackend(t *testing.T) {
	orig := kproxyYAML(t)
	for _, tc := range []struct{ mode, kpMode, backend string }{
		{"iptables-legacy", "iptables", "legacy"}, {"iptables-nft", "iptables", "nft"},
		{"ipvs-legacy", "ipvs", "legacy"}, {"iptables", "iptables", ""}, {"nftables", "nftables", ""},
	} {
		kp, err := KproxyManifest(orig, tc.mode)
		if err != nil {
			t.Fatalf("%s: %v", tc.mode, err)
		}
		up, err := kubeProxyManifest(tc.mode)
		if err != nil {
			t.Fatalf("%s: %v", tc.mode, err)
		}
		for _, m := range []string{string(kp), up} {
			if !strings.Contains(m, "\n    mode: "+tc.kpMode+"\n") {
				t.Errorf("%s: no mode %s in\n%s", tc.mode, tc.kpMode, m)
			}
		}
		env := "- name: IPTABLES_MODE\n              value: " + tc.backend + "\n"
		if got := strings.Contains(string(kp), env); got != (tc.backend != "") {
			t.Errorf("%s: kproxy's manifest has %q: %v", tc.mode, env, got)
		}
		if tc.backend == "" {
			if !strings.Contains(up, "- /usr/local/bin/kube-proxy\n") || strings.Contains(up, backendDir) {
				t.Errorf("%s: upstream's command is not kubeadm's:\n%s", tc.mode, up)
			}
			continue
		}
		for _, cmd := range []string{"iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore"} {
			tool, suffix, _ := strings.Cut(cmd, "-")
			link := fmt.Sprintf("ln -sf /usr/sbin/%s-%s", tool, tc.backend)
			if suffix != "" {
				link += "-" + suffix
			}
			link += " " + backendDir + "/" + cmd + " "
			if !strings.Contains(up, link) {
				t.Errorf("%s: upstream's command lacks %q", tc.mode, link)
			}
		}
		if !strings.Contains(up, "PATH="+backendDir+":$PATH exec /usr/local/bin/kube-proxy --config=/var/lib/kube-proxy/config.conf --hostname-override=\"$NODE_NAME\"") {
			t.Errorf("%s: upstream's command does not run kube-proxy with the links first in PATH:\n%s", tc.mode, up)
		}
	}
	for _, bad := range []string{"nftables-legacy", "iptables-foo", "userspace"} {
		if _, err := KproxyManifest(orig, bad); err == nil {
			t.Errorf("mode %q accepted", bad)
		}
	}
}
