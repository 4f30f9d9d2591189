package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kproxy/kproxy/test/e2e/framework"
)

// Kubectl runs the binary directory's kubectl as admin inside the control
// plane's network namespace (the only place the API server is reachable
// from), bounded by ctx, and returns its output.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	argv := append([]string{"netns", "exec", c.CP.Namespace,
		filepath.Join(c.Config.BinDir, "kubectl"), "--kubeconfig=" + c.Config.AdminKubeconfig()}, args...)
	return framework.RunUntil(ctx, "ip", argv...)
}

// KproxyArchive is the kproxy image archive to deploy: EnvImageArchive,
// else the one `hack/image.sh --print-archive` names for the current
// source. It must exist (hack/image.sh builds it).
func KproxyArchive() (string, error) {
	path := os.Getenv(EnvImageArchive)
	if path == "" {
		root, err := framework.RepoRoot()
		if err != nil {
			return "", err
		}
		out, err := exec.Command("bash", filepath.Join(root, "hack", "image.sh"), "--print-archive").Output()
		if err != nil {
			return "", fmt.Errorf("hack/image.sh --print-archive: %w", err)
		}
		path = strings.TrimSpace(string(out))
	}
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("kproxy image archive: %w (build it with hack/image.sh, or set %s)", err, EnvImageArchive)
	}
	return path, nil
}

// SplitMode splits a mode as the conformance runs name it ("nftables",
// "iptables", "iptables-legacy", "iptables-nft", "ipvs-legacy", ...) into
// the proxy's mode and the iptables backend to force: "legacy", "nft", or
// "" to leave the choice to the proxy (kproxy detects it, upstream's
// image runs what its iptables alternative points at). A backend goes only
// with the modes that use iptables.
func SplitMode(m string) (mode, backend string, err error) {
	mode, backend, _ = strings.Cut(m, "-")
	switch {
	case mode != "nftables" && mode != "iptables" && mode != "ipvs":
		return "", "", fmt.Errorf("mode %q: nftables, iptables or ipvs", m)
	case backend != "" && backend != "legacy" && backend != "nft":
		return "", "", fmt.Errorf("mode %q: the iptables backend is legacy or nft", m)
	case backend != "" && mode == "nftables":
		return "", "", fmt.Errorf("mode %q: nftables mode uses no iptables backend", m)
	}
	return mode, backend, nil
}

// KproxyManifest is deploy/kproxy.yaml with exactly the edits its header
// lists for this cluster: the API server's address for
// KUBERNETES_SERVICE_HOST/PORT and the cluster CIDR; and mode, the one
// setting of its configuration a user picks (SplitMode): with a backend,
// the manifest's IPTABLES_MODE entry uncommented and set to it, as
// docs/rke2.md tells a user to force one. A manifest that no longer holds
// the lines edited is an error, not a silent no-op.
func KproxyManifest(manifest []byte, mode string) ([]byte, error) {
	mode, backend, err := SplitMode(mode)
	if err != nil {
		return nil, err
	}
	s := string(manifest)
	edits := []struct{ old, new string }{
		{"- name: KUBERNETES_SERVICE_HOST\n              value: \"127.0.0.1\"",
			"- name: KUBERNETES_SERVICE_HOST\n              value: \"" + framework.ControlPlaneIP4.String() + "\""},
		{"- name: KUBERNETES_SERVICE_PORT\n              value: \"6443\"",
			"- name: KUBERNETES_SERVICE_PORT\n              value: \"" + strconv.Itoa(framework.APIServerPort) + "\""},
		{"    # clusterCIDR: 10.42.0.0/16\n", "    clusterCIDR: " + ClusterCIDR.String() + "\n"},
		{"    mode: nftables\n", "    mode: " + mode + "\n"},
	}
	if backend != "" {
		edits = append(edits, struct{ old, new string }{
			"            # - name: IPTABLES_MODE\n            #   value: nft\n",
			"            - name: IPTABLES_MODE\n              value: " + backend + "\n"})
	}
	for _, e := range edits {
		if strings.Count(s, e.old) != 1 {
			return nil, fmt.Errorf("deploy/kproxy.yaml: expected exactly one %q", e.old)
		}
		s = strings.Replace(s, e.old, e.new, 1)
	}
	return []byte(s), nil
}

