// Package cluster runs a Kubernetes cluster from real parts on one machine,
// every node in a network namespace of its own, for kproxy's in-cluster
// tests and for developers (hack/cluster.sh).
//
// # Layout
//
//	control plane   the framework's (test/e2e/framework): etcd and
//	                kube-apiserver in netns "cp", plus kube-controller-manager
//	                and kube-scheduler there; the API server on
//	                198.18.250.1:6443, Node,RBAC authorization, NodeRestriction
//	node N (1..)    netns of its own, joined to the control plane's bridge by a
//	                veth (framework.ControlPlane.ConnectNamespace) with
//	                198.18.250.(10+N)/24; containerd 2.x (runc, CNI bridge
//	                "cni0", pod CIDR 198.18.(16+N).0/24, gateway .1) and a
//	                kubelet, both run with nsenter --net (the net namespace
//	                only: the kubelet's volume mounts must be visible to
//	                containerd and runc, which `ip netns exec`'s private
//	                mount namespace would hide)
//	services        198.19.0.0/16 (IPv4 only)
//
// Each node and the control plane have a static route to every other node's
// pod CIDR through that node, each node one to the service CIDR through the
// control plane (as a real node's default route would take a ClusterIP
// before the proxy's rules rewrite it); pods route 198.18.0.0/15 through
// their node. There is no default route anywhere: nothing can leave the
// sandbox.
// No kube-proxy runs: the cluster has no Service proxy until one is
// deployed (DeployKproxy, DeployKubeProxy), as a user deploys it.
//
// # Files and clean-up
//
// A cluster named NAME keeps everything that must outlive a process, or be
// found by another one, under /var/lib/NAME (kubelet and containerd roots,
// CNI configuration, logs, the admin kubeconfig, state.json) and /run/NAME
// (containerd's state and socket, runc's state, the pods' network
// namespaces); pods' cgroups are under /NAME/NODE in every cgroup v1
// hierarchy (the kubelet's cgroupRoot). Sweep removes all of it, whoever
// made it: it kills the pods' processes (by cgroup) and the containerd
// shims serving this cluster's sockets, unmounts, deletes the network
// namespaces state.json names and the cgroups. Up sweeps first, so a
// cluster whose owner was killed never gets in the way of the next.
package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kproxy/kproxy/test/e2e/framework"
)

// Environment variables Up reads (besides framework.EnvBinDir).
const (
	// EnvImagesDir is the directory of the image archives (*.tar) imported
	// into every node: pause and agnhost (default <repo>/_output/images).
	EnvImagesDir = "KPROXY_IMAGES_DIR"
	// EnvImageArchive overrides the kproxy image archive (default: what
	// `hack/image.sh --print-archive` names).
	EnvImageArchive = "KPROXY_IMAGE_ARCHIVE"
)

// PauseImage is the sandbox image every node's containerd pins; it must be
// among the imported archives (it is never pulled).
const PauseImage = "registry.k8s.io/pause:3.10.2"

// Address plan (see the package doc).
var (
	ServiceCIDR = netip.MustParsePrefix("198.19.0.0/16")
	// DNSIP is the kube-dns Service's ClusterIP, the kubelets' clusterDNS.
	DNSIP = netip.MustParseAddr("198.19.0.10")
	// ClusterCIDR holds every node's pod CIDR.
	ClusterCIDR = netip.MustParsePrefix("198.18.16.0/20")
	// podRoute is what a pod routes through its node: nodes, pods and
	// services, and nothing else.
	podRoute = netip.MustParsePrefix("198.18.0.0/15")
)

// MaxNodes bounds Config.Nodes (pod CIDRs 198.18.17-31.0/24 lie in
// ClusterCIDR).
const MaxNodes = 15

// Binaries a cluster runs from the binary directory.
var clusterBinaries = []string{
	framework.EtcdBinary, framework.APIServerBinary,
	"kube-controller-manager", "kube-scheduler", "kubelet", "kubectl",
	"containerd", "containerd-shim-runc-v2",
}

// cniPlugins are the CNI plugins the nodes use, from Debian's
// containernetworking-plugins.
var cniPlugins = []string{"bridge", "host-local", "loopback", "portmap"}

// CNIBinDir is where Debian installs the CNI plugins.
const CNIBinDir = "/usr/lib/cni"

// Config says which cluster to run.
type Config struct {
	// Name names the cluster's directories (/var/lib/Name, /run/Name) and
	// cgroups; "kproxy-cluster" when empty.
	Name string
	// Nodes is the number of nodes, 3 when zero.
	Nodes int
	// BinDir holds the binaries (framework.BinDir when empty), ImagesDir
	// the image archives (EnvImagesDir, else <repo>/_output/images).
	BinDir, ImagesDir string
}

