package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kproxy/kproxy/test/e2e/framework"
)

// Node is one node: its network namespace, containerd and kubelet.
type Node struct {
	// Name is the Node object's name (node1, node2, ...).
	Name string
	// Namespace is its network namespace, IP its address on the control
	// plane's network, PodCIDR its pods' range.
	Namespace string
	IP        netip.Addr
	PodCIDR   netip.Prefix
	// VarDir and RunDir are its directories (see the package doc).
	VarDir, RunDir string
	// Socket is containerd's socket.
	Socket string

	Containerd, Kubelet *framework.Process
}

// nodeIP and podCIDR of node i (1-based).
func nodeIP(i int) netip.Addr { return netip.AddrFrom4([4]byte{198, 18, 250, byte(10 + i)}) }
func podCIDR(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, byte(16 + i), 0}), 24)
}

// addNode makes node i's network namespace and link, its directories and
// configuration, and its Node object (with its pod CIDR: the controller
// manager allocates none).
func (c *Cluster) addNode(i int) *Node {
	l := c.life
	l.Helper()
	name := fmt.Sprintf("node%d", i)
	n := &Node{
		Name:    name,
		IP:      nodeIP(i),
		PodCIDR: podCIDR(i),
		VarDir:  filepath.Join(c.Config.VarDir(), name),
		RunDir:  filepath.Join(c.Config.RunDir(), name),
	}
	n.Socket = filepath.Join(n.RunDir, "containerd.sock")
	n.Namespace = framework.AddNamespace(l, "kpe2e-"+name)
	c.CP.ConnectNamespace(l, n.Namespace, netip.PrefixFrom(n.IP, framework.ControlPlaneNet4.Bits()))
	ctx := context.Background()
	for _, kv := range [][2]string{
		{"net.ipv4.ip_forward", "1"},
		// Bridged pod-to-pod traffic passes the node's netfilter hooks,
		// as on a real node (kube-proxy's documented requirement): a
		// reply from a Service's endpoint on the same bridge is un-NATed.
		{"net.bridge.bridge-nf-call-iptables", "1"},
	} {
		if _, err := framework.RunIn(ctx, n.Namespace, "sysctl", "-qw", kv[0]+"="+kv[1]); err != nil {
			l.Fatalf("node %s: %v", name, err)
		}
	}
	for _, d := range []string{n.VarDir, n.RunDir, filepath.Join(n.VarDir, "cni", "net.d")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			l.Fatalf("node %s: %v", name, err)
		}
	}
	if err := c.writeNodeConfig(n); err != nil {
		l.Fatalf("node %s: %v", name, err)
	}
	c.createNode(n)
	c.Nodes = append(c.Nodes, n)
	return n
}

// routes gives every node and the control plane a route to each other
// node's pod CIDR through that node, and every node a route to the
// service CIDR through the control plane: what a real node's default
// route does for a ClusterIP, whose packets the kernel must be able to
// route before the proxy's rules rewrite them (without one, a connect()
// from the node's own network namespace fails at once, "network is
// unreachable"). Nothing routes anywhere else.
func (c *Cluster) routes() {
	l := c.life
	ctx := context.Background()
	for _, n := range c.Nodes {
		if _, err := framework.Run(ctx, "ip", "-n", n.Namespace, "route", "add", ServiceCIDR.String(), "via", framework.ControlPlaneIP4.String()); err != nil {
			l.Fatalf("cluster routes: %v", err)
		}
	}
	for _, dst := range c.Nodes {
		for _, ns := range append([]string{c.CP.Namespace}, namespaces(c.Nodes, dst)...) {
			if _, err := framework.Run(ctx, "ip", "-n", ns, "route", "add", dst.PodCIDR.String(), "via", dst.IP.String()); err != nil {
				l.Fatalf("cluster routes: %v", err)
			}
		}
	}
}