// DeployKproxy deploys kproxy as docs/rke2.md tells a user to: the image
// archive imported into every node's containerd (under the name it
// carries), deploy/kproxy.yaml applied with the edits of KproxyManifest,
// and the DaemonSet's rollout awaited. mode is one of SplitMode's.
func (c *Cluster) DeployKproxy(ctx context.Context, mode string) error {
	archive, err := KproxyArchive()
	if err != nil {
		return err
	}
	for _, n := range c.Nodes {
		if err := ImportImage(ctx, c.Config.BinDir, n.Socket, archive); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	if err := c.ApplyKproxy(ctx, mode); err != nil {
		return err
	}
	return c.DeployDNS(ctx)
}

// ApplyKproxy applies deploy/kproxy.yaml with the edits of KproxyManifest
// (`kubectl apply -f`) and waits for the DaemonSet's rollout; the image
// must be on the nodes already.
func (c *Cluster) ApplyKproxy(ctx context.Context, mode string) error {
	root, err := framework.RepoRoot()
	if err != nil {
		return err
	}
	orig, err := os.ReadFile(filepath.Join(root, "deploy", "kproxy.yaml"))
	if err != nil {
		return err
	}
	manifest, err := KproxyManifest(orig, mode)
	if err != nil {
		return err
	}
	path := filepath.Join(c.Config.VarDir(), "kproxy.yaml")
	if err := os.WriteFile(path, manifest, 0o644); err != nil {
		return err
	}
	if out, err := c.Kubectl(ctx, "apply", "-f", path); err != nil {
		return err
	} else {
		c.life.Logf("%s", strings.TrimSpace(out))
	}
	return c.RolloutStatus(ctx, "kube-system", "daemonset/kproxy", 5*time.Minute)
}

// DeployDNS deploys the cluster's DNS (test/tools/coredns/coredns.yaml:
// CoreDNS as kubeadm deploys it, its image imported by Up) with the
// kube-dns Service at DNSIP, and waits for its rollout. CoreDNS reaches the
// API server through the "kubernetes" Service, so a service proxy must
// run first; deploying a proxy deploys it (applying it again changes
// nothing).
func (c *Cluster) DeployDNS(ctx context.Context) error {
	root, err := framework.RepoRoot()
	if err != nil {
		return err
	}
	b, err := os.ReadFile(filepath.Join(root, "test", "tools", "coredns", "coredns.yaml"))
	if err != nil {
		return err
	}
	if !strings.Contains(string(b), "CLUSTER_DNS_IP") {
		return errors.New("test/tools/coredns/coredns.yaml: no CLUSTER_DNS_IP to replace")
	}
	path := filepath.Join(c.Config.VarDir(), "coredns.yaml")
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(string(b), "CLUSTER_DNS_IP", DNSIP.String())), 0o644); err != nil {
		return err
	}
	if _, err := c.Kubectl(ctx, "apply", "-f", path); err != nil {
		return err
	}
	return c.RolloutStatus(ctx, "kube-system", "deployment/coredns", 5*time.Minute)
}

// RolloutStatus waits (kubectl rollout status) until the workload has
// rolled out, and says which pods are not ready if it has not in time.
func (c *Cluster) RolloutStatus(ctx context.Context, namespace, workload string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout+30*time.Second)
	defer cancel()
	if _, err := c.Kubectl(ctx, "-n", namespace, "rollout", "status", workload, "--timeout="+timeout.String()); err != nil {
		pods, _ := c.Kubectl(context.Background(), "-n", namespace, "get", "pods", "-o", "wide")
		return fmt.Errorf("%w\n%s", err, pods)
	}
	return nil
}

// ImageNamed is the full name of the image imported into the nodes whose
// name contains part (for example "agnhost": its tag is the archive's).
func (c *Cluster) ImageNamed(ctx context.Context, part string) (string, error) {
	ctr, err := ctrBinary(c.Config.BinDir)
	if err != nil {
		return "", err
	}
	out, err := framework.Run(ctx, ctr, "--address", c.Nodes[0].Socket, "-n", "k8s.io", "images", "ls", "-q")
	if err != nil {
		return "", err
	}
	for _, name := range strings.Fields(out) {
		if strings.Contains(name, part) && !strings.HasPrefix(name, "sha256:") {
			return name, nil
		}
	}
	return "", fmt.Errorf("no image named *%s* on %s:\n%s", part, c.Nodes[0].Name, out)
}