func (c *Config) defaults() error {
	if c.Name == "" {
		c.Name = "kproxy-cluster"
	}
	if c.Nodes == 0 {
		c.Nodes = 3
	}
	if c.Nodes < 1 || c.Nodes > MaxNodes {
		return fmt.Errorf("%d nodes: between 1 and %d", c.Nodes, MaxNodes)
	}
	var err error
	if c.BinDir == "" {
		if c.BinDir, err = framework.BinDir(); err != nil {
			return err
		}
	}
	if c.ImagesDir == "" {
		c.ImagesDir = os.Getenv(EnvImagesDir)
	}
	if c.ImagesDir == "" {
		root, err := framework.RepoRoot()
		if err != nil {
			return err
		}
		c.ImagesDir = filepath.Join(root, "_output", "images")
	}
	return nil
}

// VarDir and RunDir are the cluster's persistent and run-time directories.
func (c Config) VarDir() string { return filepath.Join("/var/lib", c.Name) }
func (c Config) RunDir() string { return filepath.Join("/run", c.Name) }

// cgroupRoot is the kubelet's cgroupRoot for node: pods' cgroups go below.
func (c Config) cgroupRoot(node string) string { return "/" + c.Name + "/" + node }

// statePath is where Up records what Sweep must find.
func (c Config) statePath() string { return filepath.Join(c.VarDir(), "state.json") }

// AdminKubeconfig is the path of the cluster's admin kubeconfig, for
// programs run in the control plane's network namespace.
func (c Config) AdminKubeconfig() string { return filepath.Join(c.VarDir(), "admin.kubeconfig") }

// Missing lists what the machine lacks to run the cluster: binaries,
// plugins, tools, image archives. Empty when Up can run.
func (c Config) Missing() []string {
	if err := c.defaults(); err != nil {
		return []string{err.Error()}
	}
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root")
	}
	for _, b := range clusterBinaries {
		if !executable(filepath.Join(c.BinDir, b)) {
			missing = append(missing, filepath.Join(c.BinDir, b))
		}
	}
	for _, p := range cniPlugins {
		if !executable(filepath.Join(CNIBinDir, p)) {
			missing = append(missing, filepath.Join(CNIBinDir, p)+" (apt-get install containernetworking-plugins)")
		}
	}
	for _, tool := range []string{"ip", "nft", "nsenter", "runc"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	if _, err := ctrBinary(c.BinDir); err != nil {
		missing = append(missing, "ctr")
	}
	if archives, _ := filepath.Glob(filepath.Join(c.ImagesDir, "*.tar")); len(archives) == 0 {
		missing = append(missing, "image archives in "+c.ImagesDir)
	}
	return missing
}

func executable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

// ctrBinary is the ctr that talks to the nodes' containerd: the binary
// directory's, else the one in PATH.
func ctrBinary(binDir string) (string, error) {
	if p := filepath.Join(binDir, "ctr"); executable(p) {
		return p, nil
	}
	return exec.LookPath("ctr")
}

// Cluster is a running cluster.
type Cluster struct {
	Config Config
	// CP is the control plane (etcd, kube-apiserver); Client and RestConfig
	// reach its API server as admin from the calling process.
	CP         *framework.ControlPlane
	Client     kubernetes.Interface
	RestConfig *rest.Config
	Nodes      []*Node
	// ControllerManager and Scheduler run in CP.Namespace.
	ControllerManager, Scheduler *framework.Process
	// Ready is how long Up took until every node was Ready.
	Ready time.Duration

	life framework.Lifetime
}

// state is what state.json records: enough for Sweep in another process.
type state struct {
	// Owner is the PID of the process that owns the cluster (a test
	// binary, or hack/cluster.sh's server).
	Owner int `json:"owner"`
	// OwnerStart is its start time (field 22 of /proc/PID/stat), to tell
	// it from a later process with the same PID.
	OwnerStart string `json:"ownerStart"`
	// Namespaces are the network namespaces of the control plane and
	// nodes.
	Namespaces []string `json:"namespaces"`
	Nodes      []string `json:"nodes"`
	// ControlPlaneNamespace is where kubectl must run.
	ControlPlaneNamespace string `json:"controlPlaneNamespace"`
	// Ready is set once every node is Ready.
	Ready bool `json:"ready"`
}

func readState(c Config) (state, error) {
	var s state
	b, err := os.ReadFile(c.statePath())
	if err != nil {
		return s, err
	}
	return s, json.Unmarshal(b, &s)
}

func writeState(c Config, s state) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	tmp := c.statePath() + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, c.statePath())
}

// processStart is field 22 (starttime) of /proc/PID/stat, "" when the
// process does not exist.
func processStart(pid int) string {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return ""
	}
	// The command (field 2) is in parentheses and may hold spaces.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return ""
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return ""
	}
	return f[19]
}