// namespaces are the nodes' namespaces but except's.
func namespaces(nodes []*Node, except *Node) []string {
	var out []string
	for _, n := range nodes {
		if n != except {
			out = append(out, n.Namespace)
		}
	}
	return out
}

// createNode registers the Node object as its kubelet would, with the pod
// CIDR set: spec.podCIDR can only be set once, so it is set at creation.
func (c *Cluster) createNode(n *Node) {
	l := c.life
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:   n.Name,
			Labels: map[string]string{corev1.LabelHostname: n.Name, corev1.LabelOSStable: "linux"},
		},
		Spec: corev1.NodeSpec{PodCIDR: n.PodCIDR.String(), PodCIDRs: []string{n.PodCIDR.String()}},
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		l.Fatalf("creating node %s: %v", n.Name, err)
	}
}

// writeNodeConfig writes the node's containerd, CNI and kubelet files.
func (c *Cluster) writeNodeConfig(n *Node) error {
	cni, err := json.MarshalIndent(cniConfig(n), "", "  ")
	if err != nil {
		return err
	}
	files := map[string]string{
		filepath.Join(n.VarDir, "containerd.toml"):                            containerdConfig(n),
		filepath.Join(n.VarDir, "cni", "net.d", "10-kproxy-cluster.conflist"): string(cni),
		filepath.Join(n.VarDir, "kubelet.yaml"):                               c.kubeletConfig(n),
	}
	for path, content := range files {
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// containerdConfig is the node's containerd configuration: every path its
// own, runc from the host, the CNI bridge, the pause image pinned (never
// pulled), and oom_score_adj kept at containerd's own (a sandbox's
// negative one needs CAP_SYS_RESOURCE, which this host may lack: runc then
// fails with "can't get final child's PID from pipe").
func containerdConfig(n *Node) string {
	return fmt.Sprintf(`version = 3
root = %[1]q
state = %[2]q
disabled_plugins = [
  "io.containerd.nri.v1.nri",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs",
]

[grpc]
  address = %[3]q

[plugins.'io.containerd.internal.v1.opt']
  path = %[4]q

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = %[5]q

[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [%[6]q]
    conf_dir = %[7]q
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = %[8]q
        Root = %[9]q
        SystemdCgroup = false
`,
		filepath.Join(n.VarDir, "containerd"),
		filepath.Join(n.RunDir, "containerd"),
		n.Socket,
		filepath.Join(n.VarDir, "opt"),
		PauseImage,
		CNIBinDir,
		filepath.Join(n.VarDir, "cni", "net.d"),
		runcPath(),
		filepath.Join(n.RunDir, "runc"),
	)
}

// runcPath is the host's runc (Debian installs it in /usr/sbin).
func runcPath() string {
	for _, p := range []string{"/usr/bin/runc", "/usr/sbin/runc"} {
		if executable(p) {
			return p
		}
	}
	return "runc"
}

// cniConfig is the node's CNI network: a bridge with the node's pod CIDR,
// the bridge as the pods' gateway for the sandbox's ranges only (no
// default route), no masquerading; portmap for hostPorts.
func cniConfig(n *Node) map[string]any {
	return map[string]any{
		"cniVersion": "1.0.0",
		"name":       "kproxy-cluster",
		"plugins": []any{
			map[string]any{
				"type":        "bridge",
				"bridge":      "cni0",
				"isGateway":   true,
				"ipMasq":      false,
				"hairpinMode": true,
				"ipam": map[string]any{
					"type":    "host-local",
					"ranges":  [][]map[string]string{{{"subnet": n.PodCIDR.String()}}},
					"routes":  []map[string]string{{"dst": podRoute.String()}},
					"dataDir": filepath.Join(n.VarDir, "cni", "ipam"),
				},
			},
			map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}},
		},
	}
}

// kubeletConfig is the node's KubeletConfiguration. For a cgroup v1 host
// without CAP_SYS_RESOURCE: cgroup v1 allowed, cgroupfs, no QoS cgroups
// (pods' cgroups under the cluster's cgroupRoot, so clean-up finds them),
// nothing enforced, its own oom_score_adj left alone; eviction relaxed (a
// shared machine's disk and memory are not this cluster's).
func (c *Cluster) kubeletConfig(n *Node) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupsPerQOS: false
cgroupRoot: %[1]s
enforceNodeAllocatable: []
oomScoreAdj: 0
containerRuntimeEndpoint: unix://%[2]s
address: %[3]s
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: %[4]s
authorization:
  mode: Webhook
clusterDomain: cluster.local
clusterDNS:
  - %[7]s
# No resolver of the host's: nothing outside the cluster is resolved.
resolvConf: ""
failSwapOn: false
maxPods: 50
podLogsDir: %[5]s
volumePluginDir: %[6]s
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%%"
  nodefs.inodesFree: "1%%"
  imagefs.available: "1%%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
rotateCertificates: false
registerNode: true
`,
		c.Config.cgroupRoot(n.Name),
		n.Socket,
		n.IP,
		c.CP.CAFile(),
		filepath.Join(n.VarDir, "pod-logs"),
		filepath.Join(n.VarDir, "volume-plugins"),
		DNSIP,
	)
}

// startNode starts the node's containerd, imports the images into it, and
// starts its kubelet. Both run with nsenter --net: in the node's network
// namespace, but the host's mount namespace.
func (c *Cluster) startNode(n *Node) {
	l := c.life
	l.Helper()
	netns := "--net=/run/netns/" + n.Namespace
	// The shim (containerd-shim-runc-v2) is found in PATH.
	path := c.Config.BinDir + ":" + os.Getenv("PATH")
	env := "PATH=" + path
	n.Containerd = framework.StartProcess(l, "", n.VarDir, "containerd",
		"env", env, "nsenter", netns, "--",
		filepath.Join(c.Config.BinDir, "containerd"), "--config", filepath.Join(n.VarDir, "containerd.toml"))
	// Once the kubelet is stopped (cleanups run newest first), the pods'
	// processes are killed by cgroup and the shims by their socket, then
	// containerd stops; Sweep removes what they leave.
	l.Cleanup(func() {
		if err := killNode(c.Config, n.Name, n.Socket); err != nil {
			l.Errorf("node %s: %v", n.Name, err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := c.waitContainerd(ctx, n); err != nil {
		l.Fatalf("node %s: containerd: %v", n.Name, err)
	}
	if err := c.importImages(ctx, n); err != nil {
		l.Fatalf("node %s: %v", n.Name, err)
	}

	kubeconfig := c.CP.Kubeconfig(l, "system:node:"+n.Name, "system:nodes")
	n.Kubelet = framework.StartProcess(l, "", n.VarDir, "kubelet",
		"env", env, "nsenter", netns, "--",
		filepath.Join(c.Config.BinDir, "kubelet"),
		"--config="+filepath.Join(n.VarDir, "kubelet.yaml"),
		"--kubeconfig="+kubeconfig,
		"--root-dir="+filepath.Join(n.VarDir, "kubelet"),
		"--cert-dir="+filepath.Join(n.VarDir, "kubelet-pki"),
		"--node-ip="+n.IP.String(),
		"--hostname-override="+n.Name,
		"--v=1",
	)
}

// waitContainerd waits until containerd answers on its socket.
func (c *Cluster) waitContainerd(ctx context.Context, n *Node) error {
	ctr, err := ctrBinary(c.Config.BinDir)
	if err != nil {
		return err
	}
	var last error
	for {
		if _, last = framework.Run(ctx, ctr, "--address", n.Socket, "version"); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not answering: %v; last lines of %s:\n%s", last, n.Containerd.Log, n.Containerd.Tail(20))
		case <-n.Containerd.Done():
			return fmt.Errorf("exited: %v; last lines of %s:\n%s", n.Containerd.ExitError(), n.Containerd.Log, n.Containerd.Tail(30))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// importImages imports every archive of the images directory into the
// node's containerd, in the namespace the CRI uses.
func (c *Cluster) importImages(ctx context.Context, n *Node) error {
	archives, err := filepath.Glob(filepath.Join(c.Config.ImagesDir, "*.tar"))
	if err != nil {
		return err
	}
	for _, a := range archives {
		if err := ImportImage(ctx, c.Config.BinDir, n.Socket, a); err != nil {
			return err
		}
	}
	return nil
}

// ImportImage imports an image archive into the containerd at socket as
// a user would: `ctr -n k8s.io images import ARCHIVE`, under the name the
// archive gives it.
func ImportImage(ctx context.Context, binDir, socket, archive string) error {
	ctr, err := ctrBinary(binDir)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if _, err := framework.RunUntil(ctx, ctr, "--address", socket, "-n", "k8s.io", "images", "import", archive); err != nil {
		return fmt.Errorf("importing %s: %v", archive, err)
	}
	return nil
}

// waitNodesReady waits until every node reports Ready.
func (c *Cluster) waitNodesReady(ctx context.Context) error {
	var last error
	for {
		last = func() error {
			reqCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			nodes, err := c.Client.CoreV1().Nodes().List(reqCtx, metav1.ListOptions{})
			if err != nil {
				return err
			}
			var notReady []string
			for _, node := range nodes.Items {
				if !nodeReady(&node) {
					notReady = append(notReady, node.Name)
				}
			}
			if len(nodes.Items) != len(c.Nodes) || len(notReady) > 0 {
				return fmt.Errorf("%d nodes, not Ready: %s", len(nodes.Items), strings.Join(notReady, ", "))
			}
			return nil
		}()
		if last == nil {
			return nil
		}
		for _, n := range c.Nodes {
			for _, p := range []*framework.Process{n.Containerd, n.Kubelet} {
				select {
				case <-p.Done():
					return fmt.Errorf("node %s: %s exited: %v; last lines of %s:\n%s", n.Name, p.Name, p.ExitError(), p.Log, p.Tail(30))
				default:
				}
			}
		}
		select {
		case <-ctx.Done():
			tails := ""
			for _, n := range c.Nodes {
				tails += fmt.Sprintf("\nlast lines of %s:\n%s", n.Kubelet.Log, n.Kubelet.Tail(15))
			}
			return fmt.Errorf("nodes not Ready in time: %v%s", last, tails)
		case <-time.After(time.Second):
		}
	}
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// startControllers runs kube-controller-manager (service-account tokens
// with a credential per controller, no node CIDR allocation: every Node is
// created with its pod CIDR) and kube-scheduler in the control plane's
// namespace.
func (c *Cluster) startControllers() {
	l := c.life
	dir := c.CP.Dir
	c.ControllerManager = framework.StartProcess(l, c.CP.Namespace, dir, "kube-controller-manager",
		filepath.Join(c.Config.BinDir, "kube-controller-manager"),
		"--kubeconfig="+c.CP.Kubeconfig(l, "system:kube-controller-manager"),
		"--use-service-account-credentials=true",
		"--service-account-private-key-file="+c.CP.ServiceAccountKeyFile(),
		"--root-ca-file="+c.CP.CAFile(),
		"--allocate-node-cidrs=false",
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		"--cert-dir="+filepath.Join(dir, "kcm-certs"),
		"--cluster-name="+c.Config.Name,
		"--profiling=false",
	)
	c.Scheduler = framework.StartProcess(l, c.CP.Namespace, dir, "kube-scheduler",
		filepath.Join(c.Config.BinDir, "kube-scheduler"),
		"--kubeconfig="+c.CP.Kubeconfig(l, "system:kube-scheduler"),
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		"--cert-dir="+filepath.Join(dir, "scheduler-certs"),
		"--profiling=false",
	)
}