// OwnerAlive reports the PID of the live process owning the cluster named
// by c, or 0 when there is none (no state, or its owner is gone).
func OwnerAlive(c Config) int {
	if err := c.defaults(); err != nil {
		return 0
	}
	s, err := readState(c)
	if err != nil || s.Owner == 0 {
		return 0
	}
	if st := processStart(s.Owner); st != "" && st == s.OwnerStart {
		return s.Owner
	}
	return 0
}

// Up starts a cluster owned by l: the control plane, then the nodes,
// and waits until every node is Ready. Everything is stopped and removed
// in l's cleanups (Sweep last). A leftover of an earlier cluster of the
// same name whose owner is gone is swept first; one whose owner still
// runs is an error.
func Up(l framework.Lifetime, cfg Config) *Cluster {
	l.Helper()
	if err := cfg.defaults(); err != nil {
		l.Fatalf("cluster: %v", err)
	}
	if m := cfg.Missing(); len(m) > 0 {
		l.Fatalf("cluster: missing %s", strings.Join(m, ", "))
	}
	if pid := OwnerAlive(cfg); pid != 0 {
		l.Fatalf("cluster %s is in use by process %d", cfg.Name, pid)
	}
	if err := Sweep(cfg); err != nil {
		l.Fatalf("cluster: removing a leftover: %v", err)
	}
	began := time.Now()
	for _, d := range []string{cfg.VarDir(), cfg.RunDir()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			l.Fatalf("cluster: %v", err)
		}
	}
	// Registered first, so it runs last: whatever the cleanups before it
	// could not remove (a shim, a mount) goes here.
	l.Cleanup(func() {
		if err := Sweep(cfg); err != nil {
			l.Errorf("cluster: %v", err)
		}
	})
	st := state{Owner: os.Getpid(), OwnerStart: processStart(os.Getpid())}
	save := func() {
		if err := writeState(cfg, st); err != nil {
			l.Fatalf("cluster: writing %s: %v", cfg.statePath(), err)
		}
	}
	save()

	c := &Cluster{Config: cfg, life: l}
	c.CP = framework.StartControlPlane(l, framework.Options{
		ServiceCIDRs: []netip.Prefix{ServiceCIDR},
		ReadyTimeout: 5 * time.Minute,
		Nodes:        true,
	})
	c.Client, c.RestConfig = c.CP.Client, c.CP.Config
	st.Namespaces = append(st.Namespaces, c.CP.Namespace)
	st.ControlPlaneNamespace = c.CP.Namespace
	save()
	if err := copyFile(c.CP.AdminKubeconfig, cfg.AdminKubeconfig()); err != nil {
		l.Fatalf("cluster: %v", err)
	}
	c.startControllers()

	for i := 1; i <= cfg.Nodes; i++ {
		n := c.addNode(i)
		st.Namespaces = append(st.Namespaces, n.Namespace)
		st.Nodes = append(st.Nodes, n.Name)
		save()
	}
	c.routes()
	for _, n := range c.Nodes {
		c.startNode(n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := c.waitNodesReady(ctx); err != nil {
		l.Fatalf("cluster: %v", err)
	}
	c.Ready = time.Since(began)
	st.Ready = true
	save()
	l.Logf("%d nodes Ready after %s", cfg.Nodes, c.Ready.Round(time.Second))
	return c
}

func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o600)
}

// Attach returns the cluster named by cfg that a live process owns (see
// hack/cluster.sh: its server process owns it), for another process to
// use: deploy into it, run kubectl. Its Client is nil and its nodes' and
// control plane's processes are not its to stop. Log lines go to l.
func Attach(l framework.Lifetime, cfg Config) (*Cluster, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	if OwnerAlive(cfg) == 0 {
		return nil, fmt.Errorf("cluster %s is not up", cfg.Name)
	}
	st, err := readState(cfg)
	if err != nil {
		return nil, err
	}
	if !st.Ready {
		return nil, fmt.Errorf("cluster %s is still coming up", cfg.Name)
	}
	c := &Cluster{Config: cfg, life: l, CP: &framework.ControlPlane{Namespace: st.ControlPlaneNamespace}}
	for i, name := range st.Nodes {
		n := &Node{Name: name, IP: nodeIP(i + 1), PodCIDR: podCIDR(i + 1),
			VarDir: filepath.Join(cfg.VarDir(), name), RunDir: filepath.Join(cfg.RunDir(), name)}
		n.Socket = filepath.Join(n.RunDir, "containerd.sock")
		n.Namespace = st.Namespaces[i+1]
		c.Nodes = append(c.Nodes, n)
	}
	return c, nil
}

// TailLines is the last n lines of s.
func TailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
